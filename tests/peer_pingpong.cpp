#include "peer_pingpong.hpp"

#include "peer_common.hpp"

#include <cerrno>
#include <cstring>
#include <sys/socket.h>
#include <unistd.h>

namespace peer {

namespace {

// Deliberately plain calls on a stack array (see the header).
// noinline: with the length opaque the compiler cannot prove the call
// safe, so FORTIFY keeps the checking variant.
__attribute__((noinline)) void read_msg(int fd, std::uint64_t round, std::size_t len,
                                        std::uint64_t seed, std::uint64_t offset) {
    char msg[kPingMax];
    char part[kPingMax];  // always read at offset 0 of a known-size array
    std::size_t got = 0;
    int interrupted = 0;
    while (got < len) {
        ssize_t n;
        switch (round % 3) {
        case 0: n = read(fd, part, len - got); break;
        case 1: n = recv(fd, part, len - got, 0); break;
        default: n = recvfrom(fd, part, len - got, 0, nullptr, nullptr); break;
        }
        if (n < 0 && errno == EINTR && ++interrupted < 1000) continue;
        if (n <= 0)
            fail("ping-pong round %llu: receive returned %zd (%s) after %zu of %zu bytes",
                 (unsigned long long)round, n, n < 0 ? errno_name(errno) : "EOF", got, len);
        std::memcpy(msg + got, part, std::size_t(n));
        got += std::size_t(n);
    }
    count_rx(fd, len);
    pattern_expect(seed, offset, msg, len, "ping-pong");
}

__attribute__((noinline)) void write_msg(int fd, std::uint64_t round, std::size_t len, std::uint64_t seed,
               std::uint64_t offset) {
    char buf[kPingMax];
    pattern_fill(seed, offset, buf, len);
    std::size_t sent = 0;
    int interrupted = 0;
    while (sent < len) {
        ssize_t n = round % 2 ? send(fd, buf + sent, len - sent, MSG_NOSIGNAL)
                              : write(fd, buf + sent, len - sent);
        if (n < 0 && errno == EINTR && ++interrupted < 1000) continue;
        if (n <= 0)
            fail("ping-pong round %llu: send returned %zd (%s)", (unsigned long long)round,
                 n, n < 0 ? errno_name(errno) : "0");
        sent += std::size_t(n);
    }
    count_tx(fd, len);
}

}  // namespace

void pingpong(int fd, bool driver, std::uint64_t seed, std::uint64_t rounds,
              std::uint32_t max_msg) {
    if (max_msg == 0 || max_msg > kPingMax) max_msg = kPingMax;
    std::uint64_t off = 0;
    for (std::uint64_t k = 0; k < rounds; ++k) {
        std::size_t len = std::size_t(1 + mix(seed, k) % max_msg);
        if (driver) {
            write_msg(fd, k, len, seed, off);
            read_msg(fd, k, len, seed + 1, off);
        } else {
            read_msg(fd, k, len, seed, off);
            write_msg(fd, k, len, seed + 1, off);
        }
        off += len;
    }
}

}  // namespace peer
