// close_range and closefrom: many fds closed in one call. Every one of
// them that is ours goes the way close() takes (the peer learns of the
// last close of a connection, the table forgets the fd, so a number the
// kernel hands out again is never taken for the old socket); the kernel
// then closes the rest.
#include "shim.hpp"
#include "shm_fallback/readiness.hpp"

#include <climits>
#include <linux/close_range.h>
#include <sys/syscall.h>
#include <unistd.h>

using namespace sd::intercept;

namespace {

// The library's part of closing first..last: what close() does before
// the kernel's close, fd by fd.
void close_ours(unsigned first, unsigned last) noexcept {
    const int end = sd::fallback::table_size();
    for (unsigned fd = first; fd <= last && fd < unsigned(end); ++fd) {
        sd::fallback::epoll_fd_closed(int(fd));
        sd::fallback::Stream *s = sd::fallback::close_prepare(int(fd));
        if (!s) continue;
        sys.close(int(fd));
        sd::fallback::release(s);
    }
}

}  // namespace

SD_EXPORT int close_range(unsigned first, unsigned last, int flags) noexcept {
    // CLOSE_RANGE_CLOEXEC closes nothing (it marks the fds for exec, which
    // looks at every socket it keeps). Bad arguments: the kernel says so.
    const bool closes = !(flags & CLOSE_RANGE_CLOEXEC) &&
                        !(flags & ~(CLOSE_RANGE_CLOEXEC | CLOSE_RANGE_UNSHARE)) && first <= last;
    if (closes && !table_frozen()) {
        // CLOSE_RANGE_UNSHARE first gives the process a table of its own;
        // ours is this process's memory either way.
        close_ours(first, last);
    }
    return int(syscall(SYS_close_range, first, last, flags));
}

SD_EXPORT void closefrom(int lowfd) noexcept {
    if (lowfd < 0) lowfd = 0;
    if (!table_frozen()) close_ours(unsigned(lowfd), UINT_MAX);
    sys.closefrom(lowfd);
}
