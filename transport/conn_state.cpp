// A connection's moves between states (conn_state.hpp): the one place the
// state changes, checked against the table in debug and sanitizer builds.
#include "conn_impl.hpp"

namespace sd::transport {

namespace {

constexpr const char *kWhat = "a connection's state";

}  // namespace

// A move may make the socket ready (or hand it back to the kernel): the
// epoll entry watching it looks again at its next look (mark_touched).
bool Conn::move(ConnState from, ConnState to) noexcept {
    if (!move_word(state, kConnMoves, kConnStateNames, kWhat, from, to)) return false;
    mark_touched(this);
    return true;
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
    mark_touched(this);
}

}  // namespace sd::transport
