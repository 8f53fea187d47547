// sd_forkserve: what a connection to a server that forks a child per
// connection costs, counted where this host's timing scatters: the page
// faults and the CPU of the server and its children per connection. Plain
// sockets only: the same binary measures the kernel and, preloaded, the
// library.
//
//   sd_forkserve server PORT_FILE N [--request B] [--response B]
//   sd_forkserve client PORT N [--request B] [--response B]
//
// server: listens on 127.0.0.1 (a port of the kernel's choice, written to
// PORT_FILE once it listens), accepts N connections one after the other
// and forks a child for each, which reads the request (B bytes, 100 by
// default), writes the response (400 by default), closes and _exits; the
// server closes its copy, and reaps its children. Then one line:
//   conns=N faults_per_conn=F cpu_us_per_conn=C
// F: minor and major page faults of the server since it listened and of
// all its children, over N; C: their user and system CPU, in µs, over N
// (getrusage of the server and of its children).
// client: N connections one after the other (connect, write the request,
// read the response, close), then one line:
//   conns=N wall_us_per_conn=W
// Exit status 0, or 1 with a message on stderr.
#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <netinet/in.h>
#include <string>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace {

struct Args {
    std::string mode, where;
    long n = 0;
    std::size_t request = 100, response = 400;
};

[[noreturn]] void fail(const char *what) {
    std::fprintf(stderr, "sd_forkserve: %s: %s\n", what, std::strerror(errno));
    std::exit(1);
}

[[noreturn]] void usage() {
    std::fprintf(stderr,
                 "usage: sd_forkserve server PORT_FILE N [--request B] [--response B]\n"
                 "       sd_forkserve client PORT N [--request B] [--response B]\n");
    std::exit(1);
}

Args parse(int argc, char **argv) {
    if (argc < 4) usage();
    Args a;
    a.mode = argv[1];
    a.where = argv[2];
    a.n = std::strtol(argv[3], nullptr, 10);
    if ((a.mode != "server" && a.mode != "client") || a.n <= 0) usage();
    for (int i = 4; i + 1 < argc; i += 2) {
        const long v = std::strtol(argv[i + 1], nullptr, 10);
        if (v <= 0 || v > (1 << 20)) usage();
        if (!std::strcmp(argv[i], "--request")) a.request = std::size_t(v);
        else if (!std::strcmp(argv[i], "--response")) a.response = std::size_t(v);
        else usage();
    }
    if ((argc - 4) % 2) usage();
    return a;
}

// All n bytes through `io` (read or write), across short transfers and
// signals; false on an error or an early EOF.
template <typename Io, typename Byte>
bool exact(Io io, int fd, Byte *p, std::size_t n) {
    while (n) {
        const ssize_t r = io(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= std::size_t(r);
    }
    return true;
}

bool read_exact(int fd, char *p, std::size_t n) { return exact(read, fd, p, n); }
bool write_exact(int fd, const char *p, std::size_t n) { return exact(write, fd, p, n); }

long faults(const rusage &u) { return u.ru_minflt + u.ru_majflt; }
double cpu_us(const rusage &u) {
    return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e6 +
           double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

int server(const Args &a) {
    const int l = socket(AF_INET, SOCK_STREAM, 0);
    if (l < 0) fail("socket");
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (bind(l, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0) fail("bind");
    if (listen(l, 128) != 0) fail("listen");
    if (getsockname(l, reinterpret_cast<sockaddr *>(&sa), &len) != 0) fail("getsockname");
    rusage start{};
    getrusage(RUSAGE_SELF, &start);
    {
        const std::string tmp = a.where + ".tmp";
        FILE *f = std::fopen(tmp.c_str(), "w");
        if (!f) fail("port file");
        std::fprintf(f, "%d\n", ntohs(sa.sin_port));
        if (std::fclose(f) != 0 || std::rename(tmp.c_str(), a.where.c_str()) != 0) fail("port file");
    }
    std::vector<char> response(a.response, 'r');
    for (long i = 0; i < a.n; ++i) {
        const int c = accept(l, nullptr, nullptr);
        if (c < 0) {
            if (errno == EINTR) {
                --i;
                continue;
            }
            fail("accept");
        }
        const pid_t child = fork();
        if (child < 0) fail("fork");
        if (child == 0) {
            close(l);
            std::vector<char> request(a.request);
            const bool ok = read_exact(c, request.data(), a.request) &&
                            write_exact(c, response.data(), a.response);
            close(c);
            _exit(ok ? 0 : 1);
        }
        close(c);
        // Reap as they end: a forking server keeps no zombies.
        while (waitpid(-1, nullptr, WNOHANG) > 0) {
        }
    }
    int status = 0, bad = 0;
    for (pid_t p; (p = wait(&status)) > 0 || errno == EINTR;)
        if (p > 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) ++bad;
    rusage self{}, kids{};
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &kids);
    // Children reaped in the loop above count too (RUSAGE_CHILDREN holds
    // every child waited for).
    const double n = double(a.n);
    std::printf("conns=%ld faults_per_conn=%.2f cpu_us_per_conn=%.1f\n", a.n,
                double(faults(self) - faults(start) + faults(kids)) / n,
                (cpu_us(self) - cpu_us(start) + cpu_us(kids)) / n);
    if (bad) {
        std::fprintf(stderr, "sd_forkserve: %d children failed\n", bad);
        return 1;
    }
    return 0;
}

int client(const Args &a) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(std::uint16_t(std::strtol(a.where.c_str(), nullptr, 10)));
    std::vector<char> request(a.request, 'q'), response(a.response);
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < a.n; ++i) {
        const int s = socket(AF_INET, SOCK_STREAM, 0);
        if (s < 0) fail("socket");
        if (connect(s, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0) fail("connect");
        if (!write_exact(s, request.data(), a.request)) fail("write");
        if (!read_exact(s, response.data(), a.response)) fail("read");
        for (char ch : response)
            if (ch != 'r') {
                std::fprintf(stderr, "sd_forkserve: response corrupted\n");
                return 1;
            }
        close(s);
    }
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    std::printf("conns=%ld wall_us_per_conn=%.1f\n", a.n, us / double(a.n));
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    const Args a = parse(argc, argv);
    return a.mode == "server" ? server(a) : client(a);
}
