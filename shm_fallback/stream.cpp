#include "stream.hpp"


#include "readiness.hpp"
#include "table.hpp"

#include "transport/log.hpp"
#include "transport/memguard.hpp"
#include "transport/protocol.hpp"
#include "transport/rules.hpp"
#include "transport/settings.hpp"
#include "transport/sys.hpp"
#include "transport/wait.hpp"
#include "transport/renew.hpp"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <fcntl.h>
#include <cstring>
#include <new>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sd::fallback {

using transport::Conn;
using transport::ConnState;
using transport::epipe;
using transport::iov_total;
using transport::kMaxSlice;
using transport::monotonic_ns;
using transport::slice;
using transport::sys;

namespace {

bool readable(void *ctx) noexcept { return transport::rx_news(static_cast<Conn *>(ctx)); }

bool state_changed(void *ctx) noexcept { return !transport::upgrading(static_cast<Conn *>(ctx)); }

}  // namespace

std::uint64_t Stream::inode() noexcept {
    if (std::uint64_t v = ino.load(std::memory_order_acquire)) return v;
    const int f = fd.load(std::memory_order_relaxed);
    struct stat st;
    int rc;
    if (!foreign_process()) {
        rc = fstat(f, &st);
    } else {
        char path[48];
        std::snprintf(path, sizeof path, "/proc/%d/fd/%d", table_pid(), f);
        rc = stat(path, &st);
    }
    if (rc != 0 || !S_ISSOCK(st.st_mode)) return 0;
    ino.store(std::uint64_t(st.st_ino), std::memory_order_release);
    return std::uint64_t(st.st_ino);
}

void Stream::reset(int f, int dom, bool nb) noexcept {
    fd.store(f, std::memory_order_relaxed);
    {
        std::lock_guard lock(alias_lock);
        aliases.clear();
    }
    domain = dom;
    ino.store(0, std::memory_order_relaxed);
    fds.store(1, std::memory_order_relaxed);
    reset_to(Phase::fresh);
    nonblock.store(nb, std::memory_order_relaxed);
    nodelay.store(false, std::memory_order_relaxed);
    cork.store(false, std::memory_order_relaxed);
    rd_shut.store(false, std::memory_order_relaxed);
    kernel_wr_shut.store(false, std::memory_order_relaxed);
    rcvlowat.store(1, std::memory_order_relaxed);
    linger_reset.store(false, std::memory_order_relaxed);
    drew_reset.store(false, std::memory_order_relaxed);
    for_good.store(false, std::memory_order_relaxed);
    shut_second.store(false, std::memory_order_relaxed);
    rcvtimeo_ns.store(0, std::memory_order_relaxed);
    sndtimeo_ns.store(0, std::memory_order_relaxed);
    rcvbuf.store(0, std::memory_order_relaxed);
    conn.store(nullptr, std::memory_order_relaxed);
    engine = nullptr;
    next_free = nullptr;
    forked = false;
    orphan.store(false, std::memory_order_relaxed);
    orphan_lost.store(kNotLost, std::memory_order_relaxed);
    owner = 0;
    holders.store(nullptr, std::memory_order_relaxed);
    used_mark.store(nullptr, std::memory_order_relaxed);
    fork_mark = 0;
    share_marked = false;
    rule_verdict = 0;
    share.store(nullptr, std::memory_order_relaxed);
    prefix.store(nullptr, std::memory_order_relaxed);
    share_check_ns = 0;
    pre_tx = pre_rx = 0;
    earn_ns = 0;
    earn_calls = 0;
    plain_n.store(0, std::memory_order_relaxed);
    ask_deferred.store(false, std::memory_order_relaxed);
    take_ns = 0;
    take_calls = 0;
    calls.store(0, std::memory_order_relaxed);
    held_fd.store(-1, std::memory_order_relaxed);
    fd_users.store(0, std::memory_order_relaxed);
    refs.store(1, std::memory_order_release);
}

SD_CHILD_PATH void Stream::forget_parent_threads() noexcept {
    // What is as new already is not written (renew.hpp).
    using transport::renew;
    renew(pend_lock);
    renew(kernel_waiters, 0u);  // the threads blocked in the parent are not here
    renew(wait_holds, 0u);
    renew(alias_lock);
    renew(refs, fds.load(std::memory_order_relaxed));
    renew(calls, 0);  // the parent's threads are not ours
    renew(next_free, nullptr);
}

void Stream::accepted() noexcept {
    acceptor = true;
    move(Phase::fresh, Phase::deferred);
}

void Stream::fd_added(int nfd) noexcept {
    std::lock_guard lock(alias_lock);
    aliases.push_back(nfd);
}

SD_CHILD_PATH void Stream::fd_removed(int gone) noexcept {
    std::lock_guard lock(alias_lock);
    if (fd.load(std::memory_order_relaxed) != gone) {
        std::erase(aliases, gone);
        return;
    }
    if (aliases.empty()) return;  // the last fd: the stream goes with it
    int next = aliases.back();
    aliases.pop_back();
    fd.store(next, std::memory_order_relaxed);
    if (transport::Conn *c = conn.load(std::memory_order_acquire))
        std::atomic_ref<std::int32_t>(transport::stats(c).fd).store(next, std::memory_order_relaxed);
}

SD_CHILD_PATH void Stream::connected(bool accepted) noexcept {
    Phase p = phase.load(std::memory_order_acquire);
    if (p != Phase::fresh && p != Phase::connecting && p != Phase::deferred) {
        // Another thread's first call attaches it: ours goes the same way,
        // not past a connection that is not there yet.
        (void)transport::wait_until({.nap_ns = 100000}, 0, [this] {
            return phase.load(std::memory_order_acquire) != Phase::attaching;
        });
        return;
    }
    if (!move(p, Phase::attaching)) return connected(accepted);
    acceptor = accepted;
    // A connection that earns its upgrade hears the rules when it asks
    // (ask_now_locked); one that upgrades at once hears them now.
    if (transport::settings().upgrade_after_ms) return start_earning();
    if (transport::rules_keep_fd_on_kernel(kfd(), accepted)) {
        keep_by_rule();
        move_to(Phase::attached);
        return;
    }
    if ((engine = transport::Engine::wait_ready(transport::settings().engine_wait_ms))) {
        // pre_tx/pre_rx: bytes through the kernel before now (0 unless the
        // socket was shared through fork).
        set_conn(engine->attach(kfd(), acceptor, rcvbuf.load(std::memory_order_relaxed), pre_tx,
                                  pre_rx));
        move_to(Phase::attached);
        return;
    }
    std::lock_guard lock(pend_lock);
    refs.fetch_add(1, std::memory_order_relaxed);  // the builder's, until it is done
    pending.store(true, std::memory_order_release);
    if (!transport::Engine::when_ready(finish_pending_cb, this)) {
        pending.store(false, std::memory_order_release);
        refs.fetch_sub(1, std::memory_order_relaxed);
    }
    move_to(Phase::attached);
}

// Until the engine exists, the kernel carries the bytes. Once a connection
// has asked for its upgrade, the calls never block in the kernel (it may
// turn direct meanwhile, and a thread blocked in recv would never see the
// fabric); they poll instead. Before it asks, nothing can upgrade it but
// a call of ours (it is in no registry), so a blocking recv is the
// kernel's own, one system call as without the library, and holds the
// ask back until it returns (kernel_waiters).
namespace {

// A pending connection's kernel I/O that would block (pending_io): the
// kernel socket ready, or one sleep of at most 10 ms on it, then back to
// the caller; the socket's deadline (EAGAIN) and a signal (EINTR unless
// the kernel would restart the call) as for any wait. No spin: nothing
// of ours can make the kernel socket ready.
struct KernelSlice : transport::BellWaiter {
    bool slept = false;
    long look() noexcept {
        if (slept) return 0;
        pollfd p{kfd, kevents, 0};
        return sys.poll(&p, 1, 0) > 0 ? 0 : transport::kWaitOn;
    }
    bool may_spin() const noexcept { return false; }
    int sleep(std::uint64_t) noexcept {
        pollfd p{kfd, kevents, 0};
        const int left = ms_left(deadline_ns);
        slept = true;
        return sys.poll(&p, 1, left < 0 ? 10 : std::min(10, left)) < 0 && errno == EINTR ? -EINTR
                                                                                          : 0;
    }
};

}  // namespace

SD_CHILD_PATH ssize_t Stream::pending_io(const iovec *iov, int iovcnt, int flags, bool out,
                           std::size_t &done) noexcept {
    const bool nb = nonblock.load(std::memory_order_relaxed) || (flags & MSG_DONTWAIT);
    const std::int64_t tmo = (out ? sndtimeo_ns : rcvtimeo_ns).load(std::memory_order_relaxed);
    const std::uint64_t deadline = tmo ? monotonic_ns() + std::uint64_t(tmo) : 0;
    std::size_t total = iov_total(iov, iovcnt);
    done = 0;
    if (transport::retired()) {
        // A retired process (chroot, seccomp, a change of ids) never
        // attaches, and while it holds the socket (its entry used) no
        // other holder takes it over: the kernel carries every call as
        // asked, blocking or not (one system call, as a sandbox allows),
        // counted for the holder that upgrades it after us.
        Sharers *sh = share.load(std::memory_order_acquire);
        Conn *c = sh ? nullptr : conn.load(std::memory_order_acquire);
        if (Sharers *to = sh ? sh : (c ? left_holders(c) : nullptr)) {
            const ssize_t n = out ? transport::kernel_writev(kfd(), iov, iovcnt, flags)
                                  : transport::kernel_readv(kfd(), iov, iovcnt, flags);
            if (n < 0) return -errno;
            if (n > 0 && !(flags & MSG_PEEK)) sharers_count(to, out, std::uint64_t(n));
            return n;
        }
    }
    for (;;) {
        ssize_t n;
        {
            std::unique_lock lock(pend_lock);
            Sharers *sh = share.load(std::memory_order_relaxed);
            // Left the fabric for sharing: our connection is final, counted
            // for the holders (reads only; sends count under tx_lock).
            Conn *c = sh ? nullptr : conn.load(std::memory_order_acquire);
            Sharers *left = c && !out ? left_holders(c) : nullptr;
            bool redo;
            if (sh) {
                // Taken over, it may go direct: its plain registrations
                // become shadows first, as this call ends.
                const bool plain = plain_n.load(std::memory_order_relaxed);
                if (plain) ask_deferred.store(true, std::memory_order_relaxed);
                redo = !plain && adopt_share(sh);
            } else if (left) {
                // Alone now: kernel mode again, unless a send of ours holds
                // the connection (its next call does it).
                if (transport::TxLock tx = transport::try_lock_tx(c)) redo = rejoin_locked(c, left);
                else redo = false;
            } else {
                redo = c || !pending.load(std::memory_order_relaxed);
            }
            if (redo) return -EALREADY;  // attached, or ours alone: redo
            iovec v[kMaxSlice];
            int k = slice(iov, iovcnt, done, total - done, v, kMaxSlice);
            if (!out && !nb && !sh && !left && earn_ns) {
                ++kernel_waiters;
                lock.unlock();
                // Like the recv of a connection on TCP for good: the
                // kernel waits, times out and restarts as it was asked.
                n = transport::kernel_readv(kfd(), v, k, flags);
                const int err = errno;
                lock.lock();
                --kernel_waiters;
                if (n > 0 && !(flags & MSG_PEEK)) {
                    // A fork while we waited made the socket shared: its
                    // holders count together from the counts at the fork.
                    if (Sharers *now = share.load(std::memory_order_relaxed)) {
                        sharers_count(now, false, std::uint64_t(n));
                    } else {
                        pre_rx += std::uint64_t(n);
                        if (earn_ns) ask_upgrade_locked();
                    }
                }
                if (n < 0) return done ? ssize_t(done) : -err;
                return ssize_t(done) + n;
            }
            n = on_kfd([&](int f) {
                return out ? transport::kernel_writev(f, v, k, flags | MSG_DONTWAIT)
                           : transport::kernel_readv(f, v, k, (flags & ~MSG_WAITALL) | MSG_DONTWAIT);
            });
            if (n > 0 && !(flags & MSG_PEEK)) {
                if (sh || left) {
                    sharers_count(sh ? sh : left, out, std::uint64_t(n));
                    ++take_calls;
                } else {
                    (out ? pre_tx : pre_rx) += std::uint64_t(n);
                    if (earn_ns) ask_upgrade_locked();
                }
                if (left) transport::bump(transport::stats(c).rx_kernel, std::uint64_t(n));
            }
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return done ? ssize_t(done) : -errno;
        if (n == 0 && !out) return ssize_t(done);
        if (n > 0) {
            done += std::size_t(n);
            bool whole = out || (flags & MSG_WAITALL);
            if (!whole || done == total || (flags & MSG_PEEK)) return ssize_t(done);
            continue;
        }
        if (nb) return done ? ssize_t(done) : -EAGAIN;
        // The kernel socket's readiness, one sleep of at most 10 ms at a
        // time: the loop above looks again whether the connection was
        // attached meanwhile (the builder clears `pending`).
        KernelSlice w;
        w.kfd = kfd();
        w.kevents = short(out ? POLLOUT : POLLIN);
        w.deadline_ns = deadline;
        w.timeout_ns = tmo;
        transport::SpinSlot slot;
        if (const long r = transport::wait_on_bell(w, slot); r < 0)
            return done ? ssize_t(done) : ssize_t(r);
    }
}

SD_CHILD_PATH Conn *Stream::attached_conn() noexcept {
    Phase p = phase.load(std::memory_order_acquire);
    if (p == Phase::connecting && !forked) {
        // Non-blocking connect: attach once the handshake is done (the
        // socket has a peer; its own name it has had since connect).
        sockaddr_storage peer;
        socklen_t len = sizeof peer;
        if (sys.getpeername(kfd(), reinterpret_cast<sockaddr *>(&peer), &len) == 0)
            connected(false);
    } else if ((p == Phase::deferred && !forked) || p == Phase::attaching) {
        connected(acceptor);
    }
    return conn.load(std::memory_order_acquire);
}

transport::SocketSide Stream::side() noexcept {
    return {engine, fd, fd_users, nonblock, sndtimeo_ns, kernel_wr_shut, closed_send, this};
}

bool Stream::closed_send(void *self, Conn *c) noexcept {
    return static_cast<Stream *>(self)->first_send_to_closed(c);
}

void Stream::set_conn(transport::Conn *c) noexcept {
    // seq_cst, then the ring: a sleep that registered on the attach mask
    // before this store is rung; one that registered after sees `c`
    // (enlist_stream looks again after registering).
    conn.store(c, std::memory_order_seq_cst);
    if (c) transport::wake_pollers(transport::attach_pollers());
}

bool Stream::may_go_direct() const noexcept {
    Phase p = phase.load(std::memory_order_acquire);
    if (p == Phase::fresh || p == Phase::listener || orphan.load(std::memory_order_acquire))
        return false;
    // A retired process attaches nothing: the kernel's readiness is the
    // socket's (and a sandbox may allow nothing else).
    if (transport::retired()) return false;
    if (Conn *c = conn.load(std::memory_order_acquire))
        return transport::state_of(c) != ConnState::final || left_holders(c);
    if (counting()) return true;
    // Connected, not attached yet: another thread's first call attaches it
    // (an application thread polling while another sends).
    return !forked && (p == Phase::connecting || p == Phase::deferred || p == Phase::attaching);
}

void Stream::count_after_leave(std::uint64_t n) noexcept {
    // Read on the kernel after our connection left the fabric (final):
    // past the offset its leave gave the holders.
    if (Sharers *h = holders.load(std::memory_order_acquire)) sharers_count(h, false, n);
}

SD_CHILD_PATH ssize_t Stream::recv_stream(const iovec *iov, int iovcnt, int flags) noexcept {
    if (kernel_only(flags)) {
        // Urgent data and the error queue are never carried on the fabric:
        // the companion socket answers (EINVAL or EAGAIN when it has
        // nothing, as on any TCP connection), and the stream stays intact.
        msghdr mh{};
        mh.msg_iov = const_cast<iovec *>(iov);
        mh.msg_iovlen = std::size_t(iovcnt);
        ssize_t n = sys.recvmsg(kfd(), &mh, flags);
        return n < 0 ? -errno : n;
    }
    if (!claim_inherited()) return orphan_error(false, flags);
    if (Prefix *p = prefix.load(std::memory_order_acquire)) {
        // Before anything the kernel socket holds.
        const ssize_t n = prefix_recv(p, iov, iovcnt, flags);
        const std::size_t total = iov_total(iov, iovcnt);
        if (n <= 0 || std::size_t(n) == total || !(flags & MSG_WAITALL)) {
            if (n != 0) return n;
        } else {
            iovec v[kMaxSlice];
            const int k = slice(iov, iovcnt, std::size_t(n), total - std::size_t(n), v, kMaxSlice);
            const ssize_t r = recv_stream(v, k, flags);
            return r < 0 ? n : n + r;
        }
    }
    Conn *c = attached_conn();
    // A redo can find the stream counting again: the last holder of a
    // socket shared through fork that adopted it may start by earning its
    // upgrade (pending), and its bytes must be counted from there too.
    for (int redo = 0; redo < 4 && ((!c && counting()) || (c && left_holders(c))); ++redo) {
        std::size_t done = 0;
        ssize_t n = pending_io(iov, iovcnt, flags, false, done);
        if (n != -EALREADY) return n;
        if (done) {
            // Attached in the middle of a MSG_WAITALL: the rest comes the new way.
            iovec v[kMaxSlice];
            int k = slice(iov, iovcnt, done, iov_total(iov, iovcnt) - done, v, kMaxSlice);
            ssize_t r = recv(v, k, flags);
            return r < 0 ? ssize_t(done) : ssize_t(done) + r;
        }
        c = attached_conn();
    }
    std::size_t total = iov_total(iov, iovcnt);
    if (!c || transport::state_of(c) == ConnState::final) {
        // On TCP for good: the kernel blocks as the application asked.
        // Only the counters are ours (no later switch needs rx_off).
        ssize_t n = transport::kernel_readv(kfd(), iov, iovcnt, flags);
        if (n < 0) return -errno;
        if (c && !(flags & MSG_PEEK)) {
            transport::stats(c).rx_kernel.fetch_add(std::uint64_t(n), std::memory_order_relaxed);
            count_after_leave(std::uint64_t(n));
        }
        return n;
    }
    if (flags & MSG_TRUNC) return recv_discard(total, flags);
    // Shut for reading: what is there (TCP keeps taking bytes), else EOF
    // at once.
    const bool shut = rd_shut.load(std::memory_order_relaxed);
    const bool nb = shut || nonblock.load(std::memory_order_relaxed) || (flags & MSG_DONTWAIT);
    const std::int64_t tmo = rcvtimeo_ns.load(std::memory_order_relaxed);
    std::uint64_t deadline = tmo ? monotonic_ns() + std::uint64_t(tmo) : 0;
    // A blocking recv's first look leaves out the probe of the companion
    // for the peer's end (a system call, where an answer is usually on its
    // way): its sleep watches the companion, and the look after it probes.
    // A non-blocking recv probes when it finds nothing (it does not wait),
    // paced (try_recv's probe_due), and a blocking one probes at once after
    // readiness saw the companion at its end.
    using transport::KernelLook;
    struct Bytes : transport::BellWaiter {
        Stream &st;
        const iovec *iov;
        int iovcnt;
        int flags;
        std::size_t total, target;
        bool nb, shut;
        KernelLook kl;
        std::size_t done = 0;

        long look() noexcept {
            ssize_t r = transport::try_recv(st.side(), c, iov, iovcnt, done, total, flags, kl);
            if (r == -ESTALE) return st.recv_after_leave(c, iov, iovcnt, done, total, flags);
            if (r > 0) {
                done += std::size_t(r);
                if ((flags & MSG_PEEK) || done >= target) return long(done);
                return transport::kMoved;
            }
            if (r == 0) return long(done);
            if (r != -EAGAIN) return done ? long(done) : r;
            if (nb) return done ? long(done) : shut ? 0 : -EAGAIN;
            return transport::kWaitOn;
        }
        long timed_out() noexcept { return done ? long(done) : -EAGAIN; }
        long missed(std::uint64_t) noexcept {
            // Write zero-copy: nothing to read, and a large buffer waits.
            if ((flags & MSG_PEEK) || !transport::is_direct(c) || !e->sink_ok()) return transport::kWaitOn;
            iovec piece{};
            slice(iov, iovcnt, done, total - done, &piece, 1);
            if (piece.iov_len < transport::settings().sink_min) return transport::kWaitOn;
            // The sink's wait spins on our slot (one waiter, one of the
            // host's slots), in a window of its own.
            ssize_t n = transport::recv_sink(st.side(), c, piece, deadline_ns, timeout_ns, *slot);
            if (n > 0) {
                done += std::size_t(n);
                if (done >= target) return long(done);
                return transport::kMoved;
            }
            if (n == -EINTR) return done ? long(done) : -EINTR;
            if (n == -EAGAIN) return transport::kMoved;  // look again, the usual way
            return transport::kWaitOn;
        }
        bool may_spin() const noexcept { return transport::is_direct(c); }
        bool quick_looks() const noexcept {
            return total - done < transport::settings().sink_min && transport::is_direct(c);
        }
        void spinning() noexcept { kl = KernelLook::none; }  // the fabric only: no syscalls
        long before_sleep() noexcept {
            kl = KernelLook::probe;
            ready = transport::upgrading(c) ? state_changed : readable;
            return transport::kWaitOn;
        }
        long interrupted() noexcept {
            const long r = BellWaiter::interrupted();
            return r == -EINTR && done ? long(done) : r;
        }
        transport::SpinSlot *slot;
    } w{{engine, c, readable, c, kfd(), POLLIN | POLLRDHUP,
         std::uint64_t(transport::settings().spin_us) * 1000, deadline, tmo},
        *this, iov, iovcnt, flags, total, recv_target(total, flags), nb, shut,
        nb ? KernelLook::paced : transport::kernel_eof_seen(c) ? KernelLook::probe : KernelLook::due};
    transport::SpinSlot slot;
    w.slot = &slot;
    return ssize_t(transport::wait_on_bell(w, slot));
}

// A recv whose connection left the fabric under it (try_recv's
// -ESTALE) with `done` bytes read: the rest the way the socket now goes.
ssize_t Stream::recv_after_leave(Conn *c, const iovec *iov, int iovcnt, std::size_t done,
                                 std::size_t total, int flags) noexcept {
    iovec v[kMaxSlice];
    int k = slice(iov, iovcnt, done, total - done, v, kMaxSlice);
    if (left_holders(c)) {
        // Left for sharing: counted for the holders, never blocking
        // in the kernel (this process may be left alone with it).
        ssize_t n = recv(v, k, flags);
        return n < 0 ? (done ? ssize_t(done) : n) : ssize_t(done) + n;
    }
    // Off the fabric now: the kernel has the rest, and blocks as
    // the application asked.
    ssize_t n = transport::kernel_readv(kfd(), v, k, flags);
    if (n < 0) return done ? ssize_t(done) : -errno;
    if (!(flags & MSG_PEEK)) {
        transport::stats(c).rx_kernel.fetch_add(std::uint64_t(n), std::memory_order_relaxed);
        count_after_leave(std::uint64_t(n));
    }
    return ssize_t(done) + n;
}

ssize_t Stream::kernel_send(const iovec *iov, int iovcnt, int flags, Conn *c) noexcept {
    ssize_t n = transport::kernel_writev(kfd(), iov, iovcnt, flags);
    if (n < 0) return -errno;
    if (c && engine) engine->judge_due(c, false, std::uint64_t(n));
    if (c) transport::sent_on_kernel(c, std::uint64_t(n));
    return n;
}

SD_CHILD_PATH ssize_t Stream::send_stream(const iovec *iov, int iovcnt, int flags) noexcept {
    if (!claim_inherited()) return orphan_error(true, flags);
    if (flags & MSG_OOB) leave_for_urgent();
    Conn *c = attached_conn();
    // As in recv_stream: an adopted share may be counting again.
    for (int redo = 0; redo < 4 && !c && counting(); ++redo) {
        std::size_t done = 0;
        ssize_t n = pending_io(iov, iovcnt, flags, true, done);  // the kernel raised SIGPIPE
        if (n != -EALREADY) return n;
        if (done) {
            // Attached in the middle of this send: the rest goes the new way,
            // after the bytes the kernel already took.
            iovec v[kMaxSlice];
            int k = slice(iov, iovcnt, done, iov_total(iov, iovcnt) - done, v, kMaxSlice);
            ssize_t r = send(v, k, flags);
            return r < 0 ? ssize_t(done) : ssize_t(done) + r;
        }
        c = attached_conn();
    }
    if (!c) return kernel_send(iov, iovcnt, flags, nullptr);
    const std::size_t total = iov_total(iov, iovcnt);
    std::size_t done = 0;
    for (;;) {
        // A connection that left the fabric for sharing comes back to
        // kernel mode here once this process holds it alone (rejoin_locked),
        // under pend_lock and tx_lock: pend_lock first, as the lock order
        // says.
        std::unique_lock pend(pend_lock, std::defer_lock);
        if (left_holders(c)) pend.lock();
        transport::TxLock tx = transport::lock_tx(c);
        if (pend.owns_lock() && !left_holders(c)) pend.unlock();
        // The caller's iov as it is, or (after a leave cut a send short)
        // what is left of it.
        iovec rest[kMaxSlice];
        const iovec *v = iov;
        int k = iovcnt;
        if (done) {
            k = slice(iov, iovcnt, done, total - done, rest, kMaxSlice);
            v = rest;
        }
        if (!transport::is_direct(c) || total == 0) {
            if (wr_shut(c) && transport::is_direct(c)) return epipe(flags);
            if (transport::gone(c) && transport::is_direct(c)) return send_nothing(c, flags);
            if (transport::leave_under_way(c)) {
                // Left the fabric: what is owed to the kernel goes first.
                // Owed bytes may take a while (the peer returns ours, the
                // kernel takes them): written without pend_lock, which a
                // recv on the kernel takes.
                if (pend.owns_lock() && transport::owes_kernel(c)) pend.unlock();
                const bool nb = nonblock.load(std::memory_order_relaxed) || (flags & MSG_DONTWAIT);
                const std::int64_t tmo = sndtimeo_ns.load(std::memory_order_relaxed);
                int rc = engine->leave_flush_locked(c, !nb, tmo ? monotonic_ns() + std::uint64_t(tmo) : 0);
                if (rc == -EPIPE || rc == -ECONNRESET) return done ? ssize_t(done) : epipe(flags);
                if (rc) return done ? ssize_t(done) : rc;
            }
            if (Sharers *h = left_holders(c)) {
                if (!pend.owns_lock()) {
                    // Left, or its owed bytes written, since this pass
                    // began: the next one takes both locks.
                    tx.unlock();
                    continue;
                }
                (void)rejoin_locked(c, h);  // alone: kernel mode, counted by c
            }
            if (pend.owns_lock()) pend.unlock();
            ssize_t r = kernel_send(v, k, flags, c);
            // Left for sharing: the holders count past our offsets (added
            // under this lock when the mark was set).
            Sharers *h = holders.load(std::memory_order_acquire);
            if (r > 0 && h && sharers_left(h)) sharers_count(h, true, std::uint64_t(r));
            // The upgrade finished while this send held the lock: the peer
            // must still learn our switch point, or its readiness (EPOLLOUT
            // after a full window) keeps asking an idle kernel socket.
            if (transport::is_direct(c)) engine->announce_switch_locked(c);
            if (r < 0) return done ? ssize_t(done) : r;
            return ssize_t(done) + r;
        }
        if (pend.owns_lock()) pend.unlock();
        bool left = false;
        ssize_t r =
            transport::direct_send(side(), c, v, k, done ? iov_total(v, k) : total, flags, &left);
        if (r > 0) engine->sent_past_fin_locked(c);
        // An error told is the reset drawn: no later send is taken silently.
        if (r == -EPIPE || r == -ECONNRESET) drew_reset.store(true, std::memory_order_release);
        if (!left) return r < 0 && done ? ssize_t(done) : (r < 0 ? r : ssize_t(done) + r);
        if (r > 0) done += std::size_t(r);
        const bool nb = nonblock.load(std::memory_order_relaxed) || (flags & MSG_DONTWAIT);
        if (done == total || (done && nb)) return ssize_t(done);
        // The connection leaves the fabric: let the leave through, then the
        // rest goes the kernel's way.
        tx.unlock();
        (void)transport::wait_until(
            {.nap_ns = 20000}, 0,
            [c] { return !transport::leave_wanted(c) || !transport::is_direct(c); },
            [this](std::uint64_t, std::uint64_t) {
                engine->progress();
                return true;
            });
    }
}

void Stream::flush() noexcept {
    Conn *c = conn.load(std::memory_order_acquire);
    if (!c || !transport::is_direct(c)) return;
    transport::TxLock tx = transport::lock_tx(c);
    (void)transport::flush_locked(side(), c, !nonblock.load(std::memory_order_relaxed), 0);
}

int Stream::shutdown(int how) noexcept {
    // A half-closed shared socket stays on TCP (the switch would not know
    // of the kernel's FIN).
    if (Sharers *sh = share.load(std::memory_order_acquire)) {
        sharers_stick(sh);
        drop_share();
    }
    (void)claim_inherited();
    if (Sharers *h = holders.load(std::memory_order_acquire)) sharers_stick(h);
    Conn *c = conn.load(std::memory_order_acquire);
    // An upgrade under way is waited for (bounded): shut down while the
    // responder commits, the connection would turn direct with its kernel
    // socket already shut, and nothing on the fabric would say so.
    if (c && engine) engine->await_upgrade(c);
    int kernel_how = how;
    if (c && how != SHUT_WR) transport::shut_read(c);
    // On the fabric (or leaving it): the kernel's FIN waits until a leave
    // has written what it owes the kernel socket, or until close.
    if (c && (how == SHUT_WR || how == SHUT_RDWR) && transport::shut_write(side(), c, shut_second))
        kernel_how = how == SHUT_RDWR ? SHUT_RD : -1;
    // Our state first: the kernel's shutdown wakes a thread blocked in
    // poll or epoll on the socket, which must then see both directions
    // shut (POLLHUP), as the kernel shows them at once; so must one whose
    // connection turns direct only afterwards (kernel_wr_shut).
    const bool rd = how == SHUT_RD || how == SHUT_RDWR;
    const bool wr = kernel_how == SHUT_WR || kernel_how == SHUT_RDWR;
    const bool was_shut = rd_shut.load(std::memory_order_relaxed);
    const bool was_wr_shut = kernel_wr_shut.load(std::memory_order_relaxed);
    // The write side first: a reader that sees rd_shut (acquire) sees it.
    if (wr) kernel_wr_shut.store(true, std::memory_order_release);
    if (rd) rd_shut.store(true, std::memory_order_release);
    if (kernel_how >= 0 && sys.shutdown(kfd(), kernel_how) != 0) {
        const int err = errno;
        if (rd) rd_shut.store(was_shut, std::memory_order_release);
        if (wr) kernel_wr_shut.store(was_wr_shut, std::memory_order_release);
        return -err;
    }
    return 0;
}

int Stream::readable_bytes() noexcept {
    (void)claim_inherited();
    Conn *c = attached_conn();
    int kernel = 0;
    if (sys.ioctl(kfd(), FIONREAD, &kernel) != 0) return -errno;
    if (Prefix *p = prefix.load(std::memory_order_acquire))
        kernel = int(std::min<std::uint64_t>(std::uint64_t(kernel) + prefix_left(p), 0x7fffffff));
    if (!c || !transport::may_read_fabric(c)) return kernel;
    engine->progress();
    const std::int64_t n = transport::readable_now(c, kernel);
    return n < 0 ? kernel : int(n);
}

SD_CHILD_PATH void Stream::last_close() noexcept {
    if (plain_n.load(std::memory_order_relaxed)) epoll_plain_closed(this);
    if (Sharers *sh = share.load(std::memory_order_acquire)) {
        // The last holder: the entry that said it was shared goes with it
        // (a process that forks a child per connection and lives on would
        // otherwise leave one per connection). Marks of a socket on TCP
        // for good stay: another process may hold it, unknown to us.
        std::uint64_t look_now = 0;
        if (mark.ino && sharers_alone(sh, &look_now)) transport::unmark_unattached(kfd(), mark);
        drop_share();  // one holder fewer
    }
    Conn *c = conn.load(std::memory_order_acquire);
    const bool on_fabric = c && engine && transport::on_fabric(c);
    if (Sharers *h = holders.exchange(nullptr, std::memory_order_acq_rel)) {
        // A process we forked may hold it still and use it after us: the
        // kernel must carry the connection before ours closes.
        std::uint64_t look_now = 0;
        const bool alone = sharers_alone(h, &look_now);
        sharers_leave(h);
        if (!alone && on_fabric) {
            if (const int rc = engine->leave(c, transport::Reason::shared); rc < 0)
                SD_LOG(error, "fd %d: closing while a process we forked holds it, and the "
                              "connection could not leave the fabric first: %s", kfd(),
                       std::strerror(-rc));
        } else if (!alone && c && engine && transport::state_of(c) != ConnState::final) {
            // Taken over from holders that still hold it, and not direct
            // (yet): our kernel offsets go back into their counts.
            (void)engine->hand_off(c, transport::Reason::shared);
        }
        // Took it over: the others may use it without asking us.
        sharers_disown(h, own_pid());
    } else if (forked && on_fabric) {
        if (const int rc = engine->leave(c, transport::Reason::shared); rc < 0)  // holders unknown
            SD_LOG(error, "fd %d: closing after a fork, and the connection could not leave the "
                          "fabric first: %s", kfd(), std::strerror(-rc));
    }
    if (!c) return;
    // SO_LINGER {1, 0}: an abortive close, whatever is unsent or unread.
    transport::close_conn(side(), c, linger_reset.load(std::memory_order_relaxed));
}

SD_CHILD_PATH void Stream::destroy() noexcept {
    Conn *c = conn.exchange(nullptr, std::memory_order_acq_rel);
    if (c) {
        // The handoff's room is the prefix's memory: gone with it.
        transport::set_handoff_room(c, transport::HandoffRoom{});
    }
    if (Prefix *p = prefix.exchange(nullptr, std::memory_order_acq_rel)) prefix_release(p);
    if (c) engine->detach(c);
}

}  // namespace sd::fallback
