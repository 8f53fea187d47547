// read/write, recv/send and friends: each builds an iovec and calls the
// stream's one recv or send.
// Our symbols must keep their plain names (fcntl, sendfile), not the
// *64 names glibc redirects them to under _FILE_OFFSET_BITS=64.
#undef _FILE_OFFSET_BITS
#include "shim.hpp"
#include "transport/memguard.hpp"

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

using namespace sd::intercept;
using sd::transport::readable;
using sd::transport::writable;

extern "C" [[noreturn]] void __chk_fail(void);

namespace {

ssize_t recv_one(Held &s, void *buf, size_t len, int flags) noexcept {
    iovec v{buf, len};
    return ret(s->recv(&v, 1, flags));
}

ssize_t send_one(Held &s, const void *buf, size_t len, int flags) noexcept {
    iovec v{const_cast<void *>(buf), len};
    return ret(s->send(&v, 1, flags));
}

// recvmsg on a stream socket reports no address and no control data.
ssize_t recv_msg(Held &s, msghdr *m, int flags) noexcept {
    ssize_t n = ret(s->recv(m->msg_iov, int(m->msg_iovlen), flags));
    if (n >= 0) {
        m->msg_namelen = 0;
        m->msg_controllen = 0;
        m->msg_flags = 0;
    }
    return n;
}

}  // namespace

SD_EXPORT ssize_t read(int fd, void *buf, size_t len) {
    Held s(fd);
    if (!s) return sys.read(fd, buf, len);
    // A socket's read of nothing returns at once (a recv of nothing waits
    // for data, so it must not become one).
    if (len == 0) return 0;
    return recv_one(s, buf, len, 0);
}

SD_EXPORT ssize_t __read_chk(int fd, void *buf, size_t len, size_t buflen) {
    if (len > buflen) __chk_fail();
    return read(fd, buf, len);
}

SD_EXPORT ssize_t write(int fd, const void *buf, size_t len) {
    Held s(fd);
    if (!s) return sys.write(fd, buf, len);
    return send_one(s, buf, len, 0);
}

SD_EXPORT ssize_t readv(int fd, const iovec *iov, int iovcnt) {
    Held s(fd);
    // Bad arguments: the kernel gives the answer (EINVAL, EFAULT).
    if (!s || iovcnt < 0 || iovcnt > IOV_MAX || !readable(iov, sizeof *iov * size_t(iovcnt)))
        return sys.readv(fd, iov, iovcnt);
    size_t total = 0;
    for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
    if (total == 0) return 0;  // as read() of nothing
    return ret(s->recv(iov, iovcnt, 0));
}

SD_EXPORT ssize_t writev(int fd, const iovec *iov, int iovcnt) {
    Held s(fd);
    if (!s || iovcnt < 0 || iovcnt > IOV_MAX || !readable(iov, sizeof *iov * size_t(iovcnt)))
        return sys.writev(fd, iov, iovcnt);
    return ret(s->send(iov, iovcnt, 0));
}

SD_EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags) {
    Held s(fd);
    if (!s) return sys.recv(fd, buf, len, flags);
    return recv_one(s, buf, len, flags);
}

SD_EXPORT ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags) {
    if (len > buflen) __chk_fail();
    return recv(fd, buf, len, flags);
}

SD_EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags) {
    Held s(fd);
    if (!s) return sys.send(fd, buf, len, flags);
    return send_one(s, buf, len, flags);
}

SD_EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, sockaddr *addr,
                           socklen_t *alen) {
    Held s(fd);
    if (!s) return sys.recvfrom(fd, buf, len, flags, addr, alen);
    ssize_t n = recv_one(s, buf, len, flags);
    if (n >= 0 && addr && alen) *alen = 0;  // as the kernel does for TCP
    return n;
}

SD_EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags,
                                 sockaddr *addr, socklen_t *alen) {
    if (len > buflen) __chk_fail();
    return recvfrom(fd, buf, len, flags, addr, alen);
}

SD_EXPORT ssize_t sendto(int fd, const void *buf, size_t len, int flags, const sockaddr *addr,
                         socklen_t alen) {
    Held s(fd);
    if (!s) return sys.sendto(fd, buf, len, flags, addr, alen);
    return send_one(s, buf, len, flags);
}

SD_EXPORT ssize_t recvmsg(int fd, msghdr *m, int flags) {
    Held s(fd);
    // The error queue is the kernel socket's, with its control data.
    if (!s || (flags & MSG_ERRQUEUE) || !writable(m, sizeof *m) || m->msg_iovlen > IOV_MAX ||
        !readable(m->msg_iov, sizeof(iovec) * m->msg_iovlen))
        return sys.recvmsg(fd, m, flags);
    return recv_msg(s, m, flags);
}

SD_EXPORT ssize_t sendmsg(int fd, const msghdr *m, int flags) {
    Held s(fd);
    if (!s || !readable(m, sizeof *m) || m->msg_iovlen > IOV_MAX ||
        !readable(m->msg_iov, sizeof(iovec) * m->msg_iovlen))
        return sys.sendmsg(fd, m, flags);
    return ret(s->send(m->msg_iov, int(m->msg_iovlen), flags));
}

// sendfile into a socket: the bytes must enter the stream through the
// stream's own send, or they would bypass a direct connection.
namespace {
// The stream's bytes must go through the stream (counted, switched): any
// connection that is or may become direct.
bool through_stream(Held &s) noexcept {
    return s && s->may_go_direct();
}

ssize_t sendfile_any(int out, int in, off_t *offset, size_t count) noexcept {
    Held s(out);
    if (!through_stream(s)) return sys.sendfile(out, in, offset, count);
    char buf[65536];
    size_t done = 0;
    while (done < count) {
        size_t want = count - done < sizeof buf ? count - done : sizeof buf;
        ssize_t r = offset ? pread(in, buf, want, *offset + off_t(done)) : sys.read(in, buf, want);
        if (r < 0) {
            if (done) break;
            return -1;
        }
        if (r == 0) break;
        iovec v{buf, size_t(r)};
        ssize_t w = s->send(&v, 1, 0);
        if (w < 0) {
            if (!done) return ret(w);
            if (!offset) lseek(in, -r, SEEK_CUR);
            break;
        }
        done += size_t(w);
        if (w < r) {
            if (!offset) lseek(in, w - r, SEEK_CUR);
            break;
        }
    }
    if (offset) *offset += off_t(done);
    return ssize_t(done);
}

}  // namespace

SD_EXPORT ssize_t sendfile(int out, int in, off_t *offset, size_t count) {
    return sendfile_any(out, in, offset, count);
}

SD_EXPORT ssize_t sendfile64(int out, int in, off_t *offset, size_t count) {
    return sendfile_any(out, in, offset, count);
}

// splice between a pipe and one of our sockets: through a buffer and the
// stream's own send/recv. Socket to pipe takes no more than the pipe has
// room for, so nothing read from the stream is left over; pipe to socket
// sends everything it read (blocking for it if it must).
SD_EXPORT ssize_t splice(int in, loff_t *off_in, int out, loff_t *off_out, size_t len,
                         unsigned flags) {
    Held to(out), from(in);
    const bool into = through_stream(to), outof = through_stream(from);
    if (!into && !outof) return sys.splice(in, off_in, out, off_out, len, flags);
    if ((into && off_out) || (outof && off_in)) return errno = ESPIPE, -1;
    if (len == 0) return 0;
    char buf[65536];
    const bool nb = flags & SPLICE_F_NONBLOCK;
    if (outof) {
        int size = fcntl(out, F_GETPIPE_SZ), queued = 0;
        if (size < 0) return errno = EINVAL, -1;  // the other end must be a pipe
        for (;;) {
            if (ioctl(out, FIONREAD, &queued) != 0) return -1;
            if (queued < size) break;
            if (nb) return errno = EAGAIN, -1;
            pollfd p{out, POLLOUT, 0};
            if (sys.poll(&p, 1, -1) < 0) return -1;
        }
        std::size_t want = std::min({len, sizeof buf, std::size_t(size - queued)});
        iovec v{buf, want};
        ssize_t n = ret(from->recv(&v, 1, nb ? MSG_DONTWAIT : 0));
        if (n <= 0) return n;
        for (ssize_t at = 0; at < n;) {
            ssize_t w = sys.write(out, buf + at, std::size_t(n - at));
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) return at ? at : -1;
            at += w;
        }
        return n;
    }
    struct stat st;
    if (fstat(in, &st) != 0) return -1;
    if (!S_ISFIFO(st.st_mode)) return errno = EINVAL, -1;
    ssize_t n;
    for (;;) {
        n = off_in ? pread(in, buf, std::min(len, sizeof buf), *off_in)
                   : sys.read(in, buf, std::min(len, sizeof buf));
        if (n >= 0 || errno != EINTR) break;
    }
    if (n <= 0) return n;
    if (off_in) *off_in += n;
    ssize_t at = 0;
    while (at < n) {
        iovec v{buf + at, std::size_t(n - at)};
        ssize_t w = to->send(&v, 1, 0);
        if (w == -EINTR) continue;
        if (w < 0) return at ? at : ret(w);
        at += w;
    }
    return n;
}
