// sendfile and splice into or out of a socket that is or may become
// direct: the kernel would move the bytes between the file or pipe and
// the kernel socket alone, bypassing the fabric and the stream's counts,
// so they go through a buffer and the stream's own send and recv.
#include "stream.hpp"

#include "transport/sys.hpp"

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sd::fallback {

using transport::sys;

namespace {
// The kernel moves at most this much in one call.
constexpr std::size_t kMaxRw = 0x7ffff000;
}  // namespace

// The stream's bytes must go through the stream (counted, switched): any
// connection that is or may become direct. An inherited socket whose
// owner is still direct is claimed first (the owner moves it to the
// kernel): from then on this process counts what it moves, and the
// counts are where the last holder upgrades it again; a sendfile of its
// bytes straight into the kernel would shift every later offset. A claim
// that fails leaves the stream to answer (EIO, or a reset where the owner
// died first), as a send would.
bool Stream::moves_through_stream() noexcept {
    if (!claim_inherited()) return true;
    return may_go_direct();
}

// The file is read with pread at an explicit position and its offset (the
// fd's own, or *offset) moves by exactly what the socket took: a
// non-blocking socket that takes less, or nothing (EAGAIN), leaves the
// rest of the file where it was, as the kernel's sendfile does.
ssize_t Stream::send_file(int in, off_t *offset, std::size_t count) noexcept {
    if (offset && *offset < 0) return -EINVAL;
    if (const ssize_t n = earning_send_file(in, offset, count); n != -EALREADY) return n;
    // An input without a position (a pipe) the kernel refuses too.
    const off_t start = offset ? *offset : lseek(in, 0, SEEK_CUR);
    if (start < 0) return errno == ESPIPE ? -EINVAL : -errno;
    count = std::min(count, kMaxRw);
    char buf[65536];
    std::size_t done = 0;
    while (done < count) {
        const std::size_t want = std::min(count - done, sizeof buf);
        ssize_t r = pread(in, buf, want, start + off_t(done));
        if (r < 0 && errno == EINTR && !done) continue;
        if (r < 0) {
            if (done) break;
            return -errno;
        }
        if (r == 0) break;
        iovec v{buf, std::size_t(r)};
        ssize_t w = send(&v, 1, 0);
        if (w < 0) {
            if (!done) return w;
            break;
        }
        done += std::size_t(w);
        if (w < r) break;
    }
    if (offset) *offset = start + off_t(done);
    else if (done) lseek(in, start + off_t(done), SEEK_SET);
    return ssize_t(done);
}

// A connection still earning its upgrade on a non-blocking socket sends
// through the kernel, counted, as pending_io sends: the kernel's own
// sendfile does it in one call, under pend_lock like pending_io's send
// (it cannot block there), and what it took is counted the same way.
ssize_t Stream::earning_send_file(int in, off_t *offset, std::size_t count) noexcept {
    if (!nonblock.load(std::memory_order_relaxed) || attached_conn()) return -EALREADY;
    std::lock_guard lock(pend_lock);
    // Asked already (polled until the builder attaches it: pending_io's
    // way), shared through fork, or attached meanwhile.
    if (!pending.load(std::memory_order_relaxed) || !earn_ns ||
        share.load(std::memory_order_relaxed) || conn.load(std::memory_order_relaxed))
        return -EALREADY;
    const ssize_t n = on_kfd([&](int f) { return sys.sendfile(f, in, offset, count); });
    if (n < 0) return -errno;
    if (n > 0) {
        pre_tx += std::uint64_t(n);
        ask_upgrade_locked();
    }
    return n;
}

// Pipe to socket: the pipe's bytes are looked at without taking them (tee
// into a pipe of our own), and only as many as the socket took are then
// taken out of the pipe; the rest stays there, as with the kernel's splice.
ssize_t Stream::splice_from_pipe(int in, std::size_t len, unsigned flags) noexcept {
    int fl = sys.fcntl(in, F_GETFL);
    if (fl < 0) return -errno;
    const unsigned tee_flags =
        (flags & SPLICE_F_NONBLOCK) || (fl & O_NONBLOCK) ? SPLICE_F_NONBLOCK : 0;
    int peek[2];
    if (pipe2(peek, O_CLOEXEC | O_NONBLOCK) != 0) return -errno;
    char buf[65536];
    ssize_t n;
    do n = tee(in, peek[1], std::min(len, sizeof buf), tee_flags);
    while (n < 0 && errno == EINTR);
    const int tee_err = errno;
    ssize_t got = 0;
    while (n > 0 && got < n) {
        ssize_t r = sys.read(peek[0], buf + got, std::size_t(n - got));
        if (r <= 0) break;  // cannot happen: the bytes are in our pipe
        got += r;
    }
    sys.close(peek[0]);
    sys.close(peek[1]);
    if (n < 0) return -tee_err;
    if (n == 0) return 0;
    ssize_t at = 0;
    while (at < got) {
        iovec v{buf + at, std::size_t(got - at)};
        ssize_t w = send(&v, 1, 0);
        if (w < 0) {
            if (!at) return w;
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

// Socket to pipe: no more than the pipe has room for, so nothing read
// from the stream is left over.
ssize_t Stream::splice_to_pipe(int out, std::size_t len, unsigned flags) noexcept {
    const bool nb = flags & SPLICE_F_NONBLOCK;
    char buf[65536];
    int size = sys.fcntl(out, F_GETPIPE_SZ), queued = 0;
    if (size < 0) return -EINVAL;  // the other end must be a pipe
    for (;;) {
        if (sys.ioctl(out, FIONREAD, &queued) != 0) return -errno;
        if (queued < size) break;
        if (nb) return -EAGAIN;
        pollfd p{out, POLLOUT, 0};
        if (sys.poll(&p, 1, -1) < 0) return -errno;
    }
    std::size_t want = std::min({len, sizeof buf, std::size_t(size - queued)});
    iovec v{buf, want};
    ssize_t n = recv(&v, 1, nb ? MSG_DONTWAIT : 0);
    if (n <= 0) return n;
    for (ssize_t at = 0; at < n;) {
        ssize_t w = sys.write(out, buf + at, std::size_t(n - at));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return at ? at : -errno;
        at += w;
    }
    return n;
}

ssize_t splice(Stream *from, int in, loff_t *off_in, Stream *to, int out, loff_t *off_out,
               std::size_t len, unsigned flags) noexcept {
    if ((to && off_out) || (from && off_in)) return -ESPIPE;
    if (len == 0) return 0;
    if (from) return from->splice_to_pipe(out, len, flags);
    struct stat st;
    if (fstat(in, &st) != 0) return -errno;
    if (!S_ISFIFO(st.st_mode)) return -EINVAL;
    if (off_in) return -ESPIPE;  // a pipe has no offset
    return to->splice_from_pipe(in, len, flags);
}

}  // namespace sd::fallback
