// The real libc functions, resolved once (dlsym RTLD_NEXT) in the library
// constructor, or at the first call if another library's constructor calls
// first, into a table that is read-only afterwards. Every layer below the shims calls libc through it, so our own
// sockets, and those libfabric opens, never re-enter the shims.
#pragma once
#include <cstddef>
#include <csignal>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

namespace sd::transport {

struct Sys {
    int (*socket)(int, int, int);
    int (*bind)(int, const sockaddr *, socklen_t);
    int (*listen)(int, int);
    int (*connect)(int, const sockaddr *, socklen_t);
    int (*accept)(int, sockaddr *, socklen_t *);
    int (*accept4)(int, sockaddr *, socklen_t *, int);
    ssize_t (*read)(int, void *, size_t);
    ssize_t (*write)(int, const void *, size_t);
    ssize_t (*readv)(int, const iovec *, int);
    ssize_t (*writev)(int, const iovec *, int);
    ssize_t (*recv)(int, void *, size_t, int);
    ssize_t (*send)(int, const void *, size_t, int);
    ssize_t (*recvfrom)(int, void *, size_t, int, sockaddr *, socklen_t *);
    ssize_t (*sendto)(int, const void *, size_t, int, const sockaddr *, socklen_t);
    ssize_t (*recvmsg)(int, msghdr *, int);
    ssize_t (*sendmsg)(int, const msghdr *, int);
    int (*shutdown)(int, int);
    int (*close)(int);
    int (*dup)(int);
    int (*dup2)(int, int);
    int (*dup3)(int, int, int);
    int (*fcntl)(int, int, ...);
    int (*ioctl)(int, unsigned long, ...);
    int (*getsockopt)(int, int, int, void *, socklen_t *);
    int (*setsockopt)(int, int, int, const void *, socklen_t);
    int (*getsockname)(int, sockaddr *, socklen_t *);
    int (*getpeername)(int, sockaddr *, socklen_t *);
    int (*poll)(pollfd *, nfds_t, int);
    int (*ppoll)(pollfd *, nfds_t, const timespec *, const sigset_t *);
    int (*select)(int, fd_set *, fd_set *, fd_set *, timeval *);
    int (*pselect)(int, fd_set *, fd_set *, fd_set *, const timespec *, const sigset_t *);
    int (*epoll_create)(int);
    int (*epoll_create1)(int);
    int (*epoll_ctl)(int, int, int, epoll_event *);
    int (*epoll_wait)(int, epoll_event *, int, int);
    int (*epoll_pwait)(int, epoll_event *, int, int, const sigset_t *);
    int (*epoll_pwait2)(int, epoll_event *, int, const timespec *, const sigset_t *);
    ssize_t (*sendfile)(int, int, off_t *, size_t);
    ssize_t (*splice)(int, loff_t *, int, loff_t *, size_t, unsigned);
};

// Filled by resolve_sys() (each slot calls it until then); valid for the
// whole life of the process.
extern Sys sys;
void resolve_sys() noexcept;

// Calls made while a Guard is alive (libfabric, our control channel) go
// straight to libc even when they enter the shims.
extern thread_local int guard_depth;
struct Guard {
    Guard() noexcept { ++guard_depth; }
    ~Guard() { --guard_depth; }
    Guard(const Guard &) = delete;
    Guard &operator=(const Guard &) = delete;
};
inline bool guarded() noexcept { return guard_depth != 0; }

// A stream's bytes to or from its kernel socket, through the plainest call
// that does it: read/write for one buffer without flags, readv/writev for
// several, recv/send with flags, recvmsg/sendmsg for several with flags.
// The application's own calls then reach the kernel as the calls it made
// (a write as write): a seccomp sandbox allows those, and may kill the
// process on any other (OpenSSH's pre-auth child allows read and write,
// not sendmsg). -1 and errno, as libc.
ssize_t kernel_readv(int fd, const iovec *iov, int iovcnt, int flags) noexcept;
ssize_t kernel_writev(int fd, const iovec *iov, int iovcnt, int flags) noexcept;

// An fd of the library's own moved out of the way of the numbers the
// application is given next (dup'd to 3/4 of RLIMIT_NOFILE or above,
// close-on-exec; `fd` closed): a number it closed must stay closed for
// it, not come back as ours. `fd` itself if it cannot be moved.
int out_of_the_way(int fd) noexcept;

}  // namespace sd::transport
