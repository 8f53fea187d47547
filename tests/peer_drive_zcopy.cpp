// Drivers for the zero-copy protocols: large sends from buffers that are
// freed, unmapped or remapped the moment send() returns, and a randomised
// mix of sizes, call families, flags and directions. Every byte is checked
// against the pattern; a library that read a buffer after send() returned,
// or reordered an advertisement, delivers a wrong byte here.
#include "peer_drivers.hpp"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <pthread.h>
#include <cstdlib>
#include <cstring>
#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace peer {
namespace {

// A small deterministic generator (the seed makes a run repeatable).
struct Rng {
    std::uint64_t state;
    std::uint64_t next() { return state = mix(state, 0x9e3779b97f4a7c15ull); }
    std::uint64_t below(std::uint64_t n) { return n ? next() % n : 0; }
    // Sizes spread over orders of magnitude, 1 .. max.
    std::uint64_t size(std::uint64_t max) {
        std::uint64_t bits = 1 + below(64 - __builtin_clzll(max));
        std::uint64_t top = bits >= 64 ? max : std::min<std::uint64_t>(max, (1ull << bits) - 1);
        return 1 + below(top);
    }
};

// Sends all `len` bytes of buf with the chosen family; with MSG_DONTWAIT
// it waits in poll for room, as a non-blocking sender does.
void send_all(int fd, Tx api, const char *buf, std::size_t len, bool dontwait) {
    for (std::size_t done = 0; done < len;) {
        ssize_t n = tx_once(fd, api, buf + done, len - done, dontwait ? MSG_DONTWAIT : 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && dontwait) {
            pollfd p{fd, POLLOUT, 0};
            if (poll(&p, 1, 10000) <= 0) fail("poll(POLLOUT) found no room in 10 s");
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            fail("%s of %zu bytes returned %zd (%s)", tx_name(api), len - done, n,
                 n < 0 ? errno_name(errno) : "0");
        count_tx(fd, std::uint64_t(n));
        done += std::size_t(n);
    }
}

void set_memlock_zero() {
    rlimit none{0, 0};
    if (setrlimit(RLIMIT_MEMLOCK, &none) != 0) fail("setrlimit(RLIMIT_MEMLOCK): %s", errno_name(errno));
}

}  // namespace

// Large blocking sends, each from a buffer that is gone or rewritten as
// soon as send() returns: malloc + free, mmap + munmap, a mapping replaced
// at the same address (MAP_FIXED, new pages, new contents: a stale
// registration keyed by address would read old bytes), and one buffer
// overwritten with garbage right after each send.
void drive_zc_buffers(int *fd, const Options &opt) {
    const int s = *fd;
    if (opt.num("memlock0", 0)) set_memlock_zero();
    const auto pieces = std::uint32_t(opt.num("pieces", 48));
    const std::uint64_t max = opt.num("max", 2u << 20);
    Rng rng{seed_of(opt, 40)};
    std::vector<std::uint64_t> sizes(pieces);
    std::uint64_t total = 0;
    for (auto &z : sizes) total += z = 65536 + rng.below(max - 65536);
    // Then, with --reuse N, N sends of one buffer that stays (256 KiB):
    // a registration cache finds it registered from the second on.
    const auto reuse = std::uint32_t(opt.num("reuse", 0));
    const std::size_t reuse_len = 256 * 1024;
    total += std::uint64_t(reuse) * reuse_len;
    Cmd cmd;
    cmd.op = Op::recv;
    cmd.api = std::uint32_t(Rx::recv);
    cmd.size = total;
    cmd.seed = seed_of(opt, 41);
    cmd.chunk = 1 << 20;
    send_cmd(s, cmd);

    const std::size_t span = std::size_t(max);
    void *fixed = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (fixed == MAP_FAILED) fail("mmap: %s", errno_name(errno));
    std::vector<char> reused(span);
    std::uint64_t off = 0;
    for (std::uint32_t i = 0; i < pieces; ++i) {
        const std::size_t len = std::size_t(sizes[i]);
        char *buf = nullptr;
        switch (i % 4) {
        case 0:
            buf = static_cast<char *>(std::malloc(len));
            if (!buf) fail("malloc(%zu) failed", len);
            break;
        case 1: {
            void *m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED) fail("mmap: %s", errno_name(errno));
            buf = static_cast<char *>(m);
            break;
        }
        case 2: {
            // New pages at the old address.
            if (munmap(fixed, span) != 0) fail("munmap: %s", errno_name(errno));
            void *m = mmap(fixed, span, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            if (m != fixed) fail("mmap(MAP_FIXED): %s", errno_name(errno));
            buf = static_cast<char *>(fixed);
            break;
        }
        default:
            buf = reused.data();
            break;
        }
        pattern_fill(cmd.seed, off, buf, len);
        send_all(s, Tx::send, buf, len, false);
        off += len;
        switch (i % 4) {
        case 0:
            std::memset(buf, 0xa5, len);
            std::free(buf);
            break;
        case 1:
            if (munmap(buf, len) != 0) fail("munmap: %s", errno_name(errno));
            break;
        case 2:
        default:
            std::memset(buf, 0x5a, len);
            break;
        }
    }
    munmap(fixed, span);
    std::vector<char> kept(reuse_len);
    for (std::uint32_t i = 0; i < reuse; ++i) {
        pattern_fill(cmd.seed, off, kept.data(), reuse_len);
        send_all(s, Tx::send, kept.data(), reuse_len, false);
        off += reuse_len;
    }
    expect_ack(s, "buffers: responder's ack");
    send_exit(s);
}

namespace {

// One receive of the torture mix: `want` bytes at stream offset `off`,
// by a randomly chosen way. Returns the bytes consumed.
std::size_t torture_recv(int fd, Rng &rng, std::uint64_t seed, std::uint64_t off,
                         std::size_t want, std::vector<char> &buf) {
    if (buf.size() < want) buf.resize(want);
    const std::uint64_t how = rng.below(6);
    ssize_t n = -1;
    for (int tries = 0; tries < 100000; ++tries) {
        switch (how) {
        case 0:  // plain
            n = recv(fd, buf.data(), want, 0);
            break;
        case 1: {  // peek, then the same bytes for real
            n = recv(fd, buf.data(), want, MSG_PEEK);
            if (n > 0) {
                pattern_expect(seed, off, buf.data(), std::size_t(n), "torture: peeked bytes");
                std::size_t peeked = std::size_t(n);
                n = recv(fd, buf.data(), peeked, MSG_WAITALL);
                if (n != ssize_t(peeked))
                    fail("torture: recv after a peek of %zu returned %zd (%s)", peeked, n,
                         n < 0 ? errno_name(errno) : "short");
            }
            break;
        }
        case 2:  // all of it
            n = recv(fd, buf.data(), want, MSG_WAITALL);
            if (n >= 0 && n != ssize_t(want))
                fail("torture: MSG_WAITALL of %zu returned %zd", want, n);
            break;
        case 3:  // many pieces
            n = rx_once(fd, Rx::readv_many, buf.data(), want, 0);
            break;
        case 4:  // non-blocking, poll for more
            n = recv(fd, buf.data(), want, MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                pollfd p{fd, POLLIN, 0};
                if (poll(&p, 1, 10000) <= 0) fail("torture: poll(POLLIN) saw nothing in 10 s");
                continue;
            }
            break;
        default:
            n = rx_once(fd, Rx::recvmsg, buf.data(), want, 0);
            break;
        }
        if (n < 0 && errno == EINTR) continue;
        break;
    }
    if (n <= 0)
        fail("torture: receive way %llu of %zu bytes returned %zd (%s) at offset %llu",
             (unsigned long long)how, want, n, n < 0 ? errno_name(errno) : "EOF",
             (unsigned long long)off);
    pattern_expect(seed, off, buf.data(), std::size_t(n), "torture: received bytes");
    count_rx(fd, std::uint64_t(n));
    return std::size_t(n);
}

}  // namespace

// Rounds of three kinds, each chosen at random: we send (random piece
// sizes and call families, blocking or not, every buffer freed or
// scribbled on right after), we receive (the responder sends with a
// random chunk, we read with random sizes and ways: peek, waitall, many
// pieces, non-blocking), or both at once (duplex, zero-copy both ways).
void drive_zc_torture(int *fd, const Options &opt) {
    const int s = *fd;
    const auto rounds = std::uint32_t(opt.num("rounds", 30));
    const std::uint64_t max = opt.num("max", 4u << 20);
    Rng rng{seed_of(opt, 50)};
    const std::uint32_t chunks[] = {4096, 65536, 300000, 1u << 20, 4u << 20};
    std::vector<char> rbuf;
    for (std::uint32_t r = 0; r < rounds; ++r) {
        const std::uint64_t kind = rng.below(3);
        const std::uint64_t size = rng.size(max);
        Cmd cmd;
        cmd.size = size;
        cmd.seed = seed_of(opt, 100 + r);
        cmd.chunk = chunks[rng.below(5)];
        if (kind == 0) {
            cmd.op = Op::recv;
            cmd.api = std::uint32_t(rng.below(std::uint64_t(Rx::count)));
            send_cmd(s, cmd);
            for (std::uint64_t off = 0; off < size;) {
                const std::size_t len = std::size_t(std::min(size - off, rng.size(2u << 20)));
                char *buf = static_cast<char *>(std::malloc(len));
                if (!buf) fail("malloc(%zu) failed", len);
                pattern_fill(cmd.seed, off, buf, len);
                const auto api = Tx(rng.below(std::uint64_t(Tx::count)));
                send_all(s, api, buf, len, rng.below(4) == 0);
                std::memset(buf, 0xee, len);  // too late to matter
                std::free(buf);
                off += len;
            }
            expect_ack(s, "torture send: responder's ack");
        } else if (kind == 1) {
            cmd.op = Op::send;
            cmd.api = std::uint32_t(rng.below(std::uint64_t(Tx::count)));
            send_cmd(s, cmd);
            for (std::uint64_t off = 0; off < size;)
                off += torture_recv(s, rng, cmd.seed, off,
                                    std::size_t(std::min(size - off, rng.size(2u << 20))), rbuf);
        } else {
            cmd.op = Op::duplex;
            cmd.size2 = rng.size(max);
            cmd.seed2 = seed_of(opt, 1000 + r);
            send_cmd(s, cmd);
            const auto api = Tx(rng.below(std::uint64_t(Tx::count)));
            std::thread sender([&] { send_pattern(s, api, cmd.seed, cmd.size, cmd.chunk, 0); });
            recv_pattern(s, Rx(rng.below(std::uint64_t(Rx::count))), cmd.seed2, cmd.size2,
                         std::uint32_t(std::min<std::uint64_t>(rng.size(2u << 20), 4u << 20)),
                         "torture duplex");
            sender.join();
            expect_ack(s, "torture duplex: responder's ack");
        }
    }
    send_exit(s);
}

namespace {

// Sends all `len` bytes with blocking sends that a timeout (EAGAIN) or a
// signal (EINTR) may cut short, going on where each stopped; at most
// 100000 calls.
void send_patiently(int fd, const char *buf, std::size_t len, const char *what) {
    std::size_t done = 0;
    for (int i = 0; done < len && i < 100000; ++i) {
        ssize_t m = send(fd, buf + done, len - done, 0);
        if (m < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        if (m <= 0)
            fail("%s: send of %zu bytes returned %zd (%s)", what, len - done, m,
                 m < 0 ? errno_name(errno) : "0");
        count_tx(fd, std::uint64_t(m));
        done += std::size_t(m);
    }
    if (done != len) fail("%s: %zu of %zu bytes in 100000 sends", what, done, len);
}

std::atomic<int> cut_signals{0};
void on_cut_signal(int) { cut_signals.fetch_add(1); }

// One large blocking send to a responder that does not read yet, cut short
// by SO_SNDTIMEO (`signal_us` 0) or by a signal without SA_RESTART after
// `signal_us`. It must end like a TCP send: soon after the timeout or the
// signal, with part of the bytes taken (the kernel's buffers, or read
// zero-copy's advertisement given up and the window filled) or, for a
// signal only, -1 EINTR with nothing taken. Then the rest goes, and with
// the responder reading, whole sends of 8 MiB go through. Every byte is
// checked by the responder.
void drive_zc_cut(int fd, const Options &opt, std::uint64_t signal_us) {
    const std::uint64_t seed = mix(opt.num("seed", 1), 0x5d7 + signal_us);
    constexpr std::size_t kBig = 32u << 20;
    constexpr std::size_t kWhole = 8u << 20;
    constexpr int kWholeSends = 4;
    std::vector<char> buf(kBig);
    pattern_fill(seed, 0, buf.data(), kBig);

    // The responder starts reading 1.5 s from now, in 64 KiB pieces.
    Cmd cmd;
    cmd.op = Op::recv;
    cmd.api = std::uint32_t(Rx::recv);
    cmd.size = kBig + std::uint64_t(kWhole) * kWholeSends;
    cmd.seed = seed;
    cmd.chunk = 65536;
    cmd.pre_delay_us = 1500000;
    cmd.flags = kSmallRcvbuf;
    send_cmd(fd, cmd);

    std::thread signaller;
    std::atomic<std::uint64_t> signalled_ns{0};
    if (signal_us) {
        struct sigaction sa{};
        sa.sa_handler = on_cut_signal;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGUSR1, &sa, nullptr) != 0) fail("sigaction: %s", errno_name(errno));
        pthread_t target = pthread_self();
        signaller = std::thread([&, target] {
            sleep_us(signal_us);
            signalled_ns.store(now_ns());
            pthread_kill(target, SIGUSR1);
        });
    } else {
        timeval tv{0, 200000};
        if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0)
            fail("setsockopt(SO_SNDTIMEO): %s", errno_name(errno));
    }
    const char *what = signal_us ? "a signal" : "SO_SNDTIMEO 200 ms";
    const std::uint64_t start = now_ns();
    ssize_t n = send(fd, buf.data(), kBig, 0);
    const int err = errno;
    const std::uint64_t end = now_ns();
    if (signaller.joinable()) signaller.join();
    const double took = double(end - start) / 1e9;
    const bool eintr = signal_us && n == -1 && err == EINTR;
    if (!eintr && (n <= 0 || std::size_t(n) >= kBig))
        fail("a 32 MiB send cut short by %s, to a peer that does not read, returned %zd (%s) "
             "after %.3f s; expected a part of it%s",
             what, n, n < 0 ? errno_name(err) : "bytes", took, signal_us ? " or EINTR" : "");
    const std::uint64_t cut_ns = signal_us ? signalled_ns.load() : start + 200000000ull;
    const double late = (double(end) - double(cut_ns)) / 1e9;
    if (late < -0.05 || late > 0.5)
        fail("a 32 MiB send cut short by %s returned %.3f s after it (%.3f s after it began)",
             what, late, took);
    if (signal_us && cut_signals.load() != 1)
        fail("the handler ran %d times, expected 1", cut_signals.load());
    note("send cut short by %s: %zd of %zu bytes, %.3f s after it", what, n, kBig, late);
    std::size_t done = 0;
    if (n > 0) {
        count_tx(fd, std::uint64_t(n));
        done = std::size_t(n);
    }

    // The rest: later sends go on where it stopped.
    send_patiently(fd, buf.data() + done, kBig - done, "the rest of the 32 MiB");

    // The responder reads now: whole sends.
    for (int i = 0; i < kWholeSends; ++i) {
        const std::uint64_t at = kBig + std::uint64_t(kWhole) * std::uint64_t(i);
        pattern_fill(seed, at, buf.data(), kWhole);
        send_patiently(fd, buf.data(), kWhole, "an 8 MiB send");
    }
    expect_ack(fd, "responder read every byte");
    if (signal_us) signal(SIGUSR1, SIG_DFL);
}

}  // namespace

void drive_zc_sndtimeo(int *fd, const Options &opt) {
    drive_zc_cut(*fd, opt, 0);
    send_exit(*fd);
}

void drive_zc_eintr(int *fd, const Options &opt) {
    drive_zc_cut(*fd, opt, 100000);
    send_exit(*fd);
}

namespace {

std::atomic<int> sink_signals{0};
void on_sink_signal(int) { sink_signals.fetch_add(1, std::memory_order_relaxed); }

}  // namespace

// Large receives (advertised recv buffers) that end in their SO_RCVTIMEO
// or in a signal without SA_RESTART while the responder's bytes are on
// their way: the responder sends each round after a random pause, with
// random gaps, and a helper thread signals us every few milliseconds
// while we receive. Every byte must arrive once, in order: a recv that
// returns EAGAIN or EINTR took nothing, one that returns data took
// exactly the next bytes. With --silent, one round's responder pauses
// longer than the library's bound on a cancel's answer (1 s).
void drive_zc_sink_cancel(int *fd, const Options &opt) {
    const int s = *fd;
    const auto rounds = std::uint32_t(opt.num("rounds", 24));
    const auto timeout_ms = std::uint32_t(opt.num("timeout-ms", 10));
    const bool silent = opt.num("silent", 0) != 0;
    Rng rng{seed_of(opt, 70)};
    struct sigaction sa{};
    sa.sa_handler = on_sink_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, nullptr) != 0) fail("sigaction: %s", errno_name(errno));
    timeval tv{0, suseconds_t(timeout_ms) * 1000};
    if (setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0)
        fail("setsockopt(SO_RCVTIMEO): %s", errno_name(errno));
    std::atomic<bool> receiving{false}, stop{false};
    const pthread_t self = pthread_self();
    std::thread signaller([&] {
        Rng r{seed_of(opt, 71)};
        while (!stop.load()) {
            sleep_us(8000 + r.below(32000));
            if (receiving.load()) pthread_kill(self, SIGUSR1);
        }
    });
    const std::uint32_t pauses_us[] = {0, 5000, 20000, 40000};
    const std::uint32_t gaps_us[] = {0, 0, 3000, 10000};
    std::uint64_t timeouts = 0, interrupts = 0, moved = 0;
    std::vector<char> buf;
    for (std::uint32_t r = 0; r < rounds; ++r) {
        Cmd cmd;
        cmd.op = Op::send;
        cmd.api = std::uint32_t(Tx::send);
        cmd.size = 65536 + rng.below(2u << 20);
        cmd.seed = seed_of(opt, 200 + r);
        cmd.chunk = std::uint32_t(16384 + rng.below(1u << 20));
        cmd.pre_delay_us = silent && r == rounds / 2 ? 1300000 : pauses_us[rng.below(4)];
        cmd.gap_us = gaps_us[rng.below(4)];
        send_cmd(s, cmd);
        receiving.store(true);
        for (std::uint64_t off = 0, calls = 0; off < cmd.size; ++calls) {
            if (calls > 100000) fail("sink-cancel: no progress after %llu calls", (unsigned long long)calls);
            const std::size_t want = std::size_t(65536 + rng.below(2u << 20));
            if (buf.size() < want) buf.resize(want);
            const std::uint64_t start = now_ns();
            ssize_t n = recv(s, buf.data(), want, rng.below(4) == 0 ? MSG_WAITALL : 0);
            const int err = errno;
            const double took = double(now_ns() - start) / 1e9;
            if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR)) {
                // The timeout plus, at worst, the wait for a silent
                // responder's answer, on a loaded host.
                if (took > double(timeout_ms) / 1000 + 3.0)
                    fail("recv returned %s after %.3f s (SO_RCVTIMEO %u ms)", errno_name(err),
                         took, timeout_ms);
                ++(err == EINTR ? interrupts : timeouts);
                continue;
            }
            if (n <= 0)
                fail("sink-cancel: recv of %zu at offset %llu returned %zd (%s)", want,
                     (unsigned long long)off, n, n < 0 ? errno_name(err) : "EOF");
            pattern_expect(cmd.seed, off, buf.data(), std::size_t(n), "sink-cancel: received bytes");
            count_rx(s, std::uint64_t(n));
            off += std::uint64_t(n);
            moved += std::uint64_t(n);
        }
        receiving.store(false);
    }
    stop.store(true);
    signaller.join();
    // Signals still on their way land here, with nothing blocked.
    sleep_us(20000);
    signal(SIGUSR1, SIG_IGN);
    note("sink-cancel: %llu bytes, %llu timeouts, %llu interrupted, %d signals",
         (unsigned long long)moved, (unsigned long long)timeouts, (unsigned long long)interrupts,
         sink_signals.load());
    if (!timeouts || !interrupts)
        fail("sink-cancel: the scenario saw %llu timeouts and %llu interrupted receives; it "
             "needs both", (unsigned long long)timeouts, (unsigned long long)interrupts);
    send_exit(s);
}

// The responder kills itself (SIGKILL) in the middle of a transfer:
// --way in: while it sends us large pieces (read zero-copy advertisements,
// or our advertised recv buffers, in flight); --way out: while it reads
// our large sends. The survivor gets a correct prefix of the stream, then
// EOF or ECONNRESET (in) or EPIPE/ECONNRESET (out), within a few seconds,
// and never touches memory that went away with the dead process.
void drive_zc_peer_dies(int *fd, const Options &opt) {
    const int s = *fd;
    const bool in = opt.get("way", "in") == "in";
    Rng rng{seed_of(opt, 60)};
    Cmd cmd;
    cmd.seed = seed_of(opt, 61);
    cmd.chunk = std::uint32_t(opt.num("chunk", 4u << 20));
    cmd.size = 1ull << 40;  // never finishes
    const std::uint64_t start = now_ns();
    const std::uint64_t limit_ns = 10'000'000'000ull;
    std::uint64_t moved = 0;
    if (in) {
        cmd.op = Op::send_die;
        cmd.api = std::uint32_t(Tx::send);
        cmd.size2 = 20000 + rng.below(60000);  // it dies 20 to 80 ms from now
        send_cmd(s, cmd);
        std::vector<char> buf;
        for (;;) {
            const std::size_t want = std::size_t(rng.size(4u << 20));
            if (buf.size() < want) buf.resize(want);
            ssize_t n = recv(s, buf.data(), want, rng.below(2) ? MSG_WAITALL : 0);
            if (n < 0 && errno == EINTR) continue;
            if (n == 0 || (n < 0 && errno == ECONNRESET)) {
                note("zc-peer-dies in: %llu bytes, then %s", (unsigned long long)moved,
                     n == 0 ? "EOF" : "ECONNRESET");
                break;
            }
            if (n < 0) fail("recv while the peer dies: %s", errno_name(errno));
            pattern_expect(cmd.seed, moved, buf.data(), std::size_t(n), "bytes of the dying peer");
            count_rx(s, std::uint64_t(n));
            moved += std::uint64_t(n);
            if (now_ns() - start > limit_ns) fail("no end of stream 10 s after the peer's death");
        }
    } else {
        cmd.op = Op::recv_die;
        cmd.size2 = 1 + rng.below(8u << 20);  // it reads this much, then dies
        send_cmd(s, cmd);
        std::vector<char> buf(std::size_t(cmd.chunk));
        for (;;) {
            pattern_fill(cmd.seed, moved, buf.data(), buf.size());
            ssize_t n = send(s, buf.data(), buf.size(), MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
                note("zc-peer-dies out: %llu bytes accepted, then %s", (unsigned long long)moved,
                     errno_name(errno));
                break;
            }
            if (n <= 0) fail("send while the peer dies returned %zd (%s)", n,
                             n < 0 ? errno_name(errno) : "0");
            std::memset(buf.data(), 0x77, buf.size());
            count_tx(s, std::uint64_t(n));
            moved += std::uint64_t(n);
            if (now_ns() - start > limit_ns) fail("sends still accepted 10 s after the peer's death");
        }
        if (moved < cmd.size2) fail("only %llu bytes accepted before EPIPE; the peer read %llu",
                                    (unsigned long long)moved, (unsigned long long)cmd.size2);
    }
}

}  // namespace peer
