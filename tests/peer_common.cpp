#include "peer_common.hpp"

#include <arpa/inet.h>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <spawn.h>
#include <netinet/in.h>
#include <csignal>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <string>
#include <vector>

namespace peer {

// ---- diagnostics -----------------------------------------------------------

namespace {

void vline(FILE *out, const char *prefix, const char *fmt, va_list ap) {
    char text[1024];
    std::vsnprintf(text, sizeof text, fmt, ap);
    // One fprintf per line keeps lines whole when threads report at once.
    std::fprintf(out, "%s%s\n", prefix, text);
    std::fflush(out);
}

}  // namespace

void fail(const char *fmt, ...) {
    char prefix[64];
    std::snprintf(prefix, sizeof prefix, "FAIL pid=%d: ", int(getpid()));
    va_list ap;
    va_start(ap, fmt);
    va_list copy;
    va_copy(copy, ap);
    vline(stdout, prefix, fmt, ap);
    vline(stderr, prefix, fmt, copy);
    va_end(copy);
    va_end(ap);
    // _exit: other threads may sit inside blocking calls; a failed run
    // needs no orderly teardown.
    _exit(1);
}

void skip(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vline(stdout, "SKIP: ", fmt, ap);
    va_end(ap);
    _exit(kExitSkip);
}

void note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vline(stdout, "", fmt, ap);
    va_end(ap);
}

const char *errno_name(int err) {
    const char *name = strerrorname_np(err);
    return name ? name : "E?";
}

std::uint64_t now_ns() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return std::uint64_t(ts.tv_sec) * 1000000000ull + std::uint64_t(ts.tv_nsec);
}

void sleep_us(std::uint64_t us) {
    timespec ts{time_t(us / 1000000), long(us % 1000000) * 1000};
    // Bounded: a signal shortens at most this one nap per iteration.
    for (int i = 0; i < 1000 && nanosleep(&ts, &ts) != 0 && errno == EINTR; ++i) {
    }
}

void arm_watchdog(unsigned seconds) { alarm(seconds); }

// ---- stream pattern --------------------------------------------------------

namespace {

std::uint64_t splitmix(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Byte o of stream `seed` is byte (o % 8) of word(o / 8).
std::uint64_t word(std::uint64_t key, std::uint64_t index) { return splitmix(key ^ index); }

}  // namespace

std::uint64_t mix(std::uint64_t a, std::uint64_t b) { return splitmix(a ^ splitmix(b)); }

void pattern_fill(std::uint64_t seed, std::uint64_t offset, void *buf, std::size_t len) {
    auto *out = static_cast<std::uint8_t *>(buf);
    const std::uint64_t key = splitmix(seed);
    std::size_t i = 0;
    while (i < len && ((offset + i) & 7) != 0) {
        std::uint64_t o = offset + i;
        out[i++] = std::uint8_t(word(key, o >> 3) >> ((o & 7) * 8));
    }
    for (; i + 8 <= len; i += 8) {
        std::uint64_t w = word(key, (offset + i) >> 3);
        std::memcpy(out + i, &w, 8);  // little-endian byte order = shift order
    }
    for (; i < len; ++i) {
        std::uint64_t o = offset + i;
        out[i] = std::uint8_t(word(key, o >> 3) >> ((o & 7) * 8));
    }
}

std::size_t pattern_check(std::uint64_t seed, std::uint64_t offset, const void *buf,
                          std::size_t len) {
    const auto *in = static_cast<const std::uint8_t *>(buf);
    std::uint8_t expect[4096];
    for (std::size_t done = 0; done < len;) {
        std::size_t n = len - done < sizeof expect ? len - done : sizeof expect;
        pattern_fill(seed, offset + done, expect, n);
        if (std::memcmp(expect, in + done, n) != 0) {
            for (std::size_t i = 0; i < n; ++i)
                if (expect[i] != in[done + i]) return done + i;
        }
        done += n;
    }
    return len;
}

void pattern_expect(std::uint64_t seed, std::uint64_t offset, const void *buf,
                    std::size_t len, const char *what) {
    std::size_t bad = pattern_check(seed, offset, buf, len);
    if (bad == len) return;
    std::uint8_t want = 0;
    pattern_fill(seed, offset + bad, &want, 1);
    fail("%s: wrong byte at stream offset %llu: got 0x%02x, expected 0x%02x "
         "(seed %llu, %zu bytes in this read)",
         what, (unsigned long long)(offset + bad),
         unsigned(static_cast<const std::uint8_t *>(buf)[bad]), unsigned(want),
         (unsigned long long)seed, len);
}

// ---- call families ---------------------------------------------------------

namespace {

constexpr const char *tx_names[] = {"write", "send", "writev", "sendmsg", "sendto", "writev-many"};
constexpr const char *rx_names[] = {"read", "recv", "readv", "recvmsg", "recvfrom", "readv-many"};
static_assert(sizeof(tx_names) / sizeof(tx_names[0]) == std::size_t(Tx::count));
static_assert(sizeof(rx_names) / sizeof(rx_names[0]) == std::size_t(Rx::count));

// Splits [buf, buf+len) into three iovecs (some may be empty).
int split3(iovec *iov, const void *buf, std::size_t len) {
    auto *p = static_cast<char *>(const_cast<void *>(buf));
    std::size_t a = len / 3, b = len / 3;
    iov[0] = {p, a};
    iov[1] = {p + a, b};
    iov[2] = {p + a + b, len - a - b};
    return 3;
}

// Splits [buf, buf+len) into up to kManyPieces iovecs of assorted sizes
// (empty ones among them); the last takes what is left.
constexpr int kManyPieces = 64;
int split_many(iovec *iov, const void *buf, std::size_t len) {
    static constexpr std::size_t sizes[] = {1, 0, 13, 200, 0, 7, 1500, 64, 3, 999, 2, 40};
    auto *p = static_cast<char *>(const_cast<void *>(buf));
    int n = 0;
    std::size_t at = 0;
    for (; n < kManyPieces - 1 && at < len; ++n) {
        std::size_t take = std::min(sizes[std::size_t(n) % std::size(sizes)], len - at);
        iov[n] = {p + at, take};
        at += take;
    }
    iov[n++] = {p + at, len - at};
    return n;
}

constexpr std::size_t kCountedFds = 8192;
std::atomic<std::uint64_t> tx_counts[kCountedFds];
std::atomic<std::uint64_t> rx_counts[kCountedFds];

}  // namespace

const char *tx_name(Tx api) { return tx_names[std::size_t(api) % std::size_t(Tx::count)]; }
const char *rx_name(Rx api) { return rx_names[std::size_t(api) % std::size_t(Rx::count)]; }

Tx parse_tx(const std::string &name) {
    for (std::size_t i = 0; i < std::size_t(Tx::count); ++i)
        if (name == tx_names[i]) return Tx(i);
    fail("unknown send family '%s'", name.c_str());
}

Rx parse_rx(const std::string &name) {
    for (std::size_t i = 0; i < std::size_t(Rx::count); ++i)
        if (name == rx_names[i]) return Rx(i);
    fail("unknown receive family '%s'", name.c_str());
}

ssize_t tx_once(int fd, Tx api, const void *buf, std::size_t len, int flags) {
    iovec iov[kManyPieces];
    switch (api) {
    case Tx::write: return write(fd, buf, len);
    case Tx::send: return send(fd, buf, len, flags);
    case Tx::sendto: return sendto(fd, buf, len, flags, nullptr, 0);
    case Tx::writev: return writev(fd, iov, split3(iov, buf, len));
    case Tx::writev_many: return writev(fd, iov, split_many(iov, buf, len));
    case Tx::sendmsg: {
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = std::size_t(split3(iov, buf, len));
        return sendmsg(fd, &msg, flags);
    }
    case Tx::count: break;
    }
    errno = EINVAL;
    return -1;
}

ssize_t rx_once(int fd, Rx api, void *buf, std::size_t len, int flags) {
    iovec iov[kManyPieces];
    switch (api) {
    case Rx::read: return read(fd, buf, len);
    case Rx::recv: return recv(fd, buf, len, flags);
    case Rx::readv: return readv(fd, iov, split3(iov, buf, len));
    case Rx::readv_many: return readv(fd, iov, split_many(iov, buf, len));
    case Rx::recvmsg: {
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = std::size_t(split3(iov, buf, len));
        return recvmsg(fd, &msg, flags);
    }
    case Rx::recvfrom: {
        sockaddr_storage from{};
        socklen_t fromlen = sizeof from;
        return recvfrom(fd, buf, len, flags, reinterpret_cast<sockaddr *>(&from), &fromlen);
    }
    case Rx::count: break;
    }
    errno = EINVAL;
    return -1;
}

void count_tx(int fd, std::uint64_t n) {
    if (fd >= 0 && std::size_t(fd) < kCountedFds) tx_counts[fd] += n;
}
void count_rx(int fd, std::uint64_t n) {
    if (fd >= 0 && std::size_t(fd) < kCountedFds) rx_counts[fd] += n;
}
std::uint64_t counted_tx(int fd) {
    return fd >= 0 && std::size_t(fd) < kCountedFds ? tx_counts[fd].load() : 0;
}
std::uint64_t counted_rx(int fd) {
    return fd >= 0 && std::size_t(fd) < kCountedFds ? rx_counts[fd].load() : 0;
}

void send_pattern(int fd, Tx api, std::uint64_t seed, std::uint64_t size,
                  std::uint32_t max_chunk, std::uint32_t gap_us) {
    if (max_chunk == 0) max_chunk = 65536;
    std::vector<std::uint8_t> buf(std::size_t(size < max_chunk ? size : max_chunk) + 1);
    std::uint64_t off = 0;
    for (std::uint64_t k = 0; off < size; ++k) {
        std::uint64_t chunk = 1 + mix(seed ^ 0xc0ffee, k) % max_chunk;
        if (chunk > size - off) chunk = size - off;
        pattern_fill(seed, off, buf.data(), std::size_t(chunk));
        std::size_t sent = 0;
        int interrupted = 0;
        while (sent < chunk) {
            ssize_t n = tx_once(fd, api, buf.data() + sent, std::size_t(chunk - sent), 0);
            if (n < 0 && errno == EINTR && ++interrupted < 1000) continue;
            if (n <= 0)
                fail("%s at stream offset %llu of %llu: returned %zd (%s)", tx_name(api),
                     (unsigned long long)(off + sent), (unsigned long long)size, n,
                     n < 0 ? errno_name(errno) : "nothing sent");
            sent += std::size_t(n);
            count_tx(fd, std::uint64_t(n));
        }
        off += chunk;
        if (gap_us && off < size) sleep_us(gap_us);
    }
}

void recv_pattern(int fd, Rx api, std::uint64_t seed, std::uint64_t size,
                  std::uint32_t max_chunk, const char *what) {
    if (max_chunk == 0) max_chunk = 65536;
    std::vector<std::uint8_t> buf(std::size_t(size < max_chunk ? size : max_chunk) + 1);
    std::uint64_t off = 0;
    int interrupted = 0;
    for (std::uint64_t k = 0; off < size; ++k) {
        std::uint64_t want = 1 + mix(seed ^ 0xbeef, k) % max_chunk;
        if (want > size - off) want = size - off;
        ssize_t n = rx_once(fd, api, buf.data(), std::size_t(want), 0);
        if (n < 0 && errno == EINTR && ++interrupted < 1000) continue;
        if (n == 0)
            fail("%s: %s returned EOF after %llu of %llu bytes", what, rx_name(api),
                 (unsigned long long)off, (unsigned long long)size);
        if (n < 0)
            fail("%s: %s failed after %llu of %llu bytes: %s", what, rx_name(api),
                 (unsigned long long)off, (unsigned long long)size, errno_name(errno));
        if (std::uint64_t(n) > want)
            fail("%s: %s returned %zd for a %llu-byte buffer", what, rx_name(api), n,
                 (unsigned long long)want);
        pattern_expect(seed, off, buf.data(), std::size_t(n), what);
        count_rx(fd, std::uint64_t(n));
        off += std::uint64_t(n);
    }
}

void write_all(int fd, const void *buf, std::size_t len) {
    const auto *p = static_cast<const char *>(buf);
    int interrupted = 0;
    for (std::size_t done = 0; done < len;) {
        ssize_t n = send(fd, p + done, len - done, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR && ++interrupted < 1000) continue;
        if (n <= 0) fail("send of %zu bytes: %s", len, n < 0 ? errno_name(errno) : "0");
        done += std::size_t(n);
        count_tx(fd, std::uint64_t(n));
    }
}

void send_whole(int fd, std::uint64_t seed, std::uint64_t size) {
    std::vector<char> buf(std::size_t(size) + 1);
    pattern_fill(seed, 0, buf.data(), std::size_t(size));
    write_all(fd, buf.data(), std::size_t(size));
}

bool read_all_or_eof(int fd, void *buf, std::size_t len, const char *what) {
    auto *p = static_cast<char *>(buf);
    int interrupted = 0;
    for (std::size_t done = 0; done < len;) {
        ssize_t n = recv(fd, p + done, len - done, 0);
        if (n < 0 && errno == EINTR && ++interrupted < 1000) continue;
        if (n == 0 && done == 0) return false;
        if (n == 0) fail("%s: EOF after %zu of %zu bytes", what, done, len);
        if (n < 0) fail("%s: recv: %s", what, errno_name(errno));
        done += std::size_t(n);
        count_rx(fd, std::uint64_t(n));
    }
    return true;
}

void read_all(int fd, void *buf, std::size_t len, const char *what) {
    if (!read_all_or_eof(fd, buf, len, what)) fail("%s: unexpected EOF", what);
}

void expect_eof(int fd, const char *what) {
    char c;
    ssize_t n = recv(fd, &c, 1, 0);
    if (n != 0)
        fail("%s: expected EOF, recv returned %zd (%s)", what, n,
             n < 0 ? errno_name(errno) : "data");
}

// ---- commands ----------------------------------------------------------------

void send_cmd(int fd, const Cmd &cmd) { write_all(fd, &cmd, sizeof cmd); }

pid_t spawn_plain_cat(const char *cat, int fd) {
    std::vector<char *> env;
    for (char **e = environ; *e; ++e)
        if (std::strncmp(*e, "LD_PRELOAD=", 11) != 0 && std::strncmp(*e, "SDIRECT_", 8) != 0)
            env.push_back(*e);
    env.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd, 0);
    posix_spawn_file_actions_adddup2(&fa, fd, 1);
    char *argv[] = {const_cast<char *>(cat), nullptr};
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, cat, &fa, nullptr, argv, env.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) fail("posix_spawn %s: %s", cat, errno_name(rc));
    return pid;
}

void expect_ack(int fd, const char *what) {
    char c = 0;
    read_all(fd, &c, 1, what);
    if (c != 'A') fail("%s: expected ack 'A', got 0x%02x", what, unsigned(std::uint8_t(c)));
}

// ---- options and connections -----------------------------------------------

std::string Options::get(const std::string &key, const std::string &fallback) const {
    auto it = kv.find(key);
    return it == kv.end() ? fallback : it->second;
}

std::uint64_t Options::num(const std::string &key, std::uint64_t fallback) const {
    auto it = kv.find(key);
    if (it == kv.end()) return fallback;
    char *end = nullptr;
    unsigned long long v = std::strtoull(it->second.c_str(), &end, 0);
    if (end == it->second.c_str() || *end) fail("--%s: not a number: %s", key.c_str(),
                                                it->second.c_str());
    return v;
}

int family_of(const Options &opt) {
    std::string f = opt.get("family", "4");
    if (f == "4") return AF_INET;
    if (f == "6") return AF_INET6;
    fail("--family must be 4 or 6, not %s", f.c_str());
}

socklen_t loopback_addr(int family, std::uint16_t port, sockaddr_storage *ss) {
    std::memset(ss, 0, sizeof *ss);
    if (family == AF_INET6) {
        auto *a = reinterpret_cast<sockaddr_in6 *>(ss);
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_loopback;
        a->sin6_port = htons(port);
        return sizeof *a;
    }
    auto *a = reinterpret_cast<sockaddr_in *>(ss);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a->sin_port = htons(port);
    return sizeof *a;
}

int listen_loopback(int family, int backlog, std::uint16_t *port) {
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        if (family == AF_INET6 && errno == EAFNOSUPPORT) skip("no IPv6 on this machine");
        fail("socket: %s", errno_name(errno));
    }
    sockaddr_storage ss;
    socklen_t len = loopback_addr(family, 0, &ss);
    if (bind(fd, reinterpret_cast<sockaddr *>(&ss), len) != 0) {
        if (family == AF_INET6 && (errno == EADDRNOTAVAIL || errno == EAFNOSUPPORT))
            skip("::1 is not configured");
        fail("bind loopback: %s", errno_name(errno));
    }
    if (listen(fd, backlog) != 0) fail("listen: %s", errno_name(errno));
    len = sizeof ss;
    if (getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len) != 0)
        fail("getsockname: %s", errno_name(errno));
    *port = family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_port)
                               : ntohs(reinterpret_cast<sockaddr_in *>(&ss)->sin_port);
    return fd;
}

void write_port_file(const std::string &path, std::uint16_t port) {
    std::string tmp = path + ".tmp";
    FILE *f = std::fopen(tmp.c_str(), "w");
    if (!f) fail("cannot write %s: %s", tmp.c_str(), errno_name(errno));
    std::fprintf(f, "%u\n", unsigned(port));
    if (std::fclose(f) != 0) fail("cannot write %s", tmp.c_str());
    // rename is atomic: the harness never reads a half-written port.
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
        fail("rename %s: %s", path.c_str(), errno_name(errno));
}

namespace {
std::uint64_t first_connect_ns = 0;  // before the process's first connect()
}  // namespace

int connect_loopback(int family, std::uint16_t port) {
    if (!first_connect_ns) first_connect_ns = now_ns();
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fail("socket: %s", errno_name(errno));
    sockaddr_storage ss;
    socklen_t len = loopback_addr(family, port, &ss);
    if (connect(fd, reinterpret_cast<sockaddr *>(&ss), len) != 0)
        fail("connect to loopback port %u: %s", unsigned(port), errno_name(errno));
    return fd;
}

std::string endpoint_text(const sockaddr *sa) {
    char text[INET6_ADDRSTRLEN] = "?";
    char out[INET6_ADDRSTRLEN + 16];
    if (sa->sa_family == AF_INET6) {
        const auto *a = reinterpret_cast<const sockaddr_in6 *>(sa);
        inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text);
        std::snprintf(out, sizeof out, "[%s]:%u", text, unsigned(ntohs(a->sin6_port)));
    } else if (sa->sa_family == AF_INET) {
        const auto *a = reinterpret_cast<const sockaddr_in *>(sa);
        inet_ntop(AF_INET, &a->sin_addr, text, sizeof text);
        std::snprintf(out, sizeof out, "%s:%u", text, unsigned(ntohs(a->sin_port)));
    } else {
        std::snprintf(out, sizeof out, "family%d", int(sa->sa_family));
    }
    return out;
}

std::string local_text(int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len) != 0) return "?";
    return endpoint_text(reinterpret_cast<sockaddr *>(&ss));
}

std::string peer_text(int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &len) != 0) return "?";
    return endpoint_text(reinterpret_cast<sockaddr *>(&ss));
}

void report_conn(int fd, const char *role) {
    note("conn pid=%d role=%s local=%s peer=%s", int(getpid()), role,
         local_text(fd).c_str(), peer_text(fd).c_str());
}

void report_bytes(int fd) {
    note("bytes pid=%d local=%s peer=%s tx=%llu rx=%llu", int(getpid()),
         local_text(fd).c_str(), peer_text(fd).c_str(),
         (unsigned long long)counted_tx(fd), (unsigned long long)counted_rx(fd));
}

void settle_client(int fd, std::uint32_t settle_ms, bool paced) {
    char hello[8];
    write_all(fd, "SDHELLO1", 8);
    read_all(fd, hello, 8, "hello");
    if (std::memcmp(hello, "SDHELLO2", 8) != 0) fail("bad hello from server");
    // Connections of the parallel scenarios settle from several threads.
    static std::atomic<bool> first{true};
    if (first_connect_ns && first.exchange(false)) {
        const char *reg = std::getenv("SDIRECT_REGISTRY");
        const std::string page =
            std::string(reg && *reg ? reg : "/nonexistent") + "/p" + std::to_string(getpid());
        note("first-exchange us=%llu engine=%d",
             (unsigned long long)((now_ns() - first_connect_ns) / 1000),
             access(page.c_str(), F_OK) == 0 ? 1 : 0);
    }
    const std::uint64_t end = now_ns() + std::uint64_t(settle_ms) * 1000000ull;
    char c;
    for (int round = 0; round < 200000 && now_ns() < end; ++round) {
        if (paced) sleep_us(1000);
        write_all(fd, "p", 1);
        read_all(fd, &c, 1, "settle");
        if (c != 'p') fail("settle: expected 'p', got 0x%02x", unsigned(std::uint8_t(c)));
    }
    write_all(fd, "q", 1);
    read_all(fd, &c, 1, "settle end");
    if (c != 'q') fail("settle: expected 'q', got 0x%02x", unsigned(std::uint8_t(c)));
}

void settle_server(int fd) {
    char hello[8];
    read_all(fd, hello, 8, "hello");
    if (std::memcmp(hello, "SDHELLO1", 8) != 0) fail("bad hello from client");
    write_all(fd, "SDHELLO2", 8);
    for (int round = 0; round <= 200000; ++round) {
        char c;
        read_all(fd, &c, 1, "settle");
        write_all(fd, &c, 1);
        if (c == 'q') return;
        if (c != 'p') fail("settle: unexpected byte 0x%02x", unsigned(std::uint8_t(c)));
    }
    fail("settle: client never ended the ping-pong");
}

// An unlinked regular file holding `size` bytes of stream `seed`.
int pattern_file(std::uint64_t seed, std::uint64_t size) {
    const char *dir = std::getenv("TMPDIR");
    std::string path = std::string(dir && *dir ? dir : "/tmp") + "/sdirect-sendfile-XXXXXX";
    std::vector<char> name(path.begin(), path.end());
    name.push_back('\0');
    int f = mkostemp(name.data(), O_CLOEXEC);
    if (f < 0) fail("mkostemp %s: %s", path.c_str(), errno_name(errno));
    unlink(name.data());
    std::vector<char> buf(1 << 20);
    for (std::uint64_t off = 0; off < size;) {
        const std::size_t n = std::size_t(std::min<std::uint64_t>(buf.size(), size - off));
        pattern_fill(seed, off, buf.data(), n);
        if (pwrite(f, buf.data(), n, off_t(off)) != ssize_t(n)) fail("pwrite: %s", errno_name(errno));
        off += n;
    }
    return f;
}

off_t file_position(int f) { return lseek(f, 0, SEEK_CUR); }

void reap(pid_t pid, const char *what, int sig) {
    int status = 0;
    pid_t got = 0;
    for (int i = 0; i < 2500 && (got = waitpid(pid, &status, WNOHANG)) == 0; ++i) sleep_us(10000);
    if (got != pid) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail("%s (pid %d) did not end within 25 s", what, int(pid));
    }
    const bool ok = sig ? WIFSIGNALED(status) && WTERMSIG(status) == sig
                        : WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) fail("%s (pid %d) ended with status 0x%x", what, int(pid), unsigned(status));
}

}  // namespace peer
