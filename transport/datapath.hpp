// The direct data path: a connection's bytes on the fabric, sent
// (send.cpp: inline, into the peer's ring, read zero-copy, into the peer's
// sink) and received (recv.cpp: the ring, the peer's read zero-copy
// advertisement, our own sink). The socket object that owns the connection
// (shm_fallback's Stream) decides when a call goes this way; what the path
// needs of that socket it lends for the call (SocketSide). Every function
// returns a value or -errno.
#pragma once
#include "conn.hpp"
#include "engine.hpp"
#include "wait.hpp"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

namespace sd::transport {

constexpr int kMaxSlice = 64;

inline std::size_t iov_total(const iovec *iov, int n) noexcept {
    std::size_t t = 0;
    for (int i = 0; i < n; ++i) t += iov[i].iov_len;
    return t;
}

// out[] = the bytes [skip, skip + len) of iov[]; returns the count of
// entries (at most `max`, so the slice may come out shorter).
inline int slice(const iovec *iov, int n, std::size_t skip, std::size_t len, iovec *out,
                 int max) noexcept {
    int k = 0;
    for (int i = 0; i < n && len && k < max; ++i) {
        std::size_t l = iov[i].iov_len;
        if (skip >= l) {
            skip -= l;
            continue;
        }
        std::size_t take = std::min(l - skip, len);
        out[k++] = {static_cast<char *>(iov[i].iov_base) + skip, take};
        len -= take;
        skip = 0;
    }
    return k;
}


inline ssize_t epipe(int flags) noexcept {
    if (!(flags & MSG_NOSIGNAL)) raise(SIGPIPE);
    return -EPIPE;
}

// After our own sleep was interrupted: should the call go on?
inline bool keep_going_after_eintr(std::int64_t timeout_ns) noexcept {
    // A socket with a timeout always reports EINTR, as the kernel does.
    return timeout_ns == 0 && restart_after_signal();
}

// A call inside a syscall on the fd number it read from `fd`, one that
// never blocks: `users` counts it, so that a close that moves the socket
// to a private fd (the socket's hold_for_calls) lets it finish before the
// old number goes, and none uses the number once it is closed (or reused).
template <typename F>
auto on_fd(std::atomic<int> &fd, std::atomic<int> &users, F f) noexcept {
    users.fetch_add(1, std::memory_order_seq_cst);
    auto r = f(fd.load(std::memory_order_seq_cst));
    users.fetch_sub(1, std::memory_order_release);
    return r;
}

// What the data path needs of the socket whose connection it moves, lent
// for one call. The fd and the flags are the socket's own, read where the
// path reads them (a dup and a close may change the fd number meanwhile).
struct SocketSide {
    Engine *engine;
    std::atomic<int> &fd;        // the kernel socket: sleeps, probes, logs
    std::atomic<int> &fd_users;  // calls inside a syscall on `fd` (on_fd)
    const std::atomic<bool> &nonblock;
    const std::atomic<std::int64_t> &sndtimeo_ns;  // SO_SNDTIMEO, 0: none
    // Our write side was shut on the kernel socket itself (before the
    // connection went direct).
    const std::atomic<bool> &kernel_wr_shut;
    // The peer closed: the socket's rule for the first send to it (TCP
    // takes it, and it draws the peer's reset); true if this one is it.
    bool (*closed_send)(void *sock, Conn *c) noexcept;
    void *sock;

    int kfd() const noexcept { return fd.load(std::memory_order_relaxed); }
    template <typename F>
    auto on_kfd(F f) const noexcept {
        return on_fd(fd, fd_users, f);
    }
    bool first_send_to_closed(Conn *c) const noexcept { return closed_send(sock, c); }
};

// The connection is leaving the fabric (ours or the peer's doing): a send
// lets go of the send lock, and the rest goes through the kernel.
bool leave_requested(const Conn *c) noexcept;

// shutdown(SHUT_WR) (closing.cpp): a FIN on the fabric if the connection is
// direct (fin_second: whether the peer's FIN came first). True if the
// kernel socket's FIN must wait: the connection is on the fabric or
// leaving it (a leave writes what it owes the kernel socket first).
bool shut_write(const SocketSide &s, Conn *c, std::atomic<bool> &fin_second) noexcept;
// The last close of the socket (closing.cpp): direct, our CLOSE on the
// fabric after the staged bytes (bounded), a reset if the peer's bytes
// are unread or `abort` (SO_LINGER {1, 0}); left, what is owed to the
// kernel socket first (bounded).
void close_conn(const SocketSide &s, Conn *c, bool abort) noexcept;

// send.cpp (tx_lock held, the connection direct): `total` bytes of `iov`.
// Bytes sent or -errno; -ESTALE (and *left) when the connection is
// leaving the fabric: the rest goes through the kernel once the leave is
// under way.
ssize_t direct_send(const SocketSide &s, Conn *c, const iovec *iov, int iovcnt, std::size_t total,
                    int flags, bool *left) noexcept;
// The staged bytes go out (tx_lock held), waiting for credits if
// `blocking`, at most until `deadline` (0: none).
int flush_locked(const SocketSide &s, Conn *c, bool blocking, std::uint64_t deadline) noexcept;

// How much of the kernel socket a look at the fabric takes in.
enum class KernelLook {
    none,   // the fabric only: a spin's look, no system call
    due,    // also the bytes due there (before the peer's switch point,
            // after its leave)
    probe,  // and, with nothing on the fabric, a probe of the companion
            // for the peer's end (EOF or reset without a word on the fabric)
    paced,  // as `probe` when the connection's probe is due (recv.cpp's
            // probe_due: the companion or the peer's death said something,
            // or the last probe is kProbeEveryNs old), else as `due`
};
// A non-blocking recv that finds nothing probes the companion at most this
// often, unless the peer's end is already known (recv.cpp's probe_due).
inline constexpr std::uint64_t kProbeEveryNs = 10'000'000;

// recv.cpp: one look at what the connection has for a recv that has
// `skip` of `total` bytes already: bytes (the companion socket's before
// the peer's switch point, then the ring's or the peer's advertised
// buffer's), 0 at EOF, -EAGAIN (nothing now, as far as `look` looked),
// -ESTALE (off the fabric now: the kernel has the rest), or -errno.
ssize_t try_recv(const SocketSide &s, Conn *c, const iovec *iov, int iovcnt, std::size_t skip,
                 std::size_t total, int flags, KernelLook look) noexcept;
// Write zero-copy, receive side: nothing to read, so `piece` (one
// buffer of the caller's) is advertised and the peer's next send
// writes into it. Bytes written, -EAGAIN (over without bytes: other
// bytes came first, or the deadline), -EINTR, or -EALREADY (not
// possible now: the usual wait). It spins on the caller's `slot`;
// `tmo` is the socket's SO_RCVTIMEO.
ssize_t recv_sink(const SocketSide &s, Conn *c, const iovec &piece, std::uint64_t deadline,
                  std::int64_t tmo, SpinSlot &slot) noexcept;

}  // namespace sd::transport
