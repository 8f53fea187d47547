// The ends of our sending direction on the fabric: shutdown(SHUT_WR) and
// the last close of a connection (datapath.hpp).
#include "conn_impl.hpp"
#include "datapath.hpp"

namespace sd::transport {

bool shut_write(const SocketSide &s, Conn *c, std::atomic<bool> &fin_second) noexcept {
    Engine *engine = s.engine;
    std::lock_guard tx(c->tx_lock);
    const bool direct = c->is_direct() && !leave_requested(c);
    int rc = direct && !wr_shut(c, s.kernel_wr_shut) ? flush_locked(s, c, true, 0) : 0;
    if (direct && rc != -ESTALE) {
        // Shut on the kernel before the upgrade: the peer read our end
        // there, and the fabric says nothing more of it.
        const bool post_fin = !wr_shut(c, s.kernel_wr_shut);
        if (post_fin)
            fin_second.store(c->peer_fin(), std::memory_order_release);
        // Marked before the FIN goes: the peer may answer it at once
        // (its close), and a thread of ours polling meanwhile must see
        // our side shut with it (POLLHUP), as it is.
        (void)c->move_fin_out(FinOut::open, FinOut::fin);
        if (post_fin && engine->post(c, MsgType::fin, nullptr, 0, 0, c->tx_off, 0) == 0)
            engine->ring(c);
    }
    if (c->is_direct() || c->our_leave.load(std::memory_order_acquire) != OurLeave::none ||
        c->leave_wanted.load(std::memory_order_acquire)) {
        // On the fabric (or leaving it): the kernel's FIN waits until
        // a leave has written what it owes the kernel socket (returned
        // and staged bytes), or until close.
        c->shut_wr_deferred.store(true, std::memory_order_release);
        if (!c->is_direct()) (void)engine->leave_flush_locked(c, true, monotonic_ns() + 1000000000ull);
        return true;
    }
    return false;
}

void close_conn(const SocketSide &s, Conn *c, bool abort) noexcept {
    Engine *engine = s.engine;
    if (!c->is_direct()) {
        // Left the fabric: what is owed to the kernel goes before its close.
        std::lock_guard tx(c->tx_lock);
        // Bounded, and not ended by a signal (the bytes are the socket's
        // other holders' too).
        const std::uint64_t until = monotonic_ns() + 1000000000ull;
        while (c->leave_under_way() &&
               engine->leave_flush_locked(c, true, until) == -EINTR && monotonic_ns() < until) {
        }
        return;
    }
    std::lock_guard tx(c->tx_lock);
    // Bounded: a peer that stopped reading must not hang close().
    if (!abort) (void)flush_locked(s, c, true, monotonic_ns() + 1000000000ull);
    // Closing with the peer's bytes unread resets the connection (TCP).
    engine->progress();
    bool unread = abort;
    {
        std::lock_guard lock(c->rx_lock);
        unread = unread || c->rx_ready() != 0 ||
                 (c->switch_off != kNoOffset && c->rx_off < c->switch_off);
    }
    // Shut for writing before: the FIN went, but the peer must still learn
    // that we read no more (its sends draw a reset from now on, as TCP's).
    // Closed before the CLOSE goes, as the FIN above: a delivery that
    // answers it (under rx_lock) already finds our end closed.
    if (c->close_out() &&
        engine->post(c, MsgType::close, nullptr, 0, 0, c->tx_off, 0, unread ? kCloseReset : 0) == 0)
        engine->ring(c);
}

}  // namespace sd::transport
