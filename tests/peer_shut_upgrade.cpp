// A connection shut down before it upgrades. The connecting end sends a
// request and shuts its socket down (--part wr: SHUT_WR, --part rdwr:
// SHUT_RDWR) at once, without the hello and settle of other scenarios;
// the accepting end touches its socket only once that FIN is there, so a
// preloaded pair attaches, and upgrades, after the shutdown. The accepting
// end reads the request and EOF, answers (on the fabric when the pair went
// direct) and closes. The connecting end then reads the answer and checks
// what TCP gives after its own shutdown: both directions shut is POLLHUP,
// a send fails with EPIPE. (With SHUT_RDWR nothing is answered, and the
// connecting end checks once the peer's FIN is in.)
#include "peer_shut_upgrade.hpp"

#include "peer_drivers.hpp"
#include "peer_ready.hpp"

#include <cerrno>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>

namespace peer {
namespace {

constexpr std::uint64_t kRequest = 3000;
constexpr std::uint64_t kAnswer = 100000;

// Waits for the peer's FIN with the raw system call, which no preloaded
// library sees: the socket stays untouched (not attached) until then.
void await_fin_untouched(int fd) {
    for (int i = 0; i < 1000; ++i) {
        pollfd p{fd, POLLRDHUP, 0};
        const timespec tick{0, 10000000};
        const long r = syscall(SYS_ppoll, &p, 1, &tick, nullptr, 0);
        if (r < 0 && errno != EINTR) fail("ppoll (raw): %s", errno_name(errno));
        if (r == 1 && (p.revents & POLLRDHUP)) return;
    }
    fail("the connecting end's FIN did not come within 10 s");
}

bool rdwr_part(const Options &opt) {
    const std::string part = opt.get("part", "wr");
    if (part != "wr" && part != "rdwr") fail("shut-then-upgrade: unknown --part '%s'", part.c_str());
    return part == "rdwr";
}

void serve_accepting(int *sock, const Options &opt) {
    const int fd = *sock;
    await_fin_untouched(fd);
    std::vector<char> buf(kRequest);
    read_all(fd, buf.data(), buf.size(), "request sent before the peer's shutdown");
    pattern_expect(seed_of(opt, 1), 0, buf.data(), buf.size(), "request");
    expect_eof(fd, "after the request");
    // Not to a socket shut for reading: TCP answers such bytes with a reset.
    if (!rdwr_part(opt)) send_pattern(fd, Tx::send, seed_of(opt, 2), kAnswer, 65536, 0);
    report_bytes(fd);
    close(fd);
    *sock = -1;
    // Alive while the other end checks: a peer process that is gone adds
    // to what the survivor's poll reports.
    sleep_us(1000000);
}

// Waits until the kernel socket took in the peer's FIN (TCP_CLOSE after
// both FINs): the peer upgraded and closed by then.
void await_closed_state(int fd) {
    for (int i = 0; i < 10000; ++i) {
        tcp_info ti{};
        socklen_t len = sizeof ti;
        if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
            fail("getsockopt(TCP_INFO): %s", errno_name(errno));
        if (ti.tcpi_state == TCP_CLOSE) return;
        sleep_us(1000);
    }
    fail("the peer's FIN did not come within 10 s");
}

void expect_hangup(int fd, const char *what) {
    const short full = POLLIN | POLLOUT | POLLRDHUP | POLLHUP;
    pollfd p{fd, short(POLLIN | POLLOUT | POLLRDHUP), 0};
    const int r = poll(&p, 1, 0);
    if (r != 1 || p.revents != full)
        fail("poll %s: returned %d (%s) with %s, expected 1 with %s", what, r,
             r < 0 ? errno_name(errno) : "-", events_text(p.revents).c_str(),
             events_text(full).c_str());
}

void expect_epipe(int fd, const char *what) {
    const ssize_t n = send(fd, "x", 1, MSG_NOSIGNAL);
    if (n != -1 || errno != EPIPE)
        fail("send %s: %zd (%s), expected -1 EPIPE", what, n, n < 0 ? errno_name(errno) : "sent");
}

void serve_connecting(int fd, const Options &opt) {
    const bool rdwr = rdwr_part(opt);
    send_pattern(fd, Tx::send, seed_of(opt, 1), kRequest, 65536, 0);
    if (shutdown(fd, rdwr ? SHUT_RDWR : SHUT_WR) != 0) fail("shutdown: %s", errno_name(errno));
    if (rdwr) {
        await_closed_state(fd);
        expect_hangup(fd, "after our own shutdown(SHUT_RDWR)");
    } else {
        std::vector<char> buf(kAnswer);
        read_all(fd, buf.data(), buf.size(), "answer after our shutdown");
        pattern_expect(seed_of(opt, 2), 0, buf.data(), buf.size(), "answer after our shutdown");
        expect_eof(fd, "after the answer (the peer closed)");
        expect_hangup(fd, "after our shutdown(SHUT_WR) and the peer's close");
    }
    expect_epipe(fd, "after our shutdown");
    expect_eof(fd, "after the failed send");
    expect_hangup(fd, "after the failed send");
}

}  // namespace

bool is_shut_upgrade_scenario(const std::string &scenario) {
    return scenario == "shut-then-upgrade";
}

void serve_shut_upgrade(int *fd, bool is_client, const Options &opt) {
    if (is_client) serve_connecting(*fd, opt);
    else serve_accepting(fd, opt);
}

}  // namespace peer
