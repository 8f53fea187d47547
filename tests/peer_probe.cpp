// Invalid arguments. Every probe prints "probe NAME rc=R [errno=E]"; the
// harness compares the lines of a preloaded run with a run on the plain
// kernel, so nothing printed here may depend on ports, pids or timing.
#include "peer_drivers.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <vector>

namespace peer {

namespace {

void show(const char *name, long rc, int err) {
    if (rc < 0)
        note("probe %s rc=%ld errno=%s", name, rc, errno_name(err));
    else
        note("probe %s rc=%ld", name, rc);
}

// Evaluates the call with errno cleared and prints its result.
#define PROBE(name, call)                   \
    do {                                    \
        errno = 0;                          \
        long probe_rc_ = long(call);        \
        show(name, probe_rc_, errno);       \
    } while (0)

// Laundered through a volatile so the compiler cannot see it is invalid.
volatile std::uintptr_t bad_address = 8;
#define kBadPtr (reinterpret_cast<void *>(bad_address))

void not_a_socket(int family) {
    int p[2];
    if (pipe(p) != 0) fail("pipe: %s", errno_name(errno));
    char buf[16] = {};
    int v = 0;
    socklen_t len = sizeof v;
    sockaddr_storage ss;
    socklen_t sslen = loopback_addr(family, 9, &ss);
    iovec iov{buf, sizeof buf};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    PROBE("send_notsock", send(p[1], buf, 1, MSG_NOSIGNAL));
    PROBE("sendto_notsock", sendto(p[1], buf, 1, MSG_NOSIGNAL, nullptr, 0));
    PROBE("sendmsg_notsock", sendmsg(p[1], &msg, MSG_NOSIGNAL));
    PROBE("recv_notsock", recv(p[0], buf, sizeof buf, MSG_DONTWAIT));
    PROBE("recvfrom_notsock", recvfrom(p[0], buf, sizeof buf, MSG_DONTWAIT, nullptr, nullptr));
    PROBE("recvmsg_notsock", recvmsg(p[0], &msg, MSG_DONTWAIT));
    PROBE("getsockopt_notsock", getsockopt(p[0], SOL_SOCKET, SO_TYPE, &v, &len));
    PROBE("setsockopt_notsock", setsockopt(p[0], SOL_SOCKET, SO_KEEPALIVE, &v, sizeof v));
    PROBE("shutdown_notsock", shutdown(p[0], SHUT_RDWR));
    len = sizeof ss;
    PROBE("getpeername_notsock", getpeername(p[0], reinterpret_cast<sockaddr *>(&ss), &len));
    sslen = loopback_addr(family, 9, &ss);
    PROBE("connect_notsock", connect(p[0], reinterpret_cast<sockaddr *>(&ss), sslen));
    PROBE("accept_notsock", accept(p[0], nullptr, nullptr));
    PROBE("listen_notsock", listen(p[0], 1));
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    PROBE("send_devnull", send(devnull, buf, 1, MSG_NOSIGNAL));
    PROBE("recv_devnull", recv(devnull, buf, 1, 0));
    close(devnull);
    close(p[0]);
    close(p[1]);
}

void bad_descriptors(int fd) {
    char buf[16] = {};
    int v = 0;
    socklen_t len = sizeof v;
    iovec iov{buf, sizeof buf};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    PROBE("send_m1", send(-1, buf, 1, MSG_NOSIGNAL));
    PROBE("recv_m1", recv(-1, buf, 1, 0));
    PROBE("sendmsg_m1", sendmsg(-1, &msg, MSG_NOSIGNAL));
    PROBE("recvmsg_m1", recvmsg(-1, &msg, 0));
    PROBE("read_m1", read(-1, buf, 1));
    PROBE("write_m1", write(-1, buf, 1));
    PROBE("readv_m1", readv(-1, &iov, 1));
    PROBE("getsockopt_m1", getsockopt(-1, SOL_SOCKET, SO_TYPE, &v, &len));
    PROBE("shutdown_m1", shutdown(-1, SHUT_RDWR));
    PROBE("fcntl_m1", fcntl(-1, F_GETFL));
    PROBE("dup_m1", dup(-1));
    PROBE("close_m1", close(-1));
    int avail = 0;
    PROBE("ioctl_fionread_m1", ioctl(-1, FIONREAD, &avail));

    const int gone = dup(fd);
    PROBE("close_dup", close(gone));
    PROBE("send_closed", send(gone, buf, 1, MSG_NOSIGNAL));
    PROBE("recv_closed", recv(gone, buf, 1, 0));
    PROBE("write_closed", write(gone, buf, 1));
    PROBE("getpeername_closed", getpeername(gone, nullptr, nullptr));
    PROBE("fcntl_closed", fcntl(gone, F_GETFL));
    PROBE("close_closed", close(gone));
    PROBE("dup2_closed_source", dup2(gone, 500));
}

// Data is waiting; bad buffers must fail without consuming any of it.
void bad_buffers(int fd, const Options &opt) {
    const std::uint64_t seed = seed_of(opt, 1);
    Cmd cmd;
    cmd.op = Op::send;
    cmd.api = std::uint32_t(Tx::send);
    cmd.size = 100;
    cmd.seed = seed;
    cmd.chunk = 100;
    send_cmd(fd, cmd);
    int avail = 0;
    for (int i = 0; i < 5000 && avail < 100; ++i) {
        if (ioctl(fd, FIONREAD, &avail) != 0) fail("FIONREAD: %s", errno_name(errno));
        if (avail < 100) sleep_us(1000);
    }
    show("fionread_before", avail, 0);
    void *none = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (none == MAP_FAILED) fail("mmap: %s", errno_name(errno));
    PROBE("recv_badptr", recv(fd, kBadPtr, 100, 0));
    PROBE("read_protnone", read(fd, none, 100));
    PROBE("recv_peek_protnone", recv(fd, none, 100, MSG_PEEK));
    iovec iov{kBadPtr, 100};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    PROBE("recvmsg_badiov", recvmsg(fd, &msg, 0));
    PROBE("recvmsg_badmsg", recvmsg(fd, static_cast<msghdr *>(kBadPtr), 0));
    PROBE("readv_badiovarray", readv(fd, static_cast<iovec *>(kBadPtr), 1));
    avail = -1;
    PROBE("ioctl_fionread_badptr", ioctl(fd, FIONREAD, kBadPtr));
    ioctl(fd, FIONREAD, &avail);
    show("fionread_after_efault", avail, 0);
    recv_pattern(fd, Rx::recv, seed, 100, 100, "data after EFAULT");
    show("data_exact_after_efault", 1, 0);

    // Sends from bad buffers must inject nothing: the echo would fail.
    PROBE("send_badptr", send(fd, kBadPtr, 100, MSG_NOSIGNAL));
    PROBE("write_protnone", write(fd, none, 100));
    iov = {none, 100};
    PROBE("sendmsg_badiov", sendmsg(fd, &msg, MSG_NOSIGNAL));
    PROBE("sendmsg_badmsg", sendmsg(fd, static_cast<const msghdr *>(kBadPtr), MSG_NOSIGNAL));
    echo_round(fd, fd, 1000, seed_of(opt, 2));
    show("stream_intact_after_efault", 1, 0);
    munmap(none, 4096);
}

void bad_arguments(int fd) {
    char buf[16] = {};
    int v = 1;
    // A blocking zero-length recv waits for data (the kernel wants one byte).
    PROBE("recv_zero_len_dontwait", recv(fd, buf, 0, MSG_DONTWAIT));
    PROBE("send_zero_len", send(fd, buf, 0, MSG_NOSIGNAL));
    PROBE("recv_oob_none", recv(fd, buf, 1, MSG_OOB | MSG_DONTWAIT));
    std::vector<iovec> many(IOV_MAX + 1, iovec{buf, 1});
    msghdr big{};
    big.msg_iov = many.data();
    big.msg_iovlen = many.size();
    PROBE("sendmsg_too_many_iov", sendmsg(fd, &big, MSG_NOSIGNAL));
    PROBE("recvmsg_too_many_iov", recvmsg(fd, &big, MSG_DONTWAIT));
    PROBE("writev_too_many_iov", writev(fd, many.data(), int(many.size())));
    PROBE("setsockopt_bad_level", setsockopt(fd, 12345, 1, &v, sizeof v));
    socklen_t len = sizeof v;
    PROBE("getsockopt_bad_level", getsockopt(fd, 12345, 1, &v, &len));
    PROBE("setsockopt_bad_name", setsockopt(fd, SOL_SOCKET, 9999, &v, sizeof v));
    PROBE("setsockopt_short_len", setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &v, 1));
    PROBE("getsockopt_null_len", getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, nullptr));
    len = sizeof v;
    PROBE("getsockopt_bad_val", getsockopt(fd, SOL_SOCKET, SO_TYPE, kBadPtr, &len));
    len = 128;
    PROBE("getpeername_bad_addr",
          getpeername(fd, static_cast<sockaddr *>(kBadPtr), &len));
    sockaddr_storage ss{};
    PROBE("getsockname_bad_len",
          getsockname(fd, reinterpret_cast<sockaddr *>(&ss), static_cast<socklen_t *>(kBadPtr)));
    PROBE("ioctl_fionbio_badptr", ioctl(fd, FIONBIO, kBadPtr));
    PROBE("poll_badptr", poll(static_cast<pollfd *>(kBadPtr), 1, 0));
    PROBE("select_negative_nfds", select(-1, nullptr, nullptr, nullptr, nullptr));

    len = sizeof ss;
    getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &len);
    PROBE("connect_connected", connect(fd, reinterpret_cast<sockaddr *>(&ss), len));
    PROBE("listen_connected", listen(fd, 1));
    PROBE("accept_connected", accept(fd, nullptr, nullptr));
    sockaddr_storage any{};
    any.ss_family = ss.ss_family;
    PROBE("bind_connected", bind(fd, reinterpret_cast<sockaddr *>(&any), len));

    int ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    PROBE("epoll_ctl_add", epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
    PROBE("epoll_ctl_add_again", epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
    PROBE("epoll_ctl_del", epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr));
    PROBE("epoll_ctl_mod_absent", epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev));
    PROBE("epoll_ctl_self", epoll_ctl(ep, EPOLL_CTL_ADD, ep, &ev));
    close(ep);
}

void unconnected_sockets(int family) {
    char buf[16] = {};
    PROBE("socket_bad_family", socket(12345, SOCK_STREAM, 0));
    PROBE("socket_tcp_as_udp", socket(family, SOCK_STREAM, IPPROTO_UDP));
    int s = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    PROBE("shutdown_unconnected", shutdown(s, SHUT_RDWR));
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    PROBE("getpeername_unconnected", getpeername(s, reinterpret_cast<sockaddr *>(&ss), &len));
    PROBE("recv_unconnected", recv(s, buf, 1, MSG_DONTWAIT));
    PROBE("read_unconnected", read(s, buf, 1));
    PROBE("send_unconnected", send(s, buf, 1, MSG_NOSIGNAL));
    PROBE("accept_unconnected", accept(s, nullptr, nullptr));
    int err = -1;
    len = sizeof err;
    getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
    show("so_error_unconnected", err, 0);
    close(s);

    // A port that is bound but not listening refuses connections.
    int holder = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    socklen_t hlen = loopback_addr(family, 0, &ss);
    if (bind(holder, reinterpret_cast<sockaddr *>(&ss), hlen) != 0)
        fail("bind: %s", errno_name(errno));
    len = sizeof ss;
    getsockname(holder, reinterpret_cast<sockaddr *>(&ss), &len);
    s = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    PROBE("connect_refused", connect(s, reinterpret_cast<sockaddr *>(&ss), len));
    PROBE("connect_refused_again", connect(s, reinterpret_cast<sockaddr *>(&ss), len));
    PROBE("recv_after_refused", recv(s, buf, 1, MSG_DONTWAIT));
    close(s);
    s = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    errno = 0;
    int rc = connect(s, reinterpret_cast<sockaddr *>(&ss), len);
    int cerr = errno;
    pollfd p{s, POLLOUT, 0};
    int ready = poll(&p, 1, 5000);
    err = -1;
    socklen_t elen = sizeof err;
    getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &elen);
    // Whether the refusal shows in connect itself depends on timing.
    const bool refused = (rc == -1 && cerr == ECONNREFUSED) ||
                         (rc == -1 && cerr == EINPROGRESS && ready == 1 && err == ECONNREFUSED);
    show("connect_nonblocking_refused", refused ? 1 : 0, 0);
    close(s);
    close(holder);

    std::uint16_t port = 0;
    int l = listen_loopback(family, 4, &port);
    PROBE("recv_listener", recv(l, buf, 1, MSG_DONTWAIT));
    PROBE("send_listener", send(l, buf, 1, MSG_NOSIGNAL));
    len = sizeof ss;
    PROBE("getpeername_listener", getpeername(l, reinterpret_cast<sockaddr *>(&ss), &len));
    int fl = fcntl(l, F_GETFL);
    fcntl(l, F_SETFL, fl | O_NONBLOCK);
    PROBE("accept_nonblocking_empty", accept(l, nullptr, nullptr));
    PROBE("accept4_bad_flags", accept4(l, nullptr, nullptr, 0x7fff0000));
    int v = -1;
    len = sizeof v;
    getsockopt(l, SOL_SOCKET, SO_ACCEPTCONN, &v, &len);
    show("acceptconn_listener", v, 0);
    PROBE("shutdown_listener_wr", shutdown(l, SHUT_WR));
    close(l);
}

}  // namespace

void drive_bad_input(int *fd, const Options &opt) {
    const int family = family_of(opt);
    not_a_socket(family);
    bad_descriptors(*fd);
    bad_buffers(*fd, opt);
    bad_arguments(*fd);
    unconnected_sockets(family);
    echo_round(*fd, *fd, 2000, seed_of(opt, 3));
    send_exit(*fd);
    note("probe done");
}

}  // namespace peer
