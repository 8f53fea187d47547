// A state machine's moves: an enum of states, a table of the moves its
// transition function may make, one lookup in it, and the abort a checked
// build (SDIRECT_LOCK_CHECK) makes on a move the table does not hold.
// Serves a connection's states (conn_state.hpp) and a socket's phases
// (shm_fallback/phase.hpp).
#pragma once

#include <cstddef>

namespace sd::transport {

template <typename S>
struct Move {
    S from, to;
};

template <typename S, std::size_t N>
constexpr bool move_allowed(const Move<S> (&moves)[N], S from, S to) noexcept {
    for (const Move<S> &m : moves)
        if (m.from == from && m.to == to) return true;
    return false;
}

// The name of `s` in `names` (indexed by the enum), "?" past its end.
template <typename S, std::size_t N>
constexpr const char *state_name(const char *const (&names)[N], S s) noexcept {
    return std::size_t(s) < N ? names[std::size_t(s)] : "?";
}

// "sdirect: `what` moved from `from` to `to`, which its table does not
// allow", then abort.
[[noreturn]] void move_refused(const char *what, const char *from, const char *to) noexcept;

}  // namespace sd::transport
