// Readiness (readiness.hpp): what poll.cpp and epoll.cpp share, our own
// state's view of a socket and deadlines, and the timeout arguments.
#include "readiness.hpp"
#include "readiness_impl.hpp"

#include "transport/wait.hpp"

#include <cerrno>
#include <cstdint>
#include <mutex>
#include <sys/socket.h>

namespace sd::fallback {

namespace detail {

using transport::Conn;

bool user_view(Stream *s, short &bits, short &ask) noexcept {
    Conn *c = s->conn.load(std::memory_order_acquire);
    if (!c) return false;
    transport::FabricView v;
    if (!transport::fabric_view(c, v)) return false;
    const bool leaving = v.leaving;
    short b = 0;
    if (v.broken) {
        b = kReadBits | kWriteBits | POLLRDHUP | POLLERR | POLLHUP;
    } else {
        // SO_RCVLOWAT: readable from that many bytes on, as TCP's poll.
        if (v.ready >= std::uint64_t(s->rcvlowat.load(std::memory_order_relaxed))) b |= kReadBits;
        // Leaving (or committing after the peer's leave), with the fabric
        // part read (not final yet): the kernel has what comes next.
        if (v.read_out) {
            char probe;
            ssize_t n = sys.recv(s->fd.load(std::memory_order_relaxed), &probe, 1,
                                 MSG_PEEK | MSG_DONTWAIT);
            if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) b |= kReadBits;
        }
        // Leaving: urgent data (MSG_OOB) is the kernel socket's to report.
        if (leaving) {
            pollfd k{s->fd.load(std::memory_order_relaxed), POLLPRI, 0};
            if (sys.poll(&k, 1, 0) > 0 && (k.revents & POLLPRI)) b |= POLLPRI;
        }
        if (v.fin || v.closed || v.eof || s->rd_shut.load(std::memory_order_relaxed))
            b |= kReadBits | POLLRDHUP;
        // Leaving: sends take the kernel socket once what is owed to it is there.
        if (v.writable) b |= kWriteBits;
        if (v.kernel_sends) {
            pollfd k{s->fd.load(std::memory_order_relaxed), POLLOUT, 0};
            if (sys.poll(&k, 1, 0) > 0 && (k.revents & POLLOUT)) b |= kWriteBits;
        }
        // Both directions shut (the peer's FIN or our SHUT_RD, and our
        // SHUT_WR, on the fabric or on the kernel before the upgrade): TCP
        // reports a hang-up.
        if ((v.fin || v.closed || v.eof || s->rd_shut.load(std::memory_order_acquire)) &&
            (v.fin_sent || s->kernel_wr_shut.load(std::memory_order_acquire)))
            b |= POLLHUP;
        // A reset (the peer closed or died with our bytes unread): the
        // kernel's socket is closed, with an error until one call reports it.
        if (v.reset) {
            b |= kReadBits | kWriteBits | POLLRDHUP | POLLHUP;
            if (v.reset_unreported) b |= POLLERR;
        }
    }
    ask = v.fin || v.closed || v.eof ? 0 : POLLRDHUP;
    bits = b;
    return true;
}

bool has_prefix(Stream *s) noexcept {
    Prefix *p = s->prefix.load(std::memory_order_acquire);
    return p && prefix_left(p);
}

void kernel_hint(Stream *s) noexcept {
    if (Conn *c = s->conn.load(std::memory_order_acquire)) transport::kernel_eof_hint(c);
}

void enlist_stream(Stream *s, transport::Watch &w, void (*drop)(void *), void *hold) noexcept {
    // The connection, once set, stays until the stream is destroyed: the
    // hold (ours or the caller's) keeps it.
    if (Conn *c = s->conn.load(std::memory_order_acquire)) return w.on(c, drop, hold);
    if (has_prefix(s)) {
        w.on_everything();  // its bytes come from elsewhere (prefix.hpp)
    } else if (s->may_go_direct()) {
        // Woken when it gets a connection (Stream::set_conn), then watched
        // through it; a connection set before our registration is seen
        // by the second look.
        w.on(transport::attach_pollers());
        if (Conn *c = s->conn.load(std::memory_order_seq_cst)) return w.on(c, drop, hold);
    }
    if (drop) drop(hold);
}

std::uint64_t deadline_of(int timeout_ms) noexcept {
    return timeout_ms > 0 ? monotonic_ns() + std::uint64_t(timeout_ms) * 1000000ull : 0;
}

int ms_left(std::uint64_t deadline, int timeout_ms) noexcept {
    if (timeout_ms < 0) return -1;
    if (!deadline) return 0;
    std::uint64_t now = monotonic_ns();
    return now >= deadline ? 0 : int((deadline - now + 999999) / 1000000);
}

}  // namespace detail

int ms_of(const timespec *ts) noexcept {
    if (!ts) return -1;
    if (ts->tv_sec < 0 || ts->tv_nsec < 0 || ts->tv_nsec >= 1000000000) return -2;  // EINVAL
    std::uint64_t ms = std::uint64_t(ts->tv_sec) * 1000 + (std::uint64_t(ts->tv_nsec) + 999999) / 1000000;
    return ms > 0x7fffffff ? 0x7fffffff : int(ms);
}

int ms_of(const timeval *tv) noexcept {
    if (!tv) return -1;
    if (tv->tv_sec < 0 || tv->tv_usec < 0) return -2;
    std::uint64_t ms = std::uint64_t(tv->tv_sec) * 1000 + (std::uint64_t(tv->tv_usec) + 999) / 1000;
    return ms > 0x7fffffff ? 0x7fffffff : int(ms);
}

}  // namespace sd::fallback
