// poll, ppoll, select, pselect and the epoll calls: readiness of direct
// sockets comes from shm_fallback/readiness; with none of our sockets
// involved each call goes straight to the kernel.
#include "shim.hpp"
#include "shm_fallback/readiness.hpp"
#include "transport/memguard.hpp"
#include "transport/wait.hpp"

#include <cerrno>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>

using namespace sd::intercept;
using sd::fallback::ms_of;
using sd::transport::monotonic_ns;

extern "C" [[noreturn]] void __chk_fail(void);

namespace {

bool ours_off() noexcept { return sd::transport::guarded(); }

// Linux writes the time left back into ppoll's and select's timeout.
template <typename Tmo>
void time_left(Tmo *tmo, std::uint64_t start, int ms) noexcept;

template <>
void time_left(timespec *ts, std::uint64_t start, int ms) noexcept {
    if (!ts || ms < 0) return;
    std::uint64_t spent = monotonic_ns() - start, total = std::uint64_t(ms) * 1000000ull;
    std::uint64_t left = spent >= total ? 0 : total - spent;
    ts->tv_sec = time_t(left / 1000000000ull);
    ts->tv_nsec = long(left % 1000000000ull);
}

template <>
void time_left(timeval *tv, std::uint64_t start, int ms) noexcept {
    if (!tv || ms < 0) return;
    std::uint64_t spent = monotonic_ns() - start, total = std::uint64_t(ms) * 1000000ull;
    std::uint64_t left = spent >= total ? 0 : total - spent;
    tv->tv_sec = time_t(left / 1000000000ull);
    tv->tv_usec = long(left % 1000000000ull / 1000);
}

bool fds_usable(const pollfd *fds, nfds_t n) noexcept {
    return n <= 1u << 20 && sd::transport::writable(const_cast<pollfd *>(fds), n * sizeof *fds);
}

bool sets_usable(int nfds, fd_set *rd, fd_set *wr, fd_set *ex) noexcept {
    if (nfds < 0 || nfds > FD_SETSIZE) return false;  // the kernel answers
    std::size_t bytes = std::size_t(nfds + 7) / 8;
    for (fd_set *s : {rd, wr, ex})
        if (s && !sd::transport::writable(s, bytes)) return false;
    return true;
}

}  // namespace

SD_EXPORT int poll(pollfd *fds, nfds_t n, int timeout) {
    if (ours_off() || !fds_usable(fds, n)) return sys.poll(fds, n, timeout);
    return ret(sd::fallback::poll_fds(fds, n, timeout < 0 ? -1 : timeout, nullptr));
}

SD_EXPORT int __poll_chk(pollfd *fds, nfds_t n, int timeout, size_t fdslen) {
    if (fdslen / sizeof *fds < n) __chk_fail();
    return poll(fds, n, timeout);
}

SD_EXPORT int ppoll(pollfd *fds, nfds_t n, const timespec *tmo, const sigset_t *mask) {
    if (ours_off() || !fds_usable(fds, n) ||
        (tmo && !sd::transport::readable(tmo, sizeof *tmo)))
        return sys.ppoll(fds, n, tmo, mask);
    int ms = ms_of(tmo);
    if (ms == -2) return sys.ppoll(fds, n, tmo, mask);  // EINVAL from the kernel
    std::uint64_t start = monotonic_ns();
    int r = sd::fallback::poll_fds(fds, n, ms, mask);
    time_left(const_cast<timespec *>(tmo), start, ms);
    return ret(r);
}

SD_EXPORT int __ppoll_chk(pollfd *fds, nfds_t n, const timespec *tmo, const sigset_t *mask,
                          size_t fdslen) {
    if (fdslen / sizeof *fds < n) __chk_fail();
    return ppoll(fds, n, tmo, mask);
}

SD_EXPORT int select(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, timeval *tmo) {
    if (ours_off() || !sets_usable(nfds, rd, wr, ex) ||
        (tmo && !sd::transport::writable(tmo, sizeof *tmo)))
        return sys.select(nfds, rd, wr, ex, tmo);
    int ms = ms_of(tmo);
    if (ms == -2) return sys.select(nfds, rd, wr, ex, tmo);
    std::uint64_t start = monotonic_ns();
    int r = sd::fallback::select_fds(nfds, rd, wr, ex, ms, nullptr);
    time_left(tmo, start, ms);
    return ret(r);
}

SD_EXPORT int pselect(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, const timespec *tmo,
                      const sigset_t *mask) {
    if (ours_off() || !sets_usable(nfds, rd, wr, ex) ||
        (tmo && !sd::transport::readable(tmo, sizeof *tmo)))
        return sys.pselect(nfds, rd, wr, ex, tmo, mask);
    int ms = ms_of(tmo);
    if (ms == -2) return sys.pselect(nfds, rd, wr, ex, tmo, mask);
    return ret(sd::fallback::select_fds(nfds, rd, wr, ex, ms, mask));
}

SD_EXPORT int epoll_create(int size) {
    int fd = sys.epoll_create(size);
    if (fd >= 0 && !ours_off()) sd::fallback::epoll_created(fd);
    return fd;
}

SD_EXPORT int epoll_create1(int flags) {
    int fd = sys.epoll_create1(flags);
    if (fd >= 0 && !ours_off()) sd::fallback::epoll_created(fd);
    return fd;
}

SD_EXPORT int epoll_ctl(int epfd, int op, int fd, epoll_event *ev) {
    if (ours_off()) return sys.epoll_ctl(epfd, op, fd, ev);
    return ret(sd::fallback::epoll_control(epfd, op, fd, ev));
}

namespace {
int epoll_wait_any(int epfd, epoll_event *ev, int max, int ms, const sigset_t *mask) noexcept {
    if (ours_off() || max <= 0 || !sd::transport::writable(ev, sizeof *ev))
        return mask ? sys.epoll_pwait(epfd, ev, max, ms, mask) : sys.epoll_wait(epfd, ev, max, ms);
    return ret(sd::fallback::epoll_wait_fds(epfd, ev, max, ms < 0 ? -1 : ms, mask));
}
}  // namespace

SD_EXPORT int epoll_wait(int epfd, epoll_event *ev, int max, int timeout) {
    return epoll_wait_any(epfd, ev, max, timeout, nullptr);
}

SD_EXPORT int epoll_pwait(int epfd, epoll_event *ev, int max, int timeout, const sigset_t *mask) {
    return epoll_wait_any(epfd, ev, max, timeout, mask);
}

SD_EXPORT int epoll_pwait2(int epfd, epoll_event *ev, int max, const timespec *tmo,
                           const sigset_t *mask) {
    if (!sys.epoll_pwait2) {
        errno = ENOSYS;
        return -1;
    }
    if (ours_off() || max <= 0 || (tmo && !sd::transport::readable(tmo, sizeof *tmo)))
        return sys.epoll_pwait2(epfd, ev, max, tmo, mask);
    int ms = ms_of(tmo);
    if (ms == -2) return sys.epoll_pwait2(epfd, ev, max, tmo, mask);
    return epoll_wait_any(epfd, ev, max, ms, mask);
}
