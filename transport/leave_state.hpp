// A leave of the fabric (leave.cpp) as three words of the Conn. Ours
// (OurLeave): not owed, owed (the peer left and our answer has not gone),
// sent as the answer, or sent first (the peer's leave may come after it).
// The bytes the peer returns when it left first (GiveBack): awaited, all
// here, or none (not owed, written to the kernel socket, or given up).
// Whether the peer's side comes back to kernel mode instead of final
// (Rearm): wanted, due, or none.
// Each changes only by its Conn::move_* function (a compare-exchange from
// the state the caller saw, each a move of its table below) and the Conn
// functions built on it (leave_state.cpp); the same tables are in
// docs/ARCHITECTURE.md ("Leaving the fabric").
#pragma once

#include "moves.hpp"

#include <cstddef>
#include <cstdint>
#include <iterator>

namespace sd::transport {

enum class OurLeave : std::uint32_t {
    none,
    // The peer's leave came: ours is owed, sent by the next holder of the
    // send lock (or the flush pass) before any byte of ours goes to the
    // kernel socket.
    owed,
    // Sent as the answer to the peer's leave: we keep its unread bytes
    // and read them ourselves.
    answered,
    // Sent first (the peer had not left, or had and we did not answer
    // yet): what we hold unread goes back to the peer.
    first,
    // Sent first, and the peer's leave came after it (its answer, or its
    // own crossing ours).
    first_answered,
};

inline constexpr Move<OurLeave> kLeaveMoves[] = {
    // The peer's leave came (Engine::on_leave).
    {OurLeave::none, OurLeave::owed},
    {OurLeave::first, OurLeave::first_answered},
    // Our answer went (Engine::leave_work_locked).
    {OurLeave::owed, OurLeave::answered},
    // We leave (Engine::leave_locked): first, even with the peer's leave
    // here and not answered yet.
    {OurLeave::none, OurLeave::first},
    {OurLeave::owed, OurLeave::first},
    // Kernel mode again (Engine::rearm_locked: rearmed, or taken back
    // after a handoff); from owed when
    // the peer died before our answer went.
    {OurLeave::owed, OurLeave::none},
    {OurLeave::answered, OurLeave::none},
    {OurLeave::first, OurLeave::none},
    {OurLeave::first_answered, OurLeave::none},
};

constexpr bool leave_move_allowed(OurLeave from, OurLeave to) noexcept {
    return move_allowed(kLeaveMoves, from, to);
}

constexpr bool leave_sent(OurLeave s) noexcept {
    return s == OurLeave::answered || s == OurLeave::first || s == OurLeave::first_answered;
}
// The peer's leave came and is not answered by ours, or came after ours.
constexpr bool leave_due(OurLeave s) noexcept {
    return s == OurLeave::owed || s == OurLeave::first_answered;
}

enum class GiveBack : std::uint32_t {
    none,
    // The peer left first: it returns the bytes of ours it held unread
    // (give_back messages), written to the kernel socket before any new
    // byte of ours.
    awaited,
    complete,  // the last piece came (the bytes are in Conn::back)
};

inline constexpr Move<GiveBack> kGiveBackMoves[] = {
    // The peer's leave came, flagged first (Engine::on_leave).
    {GiveBack::none, GiveBack::awaited},
    // Its last give_back message (Engine::on_give_back).
    {GiveBack::awaited, GiveBack::complete},
    // Written to the kernel socket (write_owed_locked); given up: the
    // peer died or closed its end before returning them; kernel mode
    // again (rearm_locked).
    {GiveBack::complete, GiveBack::none},
    {GiveBack::awaited, GiveBack::none},
};

// After the peer's leave for sharing (or for an exec that hands the
// connection over): instead of final, kernel mode again once the fabric
// part is over, awaiting an upgrade (from whichever process holds the
// peer's socket then, or the new image).
enum class Rearm : std::uint32_t {
    none,
    wanted,  // decided when the peer's leave came (under rx_lock)
    // The fabric part is read and nothing is owed: the flush pass (or the
    // next send) rearms it, with both locks.
    due,
};

inline constexpr Move<Rearm> kRearmMoves[] = {
    // The peer left for sharing or an exec, both directions open, not
    // crossing a leave of ours (Engine::on_leave).
    {Rearm::none, Rearm::wanted},
    // Its fabric part read, nothing owed (Conn::settle_left_locked).
    {Rearm::wanted, Rearm::due},
    // Rearmed (rearm_locked), or handed over instead
    // (final_to_handoff_locked); from wanted when it went final another
    // way (the peer died during the leave) and a take-back rearms it.
    {Rearm::due, Rearm::none},
    {Rearm::wanted, Rearm::none},
};

// For messages: "none", "owed" ...; "none", "awaited", "complete";
// "none", "wanted", "due" (in the enums' order).
inline constexpr const char *kOurLeaveNames[] = {"none", "owed", "answered", "first",
                                                 "first_answered"};
inline constexpr const char *kGiveBackNames[] = {"none", "awaited", "complete"};
inline constexpr const char *kRearmNames[] = {"none", "wanted", "due"};
static_assert(std::size(kOurLeaveNames) == std::size_t(OurLeave::first_answered) + 1);
static_assert(std::size(kGiveBackNames) == std::size_t(GiveBack::complete) + 1);
static_assert(std::size(kRearmNames) == std::size_t(Rearm::due) + 1);
constexpr const char *our_leave_name(OurLeave s) noexcept { return state_name(kOurLeaveNames, s); }

}  // namespace sd::transport
