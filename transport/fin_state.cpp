// The ends of a connection's streams (fin_state.hpp): their moves, the one
// place each word changes, checked against its table in debug and
// sanitizer builds.
#include "conn_impl.hpp"

#include <cstdio>
#include <cstdlib>

namespace sd::transport {

const char *fin_out_name(FinOut s) noexcept {
    switch (s) {
    case FinOut::open: return "open";
    case FinOut::fin: return "fin";
    case FinOut::closed: return "closed";
    }
    return "?";
}

const char *fin_in_name(FinIn s) noexcept {
    switch (s) {
    case FinIn::open: return "open";
    case FinIn::came: return "came";
    case FinIn::kicked: return "kicked";
    }
    return "?";
}

namespace {

#ifdef SDIRECT_LOCK_CHECK
[[noreturn]] void violation(const char *what, const char *from, const char *to) noexcept {
    std::fprintf(stderr, "sdirect: %s moved from %s to %s, which its table does not allow\n", what,
                 from, to);
    std::abort();
}
#endif

}  // namespace

// Both sequentially consistent compare-exchanges, so at least a release:
// whoever sees the new state with an acquire load sees what was written
// before the move (for the peer's FIN, fin_off).
bool Conn::move_fin_out(FinOut from, FinOut to) noexcept {
#ifdef SDIRECT_LOCK_CHECK
    if (!fin_out_move_allowed(from, to))
        violation("our end of a connection", fin_out_name(from), fin_out_name(to));
#endif
    return fin_out.compare_exchange_strong(from, to);
}

bool Conn::move_fin_in(FinIn from, FinIn to) noexcept {
#ifdef SDIRECT_LOCK_CHECK
    if (!fin_in_move_allowed(from, to))
        violation("the peer's end of a connection", fin_in_name(from), fin_in_name(to));
#endif
    return fin_in.compare_exchange_strong(from, to);
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
