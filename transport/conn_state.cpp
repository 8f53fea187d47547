// A connection's moves between states (conn_state.hpp): the one place the
// state changes, checked against the table in debug and sanitizer builds.
#include "conn_impl.hpp"

namespace sd::transport {

namespace {

constexpr const char *kWhat = "a connection's state";

}  // namespace

bool Conn::move(ConnState from, ConnState to) noexcept {
    return move_word(state, kConnMoves, kConnStateNames, kWhat, from, to);
}

void Conn::move_to(ConnState to) noexcept {
    // A compare-exchange per step, so that each step is checked before it
    // is made. Already in `to`, the state is written again all the same:
    // this replaces a release store, and a reader whose acquire load sees
    // `to` may count on everything written before it.
    ConnState s = state.load(std::memory_order_relaxed);
    do {
        if (s != to) check_move(kConnMoves, kConnStateNames, kWhat, s, to);
    } while (!state.compare_exchange_weak(s, to));
}

}  // namespace sd::transport
