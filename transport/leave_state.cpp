// Our leave of the fabric (leave_state.hpp): its moves, the one place the
// word changes, checked against the table in debug and sanitizer builds.
#include "conn_impl.hpp"

#include <cstdio>
#include <cstdlib>

namespace sd::transport {

const char *our_leave_name(OurLeave s) noexcept {
    switch (s) {
    case OurLeave::none: return "none";
    case OurLeave::owed: return "owed";
    case OurLeave::answered: return "answered";
    case OurLeave::first: return "first";
    case OurLeave::first_answered: return "first_answered";
    }
    return "?";
}

const char *give_back_name(GiveBack s) noexcept {
    switch (s) {
    case GiveBack::none: return "none";
    case GiveBack::awaited: return "awaited";
    case GiveBack::complete: return "complete";
    }
    return "?";
}

const char *rearm_name(Rearm s) noexcept {
    switch (s) {
    case Rearm::none: return "none";
    case Rearm::wanted: return "wanted";
    case Rearm::due: return "due";
    }
    return "?";
}

bool Conn::move_rearm(Rearm from, Rearm to) noexcept {
#ifdef SDIRECT_LOCK_CHECK
    if (!rearm_move_allowed(from, to)) {
        std::fprintf(stderr, "sdirect: a connection's rearm moved from %s to %s, which its table "
                             "does not allow\n", rearm_name(from), rearm_name(to));
        std::abort();
    }
#endif
    // Sequentially consistent, so at least a release: the flush pass that
    // sees due (acquire, without rx_lock) sees the receive side settled.
    return rearm.compare_exchange_strong(from, to);
}

void Conn::rearm_forget() noexcept {
    Rearm s = rearm.load(std::memory_order_acquire);
    while (s != Rearm::none && !move_rearm(s, Rearm::none)) s = rearm.load(std::memory_order_acquire);
}

bool Conn::move_leave(OurLeave from, OurLeave to) noexcept {
#ifdef SDIRECT_LOCK_CHECK
    if (!leave_move_allowed(from, to)) {
        std::fprintf(stderr, "sdirect: a connection's leave moved from %s to %s, which its table "
                             "does not allow\n", our_leave_name(from), our_leave_name(to));
        std::abort();
    }
#endif
    // Sequentially consistent, so at least a release: a sender that sees
    // our leave owed (an acquire load, without rx_lock) sees the peer's
    // end and the owed bytes' marks written before it.
    return our_leave.compare_exchange_strong(from, to);
}

bool Conn::move_give_back(GiveBack from, GiveBack to) noexcept {
#ifdef SDIRECT_LOCK_CHECK
    if (!give_back_move_allowed(from, to)) {
        std::fprintf(stderr, "sdirect: a connection's returned bytes moved from %s to %s, which "
                             "their table does not allow\n", give_back_name(from),
                     give_back_name(to));
        std::abort();
    }
#endif
    // Sequentially consistent, so at least a release: the writer that
    // sees complete (acquire, under tx_lock) sees `back` and `back_len`,
    // written by the delivery under rx_lock before it.
    return give_back.compare_exchange_strong(from, to);
}

void Conn::give_back_forget() noexcept {
    GiveBack s = give_back.load(std::memory_order_acquire);
    while (s != GiveBack::none && !move_give_back(s, GiveBack::none))
        s = give_back.load(std::memory_order_acquire);
}

void Conn::peer_left() noexcept {
    OurLeave s = our_leave.load(std::memory_order_acquire);
    for (;;) {
        const OurLeave to = s == OurLeave::none    ? OurLeave::owed
                            : s == OurLeave::first ? OurLeave::first_answered
                                                   : s;
        if (to == s || move_leave(s, to)) return;
        s = our_leave.load(std::memory_order_acquire);
    }
}

void Conn::leave_goes(bool first) noexcept {
    // From none or owed: only a holder of tx_lock sends, and the peer's
    // leave (under rx_lock) may come meanwhile.
    const OurLeave to = first ? OurLeave::first : OurLeave::answered;
    OurLeave s = our_leave.load(std::memory_order_acquire);
    while (!move_leave(s, to)) s = our_leave.load(std::memory_order_acquire);
}

void Conn::leave_forget() noexcept {
    OurLeave s = our_leave.load(std::memory_order_acquire);
    while (s != OurLeave::none && !move_leave(s, OurLeave::none))
        s = our_leave.load(std::memory_order_acquire);
}

}  // namespace sd::transport
