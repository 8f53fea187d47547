// What the layers above transport may ask of a connection (conn.hpp):
// each a look at, or one step on, fields that stay transport's own.
#include "clock.hpp"
#include "conn_impl.hpp"
#include "engine.hpp"
#include "log.hpp"

#include <algorithm>
#include <cstring>

namespace sd::transport {

ConnState state_of(const Conn *c) noexcept { return c->state.load(std::memory_order_acquire); }
bool is_direct(const Conn *c) noexcept { return c->is_direct(); }
bool is_leaving(const Conn *c) noexcept { return c->is_leaving(); }
bool on_fabric(const Conn *c) noexcept {
    const ConnState s = state_of(c);
    return s == ConnState::direct || s == ConnState::leaving;
}
bool may_read_fabric(const Conn *c) noexcept {
    return on_fabric(c) || state_of(c) == ConnState::committing;
}
bool upgrading(const Conn *c) noexcept { return c->upgrading(); }
ConnStat &stats(Conn *c) noexcept { return *c->stat; }

TxLock lock_tx(Conn *c) noexcept { return TxLock(c->tx_lock); }
TxLock try_lock_tx(Conn *c) noexcept { return TxLock(c->tx_lock, std::try_to_lock); }

void sent_on_kernel(Conn *c, std::uint64_t n) noexcept {
    c->tx_off += n;
    bump(c->stat->tx_kernel, n);
}
bool leave_under_way(const Conn *c) noexcept { return c->leave_under_way(); }
bool owes_kernel(const Conn *c) noexcept { return c->tx_owed.load(std::memory_order_acquire); }
bool leave_wanted(const Conn *c) noexcept {
    return c->leave_wanted.load(std::memory_order_acquire);
}
bool leave_requested(const Conn *c) noexcept {
    return c->leave_wanted.load(std::memory_order_acquire) ||
           c->leave_due() || !c->is_direct();
}
std::uint64_t fabric_sent(Conn *c) noexcept {
    return c->stat->tx_fabric.load(std::memory_order_relaxed) - c->tx_fabric_base;
}

bool wr_shut(const Conn *c, const std::atomic<bool> &kernel_wr_shut) noexcept {
    return c->fin_sent(std::memory_order_relaxed) ||
           kernel_wr_shut.load(std::memory_order_acquire);
}
bool fin_sent(const Conn *c) noexcept { return c->fin_sent(); }
bool peer_fin(const Conn *c) noexcept { return c->peer_fin(); }
void shut_read(Conn *c) noexcept { c->rd_shut.store(true, std::memory_order_release); }
bool broken(const Conn *c) noexcept { return c->broken.load(std::memory_order_acquire); }
bool gone(const Conn *c) noexcept { return c->gone(); }

bool reset_seen(const Conn *c) noexcept { return c->reset_seen(); }
int take_reset(Conn *c) noexcept { return c->take_reset(); }
void reset_told(Conn *c) noexcept { c->reset_told(); }
void reset_drawn(Conn *c) noexcept { c->reset_after_fin(); }

bool rx_news(Conn *c) noexcept {
    std::lock_guard lock(c->rx_lock);
    return c->rx_ready() || c->fin_off != kNoOffset || c->broken ||
           c->state.load(std::memory_order_relaxed) == ConnState::final;
}

bool kernel_eof_seen(const Conn *c) noexcept {
    return c->kernel_eof.load(std::memory_order_relaxed);
}

void kernel_eof_hint(Conn *c) noexcept {
    if (c->kernel_eof.exchange(true)) return;
    // A peer that closes or shuts down says so on the fabric before its
    // companion does; without that word it is exiting (its fds close
    // before its pidfd fires): wait briefly for that, so that the first
    // report already knows whether it was a reset.
    if (auto *e = Engine::current(); e && c->is_direct()) {
        e->progress_blocking();
        bool word;
        {
            std::lock_guard lock(c->rx_lock);
            word = c->fin_off != kNoOffset || c->peer_closed.load(std::memory_order_relaxed);
        }
        bool gone = !word && e->peer_exit_wait(c->peer, 200);
        if (gone) e->peer_died(c);
    }
    c->rx_seq.fetch_add(1, std::memory_order_release);
    mark_touched(c);
}

std::int64_t readable_now(Conn *c, int kernel) noexcept {
    std::lock_guard lock(c->rx_lock);
    if (c->settle_left_locked() ||
        (c->peer_end != kNoOffset && c->rx_off >= c->peer_end && !c->rx_ready()))
        return -1;
    std::uint64_t n = c->rx_ready();
    if (c->rx_off < c->switch_off)
        n = c->switch_off == kNoOffset ? std::uint64_t(kernel)
                                       : std::min<std::uint64_t>(kernel, c->switch_off - c->rx_off);
    return std::int64_t(std::min<std::uint64_t>(n, 0x7fffffff));
}

bool fabric_bytes_ahead(Conn *c) noexcept {
    std::lock_guard lock(c->rx_lock);
    return c->rx_ready() || (c->peer_end != kNoOffset && c->rx_off < c->peer_end);
}

void wake(Conn *c) noexcept {
    std::lock_guard lock(c->rx_lock);
    c->wake_locked();
}

bool fabric_view(Conn *c, FabricView &v) noexcept {
    const ConnState st = c->state.load(std::memory_order_acquire);
    v.leaving = st == ConnState::leaving;
    // Committing: we accepted the peer's upgrade and our thread that
    // answered it has not read its commit yet. A peer that switched sent
    // its commit first, and what follows its switch point is on the
    // fabric already (our receives take it): the receive side is ours to
    // report; our sends still go to the kernel socket.
    v.kernel_sends = st == ConnState::committing;
    if (st != ConnState::direct && !v.leaving && !v.kernel_sends) return false;
    std::lock_guard lock(c->rx_lock);
    // Leaving the fabric with all of it read: the kernel answers from now on.
    if (v.leaving && c->settle_left_locked()) return false;
    if (c->switch_off == kNoOffset || c->rx_off < c->switch_off) return false;
    v.fin = c->fin_off != kNoOffset;
    v.eof = c->kernel_eof.load(std::memory_order_relaxed);
    // The companion's EOF without a fabric word: if the peer process is
    // gone, its counters say whether it left our bytes unread (a reset).
    if (v.eof && !v.fin && !c->peer_closed.load(std::memory_order_relaxed))
        if (auto *e = Engine::current(); e && !e->peer_alive(c->peer)) e->peer_died(c);
    v.closed = c->peer_closed.load(std::memory_order_relaxed);
    v.broken = c->broken.load(std::memory_order_relaxed);
    v.ready = c->rx_ready();
    // (Committing too: the peer may have left before our commit was read.)
    v.read_out = (v.leaving || v.kernel_sends) && !v.ready && c->peer_end != kNoOffset &&
                 c->rx_off >= c->peer_end;
    v.writable = v.kernel_sends ? false
                 : v.leaving    ? !c->tx_owed.load(std::memory_order_acquire)
                                : c->credits.load(std::memory_order_acquire) > 0 || v.closed || v.eof;
    v.fin_sent = c->fin_sent(std::memory_order_relaxed);
    const ResetState r = c->reset.load(std::memory_order_acquire);
    v.reset = r != ResetState::none;
    v.reset_unreported = reset_unreported(r);
    return true;
}

PollerMask &pollers_of(Conn *c) noexcept { return c->pollers; }

bool peer_wait_over(const Conn *c) noexcept {
    return c->give_up_due.load(std::memory_order_relaxed);
}

bool ask_again_due(const Conn *c) noexcept {
    const std::uint64_t at = c->ask_again_ns.load(std::memory_order_relaxed);
    return at && monotonic_ns() >= at;
}

void arrivals(const Conn *c, std::uint32_t &rx, std::uint32_t &tx) noexcept {
    rx = c->rx_seq.load(std::memory_order_acquire);
    tx = c->tx_seq.load(std::memory_order_acquire);
}

ConnState quiet_marks(const Conn *c, std::uint32_t &rx, std::uint32_t &tx) noexcept {
    arrivals(c, rx, tx);
    return c->state.load(std::memory_order_acquire);
}

void set_handoff(Conn *c, const HandoffOps *ops, void *ctx) noexcept {
    c->handoff_ops.store(ops, std::memory_order_relaxed);
    c->handoff_ctx.store(ctx, std::memory_order_release);
}
bool has_handoff(const Conn *c) noexcept {
    return c->handoff_ctx.load(std::memory_order_acquire) != nullptr;
}

std::uint64_t ring_capacity(Conn *c) noexcept {
    std::lock_guard rx(c->rx_lock);
    return c->ring_cap;
}

void set_handoff_room(Conn *c, const HandoffRoom &r) noexcept {
    std::lock_guard rx(c->rx_lock);
    c->handoff_room = r;
}

std::uint64_t hand_ring_out(Conn *c, char *(*room)(void *ctx, std::uint64_t n),
                            void *ctx) noexcept {
    // Only the answering side of a finished leave: every fabric byte of
    // the peer is here, and nothing more comes on the fabric.
    std::unique_lock tx(c->tx_lock, std::try_to_lock);
    if (!tx.owns_lock() || !c->is_leaving() ||
        c->our_leave.load(std::memory_order_acquire) != OurLeave::answered)
        return 0;
    std::lock_guard rx(c->rx_lock);
    const std::uint64_t n = c->ring_bytes();
    if (!n || c->zc.active || c->peer_end == kNoOffset || c->rx_expect() < c->peer_end ||
        c->rx_off + n != c->peer_end)
        return 0;
    char *to = room(ctx, n);
    if (!to) return 0;
    for (std::uint64_t done = 0; done < n;) {
        const std::uint32_t at = c->ring_at(c->ring_head + done);
        const std::uint64_t run = std::min<std::uint64_t>(n - done, c->ring_cap - at);
        std::memcpy(to + done, c->ring + at, run);
        done += run;
    }
    c->ring_head += n;
    c->rx_off += n;
    SD_LOG(info, "fd %d: %llu unread bytes of the peer's fabric stream go to the holders of the "
                 "socket, read first", c->stat->fd, (unsigned long long)n);
    // Read to the peer's end now: final (or handed over by the flush
    // pass).
    c->settle_left_locked();
    return n;
}

void say_barred(Conn *c, Reason why, const char *text) noexcept {
    if (c->state.load(std::memory_order_acquire) != ConnState::kernel ||
        !c->upgrades_barred.load(std::memory_order_acquire))
        return;
    c->stat->reason.store(std::uint32_t(why), std::memory_order_relaxed);
    c->verdict_due.store(false, std::memory_order_relaxed);
    SD_LOG_CONN(info, *c->stat, "stays on TCP: %s", text);
}

void Engine::judge_due(Conn *c, bool rx, std::uint64_t moved) noexcept {
    if (c->verdict_due.load(std::memory_order_relaxed)) judge(c, false);
    else if (moved && c->awaiting_peer.load(std::memory_order_relaxed)) peer_wait_due(c, rx);
}

}  // namespace sd::transport
