// Cases: calls on what is not a socket (closed fds, pipes, files) and
// invalid arguments on connected sockets (socket(7), send(2), recv(2)).
#include "conform.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

// The cases hand the kernel bad pointers and lengths on purpose.
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#pragma GCC diagnostic ignored "-Wstringop-overread"
#pragma GCC diagnostic ignored "-Wnonnull"

namespace conform {
namespace {

// Every call the library intercepts, on one fd that is not a connected
// socket of ours; `o` collects one result per call.
void every_call(Out &o, int fd) {
    char buf[8] = "abc";
    iovec iov{buf, 3};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    sockaddr_in sa{};
    socklen_t len = sizeof sa;
    int v = 1;
    socklen_t vl = sizeof v;
    o.r("send", ::send(fd, buf, 3, MSG_DONTWAIT | MSG_NOSIGNAL));
    o.r("recv", ::recv(fd, buf, 3, MSG_DONTWAIT));
    o.r("sendto", ::sendto(fd, buf, 3, MSG_DONTWAIT | MSG_NOSIGNAL, nullptr, 0));
    o.r("recvfrom", ::recvfrom(fd, buf, 3, MSG_DONTWAIT, nullptr, nullptr));
    o.r("sendmsg", ::sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL));
    o.r("recvmsg", ::recvmsg(fd, &mh, MSG_DONTWAIT));
    o.r("shutdown", ::shutdown(fd, SHUT_RDWR));
    o.r("getsockopt", ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &vl));
    o.r("setsockopt", ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, sizeof v));
    o.r("getpeername", ::getpeername(fd, reinterpret_cast<sockaddr *>(&sa), &len));
    len = sizeof sa;
    o.r("getsockname", ::getsockname(fd, reinterpret_cast<sockaddr *>(&sa), &len));
    o.r("listen", ::listen(fd, 1));
    o.r("accept", ::accept4(fd, nullptr, nullptr, SOCK_NONBLOCK));
}

void bad_fd(Out &o, int fd) {
    every_call(o, fd);
    char buf[4] = "abc";
    iovec iov{buf, 3};
    o.r("read", ::read(fd, buf, 3));
    o.r("write", ::write(fd, buf, 3));
    o.r("readv", ::readv(fd, &iov, 1));
    o.r("writev", ::writev(fd, &iov, 1));
    o.r("close", ::close(fd));
    o.r("fcntl", ::fcntl(fd, F_GETFL));
    pollfd p{fd, POLLIN | POLLOUT, 0};
    o.r("poll", ::poll(&p, 1, 0));
    o.revents("revents", p.revents);
}

void closed_number(Out &o) { bad_fd(o, 999); }
void negative_fd(Out &o) { bad_fd(o, -1); }

void closed_socket(Out &o) {
    Pair p = make_pair();
    const int fd = p.a;
    ::close(p.a);
    p.a = -1;
    bad_fd(o, fd);
    char c;
    o.r("peer-recv", ::recv(p.b, &c, 1, 0));
    p.close_both();
}

void on_pipe(Out &o) {
    int fds[2];
    ::pipe(fds);
    every_call(o, fds[0]);
    every_call(o, fds[1]);
    ::close(fds[0]);
    ::close(fds[1]);
}

void on_file(Out &o) {
    const int fd = temp_file(64);
    every_call(o, fd);
    ::close(fd);
}

void on_listener(Out &o) {
    unsigned short port;
    const int l = make_listener(&port);
    char buf[4] = "abc";
    o.r("send", ::send(l, buf, 3, MSG_NOSIGNAL));
    o.r("recv", ::recv(l, buf, 3, MSG_DONTWAIT));
    o.r("read", ::read(l, buf, 3));
    o.r("write", ::write(l, buf, 3));
    o.r("shutdown", ::shutdown(l, SHUT_RDWR));
    sockaddr_in sa{};
    socklen_t len = sizeof sa;
    o.r("getpeername", ::getpeername(l, reinterpret_cast<sockaddr *>(&sa), &len));
    ::close(l);
}

void unconnected(Out &o) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    char buf[4] = "abc";
    o.r("send", ::send(s, buf, 3, MSG_NOSIGNAL));
    o.r("recv", ::recv(s, buf, 3, MSG_DONTWAIT));
    o.r("read", ::read(s, buf, 3));
    o.r("write", ::write(s, buf, 3));
    o.r("shutdown", ::shutdown(s, SHUT_WR));
    o.revents("poll", poll1(s, POLLIN | POLLOUT | POLLRDHUP, 0));
    ::close(s);
}

// ---- invalid arguments on a connected pair ------------------------------------------

void send_efault(Out &o) {
    Pair p = make_pair();
    o.r("send", ::send(p.a, reinterpret_cast<void *>(8), 16, MSG_NOSIGNAL));
    o.r("write", ::write(p.a, reinterpret_cast<void *>(8), 16));
    o.r("send-ok", ::send(p.a, "ok", 2, 0));
    char buf[8];
    o.r("recv", ::recv(p.b, buf, sizeof buf, 0));
    o.bytes("data", buf, 2);
    p.close_both();
}

void recv_efault(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "abcd", 4, 0);
    poll1(p.b, POLLIN, 2000);
    o.r("recv", ::recv(p.b, reinterpret_cast<void *>(8), 4, 0));
    char buf[8] = {};
    o.r("recv-again", ::recv(p.b, buf, sizeof buf, MSG_DONTWAIT));
    o.bytes("data", buf, 4);
    p.close_both();
}

void recv_null_len(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "abcd", 4, 0);
    poll1(p.b, POLLIN, 2000);
    o.r("recv-null-0", ::recv(p.b, nullptr, 0, 0));
    char buf[8] = {};
    o.r("recv", ::recv(p.b, buf, sizeof buf, 0));
    o.bytes("data", buf, 4);
    p.close_both();
}

void sendmsg_efault(Out &o) {
    Pair p = make_pair();
    o.r("msg-null", ::sendmsg(p.a, nullptr, MSG_NOSIGNAL));
    msghdr mh{};
    mh.msg_iov = reinterpret_cast<iovec *>(8);
    mh.msg_iovlen = 1;
    o.r("iov-bad", ::sendmsg(p.a, &mh, MSG_NOSIGNAL));
    iovec iov{reinterpret_cast<void *>(8), 4};
    mh.msg_iov = &iov;
    o.r("base-bad", ::sendmsg(p.a, &mh, MSG_NOSIGNAL));
    o.revents("peer-poll", poll1(p.b, POLLIN, 100));
    p.close_both();
}

void recvmsg_efault(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "abcd", 4, 0);
    poll1(p.b, POLLIN, 2000);
    o.r("msg-null", ::recvmsg(p.b, nullptr, 0));
    msghdr mh{};
    mh.msg_iov = reinterpret_cast<iovec *>(8);
    mh.msg_iovlen = 1;
    o.r("iov-bad", ::recvmsg(p.b, &mh, 0));
    char buf[8] = {};
    o.r("recv", ::recv(p.b, buf, sizeof buf, MSG_DONTWAIT));
    o.bytes("data", buf, 4);
    p.close_both();
}

void iov_limits(Out &o) {
    Pair p = make_pair();
    static iovec many[IOV_MAX + 1];
    static char byte = 'z';
    for (iovec &v : many) v = {&byte, 1};
    o.r("writev-max+1", ::writev(p.a, many, IOV_MAX + 1));
    o.r("writev-neg", ::writev(p.a, many, -1));
    msghdr mh{};
    mh.msg_iov = many;
    mh.msg_iovlen = IOV_MAX + 1;
    o.r("sendmsg-max+1", ::sendmsg(p.a, &mh, MSG_NOSIGNAL));
    iovec huge[2] = {{&byte, SSIZE_MAX}, {&byte, SSIZE_MAX}};
    o.r("writev-overflow", ::writev(p.a, huge, 2));
    o.r("readv-max+1", ::readv(p.b, many, IOV_MAX + 1));
    o.revents("peer-poll", poll1(p.b, POLLIN, 100));
    p.close_both();
}

void bad_shutdown(Out &o) {
    Pair p = make_pair();
    o.r("how-7", ::shutdown(p.a, 7));
    o.r("how-neg", ::shutdown(p.a, -1));
    o.r("send", ::send(p.a, "x", 1, 0));
    char c;
    o.r("recv", ::recv(p.b, &c, 1, 0));
    o.bytes("data", &c, 1);
    p.close_both();
}

void bad_sockopt(Out &o) {
    Pair p = make_pair();
    int v = 1;
    socklen_t vl = sizeof v;
    o.r("set-short", ::setsockopt(p.a, IPPROTO_TCP, TCP_NODELAY, &v, 1));
    o.r("set-null", ::setsockopt(p.a, IPPROTO_TCP, TCP_NODELAY, nullptr, sizeof v));
    o.r("set-unknown", ::setsockopt(p.a, SOL_SOCKET, 9999, &v, sizeof v));
    o.r("set-level", ::setsockopt(p.a, 9999, 1, &v, sizeof v));
    o.r("get-null-len", ::getsockopt(p.a, SOL_SOCKET, SO_TYPE, &v, nullptr));
    vl = sizeof v;
    o.r("get-bad-ptr", ::getsockopt(p.a, SOL_SOCKET, SO_TYPE, reinterpret_cast<void *>(8), &vl));
    vl = sizeof v;
    o.r("get-unknown", ::getsockopt(p.a, IPPROTO_TCP, 9999, &v, &vl));
    timeval tv{0, 2000000};
    o.r("rcvtimeo-usec-range", ::setsockopt(p.a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
    o.r("rcvtimeo-short", ::setsockopt(p.a, SOL_SOCKET, SO_RCVTIMEO, &tv, 4));
    p.close_both();
}

void misuse(Out &o) {
    Pair p = make_pair();
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(dead_port());
    o.r("connect-connected", ::connect(p.a, reinterpret_cast<sockaddr *>(&sa), sizeof sa));
    o.r("bind-connected", ::bind(p.a, reinterpret_cast<sockaddr *>(&sa), sizeof sa));
    o.r("listen-connected", ::listen(p.a, 1));
    o.r("accept-connected", ::accept(p.a, nullptr, nullptr));
    o.r("sendto-addr", ::sendto(p.a, "q", 1, 0, reinterpret_cast<sockaddr *>(&sa), sizeof sa));
    char c = 0;
    o.r("recv", ::recv(p.b, &c, 1, 0));
    o.bytes("data", &c, 1);
    p.close_both();
}

void bad_flags(Out &o) {
    Pair p = make_pair();
    o.r("send-eor", ::send(p.a, "a", 1, MSG_EOR));
    o.r("send-confirm", ::send(p.a, "b", 1, MSG_CONFIRM));
    o.r("send-dontroute", ::send(p.a, "c", 1, MSG_DONTROUTE));
    char buf[8] = {};
    o.r("recv-cloexec", ::recv(p.b, buf, 3, MSG_WAITALL | MSG_CMSG_CLOEXEC));
    o.bytes("data", buf, 3);
    p.close_both();
}

void epoll_ctl_errors(Out &o) {
    Pair p = make_pair();
    const int ep = ::epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    o.r("add", ::epoll_ctl(ep, EPOLL_CTL_ADD, p.a, &ev));
    o.r("add-again", ::epoll_ctl(ep, EPOLL_CTL_ADD, p.a, &ev));
    o.r("mod-absent", ::epoll_ctl(ep, EPOLL_CTL_MOD, p.b, &ev));
    o.r("del-absent", ::epoll_ctl(ep, EPOLL_CTL_DEL, p.b, &ev));
    o.r("add-self", ::epoll_ctl(ep, EPOLL_CTL_ADD, ep, &ev));
    const int f = temp_file(4);
    o.r("add-file", ::epoll_ctl(ep, EPOLL_CTL_ADD, f, &ev));
    o.r("add-badfd", ::epoll_ctl(ep, EPOLL_CTL_ADD, 999, &ev));
    o.r("op-bad", ::epoll_ctl(ep, 99, p.b, &ev));
    o.r("wait-maxevents-0", ::epoll_wait(ep, &ev, 0, 0));
    o.r("wait-not-epoll", ::epoll_wait(p.a, &ev, 1, 0));
    o.r("del", ::epoll_ctl(ep, EPOLL_CTL_DEL, p.a, nullptr));
    ::close(f);
    ::close(ep);
    p.close_both();
}

void poll_errors(Out &o) {
    Pair p = make_pair();
    pollfd fds[3] = {{p.a, POLLIN | POLLOUT, 0}, {999, POLLIN, 0}, {-1, POLLIN, 0}};
    o.r("poll", ::poll(fds, 3, 0));
    o.revents("a", fds[0].revents);
    o.revents("closed", fds[1].revents);
    o.revents("negative", fds[2].revents);
    o.r("poll-efault", ::poll(reinterpret_cast<pollfd *>(8), 1, 0));
    o.r("poll-nfds", ::poll(fds, 1u << 30, 0));
    p.close_both();
}

void ioctl_cases(Out &o) {
    Pair p = make_pair();
    int v = -1;
    ::send(p.a, "12345", 5, 0);
    poll1(p.b, POLLIN, 2000);
    o.r("fionread", ::ioctl(p.b, FIONREAD, &v));
    o.n("avail", v);
    o.r("siocatmark", ::ioctl(p.b, SIOCATMARK, &v));
    o.n("mark", v);
    int on = 1;
    o.r("fionbio", ::ioctl(p.b, FIONBIO, &on));
    char buf[8];
    o.r("recv", ::recv(p.b, buf, sizeof buf, 0));
    o.r("recv-empty", ::recv(p.b, buf, sizeof buf, 0));
    o.r("fionread-bad", ::ioctl(p.b, FIONREAD, reinterpret_cast<int *>(8)));
    o.r("ioctl-unknown", ::ioctl(p.b, 0x7777, &v));
    p.close_both();
}

}  // namespace

void add_fd_cases(std::vector<Case> &all) {
    add(all, "fd-closed-number", closed_number);
    add(all, "fd-negative", negative_fd);
    add(all, "fd-closed-socket", closed_socket);
    add(all, "fd-pipe", on_pipe);
    add(all, "fd-regular-file", on_file);
    add(all, "fd-listener-io", on_listener);
    add(all, "fd-unconnected-io", unconnected);
    add(all, "arg-send-efault", send_efault);
    add(all, "arg-recv-efault", recv_efault);
    add(all, "arg-recv-null-len0", recv_null_len);
    add(all, "arg-sendmsg-efault", sendmsg_efault);
    add(all, "arg-recvmsg-efault", recvmsg_efault);
    add(all, "arg-iov-limits", iov_limits);
    add(all, "arg-shutdown-how", bad_shutdown);
    add(all, "arg-sockopt", bad_sockopt);
    add(all, "arg-misuse-connected", misuse);
    add(all, "arg-send-flags", bad_flags);
    add(all, "arg-epoll-ctl", epoll_ctl_errors);
    add(all, "arg-poll", poll_errors);
    add(all, "arg-ioctl", ioctl_cases);
}

}  // namespace conform
