// A connection's moves between states (conn_state.hpp): the one place the
// state changes, checked against the table in debug and sanitizer builds.
#include "conn_impl.hpp"

namespace sd::transport {

#ifdef SDIRECT_LOCK_CHECK
namespace {

[[noreturn]] void violation(ConnState from, ConnState to) noexcept {
    move_refused("a connection's state", conn_state_name(from), conn_state_name(to));
}

}  // namespace
#endif

bool Conn::move(ConnState from, ConnState to) noexcept {
#ifdef SDIRECT_LOCK_CHECK
    if (!conn_move_allowed(from, to)) violation(from, to);
#endif
    return state.compare_exchange_strong(from, to);
}

void Conn::move_to(ConnState to) noexcept {
    // A compare-exchange per step, so that each step is checked before it
    // is made. Already in `to`, the state is written again all the same:
    // this replaces a release store, and a reader whose acquire load sees
    // `to` may count on everything written before it.
    ConnState s = state.load(std::memory_order_relaxed);
    do {
#ifdef SDIRECT_LOCK_CHECK
        if (s != to && !conn_move_allowed(s, to)) violation(s, to);
#endif
    } while (!state.compare_exchange_weak(s, to));
}

}  // namespace sd::transport
