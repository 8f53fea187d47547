// Cases: readv/writev/recvmsg/sendmsg with odd iovecs, and byte-exact
// transfers between every sending and every receiving call family.
#include "conform.hpp"

#include <cerrno>
#include <climits>
#include <cstring>
#include <deque>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

namespace conform {
namespace {

void readv_odd(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "abcdefghij", 10, 0);
    poll1(p.b, POLLIN, 2000);
    char x[4] = {}, y[4] = {}, z[8] = {};
    iovec iov[5] = {{x, 3}, {nullptr, 0}, {y, 1}, {y + 1, 0}, {z, 8}};
    o.r("readv", ::readv(p.b, iov, 5));
    o.bytes("x", x, 3);
    o.bytes("y", y, 1);
    o.bytes("z", z, 6);
    p.close_both();
}

void writev_odd(Out &o) {
    Pair p = make_pair();
    char a[] = "AB", b[] = "CDE";
    iovec iov[6] = {{nullptr, 0}, {a, 2}, {b, 0}, {b, 3}, {nullptr, 0}, {a, 1}};
    o.r("writev", ::writev(p.a, iov, 6));
    char buf[16] = {};
    o.r("recv", ::recv(p.b, buf, 6, MSG_WAITALL));
    o.bytes("data", buf, 6);
    p.close_both();
}

void writev_many(Out &o) {
    Pair p = make_pair();
    static iovec iov[IOV_MAX];
    static char bytes[IOV_MAX];
    for (int i = 0; i < IOV_MAX; ++i) {
        bytes[i] = char('a' + i % 26);
        iov[i] = {&bytes[i], 1};
    }
    o.r("writev-1024", ::writev(p.a, iov, IOV_MAX));
    char buf[IOV_MAX] = {};
    o.r("recv", ::recv(p.b, buf, IOV_MAX, MSG_WAITALL));
    o.s("match", std::memcmp(buf, bytes, IOV_MAX) == 0 ? "yes" : "no");
    p.close_both();
}

void readv_many(Out &o) {
    Pair p = make_pair();
    const std::string data = pattern(IOV_MAX, 3);
    ::send(p.a, data.data(), data.size(), 0);
    static iovec iov[IOV_MAX];
    static char bytes[IOV_MAX];
    for (int i = 0; i < IOV_MAX; ++i) iov[i] = {&bytes[i], 1};
    std::size_t got = 0;
    for (int i = 0; i < 100 && got < data.size(); ++i) {
        poll1(p.b, POLLIN, 2000);
        // Whatever the chunking, the bytes land in order across the iovecs.
        const ssize_t n = ::readv(p.b, iov + got, int(IOV_MAX - got));
        if (n <= 0) break;
        got += std::size_t(n);
    }
    o.n("got", long(got));
    o.s("match", std::memcmp(bytes, data.data(), IOV_MAX) == 0 ? "yes" : "no");
    p.close_both();
}

void recvmsg_fields(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "hello", 5, 0);
    poll1(p.b, POLLIN, 2000);
    char buf[3] = {}, buf2[8] = {};
    iovec iov[2] = {{buf, 3}, {buf2, 8}};
    sockaddr_in from{};
    alignas(cmsghdr) char control[64];
    msghdr mh{};
    mh.msg_name = &from;
    mh.msg_namelen = sizeof from;
    mh.msg_iov = iov;
    mh.msg_iovlen = 2;
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    mh.msg_flags = 0x7fff;
    o.r("recvmsg", ::recvmsg(p.b, &mh, 0));
    o.n("namelen", mh.msg_namelen);
    o.n("controllen", long(mh.msg_controllen));
    o.n("flags", mh.msg_flags);
    o.bytes("a", buf, 3);
    o.bytes("b", buf2, 2);
    p.close_both();
}

void sendmsg_fields(Out &o) {
    Pair p = make_pair();
    sockaddr_in to{};
    to.sin_family = AF_INET;
    char a[] = "12", b[] = "345";
    iovec iov[2] = {{a, 2}, {b, 3}};
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = 2;
    mh.msg_flags = 0x7fff;  // ignored on send
    o.r("sendmsg", ::sendmsg(p.a, &mh, 0));
    mh.msg_name = &to;
    mh.msg_namelen = sizeof to;
    o.r("sendmsg-name", ::sendmsg(p.a, &mh, 0));
    char buf[16] = {};
    o.r("recv", ::recv(p.b, buf, 10, MSG_WAITALL));
    o.bytes("data", buf, 10);
    p.close_both();
}

void sendmsg_cmsg(Out &o) {
    Pair p = make_pair();
    // SCM_RIGHTS over TCP: not a unix socket.
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr mh{};
    iovec iov{const_cast<char *>("k"), 1};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    const int fd = 0;
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
    o.r("sendmsg-rights", ::sendmsg(p.a, &mh, MSG_NOSIGNAL));
    o.revents("peer-poll", poll1(p.b, POLLIN, 200));
    char buf[4];
    o.r("recv", ::recv(p.b, buf, 4, MSG_DONTWAIT));
    p.close_both();
}

void readv_partial(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "abc", 3, 0);
    poll1(p.b, POLLIN, 2000);
    char x[2] = {}, y[8] = {};
    iovec iov[2] = {{x, 2}, {y, 8}};
    o.r("readv", ::readv(p.b, iov, 2));
    o.bytes("x", x, 2);
    o.bytes("y", y, 1);
    set_nonblock(p.b, true);
    o.r("readv-empty", ::readv(p.b, iov, 2));
    p.close_both();
}

// ---- transfers: every sending family against every receiving one --------------

enum Family { f_send, f_write, f_iov, f_msg };
const char *const kSendNames[] = {"send", "write", "writev", "sendmsg"};
const char *const kRecvNames[] = {"recv", "read", "readv", "recvmsg"};

struct Xfer {
    int fd;
    Family family;
    const std::string *data;
};

void *send_all(void *arg) {
    const auto *x = static_cast<Xfer *>(arg);
    const std::string &d = *x->data;
    std::size_t off = 0;
    for (int step = 0; off < d.size() && step < 100000; ++step) {
        // Pieces of changing sizes, split over two iovecs where it can.
        const std::size_t want = std::min(d.size() - off, std::size_t(1 + (step * 7919) % 70000));
        const char *p = d.data() + off;
        ssize_t n = -1;
        iovec iov[2] = {{const_cast<char *>(p), want / 2}, {const_cast<char *>(p) + want / 2, want - want / 2}};
        msghdr mh{};
        mh.msg_iov = iov;
        mh.msg_iovlen = 2;
        switch (x->family) {
            case f_send: n = ::send(x->fd, p, want, MSG_NOSIGNAL); break;
            case f_write: n = ::write(x->fd, p, want); break;
            case f_iov: n = ::writev(x->fd, iov, 2); break;
            case f_msg: n = ::sendmsg(x->fd, &mh, MSG_NOSIGNAL); break;
        }
        if (n <= 0) break;
        off += std::size_t(n);
    }
    ::shutdown(x->fd, SHUT_WR);
    return nullptr;
}

ssize_t recv_some(int fd, Family family, char *buf, std::size_t len, int step) {
    const std::size_t want = std::min(len, std::size_t(1 + (step * 104729) % 90000));
    iovec iov[3] = {{buf, want / 3}, {buf + want / 3, 0}, {buf + want / 3, want - want / 3}};
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = 3;
    switch (family) {
        case f_send: return ::recv(fd, buf, want, 0);
        case f_write: return ::read(fd, buf, want);
        case f_iov: return ::readv(fd, iov, 3);
        case f_msg: return ::recvmsg(fd, &mh, 0);
    }
    return -1;
}

template <int S, int R, std::size_t N>
void transfer(Out &o) {
    Pair p = make_pair();
    const std::string data = pattern(N, S * 4 + R);
    Xfer x{p.a, Family(S), &data};
    pthread_t t;
    pthread_create(&t, nullptr, send_all, &x);
    std::string got(N + 16, '\0');
    std::size_t off = 0;
    ssize_t last = 0;
    for (int step = 0; step < 1000000; ++step) {
        last = recv_some(p.b, Family(R), got.data() + off, got.size() - off, step);
        if (last <= 0) break;
        off += std::size_t(last);
    }
    pthread_join(t, nullptr);
    o.n("received", long(off));
    o.r("end", last);
    o.s("match", off == N && std::memcmp(got.data(), data.data(), N) == 0 ? "yes" : "no");
    p.close_both();
}

std::deque<std::string> names;

template <int S, int R>
void add_pair(std::vector<Case> &all) {
    names.push_back(std::string("xfer-") + kSendNames[S] + "-" + kRecvNames[R] + "-small");
    add(all, names.back().c_str(), transfer<S, R, 1000>);
    names.push_back(std::string("xfer-") + kSendNames[S] + "-" + kRecvNames[R] + "-4m");
    add(all, names.back().c_str(), transfer<S, R, (4u << 20) + 13>);
}

template <int S>
void add_sender(std::vector<Case> &all) {
    add_pair<S, 0>(all);
    add_pair<S, 1>(all);
    add_pair<S, 2>(all);
    add_pair<S, 3>(all);
}

}  // namespace

void add_iov_cases(std::vector<Case> &all) {
    add(all, "iov-readv-odd", readv_odd);
    add(all, "iov-writev-odd", writev_odd);
    add(all, "iov-writev-1024", writev_many);
    add(all, "iov-readv-1024", readv_many);
    add(all, "iov-readv-partial", readv_partial);
    add(all, "iov-recvmsg-fields", recvmsg_fields);
    add(all, "iov-sendmsg-fields", sendmsg_fields);
    add(all, "iov-sendmsg-rights", sendmsg_cmsg);
    add_sender<0>(all);
    add_sender<1>(all);
    add_sender<2>(all);
    add_sender<3>(all);
}

}  // namespace conform
