// The control channel: each process with an engine listens on a Unix
// SEQPACKET socket of its own (<registry>/ctl-<pid>), and its control
// thread answers what peers ask there: an upgrade (handshake.cpp), a
// holder's leave request (handoff.cpp), a kick to progress. Also the messages'
// sending and receiving (control.hpp).
#include "control.hpp"
#include "crossuser.hpp"
#include "engine.hpp"
#include "log.hpp"
#include "registry.hpp"
#include "settings.hpp"
#include "sys.hpp"
#include "wait.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>
#include <pthread.h>
#include <signal.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/un.h>
#include <unistd.h>

namespace sd::transport {
namespace {

void *control_thread(void *arg) noexcept {
    ++guard_depth;  // everything this thread does goes straight to libc
    static_cast<Engine *>(arg)->control_loop();
    return nullptr;
}

}  // namespace

void ctl_path(char *out, std::size_t n, pid_t pid, const char *dir) noexcept {
    std::snprintf(out, n, "%s/ctl-%d", dir ? dir : settings().registry, int(pid));
}

CtlMsg reply_to(pid_t self, CtlType type) noexcept {
    CtlMsg m{};
    m.magic = kCtlMagic;
    m.version = kCtlVersion;
    m.type = std::uint16_t(type);
    m.pid = self;
    return m;
}

ssize_t send_with_fds(int fd, const void *buf, std::size_t len, const int *fds, int nfds,
                      int flags) noexcept {
    iovec iov{const_cast<void *>(buf), len};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char cbuf[CMSG_SPACE(4 * sizeof(int))];
    if (nfds > 4) {
        errno = EINVAL;
        return -1;
    }
    if (nfds) {
        mh.msg_control = cbuf;
        mh.msg_controllen = CMSG_SPACE(std::size_t(nfds) * sizeof(int));
        cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(std::size_t(nfds) * sizeof(int));
        std::memcpy(CMSG_DATA(cm), fds, std::size_t(nfds) * sizeof(int));
    }
    return sys.sendmsg(fd, &mh, MSG_NOSIGNAL | flags);
}

int take_fds(const msghdr &mh, int *fds, int want) noexcept {
    int got = 0;
    for (cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(const_cast<msghdr *>(&mh), cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        int cnt = int((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < cnt; ++i) {
            int f;
            std::memcpy(&f, CMSG_DATA(cm) + std::size_t(i) * sizeof(int), sizeof f);
            if (got < want) fds[got++] = f;
            else sys.close(f);
        }
    }
    return got;
}

ssize_t send_ctl(int fd, const CtlMsg &m, const int *fds, int nfds, int flags) noexcept {
    return send_with_fds(fd, &m, sizeof m, fds, nfds, flags);
}

int recv_ctl(int fd, CtlMsg &m, int *fds, int want, int flags) noexcept {
    for (int i = 0; i < want; ++i) fds[i] = -1;
    iovec iov{&m, sizeof m};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char cbuf[CMSG_SPACE(4 * sizeof(int))];
    mh.msg_control = cbuf;
    mh.msg_controllen = sizeof cbuf;
    ssize_t n = sys.recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | flags);
    if (n < 0) return -errno;
    if (n == 0) return -EPIPE;  // the other side closed
    (void)take_fds(mh, fds, want);
    bool ok = n == sizeof m && !(mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) &&
              m.magic == kCtlMagic && m.version == kCtlVersion;
    if (!ok) {
        for (int i = 0; i < want; ++i)
            if (fds[i] >= 0) sys.close(fds[i]), fds[i] = -1;
        return -EPROTO;
    }
    return 0;
}

int recv_ctl_until(int fd, CtlMsg &m, int *fds, int want, std::uint64_t deadline_ns) noexcept {
    for (;;) {
        const std::uint64_t now = monotonic_ns();
        if (now >= deadline_ns) return -ETIMEDOUT;
        pollfd p{fd, POLLIN, 0};
        const int ms = int((deadline_ns - now + 999999) / 1000000);
        int n = sys.poll(&p, 1, ms);
        if (n < 0 && errno != EINTR) return -errno;
        if (n <= 0) continue;
        int rc = recv_ctl(fd, m, fds, want);
        if (rc == -EINTR || rc == -EAGAIN) continue;
        return rc == -ECONNRESET ? -EPIPE : rc;
    }
}

bool peer_cred_ok(int fd, pid_t expect_pid, unsigned *uid) noexcept {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (sys.getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
    if (expect_pid != 0 && cred.pid != expect_pid) return false;
    if (uid) *uid = unsigned(cred.uid);
    return cred.uid == getuid() || (uid && cross_user_on());
}

int Engine::start_control() noexcept {
    char path[300];
    ctl_path(path, sizeof path, pid_);
    (void)unlink(path);
    int fd = sys.socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    if (std::strlen(path) >= sizeof sa.sun_path) {
        sys.close(fd);
        return -ENAMETOOLONG;
    }
    std::strcpy(sa.sun_path, path);
    if (sys.bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0 ||
        sys.listen(fd, 128) != 0) {
        int err = errno;
        sys.close(fd);
        return -err;
    }
    ctl_fd_ = fd;
    open_registry(settings().registry, path);  // SDIRECT_CROSS_USER only
    // Without it, a peer attached while the control thread waits is
    // watched from its next wake-up on.
    watch_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    // The control thread must not take the application's signals.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    pthread_t tid;
    int rc = pthread_create(&tid, &attr, control_thread, this);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return -rc;
}

void Engine::control_loop() noexcept {
    // Our control socket, and the pidfds of the attached peers: an idle
    // cached peer whose process ended is dropped at once (peers.cpp).
    constexpr int kWatch = 2 + int(sizeof peers_ / sizeof peers_[0]);
    pollfd fds[kWatch];
    for (;;) {
        int n;
        {
            std::lock_guard busy(control_busy_);
            // Given up (afresh.cpp): the thread ends, and says so.
            if (given_up_.load(std::memory_order_acquire)) {
                control_gone_.store(true, std::memory_order_release);
                return;
            }
            n = gather_watch(fds, kWatch);
        }
        if (sys.poll(fds, nfds_t(n), -1) < 0) {
            if (errno != EINTR) usleep(1000);
            continue;
        }
        // Until the next sleep: a fork waits for this (park_for_fork).
        std::lock_guard busy(control_busy_);
        if (fds[1].revents & POLLIN) {
            std::uint64_t v;
            (void)sys.read(watch_fd_, &v, sizeof v);
        }
        bool ended = false;
        for (int i = 2; i < n; ++i) ended |= fds[i].revents != 0;
        if (ended) reap_ended_peers();
        if (!(fds[0].revents & POLLIN)) continue;
        int fd = sys.accept4(ctl_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE) {
                // Our peers' upgrade requests wait, and time out: say why once.
                static bool told = false;
                if (!std::exchange(told, true))
                    SD_LOG(info, "control channel: no fd to accept upgrade requests with "
                                 "(RLIMIT_NOFILE); peers asking now stay on TCP (timeout)");
                usleep(10000);
                continue;
            }
            SD_LOG(error, "control channel accept failed: %s", std::strerror(errno));
            return;
        }
        if (!given_up_.load(std::memory_order_acquire)) handle_request(fd);
        sys.close(fd);
    }
}

void Engine::handle_request(int fd) noexcept {
    CtlMsg req{};
    int fds[4];
    // The request is nearly always queued by the time we accept; a
    // client that connected and sends nothing gets a second.
    int got = recv_ctl(fd, req, fds, 4, MSG_DONTWAIT);
    if (got == -EAGAIN) got = recv_ctl_until(fd, req, fds, 4, monotonic_ns() + 1000000000ull);
    if (got != 0) return;
    int proof = fds[0], bell = fds[1], queue = fds[2], xbell = fds[3];
    if (req.type == std::uint16_t(CtlType::kick)) {
        for (int f : fds)
            if (f >= 0) sys.close(f);
        // Until the queue is empty (a sender may be waiting for room in
        // it), within a bound: new messages may keep coming.
        unsigned uid = 0;
        if (peer_cred_ok(fd, req.pid, &uid) && (uid == getuid() || is_peer(req.pid)))
            for (int pass = 0; pass < kKickPasses && progress(); ++pass) {
            }
        return;
    }
    if (req.type == std::uint16_t(CtlType::leave)) {
        if (bell >= 0) sys.close(bell);
        if (queue >= 0) sys.close(queue);
        if (xbell >= 0) sys.close(xbell);
        // A leave for good keeps its reason; any other is for sharing.
        const Reason why = req.status == std::uint32_t(Reason::exec) ||
                                   req.status == std::uint32_t(Reason::passed) ||
                                   req.status == std::uint32_t(Reason::privilege)
                               ? Reason(req.status)
                               : Reason::shared;
        return handle_leave(fd, req.pid, req.tuple, proof, why);
    }
    answer_upgrade(fd, req, proof, bell, queue, xbell);
}

void Engine::kick(const Peer *p) noexcept {
    if (!p || p->pid == pid_) {
        progress();
        return;
    }
    CtlMsg req = reply_to(pid_, CtlType::kick);
    char path[108];
    ctl_path(path, sizeof path, p->pid, p->cross ? p->dir : nullptr);
    // Non-blocking: a full backlog means its control thread is busy, and
    // the next kick tries again.
    int s = sys.socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0) return;
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, path, sizeof path);
    if (sys.connect(s, reinterpret_cast<sockaddr *>(&sa), sizeof sa) == 0)
        (void)send_ctl(s, req, nullptr, 0);
    sys.close(s);
}

std::uint64_t Engine::kick_overdue(const Peer *p, std::uint64_t asked_ns,
                                   std::uint64_t *kicked_ns) noexcept {
    const std::uint64_t now = monotonic_ns();
    std::uint64_t due = *kicked_ns ? *kicked_ns + kKickAgainNs : asked_ns + kKickAfterNs;
    if (now >= due) {
        kick(p);
        *kicked_ns = now;
        due = now + kKickAgainNs;
    }
    return due;
}

}  // namespace sd::transport
