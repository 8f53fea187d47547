// Cases: socket options set and read back on connected sockets
// (socket(7), tcp(7)), and sendfile(2) / splice(2) into sockets.
#include "conform.hpp"

#include <cerrno>
#include <cstring>
#include <deque>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

namespace conform {
namespace {

struct IntOpt {
    const char *name;
    int level, opt, value;
    // The value before the set reflects TCP's own state (delayed-ACK mode),
    // which carries nothing on a direct connection: not compared.
    bool internal = false;
};

// Each: read, set, read back, then the connection still carries bytes.
const IntOpt kIntOpts[] = {
    {"nodelay", IPPROTO_TCP, TCP_NODELAY, 1},
    {"keepalive", SOL_SOCKET, SO_KEEPALIVE, 1},
    {"keepidle", IPPROTO_TCP, TCP_KEEPIDLE, 77},
    {"keepintvl", IPPROTO_TCP, TCP_KEEPINTVL, 13},
    {"keepcnt", IPPROTO_TCP, TCP_KEEPCNT, 4},
    {"user-timeout", IPPROTO_TCP, TCP_USER_TIMEOUT, 1234},
    {"reuseaddr", SOL_SOCKET, SO_REUSEADDR, 1},
    {"reuseport", SOL_SOCKET, SO_REUSEPORT, 1},
    {"sndbuf", SOL_SOCKET, SO_SNDBUF, 65536},
    {"rcvbuf", SOL_SOCKET, SO_RCVBUF, 65536},
    {"rcvlowat", SOL_SOCKET, SO_RCVLOWAT, 3},
    {"oobinline", SOL_SOCKET, SO_OOBINLINE, 1},
    {"priority", SOL_SOCKET, SO_PRIORITY, 3},
    {"tos", IPPROTO_IP, IP_TOS, 0x10},
    {"ttl", IPPROTO_IP, IP_TTL, 33},
    {"cork", IPPROTO_TCP, TCP_CORK, 1},
    {"quickack", IPPROTO_TCP, TCP_QUICKACK, 1, true},
    {"notsent-lowat", IPPROTO_TCP, TCP_NOTSENT_LOWAT, 16384},
    {"linger2", IPPROTO_TCP, TCP_LINGER2, 7},
    {"defer-accept", IPPROTO_TCP, TCP_DEFER_ACCEPT, 0},
    {"type", SOL_SOCKET, SO_TYPE, -1},
    {"domain", SOL_SOCKET, SO_DOMAIN, -1},
    {"protocol", SOL_SOCKET, SO_PROTOCOL, -1},
    {"acceptconn", SOL_SOCKET, SO_ACCEPTCONN, -1},
    {"error", SOL_SOCKET, SO_ERROR, -1},
};

template <std::size_t I>
void int_opt(Out &o) {
    const IntOpt &opt = kIntOpts[I];
    Pair p = make_pair();
    int v = -99;
    socklen_t len = sizeof v;
    o.r("get", ::getsockopt(p.a, opt.level, opt.opt, &v, &len));
    if (!opt.internal) o.n("v", v);
    if (opt.value >= 0) {
        o.r("set", ::setsockopt(p.a, opt.level, opt.opt, &opt.value, sizeof opt.value));
        v = -99;
        len = sizeof v;
        o.r("get2", ::getsockopt(p.a, opt.level, opt.opt, &v, &len));
        o.n("v2", v);
        o.n("len", len);
    } else {
        o.r("set-readonly", ::setsockopt(p.a, opt.level, opt.opt, &v, sizeof v));
    }
    int off = 0;
    ::setsockopt(p.a, IPPROTO_TCP, TCP_CORK, &off, sizeof off);
    o.r("send", ::send(p.a, "opt", 3, 0));
    char buf[4] = {};
    o.r("recv", ::recv(p.b, buf, 3, MSG_WAITALL));
    o.bytes("data", buf, 3);
    p.close_both();
}

std::deque<std::string> names;

template <std::size_t I>
void add_int_opts(std::vector<Case> &all) {
    if constexpr (I < std::size(kIntOpts)) {
        names.push_back(std::string("opt-") + kIntOpts[I].name);
        add(all, names.back().c_str(), int_opt<I>);
        add_int_opts<I + 1>(all);
    }
}

void opt_timeouts(Out &o) {
    Pair p = make_pair();
    timeval tv{1, 250000}, got{};
    socklen_t len = sizeof got;
    o.r("set-rcv", ::setsockopt(p.a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
    o.r("get-rcv", ::getsockopt(p.a, SOL_SOCKET, SO_RCVTIMEO, &got, &len));
    o.n("sec", got.tv_sec);
    o.n("usec", got.tv_usec);
    tv = {0, 300000};
    o.r("set-snd", ::setsockopt(p.a, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv));
    len = sizeof got;
    o.r("get-snd", ::getsockopt(p.a, SOL_SOCKET, SO_SNDTIMEO, &got, &len));
    o.n("usec2", got.tv_usec);
    tv = {0, 150000};
    ::setsockopt(p.a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char c;
    o.r("recv-times-out", ::recv(p.a, &c, 1, 0));
    p.close_both();
}

void opt_linger(Out &o) {
    Pair p = make_pair();
    linger l{}, got{};
    socklen_t len = sizeof got;
    o.r("get", ::getsockopt(p.a, SOL_SOCKET, SO_LINGER, &got, &len));
    o.n("onoff", got.l_onoff);
    l = {1, 9};
    o.r("set", ::setsockopt(p.a, SOL_SOCKET, SO_LINGER, &l, sizeof l));
    len = sizeof got;
    o.r("get2", ::getsockopt(p.a, SOL_SOCKET, SO_LINGER, &got, &len));
    o.n("onoff2", got.l_onoff);
    o.n("linger2", got.l_linger);
    o.r("set-short", ::setsockopt(p.a, SOL_SOCKET, SO_LINGER, &l, 4));
    p.close_both();
}

void opt_tcp_info(Out &o) {
    Pair p = make_pair();
    tcp_info ti{};
    socklen_t len = sizeof ti;
    o.r("get", ::getsockopt(p.a, IPPROTO_TCP, TCP_INFO, &ti, &len));
    o.n("state", ti.tcpi_state);
    ::shutdown(p.b, SHUT_WR);
    poll1(p.a, POLLRDHUP, 2000);
    msleep(50);
    len = sizeof ti;
    ::getsockopt(p.a, IPPROTO_TCP, TCP_INFO, &ti, &len);
    o.n("state-after-fin", ti.tcpi_state);
    char name[32] = {};
    len = sizeof name;
    o.r("congestion", ::getsockopt(p.a, IPPROTO_TCP, TCP_CONGESTION, name, &len));
    p.close_both();
}

void opt_listener(Out &o) {
    unsigned short port;
    const int l = make_listener(&port);
    int v = -1;
    socklen_t len = sizeof v;
    o.r("acceptconn", ::getsockopt(l, SOL_SOCKET, SO_ACCEPTCONN, &v, &len));
    o.n("v", v);
    int on = 1;
    o.r("nodelay", ::setsockopt(l, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on));
    const int c = connect_to(port);
    const int a = ::accept(l, nullptr, nullptr);
    handshake(c, a);
    len = sizeof v;
    ::getsockopt(a, IPPROTO_TCP, TCP_NODELAY, &v, &len);
    o.n("inherited-nodelay", v);
    ::close(a);
    ::close(c);
    ::close(l);
}

// ---- sendfile and splice ------------------------------------------------------------

void sendfile_offset(Out &o) {
    Pair p = make_pair();
    const int f = temp_file(100000);
    off_t off = 1000;
    o.r("sendfile", ::sendfile(p.a, f, &off, 50000));
    o.n("off", long(off));
    o.n("filepos", long(::lseek(f, 0, SEEK_CUR)));
    std::string got(50000, '\0');
    o.r("recv", ::recv(p.b, got.data(), got.size(), MSG_WAITALL));
    o.s("match", got == pattern(100000, 7).substr(1000, 50000) ? "yes" : "no");
    ::close(f);
    p.close_both();
}

void sendfile_position(Out &o) {
    Pair p = make_pair();
    const int f = temp_file(100000);
    ::lseek(f, 10, SEEK_SET);
    o.r("sendfile", ::sendfile(p.a, f, nullptr, 20000));
    o.n("filepos", long(::lseek(f, 0, SEEK_CUR)));
    o.r("sendfile-past-end", ::sendfile(p.a, f, nullptr, 200000));
    o.n("filepos2", long(::lseek(f, 0, SEEK_CUR)));
    o.r("sendfile-at-end", ::sendfile(p.a, f, nullptr, 10));
    std::string got(99990, '\0');
    o.r("recv", ::recv(p.b, got.data(), got.size(), MSG_WAITALL));
    o.s("match", got == pattern(100000, 7).substr(10) ? "yes" : "no");
    ::close(f);
    p.close_both();
}

void sendfile_errors(Out &o) {
    Pair p = make_pair();
    const int f = temp_file(100);
    off_t off = -1;
    o.r("neg-offset", ::sendfile(p.a, f, &off, 10));
    o.r("to-file", ::sendfile(f, p.b, nullptr, 10));
    o.r("bad-out", ::sendfile(999, f, nullptr, 10));
    const int ro = ::open("/proc/self/exe", O_RDONLY);
    o.r("zero", ::sendfile(p.a, ro, nullptr, 0));
    o.revents("peer-poll", poll1(p.b, POLLIN, 100));
    ::close(ro);
    ::close(f);
    p.close_both();
}

// The kernel takes no pipe and no socket as sendfile's source.
void sendfile_from_pipe(Out &o) {
    Pair p = make_pair();
    int fds[2];
    ::pipe(fds);
    o.r("empty-pipe", ::sendfile(p.a, fds[0], nullptr, 10));
    ::write(fds[1], "piped", 5);
    o.r("pipe", ::sendfile(p.a, fds[0], nullptr, 10));
    char buf[8] = {};
    o.r("pipe-left", ::read(fds[0], buf, sizeof buf));
    o.revents("peer-poll", poll1(p.b, POLLIN, 100));
    ::close(fds[0]);
    ::close(fds[1]);
    p.close_both();
}

void sendfile_from_socket(Out &o) {
    Pair p = make_pair();
    Pair q = make_pair();
    ::send(q.a, "sock", 4, 0);
    poll1(q.b, POLLIN, 2000);
    o.r("socket", ::sendfile(p.a, q.b, nullptr, 10));
    char buf[8] = {};
    o.r("socket-left", ::recv(q.b, buf, sizeof buf, MSG_DONTWAIT));
    o.r("empty-socket", ::sendfile(p.a, q.b, nullptr, 10));
    o.revents("peer-poll", poll1(p.b, POLLIN, 100));
    q.close_both();
    p.close_both();
}

void sendfile_nonblock_full(Out &o) {
    Pair p = make_pair();
    set_nonblock(p.a, true);
    const long filled = fill(p.a);
    const int f = temp_file(300000);
    o.r("sendfile", ::sendfile(p.a, f, nullptr, 300000));
    o.n("filepos", long(::lseek(f, 0, SEEK_CUR)));
    // Drain and send the rest: the receiver's copy must be exact.
    std::string got;
    long sent = 0;
    // Bounded well within the case's time, so that lost bytes show as a
    // mismatch rather than as a hang.
    for (int i = 0; i < 30 && sent < 300000; ++i) {
        drain(p.b, &got, 20);
        poll1(p.a, POLLOUT, 100);
        const ssize_t n = ::sendfile(p.a, f, nullptr, std::size_t(300000 - sent));
        if (n > 0) sent += n;
    }
    ::shutdown(p.a, SHUT_WR);
    drain(p.b, &got);
    o.n("sent", sent);
    o.s("match", long(got.size()) == filled + 300000 &&
                         got.compare(std::size_t(filled), 300000, pattern(300000, 7)) == 0
                     ? "yes"
                     : "no");
    ::close(f);
    p.close_both();
}

void splice_nonblock_full(Out &o) {
    Pair p = make_pair();
    set_nonblock(p.a, true);
    const long filled = fill(p.a);
    int fds[2];
    ::pipe(fds);
    const std::string data = pattern(60000, 9);
    ::write(fds[1], data.data(), data.size());
    o.r("splice", ::splice(fds[0], nullptr, p.a, nullptr, data.size(), SPLICE_F_NONBLOCK));
    std::string got;
    long moved = 0;
    for (int i = 0; i < 30 && moved < long(data.size()); ++i) {
        drain(p.b, &got, 20);
        poll1(p.a, POLLOUT, 100);
        const ssize_t n = ::splice(fds[0], nullptr, p.a, nullptr, data.size() - std::size_t(moved),
                                   SPLICE_F_NONBLOCK);
        if (n > 0) moved += n;
    }
    ::shutdown(p.a, SHUT_WR);
    drain(p.b, &got);
    o.n("moved", moved);
    o.s("match", long(got.size()) == filled + long(data.size()) &&
                         got.compare(std::size_t(filled), data.size(), data) == 0
                     ? "yes"
                     : "no");
    ::close(fds[0]);
    ::close(fds[1]);
    p.close_both();
}

void splice_from_socket(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "spliced!", 8, 0);
    poll1(p.b, POLLIN, 2000);
    int fds[2];
    ::pipe(fds);
    o.r("splice", ::splice(p.b, nullptr, fds[1], nullptr, 8, 0));
    char buf[16] = {};
    o.r("read-pipe", ::read(fds[0], buf, sizeof buf));
    o.bytes("data", buf, 8);
    ::close(fds[0]);
    ::close(fds[1]);
    p.close_both();
}

}  // namespace

void add_opt_cases(std::vector<Case> &all) {
    add_int_opts<0>(all);
    add(all, "opt-timeouts", opt_timeouts);
    add(all, "opt-linger", opt_linger);
    add(all, "opt-tcp-info", opt_tcp_info);
    add(all, "opt-listener-inherit", opt_listener);
}

void add_file_cases(std::vector<Case> &all) {
    add(all, "sendfile-offset", sendfile_offset);
    add(all, "sendfile-position", sendfile_position);
    add(all, "sendfile-errors", sendfile_errors);
    add(all, "sendfile-from-pipe", sendfile_from_pipe);
    add(all, "sendfile-from-socket", sendfile_from_socket);
    add(all, "sendfile-nonblock-full", sendfile_nonblock_full);
    add(all, "splice-nonblock-full", splice_nonblock_full);
    add(all, "splice-from-socket", splice_from_socket);
}

}  // namespace conform
