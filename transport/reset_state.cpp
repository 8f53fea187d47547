// A connection's reset (reset_state.hpp): its moves, the one place the word
// changes, checked against the table in debug and sanitizer builds.
#include "conn_impl.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace sd::transport {

const char *reset_state_name(ResetState s) noexcept {
    switch (s) {
    case ResetState::none: return "none";
    case ResetState::unreported: return "unreported";
    case ResetState::unreported_after_fin: return "unreported_after_fin";
    case ResetState::reported: return "reported";
    }
    return "?";
}

bool Conn::move_reset(ResetState from, ResetState to) noexcept {
#ifdef SDIRECT_LOCK_CHECK
    if (!reset_move_allowed(from, to)) {
        std::fprintf(stderr, "sdirect: a connection's reset moved from %s to %s, which its table "
                             "does not allow\n", reset_state_name(from), reset_state_name(to));
        std::abort();
    }
#endif
    // Sequentially consistent, so at least a release: whoever sees the
    // new state (an acquire load) sees what was written before the move
    // (the peer's end, peer_closed).
    return reset.compare_exchange_strong(from, to);
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
    ResetState s = reset.load(std::memory_order_acquire);
    while (s != ResetState::reported && !move_reset(s, ResetState::reported))
        s = reset.load(std::memory_order_acquire);
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
