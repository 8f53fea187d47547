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

namespace {

// A prefix of `n` bytes, in memory the processes forked later map too.
Prefix *prefix_map(std::uint64_t n) noexcept {
    void *m = mmap(nullptr, sizeof(Prefix) + n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
    if (m == MAP_FAILED) return nullptr;
    auto *p = static_cast<Prefix *>(m);
    p->taken.store(0, std::memory_order_relaxed);
    p->len.store(0, std::memory_order_relaxed);
    p->cap = n;
    return p;
}

}  // namespace

Prefix *prefix_from_ring(Conn *c) noexcept {
    Prefix *p = nullptr;
    const std::uint64_t n = transport::hand_ring_out(
        c,
        [](void *ctx, std::uint64_t n) -> char * {
            Prefix *&p = *static_cast<Prefix **>(ctx);
            p = prefix_map(n);
            return p ? p->bytes() : nullptr;
        },
        &p);
    if (!n) return nullptr;
    p->len.store(n, std::memory_order_relaxed);
    return p;
}

Prefix *prefix_reserve(Conn *c) noexcept {
    const std::uint64_t cap = transport::ring_capacity(c);
    if (!cap) return nullptr;
    Prefix *p = prefix_map(cap);
    if (!p) return nullptr;
    transport::set_handoff_room(c, transport::HandoffRoom{&p->len, p->bytes(), cap});
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
