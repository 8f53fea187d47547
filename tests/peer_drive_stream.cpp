// Drivers for stream content and receive/send flags.
#include "peer_drivers.hpp"
#include "peer_pingpong.hpp"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace peer {

std::uint64_t seed_of(const Options &opt, std::uint64_t n) { return mix(opt.num("seed", 1), n); }

void send_exit(int fd) {
    Cmd cmd;
    cmd.op = Op::exit;
    send_cmd(fd, cmd);
}

void echo_round(int tx_fd, int rx_fd, std::uint64_t size, std::uint64_t seed) {
    Cmd cmd;
    cmd.op = Op::echo;
    cmd.size = size;
    cmd.seed = seed;
    cmd.seed2 = seed + 1;
    cmd.chunk = 4096;
    send_cmd(tx_fd, cmd);
    send_pattern(tx_fd, Tx::send, seed, size, 4096, 0);
    recv_pattern(rx_fd, Rx::recv, seed + 1, size, 4096, "echo");
}

void paced_pingpongs(int fd, const Options &opt, std::uint64_t ms, std::uint64_t first) {
    const std::uint64_t end = now_ns() + ms * 1000000ull;
    for (std::uint64_t k = 0; k < 10000 && now_ns() < end; ++k) {
        Cmd cmd;
        cmd.op = Op::pingpong;
        cmd.size = 20;
        cmd.seed = seed_of(opt, first + k);
        cmd.chunk = 512;
        send_cmd(fd, cmd);
        pingpong(fd, true, cmd.seed, cmd.size, cmd.chunk);
        sleep_us(1000);
    }
}

namespace {

double elapsed_s(std::uint64_t since_ns) { return double(now_ns() - since_ns) / 1e9; }

// -1 with EAGAIN is the only acceptable answer of a receive that must not block.
void expect_eagain(ssize_t n, int err, const char *what) {
    if (n != -1 || (err != EAGAIN && err != EWOULDBLOCK))
        fail("%s: expected -1 EAGAIN, got %zd (%s)", what, n, n < 0 ? errno_name(err) : "data");
}

void wait_readable(int fd, const char *what) {
    pollfd p{fd, POLLIN, 0};
    int r = -1;
    for (int i = 0; i < 100 && (r = poll(&p, 1, 5000)) < 0 && errno == EINTR; ++i) {
    }
    if (r != 1 || !(p.revents & POLLIN))
        fail("%s: socket not readable within 5 s (poll %d, revents 0x%x)", what, r,
             unsigned(p.revents));
}

void command_send(int fd, std::uint64_t size, std::uint64_t seed, std::uint32_t chunk,
                  std::uint32_t pre_delay_us = 0, std::uint32_t gap_us = 0) {
    Cmd cmd;
    cmd.op = Op::send;
    cmd.api = std::uint32_t(Tx::send);
    cmd.size = size;
    cmd.seed = seed;
    cmd.chunk = chunk;
    cmd.pre_delay_us = pre_delay_us;
    cmd.gap_us = gap_us;
    send_cmd(fd, cmd);
}

}  // namespace

namespace {

// Request, then answer, of `size` bytes; tx on this side pairs with rx on
// the responder and the other way round.
void bulk_round(int fd, Tx tx, Rx rx, std::uint64_t size, std::uint32_t chunk,
                std::uint32_t gap_us, std::uint64_t seed_in, std::uint64_t seed_out) {
    Cmd in;
    in.op = Op::recv;
    in.api = std::uint32_t(rx);
    in.size = size;
    in.seed = seed_in;
    in.chunk = chunk;
    send_cmd(fd, in);
    send_pattern(fd, tx, in.seed, size, chunk, gap_us);
    expect_ack(fd, "bulk: responder's ack");

    Cmd out = in;
    out.op = Op::send;
    out.api = std::uint32_t(tx);
    out.seed = seed_out;
    out.gap_us = gap_us;
    send_cmd(fd, out);
    recv_pattern(fd, rx, out.seed, size, chunk, "bulk from responder");
}

}  // namespace

// --tx/--rx name one pair of call families; --combos "tx:rx,tx:rx,..."
// runs several pairs one after the other on the same connection. With
// --gap-us each sender pauses that long between its chunks, so the reader
// drains everything and waits in recv before the next one.
void drive_bulk(int *fd, const Options &opt) {
    const std::uint64_t size = opt.num("size", 65536);
    const auto chunk = std::uint32_t(opt.num("chunk", 65536));
    const auto gap_us = std::uint32_t(opt.num("gap-us", 0));
    std::string combos = opt.get("combos", opt.get("tx", "write") + ":" + opt.get("rx", "read"));
    std::uint64_t n = 0;
    for (std::size_t pos = 0; pos < combos.size();) {
        std::size_t end = combos.find(',', pos);
        if (end == std::string::npos) end = combos.size();
        const std::string item = combos.substr(pos, end - pos);
        const std::size_t colon = item.find(':');
        if (colon == std::string::npos) fail("bad --combos item '%s'", item.c_str());
        ++n;
        bulk_round(*fd, parse_tx(item.substr(0, colon)), parse_rx(item.substr(colon + 1)),
                   size, chunk, gap_us, seed_of(opt, 2 * n), seed_of(opt, 2 * n + 1));
        pos = end + 1;
    }
    send_exit(*fd);
}

void drive_duplex(int *fd, const Options &opt) {
    const std::uint64_t size = opt.num("size", 1 << 20);
    Cmd cmd;
    cmd.op = Op::duplex;
    cmd.size = size;
    cmd.seed = seed_of(opt, 1);
    cmd.size2 = size;
    cmd.seed2 = seed_of(opt, 2);
    cmd.chunk = std::uint32_t(opt.num("chunk", 65536));
    send_cmd(*fd, cmd);
    int out = *fd;
    std::thread sender([&] { send_pattern(out, Tx::write, cmd.seed, size, cmd.chunk, 0); });
    recv_pattern(*fd, Rx::read, cmd.seed2, size, cmd.chunk, "duplex from responder");
    sender.join();
    expect_ack(*fd, "duplex: responder's ack");
    send_exit(*fd);
}

// --rounds requests of --size bytes, each sent in one call and echoed
// back by the responder in one call: a request-response exchange of large
// messages (each side takes the other's message in between two of its
// sends).
void drive_exchange(int *fd, const Options &opt) {
    const std::uint64_t size = opt.num("size", 65536);
    const std::uint64_t rounds = opt.num("rounds", 20);
    for (std::uint64_t k = 0; k < rounds; ++k) {
        Cmd cmd;
        cmd.op = Op::echo;
        cmd.size = size;
        cmd.seed = seed_of(opt, 2 * k);
        cmd.seed2 = seed_of(opt, 2 * k + 1);
        cmd.chunk = std::uint32_t(size);
        cmd.flags = kWhole;
        send_cmd(*fd, cmd);
        send_whole(*fd, cmd.seed, size);
        recv_pattern(*fd, Rx::recv, cmd.seed2, size, cmd.chunk, "exchange");
    }
    send_exit(*fd);
}

void drive_pingpong(int *fd, const Options &opt) {
    Cmd cmd;
    cmd.op = Op::pingpong;
    cmd.size = opt.num("rounds", 10000);
    cmd.seed = seed_of(opt, 1);
    cmd.chunk = std::uint32_t(opt.num("max-msg", 64));
    send_cmd(*fd, cmd);
    pingpong(*fd, true, cmd.seed, cmd.size, cmd.chunk);
    send_exit(*fd);
}

void drive_peek(int *fd, const Options &opt) {
    const std::uint64_t total = opt.num("size", 20000);
    const std::uint64_t seed = seed_of(opt, 1);
    command_send(*fd, total, seed, 700);
    std::uint64_t off = 0;
    std::vector<char> a(512), b(512), c(512);
    for (std::uint64_t k = 0; off < total && k < 100000; ++k) {
        std::size_t want = std::size_t(1 + mix(seed, k) % 500);
        ssize_t n1;
        if (k % 2) {
            n1 = recv(*fd, a.data(), want, MSG_PEEK);
        } else {
            iovec iov{a.data(), want};
            msghdr msg{};
            msg.msg_iov = &iov;
            msg.msg_iovlen = 1;
            n1 = recvmsg(*fd, &msg, MSG_PEEK);
        }
        if (n1 <= 0) fail("peek at offset %llu returned %zd (%s)", (unsigned long long)off, n1,
                          n1 < 0 ? errno_name(errno) : "EOF");
        pattern_expect(seed, off, a.data(), std::size_t(n1), "first MSG_PEEK");
        ssize_t n2 = recv(*fd, b.data(), want, MSG_PEEK);
        if (n2 < n1) fail("second peek returned %zd, fewer than the first (%zd)", n2, n1);
        pattern_expect(seed, off, b.data(), std::size_t(n2), "second MSG_PEEK");
        ssize_t n3 = read(*fd, c.data(), std::size_t(n1));
        if (n3 != n1) fail("read after a %zd-byte peek returned %zd (%s)", n1, n3,
                           n3 < 0 ? errno_name(errno) : "short");
        if (std::memcmp(a.data(), c.data(), std::size_t(n1)) != 0)
            fail("read returned other bytes than the peek at offset %llu",
                 (unsigned long long)off);
        count_rx(*fd, std::uint64_t(n3));
        off += std::uint64_t(n3);
    }
    if (off != total) fail("peek loop ended at %llu of %llu", (unsigned long long)off,
                           (unsigned long long)total);
    ssize_t n = recv(*fd, a.data(), 16, MSG_PEEK | MSG_DONTWAIT);
    expect_eagain(n, errno, "MSG_PEEK|MSG_DONTWAIT on a drained socket");
    send_exit(*fd);
}

void drive_waitall(int *fd, const Options &opt) {
    // Many small sends with pauses: only MSG_WAITALL makes one call return all.
    const std::uint64_t total = 65536 + 123;
    const std::uint64_t seed = seed_of(opt, 1);
    command_send(*fd, total, seed, 4096, 0, 2000);
    std::vector<char> buf(total);
    ssize_t n = recv(*fd, buf.data(), total, MSG_WAITALL);
    if (n != ssize_t(total))
        fail("recv(MSG_WAITALL, %llu) returned %zd (%s)", (unsigned long long)total, n,
             n < 0 ? errno_name(errno) : "short");
    pattern_expect(seed, 0, buf.data(), total, "recv(MSG_WAITALL)");
    count_rx(*fd, total);

    const std::uint64_t seed2 = seed_of(opt, 2);
    command_send(*fd, 10000, seed2, 1000, 0, 2000);
    iovec iov[3];
    iov[0] = {buf.data(), 1};
    iov[1] = {buf.data() + 1, 4999};
    iov[2] = {buf.data() + 5000, 5000};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = 3;
    n = recvmsg(*fd, &msg, MSG_WAITALL);
    if (n != 10000)
        fail("recvmsg(MSG_WAITALL, 3 iovecs, 10000) returned %zd (%s)", n,
             n < 0 ? errno_name(errno) : "short");
    pattern_expect(seed2, 0, buf.data(), 10000, "recvmsg(MSG_WAITALL)");
    count_rx(*fd, 10000);
    send_exit(*fd);
}

void drive_dontwait(int *fd, const Options &opt) {
    char buf[256];
    ssize_t n = recv(*fd, buf, sizeof buf, MSG_DONTWAIT);
    expect_eagain(n, errno, "recv(MSG_DONTWAIT) on an empty socket");
    n = recvfrom(*fd, buf, sizeof buf, MSG_DONTWAIT, nullptr, nullptr);
    expect_eagain(n, errno, "recvfrom(MSG_DONTWAIT) on an empty socket");
    iovec iov{buf, sizeof buf};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    n = recvmsg(*fd, &msg, MSG_DONTWAIT);
    expect_eagain(n, errno, "recvmsg(MSG_DONTWAIT) on an empty socket");

    const std::uint64_t seed = seed_of(opt, 1);
    command_send(*fd, 200, seed, 64);
    std::uint64_t got = 0;
    for (int i = 0; got < 200 && i < 10000; ++i) {
        wait_readable(*fd, "data for MSG_DONTWAIT");
        n = recv(*fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n <= 0) fail("recv(MSG_DONTWAIT) with data: %zd (%s)", n,
                         n < 0 ? errno_name(errno) : "EOF");
        if (got + std::uint64_t(n) > 200) fail("recv returned more bytes than were sent");
        pattern_expect(seed, got, buf, std::size_t(n), "recv(MSG_DONTWAIT)");
        count_rx(*fd, std::uint64_t(n));
        got += std::uint64_t(n);
    }
    if (got != 200) fail("received %llu of 200 bytes", (unsigned long long)got);
    n = recv(*fd, buf, sizeof buf, MSG_DONTWAIT);
    expect_eagain(n, errno, "recv(MSG_DONTWAIT) after draining");
    send_exit(*fd);
}

void drive_send_dontwait(int *fd, const Options &opt) {
    // The responder sleeps before reading, so the send path must fill up. Both
    // ends' buffers are capped: the kernel could otherwise take it all.
    const std::uint64_t total = opt.num("size", 32u << 20);
    int sndbuf = 65536;
    if (setsockopt(*fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf) != 0)
        fail("setsockopt(SO_SNDBUF): %s", errno_name(errno));
    const std::uint64_t seed = seed_of(opt, 1);
    Cmd cmd;
    cmd.op = Op::recv;
    cmd.api = std::uint32_t(Rx::recv);
    cmd.size = total;
    cmd.seed = seed;
    // Long enough for the window to fill first, also in small pieces on a
    // loaded host (2 MiB in 1000-byte sends is 2000 calls).
    const std::uint64_t delay_us = opt.num("reader-delay-us", 500000);
    cmd.pre_delay_us = std::uint32_t(delay_us);
    cmd.flags = kSmallRcvbuf;
    send_cmd(*fd, cmd);
    // --piece: bytes per send call.
    std::vector<char> buf(std::size_t(opt.num("piece", 65536)));
    std::uint64_t off = 0, eagain_at = 0;
    int eagains = 0;
    // The longest send call: a non-blocking send must not wait for the
    // reader (a kernel send never does), however small its pieces.
    std::uint64_t longest_ns = 0, longest_at = 0;
    for (int i = 0; off < total && i < 10000000; ++i) {
        std::size_t len = std::size_t(total - off < buf.size() ? total - off : buf.size());
        pattern_fill(seed, off, buf.data(), len);
        const std::uint64_t t0 = now_ns();
        ssize_t n = send(*fd, buf.data(), len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (now_ns() - t0 > longest_ns) {
            longest_ns = now_ns() - t0;
            longest_at = off;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (eagains++ == 0) eagain_at = off;
            pollfd p{*fd, POLLOUT, 0};
            if (poll(&p, 1, 5000) != 1) fail("socket not writable again within 5 s");
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fail("send(MSG_DONTWAIT): %zd (%s)", n, n < 0 ? errno_name(errno) : "0");
        count_tx(*fd, std::uint64_t(n));
        off += std::uint64_t(n);
    }
    if (off != total) fail("sent %llu of %llu bytes", (unsigned long long)off,
                           (unsigned long long)total);
    // Half the reader's delay: far beyond any scheduling delay of a loaded
    // host, far below a send that waited for the reader.
    if (longest_ns > delay_us * 500)
        fail("a send(MSG_DONTWAIT) of at most %zu bytes took %llu ms (at offset %llu): it "
             "waited for the reader", buf.size(), (unsigned long long)(longest_ns / 1000000),
             (unsigned long long)longest_at);
    if (eagains == 0)
        fail("send(MSG_DONTWAIT) never returned EAGAIN although the peer did not read "
             "for %llu ms (%llu bytes)", (unsigned long long)(delay_us / 1000),
             (unsigned long long)total);
    note("send_dontwait first EAGAIN after %llu bytes, %d EAGAINs, longest send %llu us",
         (unsigned long long)eagain_at, eagains, (unsigned long long)(longest_ns / 1000));
    expect_ack(*fd, "send(MSG_DONTWAIT): responder's ack");
    send_exit(*fd);
}

void drive_fionread(int *fd, const Options &opt) {
    int avail = -1;
    if (ioctl(*fd, FIONREAD, &avail) != 0 || avail != 0)
        fail("FIONREAD on an empty socket: %d (%s)", avail, errno_name(errno));
    const std::uint64_t seed = seed_of(opt, 1);
    command_send(*fd, 3000, seed, 1000);
    int last = 0;
    const std::uint64_t start = now_ns();
    for (int i = 0; last < 3000 && i < 5000; ++i) {
        if (ioctl(*fd, FIONREAD, &avail) != 0) fail("FIONREAD: %s", errno_name(errno));
        if (avail < last || avail > 3000)
            fail("FIONREAD went from %d to %d (3000 bytes were sent)", last, avail);
        last = avail;
        if (last < 3000) sleep_us(1000);
        if (elapsed_s(start) > 5) break;
    }
    if (last != 3000) fail("FIONREAD reached only %d of 3000 bytes within 5 s", last);
    char buf[3000];
    read_all(*fd, buf, 1000, "first 1000 bytes");
    pattern_expect(seed, 0, buf, 1000, "first 1000 bytes");
    if (ioctl(*fd, FIONREAD, &avail) != 0 || avail != 2000)
        fail("FIONREAD after reading 1000 of 3000: %d, expected 2000", avail);
    read_all(*fd, buf, 2000, "last 2000 bytes");
    pattern_expect(seed, 1000, buf, 2000, "last 2000 bytes");
    if (ioctl(*fd, FIONREAD, &avail) != 0 || avail != 0)
        fail("FIONREAD after reading everything: %d, expected 0", avail);
    send_exit(*fd);
}

void drive_nonblock(int *fd, const Options &opt) {
    char buf[256];
    int on = 1;
    if (ioctl(*fd, FIONBIO, &on) != 0) fail("ioctl(FIONBIO, 1): %s", errno_name(errno));
    if (!(fcntl(*fd, F_GETFL) & O_NONBLOCK)) fail("FIONBIO did not set O_NONBLOCK");
    ssize_t n = recv(*fd, buf, sizeof buf, 0);
    expect_eagain(n, errno, "recv after FIONBIO on an empty socket");
    n = read(*fd, buf, sizeof buf);
    expect_eagain(n, errno, "read after FIONBIO on an empty socket");
    on = 0;
    if (ioctl(*fd, FIONBIO, &on) != 0) fail("ioctl(FIONBIO, 0): %s", errno_name(errno));
    const int fl = fcntl(*fd, F_GETFL);
    if (fl & O_NONBLOCK) fail("FIONBIO 0 left O_NONBLOCK set");

    if (fcntl(*fd, F_SETFL, fl | O_NONBLOCK) != 0) fail("F_SETFL: %s", errno_name(errno));
    iovec iov{buf, sizeof buf};
    n = readv(*fd, &iov, 1);
    expect_eagain(n, errno, "readv with O_NONBLOCK on an empty socket");
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    n = recvmsg(*fd, &msg, 0);
    expect_eagain(n, errno, "recvmsg with O_NONBLOCK on an empty socket");

    const std::uint64_t seed = seed_of(opt, 1);
    command_send(*fd, 100, seed, 100);
    std::uint64_t got = 0;
    for (int i = 0; got < 100 && i < 10000; ++i) {
        wait_readable(*fd, "data with O_NONBLOCK");
        n = read(*fd, buf, sizeof buf);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n <= 0) fail("read with O_NONBLOCK: %zd (%s)", n, n < 0 ? errno_name(errno) : "EOF");
        if (got + std::uint64_t(n) > 100) fail("read returned more bytes than were sent");
        pattern_expect(seed, got, buf, std::size_t(n), "read with O_NONBLOCK");
        count_rx(*fd, std::uint64_t(n));
        got += std::uint64_t(n);
    }
    if (got != 100) fail("received %llu of 100 bytes", (unsigned long long)got);

    if (fcntl(*fd, F_SETFL, fl & ~O_NONBLOCK) != 0) fail("F_SETFL: %s", errno_name(errno));
    const std::uint64_t seed2 = seed_of(opt, 2);
    command_send(*fd, 100, seed2, 100, 100000);
    const std::uint64_t start = now_ns();
    recv_pattern(*fd, Rx::recv, seed2, 100, 100, "blocking read after clearing O_NONBLOCK");
    if (elapsed_s(start) < 0.05)
        fail("read returned after %.3f s although the data came after 0.1 s: still "
             "non-blocking?", elapsed_s(start));
    send_exit(*fd);
}

void drive_rcvtimeo(int *fd, const Options &opt) {
    timeval tv{0, 200000};
    if (setsockopt(*fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0)
        fail("setsockopt(SO_RCVTIMEO): %s", errno_name(errno));
    timeval back{};
    socklen_t len = sizeof back;
    if (getsockopt(*fd, SOL_SOCKET, SO_RCVTIMEO, &back, &len) != 0 || len != sizeof back)
        fail("getsockopt(SO_RCVTIMEO): %s", errno_name(errno));
    const long us = back.tv_sec * 1000000L + back.tv_usec;
    if (us < 190000 || us > 210000) fail("SO_RCVTIMEO reads back as %ld us, set 200000", us);
    char buf[64];
    const Rx apis[] = {Rx::recv, Rx::read, Rx::recvmsg};
    for (Rx api : apis) {
        const std::uint64_t start = now_ns();
        ssize_t n = rx_once(*fd, api, buf, sizeof buf, 0);
        const int err = errno;
        const double took = elapsed_s(start);
        expect_eagain(n, err, rx_name(api));
        if (took < 0.05 || took > 2.0)
            fail("%s with SO_RCVTIMEO 200 ms returned EAGAIN after %.3f s", rx_name(api), took);
        note("rcvtimeo %s EAGAIN after %.3f s", rx_name(api), took);
    }
    const std::uint64_t seed = seed_of(opt, 1);
    command_send(*fd, 100, seed, 100);
    recv_pattern(*fd, Rx::recv, seed, 100, 100, "data after a receive timeout");
    send_exit(*fd);
}

namespace {

std::atomic<int> signal_hits{0};
// When signal_later's thread sent its signal (now_ns()).
std::atomic<std::uint64_t> signal_sent_ns{0};

void on_signal(int) { signal_hits.fetch_add(1); }

void install(int flags) {
    struct sigaction sa{};
    sa.sa_handler = on_signal;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, nullptr) != 0) fail("sigaction: %s", errno_name(errno));
}

// Signals the calling thread after delay_us from a helper thread.
std::thread signal_later(std::uint64_t delay_us) {
    pthread_t target = pthread_self();
    return std::thread([target, delay_us] {
        sleep_us(delay_us);
        signal_sent_ns.store(now_ns());
        pthread_kill(target, SIGUSR1);
    });
}

}  // namespace

void drive_eintr(int *fd, const Options &opt) {
    char buf[100];
    install(0);
    const std::uint64_t seed = seed_of(opt, 1);
    command_send(*fd, 100, seed, 100, 400000);
    std::thread t = signal_later(100000);
    std::uint64_t start = now_ns();
    ssize_t n = recv(*fd, buf, sizeof buf, 0);
    int err = errno;
    const std::uint64_t end = now_ns();
    double took = elapsed_s(start);
    t.join();
    if (n != -1 || err != EINTR)
        fail("blocked recv hit by a signal without SA_RESTART returned %zd (%s) after %.3f s, "
             "expected -1 EINTR", n, n < 0 ? errno_name(err) : "data", took);
    if (signal_hits.load() != 1) fail("handler ran %d times, expected 1", signal_hits.load());
    // Timed from the signal itself: a stalled host may send it late, and
    // the recv must end promptly after it, however late it came.
    const double after_signal = double(end - signal_sent_ns.load()) / 1e9;
    if (after_signal > 0.25)
        fail("EINTR came %.3f s after the signal (%.3f s after the recv began)", after_signal, took);
    note("eintr after %.3f s, %.3f s after the signal", took, after_signal);
    recv_pattern(*fd, Rx::recv, seed, 100, 100, "data after EINTR");

    install(SA_RESTART);
    const std::uint64_t seed2 = seed_of(opt, 2);
    command_send(*fd, 100, seed2, 100, 400000);
    t = signal_later(100000);
    start = now_ns();
    n = recv(*fd, buf, sizeof buf, 0);
    err = errno;
    took = elapsed_s(start);
    t.join();
    if (n <= 0)
        fail("blocked recv hit by a signal with SA_RESTART returned %zd (%s), expected data",
             n, n < 0 ? errno_name(err) : "EOF");
    if (signal_hits.load() != 2) fail("handler ran %d times, expected 2", signal_hits.load());
    if (took < 0.25) fail("restarted recv returned after %.3f s, before the data was sent", took);
    pattern_expect(seed2, 0, buf, std::size_t(n), "data after a restarted recv");
    count_rx(*fd, std::uint64_t(n));
    std::uint64_t got = std::uint64_t(n);
    while (got < 100) {
        ssize_t m = recv(*fd, buf, 100 - got, 0);
        if (m <= 0) fail("rest of the data after a restarted recv: %zd", m);
        pattern_expect(seed2, got, buf, std::size_t(m), "data after a restarted recv");
        count_rx(*fd, std::uint64_t(m));
        got += std::uint64_t(m);
    }
    signal(SIGUSR1, SIG_DFL);
    send_exit(*fd);
}

}  // namespace peer
