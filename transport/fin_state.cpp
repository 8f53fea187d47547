// The ends of a connection's streams (fin_state.hpp): their moves, the one
// place each word changes, checked against its table in debug and
// sanitizer builds.
#include "conn_impl.hpp"

namespace sd::transport {

// Both sequentially consistent compare-exchanges (move_word), so at least
// a release: whoever sees the new state with an acquire load sees what was
// written before the move (for the peer's FIN, fin_off).
bool Conn::move_fin_out(FinOut from, FinOut to) noexcept {
    return move_word(fin_out, kFinOutMoves, kFinOutNames, "our end of a connection", from, to);
}

bool Conn::move_fin_in(FinIn from, FinIn to) noexcept {
    return move_word(fin_in, kFinInMoves, kFinInNames, "the peer's end of a connection", from, to);
}

bool Conn::close_out() noexcept {
    FinOut s = fin_out.load(std::memory_order_acquire);
    while (s != FinOut::closed) {
        if (move_fin_out(s, FinOut::closed)) return true;
        s = fin_out.load(std::memory_order_acquire);
    }
    return false;
}

}  // namespace sd::transport
