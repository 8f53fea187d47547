// Threads: a receive blocked while another thread sends on the same
// socket, waits woken by another thread's shutdown or not woken by its
// close, and wake-ups that must never be lost over many rounds.
#include "peer_ready.hpp"
#include "peer_pingpong.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

namespace peer {

namespace {

// Waits (bounded) until `counter` reaches `value`.
void await_count(const std::atomic<std::uint64_t> &counter, std::uint64_t value,
                 const char *what) {
    const std::uint64_t start = now_ns();
    for (std::uint64_t i = 0; counter.load() < value; ++i) {
        if (seconds_since(start) > 10) fail("%s: stuck at %llu of %llu for 10 s", what,
                                            (unsigned long long)counter.load(),
                                            (unsigned long long)value);
        if (i > 100) sleep_us(50);
    }
}

}  // namespace

// The reader thread sits in recv for every answer; the main thread sends
// each request only once the previous answer is in.
void drive_thread_recv(int *fd, const Options &opt) {
    const int s = *fd;
    const std::uint64_t rounds = opt.num("rounds", 150);
    const std::uint64_t big = opt.num("size", 1u << 20);
    auto size_of = [&](std::uint64_t k) { return k == rounds ? big : 1 + mix(17, k) % 8192; };
    auto seed_at = [&](std::uint64_t k) { return seed_of(opt, 2 * k + 1); };
    std::atomic<std::uint64_t> done{0};
    std::thread reader([&] {
        for (std::uint64_t k = 0; k <= rounds; ++k) {
            recv_pattern(s, Rx::recv, seed_at(k) + 1, size_of(k), 65536,
                         "answer received by the reading thread");
            done = k + 1;
        }
    });
    for (std::uint64_t k = 0; k <= rounds; ++k) {
        await_count(done, k, "reading thread");
        // Give the reader time to block in recv.
        sleep_us(50 + 50 * (k % 4));
        Cmd cmd;
        cmd.op = Op::echo;
        cmd.size = size_of(k);
        cmd.seed = seed_at(k);
        cmd.seed2 = seed_at(k) + 1;
        cmd.chunk = 65536;
        // Command and payload in one send: two small sends would wait for
        // a delayed ACK (Nagle) and make every round 40 ms.
        std::vector<char> msg(sizeof cmd + cmd.size);
        std::memcpy(msg.data(), &cmd, sizeof cmd);
        pattern_fill(cmd.seed, 0, msg.data() + sizeof cmd, cmd.size);
        write_all(s, msg.data(), msg.size());
    }
    await_count(done, rounds + 1, "reading thread");
    reader.join();
    send_exit(s);
}

// Under the library's default policy (connections earn their upgrade):
// a thread blocks in recv from the start, while the main thread's paced
// sends earn the upgrade. The answer comes only after a pause long enough
// for an upgrade and both engines' builds; the reader must get it and
// every byte after it, and the connection still goes direct once the
// reader is back (a paced ping-pong after it).
void drive_earn_blocked_reader(int *fd, const Options &opt) {
    const int s = *fd;
    const std::uint64_t answer = opt.num("size", 1u << 20);
    const std::uint64_t answer_seed = seed_of(opt, 91);
    std::atomic<std::uint64_t> done{0};
    std::thread reader([&] {
        recv_pattern(s, Rx::recv, answer_seed, answer, 65536,
                     "answer read by the thread blocked since before the upgrade was earned");
        done = 1;
    });
    sleep_us(20000);  // the reader blocks first
    Cmd in;
    in.op = Op::recv;
    in.api = std::uint32_t(Rx::recv);
    in.flags = kNoAck;  // an ack would go to the reader
    in.size = opt.num("earn-bytes", 100000);
    in.seed = seed_of(opt, 90);
    in.chunk = 1024;
    send_cmd(s, in);
    send_pattern(s, Tx::send, in.seed, in.size, in.chunk, 500);
    sleep_us(opt.num("pause-us", 4000000));
    if (done.load()) fail("the reader returned before any answer was sent");
    Cmd out;
    out.op = Op::send;
    out.api = std::uint32_t(Tx::send);
    out.size = answer;
    out.seed = answer_seed;
    out.chunk = 16384;
    send_cmd(s, out);
    await_count(done, 1, "reading thread");
    reader.join();
    paced_pingpongs(s, opt, opt.num("after-ms", 1500), 100);
    send_exit(s);
}

// Part shutdown: another thread's shutdown(SHUT_RDWR) wakes the wait of
// --apis; part close: another thread's close does not wake epoll_wait.
void drive_thread_wake(int *fd, const Options &opt) {
    const std::string part = part_of_conn(opt);
    if (part != "shutdown" && part != "close") fail("thread-wake: unknown --part '%s'", part.c_str());
    if (part == "close") {
        int ep = epoll_create1(EPOLL_CLOEXEC);
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLRDHUP;
        ev.data.u64 = 1;
        if (epoll_ctl(ep, EPOLL_CTL_ADD, *fd, &ev) != 0) fail("epoll_ctl: %s", errno_name(errno));
        int rc = -2;
        double took = 0;
        std::thread waiter([&] {
            Watch watch(5, "epoll_wait while another thread closes");
            const std::uint64_t start = now_ns();
            epoll_event out[2];
            rc = epoll_wait(ep, out, 2, 300);
            took = seconds_since(start);
        });
        sleep_us(100000);
        report_bytes(*fd);
        if (close(*fd) != 0) fail("close: %s", errno_name(errno));
        *fd = -1;
        waiter.join();
        if (rc != 0 || took < 0.25)
            fail("epoll_wait while another thread closed the only registered socket: returned "
                 "%d after %.3f s, expected 0 at the 0.3 s timeout", rc, took);
        epoll_event out[2];
        rc = epoll_wait(ep, out, 2, 0);
        if (rc != 0) fail("epoll_wait after the close: %d, expected 0", rc);
        close(ep);
        return;
    }
    const Api api = api_of_conn(opt);
    Waiter w(api, {{*fd, POLLIN | POLLRDHUP}});
    Waited got;
    std::atomic<std::uint64_t> woke_at{0};
    std::thread waiter([&] {
        Watch watch(5, "wait while another thread shuts the socket down");
        got = w.wait(-1);
        woke_at = now_ns();
    });
    sleep_us(100000);
    const std::uint64_t at = now_ns();
    if (shutdown(*fd, SHUT_RDWR) != 0) fail("shutdown(SHUT_RDWR): %s", errno_name(errno));
    waiter.join();
    // Signed: a wait that ended before the shutdown was not woken by it.
    const double after = double(std::int64_t(woke_at.load() - at)) / 1e9;
    const short full = POLLIN | POLLOUT | POLLRDHUP | POLLHUP;
    if (got.rc != w.expected_rc({full}) || got.revents[0] != w.project(0, full))
        fail("%s blocked while another thread called shutdown(SHUT_RDWR): returned %d (%s) "
             "with %s, expected %s", api_name(api), got.rc, got.rc < 0 ? errno_name(got.err) : "-",
             events_text(got.revents[0]).c_str(), events_text(w.project(0, full)).c_str());
    if (after < 0 || after > 2.5)
        fail("%s woke %.3f s after it started, %.3f s after the shutdown", api_name(api), got.took,
             after);
    char c;
    ssize_t n = recv(*fd, &c, 1, 0);
    if (n != 0) fail("recv after own shutdown(SHUT_RDWR): %zd (%s), expected 0", n,
                     n < 0 ? errno_name(errno) : n == 0 ? "EOF" : "data");
    n = send(*fd, "x", 1, MSG_NOSIGNAL);
    if (n != -1 || errno != EPIPE)
        fail("send after own shutdown(SHUT_RDWR): %zd (%s), expected -1 EPIPE", n,
             n < 0 ? errno_name(errno) : "sent");
}

// Ping-pong where every answer is waited for with the call --apis and
// --conn-index pick, with a 5 s bound: a lost wake-up fails the round.
void drive_wakeup_loop(int *fd, const Options &opt) {
    const int s = *fd;
    const Api api = api_of_conn(opt);
    const std::uint64_t rounds = opt.num("rounds", 1000);
    const std::uint64_t seed = seed_of(opt, 1);
    const auto max = std::uint32_t(opt.num("max-msg", 64));
    // --slow-ms: waits that took longer count as slow (a wake-up that came
    // by the library's 200 ms safety net, not by the answer); more than
    // --slow-max of them fail the run.
    const std::uint64_t slow_ms = opt.num("slow-ms", 0);
    const std::uint64_t slow_max = opt.num("slow-max", 3);
    std::uint64_t slow = 0;
    double slowest = 0;
    Cmd cmd;
    cmd.op = Op::pingpong;
    cmd.size = rounds;
    cmd.seed = seed;
    cmd.chunk = max;
    send_cmd(s, cmd);
    Waiter w(api, {{s, POLLIN}});
    std::uint64_t off = 0;
    char out[kPingMax], in[kPingMax];
    for (std::uint64_t k = 0; k < rounds; ++k) {
        const std::size_t len = std::size_t(1 + mix(seed, k) % max);
        pattern_fill(seed, off, out, len);
        write_all(s, out, len);
        std::size_t got = 0;
        for (int tries = 0; got < len; ++tries) {
            if (tries > 1000) fail("round %llu: too many waits", (unsigned long long)k);
            Waited r = w.wait(5000);
            if (r.rc < 0 && r.err == EINTR) continue;
            if (r.rc != 1 || r.revents[0] != POLLIN)
                fail("%s round %llu: returned %d (%s) with %s after %.3f s: lost wake-up?",
                     api_name(api), (unsigned long long)k, r.rc,
                     r.rc < 0 ? errno_name(r.err) : "-", events_text(r.revents[0]).c_str(), r.took);
            if (r.took > slowest) slowest = r.took;
            if (slow_ms && r.took * 1000 > double(slow_ms) && ++slow > slow_max)
                fail("%s round %llu: %llu waits over %llu ms (the slowest %.3f s): wake-ups left "
                     "to the safety net?", api_name(api), (unsigned long long)k,
                     (unsigned long long)slow, (unsigned long long)slow_ms, slowest);
            ssize_t n = recv(s, in + got, len - got, MSG_DONTWAIT);
            if (n <= 0)
                fail("%s round %llu: readable, but recv returned %zd (%s)", api_name(api),
                     (unsigned long long)k, n, n < 0 ? errno_name(errno) : "EOF");
            count_rx(s, std::uint64_t(n));
            got += std::size_t(n);
        }
        pattern_expect(seed + 1, off, in, len, "wake-up loop");
        off += len;
    }
    send_exit(s);
}

// One thread sends each request, another waits (--apis, --conn-index) for
// each answer: the waiter is always blocked when the answer arrives.
void drive_thread_wake_loop(int *fd, const Options &opt) {
    const int s = *fd;
    const Api api = api_of_conn(opt);
    const std::uint64_t rounds = opt.num("rounds", 1000);
    const std::uint64_t seed = seed_of(opt, 1);
    const auto max = std::uint32_t(opt.num("max-msg", 64));
    Cmd cmd;
    cmd.op = Op::pingpong;
    cmd.size = rounds;
    cmd.seed = seed;
    cmd.chunk = max;
    send_cmd(s, cmd);
    std::atomic<std::uint64_t> answered{0};
    auto len_of = [&](std::uint64_t k) { return std::size_t(1 + mix(seed, k) % max); };
    std::thread waiter([&] {
        Waiter w(api, {{s, POLLIN}});
        std::uint64_t off = 0;
        char in[kPingMax];
        for (std::uint64_t k = 0; k < rounds; ++k) {
            const std::size_t len = len_of(k);
            std::size_t got = 0;
            for (int tries = 0; got < len; ++tries) {
                if (tries > 1000) fail("round %llu: too many waits", (unsigned long long)k);
                Waited r = w.wait(5000);
                if (r.rc < 0 && r.err == EINTR) continue;
                if (r.rc != 1 || r.revents[0] != POLLIN)
                    fail("%s in the waiting thread, round %llu: returned %d (%s) with %s after "
                         "%.3f s: lost wake-up?", api_name(api), (unsigned long long)k, r.rc,
                         r.rc < 0 ? errno_name(r.err) : "-", events_text(r.revents[0]).c_str(),
                         r.took);
                ssize_t n = recv(s, in + got, len - got, MSG_DONTWAIT);
                if (n <= 0)
                    fail("%s round %llu: readable, but recv returned %zd (%s)", api_name(api),
                         (unsigned long long)k, n, n < 0 ? errno_name(errno) : "EOF");
                count_rx(s, std::uint64_t(n));
                got += std::size_t(n);
            }
            pattern_expect(seed + 1, off, in, len, "cross-thread wake-up loop");
            off += len;
            answered = k + 1;
        }
    });
    std::uint64_t off = 0;
    char out[kPingMax];
    for (std::uint64_t k = 0; k < rounds; ++k) {
        await_count(answered, k, "waiting thread");
        const std::size_t len = len_of(k);
        pattern_fill(seed, off, out, len);
        write_all(s, out, len);
        off += len;
    }
    waiter.join();
    send_exit(s);
}

}  // namespace peer
