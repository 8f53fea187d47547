// A connection's state: whether an upgrade may still happen, is under way,
// done, being undone, or will never happen. Every change goes through
// Conn::move (a compare-exchange from the state the caller saw) or
// Conn::move_to (from whatever state it finds) and is one of the moves
// below; the same table is in docs/ARCHITECTURE.md ("A connection's
// states").
#pragma once

#include "moves.hpp"

#include <cstddef>
#include <cstdint>
#include <iterator>

namespace sd::transport {

enum class ConnState : std::uint32_t {
    kernel,      // upgrade may still happen (entry published)
    initiating,  // our upgrade request is in flight
    // We accepted a peer's request and wait for its commit: nothing goes
    // on the fabric until then, so a peer that gives up (timeout, signal,
    // fd limit, stopped) leaves both ends on TCP.
    committing,
    direct,      // peer known; our next send switches to the fabric
    // Going back to the kernel: sends take the kernel socket,
    // receives read the fabric up to the peer's end (peer_end), then the
    // kernel. Becomes final once the fabric part is read.
    leaving,
    final,       // on TCP for good (reason in the stat slot)
};

inline constexpr Move<ConnState> kConnMoves[] = {
    // Our lookup found the peer's entry: our request goes out.
    {ConnState::kernel, ConnState::initiating},
    // We accepted the peer's request and answered it; from initiating:
    // the accepting side's request crossed ours and wins.
    {ConnState::kernel, ConnState::committing},
    {ConnState::initiating, ConnState::committing},
    // Crossed requests: ours yields (the peer answered with a conflict).
    {ConnState::initiating, ConnState::kernel},
    // Our commit went out; the initiator's commit came.
    {ConnState::initiating, ConnState::direct},
    {ConnState::committing, ConnState::direct},
    // On TCP for good before any upgrade: no fabric, a refusal either
    // way, our request failed, the commit did not come, a change of
    // privileges, an exec's hand-over.
    {ConnState::kernel, ConnState::final},
    {ConnState::initiating, ConnState::final},
    {ConnState::committing, ConnState::final},
    // Our leave was sent, or the peer's came.
    {ConnState::direct, ConnState::leaving},
    // Every fabric byte of the peer is read and nothing is owed, or the
    // peer died during our leave; handed over (a handoff is set).
    {ConnState::leaving, ConnState::final},
    // The peer left for sharing or an exec: kernel mode, awaiting its
    // upgrade again; or a connection handed over is taken back
    // (Engine::take_back_locked).
    {ConnState::leaving, ConnState::kernel},
    {ConnState::final, ConnState::kernel},
};

constexpr bool conn_move_allowed(ConnState from, ConnState to) noexcept {
    return move_allowed(kConnMoves, from, to);
}

// For messages: "kernel", "initiating" ... (in ConnState's order).
inline constexpr const char *kConnStateNames[] = {"kernel", "initiating", "committing",
                                                  "direct", "leaving",    "final"};
static_assert(std::size(kConnStateNames) == std::size_t(ConnState::final) + 1);
constexpr const char *conn_state_name(ConnState s) noexcept {
    return state_name(kConnStateNames, s);
}

}  // namespace sd::transport
