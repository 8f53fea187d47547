// TCP's abort when bytes come to an end that reads no more: an end shut
// both ways (SHUT_RD, and its FIN sent) that is sent more bytes answers
// them with a reset, as the kernel does in FIN_WAIT with its receive side
// shut. The bytes are thrown away, our own end reports the reset (recv:
// ECONNRESET once, then EOF; POLLERR until reported), and the sender is
// told with a close that carries the reset (kCloseReset), so that its
// sends fail and its poll reports POLLERR, as after the kernel's RST.
#include "conn_impl.hpp"
#include "engine.hpp"

#include "log.hpp"

namespace sd::transport {

bool Engine::refuse_at_shut_end_locked(Conn *c, std::uint64_t len, bool *answer) noexcept {
    if (!len || !c->rd_shut.load(std::memory_order_acquire) ||
        !c->fin_sent())
        return false;
    if (!c->reset_seen()) {
        SD_LOG(debug, "conn %u: %llu bytes came after SHUT_RDWR: reset", c->id,
               (unsigned long long)len);
        c->reset_comes();
        if (c->fin_off == kNoOffset) c->fin_off = c->rx_expect();
        c->peer_closed.store(true, std::memory_order_release);
        *answer = true;
    }
    return true;
}

void Engine::answer_reset(Conn *c) noexcept {
    // Our FIN was the last of our stream: the reset goes at its offset
    // (tx_off no longer moves once our FIN is sent: fin_out).
    if (c->close_out() &&
        post(c, MsgType::close, nullptr, 0, 0, c->tx_off, 0, kCloseReset) == 0)
        ring(c);
}

void Engine::closed_before_ours_locked(Conn *c) noexcept {
    // Its counters (its process page) say what it read: fabric bytes of
    // ours beyond that came to a closed socket, which TCP answers with a
    // reset, after the FIN (EPIPE).
    const std::uint64_t read = peer_read(c);
    if (read == kNoOffset ||
        c->stat->tx_fabric.load(std::memory_order_relaxed) - c->tx_fabric_base <= read)
        return;
    c->reset_after_fin();
}

void Engine::sent_past_fin_locked(Conn *c) noexcept {
    // The peer's end may be shut for reading too: then these bytes draw
    // its reset, which TCP's peer answers at once, whether or not its
    // application calls in. Its control thread takes them (once).
    // A load first: every send comes here, and only the first after the
    // FIN moves the word.
    if (c->fin_in.load(std::memory_order_acquire) != FinIn::came) return;
    if (c->move_fin_in(FinIn::came, FinIn::kicked)) kick(c->peer);
}

}  // namespace sd::transport
