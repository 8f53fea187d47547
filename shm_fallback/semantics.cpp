// Corners of TCP's semantics that the fabric path must reproduce: reads
// that throw bytes away (MSG_TRUNC), how much a blocking read waits for
// (SO_RCVLOWAT), the send that meets a peer that has closed, a close while
// other calls are in progress, and urgent data (the kernel's alone).
#include "stream.hpp"

#include "transport/log.hpp"
#include "transport/sys.hpp"
#include "transport/wait.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/ioctl.h>
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
    if (wr_shut(c) || transport::broken(c) || transport::reset_seen(c))
        return false;
    // A send of ours that went out before we had taken in the peer's close
    // (it was still in our queue) reached it closed: that one drew the
    // reset. The peer's counters outlive its close in its process page.
    const std::uint64_t read = engine->peer_read(c);
    if (read != transport::kNoOffset && transport::fabric_sent(c) > read) {
        if (!drew_reset.exchange(true, std::memory_order_acq_rel)) draw_kernel_reset();
        return false;
    }
    if (drew_reset.exchange(true, std::memory_order_acq_rel)) return false;
    draw_kernel_reset();
    // The reset it draws is as good as here (one host): POLLERR|POLLHUP,
    // and the next send or SO_ERROR reports EPIPE (TCP's CLOSE_WAIT).
    transport::reset_drawn(c);
    return true;
}

bool Stream::hold_for_calls() noexcept {
    // High, out of the way of the numbers the application is given next.
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    const rlim_t lim = rl.rlim_cur == RLIM_INFINITY ? (1u << 20) : rl.rlim_cur;
    const int base = lim > 64 ? int(std::min<rlim_t>(lim, 1u << 20) * 3 / 4) : 0;
    const int priv = transport::sys.fcntl(kfd(), F_DUPFD_CLOEXEC, base);
    if (priv < 0) return false;
    fd.store(priv, std::memory_order_seq_cst);
    // A call that read the old number may be in a syscall on it (never
    // one that blocks: on_kfd). The caller closes that number once they
    // are out of it; calls from now on read the private fd. Bounded,
    // should such calls keep coming.
    (void)transport::wait_until({.nap_ns = 10000, .max_naps = 100000}, 0,
                                [this] { return fd_users.load(std::memory_order_acquire) == 0; });
    if (transport::Conn *c = conn.load(std::memory_order_acquire)) {
        std::atomic_ref<std::int32_t>(transport::stats(c).fd).store(priv, std::memory_order_relaxed);
        // Calls asleep in poll on the old number look again, at the new one.
        transport::wake(c);
    }
    held_fd.store(priv, std::memory_order_release);
    return true;
}

void Stream::close_held() noexcept {
    const int h = held_fd.exchange(-1, std::memory_order_acq_rel);
    if (h < 0) return;
    last_close();
    (void)transport::sys.close(h);
}

void Stream::leave_for_urgent() noexcept {
    transport::Conn *c = attached_conn();
    if (!c || !engine) return;  // the kernel has it
    using transport::ConnState;
    ConnState st = transport::state_of(c);
    // Not direct (yet): no upgrade from now on. An upgrade that finished
    // meanwhile leaves below.
    if (st != ConnState::direct && st != ConnState::leaving && st != ConnState::final) {
        engine->bar_upgrades(c, transport::Reason::oob);
        st = transport::state_of(c);
        // Held on TCP for good: say why (stats).
        if (st == ConnState::kernel)
            transport::say_barred(c, transport::Reason::oob, "oob (urgent data)");
    }
    if (st != ConnState::direct && st != ConnState::leaving) return;
    // The leave ends our fabric stream and writes what we owe the kernel
    // (staged bytes) before it returns: the urgent byte follows them.
    const int rc = engine->leave(c, transport::Reason::oob);
    if (rc < 0)
        SD_LOG(error, "fd %d: could not move to the kernel for urgent data (%s): the byte "
                      "goes in line", kfd(), std::strerror(-rc));
}

SD_CHILD_PATH ssize_t Stream::told(ssize_t r) noexcept {
    if (r == -ECONNRESET)
        if (transport::Conn *c = conn.load(std::memory_order_acquire)) {
            // The kernel socket may have told it before the fabric's word
            // of it came: that word then finds it told already.
            transport::reset_told(c);
            // The companion's own reset, when it came too, is told with it:
            // reading SO_ERROR clears it, as the kernel's recv would have.
            int pending = 0;
            socklen_t len = sizeof pending;
            (void)transport::sys.getsockopt(kfd(), SOL_SOCKET, SO_ERROR, &pending, &len);
        }
    if (r == -EPIPE && drew_reset.load(std::memory_order_acquire)) {
        // The kernel socket's reset that our send drew (EPIPE, pending on
        // it) is what this EPIPE reports: TCP's send clears it.
        int pending = 0;
        socklen_t len = sizeof pending;
        (void)transport::sys.getsockopt(kfd(), SOL_SOCKET, SO_ERROR, &pending, &len);
    }
    return r;
}

int Stream::take_error() noexcept {
    transport::Conn *c = conn.load(std::memory_order_acquire);
    return c ? transport::take_reset(c) : 0;
}

int Stream::at_mark() noexcept {
    if (transport::Conn *c = conn.load(std::memory_order_acquire)) {
        if (transport::on_fabric(c)) {
            engine->progress();
            // Fabric bytes come first: the mark (on the kernel) is after them.
            if (transport::fabric_bytes_ahead(c)) return 0;
        }
    }
    int at = 0;
    if (transport::sys.ioctl(kfd(), SIOCATMARK, &at) != 0) return -errno;
    return at;
}

}  // namespace sd::fallback
