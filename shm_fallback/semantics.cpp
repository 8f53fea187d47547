// Corners of TCP's semantics that the fabric path must reproduce: reads
// that throw bytes away (MSG_TRUNC), how much a blocking read waits for
// (SO_RCVLOWAT), and the send that meets a peer that has closed.
#include "stream.hpp"

#include "transport/sys.hpp"

#include <algorithm>
#include <fcntl.h>
#include <sys/resource.h>

namespace sd::fallback {

ssize_t Stream::recv_discard(std::size_t total, int flags) noexcept {
    // TCP copies nothing and counts the bytes; the caller's buffer may be
    // null. A peek says how many there are, up to one scratch buffer.
    char scratch[16384];
    flags &= ~MSG_TRUNC;
    std::size_t done = 0;
    while (done < total) {
        iovec v{scratch, std::min(total - done, sizeof scratch)};
        // The first piece waits as the caller asked; later ones take only
        // what is there, unless MSG_WAITALL wants it all.
        const int f = done && !(flags & MSG_WAITALL) ? flags | MSG_DONTWAIT : flags;
        ssize_t n = recv(&v, 1, f);
        if (n < 0) return done ? ssize_t(done) : n;
        done += std::size_t(n);
        if (n == 0 || (flags & MSG_PEEK) || std::size_t(n) < v.iov_len) break;
    }
    return ssize_t(done);
}

std::size_t Stream::recv_target(std::size_t total, int flags) const noexcept {
    if (flags & MSG_WAITALL) return total;
    const auto low = std::size_t(rcvlowat.load(std::memory_order_relaxed));
    return std::max<std::size_t>(1, std::min(total, low));
}

bool Stream::first_send_to_closed(transport::Conn *c) noexcept {
    // TCP sends into a connection whose peer has only closed (FIN): that
    // segment draws the peer's reset, and the sends after it fail. A reset
    // already there (or our own shutdown) fails at once.
    if (c->tx_fin || c->broken.load(std::memory_order_relaxed) ||
        c->peer_reset.load(std::memory_order_acquire))
        return false;
    return !drew_reset.exchange(true, std::memory_order_acq_rel);
}

bool Stream::hold_for_calls() noexcept {
    // High, out of the way of the numbers the application is given next.
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    const rlim_t lim = rl.rlim_cur == RLIM_INFINITY ? (1u << 20) : rl.rlim_cur;
    const int base = lim > 64 ? int(std::min<rlim_t>(lim, 1u << 20) * 3 / 4) : 0;
    const int priv = transport::sys.fcntl(kfd(), F_DUPFD_CLOEXEC, base);
    if (priv < 0) return false;
    fd.store(priv, std::memory_order_relaxed);
    if (transport::Conn *c = conn.load(std::memory_order_acquire))
        std::atomic_ref<std::int32_t>(c->stat->fd).store(priv, std::memory_order_relaxed);
    held_fd.store(priv, std::memory_order_release);
    return true;
}

void Stream::close_held() noexcept {
    const int h = held_fd.exchange(-1, std::memory_order_acq_rel);
    if (h < 0) return;
    last_close();
    (void)transport::sys.close(h);
}

}  // namespace sd::fallback
