// Bytes of the peer's stream that no kernel socket can carry any more,
// shared by every holder of the socket (prefix.cpp).
#pragma once
#include "transport/conn.hpp"

#include <atomic>
#include <cstdint>
#include <sys/types.h>
#include <sys/uio.h>

namespace sd::fallback {

// Layout (one MAP_SHARED anonymous mapping, inherited by fork): taken
// (bytes read by any holder), len (bytes in it; 0 while a reserve is
// empty), cap (room for bytes), then the bytes.
struct Prefix {
    std::atomic<std::uint64_t> taken;
    std::atomic<std::uint64_t> len;
    std::uint64_t cap;
    char *bytes() noexcept { return reinterpret_cast<char *>(this + 1); }
};
static_assert(sizeof(Prefix) == 24 && std::atomic<std::uint64_t>::is_always_lock_free);

// A connection that answered its peer's leave keeps the peer's fabric
// bytes it had not read, to read them itself: the peer's kernel stream
// goes on after them. At a fork they must reach whichever holder reads
// next, so they move out of the ring (rx_off moves to the peer's end and
// the connection may go final) into a prefix. Null when there is nothing
// to move (or no memory). Called before the fork, in the parent.
Prefix *prefix_from_ring(transport::Conn *c) noexcept;
// Forked while direct: an empty prefix with room for the connection's
// whole ring, made before the fork so that every holder maps it. Should
// this process later have to give the connection up with the peer's
// bytes unread (it answered the peer's leave, then a holder claims the
// socket or it closes its copy), the engine moves them in (the
// connection's handoff room, transport::set_handoff_room;
// Engine::unread_to_handoff_locked) instead of keeping them where no
// holder can read them. Null without memory.
Prefix *prefix_reserve(transport::Conn *c) noexcept;
std::uint64_t prefix_left(const Prefix *p) noexcept;
// Takes (or with MSG_PEEK, copies) up to the iovec's length from the
// prefix, each byte for one reader only. Bytes, 0 when it is empty, or
// -EFAULT (nothing taken).
ssize_t prefix_recv(Prefix *p, const iovec *iov, int iovcnt, int flags) noexcept;
void prefix_release(Prefix *p) noexcept;

}  // namespace sd::fallback
