// The one-shot half of the soak: a fresh client process per connection
// (the way short-lived clients such as redis-cli or psql run), some of
// them killed mid-request, against one long-lived server.
//
// A client sends a 16-byte header (seed, length) and `length` bytes of the
// seed's stream; the server checks them and answers `length` bytes of
// another stream; the client checks those and the EOF after them.
#include "soak.hpp"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <vector>

namespace soak {
namespace {

constexpr std::uint64_t kReplyKey = 0x7265706c79ull;  // the answer's stream differs

bool read_full(int fd, void *buf, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
        const ssize_t r = ::recv(fd, static_cast<char *>(buf) + got, n - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        got += std::size_t(r);
    }
    return true;
}

bool send_stream(int fd, std::uint64_t seed, std::uint64_t len) {
    std::vector<unsigned char> buf(256 << 10);
    std::uint64_t off = 0;
    while (off < len) {
        const std::size_t n = std::size_t(std::min<std::uint64_t>(buf.size(), len - off));
        stream_fill(seed, off, buf.data(), n);
        std::size_t done = 0;
        while (done < n) {
            const ssize_t r = ::send(fd, buf.data() + done, n - done, MSG_NOSIGNAL);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return false;
            done += std::size_t(r);
        }
        off += n;
    }
    return true;
}

// 0: all checked; 1: a wrong byte (at *bad); 2: the stream ended early
// (EOF, or an error); 3: no byte within the receive timeout (EAGAIN). errno
// means something only after a call that failed: a recv that returned 0
// may leave any value there.
int check_stream(int fd, std::uint64_t seed, std::uint64_t len, std::uint64_t *bad) {
    std::vector<unsigned char> buf(256 << 10);
    std::uint64_t off = 0;
    while (off < len) {
        const ssize_t r = ::recv(fd, buf.data(), std::size_t(std::min<std::uint64_t>(buf.size(), len - off)), 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 3;
        if (r <= 0) return 2;
        const std::size_t ok = stream_check(seed, off, buf.data(), std::size_t(r));
        if (ok != std::size_t(r)) {
            *bad = off + ok;
            return 1;
        }
        off += std::uint64_t(r);
    }
    return 0;
}

struct Conn {
    int fd;
    Shared *shared;
};

void *serve(void *arg) {
    const Conn c = *static_cast<Conn *>(arg);
    delete static_cast<Conn *>(arg);
    timeval tv{20, 0};
    ::setsockopt(c.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(c.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    std::uint64_t header[2];
    std::uint64_t bad = 0;
    if (!read_full(c.fd, header, sizeof header)) {
        c.shared->os_aborted++;
    } else if (header[1] > (1ull << 30)) {
        c.shared->os_wrong++;
        std::snprintf(c.shared->os_error, sizeof c.shared->os_error, "header: length %llu",
                      (unsigned long long)header[1]);
    } else {
        const int rc = check_stream(c.fd, header[0], header[1], &bad);
        if (rc == 1) {
            c.shared->os_wrong++;
            std::snprintf(c.shared->os_error, sizeof c.shared->os_error,
                          "server: wrong byte at offset %llu of %llu", (unsigned long long)bad,
                          (unsigned long long)header[1]);
        } else if (rc == 3) {
            c.shared->os_wrong++;
            std::snprintf(c.shared->os_error, sizeof c.shared->os_error,
                          "server: no byte for 20 s from a client");
        } else if (rc == 2) {
            c.shared->os_aborted++;
        } else {
            c.shared->os_bytes += header[1];
            if (send_stream(c.fd, header[0] ^ kReplyKey, header[1])) c.shared->os_ok++;
            else c.shared->os_aborted++;
        }
    }
    ::close(c.fd);
    return nullptr;
}

}  // namespace

int oneshot_server(int listen_fd, Shared *shared, int seconds) {
    ::signal(SIGPIPE, SIG_IGN);
    timeval start;
    gettimeofday(&start, nullptr);
    while (!shared->os_stop) {
        timeval now;
        gettimeofday(&now, nullptr);
        if (now.tv_sec - start.tv_sec > seconds) break;
        pollfd p{listen_fd, POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) continue;
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_create(&t, &attr, serve, new Conn{fd, shared});
        pthread_attr_destroy(&attr);
    }
    // Let the connections under way end (each is bounded by its timeouts).
    ::sleep(1);
    return 0;
}

int oneshot_client(unsigned short port, std::uint64_t seed, std::uint64_t len) {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(port);
    if (::connect(s, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0) {
        std::fprintf(stderr, "client: connect: %s\n", std::strerror(errno));
        return 2;
    }
    const std::uint64_t header[2] = {seed, len};
    if (::send(s, header, sizeof header, MSG_NOSIGNAL) != ssize_t(sizeof header) || !send_stream(s, seed, len)) {
        std::fprintf(stderr, "client: send: %s\n", std::strerror(errno));
        return 2;
    }
    std::uint64_t bad = 0;
    const int rc = check_stream(s, seed ^ kReplyKey, len, &bad);
    if (rc == 1) {
        std::fprintf(stderr, "client: wrong byte at offset %llu of %llu\n", (unsigned long long)bad,
                     (unsigned long long)len);
        return 1;
    }
    if (rc >= 2) {
        std::fprintf(stderr, "client: answer ended early%s\n", rc == 3 ? ": no byte in time" : "");
        return 2;
    }
    char extra;
    const ssize_t r = ::recv(s, &extra, 1, 0);
    if (r != 0) {
        std::fprintf(stderr, "client: %s after the answer\n", r > 0 ? "bytes" : "an error instead of EOF");
        return 1;
    }
    ::close(s);
    return 0;
}

}  // namespace soak
