// Cases: the ends of a connection (shutdown(2), close(2), SO_LINGER, RST),
// connect and accept errors, and pairs whose other end is a forked child.
#include "conform.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <deque>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace conform {
namespace {

constexpr short kAll = POLLIN | POLLPRI | POLLOUT | POLLRDHUP;

// ---- shutdown one way, then one kind of call -------------------------------------------

enum Obs { o_send, o_recv_pending, o_recv_empty, o_recv_later, o_poll, o_epoll, o_peer_recv,
           o_peer_send, o_again, o_sockinfo, o_count };
const char *const kObsNames[] = {"send", "recv-pending", "recv-empty", "recv-later", "poll",
                                 "epoll", "peer-recv", "peer-send", "again", "sockinfo"};
const char *const kHowNames[] = {"rd", "wr", "rdwr"};

template <int How, int Ob>
void after_shutdown(Out &o) {
    Pair p = make_pair();
    char buf[16] = {};
    if (Ob == o_recv_pending) {
        ::send(p.b, "pend", 4, 0);
        poll1(p.a, POLLIN, 2000);
    }
    o.r("shutdown", ::shutdown(p.a, How));
    if (How != SHUT_RD) poll1(p.b, POLLRDHUP, 2000);
    switch (Ob) {
        case o_send:
            o.r("send", ::send(p.a, "s", 1, 0));
            o.n("sigpipes", sigpipes_taken());
            break;
        case o_recv_pending:
            o.r("recv", ::recv(p.a, buf, sizeof buf, MSG_DONTWAIT));
            o.bytes("data", buf, 4);
            o.r("recv2", ::recv(p.a, buf, sizeof buf, MSG_DONTWAIT));
            break;
        case o_recv_empty:
            o.r("recv", ::recv(p.a, buf, sizeof buf, MSG_DONTWAIT));
            set_nonblock(p.a, true);
            o.r("read", ::read(p.a, buf, sizeof buf));
            break;
        case o_recv_later:
            o.r("peer-send", ::send(p.b, "late", 4, MSG_NOSIGNAL));
            msleep(50);
            o.r("recv", ::recv(p.a, buf, sizeof buf, MSG_DONTWAIT));
            o.r("recv2", ::recv(p.a, buf, sizeof buf, MSG_DONTWAIT));
            break;
        case o_poll:
            o.revents("self", poll1(p.a, kAll, 100));
            o.revents("peer", poll1(p.b, kAll, 100));
            break;
        case o_epoll: {
            const int ep = ::epoll_create1(EPOLL_CLOEXEC);
            epoll_event ev{};
            ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLPRI;
            ev.data.fd = p.a;
            ::epoll_ctl(ep, EPOLL_CTL_ADD, p.a, &ev);
            ev.data.fd = p.b;
            ::epoll_ctl(ep, EPOLL_CTL_ADD, p.b, &ev);
            epoll_event got[2] = {};
            const int n = ::epoll_wait(ep, got, 2, 100);
            o.n("ready", n);
            unsigned self = 0, peer = 0;
            for (int i = 0; i < n; ++i) (got[i].data.fd == p.a ? self : peer) = got[i].events;
            o.epevents("self", self);
            o.epevents("peer", peer);
            ::close(ep);
            break;
        }
        case o_peer_recv:
            o.r("peer-recv", ::recv(p.b, buf, sizeof buf, MSG_DONTWAIT));
            o.r("peer-recv2", ::recv(p.b, buf, sizeof buf, MSG_DONTWAIT));
            break;
        case o_peer_send:
            o.r("peer-send", ::send(p.b, "ps", 2, MSG_NOSIGNAL));
            msleep(50);
            o.revents("peer", poll1(p.b, kAll, 100));
            o.r("peer-send2", ::send(p.b, "ps", 2, MSG_NOSIGNAL));
            break;
        case o_again:
            o.r("same", ::shutdown(p.a, How));
            o.r("rdwr", ::shutdown(p.a, SHUT_RDWR));
            o.r("peer-wr", ::shutdown(p.b, SHUT_WR));
            poll1(p.a, POLLRDHUP, 500);
            o.r("recv", ::recv(p.a, buf, sizeof buf, MSG_DONTWAIT));
            break;
        case o_sockinfo: {
            int err = -1;
            socklen_t len = sizeof err;
            o.r("so_error", ::getsockopt(p.a, SOL_SOCKET, SO_ERROR, &err, &len));
            o.n("err", err);
            sockaddr_in sa{};
            len = sizeof sa;
            o.r("getpeername", ::getpeername(p.a, reinterpret_cast<sockaddr *>(&sa), &len));
            break;
        }
    }
    p.close_both();
}

std::deque<std::string> names;

template <int How, int Ob>
void add_obs(std::vector<Case> &all) {
    if constexpr (Ob < o_count) {
        names.push_back(std::string("shut-") + kHowNames[How] + "-" + kObsNames[Ob]);
        add(all, names.back().c_str(), after_shutdown<How, Ob>);
        add_obs<How, Ob + 1>(all);
    }
}

// ---- close ---------------------------------------------------------------------------------

// What the survivor sees after its peer's end went away.
void survivor(Out &o, int fd) {
    char buf[16] = {};
    o.revents("poll", poll1(fd, kAll, 2000));
    o.r("recv", ::recv(fd, buf, sizeof buf, MSG_DONTWAIT));
    o.r("recv2", ::recv(fd, buf, sizeof buf, MSG_DONTWAIT));
    o.r("send", ::send(fd, "x", 1, MSG_NOSIGNAL));
    msleep(20);
    o.r("send2", ::send(fd, "x", 1, MSG_NOSIGNAL));
    int err = -1;
    socklen_t len = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    o.n("so_error", err);
}

void close_clean(Out &o) {
    Pair p = make_pair();
    o.r("close", ::close(p.b));
    p.b = -1;
    poll1(p.a, POLLRDHUP, 2000);
    survivor(o, p.a);
    p.close_both();
}

void close_unread(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "unread", 6, 0);
    poll1(p.b, POLLIN, 2000);
    o.r("close", ::close(p.b));
    p.b = -1;
    poll1(p.a, POLLERR, 2000);
    survivor(o, p.a);
    p.close_both();
}

void close_read_then(Out &o) {
    Pair p = make_pair();
    ::send(p.b, "bye", 3, 0);
    o.r("close", ::close(p.b));
    p.b = -1;
    char buf[8] = {};
    o.r("recv", ::recv(p.a, buf, sizeof buf, MSG_WAITALL));
    o.bytes("data", buf, 3);
    o.r("eof", ::recv(p.a, buf, sizeof buf, 0));
    p.close_both();
}

void linger_zero(Out &o) {
    Pair p = make_pair();
    linger l{1, 0};
    o.r("setsockopt", ::setsockopt(p.b, SOL_SOCKET, SO_LINGER, &l, sizeof l));
    o.r("close", ::close(p.b));
    p.b = -1;
    poll1(p.a, POLLERR, 2000);
    survivor(o, p.a);
    p.close_both();
}

void linger_zero_data(Out &o) {
    Pair p = make_pair();
    ::send(p.b, "lost?", 5, 0);
    poll1(p.a, POLLIN, 2000);
    linger l{1, 0};
    ::setsockopt(p.b, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    o.r("close", ::close(p.b));
    p.b = -1;
    poll1(p.a, POLLERR, 2000);
    survivor(o, p.a);
    p.close_both();
}

void linger_some(Out &o) {
    Pair p = make_pair();
    linger l{1, 2};
    ::setsockopt(p.b, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    ::send(p.b, "lingered", 8, 0);
    o.r("close", ::close(p.b));
    p.b = -1;
    char buf[16] = {};
    o.r("recv", ::recv(p.a, buf, sizeof buf, MSG_WAITALL));
    o.bytes("data", buf, 8);
    p.close_both();
}

void close_staged(Out &o) {
    Pair p = make_pair();
    set_nonblock(p.a, true);
    const long sent = fill(p.a);
    o.s("filled", sent > 0 ? "yes" : "no");
    o.r("close", ::close(p.a));
    p.a = -1;
    std::string got;
    o.r("drain", drain(p.b, &got));
    o.s("all-delivered", long(got.size()) == sent ? "yes" : "no");
    p.close_both();
}

void close_twice(Out &o) {
    Pair p = make_pair();
    const int fd = p.a;
    o.r("close", ::close(fd));
    o.r("close-again", ::close(fd));
    p.a = -1;
    char c;
    o.r("peer-recv", ::recv(p.b, &c, 1, 0));
    p.close_both();
}

void dup_close(Out &o) {
    Pair p = make_pair();
    const int d = ::dup(p.a);
    o.r("close-orig", ::close(p.a));
    p.a = d;
    o.revents("peer-poll", poll1(p.b, POLLIN | POLLRDHUP, 100));
    o.r("send-dup", ::send(d, "dup", 3, 0));
    char buf[4] = {};
    o.r("peer-recv", ::recv(p.b, buf, 3, MSG_WAITALL));
    o.bytes("data", buf, 3);
    p.close_both();
}

void peername_after(Out &o) {
    Pair p = make_pair();
    sockaddr_in mine{}, peer{};
    socklen_t len = sizeof mine;
    ::getsockname(p.b, reinterpret_cast<sockaddr *>(&mine), &len);
    ::close(p.b);
    p.b = -1;
    poll1(p.a, POLLRDHUP, 2000);
    len = sizeof peer;
    o.r("after-fin", ::getpeername(p.a, reinterpret_cast<sockaddr *>(&peer), &len));
    o.s("same", peer.sin_port == mine.sin_port && peer.sin_addr.s_addr == mine.sin_addr.s_addr ? "yes" : "no");
    ::send(p.a, "x", 1, MSG_NOSIGNAL);  // answered by a reset
    poll1(p.a, POLLERR, 2000);
    len = sizeof peer;
    o.r("after-rst", ::getpeername(p.a, reinterpret_cast<sockaddr *>(&peer), &len));
    p.close_both();
}

void names_match(Out &o) {
    Pair p = make_pair();
    sockaddr_in a_name{}, a_peer{}, b_name{}, b_peer{};
    socklen_t len = sizeof a_name;
    o.r("a-name", ::getsockname(p.a, reinterpret_cast<sockaddr *>(&a_name), &len));
    len = sizeof a_peer;
    o.r("a-peer", ::getpeername(p.a, reinterpret_cast<sockaddr *>(&a_peer), &len));
    len = sizeof b_name;
    o.r("b-name", ::getsockname(p.b, reinterpret_cast<sockaddr *>(&b_name), &len));
    len = 4;
    o.r("b-peer-short", ::getpeername(p.b, reinterpret_cast<sockaddr *>(&b_peer), &len));
    o.n("len", len);
    o.s("cross", std::memcmp(&a_name, &b_peer, 4) == 0 && a_peer.sin_port == b_name.sin_port ? "yes" : "no");
    p.close_both();
}

struct Blocked {
    int fd;
    ssize_t ret;
    int err;
    char buf[16];
};

void *blocked_recv(void *arg) {
    auto *b = static_cast<Blocked *>(arg);
    b->ret = ::recv(b->fd, b->buf, sizeof b->buf, 0);
    b->err = errno;
    return nullptr;
}

void close_other_thread(Out &o) {
    Pair p = make_pair();
    timeval tv{2, 0};
    ::setsockopt(p.b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    Blocked b{p.b, -2, 0, {}};
    pthread_t t;
    pthread_create(&t, nullptr, blocked_recv, &b);
    msleep(200);
    o.r("close", ::close(p.b));
    p.b = -1;
    msleep(100);
    o.r("peer-send", ::send(p.a, "after", 5, MSG_NOSIGNAL));
    pthread_join(t, nullptr);
    errno = b.err;
    o.r("blocked-recv", b.ret);
    p.close_both();
}

void shutdown_other_thread(Out &o) {
    Pair p = make_pair();
    Blocked b{p.b, -2, 0, {}};
    pthread_t t;
    pthread_create(&t, nullptr, blocked_recv, &b);
    msleep(200);
    o.r("shutdown", ::shutdown(p.b, SHUT_RDWR));
    pthread_join(t, nullptr);
    errno = b.err;
    o.r("blocked-recv", b.ret);
    p.close_both();
}

void disconnect_unspec(Out &o) {
    Pair p = make_pair();
    sockaddr sa{};
    sa.sa_family = AF_UNSPEC;
    o.r("connect-unspec", ::connect(p.a, &sa, sizeof sa));
    o.r("send", ::send(p.a, "x", 1, MSG_NOSIGNAL));
    o.revents("peer", poll1(p.b, kAll, 2000));
    char c;
    o.r("peer-recv", ::recv(p.b, &c, 1, MSG_DONTWAIT));
    p.close_both();
}

// ---- connect and accept --------------------------------------------------------------------

sockaddr_in loopback(unsigned short port) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(port);
    return sa;
}

void connect_refused(Out &o) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa = loopback(dead_port());
    o.r("connect", ::connect(s, reinterpret_cast<sockaddr *>(&sa), sizeof sa));
    int err = -1;
    socklen_t len = sizeof err;
    ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
    o.n("so_error", err);
    o.r("send", ::send(s, "x", 1, MSG_NOSIGNAL));
    o.revents("poll", poll1(s, kAll, 0));
    ::close(s);
}

void connect_refused_nb(Out &o) {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in sa = loopback(dead_port());
    o.r("connect", ::connect(s, reinterpret_cast<sockaddr *>(&sa), sizeof sa));
    o.revents("poll", poll1(s, kAll, 2000));
    int err = -1;
    socklen_t len = sizeof err;
    ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
    o.n("so_error", err);
    o.r("connect-again", ::connect(s, reinterpret_cast<sockaddr *>(&sa), sizeof sa));
    ::close(s);
}

void connect_nb_ok(Out &o) {
    unsigned short port;
    const int l = make_listener(&port);
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in sa = loopback(port);
    o.r("connect", ::connect(s, reinterpret_cast<sockaddr *>(&sa), sizeof sa));
    o.revents("poll", poll1(s, POLLOUT, 2000));
    int err = -1;
    socklen_t len = sizeof err;
    ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
    o.n("so_error", err);
    o.r("connect-again", ::connect(s, reinterpret_cast<sockaddr *>(&sa), sizeof sa));
    const int b = ::accept(l, nullptr, nullptr);
    handshake(s, b);
    o.r("send", ::send(s, "nb", 2, 0));
    char buf[4] = {};
    o.r("recv", ::recv(b, buf, 2, MSG_WAITALL));
    o.bytes("data", buf, 2);
    ::close(b);
    ::close(s);
    ::close(l);
}

void connect_bad_args(Out &o) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa = loopback(dead_port());
    o.r("short-len", ::connect(s, reinterpret_cast<sockaddr *>(&sa), 4));
    sockaddr_in6 six{};
    six.sin6_family = AF_INET6;
    o.r("wrong-family", ::connect(s, reinterpret_cast<sockaddr *>(&six), sizeof six));
    o.r("bad-ptr", ::connect(s, reinterpret_cast<sockaddr *>(8), sizeof sa));
    ::close(s);
}

void accept_flags(Out &o) {
    unsigned short port;
    const int l = make_listener(&port);
    const int c1 = connect_to(port), c2 = connect_to(port), c3 = connect_to(port);
    const int a1 = ::accept4(l, nullptr, nullptr, SOCK_NONBLOCK);
    o.n("nonblock", (::fcntl(a1, F_GETFL) & O_NONBLOCK) != 0);
    o.n("cloexec", (::fcntl(a1, F_GETFD) & FD_CLOEXEC) != 0);
    const int a2 = ::accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
    o.n("nonblock2", (::fcntl(a2, F_GETFL) & O_NONBLOCK) != 0);
    o.n("cloexec2", (::fcntl(a2, F_GETFD) & FD_CLOEXEC) != 0);
    o.r("bad-flags", ::accept4(l, nullptr, nullptr, 0x40000000));
    sockaddr_in sa{};
    socklen_t len = 2;
    const int a3 = ::accept4(l, reinterpret_cast<sockaddr *>(&sa), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    o.n("addrlen", len);
    o.n("family", sa.sin_family);
    char c = 0;
    o.r("recv-nonblock", ::recv(a1, &c, 1, 0));
    set_nonblock(a1, false);
    handshake(c1, a1);
    handshake(c2, a2);
    handshake(c3, a3);
    set_nonblock(a1, true);
    ::send(c1, "1", 1, 0);
    o.r("recv", ::recv(a1, &c, 1, MSG_WAITALL));
    o.bytes("data", &c, 1);
    for (int fd : {a1, a2, a3, c1, c2, c3, l}) ::close(fd);
}

void accept_nonblock_empty(Out &o) {
    unsigned short port;
    const int l = make_listener(&port);
    set_nonblock(l, true);
    o.r("accept", ::accept(l, nullptr, nullptr));
    o.revents("poll", poll1(l, kAll, 0));
    const int c = connect_to(port);
    o.revents("poll-pending", poll1(l, kAll, 2000));
    const int a = ::accept(l, nullptr, nullptr);
    o.n("accepted", a >= 0);
    ::close(a);
    ::close(c);
    ::close(l);
}

// ---- the other end in a forked child ------------------------------------------------

struct ChildArg {
    unsigned short port;
    int ctl;  // pipe to the parent: the child says "ready" after its step
    int what;
};

int child_main(void *arg) {
    const auto *c = static_cast<ChildArg *>(arg);
    const int s = connect_to(c->port);
    char buf[16];
    // The parent's socket joins the library at its first call.
    ::send(s, "h", 1, 0);
    ::recv(s, buf, 1, MSG_WAITALL);
    switch (c->what) {
        case 0:  // writes and exits
            ::send(s, "from child", 10, 0);
            return 0;
        case 1:  // reads one byte, leaves the rest unread, says so, waits to be killed
        case 2:  // says it is connected, waits to be killed
            if (c->what == 1) ::recv(s, buf, 1, MSG_WAITALL);
            ::write(c->ctl, "r", 1);
            ::pause();
            return 0;
        case 3:  // sends after the parent's reset, without a SIGPIPE handler
            ::signal(SIGPIPE, SIG_DFL);
            ::recv(s, buf, 1, MSG_WAITALL);  // the parent's go
            ::recv(s, buf, 1, 0);            // its close: EOF
            ::send(s, "x", 1, 0);
            msleep(100);
            ::send(s, "x", 1, 0);
            return 0;
    }
    return 1;
}

template <int What>
void forked(Out &o) {
    unsigned short port;
    const int l = make_listener(&port);
    int ctl[2];
    ::pipe(ctl);
    ChildArg arg{port, ctl[1], What};
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::alarm(5);
        ::_exit(child_main(&arg));
    }
    const int s = ::accept(l, nullptr, nullptr);
    ::close(l);
    char buf[16] = {};
    ::recv(s, buf, 1, MSG_WAITALL);
    ::send(s, "h", 1, 0);
    note_mode(s);
    int status = 0;
    if (What == 0) {
        o.r("recv", ::recv(s, buf, 10, MSG_WAITALL));
        o.bytes("data", buf, 10);
        o.r("eof", ::recv(s, buf, sizeof buf, 0));
    } else if (What == 1 || What == 2) {
        if (What == 1) ::send(s, "abc", 3, 0);
        ::read(ctl[0], buf, 1);
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        o.revents("poll", poll1(s, kAll, 2000));
        o.r("recv", ::recv(s, buf, sizeof buf, MSG_DONTWAIT));
        o.r("recv2", ::recv(s, buf, sizeof buf, MSG_DONTWAIT));
        o.r("send", ::send(s, "x", 1, MSG_NOSIGNAL));
    } else if (What == 3) {
        ::send(s, "g", 1, 0);
        ::close(s);
    }
    if (What != 1 && What != 2) ::waitpid(pid, &status, 0);
    o.s("child", WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                   : std::string("signal ") + sigabbrev_np(WTERMSIG(status)));
    if (What != 3) ::close(s);
    ::close(ctl[0]);
    ::close(ctl[1]);
}

}  // namespace

void add_end_cases(std::vector<Case> &all) {
    add_obs<SHUT_RD, 0>(all);
    add_obs<SHUT_WR, 0>(all);
    add_obs<SHUT_RDWR, 0>(all);
    add(all, "close-clean", close_clean);
    add(all, "close-unread-rst", close_unread);
    add(all, "close-read-then-eof", close_read_then);
    add(all, "close-linger-zero", linger_zero);
    add(all, "close-linger-zero-data", linger_zero_data);
    add(all, "close-linger-2s", linger_some);
    add(all, "close-staged-bytes", close_staged);
    add(all, "close-twice", close_twice);
    add(all, "close-dup", dup_close);
    add(all, "close-other-thread", close_other_thread);
    add(all, "close-shutdown-other-thread", shutdown_other_thread);
    add(all, "close-connect-unspec", disconnect_unspec);
    add(all, "name-after-peer-close", peername_after);
    add(all, "name-cross", names_match);
    add(all, "connect-refused", connect_refused);
    add(all, "connect-refused-nonblock", connect_refused_nb);
    add(all, "connect-nonblock", connect_nb_ok);
    add(all, "connect-bad-args", connect_bad_args);
    add(all, "accept4-flags", accept_flags);
    add(all, "accept-nonblock-empty", accept_nonblock_empty);
    add(all, "child-writes-exits", forked<0>);
    add(all, "child-killed-unread", forked<1>);
    add(all, "child-killed", forked<2>);
    add(all, "child-sigpipe", forked<3>);
}

}  // namespace conform
