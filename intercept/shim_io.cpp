// read/write, recv/send and friends: each builds an iovec and calls the
// stream's one recv or send; sendfile and splice call the stream's own.
// Our symbols must keep their plain names (fcntl, sendfile), not the
// *64 names glibc redirects them to under _FILE_OFFSET_BITS=64.
#undef _FILE_OFFSET_BITS
#include "shim.hpp"
#include "fork_protocol/for_good.hpp"
#include "transport/memguard.hpp"
#include "transport/wait.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

using namespace sd::intercept;
using sd::transport::readable;
using sd::transport::writable;

extern "C" [[noreturn]] void __chk_fail(void);

namespace {

ssize_t recv_one(CallRef &s, void *buf, size_t len, int flags) noexcept {
    iovec v{buf, len};
    return ret(s->recv(&v, 1, flags));
}

ssize_t send_one(CallRef &s, const void *buf, size_t len, int flags) noexcept {
    iovec v{const_cast<void *>(buf), len};
    return ret(s->send(&v, 1, flags));
}

// recvmsg on a stream socket reports no address and no control data.
ssize_t recv_msg(CallRef &s, msghdr *m, int flags) noexcept {
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
    CallRef s(fd);
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
    CallRef s(fd);
    if (!s) return sys.write(fd, buf, len);
    return send_one(s, buf, len, 0);
}

SD_EXPORT ssize_t readv(int fd, const iovec *iov, int iovcnt) {
    CallRef s(fd);
    // Bad arguments: the kernel gives the answer (EINVAL, EFAULT).
    if (!s || iovcnt < 0 || iovcnt > IOV_MAX || !readable(iov, sizeof *iov * size_t(iovcnt)))
        return sys.readv(fd, iov, iovcnt);
    size_t total = 0;
    for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
    if (total == 0) return 0;  // as read() of nothing
    return ret(s->recv(iov, iovcnt, 0));
}

SD_EXPORT ssize_t writev(int fd, const iovec *iov, int iovcnt) {
    CallRef s(fd);
    if (!s || iovcnt < 0 || iovcnt > IOV_MAX || !readable(iov, sizeof *iov * size_t(iovcnt)))
        return sys.writev(fd, iov, iovcnt);
    return ret(s->send(iov, iovcnt, 0));
}

SD_EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags) {
    CallRef s(fd);
    if (!s) return sys.recv(fd, buf, len, flags);
    return recv_one(s, buf, len, flags);
}

SD_EXPORT ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags) {
    if (len > buflen) __chk_fail();
    return recv(fd, buf, len, flags);
}

SD_EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags) {
    CallRef s(fd);
    if (!s) return sys.send(fd, buf, len, flags);
    return send_one(s, buf, len, flags);
}

SD_EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, sockaddr *addr,
                           socklen_t *alen) {
    CallRef s(fd);
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
    CallRef s(fd);
    if (!s) return sys.sendto(fd, buf, len, flags, addr, alen);
    return send_one(s, buf, len, flags);
}

SD_EXPORT ssize_t recvmsg(int fd, msghdr *m, int flags) {
    CallRef s(fd);
    // The error queue is the kernel socket's, with its control data.
    if (!s || (flags & MSG_ERRQUEUE) || !writable(m, sizeof *m) || m->msg_iovlen > IOV_MAX ||
        !readable(m->msg_iov, sizeof(iovec) * m->msg_iovlen))
        return sys.recvmsg(fd, m, flags);
    return recv_msg(s, m, flags);
}

SD_EXPORT ssize_t sendmsg(int fd, const msghdr *m, int flags) {
    pass_fds(m);
    CallRef s(fd);
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
    CallRef s(fd);
    if (!s || !v || !writable(v, sizeof *v * n)) return sys.sendmmsg(fd, v, n, flags);
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
    CallRef s(fd);
    n = std::min(n, kMaxMmsg);
    if (!s || !v || !writable(v, sizeof *v * n) || (timeout && !writable(timeout, sizeof *timeout)))
        return sys.recvmmsg(fd, v, n, flags, timeout);
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

// sendfile and splice into or out of one of our sockets go through its
// stream (shm_fallback/splice.cpp) where the connection is or may become
// direct.
namespace {

sd::fallback::Stream *through_stream(CallRef &s) noexcept {
    return s && s->moves_through_stream() ? s.get() : nullptr;
}

ssize_t sendfile_any(int out, int in, off_t *offset, size_t count) noexcept {
    CallRef s(out);
    if (!through_stream(s)) return sys.sendfile(out, in, offset, count);
    return ret(s->send_file(in, offset, count));
}

}  // namespace

SD_EXPORT ssize_t sendfile(int out, int in, off_t *offset, size_t count) {
    return sendfile_any(out, in, offset, count);
}

SD_EXPORT ssize_t sendfile64(int out, int in, off_t *offset, size_t count) {
    return sendfile_any(out, in, offset, count);
}

SD_EXPORT ssize_t splice(int in, loff_t *off_in, int out, loff_t *off_out, size_t len,
                         unsigned flags) {
    CallRef to(out), from(in);
    sd::fallback::Stream *into = through_stream(to), *outof = through_stream(from);
    if (!into && !outof) return sys.splice(in, off_in, out, off_out, len, flags);
    return ret(sd::fallback::splice(outof, in, off_in, into, out, off_out, len, flags));
}
