// The ends of a connection's two streams on the fabric, each one word:
// ours (FinOut: open, our FIN sent, our CLOSE sent) and the peer's as our
// send side sees it (FinIn: open, its FIN or CLOSE came, our first send
// after it made its process take it). Changed only by Conn::move_fin_out
// and Conn::move_fin_in (compare-exchanges from the state the caller saw,
// each a move of the tables below: fin_state.cpp); the same tables are in
// docs/ARCHITECTURE.md ("The ends of the streams").
#pragma once

#include "moves.hpp"

#include <cstddef>
#include <cstdint>
#include <iterator>

namespace sd::transport {

enum class FinOut : std::uint32_t {
    open,
    // Our FIN went (shutdown(SHUT_WR)), or nothing more goes (a broken
    // connection's detach): no byte of ours follows on the fabric.
    fin,
    // Our CLOSE went (close, or the answer to bytes after our SHUT_RDWR,
    // itself a CLOSE): the peer knows we read no more. A FIN before it
    // does not say that.
    closed,
};

enum class FinIn : std::uint32_t {
    open,
    came,    // the peer's FIN (or CLOSE) came, with fin_off
    // Our first send after it kicked the peer's control thread, so that
    // its process takes the bytes (and answers them) even when its
    // application does not call in (abort.cpp).
    kicked,
};

inline constexpr Move<FinOut> kFinOutMoves[] = {
    // shutdown(SHUT_WR) on the fabric; the detach of a broken connection.
    {FinOut::open, FinOut::fin},
    // close (or detach) without a shutdown before it.
    {FinOut::open, FinOut::closed},
    // close after a shutdown; the reset answer to bytes after SHUT_RDWR.
    {FinOut::fin, FinOut::closed},
};

inline constexpr Move<FinIn> kFinInMoves[] = {
    // Its FIN or CLOSE message (deliver.cpp).
    {FinIn::open, FinIn::came},
    // Our first send after it (Engine::sent_past_fin_locked).
    {FinIn::came, FinIn::kicked},
};

constexpr bool fin_out_move_allowed(FinOut from, FinOut to) noexcept {
    return move_allowed(kFinOutMoves, from, to);
}
constexpr bool fin_in_move_allowed(FinIn from, FinIn to) noexcept {
    return move_allowed(kFinInMoves, from, to);
}

// For messages: "open", "fin", "closed"; "open", "came", "kicked" (in the
// enums' order).
inline constexpr const char *kFinOutNames[] = {"open", "fin", "closed"};
inline constexpr const char *kFinInNames[] = {"open", "came", "kicked"};
static_assert(std::size(kFinOutNames) == std::size_t(FinOut::closed) + 1);
static_assert(std::size(kFinInNames) == std::size_t(FinIn::kicked) + 1);

}  // namespace sd::transport
