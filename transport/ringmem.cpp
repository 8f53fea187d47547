// Receive rings: their memory, and its end. The peer writes into our ring
// with process_vm_writev (or the provider's RMA) whenever it holds credits,
// without asking us, so the ring must outlive every write it may still
// make. A connection closed here while its peer may still be sending (the
// peer has not ended its stream, lives, and its connection is open) keeps
// its ring's addresses reserved but inaccessible: a late write then fails
// (EFAULT: the peer reads our CLOSE, already in its queue, and reports
// EPIPE) instead of landing in memory this process reuses. The reservation
// is released once the peer's connection is closed too (it never writes
// after its own close) or the peer process is gone.
#include "conn_impl.hpp"
#include "engine.hpp"

#include <sys/mman.h>
#include <unistd.h>

namespace sd::transport {

namespace {

std::size_t mapped_len(std::uint32_t cap) noexcept {
    const std::size_t page = std::size_t(sysconf(_SC_PAGESIZE));
    return (std::size_t(cap) + page - 1) / page * page;
}

}  // namespace

char *ring_alloc(std::uint32_t cap) noexcept {
    // A mapping of its own (not malloc): its addresses are never handed to
    // another allocation while a reservation holds them.
    void *p = mmap(nullptr, mapped_len(cap), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<char *>(p);
}

bool Engine::peer_may_write(Conn *c) noexcept {
    // A peer of another uid is never offered the ring.
    if (!c->peer || !c->peer->page || c->peer->cross || c->peer_id >= kSlots) return false;
    {
        // Its FIN came: it writes nothing more (set by deliveries, under
        // the receive lock).
        std::lock_guard rx(c->rx_lock);
        if (c->fin_off != kNoOffset) return false;
    }
    const ConnStat &s = c->peer->page->slots[c->peer_id];
    return s.state.load(std::memory_order_acquire) == std::uint32_t(SlotState::live) &&
           peer_alive(c->peer);
}

void Engine::end_ring(Conn *c, bool keep) noexcept {
    if (!c->ring) return;
    const std::size_t len = mapped_len(c->ring_cap ? c->ring_cap : c->window);
    std::lock_guard lock(conn_lock_);
    if (keep && nretired_ < std::size(retired_) &&
        mmap(c->ring, len, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
             -1, 0) != MAP_FAILED) {
        retired_[nretired_++] = RetiredRing{c->ring, len, c->peer, c->peer_id};
    } else {
        // Full list: the reservation stays for good (addresses, no memory).
        if (keep) (void)mmap(c->ring, len, PROT_NONE,
                             MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        else munmap(c->ring, len);
        if (keep) release_peer(c->peer);
    }
    c->ring = nullptr;
    reap_rings_locked();
}

void Engine::reap_rings_locked() noexcept {
    for (std::size_t i = 0; i < nretired_;) {
        RetiredRing &r = retired_[i];
        const ConnStat &s = r.peer->page->slots[r.peer_id];
        if (s.state.load(std::memory_order_acquire) == std::uint32_t(SlotState::live) &&
            peer_alive(r.peer)) {
            ++i;
            continue;
        }
        munmap(r.mem, r.len);
        release_peer(r.peer);
        retired_[i] = retired_[--nretired_];
    }
}

}  // namespace sd::transport
