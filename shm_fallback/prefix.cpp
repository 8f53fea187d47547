// Unread fabric bytes handed to a socket's holders at a fork. A process
// that answered its peer's leave reads its ring up to the peer's end
// before the kernel socket, and nobody else can: the bytes are in its
// memory only, and the peer's kernel stream goes on after them. When it
// forks, a child (or the parent, or a later child) may be the one that
// reads next, so the bytes move into a shared mapping that every holder
// reads first, each byte once. The connection itself has then read its
// fabric part and goes final, its offsets handed to the holders.
#include "prefix.hpp"

#include "transport/log.hpp"
#include "transport/memguard.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <sys/mman.h>
#include <sys/socket.h>

namespace sd::fallback {

using transport::Conn;
using transport::kNoOffset;

Prefix *prefix_from_ring(Conn *c) noexcept {
    // Only the answering side of a finished leave: every fabric byte of
    // the peer is here, and nothing more comes on the fabric.
    std::unique_lock tx(c->tx_lock, std::try_to_lock);
    if (!tx.owns_lock() || !c->is_leaving() || !c->leave_sent || c->leave_first) return nullptr;
    std::lock_guard rx(c->rx_lock);
    const std::uint64_t n = c->ring_bytes();
    if (!n || c->zc.active || c->peer_end == kNoOffset || c->rx_expect() < c->peer_end ||
        c->rx_off + n != c->peer_end)
        return nullptr;
    void *m = mmap(nullptr, sizeof(Prefix) + n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
    if (m == MAP_FAILED) return nullptr;
    auto *p = static_cast<Prefix *>(m);
    p->taken.store(0, std::memory_order_relaxed);
    p->len.store(n, std::memory_order_relaxed);
    p->cap = n;
    for (std::uint64_t done = 0; done < n;) {
        const std::uint32_t at = std::uint32_t((c->ring_head + done) % c->ring_cap);
        const std::uint64_t run = std::min<std::uint64_t>(n - done, c->ring_cap - at);
        std::memcpy(p->bytes() + done, c->ring + at, run);
        done += run;
    }
    c->ring_head += n;
    c->rx_off += n;
    SD_LOG(info, "fd %d: %llu unread bytes of the peer's fabric stream go to the holders of the "
                 "socket, read first", c->stat->fd, (unsigned long long)n);
    // Read to the peer's end now: final (or handed to the holders by the
    // flush pass).
    c->settle_left_locked();
    return p;
}

Prefix *prefix_reserve(Conn *c) noexcept {
    std::uint64_t cap;
    {
        std::lock_guard rx(c->rx_lock);
        cap = c->ring_cap;
    }
    if (!cap) return nullptr;
    void *m = mmap(nullptr, sizeof(Prefix) + cap, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
    if (m == MAP_FAILED) return nullptr;
    auto *p = static_cast<Prefix *>(m);
    p->taken.store(0, std::memory_order_relaxed);
    p->len.store(0, std::memory_order_relaxed);
    p->cap = cap;
    std::lock_guard rx(c->rx_lock);
    c->spill = transport::Spill{&p->len, p->bytes(), cap};
    return p;
}

std::uint64_t prefix_left(const Prefix *p) noexcept {
    const std::uint64_t len = p->len.load(std::memory_order_acquire);
    return len - std::min(len, p->taken.load(std::memory_order_acquire));
}

ssize_t prefix_recv(Prefix *p, const iovec *iov, int iovcnt, int flags) noexcept {
    std::uint64_t want = 0;
    for (int i = 0; i < iovcnt; ++i) want += iov[i].iov_len;
    std::uint64_t from = p->taken.load(std::memory_order_acquire), n;
    for (;;) {
        const std::uint64_t len = p->len.load(std::memory_order_acquire);
        if (from >= len) return 0;
        n = std::min(want, len - from);
        // A bad buffer takes nothing, as the kernel's copy would.
        std::uint64_t left = n;
        for (int i = 0; i < iovcnt && left; ++i) {
            const std::size_t len = std::size_t(std::min<std::uint64_t>(left, iov[i].iov_len));
            if (len && !transport::writable(iov[i].iov_base, len)) return -EFAULT;
            left -= len;
        }
        if (flags & MSG_PEEK) break;
        if (p->taken.compare_exchange_weak(from, from + n, std::memory_order_acq_rel)) break;
    }
    std::uint64_t at = from, left = n;
    for (int i = 0; i < iovcnt && left; ++i) {
        const std::size_t len = std::size_t(std::min<std::uint64_t>(left, iov[i].iov_len));
        std::memcpy(iov[i].iov_base, p->bytes() + at, len);
        at += len;
        left -= len;
    }
    return ssize_t(n);
}

void prefix_release(Prefix *p) noexcept { munmap(p, sizeof(Prefix) + p->cap); }

}  // namespace sd::fallback
