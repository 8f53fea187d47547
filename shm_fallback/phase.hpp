// A socket's phase: where it is between socket() and its attach, or that
// it listens. Every change but two goes through Stream::move (a
// compare-exchange from the phase the caller saw) and is one of the moves
// below; the same table is in docs/ARCHITECTURE.md ("A socket's phases").
// The two are set whatever the phase was (Stream::reset_to): fresh, for a
// stream taken from the pool for a new socket, and listener, once the
// kernel accepted listen().
#pragma once

#include "transport/moves.hpp"

#include <cstddef>
#include <cstdint>
#include <iterator>

namespace sd::fallback {

enum class Phase : std::uint8_t {
    fresh,       // not connected yet (or connect still in progress)
    connecting,  // non-blocking connect under way: attach at first use
    deferred,    // accepted: attached at its first I/O (so that a server
                 // that accepts, forks and closes never upgrades it)
    attaching,   // one thread attaches; the others wait for it
    attached,    // connected; `conn` set (or null when untracked)
    listener,
};

inline constexpr transport::Move<Phase> kPhaseMoves[] = {
    // connect() returned EINPROGRESS, EALREADY or EINTR
    {Phase::fresh, Phase::connecting},
    // accept() returned it; a new image took in, from an exec, a socket
    // direct in another process or shared through fork
    {Phase::fresh, Phase::deferred},
    // connect() returned 0; a new image took one in at its offsets
    {Phase::fresh, Phase::attaching},
    // its first use (once the handshake is done), or its first I/O
    {Phase::connecting, Phase::attaching},
    {Phase::deferred, Phase::attaching},
    // the attach is done: a connection, pending the engine, earning its
    // upgrade, or on TCP by a rule
    {Phase::attaching, Phase::attached},
    // never attached: on TCP for good, handed over to an exec, or taken
    // over from holders that do not use it
    {Phase::connecting, Phase::attached},
    {Phase::deferred, Phase::attached},
    // a fork child (its parent's connection is not its own), or the last
    // holder of a socket shared through fork: attached at its next call
    {Phase::connecting, Phase::deferred},
    {Phase::attaching, Phase::deferred},
    {Phase::attached, Phase::deferred},
};

inline constexpr Phase kPhaseResets[] = {Phase::fresh, Phase::listener};

constexpr bool phase_move_allowed(Phase from, Phase to) noexcept {
    return transport::move_allowed(kPhaseMoves, from, to);
}

constexpr bool phase_reset_allowed(Phase to) noexcept {
    for (Phase p : kPhaseResets)
        if (p == to) return true;
    return false;
}

// For messages: "fresh", "connecting" ... (in Phase's order).
inline constexpr const char *kPhaseNames[] = {"fresh",     "connecting", "deferred",
                                              "attaching", "attached",   "listener"};
static_assert(std::size(kPhaseNames) == std::size_t(Phase::listener) + 1);
constexpr const char *phase_name(Phase p) noexcept {
    return transport::state_name(kPhaseNames, p);
}

}  // namespace sd::fallback
