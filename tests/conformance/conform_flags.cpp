// Cases: send and recv flags (send(2), recv(2), tcp(7) on urgent data),
// zero-length calls.
#include "conform.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

namespace conform {
namespace {

void peek(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "hello world", 11, 0);
    poll1(p.b, POLLIN, 2000);
    char buf[32] = {};
    o.r("peek5", ::recv(p.b, buf, 5, MSG_PEEK));
    o.bytes("d1", buf, 5);
    o.r("peek-all", ::recv(p.b, buf, sizeof buf, MSG_PEEK));
    o.bytes("d2", buf, 11);
    o.r("read3", ::recv(p.b, buf, 3, 0));
    o.bytes("d3", buf, 3);
    o.r("peek-rest", ::recv(p.b, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT));
    o.bytes("d4", buf, 8);
    o.r("read-rest", ::recv(p.b, buf, sizeof buf, 0));
    o.bytes("d5", buf, 8);
    o.r("peek-empty", ::recv(p.b, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT));
    p.close_both();
}

void peek_eof(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "xy", 2, 0);
    ::shutdown(p.a, SHUT_WR);
    poll1(p.b, POLLRDHUP, 2000);
    char buf[8] = {};
    o.r("peek", ::recv(p.b, buf, sizeof buf, MSG_PEEK));
    o.r("read", ::recv(p.b, buf, sizeof buf, 0));
    o.bytes("data", buf, 2);
    o.r("peek-eof", ::recv(p.b, buf, sizeof buf, MSG_PEEK));
    o.r("read-eof", ::recv(p.b, buf, sizeof buf, 0));
    p.close_both();
}

void peek_waitall(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "abcdef", 6, 0);
    poll1(p.b, POLLIN, 2000);
    char buf[8] = {};
    o.r("peek-waitall", ::recv(p.b, buf, 6, MSG_PEEK | MSG_WAITALL));
    o.bytes("data", buf, 6);
    o.r("read", ::recv(p.b, buf, 6, 0));
    p.close_both();
}

struct Later {
    int fd;
    const char *text;
    int delay_ms;
    bool shut;
};

void *send_later(void *arg) {
    const auto *l = static_cast<Later *>(arg);
    msleep(l->delay_ms);
    if (l->text) ::send(l->fd, l->text, std::strlen(l->text), MSG_NOSIGNAL);
    if (l->shut) ::shutdown(l->fd, SHUT_WR);
    return nullptr;
}

void waitall(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "abc", 3, 0);
    Later l{p.a, "defgh", 100, false};
    pthread_t t;
    pthread_create(&t, nullptr, send_later, &l);
    char buf[16] = {};
    o.r("waitall", ::recv(p.b, buf, 8, MSG_WAITALL));
    o.bytes("data", buf, 8);
    pthread_join(t, nullptr);
    p.close_both();
}

void waitall_eof(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "abc", 3, 0);
    Later l{p.a, nullptr, 100, true};
    pthread_t t;
    pthread_create(&t, nullptr, send_later, &l);
    char buf[16] = {};
    o.r("waitall", ::recv(p.b, buf, 8, MSG_WAITALL));
    o.bytes("data", buf, 3);
    o.r("after", ::recv(p.b, buf, 8, MSG_WAITALL));
    pthread_join(t, nullptr);
    p.close_both();
}

void waitall_timeout(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "abc", 3, 0);
    timeval tv{0, 200000};
    ::setsockopt(p.b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[16] = {};
    o.r("waitall", ::recv(p.b, buf, 8, MSG_WAITALL));
    o.bytes("data", buf, 3);
    o.r("again", ::recv(p.b, buf, 8, MSG_WAITALL));
    p.close_both();
}

void waitall_nonblock(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "abc", 3, 0);
    poll1(p.b, POLLIN, 2000);
    char buf[16] = {};
    o.r("waitall-dontwait", ::recv(p.b, buf, 8, MSG_WAITALL | MSG_DONTWAIT));
    o.bytes("data", buf, 3);
    set_nonblock(p.b, true);
    o.r("waitall-nonblock-empty", ::recv(p.b, buf, 8, MSG_WAITALL));
    p.close_both();
}

void dontwait(Out &o) {
    Pair p = make_pair();
    char buf[16] = {};
    o.r("empty", ::recv(p.b, buf, sizeof buf, MSG_DONTWAIT));
    o.r("send", ::send(p.a, "zz", 2, MSG_DONTWAIT));
    poll1(p.b, POLLIN, 2000);
    o.r("data", ::recv(p.b, buf, sizeof buf, MSG_DONTWAIT));
    o.bytes("d", buf, 2);
    o.r("empty2", ::recv(p.b, buf, sizeof buf, MSG_DONTWAIT));
    o.r("fcntl-nonblock", (::fcntl(p.b, F_GETFL) & O_NONBLOCK) != 0);
    p.close_both();
}

void trunc_null(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "0123456789", 10, 0);
    poll1(p.b, POLLIN, 2000);
    o.r("trunc-null", ::recv(p.b, nullptr, 4, MSG_TRUNC));
    char buf[16] = {};
    o.r("rest", ::recv(p.b, buf, sizeof buf, 0));
    o.bytes("data", buf, 6);
    p.close_both();
}

void trunc_buf(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "0123456789", 10, 0);
    poll1(p.b, POLLIN, 2000);
    char buf[16] = {};
    o.r("trunc", ::recv(p.b, buf, 3, MSG_TRUNC));
    o.r("rest", ::recv(p.b, buf, sizeof buf, 0));
    o.bytes("data", buf, 7);
    p.close_both();
}

void trunc_peek(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "0123456789", 10, 0);
    poll1(p.b, POLLIN, 2000);
    char buf[16] = {};
    o.r("trunc-peek", ::recv(p.b, buf, 4, MSG_TRUNC | MSG_PEEK));
    o.bytes("peeked", buf, 4);
    o.r("rest", ::recv(p.b, buf, sizeof buf, 0));
    o.bytes("data", buf, 10);
    p.close_both();
}

void oob_basic(Out &o) {
    Pair p = make_pair();
    o.r("send", ::send(p.a, "ab", 2, 0));
    o.r("send-oob", ::send(p.a, "!", 1, MSG_OOB));
    o.r("send2", ::send(p.a, "cd", 2, 0));
    poll1(p.b, POLLPRI, 2000);
    o.revents("poll", poll1(p.b, POLLIN | POLLPRI, 2000));
    char c = 0;
    o.r("recv-oob", ::recv(p.b, &c, 1, MSG_OOB));
    o.bytes("oob", &c, 1);
    char buf[16] = {};
    int mark = -1;
    ::ioctl(p.b, SIOCATMARK, &mark);
    o.n("atmark", mark);
    o.r("recv", ::recv(p.b, buf, sizeof buf, 0));
    o.bytes("data", buf, 2);
    ::ioctl(p.b, SIOCATMARK, &mark);
    o.n("atmark2", mark);
    o.r("recv2", ::recv(p.b, buf, sizeof buf, MSG_DONTWAIT));
    o.bytes("data2", buf, 2);
    p.close_both();
}

void oob_inline(Out &o) {
    Pair p = make_pair();
    int on = 1;
    o.r("oobinline", ::setsockopt(p.b, SOL_SOCKET, SO_OOBINLINE, &on, sizeof on));
    ::send(p.a, "ab", 2, 0);
    ::send(p.a, "!", 1, MSG_OOB);
    ::send(p.a, "cd", 2, 0);
    poll1(p.b, POLLPRI, 2000);
    char buf[16] = {};
    o.r("recv-oob", ::recv(p.b, buf, 1, MSG_OOB));
    std::string all;
    for (int i = 0; i < 5 && all.size() < 5; ++i) {
        const ssize_t n = ::recv(p.b, buf, sizeof buf, MSG_DONTWAIT);
        if (n <= 0) break;
        all.append(buf, std::size_t(n));
        o.n("chunk", n);
    }
    o.bytes("data", all.data(), all.size());
    p.close_both();
}

void oob_none(Out &o) {
    Pair p = make_pair();
    char c;
    o.r("recv-oob-empty", ::recv(p.b, &c, 1, MSG_OOB | MSG_DONTWAIT));
    ::send(p.a, "x", 1, 0);
    poll1(p.b, POLLIN, 2000);
    o.r("recv-oob-noneurgent", ::recv(p.b, &c, 1, MSG_OOB));
    o.r("recv", ::recv(p.b, &c, 1, 0));
    o.bytes("data", &c, 1);
    p.close_both();
}

void errqueue(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "12345678", 8, 0);
    poll1(p.b, POLLIN, 2000);
    char buf[16] = {};
    iovec iov{buf, sizeof buf};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    o.r("errqueue", ::recvmsg(p.b, &mh, MSG_ERRQUEUE));
    o.r("errqueue-dontwait", ::recvmsg(p.b, &mh, MSG_ERRQUEUE | MSG_DONTWAIT));
    o.r("recv", ::recv(p.b, buf, sizeof buf, 0));
    o.bytes("data", buf, 8);
    o.r("errqueue-sender", ::recvmsg(p.a, &mh, MSG_ERRQUEUE));
    p.close_both();
}

void nosignal(Out &o) {
    Pair p = make_pair();
    ::close(p.b);
    p.b = -1;
    msleep(20);
    o.r("send1", ::send(p.a, "x", 1, MSG_NOSIGNAL));
    poll1(p.a, POLLERR, 1000);
    o.r("send2", ::send(p.a, "x", 1, MSG_NOSIGNAL));
    o.r("send3", ::send(p.a, "x", 1, MSG_NOSIGNAL));
    o.n("sigpipes", sigpipes_taken());
    p.close_both();
}

void sigpipe_send(Out &o) {
    Pair p = make_pair();
    ::close(p.b);
    p.b = -1;
    msleep(20);
    o.r("send1", ::send(p.a, "x", 1, 0));
    poll1(p.a, POLLERR, 1000);
    o.r("send2", ::send(p.a, "x", 1, 0));
    o.n("sigpipes2", sigpipes_taken());
    o.r("write3", ::write(p.a, "x", 1));
    o.n("sigpipes3", sigpipes_taken());
    iovec iov{const_cast<char *>("y"), 1};
    o.r("writev4", ::writev(p.a, &iov, 1));
    o.n("sigpipes4", sigpipes_taken());
    p.close_both();
}

// As above, but the writer only writes (no poll between its sends): the
// peer's close must be seen by the sends themselves.
void sigpipe_writer_only(Out &o) {
    Pair p = make_pair();
    ::close(p.b);
    p.b = -1;
    msleep(20);
    o.r("send1", ::send(p.a, "x", 1, 0));
    msleep(20);
    o.r("send2", ::send(p.a, "x", 1, 0));
    o.r("write3", ::write(p.a, "x", 1));
    o.n("sigpipes", sigpipes_taken());
    p.close_both();
}

void sigpipe_shutwr(Out &o) {
    Pair p = make_pair();
    ::shutdown(p.a, SHUT_WR);
    o.r("send", ::send(p.a, "x", 1, 0));
    o.n("sigpipes", sigpipes_taken());
    o.r("send-nosignal", ::send(p.a, "x", 1, MSG_NOSIGNAL));
    o.n("sigpipes2", sigpipes_taken());
    msghdr mh{};
    iovec iov{const_cast<char *>("y"), 1};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    o.r("sendmsg", ::sendmsg(p.a, &mh, 0));
    o.n("sigpipes3", sigpipes_taken());
    p.close_both();
}

void more_flush(Out &o) {
    Pair p = make_pair();
    o.r("more", ::send(p.a, "abc", 3, MSG_MORE));
    o.r("last", ::send(p.a, "def", 3, 0));
    char buf[8] = {};
    o.r("recv", ::recv(p.b, buf, 6, MSG_WAITALL));
    o.bytes("data", buf, 6);
    p.close_both();
}

void more_alone(Out &o) {
    Pair p = make_pair();
    int on = 1;
    ::setsockopt(p.a, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
    o.r("more", ::send(p.a, "abc", 3, MSG_MORE));
    // The kernel sends what MSG_MORE held back within its 200 ms limit.
    o.revents("poll-2s", poll1(p.b, POLLIN, 2000));
    char buf[8] = {};
    o.r("recv", ::recv(p.b, buf, sizeof buf, MSG_DONTWAIT));
    o.bytes("data", buf, 3);
    p.close_both();
}

// ---- zero lengths ------------------------------------------------------------------

void zero_read(Out &o) {
    Pair p = make_pair();
    char buf[4];
    // (A blocking recv of 0 bytes waits for data on TCP: not here.)
    o.r("read0", ::read(p.b, buf, 0));
    o.r("recv0-dontwait", ::recv(p.b, buf, 0, MSG_DONTWAIT));
    iovec iov{buf, 0};
    o.r("readv0", ::readv(p.b, &iov, 0));
    o.r("readv-zero-iov", ::readv(p.b, &iov, 1));
    p.close_both();
}

void zero_read_data(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "ab", 2, 0);
    poll1(p.b, POLLIN, 2000);
    char buf[4] = {};
    o.r("read0", ::read(p.b, buf, 0));
    o.r("recv0", ::recv(p.b, buf, 0, 0));
    o.r("recv", ::recv(p.b, buf, 4, 0));
    o.bytes("data", buf, 2);
    p.close_both();
}

void zero_read_eof(Out &o) {
    Pair p = make_pair();
    ::shutdown(p.a, SHUT_WR);
    poll1(p.b, POLLRDHUP, 2000);
    char buf[4];
    o.r("read0", ::read(p.b, buf, 0));
    o.r("recv0", ::recv(p.b, buf, 0, 0));
    o.r("recv", ::recv(p.b, buf, 4, 0));
    p.close_both();
}

void zero_recv_nonblock(Out &o) {
    Pair p = make_pair();
    set_nonblock(p.b, true);
    char buf[4];
    o.r("recv0", ::recv(p.b, buf, 0, 0));
    o.r("read0", ::read(p.b, buf, 0));
    o.r("recv4", ::recv(p.b, buf, 4, 0));
    p.close_both();
}

void zero_write(Out &o) {
    Pair p = make_pair();
    char buf[4] = "abc";
    o.r("write0", ::write(p.a, buf, 0));
    o.r("send0", ::send(p.a, buf, 0, 0));
    o.r("send0-null", ::send(p.a, nullptr, 0, 0));
    iovec iov{buf, 0};
    o.r("writev0", ::writev(p.a, &iov, 0));
    o.r("writev-zero-iov", ::writev(p.a, &iov, 1));
    msghdr mh{};
    o.r("sendmsg-empty", ::sendmsg(p.a, &mh, 0));
    o.revents("peer-poll", poll1(p.b, POLLIN, 100));
    p.close_both();
}

void zero_write_shut(Out &o) {
    Pair p = make_pair();
    ::shutdown(p.a, SHUT_WR);
    o.r("send0", ::send(p.a, "", 0, MSG_NOSIGNAL));
    o.r("write0", ::write(p.a, "", 0));
    o.n("sigpipes", sigpipes_taken());
    p.close_both();
}

void zero_write_reset(Out &o) {
    Pair p = make_pair();
    ::send(p.a, "unread", 6, 0);
    poll1(p.b, POLLIN, 2000);
    ::close(p.b);
    p.b = -1;
    poll1(p.a, POLLERR, 2000);
    o.r("send0", ::send(p.a, "", 0, MSG_NOSIGNAL));
    o.r("send1", ::send(p.a, "x", 1, MSG_NOSIGNAL));
    p.close_both();
}

}  // namespace

void add_flag_cases(std::vector<Case> &all) {
    add(all, "flag-peek", peek);
    add(all, "flag-peek-eof", peek_eof);
    add(all, "flag-peek-waitall", peek_waitall);
    add(all, "flag-waitall", waitall);
    add(all, "flag-waitall-eof", waitall_eof);
    add(all, "flag-waitall-timeout", waitall_timeout);
    add(all, "flag-waitall-nonblock", waitall_nonblock);
    add(all, "flag-dontwait", dontwait);
    add(all, "flag-trunc-null", trunc_null);
    add(all, "flag-trunc-buf", trunc_buf);
    add(all, "flag-trunc-peek", trunc_peek);
    add(all, "flag-oob", oob_basic);
    add(all, "flag-oob-inline", oob_inline);
    add(all, "flag-oob-none", oob_none);
    add(all, "flag-errqueue", errqueue);
    add(all, "flag-nosignal", nosignal);
    add(all, "flag-sigpipe", sigpipe_send);
    add(all, "flag-sigpipe-writer-only", sigpipe_writer_only);
    add(all, "flag-sigpipe-shutwr", sigpipe_shutwr);
    add(all, "flag-more-flush", more_flush);
    add(all, "flag-more-alone", more_alone);
    add(all, "zero-read", zero_read);
    add(all, "zero-read-data", zero_read_data);
    add(all, "zero-read-eof", zero_read_eof);
    add(all, "zero-recv-nonblock", zero_recv_nonblock);
    add(all, "zero-write", zero_write);
    add(all, "zero-write-shut", zero_write_shut);
    add(all, "zero-write-reset", zero_write_reset);
}

}  // namespace conform
