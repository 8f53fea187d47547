// What send() promises, seen from both ends: what it accepted is the
// peer's, whatever the sender does next (close, exit, die), and it accepts
// as much as the kernel's buffers would, without waiting for the reader.
// Both ends of a connection run the scenario (no responder): each one
// knows its own part, and the harness compares what they print.
#include "peer_common.hpp"
#include "peer_sendpath.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace peer {

namespace {

constexpr std::uint64_t kSeed = 0x5e4d;

void set_nonblocking(int fd, bool on) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK) != 0)
        fail("fcntl(O_NONBLOCK): %s", errno_name(errno));
}

double ms_since(std::uint64_t t0) { return double(now_ns() - t0) / 1e6; }

// One blocking send of --size bytes to a reader that starts only after
// --delay-ms: the send must return long before (the kernel's buffers take
// it), or a program that sends and then tells its peer to read deadlocks.
void bigsend(int fd, bool sender, const Options &opt) {
    const std::size_t size = std::size_t(opt.num("size", 131072));
    const std::uint64_t delay_ms = opt.num("delay-ms", 1000);
    if (!sender) {
        sleep_us(delay_ms * 1000);
        recv_pattern(fd, Rx::recv, kSeed, size, 65536, "the big send");
        write_all(fd, "A", 1);
        return;
    }
    std::vector<char> buf(size);
    pattern_fill(kSeed, 0, buf.data(), size);
    const std::uint64_t t0 = now_ns();
    ssize_t n = send(fd, buf.data(), size, 0);
    const double took = ms_since(t0);
    if (n != ssize_t(size))
        fail("send of %zu bytes returned %zd (%s)", size, n, n < 0 ? errno_name(errno) : "short");
    count_tx(fd, std::uint64_t(n));
    note("send of %zu bytes returned in %.1f ms", size, took);
    if (took > double(delay_ms) / 2)
        fail("a blocking send of %zu bytes waited %.0f ms for a reader that starts after %llu ms",
             size, took, (unsigned long long)delay_ms);
    char a;
    read_all(fd, &a, 1, "the reader's answer");
}

// A non-blocking sender that meets a full window and retries after a
// sleep, never polling nor reading: once the reader drains, its sends must
// go through again.
void eagain_sleep(int fd, bool sender, const Options &opt) {
    const std::size_t size = std::size_t(opt.num("size", 8u << 20));
    if (!sender) {
        sleep_us(opt.num("delay-ms", 300) * 1000);
        recv_pattern(fd, Rx::recv, kSeed, size, 65536, "the non-blocking sender's stream");
        write_all(fd, "A", 1);
        return;
    }
    set_nonblocking(fd, true);
    std::vector<char> buf(65536);
    std::size_t off = 0;
    unsigned eagain = 0;
    const std::uint64_t t0 = now_ns();
    while (off < size) {
        if (ms_since(t0) > 10000)
            fail("sent %zu of %zu bytes in 10 s (%u EAGAIN): the returned window was never seen",
                 off, size, eagain);
        std::size_t len = std::min(buf.size(), size - off);
        pattern_fill(kSeed, off, buf.data(), len);
        ssize_t n = send(fd, buf.data(), len, 0);
        if (n > 0) {
            off += std::size_t(n);
            count_tx(fd, std::uint64_t(n));
            continue;
        }
        if (n == 0 || errno != EAGAIN) fail("send: %zd (%s)", n, errno_name(errno));
        ++eagain;
        sleep_us(1000);
    }
    if (eagain == 0) fail("the window never filled: nothing was tested");
    note("sent %zu bytes in %.0f ms, %u EAGAIN on the way", size, ms_since(t0), eagain);
    set_nonblocking(fd, false);
    char a;
    read_all(fd, &a, 1, "the reader's answer");
}

// A non-blocking sender fills the window, offers a small tail, and then
// closes, exits or is killed; the reader, late, must get every byte that
// send() accepted, then EOF. --how close|exit|kill.
void tail(int *fd, bool sender, const Options &opt) {
    const std::uint64_t delay_ms = opt.num("delay-ms", 500);
    if (!sender) {
        sleep_us(delay_ms * 1000);
        std::vector<char> buf(65536);
        std::uint64_t got = 0;
        for (;;) {
            ssize_t n = recv(*fd, buf.data(), buf.size(), 0);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) fail("recv after %llu bytes: %s", (unsigned long long)got, errno_name(errno));
            if (n == 0) break;
            pattern_expect(kSeed, got, buf.data(), std::size_t(n), "the sender's stream");
            got += std::uint64_t(n);
            count_rx(*fd, std::uint64_t(n));
        }
        note("received %llu", (unsigned long long)got);
        return;
    }
    const std::string how = opt.get("how", "close");
    set_nonblocking(*fd, true);
    std::vector<char> buf(65536);
    std::uint64_t accepted = 0;
    for (int i = 0;; ++i) {
        if (i == 8192) fail("512 MiB accepted without a reader: the window never filled");
        pattern_fill(kSeed, accepted, buf.data(), buf.size());
        ssize_t n = send(*fd, buf.data(), buf.size(), 0);
        if (n < 0 && errno == EAGAIN) break;
        if (n <= 0) fail("send: %zd (%s)", n, errno_name(errno));
        accepted += std::uint64_t(n);
    }
    pattern_fill(kSeed, accepted, buf.data(), 4);
    ssize_t t = send(*fd, buf.data(), 4, 0);
    if (t < 0 && errno != EAGAIN) fail("send of the tail: %s", errno_name(errno));
    if (t > 0) accepted += std::uint64_t(t);
    count_tx(*fd, accepted);
    note("accepted %llu", (unsigned long long)accepted);
    if (how == "exit") _exit(0);
    if (how == "kill") {
        kill(getpid(), SIGKILL);
        for (;;) pause();
    }
    report_bytes(*fd);
    const std::uint64_t t0 = now_ns();
    if (close(*fd) != 0) fail("close: %s", errno_name(errno));
    *fd = -1;
    const double took = ms_since(t0);
    note("close returned in %.1f ms", took);
    if (took > 200) fail("close with bytes in flight blocked for %.0f ms", took);
    // Alive while the reader reads: it must see a closed socket.
    sleep_us((delay_ms + 1000) * 1000);
}

// The reader takes 64 KiB of a stream that goes on and closes with bytes
// unread (TCP answers with a reset): the sender's sends, of --chunk bytes,
// must then fail with ECONNRESET or EPIPE, and so must the next one.
void reset_sender(int *fd, bool sender, const Options &opt) {
    if (!sender) {
        std::vector<char> buf(65536);
        read_all(*fd, buf.data(), buf.size(), "the first 64 KiB");
        pattern_expect(kSeed, 0, buf.data(), buf.size(), "the first 64 KiB");
        report_bytes(*fd);
        if (close(*fd) != 0) fail("close: %s", errno_name(errno));
        *fd = -1;
        return;
    }
    std::vector<char> buf(std::size_t(opt.num("chunk", 65536)));
    std::uint64_t sent = 0;
    const std::uint64_t t0 = now_ns();
    ssize_t n = 0;
    while (ms_since(t0) < 5000) {
        pattern_fill(kSeed, sent, buf.data(), buf.size());
        n = send(*fd, buf.data(), buf.size(), MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        sent += std::uint64_t(n);
        count_tx(*fd, std::uint64_t(n));
    }
    if (n > 0) fail("sends kept succeeding for 5 s (%llu bytes) after the reader closed",
                    (unsigned long long)sent);
    if (n == 0 || (errno != ECONNRESET && errno != EPIPE))
        fail("send after the reader closed: %zd (%s), expected ECONNRESET or EPIPE", n,
             n < 0 ? errno_name(errno) : "0");
    const int first = errno;
    n = send(*fd, buf.data(), buf.size(), MSG_NOSIGNAL);
    if (n >= 0 || (errno != EPIPE && errno != ECONNRESET))
        fail("the send after %s: %zd (%s), expected EPIPE", errno_name(first), n,
             n < 0 ? errno_name(errno) : "bytes taken");
}

// One thread writes a line and closes, another reads: the line, then EOF,
// never a reset (nothing was left unread). --rounds connections, made in
// this process besides the one the harness gave it.
void close_line(bool driver, const Options &opt) {
    if (!driver) return;
    std::uint16_t port = 0;
    int l = listen_loopback(family_of(opt), 16, &port);
    const int rounds = int(opt.num("rounds", 50));
    static const char line[] = "one line, then the end\n";
    const std::size_t len = sizeof line - 1;
    for (int i = 0; i < rounds; ++i) {
        int w = connect_loopback(family_of(opt), port);
        int r = accept(l, nullptr, nullptr);
        if (r < 0) fail("accept: %s", errno_name(errno));
        report_conn(w, "writer");
        report_conn(r, "reader");
        // A byte each way first, so that both ends are direct before the line.
        char b = 0;
        write_all(w, "x", 1);
        read_all(r, &b, 1, "the writer's first byte");
        write_all(r, "y", 1);
        read_all(w, &b, 1, "the reader's first byte");
        std::thread writer([&] {
            write_all(w, line, len);
            report_bytes(w);
            if (close(w) != 0) fail("close: %s", errno_name(errno));
        });
        char got[sizeof line] = {};
        std::size_t have = 0;
        while (have < len) {
            ssize_t n = recv(r, got + have, sizeof got - have, 0);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0)
                fail("round %d: recv after %zu bytes of the line: %zd (%s)", i, have, n,
                     n < 0 ? errno_name(errno) : "EOF");
            have += std::size_t(n);
            count_rx(r, std::uint64_t(n));
        }
        if (std::memcmp(got, line, len) != 0) fail("round %d: the line differs", i);
        expect_eof(r, "after the line");
        writer.join();
        report_bytes(r);
        close(r);
    }
    close(l);
}

}  // namespace

bool is_sendpath_scenario(const std::string &scenario) {
    return scenario == "sp-bigsend" || scenario == "sp-eagain-sleep" || scenario == "sp-tail" ||
           scenario == "sp-reset-sender" || scenario == "sp-close-line";
}

void serve_sendpath(int *fd, bool is_client, const Options &opt) {
    const std::string scenario = opt.get("scenario");
    // The client sends, but in sp-tail, where the sender may be killed:
    // the harness expects that of the server.
    if (scenario == "sp-bigsend") bigsend(*fd, is_client, opt);
    else if (scenario == "sp-eagain-sleep") eagain_sleep(*fd, is_client, opt);
    else if (scenario == "sp-tail") tail(fd, !is_client, opt);
    else if (scenario == "sp-reset-sender") reset_sender(fd, is_client, opt);
    else if (scenario == "sp-close-line") close_line(is_client, opt);
    else fail("unknown scenario '%s'", scenario.c_str());
}

}  // namespace peer
