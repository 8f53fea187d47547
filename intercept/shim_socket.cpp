// Socket life: socket, listen, connect, accept, shutdown, close, dup*,
// fcntl, ioctl, setsockopt.
// Our symbols must keep their plain names (fcntl, sendfile), not the
// *64 names glibc redirects them to under _FILE_OFFSET_BITS=64.
#undef _FILE_OFFSET_BITS
#include "shim.hpp"
#include "shm_fallback/readiness.hpp"
#include "transport/engine.hpp"
#include "transport/memguard.hpp"
#include "transport/settings.hpp"

#include <cstdarg>
#include <cstdint>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

using namespace sd::intercept;
using sd::fallback::Phase;
using sd::fallback::Stream;

namespace {

bool is_tcp(int domain, int type, int protocol) noexcept {
    return (domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM &&
           (protocol == 0 || protocol == IPPROTO_TCP);
}

int close_mapped(int fd) noexcept {
    sd::fallback::epoll_fd_closed(fd);
    Stream *s = sd::fallback::close_prepare(fd);
    int r = sys.close(fd);
    if (s) sd::fallback::release(s);
    return r;
}

void after_accept(CallRef &listener, int fd, int flags) noexcept {
    if (fd < 0 || !listener || sd::fallback::foreign_process()) return;
    Stream *s = sd::fallback::create(fd, listener->domain, flags & SOCK_NONBLOCK);
    if (s) s->accepted();
}

std::int64_t timeval_ns(const void *v, socklen_t len) noexcept {
    if (!v || len < sizeof(timeval)) return 0;
    const auto *tv = static_cast<const timeval *>(v);
    return std::int64_t(tv->tv_sec) * 1000000000 + std::int64_t(tv->tv_usec) * 1000;
}

}  // namespace

SD_EXPORT int socket(int domain, int type, int protocol) {
    int fd = sys.socket(domain, type, protocol);
    if (fd >= 0 && is_tcp(domain, type, protocol) && !table_frozen())
        sd::fallback::create(fd, domain, type & SOCK_NONBLOCK);
    return fd;
}

SD_EXPORT int listen(int fd, int backlog) {
    int r = sys.listen(fd, backlog);
    CallRef s(fd);
    if (r == 0 && s) {
        s->reset_to(Phase::listener);
        sd::transport::Engine::note_server();
        // A server: its connections ask for their upgrade as soon as they
        // earn it (earn.cpp). Its engine is built now, in the background,
        // where connections upgrade at once (SDIRECT_UPGRADE_AFTER_MS=0)
        // or SDIRECT_LISTEN_BUILD=1 asks; otherwise at its first ask, so
        // that a server forking a child per connection forks without
        // libfabric's mappings.
        const auto &set = sd::transport::settings();
        if (set.listen_build || !set.upgrade_after_ms) sd::transport::Engine::ready();
    }
    return r;
}

SD_EXPORT int connect(int fd, const sockaddr *addr, socklen_t len) {
    CallRef s(fd);
    // connect(AF_UNSPEC) disconnects a connected socket: the kernel's,
    // so the connection must be the kernel's first.
    if (s && addr && len >= sizeof(sa_family_t) && sd::transport::readable(addr, len) &&
        addr->sa_family == AF_UNSPEC)
        s->disconnect();
    // Upgrades at once: start building the engine now, so that it
    // overlaps the handshake.
    else if (s && !sd::transport::settings().upgrade_after_ms) sd::transport::Engine::ready();
    int r = sys.connect(fd, addr, len);
    if (!s) return r;
    int err = errno;
    if (r == 0) {
        s->connected(false);
    } else if ((err == EINPROGRESS || err == EALREADY || err == EINTR) &&
               !sd::transport::retired()) {
        // Attached at its first use; not in a retired process, whose
        // sandbox may forbid the getpeername that tells the handshake done.
        s->move(Phase::fresh, Phase::connecting);
    }
    keep_errno(err);
    return r;
}

SD_EXPORT int accept(int fd, sockaddr *addr, socklen_t *len) {
    int nfd = sys.accept(fd, addr, len);
    CallRef s(fd);
    int err = errno;
    after_accept(s, nfd, 0);
    keep_errno(err);
    return nfd;
}

SD_EXPORT int accept4(int fd, sockaddr *addr, socklen_t *len, int flags) {
    int nfd = sys.accept4(fd, addr, len, flags);
    CallRef s(fd);
    int err = errno;
    after_accept(s, nfd, flags);
    keep_errno(err);
    return nfd;
}

SD_EXPORT int shutdown(int fd, int how) {
    CallRef s(fd);
    if (!s || (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR))
        return sys.shutdown(fd, how);
    return ret(s->shutdown(how));
}

SD_EXPORT int close(int fd) {
    // Neither a socket of ours nor an epoll set (a file, a pipe): libc's
    // close, as close_mapped would make it, without table_frozen's getpid.
    if (sd::transport::guarded() ||
        (!sd::fallback::slot_taken(fd) && !sd::fallback::epoll_fd_known(fd)))
        return sys.close(fd);
    if (table_frozen()) return sys.close(fd);
    return close_mapped(fd);
}

SD_EXPORT int dup(int fd) {
    if (table_frozen()) return sys.dup(fd);
    int nfd = sys.dup(fd);
    CallRef s(fd);
    if (nfd >= 0 && s) sd::fallback::map_dup(nfd, s.get());
    if (nfd >= 0 && !s) sd::fallback::epoll_fd_dup(fd, nfd);
    return nfd;
}

namespace {
int dup_onto(int fd, int nfd, int r) noexcept {
    CallRef s(fd);
    if (r >= 0 && s && nfd != fd) sd::fallback::map_dup(nfd, s.get());
    if (r >= 0 && !s && nfd != fd) sd::fallback::epoll_fd_dup(fd, nfd);
    return r;
}
}  // namespace

SD_EXPORT int dup2(int fd, int nfd) {
    if (fd == nfd || table_frozen()) return sys.dup2(fd, nfd);
    // dup2 closes nfd first: for a socket of ours that is a close.
    sd::fallback::epoll_fd_closed(nfd);
    Stream *old = sd::fallback::close_prepare(nfd);
    int r = sys.dup2(fd, nfd);
    int err = errno;
    if (old) sd::fallback::release(old);
    r = dup_onto(fd, nfd, r);
    keep_errno(err);
    return r;
}

SD_EXPORT int dup3(int fd, int nfd, int flags) {
    if (fd == nfd || table_frozen()) return sys.dup3(fd, nfd, flags);
    sd::fallback::epoll_fd_closed(nfd);
    Stream *old = sd::fallback::close_prepare(nfd);
    int r = sys.dup3(fd, nfd, flags);
    int err = errno;
    if (old) sd::fallback::release(old);
    r = dup_onto(fd, nfd, r);
    keep_errno(err);
    return r;
}

namespace {
int fcntl_any(int fd, int cmd, void *arg) noexcept {
    int r = sys.fcntl(fd, cmd, arg);
    // Only a dup and F_SETFL change what we keep of an fd: every other
    // command (F_GETFL, F_GETFD, F_SETFD, locks ...) is the kernel's alone,
    // with no look-up of ours (a client's connect sets O_NONBLOCK with a
    // F_GETFL and a F_SETFL per connection).
    const bool dup = cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC;
    if (r < 0 || (!dup && cmd != F_SETFL) || sd::transport::guarded()) return r;
    if (dup && sd::fallback::foreign_process()) return r;
    CallRef s(fd);
    if (!s) {
        if (dup) sd::fallback::epoll_fd_dup(fd, r);
        return r;
    }
    if (dup)
        sd::fallback::map_dup(r, s.get());
    else
        s->nonblock.store((reinterpret_cast<std::intptr_t>(arg) & O_NONBLOCK) != 0);
    return r;
}
}  // namespace

SD_EXPORT int fcntl(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return fcntl_any(fd, cmd, arg);
}

SD_EXPORT int fcntl64(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    return fcntl_any(fd, cmd, arg);
}

SD_EXPORT int ioctl(int fd, unsigned long req, ...) {
    va_list ap;
    va_start(ap, req);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    CallRef s(fd);
    if (s && req == FIONREAD && s->conn.load() && sd::transport::is_direct(s->conn.load()) &&
        sd::transport::writable(arg, sizeof(int))) {
        int n = s->readable_bytes();
        if (n < 0) return ret(n);
        *static_cast<int *>(arg) = n;
        return 0;
    }
    if (s && req == SIOCATMARK && sd::transport::writable(arg, sizeof(int))) {
        int at = s->at_mark();
        if (at < 0) return ret(at);
        *static_cast<int *>(arg) = at;
        return 0;
    }
    int r = sys.ioctl(fd, req, arg);
    if (r == 0 && s && req == FIONBIO) s->nonblock.store(*static_cast<int *>(arg) != 0);
    return r;
}

// The companion answers every option; SO_ERROR also reports (and clears,
// as reading it does) a reset that came on the fabric, and TCP_INFO's
// state is what the fabric knows of the connection's end.
SD_EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len) {
    int r = sys.getsockopt(fd, level, name, val, len);
    if (r == 0 && level == IPPROTO_TCP && name == TCP_INFO && len && *len >= 1) {
        CallRef s(fd);
        auto *state = static_cast<std::uint8_t *>(val);
        if (s) *state = std::uint8_t(s->tcp_state(*state));
        return r;
    }
    if (r != 0 || level != SOL_SOCKET || name != SO_ERROR) return r;
    CallRef s(fd);
    if (!s || !len || *len < sizeof(int)) return r;
    const int ours = s->take_error();
    if (ours && *static_cast<int *>(val) == 0) *static_cast<int *>(val) = ours;
    return r;
}

SD_EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len) {
    // Always applied to the kernel socket: it validates, and it is what
    // carries the connection when it is not direct.
    int r = sys.setsockopt(fd, level, name, val, len);
    if (r != 0) return r;
    CallRef s(fd);
    if (!s) return r;
    int on = val && len >= sizeof(int) ? *static_cast<const int *>(val) : 0;
    if (level == SOL_SOCKET && name == SO_RCVTIMEO)
        s->rcvtimeo_ns.store(timeval_ns(val, len));
    else if (level == SOL_SOCKET && name == SO_SNDTIMEO)
        s->sndtimeo_ns.store(timeval_ns(val, len));
    else if (level == SOL_SOCKET && name == SO_RCVBUF && on > 0)
        s->rcvbuf.store(std::uint32_t(on));
    else if (level == SOL_SOCKET && name == SO_RCVLOWAT)
        s->rcvlowat.store(on < 0 ? 0x7fffffff : on == 0 ? 1 : on);  // as the kernel keeps it
    else if (level == SOL_SOCKET && name == SO_LINGER && len >= sizeof(linger)) {
        const auto *l = static_cast<const linger *>(val);
        s->linger_reset.store(l->l_onoff && l->l_linger == 0);
    }
    else if (level == IPPROTO_TCP && name == TCP_NODELAY) {
        s->nodelay.store(on != 0);
        if (on) s->flush();
    } else if (level == IPPROTO_TCP && name == TCP_CORK) {
        s->cork.store(on != 0);
        if (!on) s->flush();
    }
    return r;
}
