// Cases: calls real programs make on connections beside send and recv:
// sendmmsg(2) and recvmmsg(2), close_range(2), and FIONREAD.
#include "conform.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

namespace conform {
namespace {

// Three messages out in one call, read back in one call that takes what
// is there (MSG_WAITFORONE), then again with nothing left (non-blocking).
void mmsg_round(Out &o) {
    Pair p = make_pair();
    char m1[] = "first", m2[] = "the second message", m3[300];
    std::memset(m3, 'z', sizeof m3);
    iovec out[3] = {{m1, 5}, {m2, 18}, {m3, sizeof m3}};
    mmsghdr sv[3] = {};
    for (int i = 0; i < 3; ++i) {
        sv[i].msg_hdr.msg_iov = &out[i];
        sv[i].msg_hdr.msg_iovlen = 1;
    }
    o.r("sendmmsg", ::sendmmsg(p.a, sv, 3, MSG_NOSIGNAL));
    for (int i = 0; i < 3; ++i) o.n("sent_len", sv[i].msg_len);
    poll1(p.b, POLLIN, 2000);
    msleep(50);
    char in[3][200] = {};
    iovec iv[3] = {{in[0], 100}, {in[1], 100}, {in[2], 200}};
    mmsghdr rv[3] = {};
    for (int i = 0; i < 3; ++i) {
        rv[i].msg_hdr.msg_iov = &iv[i];
        rv[i].msg_hdr.msg_iovlen = 1;
    }
    // A stream: the bytes fill the buffers in order, whatever the sends.
    const int n = ::recvmmsg(p.b, rv, 3, MSG_WAITFORONE, nullptr);
    o.r("recvmmsg", n);
    std::string got;
    for (int i = 0; i < n && i < 3; ++i) {
        o.n("recv_len", rv[i].msg_len);
        got.append(in[i], rv[i].msg_len);
    }
    o.bytes("got", got.data(), got.size());
    o.r("recvmmsg_empty", ::recvmmsg(p.b, rv, 3, MSG_DONTWAIT, nullptr));
    o.r("recvmmsg_vlen0", ::recvmmsg(p.b, rv, 0, MSG_DONTWAIT, nullptr));
    p.close_both();
}

// sendmmsg to a peer that closed: the first call goes out (TCP takes it),
// then EPIPE, with MSG_NOSIGNAL no signal.
void mmsg_closed_peer(Out &o) {
    Pair p = make_pair();
    ::close(p.b);
    p.b = -1;
    msleep(20);
    char m[] = "ab";
    iovec v{m, 2};
    mmsghdr sv[2] = {};
    for (auto &h : sv) {
        h.msg_hdr.msg_iov = &v;
        h.msg_hdr.msg_iovlen = 1;
    }
    o.r("sendmmsg1", ::sendmmsg(p.a, sv, 2, MSG_NOSIGNAL));
    msleep(20);
    o.r("sendmmsg2", ::sendmmsg(p.a, sv, 2, MSG_NOSIGNAL));
    o.n("sigpipes", sigpipes_taken());
    p.close_both();
}

// close_range (glibc's) over a connection's fd: the number is closed
// (EBADF), the peer reads EOF; CLOSE_RANGE_CLOEXEC only marks a dup
// close-on-exec.
void close_range_socket(Out &o) {
    Pair p = make_pair();
    const int d = ::dup(p.a);
    o.r("cloexec", ::close_range(unsigned(d), unsigned(d), CLOSE_RANGE_CLOEXEC));
    o.r("fd_flags", ::fcntl(d, F_GETFD));
    o.r("send_on_dup", ::send(d, "k", 1, MSG_NOSIGNAL));
    char c = 0;
    o.r("peer_recv", ::recv(p.b, &c, 1, 0));
    o.r("close_range_dup", ::close_range(unsigned(d), unsigned(d), 0));
    o.r("send_closed", ::send(d, "k", 1, MSG_NOSIGNAL));
    o.r("close_range_a", ::close_range(unsigned(p.a), unsigned(p.a), 0));
    o.r("peer_recv_eof", ::recv(p.b, &c, 1, 0));
    p.a = -1;
    p.close_both();
}

// FIONREAD: what a recv would take now, after bytes arrived and after a
// partial read; SIOCINQ is the same request.
void fionread(Out &o) {
    Pair p = make_pair();
    int n = -1;
    o.r("empty", ::ioctl(p.b, FIONREAD, &n));
    o.n("empty_n", n);
    const std::string data = pattern(5000, 9);
    o.r("send", ::send(p.a, data.data(), data.size(), MSG_NOSIGNAL));
    poll1(p.b, POLLIN, 2000);
    msleep(50);
    o.r("after_send", ::ioctl(p.b, FIONREAD, &n));
    o.n("after_send_n", n);
    char buf[1200];
    o.r("recv", ::recv(p.b, buf, sizeof buf, 0));
    o.r("after_recv", ::ioctl(p.b, FIONREAD, &n));
    o.n("after_recv_n", n);
    p.close_both();
}

}  // namespace

void add_call_cases(std::vector<Case> &all) {
    add(all, "calls-mmsg-round", mmsg_round);
    add(all, "calls-mmsg-closed-peer", mmsg_closed_peer);
    add(all, "calls-close-range", close_range_socket);
    add(all, "calls-fionread", fionread);
}

}  // namespace conform
