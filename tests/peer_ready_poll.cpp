// Readiness through every waiting call: data, window, half-close, reset,
// peer death, signals, signal masks, sets mixing a connection with other
// kinds of fds, and a connection accepted on the fd number of one that a
// forked child still holds. Each scenario runs once per call named in
// --apis (or, for the ones that end the connection, the call --conn-index
// picks).
#include "peer_ready.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/types.h>
#include <unistd.h>

namespace peer {

namespace {

constexpr short kAll = POLLIN | POLLOUT | POLLRDHUP;

// Receives len bytes that sit at stream offset off of seed.
void take_part(int fd, std::uint64_t seed, std::uint64_t off, std::size_t len, const char *what) {
    std::vector<char> buf(len + 1);
    read_all(fd, buf.data(), len, what);
    pattern_expect(seed, off, buf.data(), len, what);
}

void expect_took(const Waited &w, Api api, double lo, double hi, const char *what) {
    if (w.took < lo || w.took > hi)
        fail("%s [%s]: returned after %.3f s, expected between %.3f and %.3f s", what,
             api_name(api), w.took, lo, hi);
}

void data_once(int fd, Api api, std::uint64_t seed) {
    Waiter all(api, {{fd, kAll}});
    Waiter in(api, {{fd, POLLIN}});
    expect_ready(all, 0, {POLLOUT}, "fresh connection: writable, nothing to read");
    expect_ready(in, 0, {0}, "timeout 0 with nothing to read");

    Waited w = expect_ready(in, 100, {0}, "timeout 100 ms with nothing to read");
    expect_took(w, api, 0.095, 3, "timeout 100 ms with nothing to read");
    if (api == Api::select && (in.tv_after.tv_sec != 0 || in.tv_after.tv_usec != 0))
        fail("select timed out but left %ld.%06ld s in its timeout (Linux writes 0)",
             long(in.tv_after.tv_sec), long(in.tv_after.tv_usec));
    if (api == Api::pselect && (in.ts_after.tv_sec != 0 || in.ts_after.tv_nsec != 100000000))
        fail("pselect changed its timeout to %ld.%09ld s", long(in.ts_after.tv_sec),
             long(in.ts_after.tv_nsec));

    // No timeout: the wait lasts until the data comes.
    std::uint64_t t0 = now_ns();
    order_send(fd, 100, seed, 100000, true);
    w = since(expect_ready(in, -1, {POLLIN}, "no timeout, data sent 100 ms later"), t0);
    expect_took(w, api, 0.07, 5, "no timeout, data sent 100 ms later");
    await_queued(fd, 100, "100 bytes");
    expect_ready(all, 0, {POLLIN | POLLOUT}, "data queued");
    if (!api_is_select(api)) {
        Waiter norm(api, {{fd, POLLRDNORM | POLLWRNORM}});
        expect_ready(norm, 0, {POLLIN | POLLOUT}, "POLLRDNORM|POLLWRNORM with data queued");
    }
    take_part(fd, seed, 0, 99, "99 of 100 bytes");
    expect_ready(in, 0, {POLLIN}, "one byte left");
    take_part(fd, seed, 99, 1, "last byte");
    expect_ready(all, 0, {POLLOUT}, "everything read");
    expect_ready(in, 0, {0}, "everything read");

    // A finite timeout cut short by data.
    t0 = now_ns();
    order_send(fd, 100, seed + 1, 50000, true);
    w = since(expect_ready(in, 5000, {POLLIN}, "timeout 5 s, data sent 50 ms later"), t0);
    expect_took(w, api, 0.03, 3, "timeout 5 s, data sent 50 ms later");
    if (api == Api::select) {
        const double left = double(in.tv_after.tv_sec) + double(in.tv_after.tv_usec) / 1e6;
        if (left < 1.9 || left > 4.97)
            fail("select returned after %.3f s of 5 but left %.6f s in its timeout", w.took,
                 left);
    }
    if ((api == Api::pselect) && (in.ts_after.tv_sec != 5 || in.ts_after.tv_nsec != 0))
        fail("pselect changed its timeout to %ld.%09ld s", long(in.ts_after.tv_sec),
             long(in.ts_after.tv_nsec));
    take(fd, 100, seed + 1, "data that ended a finite wait");
    expect_ready(in, 0, {0}, "everything read");
}

}  // namespace

void drive_ready_data(int *fd, const Options &opt) {
    std::uint64_t n = 0;
    for (Api api : apis_of(opt)) data_once(*fd, api, seed_of(opt, ++n * 10));
    send_exit(*fd);
}

// Fresh connection per call (--conn-index): a receive buffer that grew in
// an earlier round would let the send queue drain without the peer reading.
void drive_ready_window(int *fd, const Options &opt) {
    const Api api = api_of_conn(opt);
    Fill f = start_fill(*fd, opt.num("size", 16u << 20), seed_of(opt, 1), 400000);
    fill_until_eagain(*fd, f, Tx::send, MSG_DONTWAIT, "filling the window");
    Waiter out(api, {{*fd, POLLOUT}});
    Waiter both(api, {{*fd, POLLIN | POLLOUT}});
    expect_ready(out, 0, {0}, "window full: not writable");
    Waited w = expect_ready(both, 50, {0}, "window full: not writable within 50 ms");
    expect_took(w, api, 0.04, 3, "window full, timeout 50 ms");
    w = expect_ready(out, -1, {POLLOUT}, "the peer drains the window");
    note("window %s first=%llu eagain_at=%llu writable_after=%.3f", api_name(api),
         (unsigned long long)f.first, (unsigned long long)f.off, w.took);
    finish_fill(*fd, f, "the rest after the window opened");
    expect_ready(out, 0, {POLLOUT}, "window drained");
    send_exit(*fd);
}

// The connection ends here: one call per connection (--conn-index).
void drive_ready_rdhup(int *fd, const Options &opt) {
    const Api api = api_of_conn(opt);
    Cmd cmd;
    cmd.op = Op::send_shut;
    cmd.api = std::uint32_t(Tx::send);
    cmd.size = 100;
    cmd.seed = seed_of(opt, 1);
    cmd.chunk = 100;
    send_cmd(*fd, cmd);
    Waiter all(api, {{*fd, kAll}});
    Waiter in(api, {{*fd, POLLIN}});
    Waiter rdhup(api, {{*fd, short(POLLRDHUP)}});
    Waiter none(api, {{*fd, 0}});
    const short half = kAll;  // peer's FIN: readable, read-hung-up, still writable
    expect_ready_within(all, 5, {half}, "peer sent 100 bytes and shutdown(SHUT_WR)");
    if (api_is_select(api)) {
        // select cannot tell the FIN from data: make sure it is there.
        take(*fd, 100, cmd.seed, "data before the peer's shutdown");
        expect_eof(*fd, "after the peer's shutdown");
    }
    expect_ready(all, 0, {half}, "peer half-closed, asked again");
    expect_ready(in, 0, {half}, "peer half-closed, POLLIN only asked");
    expect_ready(rdhup, 0, {half}, "peer half-closed, POLLRDHUP only asked");
    expect_ready(none, 0, {half}, "peer half-closed, no events asked");
    if (!api_is_select(api)) {
        take(*fd, 100, cmd.seed, "data before the peer's shutdown");
        expect_ready(all, 0, {half}, "data read, FIN left");
        expect_eof(*fd, "after the peer's shutdown");
    }
    expect_ready(all, 0, {half}, "EOF read");
    expect_eof(*fd, "second read after the peer's shutdown");
    expect_ready(in, -1, {half}, "no timeout, EOF pending");

    if (shutdown(*fd, SHUT_WR) != 0) fail("shutdown(SHUT_WR): %s", errno_name(errno));
    const short both = kAll | POLLHUP;
    expect_ready(all, 0, {both}, "both directions shut");
    expect_ready(none, 0, {both}, "both directions shut, no events asked");
    expect_ready(in, -1, {both}, "both directions shut, no timeout");
}

// The responder closes with bytes it never read: the kernel answers with a
// reset. --conn-index picks the call.
void drive_ready_reset(int *fd, const Options &opt) {
    const Api api = api_of_conn(opt);
    Cmd cmd;
    cmd.op = Op::send_close;
    cmd.api = std::uint32_t(Tx::send);
    cmd.size = 0;
    cmd.pre_delay_us = 50000;
    cmd.size2 = 50;  // the responder lives on this long (ms) after its close
    const std::uint64_t t0 = now_ns();
    send_cmd(*fd, cmd);
    std::vector<char> junk(1000);
    pattern_fill(seed_of(opt, 1), 0, junk.data(), junk.size());
    write_all(*fd, junk.data(), junk.size());
    Waiter in(api, {{*fd, POLLIN | POLLRDHUP}});
    Waiter all(api, {{*fd, kAll}});
    const short reset = kAll | POLLHUP | POLLERR;
    Waited w = since(expect_ready(in, -1, {reset}, "peer closed with unread data"), t0);
    expect_took(w, api, 0.02, 3, "peer closed with unread data");
    expect_ready(all, 0, {reset}, "after the reset");
    char c;
    ssize_t n = recv(*fd, &c, 1, 0);
    if (n != -1 || errno != ECONNRESET)
        fail("recv after the reset: %zd (%s), expected -1 ECONNRESET", n,
             n < 0 ? errno_name(errno) : n == 0 ? "EOF" : "data");
    expect_ready(all, 0, {kAll | POLLHUP}, "after the reset was reported");
    n = recv(*fd, &c, 1, 0);
    if (n != 0) fail("second recv after the reset: %zd (%s), expected 0", n,
                     n < 0 ? errno_name(errno) : n == 0 ? "EOF" : "data");
    n = send(*fd, "x", 1, MSG_NOSIGNAL);
    if (n != -1 || errno != EPIPE)
        fail("send after the reset: %zd (%s), expected -1 EPIPE", n, n < 0 ? errno_name(errno) : "sent");
}

// The harness kills the responder (SIGKILL) while 1000 bytes it never read
// sit in its socket: a blocked wait must end with the reset.
void drive_ready_death(int *fd, const Options &opt) {
    const Api api = api_of_conn(opt);
    Cmd cmd;
    cmd.op = Op::hang;
    send_cmd(*fd, cmd);
    std::vector<char> junk(1000);
    pattern_fill(seed_of(opt, 1), 0, junk.data(), junk.size());
    write_all(*fd, junk.data(), junk.size());
    Waiter in(api, {{*fd, POLLIN | POLLRDHUP}});
    Waiter all(api, {{*fd, kAll}});
    const short reset = kAll | POLLHUP | POLLERR;
    Waited w;
    {
        Watch watch(10, "waiting for the peer's death");
        w = in.wait(-1);
    }
    note("death %s rc=%d revents=%s after %.3f s", api_name(api), w.rc,
         events_text(w.revents[0]).c_str(), w.took);
    if (w.rc != in.expected_rc({reset}) || w.revents[0] != in.project(0, reset))
        fail("peer killed with unread data [%s]: returned %d (%s) with %s, expected %s", api_name(api),
             w.rc, w.rc < 0 ? errno_name(w.err) : "-", events_text(w.revents[0]).c_str(),
             events_text(in.project(0, reset)).c_str());
    expect_ready(all, 0, {reset}, "after the peer's death");
    char c;
    ssize_t n = recv(*fd, &c, 1, 0);
    if (n != -1 || errno != ECONNRESET)
        fail("recv after the peer's death: %zd (%s), expected -1 ECONNRESET", n,
             n < 0 ? errno_name(errno) : n == 0 ? "EOF" : "data");
    expect_ready(all, 0, {kAll | POLLHUP}, "after the reset was reported");
    n = recv(*fd, &c, 1, 0);
    if (n != 0) fail("second recv after the peer's death: %zd, expected 0", n);
}

void drive_ready_eintr(int *fd, const Options &opt) {
    for (Api api : apis_of(opt)) {
        Waiter in(api, {{*fd, POLLIN}});
        for (int flags : {0, SA_RESTART}) {
            for (int timeout : {-1, 5000}) {
                install_usr1(flags);
                const int before = usr1_hits();
                const std::uint64_t t0 = now_ns();
                std::thread t = usr1_later(pthread_self(), 50000);
                Waited w;
                {
                    Watch watch(5, "wait interrupted by a signal");
                    w = since(in.wait(timeout), t0);
                }
                t.join();
                const char *how = flags ? "SA_RESTART" : "no SA_RESTART";
                if (w.rc != -1 || w.err != EINTR)
                    fail("%s (timeout %d) hit by a signal with %s: returned %d (%s) after %.3f s, "
                         "expected -1 EINTR (these calls are never restarted)",
                         api_name(api), timeout, how, w.rc, w.rc < 0 ? errno_name(w.err) : "-",
                         w.took);
                expect_took(w, api, 0.03, 3, "wait interrupted by a signal");
                if (usr1_hits() != before + 1)
                    fail("%s: the handler ran %d times, expected once", api_name(api),
                         usr1_hits() - before);
            }
        }
        uninstall_usr1();
        // Still usable, and still exact, after the interruptions.
        order_send(*fd, 10, seed_of(opt, 100 + std::uint64_t(api)), 0, true);
        expect_ready(in, -1, {POLLIN}, "data after EINTR");
        take(*fd, 10, seed_of(opt, 100 + std::uint64_t(api)), "data after EINTR");
    }
    send_exit(*fd);
}

void drive_ready_sigmask(int *fd, const Options &opt) {
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    std::uint64_t n = 0;
    for (Api api : apis_of(opt)) {
        if (!api_has_mask(api)) fail("%s takes no signal mask", api_name(api));
        Waiter in(api, {{*fd, POLLIN}});
        install_usr1(0);
        pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
        sigset_t open, shut;
        pthread_sigmask(SIG_SETMASK, nullptr, &open);
        shut = open;
        sigdelset(&open, SIGUSR1);
        int hits = usr1_hits();

        // No mask given: the blocked signal stays pending, the wait times out.
        std::thread t = usr1_later(pthread_self(), 30000);
        Waited w = expect_ready(in, 150, {0}, "blocked signal during a wait without a mask");
        t.join();
        expect_took(w, api, 0.14, 3, "blocked signal during a wait without a mask");
        if (usr1_hits() != hits || !usr1_pending())
            fail("%s without a mask: the blocked signal was delivered (handler ran %d times)",
                 api_name(api), usr1_hits() - hits);

        // A mask that unblocks it: the pending signal interrupts at once.
        w = in.wait(5000, &open);
        if (w.rc != -1 || w.err != EINTR || w.took > 2.5 || usr1_hits() != hits + 1)
            fail("%s with a mask that unblocks a pending signal: returned %d (%s) after %.3f s, "
                 "handler ran %d times; expected -1 EINTR at once, once",
                 api_name(api), w.rc, w.rc < 0 ? errno_name(w.err) : "-", w.took,
                 usr1_hits() - hits);
        if (!usr1_blocked()) fail("%s did not restore the thread's signal mask", api_name(api));
        if (usr1_pending()) fail("%s: the signal is still pending after its handler ran",
                                 api_name(api));

        // A signal that comes during a wait whose mask unblocks it.
        const std::uint64_t t0 = now_ns();
        t = usr1_later(pthread_self(), 50000);
        {
            Watch watch(5, "wait with an unblocking mask");
            w = since(in.wait(-1, &open), t0);
        }
        t.join();
        if (w.rc != -1 || w.err != EINTR || usr1_hits() != hits + 2)
            fail("%s with an unblocking mask, signal after 100 ms: returned %d (%s) after %.3f s,"
                 " handler ran %d times", api_name(api), w.rc,
                 w.rc < 0 ? errno_name(w.err) : "-", w.took, usr1_hits() - hits);
        expect_took(w, api, 0.03, 3, "wait with an unblocking mask");
        if (!usr1_blocked()) fail("%s did not restore the thread's signal mask", api_name(api));

        // The other way round: unblocked in the thread, blocked by the
        // call's mask. The wait times out; the signal is delivered when the
        // call puts the thread's mask back, before it returns.
        pthread_sigmask(SIG_UNBLOCK, &usr1, nullptr);
        t = usr1_later(pthread_self(), 30000);
        w = expect_ready(in, 150, {0}, "signal blocked by the call's mask", &shut);
        t.join();
        expect_took(w, api, 0.14, 3, "signal blocked by the call's mask");
        if (usr1_hits() != hits + 3)
            fail("%s with a mask that blocks the signal: handler ran %d times by the return, "
                 "expected 3", api_name(api), usr1_hits() - hits);
        if (usr1_blocked()) fail("%s left SIGUSR1 blocked after the call", api_name(api));

        // Readiness through a masked wait.
        const std::uint64_t seed = seed_of(opt, ++n);
        order_send(*fd, 10, seed, 30000, true);
        expect_ready(in, -1, {POLLIN}, "data during a masked wait", &shut);
        take(*fd, 10, seed, "data during a masked wait");
        uninstall_usr1();
    }
    send_exit(*fd);
}

namespace {

enum Mixed { kSock, kPipe, kEvent, kTimer, kUdp, kUnix, kListener, kMixedCount };

struct MixedFds {
    int fd[kMixedCount];
    int pipe_w = -1, unix_w = -1;
    sockaddr_in udp_addr{};
    std::uint16_t listen_port = 0;
};

MixedFds open_mixed(int sock) {
    MixedFds m{};
    m.fd[kSock] = sock;
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) fail("pipe2: %s", errno_name(errno));
    m.fd[kPipe] = p[0];
    m.pipe_w = p[1];
    m.fd[kEvent] = eventfd(0, EFD_CLOEXEC);
    m.fd[kTimer] = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
    m.fd[kUdp] = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (m.fd[kEvent] < 0 || m.fd[kTimer] < 0 || m.fd[kUdp] < 0)
        fail("eventfd/timerfd/udp socket: %s", errno_name(errno));
    m.udp_addr.sin_family = AF_INET;
    m.udp_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(m.fd[kUdp], reinterpret_cast<sockaddr *>(&m.udp_addr), sizeof m.udp_addr) != 0)
        fail("udp bind: %s", errno_name(errno));
    socklen_t len = sizeof m.udp_addr;
    getsockname(m.fd[kUdp], reinterpret_cast<sockaddr *>(&m.udp_addr), &len);
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0)
        fail("socketpair: %s", errno_name(errno));
    m.fd[kUnix] = sp[0];
    m.unix_w = sp[1];
    m.fd[kListener] = listen_loopback(AF_INET, 4, &m.listen_port);
    return m;
}

void close_mixed(MixedFds &m) {
    for (int i = 1; i < kMixedCount; ++i) close(m.fd[i]);
    close(m.pipe_w);
    close(m.unix_w);
}

void mixed_once(int sock, Api api, std::uint64_t seed) {
    MixedFds m = open_mixed(sock);
    std::vector<Want> wants;
    for (int i = 0; i < kMixedCount; ++i) wants.push_back({m.fd[i], POLLIN});
    Waiter w(api, wants);
    std::vector<short> full(kMixedCount, 0);
    expect_ready(w, 0, full, "mixed set, nothing ready");

    // The connection alone wakes a wait over idle kernel fds...
    std::uint64_t t0 = now_ns();
    order_send(sock, 10, seed, 50000, true);
    full[kSock] = POLLIN;
    Waited r = since(expect_ready(w, -1, full, "mixed set: data on the connection only"), t0);
    expect_took(r, api, 0.03, 5, "mixed set: data on the connection only");
    take(sock, 10, seed, "mixed set: data on the connection");
    full[kSock] = 0;
    expect_ready(w, 0, full, "mixed set after reading the connection");

    // ...and a kernel fd alone wakes it while the connection is idle.
    itimerspec its{};
    its.it_value.tv_nsec = 50000000;
    t0 = now_ns();
    if (timerfd_settime(m.fd[kTimer], 0, &its, nullptr) != 0)
        fail("timerfd_settime: %s", errno_name(errno));
    full[kTimer] = POLLIN;
    r = since(expect_ready(w, -1, full, "mixed set: the timer only"), t0);
    expect_took(r, api, 0.03, 5, "mixed set: the timer only");

    // Every other kind becomes readable; the connection stays idle.
    if (write(m.pipe_w, "p", 1) != 1) fail("pipe write: %s", errno_name(errno));
    const std::uint64_t one = 1;
    if (write(m.fd[kEvent], &one, 8) != 8) fail("eventfd write: %s", errno_name(errno));
    if (sendto(m.fd[kUdp], "udp", 3, 0, reinterpret_cast<sockaddr *>(&m.udp_addr),
               sizeof m.udp_addr) != 3)
        fail("udp sendto: %s", errno_name(errno));
    if (write(m.unix_w, "unx", 3) != 3) fail("unix write: %s", errno_name(errno));
    int client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons(m.listen_port);
    if (connect(client, reinterpret_cast<sockaddr *>(&to), sizeof to) != 0)
        fail("connect to the local listener: %s", errno_name(errno));
    for (int i : {kPipe, kEvent, kUdp, kUnix, kListener}) full[std::size_t(i)] = POLLIN;
    expect_ready_within(w, 5, full, "mixed set: every kernel fd readable, connection idle");

    order_send(sock, 10, seed + 1, 0, true);
    await_queued(sock, 10, "mixed set: data on the connection");
    full[kSock] = POLLIN;
    expect_ready(w, 0, full, "mixed set: everything readable");

    // Drained one by one: each leaves the answer at once.
    char buf[64];
    std::uint64_t ticks = 0;
    if (read(m.fd[kTimer], &ticks, 8) != 8) fail("timerfd read: %s", errno_name(errno));
    full[kTimer] = 0;
    expect_ready(w, 0, full, "mixed set: timer read");
    take(sock, 10, seed + 1, "mixed set: data on the connection");
    full[kSock] = 0;
    expect_ready(w, 0, full, "mixed set: connection read");
    if (read(m.fd[kPipe], buf, sizeof buf) != 1) fail("pipe read: %s", errno_name(errno));
    full[kPipe] = 0;
    expect_ready(w, 0, full, "mixed set: pipe read");
    if (read(m.fd[kEvent], &ticks, 8) != 8) fail("eventfd read: %s", errno_name(errno));
    full[kEvent] = 0;
    expect_ready(w, 0, full, "mixed set: eventfd read");
    if (recv(m.fd[kUdp], buf, sizeof buf, 0) != 3) fail("udp recv: %s", errno_name(errno));
    full[kUdp] = 0;
    expect_ready(w, 0, full, "mixed set: datagram read");
    if (read(m.fd[kUnix], buf, sizeof buf) != 3) fail("unix read: %s", errno_name(errno));
    full[kUnix] = 0;
    expect_ready(w, 0, full, "mixed set: unix socket read");
    int accepted = accept4(m.fd[kListener], nullptr, nullptr, SOCK_CLOEXEC);
    if (accepted < 0) fail("accept4 on the local listener: %s", errno_name(errno));
    full[kListener] = 0;
    expect_ready(w, 0, full, "mixed set: connection accepted");

    Waiter wr(api, {{sock, POLLOUT}, {m.pipe_w, POLLOUT}, {m.fd[kEvent], POLLOUT},
                    {m.fd[kUdp], POLLOUT}, {m.unix_w, POLLOUT}, {client, POLLOUT}});
    expect_ready(wr, 0, std::vector<short>(6, POLLOUT), "mixed set: all writable");
    close(accepted);
    close(client);
    close_mixed(m);
}

}  // namespace

void drive_ready_mixed(int *fd, const Options &opt) {
    std::uint64_t n = 0;
    for (Api api : apis_of(opt)) mixed_once(*fd, api, seed_of(opt, ++n * 10));
    send_exit(*fd);
}

// ---- an fd number given again ---------------------------------------------------
// Two connections, accepted one after the other (--driver server, --conns
// 2; the client connects both at once, --parallel 1). The first one
// (--conn-index 0) is polled for POLLIN with nothing sent, so that the
// poll sleeps; a forked child keeps its copy of the socket open, and this
// process closes its own. The second one is then accepted on the same fd
// number (the lowest free one), and its poll must watch its own socket,
// not the first one's, whose file lives on in the child: the data the
// client sends on it 200 ms later ends the poll within a second (--part
// data), and the first connection's hang-up, 50 ms into the poll, neither
// ends it nor reads as its EOF (--part hangup). Both polls ask for POLLIN
// alone: the same fd with the same events, so that nothing but the socket
// behind the number differs between the two sleeps.

namespace {

struct Reused {
    int fd = -1;        // the first connection's fd number
    pid_t holder = -1;  // the child that keeps its file open
    int pipe = -1;      // to the child: 'c' closes the first connection, EOF ends it
};
Reused reused;

// The child: holds the first connection until the pipe ends (at most 20 s
// a wait); on 'c', tells the client to close it.
[[noreturn]] void hold_first(int conn, int in) {
    for (int i = 0; i < 100; ++i) {
        pollfd pf{in, POLLIN, 0};
        const int r = poll(&pf, 1, 20000);
        if (r < 0 && errno == EINTR) continue;
        char c = 0;
        if (r <= 0 || read(in, &c, 1) != 1) break;
        if (c == 'c') {
            Cmd cmd;
            cmd.op = Op::send_close;
            cmd.api = std::uint32_t(Tx::send);
            cmd.pre_delay_us = 50000;
            send_cmd(conn, cmd);
        }
    }
    _exit(0);
}

void hand_first_to_child(int *fd) {
    Waiter in(Api::poll, {{*fd, POLLIN}});
    Waited w = expect_ready(in, 100, {0}, "connection 1, nothing sent, timeout 100 ms");
    expect_took(w, Api::poll, 0.095, 3, "connection 1, nothing sent, timeout 100 ms");
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) fail("pipe2: %s", errno_name(errno));
    std::fflush(stdout);
    const pid_t kid = fork();
    if (kid < 0) fail("fork: %s", errno_name(errno));
    if (kid == 0) {
        close(p[1]);
        hold_first(*fd, p[0]);
    }
    close(p[0]);
    reused = Reused{*fd, kid, p[1]};
    close(*fd);
    *fd = -1;
}

void poll_second(int *fd, const Options &opt, bool hangup) {
    if (reused.holder < 0) fail("connection 2 came before connection 1 was handed to a child");
    if (*fd != reused.fd)
        fail("connection 2 was accepted on fd %d, connection 1 had fd %d: this test needs the same "
             "number (the lowest free one), and something took it in between",
             *fd, reused.fd);
    const char *what = hangup ? "connection 2, data sent 200 ms into the poll, connection 1 closed "
                                "50 ms into it"
                              : "connection 2, data sent 200 ms into the poll";
    constexpr std::size_t kLen = 10;
    const std::uint64_t seed = seed_of(opt, 1);
    Waiter in(Api::poll, {{*fd, POLLIN}});
    const std::uint64_t t0 = now_ns();
    order_send(*fd, kLen, seed, 200000, true);
    if (hangup && write(reused.pipe, "c", 1) != 1) fail("pipe write: %s", errno_name(errno));
    const Waited w = since(in.wait(3000), t0);
    note("reused-fd %s fd=%d rc=%d revents=%s after %.3f s", hangup ? "hangup" : "data", *fd, w.rc,
         events_text(w.revents[0]).c_str(), w.took);
    if (w.rc != 1 || w.revents[0] != POLLIN)
        fail("%s: poll returned %d (%s) with %s after %.3f s, expected 1 with POLLIN", what, w.rc,
             w.rc < 0 ? errno_name(w.err) : "-", events_text(w.revents[0]).c_str(), w.took);
    if (w.took < 0.15)
        fail("%s: poll reported POLLIN after %.3f s, before the data was sent%s", what, w.took,
             hangup ? " (connection 1's hang-up, reported as connection 2's)" : "");
    if (w.took > 1.2)
        fail("%s: poll reported POLLIN after %.3f s, more than 1 s after the data was sent (the "
             "data did not wake it)",
             what, w.took);
    char buf[kLen + 1];
    ssize_t n = -1;
    for (int i = 0; i < 100; ++i) {
        n = recv(*fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n >= 0 || errno != EINTR) break;
    }
    if (n == 0) fail("%s: recv after the poll returned EOF, expected the data", what);
    if (n < 0) fail("%s: recv after the poll: %s, expected the data", what, errno_name(errno));
    if (std::size_t(n) > kLen) fail("%s: recv returned %zd bytes, %zu were sent", what, n, kLen);
    count_rx(*fd, std::uint64_t(n));
    if (std::size_t(n) < kLen) read_all(*fd, buf + n, kLen - std::size_t(n), what);
    pattern_expect(seed, 0, buf, kLen, what);
    expect_ready(in, 0, {0}, "connection 2, its data read");
    send_exit(*fd);
    close(reused.pipe);
    reap(reused.holder, "the child holding connection 1");
    reused = Reused{};
}

}  // namespace

void drive_ready_reused_fd(int *fd, const Options &opt) {
    const std::string part = part_of_conn(opt);
    if (part != "data" && part != "hangup")
        fail("--part must be data or hangup, not '%s'", part.c_str());
    if (opt.num("conn-index", 0) == 0) hand_first_to_child(fd);
    else poll_second(fd, opt, part == "hangup");
}

}  // namespace peer
