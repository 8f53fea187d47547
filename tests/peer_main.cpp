// Behaviour-suite peer. Usage:
//   peer server PORTFILE --scenario NAME [--conns N] [--driver client|server] [opts]
//   peer client PORT     --scenario NAME [--conns N] [--driver client|server] [opts]
//   peer local           --scenario NAME [opts]       both ends in one process
//   peer prefork PORTFILE --workers W --conns N [opts] listener shared by workers
//   peer idle --ready FILE [--expect-ignored 1]      no TCP at all
//   peer upgrade --scenario stopped|signals|fdlimit  the upgrade disturbed
//   peer fd-helper --unix FD --seed N                takes a connection passed on FD
//   peer exec-handler --fd FD                        answers commands on FD (--exec-self)
//   peer stdio-echo                                  echoes stdin to stdout through stdio
//                                                    (--exec-stdio)
//   peer exec-idle --fd FD --ms N                    holds FD N ms, unused (--fork-exec-idle-ms)
//   peer spawn-child --fd FD --local ADDR [--size N --seed S] [--say TEXT]
//                                                    a child of spawn-child (peer_spawn.cpp)
// Common options: --family 4|6, --settle-ms N, --seed N, --watchdog S, and
// the scenario's own (--size, --tx, --rx, --chunk, --rounds, --max-msg,
// --apis, --part ...). Connection i of a run sees --conn-index i.
// Connections: --parallel 1 serves every connection at once, one thread
// each; --accept nonblock (server) and --connect nonblock (client) make
// them through non-blocking accept and connect (peer_ready_nonblock.cpp).
// Exit: 0 all checks exact, 1 a check failed, 77 cannot run here.
#include "peer_common.hpp"
#include "peer_drivers.hpp"
#include "peer_ready.hpp"
#include "peer_sendpath.hpp"
#include "peer_shut_upgrade.hpp"
#include "peer_storm.hpp"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <sys/prctl.h>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <string>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

extern char **environ;

namespace peer {

namespace {

struct Entry {
    const char *name;
    Driver fn;
};

constexpr Entry drivers[] = {
    {"bulk", drive_bulk},
    {"duplex", drive_duplex},
    {"exchange", drive_exchange},
    {"zc-buffers", drive_zc_buffers},
    {"zc-torture", drive_zc_torture},
    {"zc-peer-dies", drive_zc_peer_dies},
    {"zc-sndtimeo", drive_zc_sndtimeo},
    {"zc-eintr", drive_zc_eintr},
    {"zc-sink-cancel", drive_zc_sink_cancel},
    {"pingpong", drive_pingpong},
    {"peek", drive_peek},
    {"waitall", drive_waitall},
    {"dontwait", drive_dontwait},
    {"send-dontwait", drive_send_dontwait},
    {"fionread", drive_fionread},
    {"nonblock", drive_nonblock},
    {"rcvtimeo", drive_rcvtimeo},
    {"eintr", drive_eintr},
    {"shutdown-wr", drive_shutdown_wr},
    {"peer-shutdown-wr", drive_peer_shutdown_wr},
    {"close-epipe", drive_close_epipe},
    {"close-sigpipe", drive_close_sigpipe},
    {"peer-death", drive_peer_death},
    {"killed-unread", drive_killed_unread},
    {"echo-plain", drive_echo_plain},
    {"exit-while-sending", drive_exit_while_sending},
    {"dup", drive_dup},
    {"sockinfo", drive_sockinfo},
    {"fork", drive_fork},
    {"fork-loop", drive_fork_loop},
    {"fork-share-write", drive_fork_share_write},
    {"fork-share-read", drive_fork_share_read},
    {"fork-peer-busy", drive_fork_peer_busy},
    {"fork-inflight", drive_fork_inflight},
    {"fork-sharer-killed", drive_fork_sharer_killed},
    {"fork-owner-killed", drive_fork_owner_killed},
    {"fork-handoff-both", drive_fork_handoff_both},
    {"fork-then-earn", drive_fork_then_earn},
    {"fork-stdio", drive_fork_stdio},
    {"fork-after-answer", drive_fork_after_answer},
    {"fork-idle-parent", drive_fork_idle_parent},
    {"fork-idle-parent-claims", drive_fork_idle_parent_claims},
    {"spawn-cat", drive_spawn_cat},
    {"spawn-child", drive_spawn_child},
    {"bad-input", drive_bad_input},
    {"ready-data", drive_ready_data},
    {"ready-window", drive_ready_window},
    {"ready-rdhup", drive_ready_rdhup},
    {"ready-reset", drive_ready_reset},
    {"ready-death", drive_ready_death},
    {"ready-eintr", drive_ready_eintr},
    {"ready-sigmask", drive_ready_sigmask},
    {"ready-mixed", drive_ready_mixed},
    {"ready-reused-fd", drive_ready_reused_fd},
    {"epoll-modes", drive_epoll_modes},
    {"epoll-errors", drive_epoll_errors},
    {"epoll-nested", drive_epoll_nested},
    {"epoll-thread-ctl", drive_epoll_thread_ctl},
    {"epoll-close", drive_epoll_close},
    {"epoll-earn-sleep", drive_epoll_earn_sleep},
    {"epoll-add-direct", drive_epoll_add_direct},
    {"alone-waits", drive_alone_waits},
    {"nonblock-io", drive_nonblock_io},
    {"thread-recv", drive_thread_recv},
    {"earn-blocked-reader", drive_earn_blocked_reader},
    {"thread-wake", drive_thread_wake},
    {"wakeup-loop", drive_wakeup_loop},
    {"thread-wake-loop", drive_thread_wake_loop},
    {"sendfile", drive_sendfile},
    {"splice", drive_splice},
    {"bypass", drive_bypass},
    {"sem-zero-read", drive_sem_zero_read},
    {"sem-trunc", drive_sem_trunc},
    {"sem-errqueue", drive_sem_errqueue},
    {"sem-rcvlowat", drive_sem_rcvlowat},
    {"sem-shut-rd", drive_sem_shut_rd},
    {"sem-linger-reset", drive_sem_linger_reset},
    {"sem-send-after-close", drive_sem_send_after_close},
    {"sem-close-in-recv", drive_sem_close_in_recv},
    {"sem-shut-rdwr-reset", drive_sem_shut_rdwr_reset},
    {"sem-tcp-info-fin", drive_sem_tcp_info_fin},
    {"sem-send-to-shut-end", drive_sem_send_to_shut_end},
    {"sem-disconnect", drive_sem_disconnect},
    {"sem-send-after-shut-close", drive_sem_send_after_shut_close},
    {"sem-cork", drive_sem_cork},
    {"sem-urgent", drive_sem_urgent},
};

Options parse(int argc, char **argv, int first) {
    Options opt;
    for (int i = first; i < argc; i += 2) {
        if (std::strncmp(argv[i], "--", 2) != 0 || i + 1 >= argc)
            fail("bad argument '%s' (options are --key value)", argv[i]);
        opt.kv[argv[i] + 2] = argv[i + 1];
    }
    return opt;
}

// The end that drives runs the scenario, the other one responds.
// --exec-self library|plain (server): after the settle, the socket goes
// to a new image of this program started by execve in this process (as
// sshd's re-exec or an inetd-style handler), with this environment
// (`library`) or without LD_PRELOAD (`plain`); that image (mode
// exec-handler) answers the client's commands.
[[noreturn]] void exec_self(int fd, const std::string &how) {
    const int fl = fcntl(fd, F_GETFD);
    if (fl < 0 || fcntl(fd, F_SETFD, fl & ~FD_CLOEXEC) != 0) fail("fcntl: %s", errno_name(errno));
    std::vector<char *> env;
    for (char **e = environ; *e; ++e)
        if (how != "plain" || std::strncmp(*e, "LD_PRELOAD=", 11) != 0) env.push_back(*e);
    env.push_back(nullptr);
    std::string fd_text = std::to_string(fd);
    char name[] = "behaviour-peer", mode[] = "exec-handler", opt_fd[] = "--fd";
    char *argv[] = {name, mode, opt_fd, fd_text.data(), nullptr};
    std::fflush(stdout);
    execve("/proc/self/exe", argv, env.data());
    fail("execve: %s", errno_name(errno));
}

// --exec-stdio 1 (server): the accepted socket, before any I/O, becomes
// stdin and stdout of a new image of this program started by execve with
// this environment (as inetd or git daemon start a handler), which echoes
// through stdio (mode stdio-echo).
[[noreturn]] void exec_stdio(int fd) {
    std::fflush(stdout);
    if (dup2(fd, 0) != 0 || dup2(fd, 1) != 1) fail("dup2: %s", errno_name(errno));
    if (fd > 1) close(fd);
    char name[] = "behaviour-peer", mode[] = "stdio-echo";
    char *argv[] = {name, mode, nullptr};
    execve("/proc/self/exe", argv, environ);
    fail("execve: %s", errno_name(errno));
}

// What arrives on stdin goes back on stdout, through glibc's stdio only:
// getc, fread of what the stream's buffer holds, fwrite, fflush. Nothing
// else may write stdout here: it is the connection.
int run_stdio_echo() {
    std::vector<char> buf(65536);
    for (int c; (c = std::getc(stdin)) != EOF;) {
        buf[0] = char(c);
        const auto held = std::size_t(stdin->_IO_read_end - stdin->_IO_read_ptr);
        const std::size_t n =
            1 + std::fread(buf.data() + 1, 1, std::min(held, buf.size() - 1), stdin);
        if (std::fwrite(buf.data(), 1, n, stdout) != n || std::fflush(stdout) != 0)
            fail("stdio-echo: fwrite: %s", errno_name(errno));
    }
    if (std::ferror(stdin)) fail("stdio-echo: getc: %s", errno_name(errno));
    return 0;
}

int run_exec_handler(const Options &opt) {
    int fd = int(opt.num("fd", 1000000));
    respond(&fd);
    close(fd);
    return 0;
}

// --fork-exec-idle-ms N (server): after the settle (direct), a forked
// child execs this program with the library (mode exec-idle), which holds
// the socket N ms without using it and exits, as git clone's index-pack
// holds git clone's socket; the server answers meanwhile and reaps the
// child at the end.
pid_t fork_exec_idle(int fd, std::uint64_t ms) {
    std::fflush(stdout);
    const pid_t kid = fork();
    if (kid < 0) fail("fork: %s", errno_name(errno));
    if (kid > 0) return kid;
    const int fl = fcntl(fd, F_GETFD);
    if (fl < 0 || fcntl(fd, F_SETFD, fl & ~FD_CLOEXEC) != 0) fail("fcntl: %s", errno_name(errno));
    std::string fd_text = std::to_string(fd), ms_text = std::to_string(ms);
    char name[] = "behaviour-peer", mode[] = "exec-idle", opt_fd[] = "--fd", opt_ms[] = "--ms";
    char *argv[] = {name, mode, opt_fd, fd_text.data(), opt_ms, ms_text.data(), nullptr};
    execve("/proc/self/exe", argv, environ);
    fail("execve: %s", errno_name(errno));
}

// --fork-exec-handler 1 (server): after the settle (direct), a forked
// child execs this program with the library in mode exec-handler, which
// answers the client on the socket it inherited (its first use asks this
// process, the owner, to leave the fabric).
pid_t fork_exec_handler(int fd) {
    std::fflush(stdout);
    const pid_t kid = fork();
    if (kid < 0) fail("fork: %s", errno_name(errno));
    if (kid == 0) exec_self(fd, "library");
    return kid;
}

int run_exec_idle(const Options &opt) {
    sleep_us(opt.num("ms", 1000) * 1000);
    return 0;
}

void serve_connection(int *fd, bool is_client, const Options &opt) {
    pid_t idle_child = -1;
    const std::string scenario = opt.get("scenario", "bulk");
    const bool client_drives = opt.get("driver", "client") == "client";
    // Shut down before any upgrade: the settle would start one first.
    // --earn-ms: a paced exchange that long, in which a connection under
    // the library's default policy earns its upgrade and goes direct.
    // echo-plain's peer is cat, which knows no hello.
    const auto earn_ms = std::uint32_t(opt.num("earn-ms", 0));
    if (is_shut_upgrade_scenario(scenario)) {
        serve_shut_upgrade(fd, is_client, opt);
    } else {
        if (is_client) {
            if (scenario != "echo-plain")
                settle_client(*fd, std::max(earn_ms, std::uint32_t(opt.num("settle-ms", 0))), earn_ms > 0);
        } else {
            settle_server(*fd);
            if (const std::string how = opt.get("exec-self"); !how.empty()) exec_self(*fd, how);
            if (const auto ms = opt.num("fork-exec-idle-ms", 0)) idle_child = fork_exec_idle(*fd, ms);
            if (opt.num("fork-exec-handler", 0)) {
                // A forking server: the child execs the handler on the
                // socket, the server closes its copy at once and waits.
                const pid_t kid = fork_exec_handler(*fd);
                close(*fd);
                *fd = -1;
                reap(kid, "the exec'd handler");
                return;
            }
        }
        if (is_sendpath_scenario(scenario)) serve_sendpath(fd, is_client, opt);
        else if (is_storm_scenario(scenario)) serve_storm(*fd, is_client, opt);
        else if (is_client == client_drives) drive(scenario, fd, opt);
        else respond(fd);
    }
    // The child let go first: the close below ends a connection that only
    // this process held.
    if (idle_child > 0) reap(idle_child, "the exec'd child holding the socket");
    if (*fd >= 0) {
        report_bytes(*fd);
        close(*fd);
        *fd = -1;
    }
}

void raise_nofile(std::uint64_t needed) {
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur >= needed) return;
    if (rl.rlim_max < needed)
        skip("RLIMIT_NOFILE hard limit %llu < %llu", (unsigned long long)rl.rlim_max,
             (unsigned long long)needed);
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) skip("cannot raise RLIMIT_NOFILE");
}

int accept_one(int listener) {
    for (int i = 0; i < 1000; ++i) {
        int fd = accept(listener, nullptr, nullptr);
        if (fd >= 0) return fd;
        if (errno != EINTR && errno != ECONNABORTED) fail("accept: %s", errno_name(errno));
    }
    fail("accept: interrupted too often");
}

// Connection i of a run sees --conn-index i (scenarios that end their
// connection use it to pick what to test).
Options for_conn(const Options &opt, std::size_t i) {
    Options o = opt;
    o.kv["conn-index"] = std::to_string(i);
    return o;
}

// --exec-cat: the accepted socket goes, unused, to /bin/cat started without
// the library (its stdin and stdout), as an inetd-style server hands it
// to the program it runs; this process closes its copy and waits.
int serve_by_cat(int fd) {
    const char *cat = "/bin/cat";
    if (access(cat, X_OK) != 0) skip("%s is not installed", cat);
    const pid_t pid = spawn_plain_cat(cat, fd);
    close(fd);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("cat ended with status 0x%x", unsigned(status));
    return 0;
}

int run_server(const std::string &port_file, const Options &opt) {
    std::vector<pid_t> served;  // --fork-serve
    const auto conns = std::size_t(opt.num("conns", 1));
    const bool many = opt.get("scenario") == "many";
    const bool nonblocking = opt.get("accept") == "nonblock";
    const bool parallel = opt.num("parallel", 0) != 0;
    if (many) raise_nofile(conns + 64);
    std::uint16_t port = 0;
    int l = listen_loopback(family_of(opt), int(conns + 16 < 128 ? 128 : conns + 16), &port);
    if (nonblocking) listener_nonblocking_prelude(l);
    write_port_file(port_file, port);
    if (many) {
        std::vector<int> fds;
        for (std::size_t i = 0; i < conns; ++i) {
            fds.push_back(accept_one(l));
            report_conn(fds.back(), "server");
        }
        // Every connection is open at once; give upgrades time before traffic.
        sleep_us(opt.num("settle-ms", 0) * 1000);
        many_exchange(fds.data(), fds.size(), false, opt);
    } else if (parallel) {
        // Every connection served at once, one thread each.
        std::vector<std::thread> threads;
        std::vector<int> fds(conns, -1);
        for (std::size_t i = 0; i < conns; ++i) {
            fds[i] = accept_one(l);
            report_conn(fds[i], "server");
            threads.emplace_back([&fds, &opt, i] {
                serve_connection(&fds[i], false, for_conn(opt, i));
            });
        }
        for (std::thread &t : threads) t.join();
    } else {
        for (std::size_t i = 0; i < conns; ++i) {
            int fd = nonblocking ? accept_nonblocking(l, i) : accept_one(l);
            report_conn(fd, "server");
            if (opt.num("exec-stdio", 0)) exec_stdio(fd);
            if (opt.num("exec-cat", 0)) {
                serve_by_cat(fd);
                continue;
            }
            // --fork-hold-ms N: a child holds the socket, unused, for N ms
            // from before the first I/O (a helper forked at accept time).
            if (const auto ms = opt.num("fork-hold-ms", 0)) {
                std::fflush(stdout);
                const pid_t kid = fork();
                if (kid < 0) fail("fork: %s", errno_name(errno));
                if (kid == 0) {
                    sleep_us(ms * 1000);
                    _exit(0);
                }
            }
            // --fork-serve 1: a forking server, a child per connection that
            // serves it and exits; this process closes its copy at once
            // and reaps the children at the end.
            if (opt.num("fork-serve", 0)) {
                std::fflush(stdout);
                const pid_t kid = fork();
                if (kid < 0) fail("fork: %s", errno_name(errno));
                if (kid == 0) {
                    close(l);
                    serve_connection(&fd, false, for_conn(opt, i));
                    std::fflush(stdout);
                    _exit(0);
                }
                close(fd);
                served.push_back(kid);
                continue;
            }
            // --setuid-first: privileges dropped before the connection's
            // first I/O (as a server that accepts as root, then serves as
            // nobody); it is served as usual after.
            if (opt.num("setuid-first", 0)) {
                if (getuid() != 0) skip("dropping privileges needs root");
                if (setgid(65534) != 0 || setuid(65534) != 0)
                    fail("setuid(65534): %s", errno_name(errno));
            }
            serve_connection(&fd, false, for_conn(opt, i));
        }
    }
    for (pid_t kid : served) reap(kid, "a connection's child");
    close(l);
    return 0;
}

int run_client(const std::string &port_text, const Options &opt) {
    const auto port = std::uint16_t(std::strtoul(port_text.c_str(), nullptr, 10));
    if (port == 0) fail("bad port '%s'", port_text.c_str());
    if (opt.get("scenario") == "many") {
        const auto conns = std::size_t(opt.num("conns", 1));
        raise_nofile(conns + 64);
        std::vector<int> fds;
        for (std::size_t i = 0; i < conns; ++i) {
            fds.push_back(connect_loopback(family_of(opt), port));
            report_conn(fds.back(), "client");
        }
        many_exchange(fds.data(), fds.size(), true, opt);
        return 0;
    }
    const auto conns = std::size_t(opt.num("conns", 1));
    if (opt.num("parallel", 0) != 0) {
        std::vector<std::thread> threads;
        std::vector<int> fds(conns, -1);
        for (std::size_t i = 0; i < conns; ++i) {
            fds[i] = connect_loopback(family_of(opt), port);
            report_conn(fds[i], "client");
            threads.emplace_back([&fds, &opt, i] {
                serve_connection(&fds[i], true, for_conn(opt, i));
            });
        }
        for (std::thread &t : threads) t.join();
        return 0;
    }
    const bool nonblocking = opt.get("connect") == "nonblock";
    if (nonblocking) refused_connects(family_of(opt));
    // --gap-ms: a pause before each connection after the first (two
    // clients of one server then take turns).
    const std::uint64_t gap_ms = opt.num("gap-ms", 0);
    for (std::size_t i = 0; i < conns; ++i) {
        if (i && gap_ms) sleep_us(gap_ms * 1000);
        int fd = nonblocking ? connect_nonblocking(family_of(opt), port, i)
                             : connect_loopback(family_of(opt), port);
        report_conn(fd, "client");
        serve_connection(&fd, true, for_conn(opt, i));
    }
    return 0;
}

int run_local(const Options &opt) {
    std::uint16_t port = 0;
    int l = listen_loopback(family_of(opt), 16, &port);
    std::thread server([&] {
        int fd = accept_one(l);
        report_conn(fd, "server");
        serve_connection(&fd, false, opt);
    });
    int fd = connect_loopback(family_of(opt), port);
    report_conn(fd, "client");
    serve_connection(&fd, true, opt);
    server.join();
    close(l);
    return 0;
}

int run_prefork(const std::string &port_file, const Options &opt) {
    const auto workers = int(opt.num("workers", 3));
    const auto conns = std::size_t(opt.num("conns", 9));
    std::uint16_t port = 0;
    int l = listen_loopback(family_of(opt), 128, &port);
    // One token per connection: a worker takes one before each accept, so
    // the workers together accept exactly `conns` connections.
    int tokens[2];
    if (pipe(tokens) != 0) fail("pipe: %s", errno_name(errno));
    std::string all(conns, 't');
    if (write(tokens[1], all.data(), all.size()) != ssize_t(all.size())) fail("token pipe");
    std::fflush(stdout);
    std::vector<pid_t> kids;
    for (int w = 0; w < workers; ++w) {
        pid_t pid = fork();
        if (pid < 0) fail("fork: %s", errno_name(errno));
        if (pid == 0) {
            arm_watchdog(unsigned(opt.num("watchdog", 120)));
            close(tokens[1]);
            for (std::size_t i = 0; i <= conns; ++i) {
                char t;
                ssize_t n = read(tokens[0], &t, 1);
                if (n < 0 && errno == EINTR) continue;
                if (n <= 0) break;
                int fd = accept_one(l);
                report_conn(fd, "worker");
                serve_connection(&fd, false, opt);
            }
            exit(0);
        }
        kids.push_back(pid);
    }
    close(tokens[1]);
    write_port_file(port_file, port);
    int failed = 0;
    for (pid_t pid : kids) {
        int status = 0;
        pid_t got = 0;
        for (int i = 0; i < 12000 && (got = waitpid(pid, &status, WNOHANG)) == 0; ++i)
            sleep_us(10000);
        if (got != pid) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            note("worker %d did not finish", int(pid));
            ++failed;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            note("worker %d ended with status 0x%x", int(pid), unsigned(status));
            ++failed;
        }
    }
    close(l);
    if (failed) fail("%d of %d workers failed", failed, workers);
    return 0;
}

// Uses the socket API without TCP: a Unix socketpair and UDP on loopback.
void non_tcp_traffic() {
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0)
        fail("socketpair: %s", errno_name(errno));
    send_pattern(sp[0], Tx::send, 7, 32768, 4096, 0);
    recv_pattern(sp[1], Rx::recv, 7, 32768, 4096, "unix socketpair");
    close(sp[0]);
    close(sp[1]);
    int a = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int b = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(b, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0)
        fail("udp bind: %s", errno_name(errno));
    socklen_t len = sizeof addr;
    getsockname(b, reinterpret_cast<sockaddr *>(&addr), &len);
    char out[1000], in[1001];
    pattern_fill(9, 0, out, sizeof out);
    if (sendto(a, out, sizeof out, 0, reinterpret_cast<sockaddr *>(&addr), len) != 1000)
        fail("udp sendto: %s", errno_name(errno));
    if (recvfrom(b, in, sizeof in, 0, nullptr, nullptr) != 1000)
        fail("udp recvfrom: %s", errno_name(errno));
    pattern_expect(9, 0, in, 1000, "udp datagram");
    close(a);
    close(b);
}

int run_idle(const Options &opt) {
    const std::string ready = opt.get("ready");
    if (ready.empty()) fail("idle needs --ready FILE");
    const bool expect_ignored = opt.num("expect-ignored", 0) != 0;
    struct sigaction sa{};
    sigaction(SIGTERM, nullptr, &sa);
    if (expect_ignored && sa.sa_handler != SIG_IGN) fail("SIGTERM is no longer ignored at start");
    if (!expect_ignored && sa.sa_handler != SIG_DFL) fail("SIGTERM has a handler at start");
    non_tcp_traffic();
    write_port_file(ready, 1);
    if (expect_ignored) {
        sleep_us(opt.num("linger-ms", 500) * 1000);
        sigaction(SIGTERM, nullptr, &sa);
        if (sa.sa_handler != SIG_IGN) fail("SIGTERM is no longer ignored");
        note("idle survived with SIGTERM ignored");
        return 0;
    }
    for (int i = 0; i < 200; ++i) sleep_us(100000);
    fail("idle: nobody sent the expected signal within 20 s");
}

}  // namespace

bool is_driver_scenario(const std::string &scenario) {
    for (const Entry &e : drivers)
        if (scenario == e.name) return true;
    return false;
}

void drive(const std::string &scenario, int *fd, const Options &opt) {
    for (const Entry &e : drivers)
        if (scenario == e.name) return e.fn(fd, opt);
    fail("unknown scenario '%s'", scenario.c_str());
}

}  // namespace peer

int main(int argc, char **argv) {
    using namespace peer;
    setvbuf(stdout, nullptr, _IOLBF, 0);
    // The undumpable configuration: a pair of which an end is not
    // dumpable goes through the library's queues under the restrictions
    // of a pair of two uids (every byte inline, no ring offered).
    if (const char *u = std::getenv("SDIRECT_TEST_UNDUMPABLE"); u && *u == '1')
        (void)prctl(PR_SET_DUMPABLE, 0);
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s server|client|local|prefork|idle ...\n", argv[0]);
        return 2;
    }
    const std::string mode = argv[1];
    const bool positional = mode == "server" || mode == "client" || mode == "prefork";
    if (positional && argc < 3) fail("%s needs an argument", mode.c_str());
    Options opt = parse(argc, argv, positional ? 3 : 2);
    arm_watchdog(unsigned(opt.num("watchdog", 120)));
    const std::string scenario = opt.get("scenario", "bulk");
    if (scenario != "many" && mode != "upgrade" && !is_driver_scenario(scenario) &&
        !is_sendpath_scenario(scenario) && !is_storm_scenario(scenario) &&
        !is_shut_upgrade_scenario(scenario))
        fail("unknown scenario '%s'", scenario.c_str());
    int rc = 2;
    if (mode == "server") rc = run_server(argv[2], opt);
    else if (mode == "client") rc = run_client(argv[2], opt);
    else if (mode == "local") rc = run_local(opt);
    else if (mode == "prefork") rc = run_prefork(argv[2], opt);
    else if (mode == "idle") rc = run_idle(opt);
    else if (mode == "upgrade") rc = run_upgrade(opt);
    else if (mode == "fd-helper") rc = run_fd_helper(opt);
    else if (mode == "exec-handler") rc = run_exec_handler(opt);
    else if (mode == "stdio-echo") rc = run_stdio_echo();
    else if (mode == "exec-idle") rc = run_exec_idle(opt);
    else if (mode == "spawn-child") rc = run_spawn_child(opt);
    else fail("unknown mode '%s'", mode.c_str());
    std::fflush(stdout);
    return rc;
}
