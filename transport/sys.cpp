#include "sys.hpp"

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <sys/resource.h>

namespace sd::transport {

namespace {

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
    Lazy<&Sys::epoll_pwait2>::call,
    Lazy<&Sys::sendfile>::call,
    Lazy<&Sys::splice>::call,
};
std::atomic<bool> sys_resolved{false};
thread_local int guard_depth = 0;

namespace {
template <typename F>
void bind_real(F &slot, const char *name) noexcept {
    void *p = dlsym(RTLD_NEXT, name);
    if (!p) {
        std::fprintf(stderr, "sdirect: libc has no %s; cannot run\n", name);
        std::abort();
    }
    slot = reinterpret_cast<F>(p);
}
// Newer calls an older libc may lack: the slot stays null.
template <typename F>
void bind_optional(F &slot, const char *name) noexcept {
    slot = reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}
}  // namespace

void resolve_sys() noexcept {
    if (sys_resolved.load(std::memory_order_acquire)) return;
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
    bind_optional(sys.epoll_pwait2, "epoll_pwait2");
    sys_resolved.store(true, std::memory_order_release);
}

ssize_t kernel_readv(int fd, const iovec *iov, int iovcnt, int flags) noexcept {
    if (iovcnt == 1)
        return flags ? sys.recv(fd, iov[0].iov_base, iov[0].iov_len, flags)
                     : sys.read(fd, iov[0].iov_base, iov[0].iov_len);
    if (!flags) return sys.readv(fd, iov, iovcnt);
    msghdr mh{};
    mh.msg_iov = const_cast<iovec *>(iov);
    mh.msg_iovlen = std::size_t(iovcnt);
    return sys.recvmsg(fd, &mh, flags);
}

ssize_t kernel_writev(int fd, const iovec *iov, int iovcnt, int flags) noexcept {
    if (iovcnt == 1)
        return flags ? sys.send(fd, iov[0].iov_base, iov[0].iov_len, flags)
                     : sys.write(fd, iov[0].iov_base, iov[0].iov_len);
    if (!flags) return sys.writev(fd, iov, iovcnt);
    msghdr mh{};
    mh.msg_iov = const_cast<iovec *>(iov);
    mh.msg_iovlen = std::size_t(iovcnt);
    return sys.sendmsg(fd, &mh, flags);
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
