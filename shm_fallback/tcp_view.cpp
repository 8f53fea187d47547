// What the kernel socket would say of a direct connection had it carried
// the bytes itself: the TCP state that TCP_INFO reports, a send of nothing
// after the peer's close or reset, and connect(AF_UNSPEC), which TCP
// answers by disconnecting (a reset both ways).
#include "stream.hpp"

#include "transport/sys.hpp"

#include <cerrno>
#include <csignal>
#include <netinet/tcp.h>

namespace sd::fallback {

using transport::Conn;
using transport::ConnState;
using transport::kNoOffset;

int Stream::tcp_state(int kernel) noexcept {
    Conn *c = conn.load(std::memory_order_acquire);
    if (!c || !engine) return kernel;
    const ConnState st = transport::state_of(c);
    if (st != ConnState::direct && st != ConnState::leaving) return kernel;
    // The kernel socket's own FIN waits while the fabric carries the
    // stream: its state says ESTABLISHED (or CLOSE_WAIT once the peer's
    // process closed it) whatever the fabric said. A state further on
    // (a reset, a disconnect) is the kernel's to tell.
    if (kernel != TCP_ESTABLISHED && kernel != TCP_CLOSE_WAIT) return kernel;
    engine->progress();
    const bool fin = peer_fin_seen(c);
    if (transport::reset_seen(c) || transport::broken(c))
        return TCP_CLOSE;
    const bool ours = transport::fin_sent(c);
    if (fin && !ours) return TCP_CLOSE_WAIT;
    if (ours && !fin) return TCP_FIN_WAIT2;
    if (ours && fin)  // the end that shut first waits in TIME_WAIT
        return shut_second.load(std::memory_order_acquire) ? TCP_CLOSE : TCP_TIME_WAIT;
    return kernel;
}

bool Stream::peer_fin_seen(Conn *c) noexcept {
    return transport::peer_fin(c);
}

ssize_t Stream::send_nothing(Conn *c, int flags) noexcept {
    // TCP's send of no bytes still reports the connection's error first:
    // a pending reset (once), then EPIPE for a connection that is over; a
    // peer that only closed takes it (nothing goes out, nothing is drawn).
    const int e = transport::take_reset(c);
    if (e == ECONNRESET) return -e;
    if (e || transport::reset_seen(c) || transport::broken(c) ||
        drew_reset.load(std::memory_order_acquire)) {
        if (!(flags & MSG_NOSIGNAL)) raise(SIGPIPE);
        return -EPIPE;
    }
    return 0;
}

void Stream::draw_kernel_reset() noexcept {
    // The peer's process closed its kernel socket (its CLOSE on the fabric
    // comes just before that close): a byte arriving there, or left unread
    // in it, draws a reset.
    const char byte = 0;
    (void)transport::sys.send(kfd(), &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void Stream::disconnect() noexcept {
    // The kernel socket disconnects it (a reset to the peer, our socket
    // unconnected): it must carry the connection first, for good, so that
    // the peer's end leaves the fabric too and hears of the reset.
    to_kernel_for_good(transport::Reason::disconnect);
}

}  // namespace sd::fallback
