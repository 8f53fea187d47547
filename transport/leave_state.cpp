// A leave of the fabric (leave_state.hpp): the moves of its three words,
// the one place each changes, checked against its table in debug and
// sanitizer builds.
#include "conn_impl.hpp"

namespace sd::transport {

bool Conn::move_rearm(Rearm from, Rearm to) noexcept {
    // Sequentially consistent (move_word), so at least a release: the
    // flush pass that sees due (acquire, without rx_lock) sees the receive
    // side settled.
    return move_word(rearm, kRearmMoves, kRearmNames, "a connection's rearm", from, to);
}

void Conn::rearm_forget() noexcept {
    move_word_to(rearm, Rearm::none, [this](Rearm from, Rearm to) { return move_rearm(from, to); });
}

bool Conn::move_leave(OurLeave from, OurLeave to) noexcept {
    // Sequentially consistent (move_word), so at least a release: a
    // sender that sees our leave owed (an acquire load, without rx_lock)
    // sees the peer's end and the owed bytes' marks written before it.
    return move_word(our_leave, kLeaveMoves, kOurLeaveNames, "a connection's leave", from, to);
}

bool Conn::move_give_back(GiveBack from, GiveBack to) noexcept {
    // Sequentially consistent (move_word), so at least a release: the
    // writer that sees complete (acquire, under tx_lock) sees `back` and
    // `back_len`, written by the delivery under rx_lock before it.
    return move_word(give_back, kGiveBackMoves, kGiveBackNames, "a connection's give-back", from,
                     to);
}

void Conn::give_back_forget() noexcept {
    move_word_to(give_back, GiveBack::none,
                 [this](GiveBack from, GiveBack to) { return move_give_back(from, to); });
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
    move_word_to(our_leave, OurLeave::none,
                 [this](OurLeave from, OurLeave to) { return move_leave(from, to); });
}

}  // namespace sd::transport
