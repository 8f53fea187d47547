// A connection's reset (reset_state.hpp): its moves, the one place the word
// changes, checked against the table in debug and sanitizer builds.
#include "conn_impl.hpp"

#include <cerrno>

namespace sd::transport {

bool Conn::move_reset(ResetState from, ResetState to) noexcept {
    // Sequentially consistent (move_word), so at least a release: whoever
    // sees the new state (an acquire load) sees what was written before
    // the move (the peer's end, peer_closed).
    return move_word(reset, kResetMoves, kResetStateNames, "a connection's reset", from, to);
}

void Conn::reset_comes(bool after_fin) noexcept {
    (void)move_reset(ResetState::none,
                     after_fin ? ResetState::unreported_after_fin : ResetState::unreported);
}

void Conn::reset_after_fin() noexcept {
    ResetState s = reset.load(std::memory_order_acquire);
    while ((s == ResetState::none || s == ResetState::unreported) &&
           !move_reset(s, ResetState::unreported_after_fin))
        s = reset.load(std::memory_order_acquire);
}

void Conn::reset_told() noexcept {
    move_word_to(reset, ResetState::reported,
                 [this](ResetState from, ResetState to) { return move_reset(from, to); });
}

int Conn::take_reset() noexcept {
    ResetState s = reset.load(std::memory_order_acquire);
    while (reset_unreported(s)) {
        // Exactly one caller wins the move, and reports it.
        if (move_reset(s, ResetState::reported))
            return s == ResetState::unreported_after_fin ? EPIPE : ECONNRESET;
        s = reset.load(std::memory_order_acquire);
    }
    return 0;
}

}  // namespace sd::transport
