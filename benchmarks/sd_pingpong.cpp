// sd_pingpong: a plain-socket TCP benchmark, run the same way under the
// kernel and under sdirect-run so the two are compared like for like.
//
//   sd_pingpong server PORT [--count C] [--bind ADDR] [--timeout S]
//               [--wait block|poll|epoll]
//   sd_pingpong client HOST PORT --size N --iters K --mode pingpong|stream
//               [--warmup W] [--warmup-ms T] [--timeout S]
//               [--wait block|poll|epoll]
//
// The client opens with a fixed 24-byte request (below) so the server needs
// no options of its own. pingpong: K round trips of N bytes each way, one
// clock_gettime(CLOCK_MONOTONIC) pair per round trip, latency = RTT / 2.
// stream: K messages of N bytes one way, then a 1-byte ack; MB/s = 10^6 B/s.
// Before them, W round trips (messages) of warm-up, untimed (default: K/10,
// at most 1000); pingpong with --warmup-ms: at least W, and for at least T
// ms (the steady state of a long connection: past the connection's own
// start, the upgrade and the scheduler's placement of the two processes).
// Each end sends from one buffer and receives into another, as fi_pingpong
// does: the bytes a send copies were not just written by the other CPU.
// (Echoing the received buffer makes every copy move lines dirty in the
// other CPU's cache: a 64 KiB process_vm_readv took 7.9 us here against
// 3.4 us for a buffer at rest, for the kernel and the library alike.)
//
// --wait: how each end waits for its socket. block (the default): blocking
// read and write. poll / epoll: the socket non-blocking, and a read or
// write that would block waits in poll() / in epoll_wait() on a
// level-triggered set holding the socket (EPOLLIN, EPOLLOUT while a write
// waits), as event-driven servers and clients do.
//
// Output (client, one line on stdout):
//   size=N mode=pingpong iters=K lat_us_median=.. lat_us_mean=.. lat_us_min=.. mbps=..
//   size=N mode=stream iters=K secs=.. mbps=..
// pingpong's mbps is N / mean one-way latency, as NetPIPE and fi_pingpong
// report it.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

// Request, client -> server, little-endian host order:
//   0 magic u32 | 4 mode u32 | 8 size u64 | 16 iters u32 | 20 warmup u32
// warmup kOpenWarmup (pingpong): the warm-up's messages start with
// kWarmByte, and the first message that does not is the first timed one.
struct Request {
    std::uint32_t magic;
    std::uint32_t mode;
    std::uint64_t size;
    std::uint32_t iters;
    std::uint32_t warmup;
};
static_assert(sizeof(Request) == 24);

constexpr std::uint32_t kMagic = 0x53445050;  // "SDPP"
constexpr std::uint64_t kMaxSize = 1ull << 30;
constexpr std::uint32_t kMaxIters = 100'000'000;
constexpr std::uint32_t kOpenWarmup = 0xffffffff;
constexpr char kWarmByte = 'w';
enum Mode : std::uint32_t { pingpong = 0, stream = 1 };

[[noreturn]] void die(const char *what) {
    std::fprintf(stderr, "sd_pingpong: %s: %s\n", what, std::strerror(errno));
    std::exit(1);
}

[[noreturn]] void fail(const char *what) {
    std::fprintf(stderr, "sd_pingpong: %s\n", what);
    std::exit(1);
}

double now_us() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return double(ts.tv_sec) * 1e6 + double(ts.tv_nsec) / 1e3;
}

enum class Wait { block, poll, epoll };
Wait wait_mode = Wait::block;
int wait_set = -1;            // the epoll set of --wait epoll
std::uint32_t set_events = 0;  // what the set holds for the socket

bool parse_wait(const char *text) {
    std::string_view w = text;
    if (w == "block") wait_mode = Wait::block;
    else if (w == "poll") wait_mode = Wait::poll;
    else if (w == "epoll") wait_mode = Wait::epoll;
    else return false;
    return true;
}

// The socket as --wait wants it: non-blocking and, for epoll, in a set of
// its own (read interest).
void prepare(int fd) {
    if (wait_mode == Wait::block) return;
    const int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) die("O_NONBLOCK");
    if (wait_mode != Wait::epoll) return;
    if (wait_set < 0 && (wait_set = epoll_create1(EPOLL_CLOEXEC)) < 0) die("epoll_create1");
    epoll_event ev{};
    ev.events = set_events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(wait_set, EPOLL_CTL_ADD, fd, &ev) != 0) die("epoll_ctl");
}

void unprepare(int fd) {
    if (wait_mode == Wait::epoll && epoll_ctl(wait_set, EPOLL_CTL_DEL, fd, nullptr) != 0)
        die("epoll_ctl");
}

// Waits until fd is readable (or writable); returns at once for EINTR.
void wait_for(int fd, bool out) {
    if (wait_mode == Wait::poll) {
        pollfd p{fd, short(out ? POLLOUT : POLLIN), 0};
        if (poll(&p, 1, -1) < 0 && errno != EINTR) die("poll");
        return;
    }
    const std::uint32_t want = out ? EPOLLOUT : EPOLLIN;
    if (set_events != want) {
        epoll_event ev{};
        ev.events = set_events = want;
        ev.data.fd = fd;
        if (epoll_ctl(wait_set, EPOLL_CTL_MOD, fd, &ev) != 0) die("epoll_ctl");
    }
    epoll_event got[4];
    if (epoll_wait(wait_set, got, 4, -1) < 0 && errno != EINTR) die("epoll_wait");
}

// Each pass moves at least one byte, waits for the socket, or ends the
// program, so the loops are bounded by the byte count.
void write_all(int fd, const char *p, std::size_t n) {
    while (n > 0) {
        ssize_t w = ::write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN && wait_mode != Wait::block) {
                wait_for(fd, true);
                continue;
            }
            die("write");
        }
        p += w;
        n -= std::size_t(w);
    }
}

void read_all(int fd, char *p, std::size_t n) {
    while (n > 0) {
        ssize_t r = ::read(fd, p, n);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN && wait_mode != Wait::block) {
                wait_for(fd, false);
                continue;
            }
            die("read");
        }
        if (r == 0) fail("peer closed the connection early");
        p += r;
        n -= std::size_t(r);
    }
}

void nodelay(int fd) {
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) die("TCP_NODELAY");
}

bool parse_u64(const char *text, std::uint64_t max, std::uint64_t &out) {
    char *end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(text, &end, 10);
    if (errno || end == text || *end != '\0' || v > max) return false;
    out = v;
    return true;
}

void usage() {
    std::fputs("usage: sd_pingpong server PORT [--count C] [--bind ADDR] [--timeout S]\n"
               "                   [--wait block|poll|epoll]\n"
               "       sd_pingpong client HOST PORT --size N --iters K --mode pingpong|stream\n"
               "                   [--warmup W] [--warmup-ms T] [--timeout S]\n"
               "                   [--wait block|poll|epoll]\n",
               stderr);
    std::exit(2);
}

std::uint64_t number(int argc, char **argv, int &i, std::uint64_t max) {
    std::uint64_t v = 0;
    if (i + 1 >= argc || !parse_u64(argv[i + 1], max, v)) {
        std::fprintf(stderr, "sd_pingpong: %s needs a number <= %llu\n", argv[i],
                     (unsigned long long)max);
        std::exit(2);
    }
    ++i;
    return v;
}

void serve(int fd) {
    Request rq{};
    read_all(fd, reinterpret_cast<char *>(&rq), sizeof rq);
    if (rq.magic != kMagic || rq.mode > stream || rq.size == 0 || rq.size > kMaxSize ||
        rq.iters > kMaxIters || (rq.warmup > kMaxIters && rq.warmup != kOpenWarmup) ||
        (rq.warmup == kOpenWarmup && (rq.mode != pingpong || rq.iters == 0)))
        fail("bad request");
    std::vector<char> buf(rq.size, 's'), out(rq.size, 's');
    char ack = 'a';
    if (rq.mode == pingpong) {
        std::uint64_t left = rq.iters;
        if (rq.warmup == kOpenWarmup) {
            // Answered as they come; the first timed message ends the warm-up.
            for (;;) {
                read_all(fd, buf.data(), buf.size());
                write_all(fd, out.data(), out.size());
                if (buf[0] != kWarmByte) break;
            }
            --left;
        } else {
            left += rq.warmup;
        }
        for (std::uint64_t i = 0; i < left; ++i) {
            read_all(fd, buf.data(), buf.size());
            write_all(fd, out.data(), out.size());
        }
    } else {
        for (std::uint32_t i = 0; i < rq.warmup; ++i) read_all(fd, buf.data(), buf.size());
        write_all(fd, &ack, 1);
        for (std::uint32_t i = 0; i < rq.iters; ++i) read_all(fd, buf.data(), buf.size());
        write_all(fd, &ack, 1);
    }
}

int run_server(int argc, char **argv) {
    if (argc < 3) usage();
    std::uint64_t port = 0, count = 1;
    const char *bind_addr = "127.0.0.1";
    if (!parse_u64(argv[2], 65535, port) || port == 0) usage();
    for (int i = 3; i < argc; ++i) {
        std::string_view a = argv[i];
        if (a == "--count") count = number(argc, argv, i, 1'000'000);
        else if (a == "--bind" && i + 1 < argc) bind_addr = argv[++i];
        else if (a == "--timeout") alarm(unsigned(number(argc, argv, i, 86400)));
        else if (a == "--wait" && i + 1 < argc && parse_wait(argv[i + 1])) ++i;
        else usage();
    }

    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
    std::string service = std::to_string(port);
    if (int rc = getaddrinfo(bind_addr, service.c_str(), &hints, &res); rc != 0)
        fail(gai_strerror(rc));
    int ls = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (ls < 0) die("socket");
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(ls, res->ai_addr, res->ai_addrlen) != 0) die("bind");
    freeaddrinfo(res);
    if (listen(ls, 16) != 0) die("listen");

    std::uint64_t served = 0;
    while (served < count) {
        int fd = accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR) continue;
            die("accept");
        }
        nodelay(fd);
        prepare(fd);
        serve(fd);
        unprepare(fd);
        close(fd);
        ++served;
    }
    close(ls);
    return 0;
}

// Retries while the server is not listening yet, for up to two seconds.
int connect_to(const char *host, const char *port) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    if (int rc = getaddrinfo(host, port, &hints, &res); rc != 0) fail(gai_strerror(rc));
    for (int attempt = 0; attempt < 200; ++attempt) {
        int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) die("socket");
        if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
            freeaddrinfo(res);
            return fd;
        }
        int err = errno;
        close(fd);
        if (err != ECONNREFUSED && err != EINTR) {
            errno = err;
            die("connect");
        }
        usleep(10'000);
    }
    fail("connect: server not listening after 2 s");
}

int run_client(int argc, char **argv) {
    if (argc < 4) usage();
    const char *host = argv[2];
    const char *port = argv[3];
    std::uint64_t size = 0, iters = 0, warmup = ~0ull, warmup_ms = 0;
    int mode = -1;
    for (int i = 4; i < argc; ++i) {
        std::string_view a = argv[i];
        if (a == "--size") size = number(argc, argv, i, kMaxSize);
        else if (a == "--iters") iters = number(argc, argv, i, kMaxIters);
        else if (a == "--warmup") warmup = number(argc, argv, i, kMaxIters);
        else if (a == "--warmup-ms") warmup_ms = number(argc, argv, i, 600'000);
        else if (a == "--timeout") alarm(unsigned(number(argc, argv, i, 86400)));
        else if (a == "--wait" && i + 1 < argc && parse_wait(argv[i + 1])) ++i;
        else if (a == "--mode" && i + 1 < argc) {
            std::string_view m = argv[++i];
            if (m == "pingpong") mode = pingpong;
            else if (m == "stream") mode = stream;
            else usage();
        } else usage();
    }
    if (size == 0 || iters == 0 || mode < 0) usage();
    if (warmup == ~0ull) warmup = std::min<std::uint64_t>(iters / 10, 1000);

    int fd = connect_to(host, port);
    nodelay(fd);
    prepare(fd);
    if (warmup_ms && mode != pingpong) usage();
    Request rq{kMagic, std::uint32_t(mode), size, std::uint32_t(iters),
               warmup_ms ? kOpenWarmup : std::uint32_t(warmup)};
    write_all(fd, reinterpret_cast<const char *>(&rq), sizeof rq);

    std::vector<char> buf(size, 'c'), in(size);
    char ack = 0;
    if (mode == pingpong) {
        std::uint64_t warmed = 0;
        if (warmup_ms) {
            // The server answers until a message does not start with kWarmByte.
            const double until = now_us() + double(warmup_ms) * 1000;
            buf[0] = kWarmByte;
            for (; warmed < warmup || now_us() < until; ++warmed) {
                write_all(fd, buf.data(), size);
                read_all(fd, in.data(), size);
            }
            buf[0] = 'c';
        } else {
            for (; warmed < warmup; ++warmed) {
                write_all(fd, buf.data(), size);
                read_all(fd, in.data(), size);
            }
        }
        std::vector<double> lat(iters);
        for (std::uint64_t i = 0; i < iters; ++i) {
            double t0 = now_us();
            write_all(fd, buf.data(), size);
            read_all(fd, in.data(), size);
            lat[i] = (now_us() - t0) / 2;
        }
        double sum = 0;
        for (double v : lat) sum += v;
        double mean = sum / double(iters);
        double min = *std::min_element(lat.begin(), lat.end());
        std::nth_element(lat.begin(), lat.begin() + lat.size() / 2, lat.end());
        double median = lat[lat.size() / 2];
        std::printf("size=%llu mode=pingpong iters=%llu lat_us_median=%.3f lat_us_mean=%.3f "
                    "lat_us_min=%.3f mbps=%.2f warmup=%llu\n",
                    (unsigned long long)size, (unsigned long long)iters, median, mean, min,
                    double(size) / mean, (unsigned long long)warmed);
    } else {
        for (std::uint64_t i = 0; i < warmup; ++i) write_all(fd, buf.data(), size);
        read_all(fd, &ack, 1);
        double t0 = now_us();
        for (std::uint64_t i = 0; i < iters; ++i) write_all(fd, buf.data(), size);
        read_all(fd, &ack, 1);
        double us = now_us() - t0;
        std::printf("size=%llu mode=stream iters=%llu secs=%.6f mbps=%.2f\n",
                    (unsigned long long)size, (unsigned long long)iters, us / 1e6,
                    double(size) * double(iters) / us);
    }
    close(fd);
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 2) usage();
    // A benchmark never waits forever: the default bound is two minutes,
    // --timeout overrides it (SIGALRM ends the process).
    alarm(120);
    std::string_view role = argv[1];
    if (role == "server") return run_server(argc, argv);
    if (role == "client") return run_client(argc, argv);
    usage();
}
