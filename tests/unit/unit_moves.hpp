// A state word's table of moves (transport/moves.hpp) as its unit tests
// check it: the moves it must allow and those it must not, no move from a
// state to itself, and each move listed once; whether this build aborts on
// a refused move.
#pragma once
#include <catch2/catch.hpp>

#include "transport/lock_order.hpp"
#include "transport/moves.hpp"

#include <array>
#include <cstddef>
#include <initializer_list>
#include <type_traits>
#include <utility>

// Every state of S in its order, one per name of `names` (indexed by the
// enum, as state_name reads it).
template <typename S, std::size_t M>
constexpr std::array<S, M> all_states(const char *const (&)[M]) noexcept {
    return [] <std::size_t... I>(std::index_sequence<I...>) {
        return std::array<S, M>{S(I)...};
    }(std::make_index_sequence<M>{});
}

// `moves` allows every move of `allowed` and none of `refused`, none from a
// state to itself, and allows as many pairs of states as it lists moves
// (no pair listed twice).
template <typename S, std::size_t N, std::size_t M>
void check_table(const sd::transport::Move<S> (&moves)[N], const char *const (&names)[M],
                 std::type_identity_t<std::initializer_list<sd::transport::Move<S>>> allowed,
                 std::type_identity_t<std::initializer_list<sd::transport::Move<S>>> refused) {
    using sd::transport::move_allowed;
    using sd::transport::state_name;
    for (const auto &m : allowed) {
        INFO("allowed: " << state_name(names, m.from) << " -> " << state_name(names, m.to));
        CHECK(move_allowed(moves, m.from, m.to));
    }
    for (const auto &m : refused) {
        INFO("refused: " << state_name(names, m.from) << " -> " << state_name(names, m.to));
        CHECK_FALSE(move_allowed(moves, m.from, m.to));
    }
    int pairs = 0;
    for (S from : all_states<S>(names)) {
        INFO("to itself: " << state_name(names, from));
        CHECK_FALSE(move_allowed(moves, from, from));
        for (S to : all_states<S>(names)) pairs += move_allowed(moves, from, to);
    }
    CHECK(pairs == int(N));
}

// Debug and sanitizer builds (SDIRECT_LOCK_CHECK) check moves as they
// check the lock order; a release build says it skips.
inline bool moves_checked() {
    if (sd::transport::lock_order::checked()) return true;
    WARN("SKIPPED: this build does not check moves (release)");
    return false;
}
