// stdio over sockets. glibc's own streams read and write their descriptor
// with internal calls that no interposer sees, so the bytes of such a
// stream over a direct connection would bypass it. A stream over a socket
// of ours is therefore a cookie stream (fopencookie) whose reads, writes
// and close are this library's read, write and close of the same
// descriptor: it moves bytes as glibc's stream over that descriptor does
// (whole buffers, short counts and errors marked on the stream, EOF), in
// whatever mode the connection is, and fileno() gives the descriptor.
//
// - fdopen() of a socket of ours returns such a stream.
// - At start, stdin, stdout and stderr become such streams when fd 0, 1 or
//   2 is a TCP socket: a program started by inetd, git daemon, sshd or any
//   server that execs a handler on its connection writes its answer with
//   printf or fwrite.
// - dprintf() and vdprintf() to a socket of ours format, then write.
//
// Not covered: a stream pointer taken before the library's constructor ran
// (C++'s std::cout, set up by libstdc++'s own constructor, keeps glibc's
// stdout), and a stdout a program builds itself over fd 1 with glibc's
// internals.
#include "shim.hpp"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace sd::intercept;

extern "C" int __vasprintf_chk(char **, int, const char *, va_list);

namespace {

// glibc's flag for an error seen on a stream (ferror()), stable since the
// stream layout became public.
constexpr int kErrSeen = 0x20;

struct Cookie {
    int fd;
    FILE *fp;
};

ssize_t stream_read(void *cookie, char *buf, size_t n) {
    return read(static_cast<Cookie *>(cookie)->fd, buf, n);
}

// All of it, as glibc's stream writes: a short count only before an error,
// which is then marked on the stream.
ssize_t stream_write(void *cookie, const char *buf, size_t n) {
    auto *c = static_cast<Cookie *>(cookie);
    size_t done = 0;
    while (done < n) {
        const ssize_t w = write(c->fd, buf + done, n - done);
        if (w < 0) {
            if (done == 0) return -1;
            c->fp->_flags |= kErrSeen;
            break;
        }
        done += size_t(w);
    }
    return ssize_t(done);
}

// A socket has no position.
int stream_seek(void *, off64_t *, int) {
    errno = ESPIPE;
    return -1;
}

int stream_close(void *cookie) {
    const int fd = static_cast<Cookie *>(cookie)->fd;
    std::free(cookie);
    return close(fd);
}

// A cookie stream over `fd` with `mode` as fdopen() takes it; null and
// errno as fdopen() fails.
FILE *socket_stream(int fd, const char *mode) noexcept {
    if (!mode || (mode[0] != 'r' && mode[0] != 'w' && mode[0] != 'a')) {
        errno = EINVAL;
        return nullptr;
    }
    const int fl = sys.fcntl(fd, F_GETFL);
    if (fl < 0) return nullptr;
    // As fdopen() does for "a" (nothing a socket heeds).
    if (mode[0] == 'a' && !(fl & O_APPEND) && sys.fcntl(fd, F_SETFL, fl | O_APPEND) < 0)
        return nullptr;
    auto *c = static_cast<Cookie *>(std::malloc(sizeof(Cookie)));
    if (!c) {
        errno = ENOMEM;
        return nullptr;
    }
    c->fd = fd;
    const cookie_io_functions_t io{stream_read, stream_write, stream_seek, stream_close};
    FILE *f = fopencookie(c, mode, io);
    if (!f) {
        std::free(c);
        return nullptr;
    }
    c->fp = f;
    f->_fileno = fd;
    return f;
}

FILE *open_stream(int fd, const char *mode) noexcept {
    if (!table_frozen()) {
        CallRef s(fd);
        if (s) return socket_stream(fd, mode);
    }
    return sys.fdopen(fd, mode);
}

bool tcp_socket(int fd) noexcept {
    int type = 0, domain = 0;
    socklen_t len = sizeof type;
    if (sys.getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM)
        return false;
    len = sizeof domain;
    return sys.getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 &&
           (domain == AF_INET || domain == AF_INET6);
}

int write_formatted(int fd, char *text, int n) noexcept {
    if (n < 0) return -1;
    for (int done = 0; done < n;) {
        const ssize_t w = write(fd, text + done, size_t(n - done));
        if (w < 0) {
            std::free(text);
            return -1;
        }
        done += int(w);
    }
    std::free(text);
    return n;
}

}  // namespace

namespace sd::intercept {

void std_streams_init() noexcept {
    FILE **streams[3] = {&stdin, &stdout, &stderr};
    for (int fd = 0; fd < 3; ++fd) {
        if (!tcp_socket(fd)) continue;
        FILE *f = socket_stream(fd, fd == 0 ? "r" : "w");
        if (!f) continue;
        // stderr is unbuffered, the others fully buffered (as glibc's
        // streams over a socket).
        if (fd == 2) std::setvbuf(f, nullptr, _IONBF, 0);
        if (fd) std::fflush(*streams[fd]);
        *streams[fd] = f;
    }
}

}  // namespace sd::intercept

SD_EXPORT FILE *fdopen(int fd, const char *mode) noexcept { return open_stream(fd, mode); }

SD_EXPORT FILE *_IO_fdopen(int fd, const char *mode) noexcept { return open_stream(fd, mode); }

SD_EXPORT int vdprintf(int fd, const char *format, va_list ap) noexcept {
    if (!table_frozen()) {
        CallRef s(fd);
        char *text = nullptr;
        if (s) return write_formatted(fd, text, vasprintf(&text, format, ap));
    }
    return sys.vdprintf(fd, format, ap);
}

SD_EXPORT int dprintf(int fd, const char *format, ...) noexcept {
    va_list ap;
    va_start(ap, format);
    const int n = vdprintf(fd, format, ap);
    va_end(ap);
    return n;
}

SD_EXPORT int __vdprintf_chk(int fd, int flag, const char *format, va_list ap) noexcept {
    if (!table_frozen()) {
        CallRef s(fd);
        char *text = nullptr;
        if (s) return write_formatted(fd, text, __vasprintf_chk(&text, flag, format, ap));
    }
    return sys.vdprintf_chk(fd, flag, format, ap);
}

SD_EXPORT int __dprintf_chk(int fd, int flag, const char *format, ...) noexcept {
    va_list ap;
    va_start(ap, format);
    const int n = __vdprintf_chk(fd, flag, format, ap);
    va_end(ap);
    return n;
}
