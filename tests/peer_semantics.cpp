// TCP's corners, checked exactly: reads of nothing, MSG_TRUNC, the error
// queue, SO_RCVLOWAT, SHUT_RD, an abortive close, the first send after the
// peer closed, and a close while another thread is blocked in recv. The
// kernel's answers are the reference (the kernel configuration runs the
// same checks with nothing preloaded).
#include "peer_drivers.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace peer {

namespace {

double since_s(std::uint64_t start_ns) { return double(now_ns() - start_ns) / 1e9; }

// The responder sends `size` bytes of `seed` in one call, after `delay_us`.
void ask_send(int fd, std::uint64_t size, std::uint64_t seed, std::uint32_t delay_us = 0) {
    Cmd cmd;
    cmd.op = Op::send;
    cmd.size = size;
    cmd.seed = seed;
    cmd.flags = kWhole;
    cmd.pre_delay_us = delay_us;
    send_cmd(fd, cmd);
}

// Until FIONREAD says `n` bytes are there (5 s at most).
void wait_queued(int fd, int n, const char *what) {
    int avail = -1;
    for (int i = 0; i < 5000; ++i) {
        if (ioctl(fd, FIONREAD, &avail) != 0) fail("%s: FIONREAD: %s", what, errno_name(errno));
        if (avail == n) return;
        if (avail > n) fail("%s: FIONREAD %d, more than the %d bytes sent", what, avail, n);
        sleep_us(1000);
    }
    fail("%s: only %d of %d bytes arrived within 5 s", what, avail, n);
}

void expect_result(ssize_t n, int err, ssize_t want, int want_err, const char *what) {
    if (n == want && (want >= 0 || err == want_err)) return;
    fail("%s returned %zd (%s), expected %zd (%s)", what, n, n < 0 ? errno_name(err) : "-", want,
         want < 0 ? errno_name(want_err) : "-");
}

}  // namespace

// errno as the call left it (the arguments of a function call have no order).
#define EXPECT(call, want, want_err, what)                 \
    do {                                                   \
        const ssize_t got_ = (call);                       \
        const int err_ = errno;                            \
        expect_result(got_, err_, want, want_err, what);   \
    } while (0)

void drive_sem_zero_read(int *fd, const Options &opt) {
    // A read of nothing that blocked would end the process here.
    arm_watchdog(10);
    char buf[128];
    iovec none{buf, 0};
    const std::uint64_t start = now_ns();
    EXPECT(read(*fd, buf, 0), 0, 0, "read(fd, buf, 0) on an empty socket");
    EXPECT(readv(*fd, &none, 0), 0, 0, "readv(fd, iov, 0) on an empty socket");
    EXPECT(readv(*fd, &none, 1), 0, 0, "readv of one empty piece");
    if (since_s(start) > 1) fail("reads of nothing took %.3f s", since_s(start));
    // recv of nothing is a recv: nothing queued, EAGAIN without waiting.
    EXPECT(recv(*fd, buf, 0, MSG_DONTWAIT), -1, EAGAIN,
           "recv(len 0, MSG_DONTWAIT) on an empty socket");
    const std::uint64_t seed = seed_of(opt, 1);
    ask_send(*fd, 100, seed);
    wait_queued(*fd, 100, "100 bytes");
    // With bytes there, every read of nothing returns 0 and takes none.
    EXPECT(recv(*fd, buf, 0, 0), 0, 0, "recv(len 0) with bytes queued");
    EXPECT(recv(*fd, buf, 0, MSG_DONTWAIT), 0, 0,
           "recv(len 0, MSG_DONTWAIT) with bytes queued");
    EXPECT(read(*fd, buf, 0), 0, 0, "read(fd, buf, 0) with bytes queued");
    read_all(*fd, buf, 100, "the bytes after reads of nothing");
    pattern_expect(seed, 0, buf, 100, "the bytes after reads of nothing");
    arm_watchdog(unsigned(opt.num("watchdog", 120)));
    send_exit(*fd);
}

void drive_sem_trunc(int *fd, const Options &opt) {
    const std::uint64_t seed = seed_of(opt, 2);
    ask_send(*fd, 10000, seed);
    wait_queued(*fd, 10000, "10000 bytes");
    // TCP's MSG_TRUNC: the bytes are consumed and not copied.
    EXPECT(recv(*fd, nullptr, 1000, MSG_TRUNC), 1000, 0,
           "recv(NULL, 1000, MSG_TRUNC)");
    count_rx(*fd, 1000);
    char buf[10000];
    std::memset(buf, 0x5a, sizeof buf);
    EXPECT(recv(*fd, buf, 500, MSG_TRUNC), 500, 0, "recv(buf, 500, MSG_TRUNC)");
    count_rx(*fd, 500);
    for (int i = 0; i < 500; ++i)
        if (buf[i] != 0x5a) fail("recv(buf, 500, MSG_TRUNC) wrote into the buffer at %d", i);
    // With MSG_PEEK: counted, neither copied nor consumed.
    EXPECT(recv(*fd, nullptr, 300, MSG_TRUNC | MSG_PEEK), 300, 0,
           "recv(NULL, 300, MSG_TRUNC | MSG_PEEK)");
    int avail = -1;
    if (ioctl(*fd, FIONREAD, &avail) != 0 || avail != 8500)
        fail("FIONREAD after discarding 1500 of 10000: %d, expected 8500", avail);
    read_all(*fd, buf, 8500, "the bytes after MSG_TRUNC");
    pattern_expect(seed, 1500, buf, 8500, "the bytes after MSG_TRUNC");
    EXPECT(recv(*fd, nullptr, 100, MSG_TRUNC | MSG_DONTWAIT), -1, EAGAIN,
           "recv(NULL, 100, MSG_TRUNC | MSG_DONTWAIT) on an empty socket");
    send_exit(*fd);
}

void drive_sem_errqueue(int *fd, const Options &opt) {
    const std::uint64_t seed = seed_of(opt, 3);
    ask_send(*fd, 64, seed);
    wait_queued(*fd, 64, "64 bytes");
    char buf[64], control[256];
    iovec v{buf, sizeof buf};
    msghdr m{};
    m.msg_iov = &v;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    // Nothing in the error queue: EAGAIN, and the stream stays whole.
    EXPECT(recvmsg(*fd, &m, MSG_ERRQUEUE), -1, EAGAIN, "recvmsg(MSG_ERRQUEUE)");
    EXPECT(recv(*fd, buf, sizeof buf, MSG_ERRQUEUE | MSG_DONTWAIT), -1, EAGAIN,
           "recv(MSG_ERRQUEUE | MSG_DONTWAIT)");
    int avail = -1;
    if (ioctl(*fd, FIONREAD, &avail) != 0 || avail != 64)
        fail("FIONREAD after the error queue reads: %d, expected 64", avail);
    read_all(*fd, buf, 64, "the bytes after MSG_ERRQUEUE");
    pattern_expect(seed, 0, buf, 64, "the bytes after MSG_ERRQUEUE");
    send_exit(*fd);
}

void drive_sem_rcvlowat(int *fd, const Options &opt) {
    const int low = 100;
    if (setsockopt(*fd, SOL_SOCKET, SO_RCVLOWAT, &low, sizeof low) != 0)
        fail("setsockopt(SO_RCVLOWAT): %s", errno_name(errno));
    const std::uint64_t seed = seed_of(opt, 4), seed2 = seed_of(opt, 5);
    ask_send(*fd, 10, seed);
    wait_queued(*fd, 10, "10 bytes");
    // 10 bytes under a low mark of 100: not readable, whatever waits.
    pollfd p{*fd, POLLIN, 0};
    EXPECT(poll(&p, 1, 300), 0, 0, "poll(POLLIN) with 10 bytes of 100");
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(*fd, &rd);
    timeval tv{0, 300000};
    EXPECT(select(*fd + 1, &rd, nullptr, nullptr, &tv), 0, 0,
           "select(read) with 10 bytes of 100");
    int ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, *fd, &ev) != 0)
        fail("epoll: %s", errno_name(errno));
    epoll_event out{};
    EXPECT(epoll_wait(ep, &out, 1, 300), 0, 0, "epoll_wait with 10 bytes of 100");
    // A non-blocking recv takes what is there.
    char buf[200];
    EXPECT(recv(*fd, buf, sizeof buf, MSG_DONTWAIT), 10, 0,
           "recv(MSG_DONTWAIT) of 10 bytes of 100");
    count_rx(*fd, 10);
    pattern_expect(seed, 0, buf, 10, "the first 10 bytes");
    // A blocking recv waits for the low mark: 60 bytes come, later 40.
    const std::uint64_t seed3 = seed_of(opt, 9);
    ask_send(*fd, 60, seed2, 200000);
    ask_send(*fd, 40, seed3, 200000);
    const std::uint64_t start = now_ns();
    EXPECT(recv(*fd, buf, sizeof buf, 0), 100, 0, "blocking recv(200) with SO_RCVLOWAT 100");
    count_rx(*fd, 100);
    if (since_s(start) < 0.3)
        fail("blocking recv returned after %.3f s, before the last 40 bytes were sent",
             since_s(start));
    pattern_expect(seed2, 0, buf, 60, "the next 60 bytes");
    pattern_expect(seed3, 0, buf + 60, 40, "the last 40 bytes");
    // Enough bytes: readable again.
    ask_send(*fd, 150, seed);
    EXPECT(epoll_wait(ep, &out, 1, 5000), 1, 0, "epoll_wait with 150 bytes of 100");
    p.revents = 0;
    EXPECT(poll(&p, 1, 5000), 1, 0, "poll(POLLIN) with 150 bytes of 100");
    close(ep);
    read_all(*fd, buf, 150, "150 bytes");
    pattern_expect(seed, 0, buf, 150, "150 bytes");
    send_exit(*fd);
}

void drive_sem_shut_rd(int *fd, const Options &opt) {
    char buf[100];
    if (shutdown(*fd, SHUT_RD) != 0) fail("shutdown(SHUT_RD): %s", errno_name(errno));
    const std::uint64_t start = now_ns();
    EXPECT(recv(*fd, buf, sizeof buf, 0), 0, 0, "recv after SHUT_RD");
    if (since_s(start) > 1) fail("recv after SHUT_RD waited %.3f s", since_s(start));
    // TCP still takes what the peer sends after our SHUT_RD, and recv
    // returns it; then EOF again.
    const std::uint64_t seed = seed_of(opt, 6);
    ask_send(*fd, 50, seed);
    wait_queued(*fd, 50, "50 bytes after SHUT_RD");
    EXPECT(recv(*fd, buf, sizeof buf, 0), 50, 0, "recv of bytes sent after SHUT_RD");
    count_rx(*fd, 50);
    pattern_expect(seed, 0, buf, 50, "bytes sent after SHUT_RD");
    EXPECT(recv(*fd, buf, sizeof buf, 0), 0, 0, "recv after those bytes");
    send_exit(*fd);
}

void drive_sem_linger_reset(int *fd, const Options &opt) {
    Cmd cmd;
    cmd.op = Op::linger_close;
    cmd.size2 = 1500;  // the responder stays alive this long after close()
    send_cmd(*fd, cmd);
    // An abortive close: a reset, seen by poll and reported by one recv.
    pollfd p{*fd, POLLIN | POLLOUT | POLLRDHUP, 0};
    constexpr short all = POLLIN | POLLOUT | POLLRDHUP | POLLERR | POLLHUP;
    const std::uint64_t start = now_ns();
    while (since_s(start) < 5) {
        p.revents = 0;
        if (poll(&p, 1, 1000) < 0) fail("poll: %s", errno_name(errno));
        if (p.revents & (POLLERR | POLLHUP)) break;
        sleep_us(1000);
    }
    if (p.revents != all)
        fail("poll after the peer's abortive close: revents 0x%x, expected 0x%x",
             unsigned(p.revents), unsigned(all));
    char buf[16];
    if (opt.get("read-error") == "so_error") {
        // Reading SO_ERROR reports the reset, and recv does not again.
        int err = -1;
        socklen_t len = sizeof err;
        if (getsockopt(*fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != ECONNRESET)
            fail("SO_ERROR after the peer's abortive close: %s, expected ECONNRESET",
                 errno_name(err));
        err = -1;
        if (getsockopt(*fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)
            fail("SO_ERROR read a second time: %s, expected 0", errno_name(err));
        EXPECT(recv(*fd, buf, sizeof buf, 0), 0, 0, "recv after SO_ERROR reported the reset");
        return;
    }
    EXPECT(recv(*fd, buf, sizeof buf, 0), -1, ECONNRESET, "recv after the peer's abortive close");
    EXPECT(recv(*fd, buf, sizeof buf, 0), 0, 0, "the recv after ECONNRESET");
}

void drive_sem_send_after_close(int *fd, const Options &opt) {
    Cmd cmd;
    cmd.op = Op::send_close;
    cmd.api = std::uint32_t(Tx::send);
    cmd.size = 1000;
    cmd.seed = seed_of(opt, 7);
    cmd.size2 = 1500;
    send_cmd(*fd, cmd);
    char buf[1000];
    read_all(*fd, buf, sizeof buf, "bytes before the peer's close");
    pattern_expect(cmd.seed, 0, buf, sizeof buf, "bytes before the peer's close");
    expect_eof(*fd, "recv after the peer's close");
    // The peer only closed: the first send is taken (it draws the reset).
    EXPECT(send(*fd, "x", 1, MSG_NOSIGNAL), 1, 0,
           "the first send after the peer's close");
    const std::uint64_t start = now_ns();
    while (since_s(start) < 2) {
        sleep_us(10000);
        ssize_t n = send(*fd, "x", 1, MSG_NOSIGNAL);
        if (n == 1) continue;  // the reset is not there yet
        EXPECT(n, -1, EPIPE, "a send after the peer's reset");
        EXPECT(send(*fd, "x", 1, MSG_NOSIGNAL), -1, EPIPE, "the next send");
        return;
    }
    fail("sends to a closed peer never failed");
}

void drive_sem_close_in_recv(int *fd, const Options &opt) {
    // The responder sends 0.5 s from now; our recv waits in another thread
    // and our close() comes meanwhile: the socket lives on until the
    // recv is over, which gets the bytes (as the kernel does).
    const std::uint64_t seed = seed_of(opt, 8);
    ask_send(*fd, 64, seed, 500000);
    char buf[128];
    ssize_t got = -2;
    int err = 0;
    const int sock = *fd;
    std::thread reader([&] {
        got = recv(sock, buf, sizeof buf, 0);
        err = errno;
    });
    sleep_us(200000);
    if (close(sock) != 0) fail("close during a blocked recv: %s", errno_name(errno));
    *fd = -1;
    reader.join();
    expect_result(got, err, 64, 0, "a recv blocked while another thread closed the socket");
    pattern_expect(seed, 0, buf, 64, "the bytes of that recv");
}

void drive_sem_shut_rdwr_reset(int *fd, const Options &opt) {
    // TCP answers bytes that reach an end shut both ways with a reset: that
    // end reports POLLERR, then ECONNRESET once, then EOF. The responder
    // sends 0.2 s after our shutdown.
    const std::uint64_t seed = seed_of(opt, 12);
    ask_send(*fd, 64, seed, 200000);
    EXPECT(shutdown(*fd, SHUT_RDWR), 0, 0, "shutdown(SHUT_RDWR)");
    short got = 0;
    for (int i = 0; i < 500 && !(got & POLLERR); ++i) {
        pollfd p{*fd, POLLIN | POLLOUT | POLLRDHUP, 0};
        if (poll(&p, 1, 0) < 0) fail("poll: %s", errno_name(errno));
        got = p.revents;
        if (!(got & POLLERR)) sleep_us(10000);
    }
    const short want = POLLIN | POLLOUT | POLLRDHUP | POLLHUP | POLLERR;
    if (got != want)
        fail("poll after bytes came to an end shut both ways: revents %#x, expected %#x",
             unsigned(got), unsigned(want));
    char buf[64];
    EXPECT(recv(*fd, buf, sizeof buf, MSG_DONTWAIT), -1, ECONNRESET,
           "recv after bytes came to an end shut both ways");
    EXPECT(recv(*fd, buf, sizeof buf, MSG_DONTWAIT), 0, 0, "recv after the reset was reported");
    int err = -1;
    socklen_t len = sizeof err;
    if (getsockopt(*fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)
        fail("SO_ERROR after the reset was reported: %d, expected 0", err);
}

void drive_sem_send_to_shut_end(int *fd, const Options &) {
    // The responder shuts both ways and then makes no socket call: our
    // bytes to its end still draw the reset at once, as from TCP's kernel.
    Cmd cmd;
    cmd.op = Op::shut_idle;
    cmd.size2 = 3000;
    send_cmd(*fd, cmd);
    pollfd p{*fd, POLLRDHUP, 0};
    if (poll(&p, 1, 5000) != 1 || !(p.revents & POLLRDHUP)) fail("the responder's FIN never came");
    EXPECT(send(*fd, "ps", 2, MSG_NOSIGNAL), 2, 0, "a send to an end shut both ways");
    short got = 0;
    for (int i = 0; i < 200 && !(got & POLLERR); ++i) {
        p = pollfd{*fd, POLLIN | POLLOUT | POLLRDHUP, 0};
        if (poll(&p, 1, 0) < 0) fail("poll: %s", errno_name(errno));
        got = p.revents;
        if (!(got & POLLERR)) sleep_us(5000);
    }
    const short want = POLLIN | POLLOUT | POLLRDHUP | POLLHUP | POLLERR;
    if (got != want)
        fail("poll after sending to an end shut both ways: revents %#x, expected %#x within 1 s",
             unsigned(got), unsigned(want));
    // After the peer's FIN, TCP reports the reset as EPIPE.
    EXPECT(send(*fd, "ps", 2, MSG_NOSIGNAL), -1, EPIPE, "the send after the reset");
    EXPECT(send(*fd, "ps", 2, MSG_NOSIGNAL), -1, EPIPE, "the next send");
    char buf[8];
    EXPECT(recv(*fd, buf, sizeof buf, MSG_DONTWAIT), 0, 0, "recv after the reset");
}

void drive_sem_send_after_shut_close(int *fd, const Options &) {
    // The responder shuts both ways, then closes: it reads no more, so the
    // first send is taken and draws the reset, and the next ones fail.
    Cmd cmd;
    cmd.op = Op::shut_close;
    cmd.size2 = 2000;
    send_cmd(*fd, cmd);
    pollfd p{*fd, POLLRDHUP, 0};
    if (poll(&p, 1, 5000) != 1 || !(p.revents & POLLRDHUP)) fail("the responder's FIN never came");
    sleep_us(100000);
    EXPECT(send(*fd, "x", 1, MSG_NOSIGNAL), 1, 0, "the first send after the peer's close");
    short got = 0;
    for (int i = 0; i < 200 && !(got & POLLERR); ++i) {
        p = pollfd{*fd, POLLIN | POLLOUT | POLLRDHUP, 0};
        if (poll(&p, 1, 0) < 0) fail("poll: %s", errno_name(errno));
        got = p.revents;
        if (!(got & POLLERR)) sleep_us(5000);
    }
    const short want = POLLIN | POLLOUT | POLLRDHUP | POLLHUP | POLLERR;
    if (got != want)
        fail("poll after the send that drew the reset: revents %#x, expected %#x within 1 s",
             unsigned(got), unsigned(want));
    EXPECT(send(*fd, "x", 1, MSG_NOSIGNAL), -1, EPIPE, "the send after the reset");
    EXPECT(send(*fd, "x", 1, MSG_NOSIGNAL), -1, EPIPE, "the next send");
}

void drive_sem_disconnect(int *fd, const Options &) {
    // connect(AF_UNSPEC) disconnects: TCP resets the connection both ways.
    // The responder waits in recv for that reset.
    Cmd cmd;
    cmd.op = Op::await_reset;
    send_cmd(*fd, cmd);
    sleep_us(100000);
    sockaddr sa{};
    sa.sa_family = AF_UNSPEC;
    EXPECT(connect(*fd, &sa, sizeof sa), 0, 0, "connect(AF_UNSPEC)");
    EXPECT(send(*fd, "x", 1, MSG_NOSIGNAL), -1, ECONNRESET, "a send after connect(AF_UNSPEC)");
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    EXPECT(getpeername(*fd, reinterpret_cast<sockaddr *>(&peer), &len), -1, ENOTCONN,
           "getpeername after connect(AF_UNSPEC)");
}

void drive_sem_tcp_info_fin(int *fd, const Options &opt) {
    // TCP_INFO's state follows the connection's end: CLOSE_WAIT once the
    // peer's FIN is read (on a direct connection the kernel socket's own
    // FIN waits, so the state comes from what the fabric said).
    const std::uint64_t seed = seed_of(opt, 13);
    tcp_info ti{};
    socklen_t len = sizeof ti;
    if (getsockopt(*fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 || ti.tcpi_state != TCP_ESTABLISHED)
        fail("TCP_INFO state before the peer's FIN: %u, expected ESTABLISHED",
             unsigned(ti.tcpi_state));
    Cmd cmd;
    cmd.op = Op::send_shut;
    cmd.size = 100;
    cmd.seed = seed;
    send_cmd(*fd, cmd);
    char buf[100];
    read_all(*fd, buf, sizeof buf, "the bytes before the peer's FIN");
    pattern_expect(seed, 0, buf, sizeof buf, "the bytes before the peer's FIN");
    expect_eof(*fd, "recv after the peer's FIN");
    len = sizeof ti;
    if (getsockopt(*fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 || ti.tcpi_state != TCP_CLOSE_WAIT)
        fail("TCP_INFO state after the peer's FIN: %u, expected CLOSE_WAIT (%u)",
             unsigned(ti.tcpi_state), unsigned(TCP_CLOSE_WAIT));
}

namespace {

// `len` bytes held back (TCP_CORK or MSG_MORE) reach the responder, whose
// acknowledgement comes back: after how long.
double held_bytes_delay(int fd, std::size_t len, int flags, std::uint64_t seed) {
    char buf[64];
    pattern_fill(seed, 0, buf, len);
    const std::uint64_t start = now_ns();
    EXPECT(send(fd, buf, len, flags), ssize_t(len), 0, "a held-back send");
    count_tx(fd, len);
    expect_ack(fd, "the held-back bytes");
    return since_s(start);
}

void ask_recv(int fd, std::uint64_t size, std::uint64_t seed) {
    Cmd cmd;
    cmd.op = Op::recv;
    cmd.api = std::uint32_t(Rx::recv);
    cmd.size = size;
    cmd.seed = seed;
    send_cmd(fd, cmd);
}

}  // namespace

void drive_sem_cork(int *fd, const Options &opt) {
    // TCP sends corked bytes after 200 ms even if nothing more comes.
    const std::uint64_t seed = seed_of(opt, 10);
    ask_recv(*fd, 6, seed);
    int on = 1;
    if (setsockopt(*fd, IPPROTO_TCP, TCP_CORK, &on, sizeof on) != 0)
        fail("setsockopt(TCP_CORK): %s", errno_name(errno));
    double t = held_bytes_delay(*fd, 6, 0, seed);
    note("corked bytes acknowledged after %.3f s", t);
    // The kernel sends them after 200 ms; the library at once (a byte
    // send() took never waits in process memory, where a kill would lose
    // it): within 200 ms either way, never held for good.
    if (t > 1.0) fail("6 corked bytes arrived after %.3f s, expected at most about 0.2 s", t);
    on = 0;
    if (setsockopt(*fd, IPPROTO_TCP, TCP_CORK, &on, sizeof on) != 0)
        fail("setsockopt(TCP_CORK, 0): %s", errno_name(errno));
    ask_recv(*fd, 4, seed);
    t = held_bytes_delay(*fd, 4, MSG_MORE, seed);
    note("MSG_MORE bytes acknowledged after %.3f s", t);
    // TCP holds them at most as long as corked ones (less when an ACK
    // comes first: 0.04 s seen).
    if (t > 1.0) fail("4 MSG_MORE bytes arrived after %.3f s, expected at most about 0.2 s", t);
    send_exit(*fd);
}

namespace {

void ask_urgent(int fd, std::uint64_t size, std::uint64_t seed, std::uint64_t size2,
                std::uint64_t seed2) {
    Cmd cmd;
    cmd.op = Op::urgent;
    cmd.size = size;
    cmd.seed = seed;
    cmd.size2 = size2;
    cmd.seed2 = seed2;
    send_cmd(fd, cmd);
}

// Until poll reports urgent data (5 s at most); the events seen.
short await_urgent(int fd) {
    pollfd p{fd, POLLIN | POLLPRI, 0};
    const std::uint64_t start = now_ns();
    while (since_s(start) < 5) {
        p.revents = 0;
        if (poll(&p, 1, 1000) < 0) fail("poll: %s", errno_name(errno));
        if (p.revents & POLLPRI) return p.revents;
        sleep_us(2000);
    }
    fail("poll never reported urgent data (POLLPRI) within 5 s: revents 0x%x",
         unsigned(p.revents));
}

int at_mark(int fd) {
    int at = -1;
    if (ioctl(fd, SIOCATMARK, &at) != 0) fail("ioctl(SIOCATMARK): %s", errno_name(errno));
    return at;
}

}  // namespace

void drive_sem_urgent(int *fd, const Options &opt) {
    const std::uint64_t seed = seed_of(opt, 11), seed2 = seed_of(opt, 12);
    char buf[4096];
    // Out of band: the bytes before the mark, the urgent byte by
    // recv(MSG_OOB), then the bytes after it.
    ask_urgent(*fd, 1000, seed, 500, seed2);
    short ev = await_urgent(*fd);
    if (ev != (POLLIN | POLLPRI))
        fail("poll with urgent data: revents 0x%x, expected IN|PRI", unsigned(ev));
    if (at_mark(*fd) != 0) fail("SIOCATMARK with 1000 bytes before the mark: not 0");
    EXPECT(recv(*fd, buf, sizeof buf, 0), 1000, 0, "recv up to the urgent mark");
    count_rx(*fd, 1000);
    pattern_expect(seed, 0, buf, 1000, "bytes before the urgent mark");
    if (at_mark(*fd) != 1) fail("SIOCATMARK at the urgent mark: not 1");
    char urgent = 0;
    EXPECT(recv(*fd, &urgent, 1, MSG_OOB), 1, 0, "recv(MSG_OOB)");
    if (urgent != kUrgentByte)
        fail("recv(MSG_OOB) gave 0x%02x, expected '%c'", unsigned(urgent), kUrgentByte);
    EXPECT(recv(*fd, &urgent, 1, MSG_OOB | MSG_DONTWAIT), -1, EINVAL, "a second recv(MSG_OOB)");
    read_all(*fd, buf, 500, "bytes after the urgent byte");
    pattern_expect(seed2, 0, buf, 500, "bytes after the urgent byte");
    // SO_OOBINLINE: the urgent byte comes in line, at the mark.
    const int on = 1;
    if (setsockopt(*fd, SOL_SOCKET, SO_OOBINLINE, &on, sizeof on) != 0)
        fail("setsockopt(SO_OOBINLINE): %s", errno_name(errno));
    ask_urgent(*fd, 300, seed2, 200, seed);
    (void)await_urgent(*fd);
    EXPECT(recv(*fd, buf, sizeof buf, 0), 300, 0, "recv up to the in-line urgent mark");
    count_rx(*fd, 300);
    pattern_expect(seed2, 0, buf, 300, "bytes before the in-line urgent mark");
    if (at_mark(*fd) != 1) fail("SIOCATMARK at the in-line urgent mark: not 1");
    EXPECT(recv(*fd, &urgent, 1, MSG_OOB | MSG_DONTWAIT), -1, EINVAL,
           "recv(MSG_OOB) with SO_OOBINLINE");
    read_all(*fd, buf, 201, "the in-line urgent byte and the bytes after it");
    if (buf[0] != kUrgentByte)
        fail("in-line urgent byte 0x%02x, expected '%c'", unsigned(buf[0]), kUrgentByte);
    pattern_expect(seed, 0, buf + 1, 200, "bytes after the in-line urgent byte");
    send_exit(*fd);
}

void respond_urgent(int fd, const Cmd &cmd) {
    send_whole(fd, cmd.seed, cmd.size);
    EXPECT(send(fd, &kUrgentByte, 1, MSG_OOB), 1, 0, "send(MSG_OOB)");
    count_tx(fd, 1);
    send_whole(fd, cmd.seed2, cmd.size2);
}

void respond_linger_close(int *fd, const Cmd &cmd) {
    linger l{1, 0};
    if (setsockopt(*fd, SOL_SOCKET, SO_LINGER, &l, sizeof l) != 0)
        fail("setsockopt(SO_LINGER): %s", errno_name(errno));
    close(*fd);
    *fd = -1;
    sleep_us(cmd.size2 * 1000);
}

}  // namespace peer
