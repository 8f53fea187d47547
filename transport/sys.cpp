#include "sys.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <type_traits>
#include <unistd.h>

namespace sd::transport {

namespace {

// The thread that runs resolve_sys(): its memory hooks' calls before their
// slots are set get their fallbacks (dlsym may free what it allocated;
// free resolved through itself would never return).
__attribute__((tls_model("initial-exec"))) thread_local bool resolving = false;

// Until resolve_sys() has run, every slot resolves the table first: a
// library whose constructor runs before ours (libcap-ng's reads
// /proc/self/status) may call the shims, which call through here.
template <auto M>
struct Lazy;
template <typename R, typename... A, R (*Sys::*M)(A...)>
struct Lazy<M> {
    static R call(A... a) {
        resolve_sys();
        return (sys.*M)(a...);
    }
};

// The variadic two (fcntl, ioctl): the optional third argument is one
// word (an int or a pointer) in every command the shims pass on.
template <auto M, typename Req>
int lazy_word(int fd, Req req, ...) {
    va_list ap;
    va_start(ap, req);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    resolve_sys();
    return (sys.*M)(fd, req, arg);
}

int lazy_epoll_pwait2(int epfd, epoll_event *ev, int max, const timespec *tmo,
                      const sigset_t *mask) {
    resolve_sys();
    if (!sys.epoll_pwait2) return errno = ENOSYS, -1;
    return sys.epoll_pwait2(epfd, ev, max, tmo, mask);
}

// What a call this libc lacks does instead (see sys.hpp).
template <typename R, typename... A>
R no_call(A...) {
    errno = ENOSYS;
    if constexpr (std::is_same_v<R, sighandler_t>)
        return SIG_ERR;
    else if constexpr (std::is_pointer_v<R>)
        return nullptr;
    else
        return R(-1);
}
// The posix_spawn family returns its error.
template <typename... A>
int no_spawn(A...) {
    return ENOSYS;
}
int raw_sendmmsg(int fd, mmsghdr *v, unsigned n, int flags) {
    return int(syscall(SYS_sendmmsg, fd, v, n, flags));
}
int raw_recvmmsg(int fd, mmsghdr *v, unsigned n, int flags, timespec *t) {
    return int(syscall(SYS_recvmmsg, fd, v, n, flags, t));
}
void raw_closefrom(int lowfd) { syscall(SYS_close_range, unsigned(lowfd), UINT_MAX, 0); }

// The memory hooks' fallbacks.
SD_UNINSTRUMENTED void no_free(void *) {}
SD_UNINSTRUMENTED void *no_realloc(void *, size_t) { return nullptr; }
SD_UNINSTRUMENTED void *raw_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    return reinterpret_cast<void *>(syscall(SYS_mmap, addr, len, prot, flags, fd, off));
}
SD_UNINSTRUMENTED int raw_munmap(void *addr, size_t len) {
    return int(syscall(SYS_munmap, addr, len));
}
SD_UNINSTRUMENTED void *raw_mremap(void *old, size_t old_len, size_t new_len, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    void *to = (flags & MREMAP_FIXED) ? va_arg(ap, void *) : nullptr;
    va_end(ap);
    return reinterpret_cast<void *>(syscall(SYS_mremap, old, old_len, new_len, flags, to));
}
SD_UNINSTRUMENTED int raw_madvise(void *addr, size_t len, int advice) {
    return int(syscall(SYS_madvise, addr, len, advice));
}
SD_UNINSTRUMENTED int no_brk(void *) { return -1; }
SD_UNINSTRUMENTED void *no_sbrk(intptr_t) { return reinterpret_cast<void *>(-1); }
SD_UNINSTRUMENTED int raw_shmdt(const void *addr) { return int(syscall(SYS_shmdt, addr)); }

// A memory hook's slot until the table is resolved: its fallback on the
// resolving thread, else the table resolved first.
template <auto M, auto Fallback>
struct LazyMem;
template <typename R, typename... A, R (*Sys::*M)(A...), auto Fallback>
struct LazyMem<M, Fallback> {
    SD_UNINSTRUMENTED static R call(A... a) {
        if (resolving) return Fallback(a...);
        resolve_sys();
        return (sys.*M)(a...);
    }
};

SD_UNINSTRUMENTED void *lazy_mremap(void *old, size_t old_len, size_t new_len, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    void *to = (flags & MREMAP_FIXED) ? va_arg(ap, void *) : nullptr;
    va_end(ap);
    if (resolving) return raw_mremap(old, old_len, new_len, flags, to);
    resolve_sys();
    return sys.mremap(old, old_len, new_len, flags, to);
}

}  // namespace

Sys sys = {
    Lazy<&Sys::socket>::call,
    Lazy<&Sys::bind>::call,
    Lazy<&Sys::listen>::call,
    Lazy<&Sys::connect>::call,
    Lazy<&Sys::accept>::call,
    Lazy<&Sys::accept4>::call,
    Lazy<&Sys::read>::call,
    Lazy<&Sys::write>::call,
    Lazy<&Sys::readv>::call,
    Lazy<&Sys::writev>::call,
    Lazy<&Sys::recv>::call,
    Lazy<&Sys::send>::call,
    Lazy<&Sys::recvfrom>::call,
    Lazy<&Sys::sendto>::call,
    Lazy<&Sys::recvmsg>::call,
    Lazy<&Sys::sendmsg>::call,
    Lazy<&Sys::shutdown>::call,
    Lazy<&Sys::close>::call,
    Lazy<&Sys::dup>::call,
    Lazy<&Sys::dup2>::call,
    Lazy<&Sys::dup3>::call,
    lazy_word<&Sys::fcntl, int>,
    lazy_word<&Sys::ioctl, unsigned long>,
    Lazy<&Sys::getsockopt>::call,
    Lazy<&Sys::setsockopt>::call,
    Lazy<&Sys::getsockname>::call,
    Lazy<&Sys::getpeername>::call,
    Lazy<&Sys::poll>::call,
    Lazy<&Sys::ppoll>::call,
    Lazy<&Sys::select>::call,
    Lazy<&Sys::pselect>::call,
    Lazy<&Sys::epoll_create>::call,
    Lazy<&Sys::epoll_create1>::call,
    Lazy<&Sys::epoll_ctl>::call,
    Lazy<&Sys::epoll_wait>::call,
    Lazy<&Sys::epoll_pwait>::call,
    Lazy<&Sys::sendfile>::call,
    Lazy<&Sys::splice>::call,
    lazy_epoll_pwait2,
    Lazy<&Sys::sendmmsg>::call,
    Lazy<&Sys::recvmmsg>::call,
    Lazy<&Sys::closefrom>::call,
    Lazy<&Sys::fdopen>::call,
    Lazy<&Sys::fopen>::call,
    Lazy<&Sys::vdprintf>::call,
    Lazy<&Sys::vdprintf_chk>::call,
    Lazy<&Sys::execve>::call,
    Lazy<&Sys::execvpe>::call,
    Lazy<&Sys::fexecve>::call,
    Lazy<&Sys::execveat>::call,
    // vfork, _Fork, clone, syscall: their entry points resolve the table
    // before they read it.
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    Lazy<&Sys::posix_spawn>::call,
    Lazy<&Sys::posix_spawnp>::call,
    Lazy<&Sys::spawn_actions_init>::call,
    Lazy<&Sys::spawn_actions_destroy>::call,
    Lazy<&Sys::spawn_addclose>::call,
    Lazy<&Sys::spawn_adddup2>::call,
    Lazy<&Sys::spawn_addopen>::call,
    Lazy<&Sys::spawn_addclosefrom>::call,
    Lazy<&Sys::spawn_addchdir>::call,
    Lazy<&Sys::spawn_addfchdir>::call,
    Lazy<&Sys::spawn_addtcsetpgrp>::call,
    Lazy<&Sys::system>::call,
    Lazy<&Sys::popen>::call,
    Lazy<&Sys::setuid>::call,
    Lazy<&Sys::setgid>::call,
    Lazy<&Sys::seteuid>::call,
    Lazy<&Sys::setegid>::call,
    Lazy<&Sys::setreuid>::call,
    Lazy<&Sys::setregid>::call,
    Lazy<&Sys::setresuid>::call,
    Lazy<&Sys::setresgid>::call,
    Lazy<&Sys::chroot>::call,
    Lazy<&Sys::unshare>::call,
    Lazy<&Sys::setns>::call,
    Lazy<&Sys::prctl>::call,
    Lazy<&Sys::sigaction>::call,
    Lazy<&Sys::sigset>::call,
    LazyMem<&Sys::free, no_free>::call,
    LazyMem<&Sys::realloc, no_realloc>::call,
    LazyMem<&Sys::mmap, raw_mmap>::call,
    LazyMem<&Sys::munmap, raw_munmap>::call,
    lazy_mremap,
    LazyMem<&Sys::madvise, raw_madvise>::call,
    LazyMem<&Sys::brk, no_brk>::call,
    LazyMem<&Sys::sbrk, no_sbrk>::call,
    LazyMem<&Sys::shmdt, raw_shmdt>::call,
};
thread_local int guard_depth = 0;

namespace {

// A plain word with __atomic builtins: read and written where
// instrumented code may not run (std::atomic's members are functions of
// their own, instrumented).
bool sys_resolved = false;

// Each slot is stored whole (a memory hook may read it on another
// thread meanwhile).
template <typename F>
SD_UNINSTRUMENTED void set_slot(F &slot, F f) noexcept {
    __atomic_store_n(&slot, f, __ATOMIC_RELEASE);
}
template <typename F>
SD_UNINSTRUMENTED void bind_real(F &slot, const char *name) noexcept {
    void *p = dlsym(RTLD_NEXT, name);
    if (!p) {
        std::fprintf(stderr, "sdirect: libc has no %s; cannot run\n", name);
        std::abort();
    }
    set_slot(slot, reinterpret_cast<F>(p));
}
// Newer calls an older libc may lack: the slot stays null.
template <typename F>
SD_UNINSTRUMENTED void bind_nullable(F &slot, const char *name) noexcept {
    set_slot(slot, reinterpret_cast<F>(dlsym(RTLD_NEXT, name)));
}
// A call the library must answer even where libc lacks it: `fallback`
// then (see sys.hpp).
template <typename F>
SD_UNINSTRUMENTED void bind_or(F &slot, const char *name, F fallback) noexcept {
    void *p = dlsym(RTLD_NEXT, name);
    set_slot(slot, p ? reinterpret_cast<F>(p) : fallback);
}
template <typename R, typename... A>
SD_UNINSTRUMENTED void bind_or_enosys(R (*&slot)(A...), const char *name) noexcept {
    bind_or(slot, name, &no_call<R, A...>);
}
template <typename... A>
SD_UNINSTRUMENTED void bind_spawn(int (*&slot)(A...), const char *name) noexcept {
    bind_or(slot, name, &no_spawn<A...>);
}
}  // namespace

SD_UNINSTRUMENTED void resolve_sys() noexcept {
    if (__atomic_load_n(&sys_resolved, __ATOMIC_ACQUIRE)) return;
    // Nested (a signal handler's call on this thread): resolved again,
    // whole, as the same values.
    const bool outer = resolving;
    resolving = true;
    // The memory hooks first: dlsym's own frees are forwarded once free
    // is set.
    bind_or(sys.free, "free", &no_free);
    bind_or(sys.realloc, "realloc", &no_realloc);
    bind_or(sys.mmap, "mmap", &raw_mmap);
    bind_or(sys.munmap, "munmap", &raw_munmap);
    bind_or(sys.mremap, "mremap", &raw_mremap);
    bind_or(sys.madvise, "madvise", &raw_madvise);
    bind_or(sys.brk, "brk", &no_brk);
    bind_or(sys.sbrk, "sbrk", &no_sbrk);
    bind_or(sys.shmdt, "shmdt", &raw_shmdt);

    bind_real(sys.socket, "socket");
    bind_real(sys.bind, "bind");
    bind_real(sys.listen, "listen");
    bind_real(sys.connect, "connect");
    bind_real(sys.accept, "accept");
    bind_real(sys.accept4, "accept4");
    bind_real(sys.read, "read");
    bind_real(sys.write, "write");
    bind_real(sys.readv, "readv");
    bind_real(sys.writev, "writev");
    bind_real(sys.recv, "recv");
    bind_real(sys.send, "send");
    bind_real(sys.recvfrom, "recvfrom");
    bind_real(sys.sendto, "sendto");
    bind_real(sys.recvmsg, "recvmsg");
    bind_real(sys.sendmsg, "sendmsg");
    bind_real(sys.shutdown, "shutdown");
    bind_real(sys.close, "close");
    bind_real(sys.dup, "dup");
    bind_real(sys.dup2, "dup2");
    bind_real(sys.dup3, "dup3");
    bind_real(sys.fcntl, "fcntl");
    bind_real(sys.ioctl, "ioctl");
    bind_real(sys.getsockopt, "getsockopt");
    bind_real(sys.setsockopt, "setsockopt");
    bind_real(sys.getsockname, "getsockname");
    bind_real(sys.getpeername, "getpeername");
    bind_real(sys.poll, "poll");
    bind_real(sys.sendfile, "sendfile");
    bind_real(sys.splice, "splice");
    bind_real(sys.ppoll, "ppoll");
    bind_real(sys.select, "select");
    bind_real(sys.pselect, "pselect");
    bind_real(sys.epoll_create, "epoll_create");
    bind_real(sys.epoll_create1, "epoll_create1");
    bind_real(sys.epoll_ctl, "epoll_ctl");
    bind_real(sys.epoll_wait, "epoll_wait");
    bind_real(sys.epoll_pwait, "epoll_pwait");
    bind_nullable(sys.epoll_pwait2, "epoll_pwait2");

    bind_or(sys.sendmmsg, "sendmmsg", &raw_sendmmsg);
    bind_or(sys.recvmmsg, "recvmmsg", &raw_recvmmsg);
    bind_or(sys.closefrom, "closefrom", &raw_closefrom);
    bind_or_enosys(sys.fdopen, "fdopen");
    bind_or_enosys(sys.fopen, "fopen");
    bind_or_enosys(sys.vdprintf, "vdprintf");
    bind_or_enosys(sys.vdprintf_chk, "__vdprintf_chk");

    bind_or_enosys(sys.execve, "execve");
    bind_or_enosys(sys.execvpe, "execvpe");
    bind_or_enosys(sys.fexecve, "fexecve");
    bind_real(sys.vfork, "vfork");
    bind_nullable(sys.Fork, "_Fork");
    bind_real(sys.clone, "clone");
    bind_real(sys.syscall, "syscall");
    bind_or_enosys(sys.execveat, "execveat");
    bind_spawn(sys.posix_spawn, "posix_spawn");
    bind_spawn(sys.posix_spawnp, "posix_spawnp");
    bind_spawn(sys.spawn_actions_init, "posix_spawn_file_actions_init");
    bind_spawn(sys.spawn_actions_destroy, "posix_spawn_file_actions_destroy");
    bind_spawn(sys.spawn_addclose, "posix_spawn_file_actions_addclose");
    bind_spawn(sys.spawn_adddup2, "posix_spawn_file_actions_adddup2");
    bind_spawn(sys.spawn_addopen, "posix_spawn_file_actions_addopen");
    bind_spawn(sys.spawn_addclosefrom, "posix_spawn_file_actions_addclosefrom_np");
    bind_spawn(sys.spawn_addchdir, "posix_spawn_file_actions_addchdir_np");
    bind_spawn(sys.spawn_addfchdir, "posix_spawn_file_actions_addfchdir_np");
    bind_spawn(sys.spawn_addtcsetpgrp, "posix_spawn_file_actions_addtcsetpgrp_np");
    bind_or_enosys(sys.system, "system");
    bind_or_enosys(sys.popen, "popen");

    bind_or_enosys(sys.setuid, "setuid");
    bind_or_enosys(sys.setgid, "setgid");
    bind_or_enosys(sys.seteuid, "seteuid");
    bind_or_enosys(sys.setegid, "setegid");
    bind_or_enosys(sys.setreuid, "setreuid");
    bind_or_enosys(sys.setregid, "setregid");
    bind_or_enosys(sys.setresuid, "setresuid");
    bind_or_enosys(sys.setresgid, "setresgid");
    bind_or_enosys(sys.chroot, "chroot");
    bind_or_enosys(sys.unshare, "unshare");
    bind_or_enosys(sys.setns, "setns");
    bind_or_enosys(sys.prctl, "prctl");

    bind_or_enosys(sys.sigaction, "sigaction");
    bind_or_enosys(sys.sigset, "sigset");
    resolving = outer;
    __atomic_store_n(&sys_resolved, true, __ATOMIC_RELEASE);
}

SD_CHILD_PATH ssize_t kernel_readv(int fd, const iovec *iov, int iovcnt, int flags) noexcept {
    if (iovcnt == 1)
        return flags ? sys.recv(fd, iov[0].iov_base, iov[0].iov_len, flags)
                     : sys.read(fd, iov[0].iov_base, iov[0].iov_len);
    if (!flags) return sys.readv(fd, iov, iovcnt);
    msghdr mh{};
    mh.msg_iov = const_cast<iovec *>(iov);
    mh.msg_iovlen = std::size_t(iovcnt);
    return sys.recvmsg(fd, &mh, flags);
}

SD_CHILD_PATH ssize_t kernel_writev(int fd, const iovec *iov, int iovcnt, int flags) noexcept {
    if (iovcnt == 1)
        return flags ? sys.send(fd, iov[0].iov_base, iov[0].iov_len, flags)
                     : sys.write(fd, iov[0].iov_base, iov[0].iov_len);
    if (!flags) return sys.writev(fd, iov, iovcnt);
    msghdr mh{};
    mh.msg_iov = const_cast<iovec *>(iov);
    mh.msg_iovlen = std::size_t(iovcnt);
    return sys.sendmsg(fd, &mh, flags);
}

int fd_budget() noexcept {
    static const int budget = [] {
        rlimit rl{};
        getrlimit(RLIMIT_NOFILE, &rl);
        const rlim_t lim = rl.rlim_cur == RLIM_INFINITY ? 4096 : rl.rlim_cur;
        return int(std::clamp<rlim_t>(lim / 16, 16, 256));
    }();
    return budget;
}

int out_of_the_way(int fd) noexcept {
    if (fd < 0) return fd;
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    const rlim_t lim = rl.rlim_cur == RLIM_INFINITY ? (1u << 20) : rl.rlim_cur;
    if (lim <= 64) return fd;
    const int high = sys.fcntl(fd, F_DUPFD_CLOEXEC, int(std::min<rlim_t>(lim, 1u << 20) * 3 / 4));
    if (high < 0) return fd;
    sys.close(fd);
    return high;
}

}  // namespace sd::transport
