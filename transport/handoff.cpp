// The leave's entries for the layers above, named for the mechanism, not
// for why they are used: barring upgrades from now on (bar_upgrades,
// settle_upgrade); a connection handed to its handoff (conn.hpp:
// HandoffOps) whatever its state (hand_off); and the control channel's
// leave request, by which another process that holds the socket asks the
// process whose connection it is to move it back to the kernel
// (request_leave, answered by handle_leave). The leave itself is
// leave.cpp.
#include "conn_impl.hpp"
#include "control.hpp"
#include "crossuser.hpp"
#include "engine.hpp"
#include "log.hpp"
#include "settings.hpp"
#include "sys.hpp"
#include "wait.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <mutex>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

namespace sd::transport {

void Engine::bar_upgrades(Conn *c, Reason why) noexcept {
    (void)wait_until({.nap_ns = 1000000, .max_naps = 200}, 0, [c] {
        return c->state.load() != ConnState::initiating && c->state.load() != ConnState::committing;
    });
    std::lock_guard lock(conn_lock_);
    bar_upgrades_locked(c, why);
}

void Engine::bar_upgrades_locked(Conn *c, Reason why) noexcept {
    ConnState st = c->state.load();
    if (st == ConnState::direct || st == ConnState::leaving) return;
    c->barred_why.store(std::uint32_t(why), std::memory_order_relaxed);
    c->upgrades_barred.store(true, std::memory_order_release);
    // An upgrade still under way sees the mark where it ends (both under
    // conn_lock_): an initiator sends no commit, a responder whose commit
    // came leaves at once. Before, it went direct after the mark, and an
    // exec or a fork child then used the kernel socket while the peer
    // wrote into this process's ring (EFAULT after the exec: EIO).
    if (st == ConnState::initiating || st == ConnState::committing) return;
    if (st != ConnState::final) mark_kernel(c, why);
}

bool Engine::settle_upgrade(Conn *c) noexcept {
    // The initiator's wait for an answer and the responder's for the
    // commit end within the upgrade timeout.
    const std::uint64_t deadline =
        monotonic_ns() + (std::uint64_t(settings().upgrade_timeout_ms) + 500) * 1000000ull;
    ConnState st = ConnState::initiating;
    const Waited w = wait_until({.nap_ns = 1000000}, deadline, [&] {
        st = c->state.load(std::memory_order_acquire);
        return st != ConnState::initiating && st != ConnState::committing;
    });
    return w == Waited::ready && (st == ConnState::direct || st == ConnState::leaving);
}

int Engine::hand_off_locked(Conn *c, Reason why) noexcept {
    const ConnState st = c->state.load(std::memory_order_acquire);
    if (st == ConnState::direct || st == ConnState::leaving) {
        const int rc = leave_locked(c, why);
        return rc < 0 ? rc : 0;
    }
    const Conn::HandoffRef h = c->handoff();
    // Handed already (its leave gave the offsets), or nobody to hand to.
    if (!h || (st == ConnState::final && h.taken())) return 0;
    // No upgrade from now on: one under way sees the mark where it ends
    // (it ends on the kernel, or goes direct and leaves for `why`).
    bar_upgrades_locked(c, why);
    if (st == ConnState::initiating || st == ConnState::committing) return -EAGAIN;
    // A call of ours on the kernel holds it (a blocking send): later.
    std::unique_lock tx(c->tx_lock, std::try_to_lock);
    if (!tx.owns_lock()) return -EAGAIN;
    std::unique_lock rx(c->rx_lock, std::try_to_lock);
    if (!rx.owns_lock()) return -EAGAIN;
    return final_to_handoff_locked(c) ? 0 : -EIO;
}

int Engine::hand_off(Conn *c, Reason why) noexcept {
    const std::uint64_t deadline =
        monotonic_ns() + (std::uint64_t(settings().upgrade_timeout_ms) + 1000) * 1000000ull;
    int rc = -EAGAIN;
    const Waited w = wait_until({.nap_ns = 1000000}, deadline, [&] {
        std::lock_guard lock(conn_lock_);
        return (rc = hand_off_locked(c, why)) != -EAGAIN;
    });
    return w == Waited::ready ? rc : -ETIMEDOUT;
}

namespace {

// The registry of process `pid`'s real uid (its control socket's place),
// when that uid is not ours: a holder that changed its ids afresh after
// the fork that shared the socket (transport/afresh.cpp) publishes there.
bool foreign_registry_of(pid_t pid, unsigned *uid, char *dir, std::size_t n) noexcept {
    char path[48];
    std::snprintf(path, sizeof path, "/proc/%d/status", int(pid));
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char text[2048];
    const ssize_t len = sys.read(fd, text, sizeof text - 1);
    sys.close(fd);
    if (len <= 0) return false;
    text[len] = '\0';
    const char *line = std::strstr(text, "\nUid:");
    unsigned real = 0;
    if (!line || std::sscanf(line + 5, "%u", &real) != 1 || real == unsigned(getuid()))
        return false;
    *uid = real;
    return registry_of_uid(real, dir, n) == 0;
}

}  // namespace

int request_leave(pid_t owner, int fd, Reason why) noexcept {
    Guard guard;
    CtlMsg req = reply_to(getpid(), CtlType::leave);
    req.status = std::uint32_t(why);
    if (tuple_of(fd, req.tuple) != 0) return -ENOTCONN;
    // The owner's death ends the wait: a child of it holds its listening
    // control socket too (inherited), so a connect to a dead owner still
    // succeeds and nobody would ever answer. Its pidfd is readable once it
    // has exited, reaped or not.
    const int pfd = int(syscall(SYS_pidfd_open, owner, 0));
    if (pfd < 0 && errno == ESRCH) return -ESRCH;
    auto owner_dead = [pfd] {
        pollfd p{pfd, POLLIN, 0};
        return pfd >= 0 && sys.poll(&p, 1, 0) == 1;
    };
    if (owner_dead()) {
        sys.close(pfd);
        return -ESRCH;
    }
    char path[108];
    ctl_path(path, sizeof path, owner);
    int s = sys.socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0) {
        const int err = errno;
        if (pfd >= 0) sys.close(pfd);
        return -err;
    }
    // The owner waits up to the leave timeout for its peer.
    const std::uint32_t ms = settings().leave_timeout_ms + 2000;
    const std::uint64_t deadline = monotonic_ns() + std::uint64_t(ms) * 1000000ull;
    timeval tv{time_t(ms / 1000), suseconds_t((ms % 1000) * 1000)};
    sys.setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, path, sizeof path);
    int rc = -ESRCH;
    CtlMsg rep{};
    int none = -1;
    unsigned want_uid = unsigned(getuid());
    bool connected = sys.connect(s, reinterpret_cast<sockaddr *>(&sa), sizeof sa) == 0;
    // Not in our registry: the owner may have become another uid after the
    // fork (its connection then is its new uid's, and the socket we pass
    // is the proof that we hold it, as across users).
    char dir[64];
    if (!connected && errno == ENOENT && cross_user_on() &&
        foreign_registry_of(owner, &want_uid, dir, sizeof dir)) {
        ctl_path(path, sizeof path, owner, dir);
        std::memcpy(sa.sun_path, path, sizeof path);
        connected = sys.connect(s, reinterpret_cast<sockaddr *>(&sa), sizeof sa) == 0;
    }
    if (connected) {
        rc = -EPERM;
        unsigned uid = 0;
        if (peer_cred_ok(s, owner, &uid) && uid == want_uid) {
            rc = -ETIMEDOUT;
            // To another uid, a duplicate checked against the tuple, as an
            // upgrade's proof is: never a number reused meanwhile.
            const bool foreign = want_uid != unsigned(getuid());
            int proof = foreign ? proof_dup(fd, req.tuple) : fd;
            const bool sent = proof >= 0 && send_ctl(s, req, &proof, 1) == sizeof req;
            if (foreign && proof >= 0) sys.close(proof);
            if (sent) {
                // In slices: the owner may die while we wait.
                for (;;) {
                    const std::uint64_t slice = std::min<std::uint64_t>(deadline, monotonic_ns() + 50000000ull);
                    const int got = recv_ctl_until(s, rep, &none, 0, slice);
                    if (got == 0) {
                        if (rep.type == std::uint16_t(CtlType::reply) && rep.pid == owner)
                            rc = rep.status == std::uint32_t(Reason::none)         ? 0
                                 : rep.status == std::uint32_t(Reason::disconnect) ? -ECONNRESET
                                 : rep.status == kLeaveAgain                       ? -EAGAIN
                                                                                  : -EIO;
                        break;
                    }
                    if (owner_dead()) {
                        rc = -ESRCH;
                        break;
                    }
                    if (got != -ETIMEDOUT || monotonic_ns() >= deadline) break;
                }
            }
        }
    } else if (!owner_dead()) {
        rc = errno == ENOENT || errno == ECONNREFUSED ? -ESRCH : -errno;
    }
    sys.close(s);
    if (pfd >= 0) sys.close(pfd);
    return rc;
}

void Engine::handle_leave(int fd, pid_t pid, const Tuple &tuple, int proof, Reason why) noexcept {
    CtlMsg rep = reply_to(pid_, CtlType::reply);
    Tuple proven;
    // Another uid too (SDIRECT_CROSS_USER): a holder of the socket that
    // did not change its ids when this process did after their fork. The
    // socket it passed is the proof that it holds the connection, and all
    // it may ask is that the connection go back to the kernel, which its
    // own copy of the socket could break anyway.
    unsigned uid = 0;
    if (!peer_cred_ok(fd, pid, &uid)) {
        rep.status = std::uint32_t(Reason::other_user);
    } else if (tuple_of(proof, proven) != 0 || !(proven == tuple)) {
        rep.status = std::uint32_t(Reason::proof_failed);
    } else {
        std::lock_guard lock(conn_lock_);
        Conn *c = find_tuple(tuple);
        // Not direct (yet), with a handoff: upgrades barred, its offsets
        // handed over; or, while that cannot be done at once, the asking
        // process asks again.
        const ConnState st = c ? c->state.load(std::memory_order_acquire) : ConnState::final;
        const Conn::HandoffRef h = c ? c->handoff() : Conn::HandoffRef{};
        if (c && st != ConnState::direct && st != ConnState::leaving && st != ConnState::final &&
            h) {
            const int rc = hand_off_locked(c, h.ops->why);
            if (rc == -EAGAIN) rep.status = kLeaveAgain;
            else if (rc < 0) rep.status = std::uint32_t(Reason::timeout);
            c = nullptr;
        }
        // Not ours (any more): the kernel carries it all already.
        if (c) {
            if (const int rc = leave_locked(c, why); rc < 0) {
                SD_LOG(error, "fd %d: pid %d asked us to leave the fabric (%s) and we could not: "
                              "%s", c->stat->fd, int(pid), reason_name(why), std::strerror(-rc));
                // Bytes of the connection were lost here (its peer died
                // before they were read): a reset for the asking process.
                rep.status = std::uint32_t(rc == -ECONNRESET ? Reason::disconnect : Reason::timeout);
            }
        }
    }
    if (proof >= 0) sys.close(proof);
    send_ctl(fd, rep, nullptr, 0, MSG_DONTWAIT);
}

}  // namespace sd::transport
