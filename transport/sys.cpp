#include "sys.hpp"

#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>

namespace sd::transport {

Sys sys;
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
    if (sys.socket) return;
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
}

}  // namespace sd::transport
