// epoll_wait across an upgrade: a thread asleep in epoll_wait on a set
// whose connection is still earning its upgrade (under the earn policy the
// library's wait is then the kernel's own epoll_wait) gets the readiness
// of what comes after the connection went direct, and of a direct socket
// another thread adds to the set while it sleeps.
#include "peer_ready.hpp"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <thread>
#include <unistd.h>

namespace peer {

namespace {

constexpr std::uint32_t IN = EPOLLIN;

int ep_new() {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) fail("epoll_create1: %s", errno_name(errno));
    return ep;
}

void ep_ctl(int ep, int op, int fd, std::uint32_t events, std::uint64_t data, const char *what) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = data;
    if (epoll_ctl(ep, op, fd, &ev) != 0) fail("%s: epoll_ctl: %s", what, errno_name(errno));
}

// The kernel socket's own byte counts (TCP_INFO): bytes that went on the
// fabric never reach them.
struct KernelBytes {
    std::uint64_t sent = 0, received = 0;
};
KernelBytes kernel_bytes(int fd) {
    tcp_info ti{};
    socklen_t len = sizeof ti;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
        fail("getsockopt(TCP_INFO): %s", errno_name(errno));
    if (len < offsetof(tcp_info, tcpi_bytes_sent) + sizeof ti.tcpi_bytes_sent)
        skip("TCP_INFO has no tcpi_bytes_sent on this kernel");
    return {ti.tcpi_bytes_sent, ti.tcpi_bytes_received};
}

// Bytes the responder reads and does not answer (nothing comes back for a
// thread asleep on the socket to see).
void send_unanswered(int s, std::uint64_t size, std::uint64_t seed, std::uint32_t chunk,
                     std::uint32_t gap_us) {
    Cmd in;
    in.op = Op::recv;
    in.api = std::uint32_t(Rx::recv);
    in.flags = kNoAck;
    in.size = size;
    in.seed = seed;
    in.chunk = chunk;
    send_cmd(s, in);
    send_pattern(s, Tx::send, seed, size, chunk, gap_us);
}

// Until what we send no longer goes through the kernel socket: the
// connection is direct (bounded: 30 s for the engines' builds and the
// upgrade on a loaded host).
void await_sends_off_kernel(int s, const Options &opt, std::uint64_t first, const char *what) {
    const std::uint64_t start = now_ns();
    for (std::uint64_t k = 0;; ++k) {
        const KernelBytes before = kernel_bytes(s);
        send_unanswered(s, 4096, seed_of(opt, first + k), 4096, 0);
        sleep_us(20000);
        if (kernel_bytes(s).sent - before.sent < 4096) return;
        if (seconds_since(start) > 30) fail("%s: still sending through the kernel after 30 s", what);
        sleep_us(30000);
    }
}

// The system call thread `tid` of this process is in, or -1 while it
// runs in user space.
long syscall_of(pid_t tid) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/self/task/%d/syscall", int(tid));
    char buf[256] = {};
    int f = open(path, O_RDONLY | O_CLOEXEC);
    if (f < 0) fail("open %s: %s", path, errno_name(errno));
    ssize_t n = read(f, buf, sizeof buf - 1);
    close(f);
    return n > 0 && std::strncmp(buf, "running", 7) != 0 ? std::strtol(buf, nullptr, 10) : -1;
}

// Asleep in the kernel's epoll_wait itself, not in a wait of the
// library's (which sleeps in ppoll and looks with epoll_wait between): 10
// looks in a row, 10 ms apart, see it there (bounded 10 s).
void expect_in_epoll_wait(pid_t tid, const char *what) {
    const std::uint64_t start = now_ns();
    long nr = -1;
    for (int row = 0; row < 10;) {
        nr = syscall_of(tid);
        row = nr == SYS_epoll_wait || nr == SYS_epoll_pwait ? row + 1 : 0;
        if (seconds_since(start) > 10)
            fail("%s: the thread in epoll_wait is in system call %ld, not epoll_wait (%d) or "
                 "epoll_pwait (%d)", what, nr, int(SYS_epoll_wait), int(SYS_epoll_pwait));
        sleep_us(10000);
    }
}

struct Sleeper {
    std::thread t;
    std::atomic<pid_t> tid{0};
    std::atomic<bool> done{false};
    int rc = 0;
    int err = 0;
    std::uint64_t woke_at = 0;
    epoll_event ev[4]{};
};

}  // namespace

// The set holds the connection, still earning (SDIRECT_UPGRADE_AFTER_MS
// of the harness is longer than the settle); a thread sleeps in
// epoll_wait on it while the main thread's paced sends earn the upgrade
// (--await-direct: and waits until the connection is direct). Then the
// responder answers: the sleeper reports EPOLLIN for it, not before, and
// reads every byte; a paced ping-pong follows.
void drive_epoll_earn_sleep(int *fd, const Options &opt) {
    const int s = *fd;
    const std::uint64_t answer = opt.num("size", 256 * 1024);
    const std::uint64_t answer_seed = seed_of(opt, 1);
    const int ep = ep_new();
    ep_ctl(ep, EPOLL_CTL_ADD, s, IN, 0x51, "ADD the earning connection");
    Sleeper sl;
    sl.t = std::thread([&] {
        sl.tid = pid_t(syscall(SYS_gettid));
        Watch watch(60, "epoll_wait asleep while the connection earns its upgrade");
        sl.rc = epoll_wait(ep, sl.ev, 4, 45000);
        sl.err = errno;
        sl.woke_at = now_ns();
        if (sl.rc == 1 && sl.ev[0].data.u64 == 0x51 && sl.ev[0].events == IN)
            recv_pattern(s, Rx::recv, answer_seed, answer, 65536,
                         "answer read by the thread woken by epoll_wait");
        sl.done = true;
    });
    while (!sl.tid.load()) sleep_us(1000);
    expect_in_epoll_wait(sl.tid, "before the upgrade is earned");
    // Paced: past SDIRECT_UPGRADE_AFTER_MS of the connection's life, each
    // send would ask for the upgrade while the sleeper holds it back.
    send_unanswered(s, opt.num("earn-bytes", 60000), seed_of(opt, 2), 1024,
                    std::uint32_t(opt.num("gap-us", 25000)));
    if (opt.num("await-direct", 0)) await_sends_off_kernel(s, opt, 100, "earning connection");
    if (sl.done) fail("epoll_wait returned %d (%s) before any answer was sent", sl.rc,
                      sl.rc < 0 ? errno_name(sl.err) : events_text(short(sl.ev[0].events)).c_str());
    const std::uint64_t ordered = now_ns();
    const KernelBytes before = kernel_bytes(s);
    Cmd out;
    out.op = Op::send;
    out.api = std::uint32_t(Tx::send);
    out.size = answer;
    out.seed = answer_seed;
    out.chunk = 16384;
    out.pre_delay_us = 50000;
    send_cmd(s, out);
    sl.t.join();
    if (sl.rc != 1 || sl.ev[0].data.u64 != 0x51 || sl.ev[0].events != IN)
        fail("epoll_wait asleep across the upgrade returned %d (%s, data 0x%llx); expected EPOLLIN "
             "for the answer", sl.rc,
             sl.rc < 0 ? errno_name(sl.err) : events_text(short(sl.ev[0].events)).c_str(),
             (unsigned long long)sl.ev[0].data.u64);
    const double after = double(std::int64_t(sl.woke_at - ordered)) / 1e9;
    if (after < 0.03) fail("epoll_wait returned %.3f s after the answer was ordered (sent 0.05 s "
                           "later)", after);
    if (opt.num("await-direct", 0) && kernel_bytes(s).received - before.received >= answer)
        fail("the answer came through the kernel socket: the connection was not direct");
    paced_pingpongs(s, opt, opt.num("after-ms", 1500), 200);
    close(ep);
    send_exit(s);
}

namespace {

// Connection 0 sleeps in epoll_wait on a set holding only itself (still
// earning); connection 1, served by another thread of this process, goes
// direct, adds itself to that set and has the responder send to it.
struct AddDirect {
    std::atomic<int> ep{-1};
    std::atomic<pid_t> sleeper{0};
    std::atomic<std::uint64_t> ordered{0};
    std::atomic<bool> returned{false};
    std::atomic<bool> deleted{false};
};
AddDirect add_direct;

void await_flag(const std::atomic<bool> &flag, double seconds, const char *what) {
    const std::uint64_t start = now_ns();
    while (!flag.load()) {
        if (seconds_since(start) > seconds) fail("%s: not after %.0f s", what, seconds);
        sleep_us(1000);
    }
}

void add_direct_sleeper(int s, const Options &opt) {
    const int ep = ep_new();
    ep_ctl(ep, EPOLL_CTL_ADD, s, IN, 0xa0, "ADD the earning connection");
    add_direct.sleeper = pid_t(syscall(SYS_gettid));
    add_direct.ep = ep;
    epoll_event ev[4]{};
    int rc, err;
    {
        Watch watch(60, "epoll_wait asleep while another thread adds a direct socket");
        rc = epoll_wait(ep, ev, 4, 45000);
        err = errno;
    }
    const std::uint64_t woke = now_ns();
    add_direct.returned = true;
    if (rc != 1 || ev[0].data.u64 != 0xa1 || ev[0].events != IN)
        fail("epoll_wait while another thread added a direct socket returned %d (%s, data 0x%llx); "
             "expected EPOLLIN for the added socket", rc,
             rc < 0 ? errno_name(err) : events_text(short(ev[0].events)).c_str(),
             (unsigned long long)ev[0].data.u64);
    const double after = double(std::int64_t(woke - add_direct.ordered.load())) / 1e9;
    if (after < 0.03)
        fail("epoll_wait returned %.3f s after the data was ordered (sent 0.05 s later)", after);
    await_flag(add_direct.deleted, 30, "the added socket's DEL");
    close(ep);
    // This connection goes direct too (the modes the harness checks).
    paced_pingpongs(s, opt, opt.num("after-ms", 2000), 300);
}

void add_direct_adder(int s, const Options &opt) {
    paced_pingpongs(s, opt, opt.num("earn-ms", 2500), 400);
    if (opt.num("await-direct", 0)) await_sends_off_kernel(s, opt, 500, "connection to add");
    const std::uint64_t start = now_ns();
    while (add_direct.ep.load() < 0 || !add_direct.sleeper.load()) {
        if (seconds_since(start) > 30) fail("the sleeping connection's set never came");
        sleep_us(1000);
    }
    expect_in_epoll_wait(add_direct.sleeper, "before the ADD");
    const KernelBytes before = kernel_bytes(s);
    ep_ctl(add_direct.ep, EPOLL_CTL_ADD, s, IN, 0xa1, "ADD a direct socket from another thread");
    add_direct.ordered = now_ns();
    order_send(s, 10, seed_of(opt, 1), 50000, true);
    await_flag(add_direct.returned, 30, "the sleeper's return");
    take(s, 10, seed_of(opt, 1), "data of the socket added while the set slept");
    if (opt.num("await-direct", 0) && kernel_bytes(s).received != before.received)
        fail("the added socket's data came through the kernel socket: it was not direct");
    ep_ctl(add_direct.ep, EPOLL_CTL_DEL, s, 0, 0, "DEL the added socket");
    add_direct.deleted = true;
}

}  // namespace

// --conns 2 --parallel 1: connection 0 sleeps, connection 1 adds itself.
void drive_epoll_add_direct(int *fd, const Options &opt) {
    if (opt.num("conn-index", 0) == 0) add_direct_sleeper(*fd, opt);
    else add_direct_adder(*fd, opt);
    send_exit(*fd);
}

namespace {

// Eventfds this process holds (/proc/self/fd): the library's wake-up fds.
int eventfds_held() {
    DIR *d = opendir("/proc/self/fd");
    if (!d) fail("opendir(/proc/self/fd): %s", errno_name(errno));
    int n = 0;
    while (dirent *e = readdir(d)) {
        char path[300], target[64];
        std::snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        const ssize_t len = readlink(path, target, sizeof target - 1);
        if (len <= 0) continue;
        target[len] = '\0';
        if (std::strcmp(target, "anon_inode:[eventfd]") == 0) ++n;
    }
    closedir(d);
    return n;
}

// Threads of this process now (/proc/self/status).
int threads_now() {
    FILE *f = std::fopen("/proc/self/status", "r");
    if (!f) fail("fopen(/proc/self/status): %s", errno_name(errno));
    char line[256];
    int n = 0;
    while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "Threads: %d", &n) == 1) break;
    std::fclose(f);
    return n;
}

}  // namespace

// A process whose only thread waits in epoll_wait and poll on a
// connection that has not asked for its upgrade: the readiness and bytes
// of every answer. --eventfds check: the eventfds it holds afterwards,
// under the library: none with one thread (the library's waits sleep on no
// fd of their own), some once a second thread ran (--thread 1: the epoll
// set's wake-up fd, the thread's bell), as when a sanitizer's runtime
// keeps a thread of its own; without the library, none.
void drive_alone_waits(int *fd, const Options &opt) {
    const int s = *fd;
    if (opt.num("thread", 0)) std::thread([] {}).join();
    const int ep = ep_new();
    ep_ctl(ep, EPOLL_CTL_ADD, s, IN, 0x52, "ADD the connection");
    const int rounds = int(opt.num("rounds", 20));
    for (int i = 0; i < rounds; ++i) {
        Cmd out;
        out.op = Op::send;
        out.api = std::uint32_t(Tx::send);
        out.size = 1000 + std::uint64_t(i) * 37;
        out.seed = seed_of(opt, std::uint64_t(10 + i));
        out.chunk = 4096;
        out.pre_delay_us = 2000;
        send_cmd(s, out);
        if (i % 2 == 0) {
            epoll_event ev[2]{};
            const int rc = epoll_wait(ep, ev, 2, 10000);
            if (rc != 1 || ev[0].data.u64 != 0x52 || ev[0].events != IN)
                fail("round %d: epoll_wait returned %d (%s), expected EPOLLIN for the answer", i,
                     rc, rc < 0 ? errno_name(errno) : events_text(short(ev[0].events)).c_str());
        } else {
            pollfd p{s, POLLIN, 0};
            const int rc = poll(&p, 1, 10000);
            if (rc != 1 || p.revents != POLLIN)
                fail("round %d: poll returned %d (%s), expected POLLIN for the answer", i, rc,
                     rc < 0 ? errno_name(errno) : events_text(p.revents).c_str());
        }
        recv_pattern(s, Rx::recv, out.seed, out.size, 65536, "answer");
    }
    if (opt.has("eventfds")) {
        const char *pre = std::getenv("LD_PRELOAD");
        const bool ours = pre && std::strstr(pre, "sdirect");
        const bool threads = opt.num("thread", 0) || threads_now() > 1;
        const int held = eventfds_held();
        if (!ours && held != 0)
            fail("without the library this process holds %d eventfds", held);
        if (ours && !threads && held != 0)
            fail("with one thread, after %d waits this process holds %d eventfds, expected none",
                 rounds, held);
        if (ours && threads && held == 0)
            fail("after a second thread and %d waits this process holds no eventfd: its waits "
                 "did not sleep on the library's fds", rounds);
    }
    close(ep);
    send_exit(s);
}

}  // namespace peer
