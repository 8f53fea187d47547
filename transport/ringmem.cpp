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

#include "log.hpp"
#include "settings.hpp"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>

namespace sd::transport {

namespace {

constexpr std::size_t kHugePage = std::size_t(2) << 20;
// madvise's synchronous collapse into huge pages (Linux 6.1; glibc's
// headers name it only from 2.37).
constexpr int kMadvCollapse = 25;

std::size_t mapped_len(std::uint32_t cap) noexcept {
    const std::size_t page = std::size_t(sysconf(_SC_PAGESIZE));
    return (std::size_t(cap) + page - 1) / page * page;
}

}  // namespace

char *ring_alloc(std::uint32_t cap) noexcept {
    // A mapping of its own (not malloc): its addresses are never handed to
    // another allocation while a reservation holds them. Where it spans a
    // huge page it starts on one (the addresses around it are given back),
    // so that ring_filled can back it with huge pages; until then small
    // pages only, even where the kernel would give huge ones at the first
    // touch ("always"): a connection that passes a few bytes touches a few
    // pages of its ring, not 2 MB.
    const std::size_t len = mapped_len(cap);
    const std::size_t align = len >= kHugePage ? kHugePage : 0;
    void *p = mmap(nullptr, len + align, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    char *const got = static_cast<char *>(p);
    if (!align) return got;
    char *const ring = reinterpret_cast<char *>(
        (reinterpret_cast<std::uintptr_t>(got) + align - 1) & ~std::uintptr_t(align - 1));
    if (ring > got) munmap(got, std::size_t(ring - got));
    if (char *const end = got + len + align; end > ring + len) munmap(ring + len, std::size_t(end - (ring + len)));
    (void)madvise(ring, len, MADV_NOHUGEPAGE);
    return ring;
}

void Engine::ring_filled(Conn *c) noexcept {
    const std::size_t len = mapped_len(c->ring_cap);
    if (!settings().ring_huge || !c->ring || len < kHugePage) return;
    // Every page is resident already: huge pages cost no more memory, and
    // the peer's writes pin (and the reader's copies translate) one page
    // a 2 MB where they took 512. MADV_COLLAPSE (Linux 6.1) copies the
    // ring into them now, whatever the system's THP setting. A page that
    // another holds at that instant (the peer's write into it under way,
    // or a fresh page not yet on the kernel's lists) makes it refuse with
    // EAGAIN, and the copy under way is never lost: the next ring's worth
    // asks again, up to Conn::kRingHugeTries times. Refused for good (an
    // older kernel, no huge page free): the ring stays as it was.
    int err = 0;
    if (madvise(c->ring, len, MADV_HUGEPAGE) != 0 || madvise(c->ring, len, kMadvCollapse) != 0)
        err = errno;
    unsigned tries;
    {
        std::lock_guard rx(c->rx_lock);
        tries = c->huge_tries;
        if (err == EAGAIN && tries < Conn::kRingHugeTries) return;
        c->huge_tries = Conn::kRingHugeTries;  // asked no more
    }
    if (err)
        SD_LOG(debug, "conn %u: ring not backed by huge pages (try %u): %s", c->id, tries,
               std::strerror(err));
    else
        SD_LOG(debug, "conn %u: ring of %zu KiB backed by huge pages (try %u)", c->id, len >> 10,
               tries);
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
