// A state machine's moves: an enum of states, a table of the moves its
// transition function may make, one lookup in it, the names of its states
// for messages, the abort a checked build (SDIRECT_LOCK_CHECK) makes on a
// move the table does not hold, and the one compare-exchange that moves a
// state word. Serves a connection's states (conn_state.hpp), its reset
// (reset_state.hpp), the ends of its streams (fin_state.hpp), its leave of
// the fabric (leave_state.hpp) and a socket's phases
// (shm_fallback/phase.hpp).
#pragma once

#include <atomic>
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

// In a checked build, aborts (move_refused, naming `what` and both states)
// unless `moves` holds from -> to; elsewhere nothing.
template <typename S, std::size_t N, std::size_t M>
inline void check_move([[maybe_unused]] const Move<S> (&moves)[N],
                       [[maybe_unused]] const char *const (&names)[M],
                       [[maybe_unused]] const char *what, [[maybe_unused]] S from,
                       [[maybe_unused]] S to) noexcept {
#ifdef SDIRECT_LOCK_CHECK
    if (!move_allowed(moves, from, to))
        move_refused(what, state_name(names, from), state_name(names, to));
#endif
}

// A state word's move from the state the caller saw: checked (check_move),
// then one sequentially consistent compare-exchange, so at least a
// release: whoever sees the new state with an acquire load sees what was
// written before the move. False if another thread moved it first.
template <typename S, std::size_t N, std::size_t M>
inline bool move_word(std::atomic<S> &word, const Move<S> (&moves)[N],
                      const char *const (&names)[M], const char *what, S from, S to) noexcept {
    check_move(moves, names, what, from, to);
    return word.compare_exchange_strong(from, to);
}

// `word` to `to` from whatever state it is in, nothing if already there:
// each try one move by `move` (the word's move function) from the state
// last seen, again if another thread moved first.
template <typename S, typename MoveFn>
inline void move_word_to(const std::atomic<S> &word, S to, MoveFn move) noexcept {
    S s = word.load(std::memory_order_acquire);
    while (s != to && !move(s, to)) s = word.load(std::memory_order_acquire);
}

}  // namespace sd::transport
