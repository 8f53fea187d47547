// One TCP connection as the transport sees it: its place in the host
// registry, its counters, and (once upgraded) its direct-mode state:
// peer, credits, the receive ring and the threads waiting on it.
// Transport's own: the layers above see conn.hpp only.
#pragma once
#ifdef SDIRECT_OUTSIDE_TRANSPORT
#error "Conn's fields are transport's own: use the functions of transport/conn.hpp"
#endif
#include "conn.hpp"
#include "fin_state.hpp"
#include "leave_state.hpp"
#include "reset_state.hpp"
#include "wire.hpp"

#include <boost/intrusive/list.hpp>
#include <rdma/fi_domain.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <mutex>

namespace sd::transport {

struct Peer;

// A held receive-side lock, passed to code that may drop it while it waits.
using RxLock = std::unique_lock<RankedMutex<Rank::rx>>;

// A thread blocked on a connection; woken through its own eventfd. Lives
// on the waiting thread's stack, linked into the connection's list (or a
// list of sleeps): doubly linked, so that it leaves in constant time
// (walking the list touched every other sleeper's stack).
struct Waiter : boost::intrusive::list_base_hook<boost::intrusive::link_mode<
                    boost::intrusive::safe_link>> {
    explicit Waiter(int fd) noexcept : efd(fd) {}
    int efd;
    bool handed = false;  // given the doorbell's watch while standing by (wait.cpp)
    bool rung = false;    // written once by a delivery (Conn::wake_locked), under rx_lock
};
using WaiterList = boost::intrusive::list<Waiter, boost::intrusive::constant_time_size<false>>;

// Takes `w` off `list` if it is on it (on no other list).
inline void unlink_waiter(WaiterList &list, Waiter &w) noexcept {
    if (w.is_linked()) list.erase(list.iterator_to(w));
}

// The peer's read zero-copy advertisement being read here (receive side,
// under rx_lock). At most one per connection: its sender waits in send()
// until it is over, so nothing follows it on the wire before then.
struct SrcAvail {
    bool active = false;
    bool busy = false;     // a reader is reading it (without rx_lock)
    bool cancel = false;   // the sender asked to end it: answer when not busy
    std::uint64_t off = 0; // stream offset of its first byte
    std::uint64_t addr = 0, key = 0;
    std::uint32_t len = 0, done = 0;
};

// Write zero-copy (SDP SinkAvail), receive side: our application's recv
// buffer, advertised to the peer while the recv waits (under rx_lock). At
// most one per connection; the recv that made it returns only once it is
// over: written (done, `got` bytes), cancelled through the claim word (one
// host), or, registered (`rma`), once the peer can no longer write it:
// `over` (a stream message of the peer came after it, or the peer's
// answer of 0 to our sink_cancel), or deregistered (peer gone, no answer).
struct SinkAvail {
    bool active = false;
    bool done = false;
    bool rma = false;       // registered, written by the provider's RMA
    bool over = false;      // rma: the peer will never write it
    bool asked = false;     // rma: our sink_cancel is sent
    std::uint64_t kicked_ns = 0;  // rma: when we last made the peer progress
    std::uint64_t seq = 0;  // its number in the claim word
    std::uint64_t off = 0;  // stream offset of its first byte
    std::uint32_t len = 0, got = 0;
};

// The peer's advertised recv buffer, as the send side knows it (written
// by deliveries and taken by senders, both under rx_lock; Conn::psink_valid
// says whether there is one).
struct PeerSink {
    std::uint64_t seq = 0, off = 0, addr = 0;
    std::uint64_t key = 0;  // kSrcNoKey: one host, the claim word
    std::uint32_t len = 0;
};


struct Conn {
    std::uint32_t id = 0;
    std::uint32_t gen = 0;
    bool acceptor = false;
    std::uint32_t window = 0;       // our receive window = ring size, bytes
    Tuple tuple{};
    ConnStat *stat = nullptr;
    // Changed by move and move_to only (conn_state.hpp: the moves allowed).
    std::atomic<ConnState> state{ConnState::kernel};
    // Our registry entry while it is published: its file's identity
    // (registry.hpp), so that unpublishing needs no read of it. 0: none.
    // Both atomic: a publish of the next entry (rearmed) may run while an
    // unpublish of the previous one reads them. The device is stored
    // before the inode's release and loaded after the inode's exchange.
    std::atomic<std::uint64_t> entry_ino{0};
    std::atomic<std::uint64_t> entry_dev{0};
    // CLOCK_MONOTONIC once our entry was whole (0: not published).
    std::atomic<std::uint64_t> published_ns{0};
    // No upgrade either way from now on (Engine::bar_upgrades: the layer
    // above's policy, for `barred_why`), until a take-back clears it.
    std::atomic<bool> upgrades_barred{false};
    // On the kernel since attach with no word of the peer: once the
    // upgrade timeout has passed (or at close), verdict.cpp says why, once.
    std::atomic<bool> verdict_due{false};
    // Published and waiting for the peer's upgrade request
    // (SDIRECT_PEER_WAIT_MS): set at attach, cleared once the wait is over
    // one way or the other (never set again: a rearmed connection waits
    // for its holder without it). `give_up_due`: the wait ran out
    // (seen at a kernel I/O, under this connection's locks); the call's
    // end, holding no lock, moves it to TCP for good (give_up_waiting).
    std::atomic<bool> awaiting_peer{false};
    std::atomic<bool> give_up_due{false};
    // Turns of the conversation since the entry was written (a read that
    // moved bytes after a write that did, or the reverse; `wait_last_rx`
    // the direction of the last one): a peer with the library that
    // exchanged this much with us would have asked (kPeerWaitTurns).
    std::atomic<std::uint32_t> wait_turns{0};
    std::atomic<bool> wait_last_rx{false};
    static constexpr std::uint32_t kPeerWaitTurns = 16;
    std::atomic<std::uint32_t> barred_why{0};  // Reason given to bar_upgrades()
    std::uint64_t born_ns = 0;

    // Peer; written before `state` becomes direct (release), then constant.
    Peer *peer = nullptr;
    std::uint32_t peer_id = 0;
    std::uint32_t peer_gen = 0;

    // Send side, under tx_lock.
    RankedMutex<Rank::tx> tx_lock;
    std::uint64_t tx_off = 0;       // stream bytes sent so far, any transport
    bool tx_fabric = false;         // the switch point has been passed
    // Our end of the stream on the fabric (fin_state.hpp): changed under
    // tx_lock by move_fin_out only; readiness and deliveries read it
    // under rx_lock, send checks without a lock.
    std::atomic<FinOut> fin_out{FinOut::open};
    // The application shut it for reading (SHUT_RD): once our FIN is sent
    // too, bytes that come are answered with a reset (abort.cpp).
    std::atomic<bool> rd_shut{false};
    // The peer's end (fin_state.hpp): came with fin_off (a delivery,
    // under rx_lock, release), kicked by our first send after it (under
    // tx_lock); changed by move_fin_in only.
    std::atomic<FinIn> fin_in{FinIn::open};
    std::atomic<std::int64_t> credits{0};
    std::uint32_t staged = 0;       // combined bytes not yet sent (MSG_MORE, TCP_CORK)
    char *stage = nullptr;          // chunk-sized combining buffer
    // The staged bytes were accepted (the application was told they are
    // sent) but credits were short: progress() sends them when credits come.
    std::atomic<bool> flush_due{false};
    std::uint64_t tx_ring = 0;      // fabric bytes sent = the peer's ring tail
    // Offset of our last stream message (wire.hpp is_stream_msg), set by
    // post(): a registered sink of the peer at or before it is never
    // written (the peer reads that message as the sink's end).
    std::atomic<std::uint64_t> tx_mark{kNoOffset};
    // Read zero-copy, send side: the peer's answer to our advertisement
    // (src_done): its offset, then how many bytes were read.
    std::atomic<std::uint64_t> zc_answer_off{kNoOffset};
    std::atomic<std::uint32_t> zc_answer_len{0};
    // The peer cannot read our unregistered buffers (src_need_key).
    std::atomic<bool> zc_need_key{false};
    std::uint64_t peer_ring_addr = 0;  // the peer's ring, for RMA writes
    std::uint64_t peer_ring_key = 0;
    std::uint32_t peer_ring_cap = 0;

    // Receive side, under rx_lock.
    RankedMutex<Rank::rx> rx_lock;
    std::uint64_t rx_off = 0;       // stream bytes delivered to the application
    std::uint64_t switch_off = kNoOffset;  // first fabric byte of the peer's stream
    std::uint64_t fin_off = kNoOffset;     // peer's EOF offset
    // Set under rx_lock, read by senders without it.
    std::atomic<bool> peer_closed{false};  // peer no longer reads (close, death)
    std::atomic<bool> broken{false};       // protocol or fabric error
    // The peer closed or died with bytes of ours unread (TCP: RST):
    // POLLERR|POLLHUP, and the next recv or send reports it once
    // (reset_state.hpp). Changed by move_reset only, read without a lock
    // (acquire).
    std::atomic<ResetState> reset{ResetState::none};
    char *ring = nullptr;           // fabric bytes not yet consumed
    std::uint32_t ring_cap = 0;     // = our window
    fid_mr *ring_mr = nullptr;      // the ring registered for the peer's writes
    std::uint64_t ring_head = 0;    // consumed fabric bytes
    std::uint64_t ring_tail = 0;    // delivered fabric bytes
    // The byte at stream position p is at ring[(p - ring_base) % ring_cap]
    // (ring_at). A ring the peer never writes into (not registered: a peer
    // through the queues of another uid, or one not dumpable) starts over
    // at its first byte whenever a delivery finds it empty (Rx::data): a
    // conversation of small messages then reuses the same few cache lines
    // and pages, where a ring placed by stream offset alone would move
    // through all of its window (2 MiB by default), a line it has not
    // touched for a while and, the first time round, a page fault every
    // 4 KiB. A registered ring stays placed by offset (base 0), as the
    // peer's writes into it are. Under rx_lock.
    std::uint64_t ring_base = 0;
    std::uint32_t ring_at(std::uint64_t pos) const noexcept {
        return std::uint32_t((pos - ring_base) % ring_cap);
    }
    // Engine::ring_filled is asked to back the ring with huge pages once a
    // whole ring's worth has been consumed past huge_after, at most
    // kRingHugeTries times (under rx_lock).
    std::uint64_t huge_after = 0;
    std::uint8_t huge_tries = 0;
    static constexpr std::uint8_t kRingHugeTries = 8;
    SrcAvail zc;                    // the peer's advertisement being read
    std::uint64_t zc_total = 0;     // stream bytes of finished advertisements
    SinkAvail sink;                 // our recv buffer, advertised
    std::uint64_t sink_seq = 0;     // the last sink's number
    std::uint64_t sink_total = 0;   // stream bytes the peer wrote into our buffers
    PeerSink psink;                 // the peer's recv buffer (send side)
    std::atomic<bool> psink_valid{false};
    std::atomic<bool> psink_seen{false};  // the peer has advertised sinks (read without a lock)
    std::uint64_t psink_last = 0;   // the highest sink number the peer advertised
    std::uint64_t psink_busy = 0;   // the registered sink a sender is writing (its seq)
    fid_mr *sink_mr = nullptr;      // our sink's registration (rma)
    std::uint32_t sink_held = 0;    // bytes of the sink budget it holds
    WaiterList waiters;
    PollerMask pollers;             // poll/select/epoll sleeps watching it
    // The readiness mark of the epoll entry that watches it (conn.hpp:
    // mark_link; 0: none), set by each change (mark_changed, mark_touched).
    std::atomic<std::uint32_t> ready_mark{0};
    std::atomic<std::uint32_t> unreturned{0};  // consumed, credits not yet returned

    // Readiness (poll/select/epoll): bumped on every arrival, so an
    // edge-triggered watcher knows something new came.
    std::atomic<std::uint32_t> rx_seq{0};  // data, fin, close, state change
    std::atomic<std::uint32_t> tx_seq{0};  // credits back from none, or a send may try again
    // The companion socket reported EOF or an error while the fabric said
    // nothing: the peer may be gone; readers must look (recv sorts it out).
    std::atomic<bool> kernel_eof{false};
    // When a non-blocking recv that finds nothing next probes the
    // companion (recv.cpp's probe_due; any thread, relaxed).
    std::atomic<std::uint64_t> probe_ns{0};

    // Leaving the fabric (leave.cpp). Send side, under tx_lock unless atomic.
    std::atomic<bool> leave_wanted{false};  // we leave: senders let go of tx_lock
    // Our leave (leave_state.hpp): owed, sent as the answer, or sent first
    // (our fabric stream ended at tx_end). Moved by move_leave only:
    // sends under tx_lock, the peer's leave under rx_lock; read by
    // senders and the flush pass without either (acquire).
    std::atomic<OurLeave> our_leave{OurLeave::none};
    std::atomic<std::uint64_t> tx_end{kNoOffset};  // read by deliver (give_back)
    // Owed to the kernel socket before any new byte of ours: the bytes the
    // peer returned (it left first: give_back), then our staged bytes.
    std::atomic<bool> tx_owed{false};
    // shutdown(SHUT_WR) while direct: the fin went on the fabric; the
    // kernel socket's FIN waits for a leave's owed bytes (or close).
    std::atomic<bool> shut_wr_deferred{false};
    // The bytes the peer returns (leave_state.hpp), moved by
    // move_give_back only: awaited (the peer left first), complete (the
    // last piece came: a release of `back`), none.
    std::atomic<GiveBack> give_back{GiveBack::none};
    char *back = nullptr;                    // written by deliver under rx_lock
    std::uint32_t back_len = 0;              // until complete
    std::uint32_t back_done = 0;             // written to the kernel (tx_lock)
    std::uint64_t back_off = kNoOffset;      // stream offset of back[0]
    // Receive side, under rx_lock: the peer's fabric stream ends here.
    std::uint64_t peer_end = kNoOffset;
    // The peer left for a reason after which its side may upgrade again
    // (on_leave): once the fabric part is read and owed bytes written, the
    // connection waits in kernel mode for that upgrade, instead of final
    // (leave_state.hpp). Moved by move_rearm only: wanted under rx_lock,
    // due under rx_lock, none with both locks; the flush pass reads it
    // without a lock (acquire).
    std::atomic<Rearm> rearm{Rearm::none};
    std::atomic<bool> initiate_due{false};  // rearmed: look for the peer's entry
    // Our entry is where the peer never looks (ids changed afresh: the
    // kernel names our socket's old uid, whose registry holds at most a
    // mark of the holder we took it over from), so the upgrade is ours to
    // ask, and the peer had not published when we looked: we look again
    // at the end of a call at or after this time (monotonic ns; 0: not
    // due), `ask_step_ms` later each time (Engine::ask_again).
    std::atomic<std::uint64_t> ask_again_ns{0};
    std::atomic<std::uint32_t> ask_step_ms{0};
    std::uint64_t tx_fabric_base = 0;       // stat->tx_fabric when rearmed (peer_died)
    // A send's next progress pass for a CLOSE of a peer of another uid
    // (tx_lock): at most once a millisecond.
    std::uint64_t close_look_ns = 0;
    // stat->rx_fabric when the last send larger than a message began
    // (tx_lock): a large send that finds it unchanged follows another
    // with nothing from the peer in between, a stream (direct_send).
    std::uint64_t large_send_heard = ~std::uint64_t(0);
    // Who takes the kernel stream over when it leaves (conn.hpp:
    // HandoffOps, set_handoff): the ops are stored before the context
    // (release) and read after it (acquire); a null context: none.
    std::atomic<const HandoffOps *> handoff_ops{nullptr};
    std::atomic<void *> handoff_ctx{nullptr};
    // Where the peer's unread fabric bytes go if this process hands the
    // connection over before reading them (rx_lock). Used once.
    HandoffRoom handoff_room;

    // Its handoff (ops and context), or none (both null).
    struct HandoffRef {
        const HandoffOps *ops = nullptr;
        void *ctx = nullptr;
        explicit operator bool() const noexcept { return ctx != nullptr; }
        bool taken() const noexcept { return ops->taken(ctx); }
        bool reads_room() const noexcept { return ops->reads_room(ctx); }
        void take(std::uint64_t sent, std::uint64_t received) const noexcept {
            ops->take(ctx, sent, received);
        }
    };
    HandoffRef handoff() const noexcept {
        void *ctx = handoff_ctx.load(std::memory_order_acquire);
        if (!ctx) return {};
        return {handoff_ops.load(std::memory_order_relaxed), ctx};
    }

    // Something arrived or changed: wakes its waiters and the pollers
    // whose interest set holds it; caller holds rx_lock.
    void wake_locked() noexcept;
    // The waiters only (their eventfds are valid while they are on the
    // list, under rx_lock); the caller wakes the pollers
    // (wake_pollers(pollers, skip), `skip` the value returned: the poller
    // slot the peer woke itself) once it has let rx_lock go. A poller woken
    // under the lock may take the CPU from the waker at once and then
    // block on the lock the waker still holds: a delivery to a connection
    // polled by a thread of a busy process cost two futex calls that way.
    // `rung`: a sleep on a peer of another uid that is woken already
    // (latch_waker), skipped too.
    std::uint64_t wake_waiters_locked(RungWaker rung = {-1, 0}) noexcept;
    // Flow state into the counters (sdirect-stat shows it); the receive
    // side's only when the caller holds rx_lock.
    void show_flow(bool rx_locked) noexcept;
    // The one place the reset changes (reset_state.cpp): from the state
    // the caller saw, as a compare-exchange; false if another thread moved
    // it first. A move outside kResetMoves aborts a checked build.
    bool move_reset(ResetState from, ResetState to) noexcept;
    // The reset came (after the peer's FIN if `after_fin`); one already
    // there stays as it is.
    void reset_comes(bool after_fin = false) noexcept;
    // A reset that our bytes drew after the peer's close (its FIN first):
    // a new one, or the one not reported yet, is reported as EPIPE.
    void reset_after_fin() noexcept;
    // The kernel socket reported it first: reported, whatever came.
    void reset_told() noexcept;
    // The reset not reported yet, now reported: ECONNRESET, EPIPE (after
    // the peer's FIN), or 0.
    int take_reset() noexcept;
    // The ends of the streams (fin_state.cpp): one place each changes, as
    // a compare-exchange from the state the caller saw; a move outside
    // kFinOutMoves or kFinInMoves aborts a checked build.
    bool move_fin_out(FinOut from, FinOut to) noexcept;
    bool move_fin_in(FinIn from, FinIn to) noexcept;
    // Our FIN or CLOSE went on the fabric.
    bool fin_sent(std::memory_order mo = std::memory_order_acquire) const noexcept {
        return fin_out.load(mo) != FinOut::open;
    }
    // Our CLOSE goes: true for the one caller that moved it to closed
    // (and posts it).
    bool close_out() noexcept;
    // The peer's FIN or CLOSE came.
    bool peer_fin() const noexcept { return fin_in.load(std::memory_order_acquire) != FinIn::open; }
    bool reset_seen() const noexcept {
        return reset.load(std::memory_order_acquire) != ResetState::none;
    }
    void add_waiter(Waiter *w) noexcept;
    void remove_waiter(Waiter *w) noexcept;
    // The one place the state changes (conn_state.cpp): from the state
    // the caller saw, as a compare-exchange; false if another thread moved
    // it first. A move outside kConnMoves aborts a checked build.
    bool move(ConnState from, ConnState to) noexcept;
    // To `to` from whatever state it is in, each step a move of the table.
    void move_to(ConnState to) noexcept;
    bool is_direct() const noexcept { return state.load(std::memory_order_acquire) == ConnState::direct; }
    bool is_leaving() const noexcept { return state.load(std::memory_order_acquire) == ConnState::leaving; }
    // Not direct yet, but an upgrade may still make it so.
    bool upgrading() const noexcept {
        ConnState s = state.load(std::memory_order_acquire);
        return s == ConnState::kernel || s == ConnState::initiating || s == ConnState::committing;
    }
    // The application's fd of the socket (another alias after a dup and a
    // close of the first one: Stream::fd_removed updates it).
    int app_fd() noexcept { return std::atomic_ref<std::int32_t>(stat->fd).load(std::memory_order_relaxed); }
    // Our leave is sent or owed, or bytes are owed to the kernel socket: a
    // send goes through leave_flush_locked first (tx_lock held).
    bool leave_under_way() const noexcept {
        return our_leave.load(std::memory_order_acquire) != OurLeave::none ||
               tx_owed.load(std::memory_order_acquire);
    }
    // Our leave (leave_state.cpp): the one place it changes, a
    // compare-exchange from the state the caller saw; a move outside
    // kLeaveMoves aborts a checked build.
    bool move_leave(OurLeave from, OurLeave to) noexcept;
    // The peer's leave came: ours is owed, or (sent first) answered.
    void peer_left() noexcept;
    // Ours goes (tx_lock held): first, or as the answer.
    void leave_goes(bool first) noexcept;
    // Kernel mode again: no leave of ours sent or owed.
    void leave_forget() noexcept;
    bool move_give_back(GiveBack from, GiveBack to) noexcept;
    bool move_rearm(Rearm from, Rearm to) noexcept;
    // Rearmed or handed over (HandoffOps): none.
    void rearm_forget() noexcept;
    bool rearm_due() const noexcept { return rearm.load(std::memory_order_acquire) == Rearm::due; }
    // Returned bytes written, given up, or kernel mode again: none.
    void give_back_forget() noexcept;
    bool back_complete() const noexcept {
        return give_back.load(std::memory_order_acquire) == GiveBack::complete;
    }
    bool leave_sent() const noexcept {
        return transport::leave_sent(our_leave.load(std::memory_order_acquire));
    }
    bool leave_first() const noexcept {
        const OurLeave s = our_leave.load(std::memory_order_acquire);
        return s == OurLeave::first || s == OurLeave::first_answered;
    }
    bool leave_due() const noexcept {
        return transport::leave_due(our_leave.load(std::memory_order_acquire));
    }
    // Leaving, and every fabric byte of the peer is read: receives take
    // the kernel socket alone from now on (rx_lock held). True once final.
    bool settle_left_locked() noexcept;
    std::uint64_t ring_bytes() const noexcept { return ring_tail - ring_head; }
    // Bytes the application can read now on the fabric (rx_lock held).
    std::uint64_t rx_ready() const noexcept {
        return ring_bytes() + (zc.active ? zc.len - zc.done : 0);
    }
    // Stream offset the next fabric message must start at (rx_lock held).
    std::uint64_t rx_expect() const noexcept {
        return switch_off + ring_tail + zc_total + sink_total + (zc.active ? zc.len : 0);
    }
    bool gone() const noexcept {
        return peer_closed.load(std::memory_order_relaxed) || broken.load(std::memory_order_relaxed);
    }
};

}  // namespace sd::transport
