// A connection's reset (the peer closed or died with bytes of ours unread:
// TCP's RST) as the application learns of it: not come, come and to be
// reported once (ECONNRESET, or EPIPE when it came after the peer's FIN),
// reported. One word, changed only by Conn::move_reset (a compare-exchange
// from the state the caller saw, each a move of the table below) and the
// Conn functions built on it (reset_comes, reset_after_fin, reset_told,
// take_reset: reset_state.cpp); the same table is in docs/ARCHITECTURE.md
// ("Resets").
#pragma once

#include "moves.hpp"

#include <cstddef>
#include <cstdint>
#include <iterator>

namespace sd::transport {

enum class ResetState : std::uint32_t {
    none,
    // Come, not reported yet: POLLERR, and the next recv or send (or
    // SO_ERROR) reports ECONNRESET.
    unreported,
    // Come after the peer's FIN (TCP's CLOSE_WAIT), or drawn by a send of
    // ours to a peer that had closed: EPIPE, to a send or SO_ERROR only
    // (a recv says EOF).
    unreported_after_fin,
    // Reported once (by us, or by the kernel socket first): POLLHUP stays,
    // the error does not.
    reported,
};

inline constexpr Move<ResetState> kResetMoves[] = {
    // The peer's CLOSE with kCloseReset, its death with our bytes unread,
    // the companion's ECONNRESET, bytes after our SHUT_RDWR.
    {ResetState::none, ResetState::unreported},
    // The same after the peer's FIN; our send drew the reset of a peer
    // that had closed.
    {ResetState::none, ResetState::unreported_after_fin},
    // Fabric bytes of ours came to the peer after its close (its counters
    // say so): the reset is the one those bytes drew, after the FIN.
    {ResetState::unreported, ResetState::unreported_after_fin},
    // Reported: by our recv, send or SO_ERROR, or by the kernel socket
    // before the fabric's word of it came (then from none as well).
    {ResetState::unreported, ResetState::reported},
    {ResetState::unreported_after_fin, ResetState::reported},
    {ResetState::none, ResetState::reported},
};

constexpr bool reset_move_allowed(ResetState from, ResetState to) noexcept {
    return move_allowed(kResetMoves, from, to);
}

// Come and not reported yet.
constexpr bool reset_unreported(ResetState s) noexcept {
    return s == ResetState::unreported || s == ResetState::unreported_after_fin;
}

// For messages: "none", "unreported" ... (in ResetState's order).
inline constexpr const char *kResetStateNames[] = {"none", "unreported", "unreported_after_fin",
                                                   "reported"};
static_assert(std::size(kResetStateNames) == std::size_t(ResetState::reported) + 1);

}  // namespace sd::transport
