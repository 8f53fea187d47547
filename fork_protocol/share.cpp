// Sockets shared through fork: before a fork, each connected socket is
// marked shared (its holders counted together in the sharers arena, or,
// for one already direct, who holds it kept for the owner's last close);
// after it, the child keeps none of its parent's connection state. The
// holder that finds itself alone takes the shared counts as its own and
// upgrades the socket again (adopt_share), or, where its own connection
// left the fabric for the sharing, brings that connection back to kernel
// mode from the holders' counts (rejoin_locked).
#include "shm_fallback/stream.hpp"

#include "transport/log.hpp"

#include <mutex>
#include <new>

namespace sd::fallback {

using transport::Conn;
using transport::ConnState;

void Stream::fork_prepare(unsigned mark) noexcept {
    if (fork_mark == mark) return;  // another fd of the same socket
    fork_mark = mark;
    Phase p = phase.load(std::memory_order_acquire);
    if (p == Phase::fresh || p == Phase::listener) return;
    forked = true;
    if (orphan.load(std::memory_order_relaxed)) {
        // Another process's connection: the child holds it too.
        if (Sharers *h = holders.load(std::memory_order_relaxed)) sharers_expect_child(h);
        return;
    }
    if (Conn *c = conn.load(std::memory_order_acquire)) {
        // Not direct yet: it stays with the kernel, shared from now on.
        if (engine) engine->hold(c);
        // Direct: it stays so until the child uses it; who holds it is
        // kept, for our last close.
        if (c->is_direct() || c->is_leaving()) {
            Sharers *h = holders.load(std::memory_order_relaxed);
            if (!h && (h = sharers_open(0, 0))) {
                holders.store(h, std::memory_order_relaxed);
                c->holder_counts.store(sharers_counts(h), std::memory_order_release);
            }
            if (h) sharers_expect_child(h);
            // Answered the peer's leave with its bytes unread: whoever
            // reads next gets them (the holders' counts start after them).
            if (h && c->is_leaving() && !prefix.load(std::memory_order_relaxed))
                if (Prefix *p = prefix_from_ring(c)) {
                    prefix.store(p, std::memory_order_release);
                    if (engine) engine->want_flush(c);
                }
            // Still direct: room for what a later answer to the peer's
            // leave would keep unread, in memory the child maps too.
            if (h && !prefix.load(std::memory_order_relaxed))
                if (Prefix *p = prefix_reserve(c)) prefix.store(p, std::memory_order_release);
        } else if (Sharers *h = left_holders(c)) {
            sharers_expect_child(h);  // left for sharing: one holder more
        }
        return;
    }
    // No connection yet: the holders keep count together, and the last
    // one left upgrades it; unless it is on TCP for good.
    if (for_good.load(std::memory_order_acquire)) return;
    std::lock_guard lock(pend_lock);
    if (earn_ns) {
        // Still earning its upgrade: no builder will come for it, and
        // the holder left last upgrades it from the shared counts.
        earn_ns = 0;
        pending.store(false, std::memory_order_release);
    }
    Sharers *sh = share.load(std::memory_order_relaxed);
    // The peer may wait for an upgrade that no holder makes while it is
    // shared: our entry tells it why (the last holder's replaces it).
    if (!sh) transport::mark_unattached(kfd(), transport::Reason::shared);
    if (!sh && !(sh = sharers_open(pre_tx, pre_rx))) return;
    share.store(sh, std::memory_order_release);
    sharers_expect_child(sh);
}

void Stream::fork_child(unsigned mark, int parent) noexcept {
    if (fork_mark == mark) return;
    fork_mark = mark;
    new (&pend_lock) std::mutex();
    kernel_waiters = 0;  // the threads blocked in the parent are not here
    new (&alias_lock) std::mutex();
    refs.store(fds.load(std::memory_order_relaxed), std::memory_order_relaxed);
    calls.store(0, std::memory_order_relaxed);  // the parent's threads are not ours
    next_free = nullptr;
    Phase p = phase.load(std::memory_order_relaxed);
    if (p == Phase::fresh || p == Phase::listener) return;
    // The parent's connection state stays the parent's: the kernel socket
    // is all the child has.
    Conn *c = conn.exchange(nullptr, std::memory_order_relaxed);
    // Our parent's connection left the fabric for sharing: its holders
    // count, and so do we.
    Sharers *left = c && engine ? left_holders(c) : nullptr;
    engine = nullptr;
    pending.store(false, std::memory_order_relaxed);
    earn_ns = 0;
    forked = true;
    if (c && (c->is_direct() || c->is_leaving() || c->state.load() == ConnState::initiating ||
              c->state.load() == ConnState::committing)) {
        // Its bytes travel through the parent's endpoint: the parent moves
        // it to the kernel when we use it (claim_inherited).
        orphan.store(true, std::memory_order_relaxed);
        owner = parent;
    }
    if (Sharers *sh = share.load(std::memory_order_relaxed)) sharers_born(sh, parent);
    if (Sharers *h = holders.load(std::memory_order_relaxed)) sharers_born(h, parent);
    if (left) {
        holders.store(nullptr, std::memory_order_relaxed);
        share.store(left, std::memory_order_relaxed);
    } else if (c && !orphan.load(std::memory_order_relaxed) &&
               !share.load(std::memory_order_relaxed)) {
        // On the kernel in the parent (held, or for good): its bytes there
        // were counted by nobody, so no holder here may upgrade it from
        // counts (a later fork of ours would start them at stale offsets).
        if (Sharers *sh = sharers_open(0, 0)) {
            sharers_stick(sh);
            share.store(sh, std::memory_order_relaxed);
        }
    }
    share_check_ns = 0;
    phase.store(Phase::deferred, std::memory_order_relaxed);
}

bool Stream::adopt_share(Sharers *sh) noexcept {
    // Still waiting for this process's engine (the builder clears pending).
    if (pending.load(std::memory_order_relaxed) || !sharers_alone(sh, &share_check_ns))
        return false;
    pre_tx = sharers_sent(sh);
    pre_rx = sharers_received(sh);
    sharers_leave(sh);
    share.store(nullptr, std::memory_order_release);
    forked = false;
    SD_LOG(debug, "fd %d: the only holder left after fork; upgrading at offsets %llu/%llu",
           kfd(), (unsigned long long)pre_tx, (unsigned long long)pre_rx);
    phase.store(Phase::deferred, std::memory_order_release);
    return true;
}

void Stream::drop_share() noexcept {
    std::lock_guard lock(pend_lock);
    if (Sharers *sh = share.exchange(nullptr, std::memory_order_acq_rel)) sharers_leave(sh);
}

Sharers *Stream::left_holders(Conn *c) const noexcept {
    Sharers *h = holders.load(std::memory_order_acquire);
    if (!h || !c->holder_counts.load(std::memory_order_acquire) || sharers_stuck(h) ||
        c->state.load(std::memory_order_acquire) != ConnState::final ||
        c->stat->reason.load(std::memory_order_relaxed) != std::uint32_t(transport::Reason::shared))
        return nullptr;
    return h;
}

bool Stream::rejoin_locked(Conn *c, Sharers *h) noexcept {
    // Its leave has added our offsets (the mark), and nobody else holds it.
    if (!sharers_left(h) || !sharers_alone(h, &share_check_ns)) return false;
    const std::uint64_t sent = sharers_sent(h), received = sharers_received(h);
    const bool back = engine->rejoin_locked(c, sent, received);
    holders.store(nullptr, std::memory_order_release);
    sharers_leave(h);
    forked = false;
    if (back)
        SD_LOG(debug, "fd %d: the only holder left after its leave; kernel mode at offsets "
                      "%llu/%llu until the peer upgrades it again",
               kfd(), (unsigned long long)sent, (unsigned long long)received);
    return true;
}

}  // namespace sd::fallback
