// The real libc functions: every one the library calls in place of a
// symbol it hijacks, resolved once (dlsym RTLD_NEXT) in the library
// constructor (intercept/init.cpp, priority 101, before every other
// constructor of the library and before main(): a vfork child must never
// enter the dynamic linker to find execve) into this table, read-only
// afterwards. A shim may run before that constructor (called from
// another library's constructor: libcap-ng's reads /proc/self/status);
// until then each slot resolves the whole table first (sys.cpp). Every
// layer calls libc through it, so our own sockets, and those libfabric
// opens, never re-enter the shims.
// No symbol is versioned here: each is the default version, the one a
// program links against (no dlvsym).
#pragma once
#include <cstdarg>
#include <cstddef>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <poll.h>
#include <spawn.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/single_threaded.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

namespace sd::transport {

struct Sys {
    // Sockets, I/O, readiness: the library cannot run without them (a libc
    // that lacks one stops the process at load, with a line on stderr).
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
    ssize_t (*sendfile)(int, int, off_t *, size_t);
    ssize_t (*splice)(int, loff_t *, int, loff_t *, size_t, unsigned);
    // Newer than some libcs: null where this libc lacks it (the shim then
    // answers ENOSYS, as that libc would).
    int (*epoll_pwait2)(int, epoll_event *, int, const timespec *, const sigset_t *);

    // From here on, a function this libc lacks is not fatal: its slot holds
    // what the call does without it (sys.cpp), never null. Most answer
    // ENOSYS as a call of a libc without them would (-1 and errno; the
    // posix_spawn family returns ENOSYS; fdopen and popen null and errno;
    // sigset SIG_ERR); those with a kernel call of their own make it.
    int (*sendmmsg)(int, mmsghdr *, unsigned, int);              // raw syscall
    int (*recvmmsg)(int, mmsghdr *, unsigned, int, timespec *);  // raw syscall
    void (*closefrom)(int);                                      // close_range syscall
    FILE *(*fdopen)(int, const char *);
    FILE *(*fopen)(const char *, const char *);
    int (*vdprintf)(int, const char *, va_list);
    int (*vdprintf_chk)(int, int, const char *, va_list);  // __vdprintf_chk

    // Programs: the exec family (execv, execvp and the execl forms reach
    // execve and execvpe), posix_spawn and its file actions, system, popen.
    int (*execve)(const char *, char *const[], char *const[]);
    int (*execvpe)(const char *, char *const[], char *const[]);
    int (*fexecve)(int, char *const[], char *const[]);
    int (*execveat)(int, const char *, char *const[], char *const[], int);
    // Children made without the fork handlers (intercept/shim_child.cpp):
    // jumped to, never called from C (vfork's caller must be the one that
    // returns twice).
    void *vfork;
    void *Fork;   // _Fork (glibc 2.34 on; null before)
    void *clone;
    void *syscall;
    int (*posix_spawn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                       const posix_spawnattr_t *, char *const[], char *const[]);
    int (*posix_spawnp)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                        const posix_spawnattr_t *, char *const[], char *const[]);
    int (*spawn_actions_init)(posix_spawn_file_actions_t *);
    int (*spawn_actions_destroy)(posix_spawn_file_actions_t *);
    int (*spawn_addclose)(posix_spawn_file_actions_t *, int);
    int (*spawn_adddup2)(posix_spawn_file_actions_t *, int, int);
    int (*spawn_addopen)(posix_spawn_file_actions_t *, int, const char *, int, mode_t);
    // The *_np actions (glibc 2.29 and later).
    int (*spawn_addclosefrom)(posix_spawn_file_actions_t *, int);
    int (*spawn_addchdir)(posix_spawn_file_actions_t *, const char *);
    int (*spawn_addfchdir)(posix_spawn_file_actions_t *, int);
    int (*spawn_addtcsetpgrp)(posix_spawn_file_actions_t *, int);
    int (*system)(const char *);
    FILE *(*popen)(const char *, const char *);

    // Ids and sandboxes.
    int (*setuid)(uid_t);
    int (*setgid)(gid_t);
    int (*seteuid)(uid_t);
    int (*setegid)(gid_t);
    int (*setreuid)(uid_t, uid_t);
    int (*setregid)(gid_t, gid_t);
    int (*setresuid)(uid_t, uid_t, uid_t);
    int (*setresgid)(gid_t, gid_t, gid_t);
    int (*chroot)(const char *);
    int (*unshare)(int);
    int (*setns)(int, int);
    // Variadic in libc; called with all four words (those the option does
    // not use are ignored).
    int (*prctl)(int, unsigned long, unsigned long, unsigned long, unsigned long);

    // Signal dispositions.
    int (*sigaction)(int, const struct sigaction *, struct sigaction *);
    sighandler_t (*sigset)(int, sighandler_t);

    // The registration cache's memory hooks (intercept/shim_mem.cpp): the
    // next definition, the application's allocator or libc. They are
    // reached before the constructor (a sanitizer's runtime frees through
    // them while it starts) and while the table is being resolved (dlsym
    // may allocate and free): such a call on the resolving thread, before
    // its slot is set, gets the fallback (a free is dropped, a few bytes
    // once; realloc null; sbrk and brk -1; the others their raw syscall),
    // as does one whose function this libc lacks.
    void (*free)(void *);
    void *(*realloc)(void *, size_t);
    void *(*mmap)(void *, size_t, int, int, int, off_t);
    int (*munmap)(void *, size_t);
    void *(*mremap)(void *, size_t, size_t, int, ...);
    int (*madvise)(void *, size_t, int);
    int (*brk)(void *);
    void *(*sbrk)(intptr_t);
    int (*shmdt)(const void *);
};

// Filled by resolve_sys() (each slot calls it until then); valid for the
// whole life of the process.
extern Sys sys;
void resolve_sys() noexcept;

// Code that may run where instrumented code may not yet: ThreadSanitizer's
// runtime frees through the memory hooks while it starts, and in each new
// thread before the thread's state exists. The hooks, the slots they
// reach before the table is resolved and the resolution itself are built
// without its instrumentation.
#define SD_UNINSTRUMENTED __attribute__((no_sanitize_thread))

// The code a fork child runs in its handlers, and in its first calls on the
// connection it inherited (a read, a write, a close and its exit, as a
// forking server's child makes them), kept together on few pages: a child
// starts with none of the library's code mapped, and each 64 KiB window of
// it that the child runs costs a page fault (a forking server pays it per
// connection). The linker places these sections side by side.
#define SD_CHILD_PATH __attribute__((section(".text.hot.sdirect_child")))

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

// No thread but the caller was ever started in this process (glibc keeps
// the flag): no lock of ours can be held by another thread, so a fork's
// handlers need take none.
inline bool one_thread() noexcept { return __libc_single_threaded; }

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

// How many fds one kind of the library's own (copies of peers' eventfds,
// threads' bells for links) may hold at once: a sixteenth of the fd limit
// at the first call, 16 to 256, so that they never take the
// application's fds.
int fd_budget() noexcept;

}  // namespace sd::transport
