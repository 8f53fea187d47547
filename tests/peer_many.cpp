// Scenario "many": every connection carries one request and one answer of
// its own size and pattern, all at once, over nonblocking sockets driven
// by one poll() loop (or, with --wait epoll, one level-triggered epoll set
// whose registrations follow what each connection waits for). The client
// names each connection in a 16-byte header (magic, index, size) because
// the server accepts them in any order.
#include "peer_common.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>
#include <vector>

namespace peer {

namespace {

inline constexpr std::uint32_t kManyMagic = 0x53444d48;  // "SDMH"

struct Header {
    std::uint32_t magic;
    std::uint32_t index;
    std::uint64_t size;
};
static_assert(sizeof(Header) == 16);

struct Flow {
    int fd = -1;
    Header hdr{};
    std::size_t hdr_done = 0;  // bytes of the header sent (client) or received (server)
    std::uint64_t tx_off = 0;
    std::uint64_t rx_off = 0;
    bool eof = false;
    std::uint64_t up_seed = 0;    // client -> server
    std::uint64_t down_seed = 0;  // server -> client
};

void derive(Flow &f, std::uint64_t base) {
    f.up_seed = mix(base ^ 0x11, f.hdr.index);
    f.down_seed = mix(base ^ 0x22, f.hdr.index);
}

bool header_known(const Flow &f) { return f.hdr_done == sizeof(Header); }

// The events a connection waits for now.
short wanted(const Flow &f, bool client) {
    short ev = POLLIN;
    if ((client && f.hdr_done < sizeof(Header)) || (header_known(f) && f.tx_off < f.hdr.size))
        ev |= POLLOUT;
    return ev;
}

bool finished(const Flow &f, bool client) {
    if (!header_known(f) || f.tx_off < f.hdr.size || f.rx_off < f.hdr.size) return false;
    return client || f.eof;
}

// Returns false when the socket would block.
bool do_send(Flow &f, bool client, std::uint8_t *buf, std::size_t cap) {
    if (client && f.hdr_done < sizeof(Header)) {
        const auto *h = reinterpret_cast<const std::uint8_t *>(&f.hdr);
        ssize_t n = send(f.fd, h + f.hdr_done, sizeof(Header) - f.hdr_done, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) return false;
            fail("conn %u: send header: %s", f.hdr.index, errno_name(errno));
        }
        f.hdr_done += std::size_t(n);
        count_tx(f.fd, std::uint64_t(n));
        return true;
    }
    if (!header_known(f) || f.tx_off >= f.hdr.size) return false;
    std::uint64_t left = f.hdr.size - f.tx_off;
    std::size_t len = std::size_t(left < cap ? left : cap);
    const std::uint64_t seed = client ? f.up_seed : f.down_seed;
    pattern_fill(seed, f.tx_off, buf, len);
    ssize_t n = send(f.fd, buf, len, MSG_NOSIGNAL);
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return false;
        fail("conn %u: send at %llu: %s", f.hdr.index, (unsigned long long)f.tx_off,
             errno_name(errno));
    }
    f.tx_off += std::uint64_t(n);
    count_tx(f.fd, std::uint64_t(n));
    return true;
}

bool do_recv(Flow &f, bool client, std::uint64_t base, std::uint8_t *buf, std::size_t cap) {
    if (!client && f.hdr_done < sizeof(Header)) {
        auto *h = reinterpret_cast<std::uint8_t *>(&f.hdr);
        ssize_t n = recv(f.fd, h + f.hdr_done, sizeof(Header) - f.hdr_done, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return false;
        if (n <= 0) fail("connection header: %zd (%s)", n, n < 0 ? errno_name(errno) : "EOF");
        f.hdr_done += std::size_t(n);
        count_rx(f.fd, std::uint64_t(n));
        if (header_known(f)) {
            if (f.hdr.magic != kManyMagic || f.hdr.size > (1ull << 28))
                fail("bad connection header: magic 0x%08x size %llu", unsigned(f.hdr.magic),
                     (unsigned long long)f.hdr.size);
            derive(f, base);
        }
        return true;
    }
    if (!header_known(f)) return false;
    if (f.rx_off >= f.hdr.size) {
        // Everything arrived; the server waits for the client's close.
        ssize_t n = recv(f.fd, buf, 1, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return false;
        if (n != 0) fail("conn %u: %zd bytes beyond the end of the stream (%s)", f.hdr.index,
                         n, n < 0 ? errno_name(errno) : "data");
        f.eof = true;
        return false;
    }
    std::uint64_t left = f.hdr.size - f.rx_off;
    std::size_t len = std::size_t(left < cap ? left : cap);
    ssize_t n = recv(f.fd, buf, len, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return false;
    if (n <= 0)
        fail("conn %u: recv at %llu of %llu: %zd (%s)", f.hdr.index,
             (unsigned long long)f.rx_off, (unsigned long long)f.hdr.size, n,
             n < 0 ? errno_name(errno) : "EOF");
    pattern_expect(client ? f.down_seed : f.up_seed, f.rx_off, buf, std::size_t(n),
                   client ? "answer" : "request");
    f.rx_off += std::uint64_t(n);
    count_rx(f.fd, std::uint64_t(n));
    return true;
}

}  // namespace

void many_exchange(int *fds, std::size_t n, bool client, const Options &opt) {
    const std::uint64_t base = opt.num("seed", 1);
    const std::uint64_t first = opt.num("first-index", 0);
    const std::uint64_t max_size = opt.num("max-size", 65536);
    // --hold-ms: a client keeps its finished connections open this long
    // (so the clients of a fleet overlap however slowly they start).
    const std::uint64_t hold_ms = client ? opt.num("hold-ms", 0) : 0;
    std::vector<int> held;
    std::vector<Flow> flows(n);
    for (std::size_t i = 0; i < n; ++i) {
        Flow &f = flows[i];
        f.fd = fds[i];
        if (fcntl(f.fd, F_SETFL, fcntl(f.fd, F_GETFL) | O_NONBLOCK) != 0)
            fail("O_NONBLOCK: %s", errno_name(errno));
        if (client) {
            f.hdr.magic = kManyMagic;
            f.hdr.index = std::uint32_t(first + i);
            f.hdr.size = 1 + mix(base, f.hdr.index) % max_size;
            f.hdr_done = 0;
            derive(f, base);
        }
    }
    std::vector<std::uint8_t> buf(65536);
    std::size_t open = n;
    // One connection's turn with the events `got`; its registration in
    // the epoll set `ep` (if any) follows what it waits for next.
    auto serve = [&](Flow &f, short got, int ep, short &registered) {
        if (f.fd >= 0 && (got & (POLLIN | POLLHUP | POLLERR)))
            for (int j = 0; j < 64 && do_recv(f, client, base, buf.data(), buf.size()); ++j) {
            }
        if (f.fd >= 0 && (got & (POLLOUT | POLLERR)))
            for (int j = 0; j < 64 && do_send(f, client, buf.data(), buf.size()); ++j) {
            }
        if (finished(f, client)) {
            report_bytes(f.fd);
            if (hold_ms) {
                if (ep >= 0 && epoll_ctl(ep, EPOLL_CTL_DEL, f.fd, nullptr) != 0)
                    fail("epoll_ctl DEL: %s", errno_name(errno));
                held.push_back(f.fd);
            } else {
                close(f.fd);
            }
            f.fd = -1;
            --open;
        } else if (ep >= 0 && wanted(f, client) != registered) {
            registered = wanted(f, client);
            epoll_event ev{std::uint32_t(registered), {}};
            ev.data.u64 = std::uint64_t(&f - flows.data());
            if (epoll_ctl(ep, EPOLL_CTL_MOD, f.fd, &ev) != 0)
                fail("epoll_ctl MOD: %s", errno_name(errno));
        }
    };
    const std::uint64_t deadline = now_ns() + opt.num("deadline-s", 60) * 1000000000ull;
    auto on_time = [&] {
        if (now_ns() > deadline)
            fail("many: %zu of %zu connections unfinished at the deadline", open, n);
    };
    if (opt.get("wait") == "epoll") {
        const int ep = epoll_create1(EPOLL_CLOEXEC);
        if (ep < 0) fail("epoll_create1: %s", errno_name(errno));
        std::vector<short> registered(n);
        for (std::size_t i = 0; i < n; ++i) {
            registered[i] = wanted(flows[i], client);
            epoll_event ev{std::uint32_t(registered[i]), {}};
            ev.data.u64 = i;
            if (epoll_ctl(ep, EPOLL_CTL_ADD, flows[i].fd, &ev) != 0)
                fail("epoll_ctl ADD: %s", errno_name(errno));
        }
        epoll_event out[64];
        for (int iter = 0; open > 0 && iter < 10000000; ++iter) {
            on_time();
            const int r = epoll_wait(ep, out, 64, 1000);
            if (r < 0 && errno != EINTR) fail("epoll_wait: %s", errno_name(errno));
            for (int k = 0; k < r; ++k) {
                const std::size_t i = std::size_t(out[k].data.u64);
                if (i >= n || flows[i].fd < 0)
                    fail("epoll_wait: event %#x for connection %zu, not one waited on",
                         out[k].events, i);
                serve(flows[i], short(out[k].events), ep, registered[i]);
            }
        }
        close(ep);
    } else {
        std::vector<pollfd> pfds;
        std::vector<std::size_t> which;
        short none = 0;
        for (int iter = 0; open > 0 && iter < 10000000; ++iter) {
            on_time();
            pfds.clear();
            which.clear();
            for (std::size_t i = 0; i < n; ++i) {
                if (flows[i].fd < 0) continue;
                pfds.push_back(pollfd{flows[i].fd, wanted(flows[i], client), 0});
                which.push_back(i);
            }
            int r = poll(pfds.data(), pfds.size(), 1000);
            if (r < 0 && errno != EINTR) fail("poll: %s", errno_name(errno));
            for (std::size_t k = 0; r > 0 && k < pfds.size(); ++k) {
                if (pfds[k].revents & POLLNVAL) fail("poll: POLLNVAL on fd %d", pfds[k].fd);
                serve(flows[which[k]], pfds[k].revents, -1, none);
            }
        }
    }
    if (open) fail("many: %zu connections unfinished", open);
    if (hold_ms) usleep(useconds_t(hold_ms * 1000));
    for (int fd : held) close(fd);
    note("many done %zu connections", n);
}

}  // namespace peer
