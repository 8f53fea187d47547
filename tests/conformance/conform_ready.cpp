// Cases: readiness (poll(2), select(2), epoll(7) level, edge and one-shot)
// after each event of a connection's life; non-blocking sockets and full
// buffers (fcntl(2)); SO_RCVLOWAT; TCP_CORK.
#include "conform.hpp"

#include <cerrno>
#include <cstring>
#include <deque>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

namespace conform {
namespace {

constexpr short kAll = POLLIN | POLLPRI | POLLOUT | POLLRDHUP;

// The states a connection's end `a` is looked at in.
enum State { s_fresh, s_data, s_peer_shutwr, s_peer_close, s_peer_reset, s_self_shutwr,
             s_self_shutrd, s_full, s_drained, s_read_eof, s_count };
const char *const kStateNames[] = {"fresh", "data", "peer-shutwr", "peer-close", "peer-reset",
                                   "self-shutwr", "self-shutrd", "full", "drained", "read-eof"};

// Brings the pair into the state; the event `a` waits for is let arrive.
void enter(Pair &p, State st) {
    char buf[64];
    switch (st) {
        case s_fresh: break;
        case s_data:
            ::send(p.b, "data", 4, 0);
            poll1(p.a, POLLIN, 2000);
            break;
        case s_peer_shutwr:
            ::shutdown(p.b, SHUT_WR);
            poll1(p.a, POLLRDHUP, 2000);
            break;
        case s_peer_close:
            ::close(p.b);
            p.b = -1;
            poll1(p.a, POLLRDHUP, 2000);
            break;
        case s_peer_reset:
            ::send(p.a, "u", 1, 0);
            poll1(p.b, POLLIN, 2000);
            ::close(p.b);
            p.b = -1;
            poll1(p.a, POLLERR, 2000);
            break;
        case s_self_shutwr: ::shutdown(p.a, SHUT_WR); break;
        case s_self_shutrd: ::shutdown(p.a, SHUT_RD); break;
        case s_full:
            set_nonblock(p.a, true);
            fill(p.a);
            break;
        case s_drained: {
            set_nonblock(p.a, true);
            fill(p.a);
            drain(p.b, nullptr, 300);
            // The kernel wakes writers once a third of the buffer is free.
            poll1(p.a, POLLOUT, 2000);
            break;
        }
        case s_read_eof:
            ::send(p.b, "last", 4, 0);
            ::shutdown(p.b, SHUT_WR);
            poll1(p.a, POLLRDHUP, 2000);
            while (::recv(p.a, buf, sizeof buf, MSG_DONTWAIT) > 0) {}
            break;
        case s_count: break;
    }
}

enum Looker { l_poll, l_select, l_epoll };
const char *const kLookerNames[] = {"poll", "select", "epoll"};

template <int L, int St>
void ready_in(Out &o) {
    Pair p = make_pair();
    enter(p, State(St));
    if (L == l_poll) {
        o.revents("a", poll1(p.a, kAll, 0));
        pollfd f{p.a, POLLIN, 0};
        o.r("in-only", ::poll(&f, 1, 50));
        o.revents("in-only-revents", f.revents);
    } else if (L == l_select) {
        fd_set r, w, e;
        FD_ZERO(&r);
        FD_ZERO(&w);
        FD_ZERO(&e);
        FD_SET(p.a, &r);
        FD_SET(p.a, &w);
        FD_SET(p.a, &e);
        timeval tv{0, 0};
        o.r("select", ::select(p.a + 1, &r, &w, &e, &tv));
        o.n("r", FD_ISSET(p.a, &r));
        o.n("w", FD_ISSET(p.a, &w));
        o.n("e", FD_ISSET(p.a, &e));
    } else {
        const int ep = ::epoll_create1(EPOLL_CLOEXEC);
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLPRI;
        ::epoll_ctl(ep, EPOLL_CTL_ADD, p.a, &ev);
        epoll_event got{};
        o.r("wait", ::epoll_wait(ep, &got, 1, 0));
        o.epevents("a", got.events);
        ev.events = EPOLLIN;
        ::epoll_ctl(ep, EPOLL_CTL_MOD, p.a, &ev);
        got = {};
        o.r("wait-in", ::epoll_wait(ep, &got, 1, 50));
        o.epevents("in-only", got.events);
        ::close(ep);
    }
    p.close_both();
}

std::deque<std::string> names;

template <int L, int St>
void add_states(std::vector<Case> &all) {
    if constexpr (St < s_count) {
        names.push_back(std::string("ready-") + kLookerNames[L] + "-" + kStateNames[St]);
        add(all, names.back().c_str(), ready_in<L, St>);
        add_states<L, St + 1>(all);
    }
}

// ---- epoll modes ----------------------------------------------------------------------

int ep_wait(int ep, int timeout_ms, unsigned *events) {
    epoll_event got{};
    const int n = ::epoll_wait(ep, &got, 1, timeout_ms);
    *events = n > 0 ? got.events : 0;
    return n;
}

// A new epoll set watching `fd` for `events`.
int epoll_on(int fd, unsigned events) {
    const int ep = ::epoll_create1(0);
    epoll_event ev{};
    ev.events = events;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    return ep;
}

void epoll_edge(Out &o) {
    Pair p = make_pair();
    const int ep = epoll_on(p.a, EPOLLIN | EPOLLET);
    unsigned e;
    o.r("idle", ep_wait(ep, 50, &e));
    ::send(p.b, "one", 3, 0);
    o.r("first", ep_wait(ep, 2000, &e));
    o.epevents("e1", e);
    o.r("again", ep_wait(ep, 50, &e));
    ::send(p.b, "two", 3, 0);
    o.r("second", ep_wait(ep, 2000, &e));
    char buf[16];
    o.r("recv-part", ::recv(p.a, buf, 2, 0));
    o.r("after-part", ep_wait(ep, 50, &e));
    ::shutdown(p.b, SHUT_WR);
    o.r("fin", ep_wait(ep, 2000, &e));
    o.epevents("e-fin", e);
    ::close(ep);
    p.close_both();
}

void epoll_oneshot(Out &o) {
    Pair p = make_pair();
    const int ep = epoll_on(p.a, EPOLLIN | EPOLLONESHOT);
    unsigned e;
    ::send(p.b, "one", 3, 0);
    o.r("first", ep_wait(ep, 2000, &e));
    o.r("disarmed", ep_wait(ep, 50, &e));
    ::send(p.b, "two", 3, 0);
    o.r("still-disarmed", ep_wait(ep, 50, &e));
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLONESHOT;
    o.r("rearm", ::epoll_ctl(ep, EPOLL_CTL_MOD, p.a, &ev));
    o.r("rearmed", ep_wait(ep, 0, &e));
    o.epevents("e", e);
    ::close(ep);
    p.close_both();
}

void epoll_edge_out(Out &o) {
    Pair p = make_pair();
    set_nonblock(p.a, true);
    const int ep = epoll_on(p.a, EPOLLOUT | EPOLLET);
    unsigned e;
    o.r("initial", ep_wait(ep, 0, &e));
    o.r("again", ep_wait(ep, 50, &e));
    fill(p.a);
    o.r("full", ep_wait(ep, 50, &e));
    drain(p.b, nullptr, 300);
    o.r("drained", ep_wait(ep, 2000, &e));
    o.epevents("e", e);
    ::close(ep);
    p.close_both();
}

// What wakes an edge-triggered watcher of output only: not bytes coming
// in, not space coming back that never ran out; the peer's end does.
void epoll_edge_out_quiet(Out &o) {
    Pair p = make_pair();
    set_nonblock(p.a, true);
    const int ep = epoll_on(p.a, EPOLLOUT | EPOLLET);
    unsigned e;
    o.r("initial", ep_wait(ep, 0, &e));
    o.r("send-in", ::send(p.b, "in", 2, 0));
    o.r("after-in", ep_wait(ep, 100, &e));
    static char chunk[65536];
    o.r("send-out", ::send(p.a, chunk, sizeof chunk, 0));
    std::string got;
    drain(p.b, &got, 300);
    o.r("drained", long(got.size()));
    o.r("after-drain", ep_wait(ep, 100, &e));
    ::shutdown(p.b, SHUT_WR);
    o.r("fin", ep_wait(ep, 2000, &e));
    o.epevents("e-fin", e);
    o.r("after-fin", ep_wait(ep, 50, &e));
    ::close(ep);
    p.close_both();
}

// An event loop's churn: a socket deleted and added again between its
// write and its read, and what the set says of it in between.
void epoll_del_add(Out &o) {
    Pair p = make_pair();
    const int ep = ::epoll_create1(0);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 7;
    unsigned e;
    o.r("add", ::epoll_ctl(ep, EPOLL_CTL_ADD, p.a, &ev));
    o.r("add-again", ::epoll_ctl(ep, EPOLL_CTL_ADD, p.a, &ev));
    ::send(p.b, "x", 1, 0);
    o.r("ready", ep_wait(ep, 2000, &e));
    o.r("del", ::epoll_ctl(ep, EPOLL_CTL_DEL, p.a, nullptr));
    o.r("deleted-wait", ep_wait(ep, 50, &e));
    o.r("del-again", ::epoll_ctl(ep, EPOLL_CTL_DEL, p.a, nullptr));
    o.r("mod-deleted", ::epoll_ctl(ep, EPOLL_CTL_MOD, p.a, &ev));
    o.r("bad-op-deleted", ::epoll_ctl(ep, 77, p.a, &ev));
    epoll_event excl{};
    excl.events = EPOLLIN | EPOLLEXCLUSIVE;
    o.r("mod-exclusive-deleted", ::epoll_ctl(ep, EPOLL_CTL_MOD, p.a, &excl));
    ev.events = EPOLLOUT;
    ev.data.u64 = 8;
    o.r("add-out", ::epoll_ctl(ep, EPOLL_CTL_ADD, p.a, &ev));
    epoll_event got{};
    o.r("out", ::epoll_wait(ep, &got, 1, 2000));
    o.epevents("e-out", got.events);
    o.r("data-out", long(got.data.u64));
    o.r("del2", ::epoll_ctl(ep, EPOLL_CTL_DEL, p.a, nullptr));
    ev.events = EPOLLIN | EPOLLET;
    ev.data.u64 = 9;
    o.r("add-in-et", ::epoll_ctl(ep, EPOLL_CTL_ADD, p.a, &ev));
    o.r("in", ::epoll_wait(ep, &got, 1, 2000));
    o.epevents("e-in", got.events);
    o.r("data-in", long(got.data.u64));
    o.r("in-again", ep_wait(ep, 50, &e));
    char c;
    o.r("recv", ::recv(p.a, &c, 1, 0));
    o.r("del3", ::epoll_ctl(ep, EPOLL_CTL_DEL, p.a, nullptr));
    // Closed while deleted, its number taken by another socket.
    const int fd = p.a;
    ::close(p.a);
    Pair q = make_pair();
    const int moved = q.a == fd ? -1 : ::dup2(q.a, fd);
    o.r("same-number", moved == -1 || moved == fd);
    ev.events = EPOLLIN;
    ev.data.u64 = 10;
    o.r("add-new", ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
    o.r("new-quiet", ep_wait(ep, 50, &e));
    ::send(q.b, "y", 1, 0);
    o.r("new-ready", ::epoll_wait(ep, &got, 1, 2000));
    o.r("data-new", long(got.data.u64));
    ::send(p.b, "z", 1, 0);
    epoll_event all[4]{};
    o.r("only-new", ::epoll_wait(ep, all, 4, 50));
    o.r("only-new-data", long(all[0].data.u64));
    if (moved == fd) ::close(fd);
    p.a = -1;
    ::close(ep);
    p.close_both();
    q.close_both();
}

void epoll_closed_fd(Out &o) {
    Pair p = make_pair();
    const int ep = epoll_on(p.a, EPOLLIN);
    const int d = ::dup(p.a);
    ::close(p.a);
    p.a = d;
    ::send(p.b, "x", 1, 0);
    unsigned e;
    // The registration belongs to the open file, which the dup keeps.
    o.r("dup-keeps", ep_wait(ep, 2000, &e));
    epoll_event ev{};
    o.r("del-closed", ::epoll_ctl(ep, EPOLL_CTL_DEL, d + 1000, &ev));
    ::close(ep);
    p.close_both();
}

void poll_wakes(Out &o) {
    Pair p = make_pair();
    struct Arg {
        int fd;
    } arg{p.b};
    pthread_t t;
    pthread_create(
        &t, nullptr,
        [](void *x) -> void * {
            msleep(100);
            ::send(static_cast<Arg *>(x)->fd, "wake", 4, 0);
            return nullptr;
        },
        &arg);
    o.revents("poll", poll1(p.a, POLLIN, 3000));
    pthread_join(t, nullptr);
    char buf[8] = {};
    o.r("recv", ::recv(p.a, buf, sizeof buf, 0));
    o.bytes("data", buf, 4);
    p.close_both();
}

// ---- non-blocking and full buffers -------------------------------------------------------

void nonblock_flags(Out &o) {
    Pair p = make_pair();
    const int fl = ::fcntl(p.a, F_GETFL);
    o.n("initial", fl & (O_NONBLOCK | O_RDWR | O_APPEND));
    o.r("set", ::fcntl(p.a, F_SETFL, fl | O_NONBLOCK));
    o.n("now", ::fcntl(p.a, F_GETFL) & O_NONBLOCK ? 1 : 0);
    char c;
    o.r("recv", ::recv(p.a, &c, 1, 0));
    o.r("read", ::read(p.a, &c, 1));
    o.r("clear", ::fcntl(p.a, F_SETFL, fl));
    timeval tv{0, 100000};
    ::setsockopt(p.a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    o.r("recv-timeout", ::recv(p.a, &c, 1, 0));
    o.r("setfd", ::fcntl(p.a, F_SETFD, FD_CLOEXEC));
    o.n("getfd", ::fcntl(p.a, F_GETFD));
    p.close_both();
}

void eagain_full(Out &o) {
    Pair p = make_pair();
    set_nonblock(p.a, true);
    const long sent = fill(p.a);
    o.s("eagain", sent > 0 ? "yes" : "no");
    o.r("send-more", ::send(p.a, "x", 1, 0));
    o.revents("poll-out", poll1(p.a, POLLOUT, 0));
    std::string got;
    drain(p.b, &got, 300);
    o.s("received-all", long(got.size()) == sent ? "yes" : "no");
    o.revents("poll-out-after", poll1(p.a, POLLOUT, 2000));
    o.r("send-after", ::send(p.a, "y", 1, 0));
    p.close_both();
}

// A non-blocking sender that retries by sleeping, never polling or reading.
void eagain_sleeper(Out &o) {
    Pair p = make_pair();
    set_nonblock(p.a, true);
    const long sent = fill(p.a);
    std::string got;
    drain(p.b, &got, 300);
    long more = -1;
    for (int i = 0; i < 100 && more <= 0; ++i) {
        msleep(20);
        more = ::send(p.a, "z", 1, 0);
    }
    o.r("resumed", more);
    drain(p.b, &got, 300);
    o.s("all", long(got.size()) == sent + 1 ? "yes" : "no");
    p.close_both();
}

void eagain_timeout(Out &o) {
    Pair p = make_pair();
    set_nonblock(p.a, true);
    fill(p.a);
    set_nonblock(p.a, false);
    timeval tv{0, 200000};
    ::setsockopt(p.a, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    static char big[65536];
    o.r("send-timeout", ::send(p.a, big, sizeof big, 0));
    p.close_both();
}

// A blocking send the kernel buffers whole while nobody reads.
void big_send_no_reader(Out &o) {
    Pair p = make_pair();
    timeval tv{2, 0};
    ::setsockopt(p.a, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    const std::string data = pattern(200 * 1024, 5);
    o.r("send", ::send(p.a, data.data(), data.size(), 0));
    std::string got;
    ::shutdown(p.a, SHUT_WR);
    o.r("drain", drain(p.b, &got));
    o.s("match", got == data ? "yes" : "no");
    p.close_both();
}

void rcvlowat(Out &o) {
    Pair p = make_pair();
    int v = 10;
    o.r("set", ::setsockopt(p.b, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v));
    ::send(p.a, "12345", 5, 0);
    msleep(50);
    o.revents("poll-5", poll1(p.b, POLLIN, 100));
    ::send(p.a, "67890", 5, 0);
    o.revents("poll-10", poll1(p.b, POLLIN, 2000));
    char buf[16] = {};
    o.r("recv", ::recv(p.b, buf, sizeof buf, 0));
    o.bytes("data", buf, 10);
    p.close_both();
}

void rcvlowat_recv(Out &o) {
    Pair p = make_pair();
    int v = 6;
    ::setsockopt(p.b, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v);
    timeval tv{2, 0};
    ::setsockopt(p.b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::send(p.a, "abc", 3, 0);
    Pair *pp = &p;
    pthread_t t;
    pthread_create(
        &t, nullptr,
        [](void *x) -> void * {
            msleep(150);
            // The kernel wakes the reader when what is queued reaches
            // the mark (not counting what the reader already took).
            ::send(static_cast<Pair *>(x)->a, "defghij", 7, 0);
            return nullptr;
        },
        pp);
    char buf[16] = {};
    // A blocking recv waits for the low-water mark.
    o.r("recv", ::recv(p.b, buf, sizeof buf, 0));
    o.bytes("data", buf, 10);
    pthread_join(t, nullptr);
    p.close_both();
}

void cork_uncork(Out &o) {
    Pair p = make_pair();
    int on = 1, off = 0;
    o.r("cork", ::setsockopt(p.a, IPPROTO_TCP, TCP_CORK, &on, sizeof on));
    ::send(p.a, "cor", 3, 0);
    ::send(p.a, "ked", 3, 0);
    o.r("uncork", ::setsockopt(p.a, IPPROTO_TCP, TCP_CORK, &off, sizeof off));
    char buf[8] = {};
    o.r("recv", ::recv(p.b, buf, 6, MSG_WAITALL));
    o.bytes("data", buf, 6);
    p.close_both();
}

void cork_held(Out &o) {
    Pair p = make_pair();
    int on = 1;
    ::setsockopt(p.a, IPPROTO_TCP, TCP_CORK, &on, sizeof on);
    ::send(p.a, "corked", 6, 0);
    // The kernel sends what a cork holds within 200 ms.
    o.revents("poll-2s", poll1(p.b, POLLIN, 2000));
    char buf[8] = {};
    o.r("recv", ::recv(p.b, buf, sizeof buf, MSG_DONTWAIT));
    o.bytes("data", buf, 6);
    p.close_both();
}

void cork_close(Out &o) {
    Pair p = make_pair();
    int on = 1;
    ::setsockopt(p.a, IPPROTO_TCP, TCP_CORK, &on, sizeof on);
    ::send(p.a, "closing", 7, 0);
    ::close(p.a);
    p.a = -1;
    char buf[8] = {};
    o.r("recv", ::recv(p.b, buf, 7, MSG_WAITALL));
    o.bytes("data", buf, 7);
    o.r("eof", ::recv(p.b, buf, 7, 0));
    p.close_both();
}

}  // namespace

void add_ready_cases(std::vector<Case> &all) {
    add_states<l_poll, 0>(all);
    add_states<l_select, 0>(all);
    add_states<l_epoll, 0>(all);
    add(all, "epoll-edge", epoll_edge);
    add(all, "epoll-oneshot", epoll_oneshot);
    add(all, "epoll-edge-out", epoll_edge_out);
    add(all, "epoll-edge-out-quiet", epoll_edge_out_quiet);
    add(all, "epoll-del-add", epoll_del_add);
    add(all, "epoll-dup-closed", epoll_closed_fd);
    add(all, "poll-wakes", poll_wakes);
    add(all, "nonblock-fcntl", nonblock_flags);
    add(all, "nonblock-eagain-full", eagain_full);
    add(all, "nonblock-eagain-sleeper", eagain_sleeper);
    add(all, "nonblock-sndtimeo-full", eagain_timeout);
    add(all, "send-200k-no-reader", big_send_no_reader);
    add(all, "rcvlowat-poll", rcvlowat);
    add(all, "rcvlowat-recv", rcvlowat_recv);
    add(all, "cork-uncork", cork_uncork);
    add(all, "cork-held", cork_held);
    add(all, "cork-close", cork_close);
}

}  // namespace conform
