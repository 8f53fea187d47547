// A connection as the layers above transport see it: an opaque handle
// and what they may ask of it. Its fields are transport's own
// (conn_impl.hpp, which only transport's files include: a file built
// outside transport that includes it fails to compile), so a socket
// (shm_fallback), the fork protocol and the shims go through the
// functions below, named for what they need.
#pragma once
#include "conn_state.hpp"
#include "lock_order.hpp"
#include "procpage.hpp"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <netinet/in.h>

namespace sd::transport {

// What a delivery need not wake: a sleeper woken already (by the peer, or
// by another delivery), which looks at everything anyway once woken: its
// bell (-1: none) or its poller slot's bit (0: none). wait.hpp:
// latch_waker.
struct RungWaker {
    int bell;
    std::uint64_t slot_bit;
};

struct Conn;  // conn_impl.hpp

// The 4-tuple as one side sees it; also the registry key.
struct Tuple {
    std::uint16_t family;
    std::uint16_t local_port;
    std::uint16_t peer_port;
    std::uint16_t pad;
    std::uint8_t local_addr[16];
    std::uint8_t peer_addr[16];
    bool operator==(const Tuple &) const = default;
};
static_assert(sizeof(Tuple) == 40);

// Reads getsockname/getpeername of `fd`; IPv4-mapped IPv6 addresses are
// named as IPv4 (the other end of such a connection sees IPv4).
int tuple_of(int fd, Tuple &t) noexcept;
Tuple reversed(const Tuple &t) noexcept;

// The poll/select/epoll sleeps (sleep_on_fds) whose interest set holds a
// connection or an epoll set: one bit per poller slot (wait.cpp). Set by
// the sleeper before its last look, cleared after its sleep.
struct PollerMask {
    std::atomic<std::uint64_t> bits{0};
};

inline constexpr std::uint64_t kNoOffset = ~std::uint64_t(0);

// Who takes a connection's kernel stream over when it leaves the fabric,
// supplied by the layer above (set_handoff) and called by the leave
// (leave.cpp, handoff.cpp) only: a leave for `why` hands over the offsets
// where the kernel socket takes the stream on, instead of this process
// keeping them; a connection whose peer left, with its fabric part read,
// goes final and hands its offsets over instead of waiting in kernel mode
// for the peer again (rearm). Transport knows nothing of what is behind
// `ctx`; the calls are made on a leave, never on the data path.
struct HandoffOps {
    // The reason of the leave that hands over (other leaves do not).
    Reason why;
    // The kernel socket carries the stream on from `sent` and `received`:
    // taken over from these offsets.
    void (*take)(void *ctx, std::uint64_t sent, std::uint64_t received) noexcept;
    // take() has come already.
    bool (*taken)(void *ctx) noexcept;
    // Whoever takes over reads bytes put into the handoff's room
    // (HandoffRoom) before the kernel's; false: nothing is put there, and
    // the peer's unread bytes stay this process's to read.
    bool (*reads_room)(void *ctx) noexcept;
};

// Room for the peer's unread fabric bytes, should this process hand the
// connection over before reading them: `len` (bytes put in it) then `cap`
// bytes, in memory whoever takes over reads.
struct HandoffRoom {
    std::atomic<std::uint64_t> *len = nullptr;
    char *bytes = nullptr;
    std::uint64_t cap = 0;
};

using TxLock = std::unique_lock<RankedMutex<Rank::tx>>;

// The state (conn_state.hpp), as of an acquire load: what a direct state
// published (the peer, the ring) is visible after it.
ConnState state_of(const Conn *c) noexcept;
bool is_direct(const Conn *c) noexcept;
bool is_leaving(const Conn *c) noexcept;
// Direct or leaving: the fabric has (or had) bytes of it.
bool on_fabric(const Conn *c) noexcept;
// On the fabric, or committing (the peer may have switched already, and
// our receives take what follows its switch point).
bool may_read_fabric(const Conn *c) noexcept;
// Not direct yet, but an upgrade may still make it so.
bool upgrading(const Conn *c) noexcept;
// Its counters (sdirect-stat shows them).
ConnStat &stats(Conn *c) noexcept;

// The send side's lock: a send, a flush, a shutdown and a close take it.
TxLock lock_tx(Conn *c) noexcept;
TxLock try_lock_tx(Conn *c) noexcept;

// Send side, tx_lock held: `n` bytes went through the kernel socket.
void sent_on_kernel(Conn *c, std::uint64_t n) noexcept;
// Our leave is sent or owed, or bytes are owed to the kernel socket: a
// send goes through Engine::leave_flush_locked first (tx_lock held).
bool leave_under_way(const Conn *c) noexcept;
// Bytes are owed to the kernel socket before any new byte of ours.
bool owes_kernel(const Conn *c) noexcept;
// We leave the fabric: a send lets go of tx_lock until it is done.
bool leave_wanted(const Conn *c) noexcept;
// Fabric bytes sent since it (last) went direct.
std::uint64_t fabric_sent(Conn *c) noexcept;

// Our sending direction is over: a FIN or CLOSE on the fabric, or the
// kernel's FIN before the connection went direct.
bool wr_shut(const Conn *c, const std::atomic<bool> &kernel_wr_shut) noexcept;
// Our FIN or CLOSE went on the fabric.
bool fin_sent(const Conn *c) noexcept;
// The peer's FIN (or close) has come on the fabric.
bool peer_fin(const Conn *c) noexcept;
// The application shut it for reading (SHUT_RD).
void shut_read(Conn *c) noexcept;
// Protocol or fabric error.
bool broken(const Conn *c) noexcept;
// The peer reads no more (close, death), or the connection broke.
bool gone(const Conn *c) noexcept;

// Resets (the peer closed or died with our bytes unread: TCP's RST).
bool reset_seen(const Conn *c) noexcept;
// The reset not reported yet, now reported: ECONNRESET, EPIPE (after
// the peer's FIN), or 0.
int take_reset(Conn *c) noexcept;
// The kernel socket reported the reset first: the fabric's word of it
// finds it told.
void reset_told(Conn *c) noexcept;
// Our first send after the peer's close drew its reset (one host: as good
// as here): EPIPE to the next send or SO_ERROR, as TCP's CLOSE_WAIT.
void reset_drawn(Conn *c) noexcept;

// Receive side. Something for a recv to look at: bytes, the peer's FIN,
// an error, or the connection off the fabric for good.
bool rx_news(Conn *c) noexcept;
// The companion socket's EOF was seen by readiness (recv probes it).
bool kernel_eof_seen(const Conn *c) noexcept;
// The companion socket reported EOF or an error: the peer may be gone
// (readiness.cpp's hint); once per connection.
void kernel_eof_hint(Conn *c) noexcept;
// FIONREAD of a connection on the fabric, given the kernel socket's:
// -1 when the kernel's count is the answer.
std::int64_t readable_now(Conn *c, int kernel) noexcept;
// Fabric bytes come before the kernel's (SIOCATMARK: the mark is after
// them).
bool fabric_bytes_ahead(Conn *c) noexcept;
// Wakes its waiters and pollers (they look again: a new fd number).
void wake(Conn *c) noexcept;

// Readiness of a connection on the fabric as one look under its receive
// lock sees it (poll, select, epoll).
struct FabricView {
    bool leaving = false;
    bool broken = false;
    bool fin = false;       // the peer's FIN (or close) came
    bool closed = false;    // the peer reads no more (close, death)
    bool eof = false;       // the companion socket said EOF, the fabric nothing
    // Leaving (or committing after the peer's leave came), and the fabric
    // part is read (not final yet): the kernel has what comes next.
    bool read_out = false;
    bool writable = false;  // credits, or (leaving) nothing owed to the kernel
    // Committing (the peer switched, our answering thread has yet to read
    // its commit): the kernel socket takes our sends, and says whether
    // it is writable.
    bool kernel_sends = false;
    bool fin_sent = false;  // our FIN or CLOSE went on the fabric
    bool reset = false;     // the peer's reset came
    bool reset_unreported = false;
    std::uint64_t ready = 0;  // bytes a recv takes now
};
// False when the kernel socket answers (not on the fabric nor committing,
// its fabric part read, or before the peer's switch point).
bool fabric_view(Conn *c, FabricView &v) noexcept;
// The poll/select/epoll sleeps watching it.
PollerMask &pollers_of(Conn *c) noexcept;
// Its wait for the peer's upgrade has run out (Engine::peer_wait_due):
// Engine::give_up_waiting is due, with no lock held.
bool peer_wait_over(const Conn *c) noexcept;
// Its look for the peer's entry is due again (Engine::ask_later):
// Engine::ask_again is, with no lock held.
bool ask_again_due(const Conn *c) noexcept;
// Counts of arrivals (data, fin, close, state) and of send retries
// (credits): an edge-triggered watcher knows something new came.
void arrivals(const Conn *c, std::uint32_t &rx, std::uint32_t &tx) noexcept;
// Its state and arrival counts in one call (an epoll look over many
// quiet connections reads them for each).
ConnState quiet_marks(const Conn *c, std::uint32_t &rx, std::uint32_t &tx) noexcept;

// Readiness marks (marks.cpp). An epoll set of the layer above has a group
// (group_alloc), and each of its first kMarkSlots entries a mark in it
// (mark_of), which the entry links to its socket's connection
// (mark_link). Every change of the connection that can make it ready (a
// delivery, a move of its state, a kernel hint, a send that should try
// again, and each application call on its socket, which calls
// mark_changed) sets the mark, and the first setting since the set last
// took its marks (marks_take) wakes the group's pollers: the sleeps on the
// set. So a look at a set need only look at the entries whose marks are
// set (and those without one), and a sleep need not register on each
// connection. Groups live in memory never freed: a change that reads a
// mark just before its entry goes sets a bit for nothing, a look too many,
// never one too few.
inline constexpr std::uint32_t kMarkSlots = 4096;
// A group (0: none left; its sets' entries have no marks).
std::uint32_t group_alloc() noexcept;
void group_free(std::uint32_t g) noexcept;
// The group's poller mask (all of group 0's sets share one).
PollerMask &group_pollers(std::uint32_t g) noexcept;
// The mark of `slot` in group `g` (0: none, for group 0 or a slot beyond
// kMarkSlots).
std::uint32_t mark_of(std::uint32_t g, std::uint32_t slot) noexcept;
// Links mark `m` to `c`, unless `c` carries another (the socket's entry
// in another set): true when linked. Then the caller reads the
// connection's state: a change after the link sets the mark.
bool mark_link(Conn *c, std::uint32_t m) noexcept;
// The entry goes: `c` forgets `m` if it carries it.
void mark_unlink(Conn *c, std::uint32_t m) noexcept;
// Calls fn(ctx, slot) for each mark of group `g` set since the last
// call, clearing them.
void marks_take(std::uint32_t g, void (*fn)(void *ctx, std::uint32_t slot), void *ctx) noexcept;
// `c` changed (after the change is made): its mark is set, and the
// group's sleeps are woken but for the poller slots of `skip` (those the
// peer woke itself: wake_pollers). mark_touched: the same for a change
// that wakes nobody (a move of its state, the application's own call, a
// death hint), which the next look finds as any other.
void mark_changed(Conn *c, std::uint64_t skip = 0) noexcept;
void mark_touched(Conn *c) noexcept;
// In a fork child (the groups are the parent's copies, kept).
void marks_after_fork_child() noexcept;

// The handoff of its leave (HandoffOps), until a take-back
// (Engine::take_back_locked) forgets it; `ops` lives as long as the
// library. has_handoff: one is set.
void set_handoff(Conn *c, const HandoffOps *ops, void *ctx) noexcept;
bool has_handoff(const Conn *c) noexcept;
// Our receive ring's size (0: never direct).
std::uint64_t ring_capacity(Conn *c) noexcept;
// The handoff's room for the peer's unread fabric bytes (HandoffRoom{}:
// none). Used once.
void set_handoff_room(Conn *c, const HandoffRoom &r) noexcept;
// The answering side of a finished leave, every fabric byte of the peer
// in the ring: those bytes are copied into room(ctx, n) and taken (whoever
// reads next reads them first); their count, 0 if none or not now.
std::uint64_t hand_ring_out(Conn *c, char *(*room)(void *ctx, std::uint64_t n),
                            void *ctx) noexcept;
// Upgrades barred for `why` while on the kernel (Engine::bar_upgrades):
// the reason goes in its counters, logged once, and no verdict is owed.
void say_barred(Conn *c, Reason why, const char *text) noexcept;

}  // namespace sd::transport
