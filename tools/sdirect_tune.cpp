// sdirect-tune: measures on this host which protocol moves a stream of
// messages of each size fastest, and writes the table that
// SDIRECT_PROTOCOLS=auto reads (transport/protocol.hpp).
//
//   sdirect-run sdirect-tune [--out FILE] [--min BYTES] [--max BYTES]
//                            [--seconds S] [--repeats N]
//
// For each protocol (buffered, ring, zcopy) and each repeat it starts a
// copy of itself with SDIRECT_PROTOCOLS set to that protocol; the copy
// forks, connects to itself over 127.0.0.1 and streams messages of every
// size (powers of two from --min to --max) for about --seconds each. The
// library's statistics file then proves the connection ran direct and by
// which protocol its bytes went. Per size: the median of the repeats; the
// best protocol is the one with the highest median.
#include "transport/clock.hpp"
#include "transport/protocol.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sstream>
#include <string>
#include <string_view>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace {

using sd::transport::Protocol;
using sd::transport::protocol_name;

constexpr Protocol kProtocols[] = {Protocol::buffered, Protocol::ring, Protocol::zcopy};

struct Options {
    std::string out;
    std::uint64_t min = 4096, max = 4u << 20;
    double seconds = 0.15;
    int repeats = 3;
};

double now_s() { return double(sd::transport::monotonic_ns()) * 1e-9; }

[[noreturn]] void die(const char *what) {
    std::fprintf(stderr, "sdirect-tune: %s: %s\n", what, std::strerror(errno));
    std::exit(1);
}

bool send_all(int fd, const void *buf, std::size_t len) {
    const char *p = static_cast<const char *>(buf);
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        p += n;
        len -= std::size_t(n);
    }
    return true;
}

bool recv_all(int fd, void *buf, std::size_t len) {
    char *p = static_cast<char *>(buf);
    while (len) {
        ssize_t n = recv(fd, p, len, MSG_WAITALL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        p += n;
        len -= std::size_t(n);
    }
    return true;
}

// The receiving end: per round a header (size, count), then count
// messages of size bytes, answered by one byte. Size 0 ends it.
[[noreturn]] void sink(std::uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) _exit(2);
    std::vector<char> buf;
    for (;;) {
        std::uint64_t h[2];
        if (!recv_all(fd, h, sizeof h)) _exit(3);
        if (h[0] == 0) break;
        if (buf.size() < h[0]) buf.resize(h[0]);
        for (std::uint64_t i = 0; i < h[1]; ++i)
            if (!recv_all(fd, buf.data(), h[0])) _exit(4);
        char ack = 1;
        if (!send_all(fd, &ack, 1)) _exit(5);
    }
    close(fd);
    _exit(0);
}

// One round: `count` messages of `size` bytes; seconds until acknowledged.
double round_trip(int fd, const char *buf, std::uint64_t size, std::uint64_t count) {
    std::uint64_t h[2] = {size, count};
    const double t0 = now_s();
    if (!send_all(fd, h, sizeof h)) return -1;
    for (std::uint64_t i = 0; i < count; ++i)
        if (!send_all(fd, buf, size)) return -1;
    char ack;
    if (!recv_all(fd, &ack, 1)) return -1;
    return now_s() - t0;
}

// --measure: this process runs under the library with one protocol
// forced; prints "SIZE MBPS" per size.
int measure(const Options &opt) {
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof a;
    if (ls < 0 || bind(ls, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 || listen(ls, 1) != 0 ||
        getsockname(ls, reinterpret_cast<sockaddr *>(&a), &alen) != 0)
        die("listen on 127.0.0.1");
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) sink(ntohs(a.sin_port));
    int fd = accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) die("accept");
    close(ls);
    std::vector<char> buf(opt.max);
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = char(i * 7);
    int rc = 0;
    for (std::uint64_t size = opt.min; size <= opt.max; size *= 2) {
        // Warm up, then double the count until a round lasts long enough.
        if (round_trip(fd, buf.data(), size, 4) < 0) {
            rc = 1;
            break;
        }
        std::uint64_t count = 8;
        double t = 0;
        for (;;) {
            t = round_trip(fd, buf.data(), size, count);
            if (t < 0 || t >= opt.seconds || count >= (1u << 24)) break;
            count = t > opt.seconds / 16 ? std::uint64_t(double(count) * opt.seconds / t) + 1
                                         : count * 4;
        }
        if (t <= 0) {
            rc = 1;
            break;
        }
        std::printf("%llu %.1f\n", (unsigned long long)size, double(size * count) / t / 1e6);
        std::fflush(stdout);
    }
    std::uint64_t end[2] = {0, 0};
    (void)send_all(fd, end, sizeof end);
    int status = 0;
    waitpid(child, &status, 0);
    close(fd);
    return rc || !WIFEXITED(status) || WEXITSTATUS(status) ? 1 : 0;
}

// The value of " key=" in a statistics line.
std::string field(const std::string &line, const std::string &key) {
    std::size_t at = line.find(" " + key + "=");
    if (at == std::string::npos) return {};
    at += key.size() + 2;
    return line.substr(at, line.find(' ', at) - at);
}

// Runs one --measure copy with `protocol` forced: size -> MB/s, or an
// error message.
std::map<std::uint64_t, double> run_copy(const char *self, const Options &opt,
                                          const char *protocol, std::string *error) {
    char stats[] = "/tmp/sdirect-tune-XXXXXX";
    int sfd = mkstemp(stats);
    if (sfd < 0) die("mkstemp");
    close(sfd);
    int out[2];
    if (pipe(out) != 0) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        dup2(out[1], 1);
        close(out[0]);
        close(out[1]);
        setenv("SDIRECT_PROTOCOLS", protocol, 1);
        setenv("SDIRECT_STATS_FILE", stats, 1);
        char min[32], max[32], secs[32];
        std::snprintf(min, sizeof min, "%llu", (unsigned long long)opt.min);
        std::snprintf(max, sizeof max, "%llu", (unsigned long long)opt.max);
        std::snprintf(secs, sizeof secs, "%g", opt.seconds);
        execl(self, self, "--measure", "--min", min, "--max", max, "--seconds", secs,
              static_cast<char *>(nullptr));
        _exit(127);
    }
    close(out[1]);
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = read(out[0], buf, sizeof buf)) != 0;) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        text.append(buf, std::size_t(n));
    }
    close(out[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    std::map<std::uint64_t, double> result;
    std::istringstream in(text);
    for (unsigned long long size; in >> size;) {
        double mbps;
        if (in >> mbps) result[size] = mbps;
    }
    // Proof: the sending side's connection ran direct, and this protocol
    // carried most of its bytes.
    std::ifstream sf(stats);
    std::string line, proof;
    bool direct = false, ours = false;
    while (std::getline(sf, line)) {
        if (line.rfind("pid=", 0) != 0 || field(line, "tx_fabric").empty()) continue;
        const double fabric = std::strtod(field(line, "tx_fabric").c_str(), nullptr);
        if (fabric < 1e6) continue;  // the receiving side
        direct = field(line, "mode") == "direct";
        const char *key = !std::strcmp(protocol, "buffered") ? "tx_inline"
                          : !std::strcmp(protocol, "ring")   ? "tx_ring"
                                                             : "tx_zcopy";
        ours = std::strtod(field(line, key).c_str(), nullptr) > fabric / 2;
        proof = line;
    }
    unlink(stats);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        *error = "the measuring copy failed (status " + std::to_string(status) + ")";
    else if (proof.empty())
        *error = "no statistics from the library: is it preloaded (run under sdirect-run)?";
    else if (!direct)
        *error = "the connection did not run direct (mode " + field(proof, "mode") + ", reason " +
                 field(proof, "reason") + ")";
    else if (!ours)
        *error = std::string("the bytes did not go by ") + protocol + ": " + proof;
    if (!error->empty()) result.clear();
    return result;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void usage(std::FILE *f) {
    std::fputs(
        "usage: sdirect-run sdirect-tune [--out FILE] [--min BYTES] [--max BYTES]\n"
        "                                [--seconds S] [--repeats N]\n"
        "  Measures the stream bandwidth of each protocol (buffered, ring, zcopy) per\n"
        "  message size on this host and writes the table SDIRECT_PROTOCOLS=auto reads.\n"
        "  --out FILE   where (default: SDIRECT_TUNE_FILE, $HOME/.config/sdirect/protocols;\n"
        "               '-': standard output only)\n"
        "  --min, --max sizes measured, powers of two (default 4096 .. 4194304)\n"
        "  --seconds S  about this long per size and protocol (default 0.15)\n"
        "  --repeats N  runs per protocol; the median counts (default 3)\n",
        f);
}

bool number(const char *text, std::uint64_t *out) {
    char *end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(text, &end, 10);
    if (errno || end == text || *end) return false;
    *out = v;
    return true;
}

void make_parent_dirs(const std::string &path) {
    for (std::size_t at = path.find('/', 1); at != std::string::npos; at = path.find('/', at + 1))
        mkdir(path.substr(0, at).c_str(), 0755);
}

}  // namespace

int main(int argc, char **argv) {
    Options opt;
    bool measuring = false;
    for (int i = 1; i < argc; ++i) {
        std::string_view a = argv[i];
        const bool has_value = i + 1 < argc;
        std::uint64_t v = 0;
        if (a == "--measure") {
            measuring = true;
        } else if (a == "--out" && has_value) {
            opt.out = argv[++i];
        } else if ((a == "--min" || a == "--max" || a == "--repeats") && has_value &&
                   number(argv[i + 1], &v) && v > 0) {
            ++i;
            if (a == "--min") opt.min = v;
            else if (a == "--max") opt.max = v;
            else opt.repeats = int(std::min<std::uint64_t>(v, 99));
        } else if (a == "--seconds" && has_value && std::strtod(argv[i + 1], nullptr) > 0) {
            opt.seconds = std::strtod(argv[++i], nullptr);
        } else if (a == "-h" || a == "--help") {
            usage(stdout);
            return 0;
        } else {
            std::fprintf(stderr, "sdirect-tune: bad argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (opt.min > opt.max || opt.max > (256u << 20)) {
        std::fprintf(stderr, "sdirect-tune: sizes must satisfy min <= max <= 256 MiB\n");
        return 2;
    }
    if (measuring) return measure(opt);

    const char *preload = std::getenv("LD_PRELOAD");
    if (!preload || !std::strstr(preload, "libsdirect")) {
        std::fprintf(stderr, "sdirect-tune: libsdirect.so is not preloaded; run it as "
                             "'sdirect-run sdirect-tune'\n");
        return 2;
    }
    if (opt.out.empty()) {
        const char *f = std::getenv("SDIRECT_TUNE_FILE");
        const char *home = std::getenv("HOME");
        opt.out = f && *f ? f : std::string(home && *home ? home : "") + "/.config/sdirect/protocols";
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) die("readlink /proc/self/exe");
    self[n] = '\0';

    std::map<std::uint64_t, std::map<std::string, std::vector<double>>> runs;
    for (int r = 0; r < opt.repeats; ++r)
        for (Protocol proto : kProtocols) {
            const char *p = protocol_name(proto);
            std::string error;
            auto result = run_copy(self, opt, p, &error);
            if (!error.empty()) {
                std::fprintf(stderr, "sdirect-tune: %s: %s\n", p, error.c_str());
                return 1;
            }
            for (auto &[size, mbps] : result) runs[size][p].push_back(mbps);
            std::fprintf(stderr, "sdirect-tune: %s, run %d of %d done\n", p, r + 1, opt.repeats);
        }

    std::ostringstream table;
    time_t t = time(nullptr);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", gmtime(&t));
    table << "# sdirect-tune " << when << ": stream MB/s (10^6 B/s) per protocol, median of "
          << opt.repeats << " run(s), " << opt.seconds << " s per size\n";
    table << sd::transport::kTuneColumns << '\n';
    for (auto &[size, by] : runs) {
        Protocol best = Protocol::buffered;
        double top = -1;
        double mbps[3] = {-1, -1, -1};
        for (Protocol p : kProtocols) {
            auto it = by.find(protocol_name(p));
            if (it == by.end() || it->second.empty()) continue;
            mbps[int(p)] = median(it->second);
            if (mbps[int(p)] > top) {
                top = mbps[int(p)];
                best = p;
            }
        }
        table << sd::transport::format_tune_line(size, best, mbps) << '\n';
    }
    std::fputs(table.str().c_str(), stdout);
    if (opt.out == "-") return 0;
    make_parent_dirs(opt.out);
    const std::string tmp = opt.out + ".tmp";
    {
        std::ofstream f(tmp);
        f << table.str();
        if (!f.flush()) {
            std::fprintf(stderr, "sdirect-tune: cannot write %s\n", tmp.c_str());
            return 1;
        }
    }
    if (rename(tmp.c_str(), opt.out.c_str()) != 0) die("rename");
    std::fprintf(stderr, "sdirect-tune: wrote %s; use it with SDIRECT_PROTOCOLS=auto\n",
                 opt.out.c_str());
    return 0;
}
