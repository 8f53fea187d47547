// `peer upgrade --scenario NAME`: the upgrade handshake under what real
// programs do to it. The process forks its own client (fresh sockets, not
// inherited ones), so both ends run whatever the process runs; each
// connection is reported from both ends, and the harness checks that the
// two ends agree on the mode: an upgrade is all or nothing.
//   stopped   the client is stopped (SIGSTOP, 2 s) right after connect,
//             while the server asks it to upgrade; ping, then pong
//   signals   a 200 us interval timer (SA_RESTART handler) in both
//             processes; 30 connections, 4 KiB echoed on each
//   fdlast    the server has no fd left when its second connection upgrades
//   fdlimit   RLIMIT_NOFILE 64 in the client; 50 connections open at once,
//             1000 bytes echoed on each
#include "peer_common.hpp"
#include "peer_drivers.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace peer {
namespace {

void on_tick(int) {}

int accept_retry(int l) {
    for (int i = 0; i < 100000; ++i) {
        int fd = accept(l, nullptr, nullptr);
        if (fd >= 0) return fd;
        if (errno != EINTR && errno != ECONNABORTED) fail("accept: %s", errno_name(errno));
    }
    fail("accept: interrupted too often");
}

// A 200 us interval timer whose handler restarts calls, as most programs
// install theirs: any call the kernel would restart must not fail.
void signal_storm() {
    struct sigaction sa{};
    sa.sa_handler = on_tick;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, nullptr);
    itimerval it{{0, 200}, {0, 200}};
    setitimer(ITIMER_REAL, &it, nullptr);
}

void stop_storm() {
    itimerval off{};
    setitimer(ITIMER_REAL, &off, nullptr);
}

void echo(int fd, std::uint64_t seed, std::size_t len, const char *what) {
    std::vector<char> out(len), in(len);
    pattern_fill(seed, 0, out.data(), len);
    write_all(fd, out.data(), len);
    read_all(fd, in.data(), len, what);
    pattern_expect(seed, 0, in.data(), len, what);
}

// Serves `conns` connections in turn (or all at once, `together`): each
// echoes `len` bytes back, then waits for EOF.
void serve_echo(int l, std::size_t conns, std::size_t len, bool together) {
    std::vector<int> fds;
    for (std::size_t i = 0; i < conns; ++i) {
        int fd = accept_retry(l);
        report_conn(fd, "server");
        if (together) {
            fds.push_back(fd);
            continue;
        }
        fds.assign(1, fd);
        std::vector<char> buf(len);
        read_all(fd, buf.data(), len, "echo request");
        write_all(fd, buf.data(), len);
        expect_eof(fd, "echo end");
        close(fd);
    }
    if (!together) return;
    for (int fd : fds) {
        std::vector<char> buf(len);
        read_all(fd, buf.data(), len, "echo request");
        write_all(fd, buf.data(), len);
    }
    for (int fd : fds) {
        expect_eof(fd, "echo end");
        close(fd);
    }
}

int wait_child(pid_t pid) {
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail("client process ended with status %#x", st);
    return 0;
}

int run_stopped(const Options &opt) {
    std::uint16_t port = 0;
    const int family = family_of(opt);
    int l = listen_loopback(family, 4, &port);
    int ready[2];
    if (pipe(ready) != 0) fail("pipe: %s", errno_name(errno));
    const pid_t parent = getpid();
    pid_t child = fork();
    if (child < 0) fail("fork: %s", errno_name(errno));
    if (child == 0) {
        // The parent stops us: should it die before it continues us (a
        // failed check, its watchdog), we must not stay stopped for ever.
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);
        close(ready[0]);
        int fd = connect_loopback(family, port);
        report_conn(fd, "client");
        if (write(ready[1], "c", 1) != 1) fail("pipe write: %s", errno_name(errno));
        char ping[4];
        read_all(fd, ping, 4, "ping");
        if (std::memcmp(ping, "ping", 4) != 0) fail("client: got something else than ping");
        write_all(fd, "pong", 4);
        expect_eof(fd, "after pong");
        close(fd);
        exit(0);  // through the library's exit handlers: its statistics
    }
    close(ready[1]);
    char c;
    ssize_t n;
    while ((n = read(ready[0], &c, 1)) < 0 && errno == EINTR) {
    }
    if (n != 1) fail("client did not connect");
    // Stopped the way a busy host or a debugger stops it: its control
    // thread too, in the middle of our upgrade request.
    kill(child, SIGSTOP);
    // The client is stopped once every thread of it is: the one that takes
    // the signal may be in an uninterruptible sleep (a page read, an fd
    // table growing), and until it leaves it the others run on, its
    // control thread included, which would answer our request in time.
    int st = 0;
    while (waitpid(child, &st, WUNTRACED) < 0 && errno == EINTR) {
    }
    if (!WIFSTOPPED(st)) fail("client did not stop (status %#x)", st);
    int fd = accept_retry(l);
    report_conn(fd, "server");
    const std::uint64_t t0 = now_ns();
    write_all(fd, "ping", 4);
    while (now_ns() - t0 < 2000000000ull) sleep_us(10000);
    kill(child, SIGCONT);
    char pong[4];
    read_all(fd, pong, 4, "pong");
    if (std::memcmp(pong, "pong", 4) != 0) fail("server: got something else than pong");
    note("pong after the client was stopped");
    close(fd);
    close(l);
    return wait_child(child);
}

// Listens, forks a client that runs `client(family, port)` and ends
// through the library's exit handlers (its statistics), serves with
// `server(listener)`, and waits for the client.
template <class Client, class Server>
int client_and_server(const Options &opt, int backlog, Client client, Server server) {
    std::uint16_t port = 0;
    const int family = family_of(opt);
    int l = listen_loopback(family, backlog, &port);
    pid_t child = fork();
    if (child < 0) fail("fork: %s", errno_name(errno));
    if (child == 0) {
        close(l);
        client(family, port);
        exit(0);
    }
    server(l);
    close(l);
    return wait_child(child);
}

int run_signals(const Options &opt) {
    const std::size_t conns = opt.num("conns", 30);
    const std::size_t len = opt.num("size", 4096);
    return client_and_server(
        opt, 64,
        [&](int family, std::uint16_t port) {
            signal_storm();
            for (std::size_t i = 0; i < conns; ++i) {
                int fd = connect_loopback(family, port);
                report_conn(fd, "client");
                echo(fd, 500 + i, len, "echo under signals");
                close(fd);
            }
            stop_storm();
        },
        [&](int l) {
            signal_storm();
            serve_echo(l, conns, len, false);
            stop_storm();
            note("%zu echoes under an interval timer", conns);
        });
}

int run_fdlimit(const Options &opt) {
    const std::size_t conns = opt.num("conns", 50);
    const std::size_t len = opt.num("size", 1000);
    return client_and_server(
        opt, 128,
        [&](int family, std::uint16_t port) {
            rlimit lim{64, 64};
            if (setrlimit(RLIMIT_NOFILE, &lim) != 0) fail("setrlimit: %s", errno_name(errno));
            std::vector<int> fds;
            for (std::size_t i = 0; i < conns; ++i) {
                int fd = connect_loopback(family, port);
                report_conn(fd, "client");
                fds.push_back(fd);
            }
            for (std::size_t i = 0; i < conns; ++i) echo(fds[i], 700 + i, len, "echo at the fd limit");
            for (int fd : fds) close(fd);
        },
        [&](int l) {
            serve_echo(l, conns, len, true);
            note("%zu echoes at the fd limit", conns);
        });
}

// The server has no free fd when its second connection starts upgrading
// (the first one, direct, built its engine and attached the peer, so the
// answer to a request would pass no fd: one free fd would be enough): the
// upgrade's control socket finds none. Both ends stay on TCP; the echo on
// it is exact.
int run_fdlast(const Options &opt) {
    const std::size_t len = opt.num("size", 1000);
    return client_and_server(
        opt, 4,
        [&](int family, std::uint16_t port) {
            int a = connect_loopback(family, port);
            report_conn(a, "client");
            echo(a, 800, len, "echo on the first connection");
            int b = connect_loopback(family, port);
            report_conn(b, "client");
            echo(b, 801, len, "echo with no fd left");
            close(b);
            close(a);
        },
        [&](int l) {
            int a = accept_retry(l);
            report_conn(a, "server");
            std::vector<char> buf(len);
            read_all(a, buf.data(), len, "echo request");
            write_all(a, buf.data(), len);
            int b = accept_retry(l);
            report_conn(b, "server");
            // The client's connect has published its end by then, so this
            // side's first I/O starts the upgrade (a request of the client's
            // would find our control thread without an fd instead).
            sleep_us(300000);
            // Every fd but one taken, up to a lowered limit.
            rlimit old{};
            getrlimit(RLIMIT_NOFILE, &old);
            rlimit lim{256, old.rlim_max};
            if (setrlimit(RLIMIT_NOFILE, &lim) != 0) fail("setrlimit: %s", errno_name(errno));
            std::vector<int> filler;
            for (int i = 0; i < 300; ++i) {
                int f = dup(l);
                if (f < 0) break;
                filler.push_back(f);
            }
            if (filler.empty() || filler.size() >= 300) fail("could not reach the fd limit");
            read_all(b, buf.data(), len, "echo request with no fd left");
            write_all(b, buf.data(), len);
            for (int f : filler) close(f);
            setrlimit(RLIMIT_NOFILE, &old);
            expect_eof(b, "echo end");
            close(b);
            expect_eof(a, "echo end");
            close(a);
            note("echoes with no fd left");
        });
}

}  // namespace

int run_upgrade(const Options &opt) {
    const std::string scenario = opt.get("scenario");
    std::fflush(stdout);  // a forked child must not print our buffer again
    if (scenario == "stopped") return run_stopped(opt);
    if (scenario == "signals") return run_signals(opt);
    if (scenario == "fdlimit") return run_fdlimit(opt);
    if (scenario == "fdlast") return run_fdlast(opt);
    fail("unknown upgrade scenario '%s'", scenario.c_str());
}

}  // namespace peer
