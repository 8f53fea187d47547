// read/write, recv/send and friends: each builds an iovec and calls the
// stream's one recv or send.
// Our symbols must keep their plain names (fcntl, sendfile), not the
// *64 names glibc redirects them to under _FILE_OFFSET_BITS=64.
#undef _FILE_OFFSET_BITS
#include "shim.hpp"
#include "fork_protocol/for_good.hpp"
#include "transport/memguard.hpp"
#include "transport/wait.hpp"

#include <algorithm>
#include <dlfcn.h>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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

// A message that passes fds (SCM_RIGHTS, on a Unix socket): every one of
// ours among them goes to the kernel for good before the message leaves,
// so the receiving process, which knows nothing of our connection, and we
// both hold a plain TCP socket.
void pass_fds(const msghdr *m) noexcept {
    if (!m || sd::transport::guarded() || !readable(m, sizeof *m) || !m->msg_control ||
        m->msg_controllen < sizeof(cmsghdr) || !readable(m->msg_control, m->msg_controllen))
        return;
    for (cmsghdr *h = CMSG_FIRSTHDR(m); h; h = CMSG_NXTHDR(const_cast<msghdr *>(m), h)) {
        if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS || h->cmsg_len < CMSG_LEN(0))
            continue;
        // Within the buffer, whatever cmsg_len says (the kernel checks it).
        const auto *data = reinterpret_cast<const char *>(CMSG_DATA(h));
        const auto *end = static_cast<const char *>(m->msg_control) + m->msg_controllen;
        const std::size_t room = data < end ? std::size_t(end - data) : 0;
        const int n = int(std::min<std::size_t>(h->cmsg_len - CMSG_LEN(0), room) / sizeof(int));
        int fds[64];
        for (int at = 0; at < n; at += 64) {
            const int k = std::min(64, n - at);
            std::memcpy(fds, data + sizeof(int) * std::size_t(at), sizeof(int) * std::size_t(k));
            sd::forking::table_to_kernel_for_good(fds, k, sd::transport::Reason::passed);
        }
    }
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
    pass_fds(m);
    Held s(fd);
    if (!s || !readable(m, sizeof *m) || m->msg_iovlen > IOV_MAX ||
        !readable(m->msg_iov, sizeof(iovec) * m->msg_iovlen))
        return sys.sendmsg(fd, m, flags);
    return ret(s->send(m->msg_iov, int(m->msg_iovlen), flags));
}

// sendmmsg and recvmmsg: each message through the stream's one send or
// recv, with the kernel's rules for a stream socket: messages are taken in
// order until one fails or comes out short; the count of those done is the
// answer (an error only when the first one fails). recvmmsg's
// MSG_WAITFORONE turns the calls after the first message non-blocking, and
// its timeout is looked at after each message, as the kernel does.
namespace {

int (*real_sendmmsg)(int, mmsghdr *, unsigned, int) = nullptr;
int (*real_recvmmsg)(int, mmsghdr *, unsigned, int, timespec *) = nullptr;

__attribute__((constructor(102))) void resolve_mmsg() {
    real_sendmmsg = reinterpret_cast<decltype(real_sendmmsg)>(dlsym(RTLD_NEXT, "sendmmsg"));
    real_recvmmsg = reinterpret_cast<decltype(real_recvmmsg)>(dlsym(RTLD_NEXT, "recvmmsg"));
}

int kernel_sendmmsg(int fd, mmsghdr *v, unsigned n, int flags) noexcept {
    return real_sendmmsg ? real_sendmmsg(fd, v, n, flags)
                         : int(syscall(SYS_sendmmsg, fd, v, n, flags));
}

int kernel_recvmmsg(int fd, mmsghdr *v, unsigned n, int flags, timespec *t) noexcept {
    return real_recvmmsg ? real_recvmmsg(fd, v, n, flags, t)
                         : int(syscall(SYS_recvmmsg, fd, v, n, flags, t));
}

constexpr unsigned kMaxMmsg = 1024;  // the kernel's UIO_MAXIOV

bool usable(const msghdr &m) noexcept {
    return m.msg_iovlen <= IOV_MAX && readable(m.msg_iov, sizeof(iovec) * m.msg_iovlen);
}

std::size_t msg_bytes(const msghdr &m) noexcept {
    std::size_t t = 0;
    for (std::size_t i = 0; i < m.msg_iovlen; ++i) t += m.msg_iov[i].iov_len;
    return t;
}

}  // namespace

SD_EXPORT int sendmmsg(int fd, mmsghdr *v, unsigned n, int flags) {
    n = std::min(n, kMaxMmsg);
    if (v && readable(v, sizeof *v * n))
        for (unsigned i = 0; i < n; ++i) pass_fds(&v[i].msg_hdr);
    Held s(fd);
    if (!s || !v || !writable(v, sizeof *v * n)) return kernel_sendmmsg(fd, v, n, flags);
    unsigned done = 0;
    ssize_t r = 0;
    for (; done < n; ++done) {
        msghdr &m = v[done].msg_hdr;
        r = usable(m) ? s->send(m.msg_iov, int(m.msg_iovlen), flags) : -EFAULT;
        if (r < 0) break;
        v[done].msg_len = unsigned(r);
        if (std::size_t(r) < msg_bytes(m)) {
            ++done;
            break;
        }
    }
    if (done) return int(done);
    return int(ret(r));
}

SD_EXPORT int recvmmsg(int fd, mmsghdr *v, unsigned n, int flags, timespec *timeout) {
    Held s(fd);
    n = std::min(n, kMaxMmsg);
    if (!s || !v || !writable(v, sizeof *v * n) || (timeout && !writable(timeout, sizeof *timeout)))
        return kernel_recvmmsg(fd, v, n, flags, timeout);
    if (timeout && (timeout->tv_sec < 0 || timeout->tv_nsec < 0 || timeout->tv_nsec >= 1000000000))
        return errno = EINVAL, -1;
    const std::uint64_t end =
        timeout ? sd::transport::monotonic_ns() + std::uint64_t(timeout->tv_sec) * 1000000000u +
                      std::uint64_t(timeout->tv_nsec)
                : 0;
    unsigned done = 0;
    ssize_t r = 0;
    int each = flags & ~MSG_WAITFORONE;
    while (done < n) {
        msghdr &m = v[done].msg_hdr;
        r = usable(m) ? s->recv(m.msg_iov, int(m.msg_iovlen), each) : -EFAULT;
        if (r < 0) break;
        m.msg_namelen = 0;
        m.msg_controllen = 0;
        m.msg_flags = 0;
        v[done++].msg_len = unsigned(r);
        if (flags & MSG_WAITFORONE) each |= MSG_DONTWAIT;
        if (timeout) {
            const std::uint64_t now = sd::transport::monotonic_ns();
            const std::uint64_t left = now < end ? end - now : 0;
            timeout->tv_sec = time_t(left / 1000000000u);
            timeout->tv_nsec = long(left % 1000000000u);
            if (!left) break;
        }
    }
    if (done) return int(done);
    return int(ret(r));
}

// sendfile into a socket: the bytes must enter the stream through the
// stream's own send, or they would bypass a direct connection.
namespace {
// The stream's bytes must go through the stream (counted, switched): any
// connection that is or may become direct. An inherited socket whose
// owner is still direct is claimed first (the owner moves it to the
// kernel): from then on this process counts what it moves, and the
// counts are where the last holder upgrades it again; a sendfile of its
// bytes straight into the kernel would shift every later offset. A claim
// that fails leaves the stream to answer (EIO, or a reset where the owner
// died first), as a send would.
bool through_stream(Held &s) noexcept {
    if (!s) return false;
    if (!s->claim_inherited()) return true;
    return s->may_go_direct();
}

// The kernel moves at most this much in one call.
constexpr std::size_t kMaxRw = 0x7ffff000;

// The file is read with pread at an explicit position and its offset (the
// fd's own, or *offset) moves by exactly what the socket took: a
// non-blocking socket that takes less, or nothing (EAGAIN), leaves the
// rest of the file where it was, as the kernel's sendfile does.
ssize_t sendfile_any(int out, int in, off_t *offset, size_t count) noexcept {
    Held s(out);
    if (!through_stream(s)) return sys.sendfile(out, in, offset, count);
    if (offset && *offset < 0) return errno = EINVAL, -1;
    // An input without a position (a pipe) the kernel refuses too.
    const off_t start = offset ? *offset : lseek(in, 0, SEEK_CUR);
    if (start < 0) return errno == ESPIPE ? (errno = EINVAL, -1) : -1;
    count = std::min(count, kMaxRw);
    char buf[65536];
    size_t done = 0;
    while (done < count) {
        const size_t want = std::min(count - done, sizeof buf);
        ssize_t r = pread(in, buf, want, start + off_t(done));
        if (r < 0 && errno == EINTR && !done) continue;
        if (r < 0) {
            if (done) break;
            return -1;
        }
        if (r == 0) break;
        iovec v{buf, size_t(r)};
        ssize_t w = s->send(&v, 1, 0);
        if (w < 0) {
            if (!done) return ret(w);
            break;
        }
        done += size_t(w);
        if (w < r) break;
    }
    if (offset) *offset = start + off_t(done);
    else if (done) lseek(in, start + off_t(done), SEEK_SET);
    return ssize_t(done);
}

// Pipe to socket: the pipe's bytes are looked at without taking them (tee
// into a pipe of our own), and only as many as the socket took are then
// taken out of the pipe; the rest stays there, as with the kernel's splice.
ssize_t splice_from_pipe(int in, Held &to, size_t len, unsigned flags) noexcept {
    int fl = fcntl(in, F_GETFL);
    if (fl < 0) return -1;
    const unsigned tee_flags = (flags & SPLICE_F_NONBLOCK) || (fl & O_NONBLOCK) ? SPLICE_F_NONBLOCK : 0;
    int peek[2];
    if (pipe2(peek, O_CLOEXEC | O_NONBLOCK) != 0) return -1;
    char buf[65536];
    ssize_t n;
    do n = tee(in, peek[1], std::min(len, sizeof buf), tee_flags);
    while (n < 0 && errno == EINTR);
    ssize_t got = 0;
    while (n > 0 && got < n) {
        ssize_t r = sys.read(peek[0], buf + got, std::size_t(n - got));
        if (r <= 0) break;  // cannot happen: the bytes are in our pipe
        got += r;
    }
    const int err = errno;
    sys.close(peek[0]);
    sys.close(peek[1]);
    if (n <= 0) return errno = err, n;
    ssize_t at = 0;
    while (at < got) {
        iovec v{buf + at, std::size_t(got - at)};
        ssize_t w = to->send(&v, 1, 0);
        if (w < 0) {
            if (!at) return ret(w);
            break;
        }
        at += w;
        if (w < ssize_t(v.iov_len)) break;  // the socket took less: the rest stays
    }
    // Take out of the pipe exactly what went into the stream.
    for (ssize_t taken = 0; taken < at;) {
        ssize_t r = sys.read(in, buf, std::size_t(at - taken));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;  // another reader of the pipe took them
        taken += r;
    }
    return at;
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
// takes no more out of the pipe than the socket took.
SD_EXPORT ssize_t splice(int in, loff_t *off_in, int out, loff_t *off_out, size_t len,
                         unsigned flags) {
    Held to(out), from(in);
    const bool into = through_stream(to), outof = through_stream(from);
    if (!into && !outof) return sys.splice(in, off_in, out, off_out, len, flags);
    if ((into && off_out) || (outof && off_in)) return errno = ESPIPE, -1;
    if (len == 0) return 0;
    const bool nb = flags & SPLICE_F_NONBLOCK;
    if (outof) {
        char buf[65536];
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
    if (off_in) return errno = ESPIPE, -1;  // a pipe has no offset
    return splice_from_pipe(in, to, len, flags);
}
