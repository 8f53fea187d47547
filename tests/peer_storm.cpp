// Large blocking sends both ways at once while a 200 us interval timer
// (SIGALRM) hits both processes, with or without SA_RESTART. Large sends
// go by read zero-copy under the library: the peer copies straight from
// the sender's buffer while send() waits, and signals cut those waits
// (and the reader's) all the time. A send must never return while the
// peer may still read its buffer, and must count exactly the bytes the
// peer took: each buffer is scribbled on the moment send() returns and
// the next send starts at the offset send() reported, so a byte read
// late, or read but not counted, or counted but not read, is a wrong
// byte at the receiver.
#include "peer_storm.hpp"

#include "peer_drivers.hpp"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <sys/socket.h>
#include <sys/time.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace peer {
namespace {

std::atomic<std::uint64_t> ticks{0};
void on_tick(int) { ticks.fetch_add(1, std::memory_order_relaxed); }

void start_storm(bool restart, std::uint32_t us) {
    struct sigaction sa{};
    sa.sa_handler = on_tick;
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGALRM, &sa, nullptr) != 0) fail("sigaction: %s", errno_name(errno));
    const itimerval it{{0, suseconds_t(us)}, {0, suseconds_t(us)}};
    if (setitimer(ITIMER_REAL, &it, nullptr) != 0) fail("setitimer: %s", errno_name(errno));
}

// The timer replaced the watchdog's alarm (one ITIMER_REAL per process).
void stop_storm(unsigned watchdog_s) {
    const itimerval off{};
    setitimer(ITIMER_REAL, &off, nullptr);
    alarm(watchdog_s);
}

constexpr std::size_t kMinSend = 128 * 1024;
constexpr std::size_t kMaxSend = 1024 * 1024;

// Blocking sends of 128 KiB .. 1 MiB, each from a buffer filled for the
// offset the previous sends reached and overwritten once send() returns.
void storm_send(int fd, std::uint64_t seed, std::uint64_t size, std::uint64_t deadline,
                std::uint64_t *interrupted) {
    std::vector<char> buf(kMaxSend);
    std::uint64_t off = 0;
    for (std::uint64_t k = 0; off < size; ++k) {
        if (now_ns() > deadline)
            fail("storm: sent only %llu of %llu bytes in time", (unsigned long long)off,
                 (unsigned long long)size);
        std::size_t len = kMinSend + std::size_t(mix(seed ^ 0x5e4d, k) % (kMaxSend - kMinSend + 1));
        if (len > size - off) len = std::size_t(size - off);
        pattern_fill(seed, off, buf.data(), len);
        const ssize_t n = send(fd, buf.data(), len, MSG_NOSIGNAL);
        const int err = errno;
        std::memset(buf.data(), 0xA5, len);
        if (n < 0 && err == EINTR) {
            ++*interrupted;
            continue;
        }
        if (n <= 0)
            fail("storm: send of %zu bytes at offset %llu returned %zd (%s)", len,
                 (unsigned long long)off, n, n < 0 ? errno_name(err) : "nothing sent");
        if (std::size_t(n) > len)
            fail("storm: send of %zu bytes returned %zd", len, n);
        count_tx(fd, std::uint64_t(n));
        off += std::uint64_t(n);
    }
}

void storm_recv(int fd, std::uint64_t seed, std::uint64_t size, std::uint64_t deadline,
                std::uint64_t *interrupted) {
    std::vector<char> buf(kMaxSend);
    std::uint64_t off = 0;
    for (std::uint64_t k = 0; off < size; ++k) {
        if (now_ns() > deadline)
            fail("storm: received only %llu of %llu bytes in time", (unsigned long long)off,
                 (unsigned long long)size);
        std::size_t want = 1 + std::size_t(mix(seed ^ 0x7ec5, k) % kMaxSend);
        if (want > size - off) want = std::size_t(size - off);
        const ssize_t n = recv(fd, buf.data(), want, 0);
        const int err = errno;
        if (n < 0 && err == EINTR) {
            ++*interrupted;
            continue;
        }
        if (n <= 0)
            fail("storm: recv at offset %llu of %llu returned %zd (%s)", (unsigned long long)off,
                 (unsigned long long)size, n, n < 0 ? errno_name(err) : "EOF");
        if (std::size_t(n) > want) fail("storm: recv of %zu returned %zd", want, n);
        pattern_expect(seed, off, buf.data(), std::size_t(n), "storm: received bytes");
        count_rx(fd, std::uint64_t(n));
        off += std::uint64_t(n);
    }
}

// Both ends send --size bytes and receive the other's --size at once,
// the storm on (--restart 1: SA_RESTART) until both are done.
void storm_duplex(int fd, bool is_client, const Options &opt) {
    const std::uint64_t size = opt.num("size", 64u << 20);
    const auto us = std::uint32_t(opt.num("timer-us", 200));
    const bool restart = opt.num("restart", 0) != 0;
    const std::uint64_t deadline = now_ns() + opt.num("limit-s", 60) * 1'000'000'000ull;
    const std::uint64_t out_seed = seed_of(opt, is_client ? 81 : 82);
    const std::uint64_t in_seed = seed_of(opt, is_client ? 82 : 81);
    std::uint64_t send_eintr = 0, recv_eintr = 0;
    start_storm(restart, us);
    std::thread sender([&] { storm_send(fd, out_seed, size, deadline, &send_eintr); });
    storm_recv(fd, in_seed, size, deadline, &recv_eintr);
    sender.join();
    stop_storm(unsigned(opt.num("watchdog", 120)));
    std::printf("storm ticks=%llu send_eintr=%llu recv_eintr=%llu\n",
                (unsigned long long)ticks.load(), (unsigned long long)send_eintr,
                (unsigned long long)recv_eintr);
}

}  // namespace

bool is_storm_scenario(const std::string &scenario) { return scenario == "storm-duplex"; }

void serve_storm(int fd, bool is_client, const Options &opt) {
    storm_duplex(fd, is_client, opt);
}

}  // namespace peer
