// The direct data path, receiving: the ring the peer writes into, the
// peer's buffer it advertised for read zero-copy, and our own buffer
// advertised for write zero-copy (the sink). Before the peer's switch
// point, and after its fabric stream ended, the companion socket has the
// bytes.
#include "conn_impl.hpp"
#include "datapath.hpp"

#include "log.hpp"
#include "memguard.hpp"
#include "settings.hpp"
#include "sink.hpp"
#include "sys.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <poll.h>

namespace sd::transport {
namespace {

// Copies n ring bytes starting at stream position `head` into the slice.
void ring_copy_out(const Conn *c, std::uint64_t head, const iovec *v, int k) noexcept {
    for (int i = 0; i < k; ++i) {
        auto *dst = static_cast<char *>(v[i].iov_base);
        std::size_t left = v[i].iov_len;
        while (left) {
            std::uint32_t at = c->ring_at(head);
            std::size_t run = std::min<std::size_t>(left, c->ring_cap - at);
            std::memcpy(dst, c->ring + at, run);
            dst += run;
            left -= run;
            head += run;
        }
    }
}

// Something arrived or changed that ends a recv's sink or needs the recv to
// end it (rx_lock held).
bool sink_event_locked(Conn *c) noexcept {
    return c->sink.done || c->sink.over || !c->sink.active || c->ring_bytes() || c->zc.active ||
           c->fin_off != kNoOffset || c->peer_end != kNoOffset || c->gone() || !c->is_direct() ||
           c->rx_expect() != c->sink.off;
}

// A recv waiting on its sink: written, or something else to look at.
bool sink_over(void *ctx) noexcept {
    auto *c = static_cast<Conn *>(ctx);
    std::lock_guard lock(c->rx_lock);
    return sink_event_locked(c);
}

// The companion socket's bytes, counted (rx_off) unless peeked.
ssize_t kernel_recv(const SocketSide &s, Conn *c, const iovec *iov, int iovcnt,
                    int flags) noexcept {
    ssize_t n = s.on_kfd([&](int f) { return kernel_readv(f, iov, iovcnt, flags); });
    if (n < 0) return -errno;
    if (c && s.engine) s.engine->judge_due(c, true, flags & MSG_PEEK ? 0 : std::uint64_t(n));
    if (c && !(flags & MSG_PEEK)) {
        c->rx_off += std::uint64_t(n);
        c->stat->rx_kernel.fetch_add(std::uint64_t(n), std::memory_order_relaxed);
    }
    return n;
}

// Read zero-copy, receive side: reads the peer's advertisement (rx_lock
// held on entry, let go while the read runs). Bytes taken or -errno.
ssize_t read_advert(const SocketSide &s, Conn *c, RxLock &lock, const iovec *iov, int iovcnt,
                    std::size_t skip, std::size_t total, int flags) noexcept {
    // Another thread of ours is reading it: its wake-up brings us back.
    if (c->zc.busy) return -EAGAIN;
    iovec v[kMaxSlice];
    std::size_t want = std::min<std::size_t>(total - skip, c->zc.len - c->zc.done);
    int k = slice(iov, iovcnt, skip, want, v, std::min(kMaxSlice, s.engine->rma_iov_limit()));
    std::size_t n = iov_total(v, k);
    // The kernel would fault on a bad buffer before taking a byte.
    for (int i = 0; i < k; ++i)
        if (!writable(v[i].iov_base, v[i].iov_len)) return -EFAULT;
    const std::uint64_t addr = c->zc.addr + c->zc.done, key = c->zc.key;
    c->zc.busy = true;
    lock.unlock();
    int rc = s.engine->read_remote(c, v, k, addr, key, n);
    lock.lock();
    c->zc.busy = false;
    if (rc == -ENOKEY) {
        // Not registered, and the kernel refuses to let us read it: the
        // sender registers from now on; this advertisement ends unread
        // (its send goes on buffered).
        std::uint64_t answer_off = kNoOffset;
        std::uint32_t answer_len = 0;
        s.engine->need_key(c);
        Engine::finish_advert_locked(c, &answer_off, &answer_len);
        c->wake_locked();
        lock.unlock();
        s.engine->answer_advert(c, answer_off, answer_len);
        lock.lock();
        return -EAGAIN;
    }
    if (rc) {
        // The sender's memory is gone (it died, or the advert was torn
        // down under us): the stream cannot go on.
        SD_LOG(info, "fd %d: reading the peer's advertised buffer failed: %s", s.kfd(),
               std::strerror(-rc));
        c->broken = true;
        c->wake_locked();
        return -ECONNRESET;
    }
    std::uint64_t answer_off = kNoOffset;
    std::uint32_t answer_len = 0;
    if (!(flags & MSG_PEEK)) {
        c->zc.done += std::uint32_t(n);
        c->rx_off += n;
        bump(c->stat->rx_fabric, n);
        bump(c->stat->rx_zcopy, n);
    }
    if (c->zc.done == c->zc.len || c->zc.cancel)
        Engine::finish_advert_locked(c, &answer_off, &answer_len);
    c->wake_locked();  // readers that found it busy
    lock.unlock();
    if (answer_off != kNoOffset) s.engine->answer_advert(c, answer_off, answer_len);
    return ssize_t(n);
}

// A look that may probe the companion: always once a probe or readiness
// saw it at its end, the peer's death was taken in, or the control thread
// saw the peer's process end (its exit closed its socket: EOF or a reset
// waits there), else once per kProbeEveryNs. The probe is a system call
// on every look that finds nothing, and a server that reads until EAGAIN
// makes one such look per request (a PostgreSQL backend, libpq's client).
bool probe_due(Conn *c, KernelLook look) noexcept {
    if (look == KernelLook::probe) return true;
    if (look != KernelLook::paced) return false;
    if (c->kernel_eof.load(std::memory_order_relaxed) ||
        c->peer_closed.load(std::memory_order_relaxed))
        return true;
    if (c->peer && std::atomic_ref<bool>(c->peer->ended).load(std::memory_order_acquire))
        return true;
    const std::uint64_t now = monotonic_ns();
    if (now < c->probe_ns.load(std::memory_order_relaxed)) return false;
    c->probe_ns.store(now + kProbeEveryNs, std::memory_order_relaxed);
    return true;
}

}  // namespace

ssize_t try_recv(const SocketSide &s, Conn *c, const iovec *iov, int iovcnt, std::size_t skip,
                 std::size_t total, int flags, KernelLook look) noexcept {
    std::unique_lock lock(c->rx_lock);
    // Bytes taken in already (a poll's or epoll's pass found them) are
    // read without another pass: the loop below returns them first. Else
    // a pass, outside the lock (its rank is below ours), takes in what
    // the peer sent.
    if (c->broken || c->rx_off < c->switch_off || !c->ring_bytes() ||
        c->state.load(std::memory_order_relaxed) == ConnState::final) {
        lock.unlock();
        s.engine->progress_for(c);
        lock.lock();
    }
    for (int round = 0; round < 2; ++round) {
        if (c->broken) return -ECONNRESET;
        if (c->state.load(std::memory_order_acquire) == ConnState::final) return -ESTALE;
        iovec v[kMaxSlice];
        if (c->rx_off < c->switch_off) {
            // Bytes still due on the companion socket: before the peer's
            // switch point, or the peer has not switched at all.
            if (look == KernelLook::none) return -EAGAIN;
            std::uint64_t due = c->switch_off - c->rx_off;
            int k = slice(iov, iovcnt, skip, std::min<std::uint64_t>(total - skip, due), v, kMaxSlice);
            ssize_t n = kernel_recv(s, c, v, k, (flags & MSG_PEEK) | MSG_DONTWAIT);
            if (n != 0 || c->switch_off != kNoOffset) return n;
            // Kernel EOF with no switch point known: the peer may have
            // moved to the fabric and closed; its messages precede its FIN.
            lock.unlock();
            s.engine->progress_blocking();
            lock.lock();
            if (c->switch_off == kNoOffset) return 0;
            continue;
        }
        if (c->peer_end != kNoOffset && c->rx_off >= c->peer_end && !c->ring_bytes() &&
            !c->zc.active) {
            // The peer's fabric stream is over and read: the kernel's turn.
            const bool final = c->settle_left_locked();
            const Rearm rearm = c->rearm.load(std::memory_order_acquire);
            if (rearm == Rearm::none) {
                if (final) return -ESTALE;  // the kernel alone, blocking as asked
            } else if (rearm == Rearm::due) {
                s.engine->want_flush(c);  // kernel mode again, with both locks
            }
            // Until then: counted (an upgrade later starts at rx_off), and
            // never blocking in the kernel (the fabric may come back).
            if (look == KernelLook::none) return -EAGAIN;
            int k = slice(iov, iovcnt, skip, total - skip, v, kMaxSlice);
            return kernel_recv(s, c, v, k, (flags & MSG_PEEK) | MSG_DONTWAIT);
        }
        if (std::uint64_t avail = c->ring_bytes()) {
            int k = slice(iov, iovcnt, skip, std::min<std::uint64_t>(total - skip, avail), v,
                          kMaxSlice);
            std::size_t n = iov_total(v, k);
            if (!fault_guarded([&] { ring_copy_out(c, c->ring_head, v, k); }))
                return -EFAULT;  // nothing consumed
            if (!(flags & MSG_PEEK)) {
                c->ring_head += n;
                c->rx_off += n;
                c->unreturned.fetch_add(std::uint32_t(n), std::memory_order_relaxed);
                c->show_flow(true);
                const bool filled = c->huge_tries < Conn::kRingHugeTries &&
                                    c->ring_head >= c->huge_after + c->ring_cap;
                if (filled) {
                    ++c->huge_tries;
                    c->huge_after = c->ring_head;
                }
                lock.unlock();
                s.engine->maybe_return_credits(c);
                if (filled) s.engine->ring_filled(c);
            }
            return ssize_t(n);
        }
        if (c->zc.active && c->rx_off == c->zc.off + c->zc.done)
            return skip == total ? 0 : read_advert(s, c, lock, iov, iovcnt, skip, total, flags);
        if (c->fin_off != kNoOffset && c->rx_off >= c->fin_off)
            // A reset after the peer's FIN is the next send's to report.
            return c->reset.load(std::memory_order_acquire) == ResetState::unreported_after_fin
                       ? 0
                       : -c->take_reset();
        if (!probe_due(c, look)) return -EAGAIN;
        // Nothing on the fabric. A companion at EOF without a fabric FIN
        // means the peer process is gone: deliver what arrived, then EOF.
        char probe;
        ssize_t n =
            s.on_kfd([&](int f) { return sys.recv(f, &probe, 1, MSG_PEEK | MSG_DONTWAIT); });
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
            // Every later look probes too: the end stays where it is.
            c->kernel_eof.store(true, std::memory_order_relaxed);
            // The kernel reset the connection (the peer's exit closed its
            // socket with bytes of ours unread there): the probe took the
            // error, which the kernel reports once; it is ours to report.
            if (n < 0 && errno == ECONNRESET) c->reset_comes();
            if (round == 1) {
                // The peer is gone or closed without a word: sending to it
                // fails from now on, as after a reset.
                if (!s.engine->peer_alive(c->peer)) s.engine->peer_died(c);
                if (int e = c->take_reset()) return -e;
                return n == 0 ? 0 : -errno;
            }
            lock.unlock();
            s.engine->progress_blocking();
            lock.lock();
            continue;
        }
        return -EAGAIN;
    }
    return -EAGAIN;
}

ssize_t recv_sink(const SocketSide &s, Conn *c, const iovec &piece, std::uint64_t deadline,
                  std::int64_t tmo, SpinSlot &slot) noexcept {
    const auto len = std::uint32_t(std::min<std::size_t>(piece.iov_len, kMaxSink));
    // A bad buffer: the usual way reports EFAULT when bytes come.
    if (!writable(piece.iov_base, len)) return -EALREADY;
    if (s.engine->advertise_sink(c, piece.iov_base, len) != 0) return -EALREADY;
    // Every way out: the sink is over (deregistered), its bytes counted.
    bool interrupted = false;
    auto over = [&]() -> ssize_t {
        const std::uint32_t got = s.engine->finish_sink(c);
        return got ? ssize_t(got) : interrupted ? -EINTR : -EAGAIN;
    };
    // The sink is over (1), or ours to end (0: the peer's other message,
    // the companion's EOF or error, which the usual way sorts out; -EAGAIN
    // at the deadline; -EINTR).
    struct Claim : BellWaiter {
        const SocketSide &s;
        long look() noexcept {
            s.engine->progress();
            std::lock_guard lock(c->rx_lock);
            if (c->sink.done || c->sink.over || !c->sink.active) return 1;
            return sink_event_locked(c) ? 0 : kWaitOn;
        }
        long before_sleep() noexcept {
            pollfd p{s.kfd(), POLLIN | POLLRDHUP, 0};
            return sys.poll(&p, 1, 0) > 0 ? 0 : kWaitOn;
        }
    } claim{{s.engine, c, sink_over, c, s.kfd(), POLLIN | POLLRDHUP,
             std::uint64_t(settings().spin_us) * 1000, deadline, tmo},
            s};
    const long r = wait_on_bell(claim, slot);
    if (r == 1) return over();
    interrupted = r == -EINTR;
    if (s.engine->cancel_sink(c) == 0) return over();
    // Asked to end it: only the peer's word that it did, or its loss,
    // ends it (a signal does not).
    struct Ended : BellWaiter {
        const SocketSide &s;
        std::uint64_t asked_at;
        long look() noexcept {
            s.engine->progress();
            {
                std::lock_guard lock(c->rx_lock);
                if (c->sink.done || c->sink.over || !c->sink.active) return 1;
            }
            return s.engine->sink_writer_lost(c, asked_at) ? 1 : kWaitOn;
        }
        int sleep(std::uint64_t) noexcept { return sleep_once(e, c, -1, 0, sink_over, c, 10); }
        long interrupted() noexcept { return kWaitOn; }
    } ended{{s.engine, c, sink_over, c}, s, monotonic_ns()};
    (void)wait_on_bell(ended, slot);
    return over();
}

}  // namespace sd::transport
