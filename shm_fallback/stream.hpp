// A stream socket as the application sees it: the companion kernel socket
// plus, once connected, its transport Conn. Reads and writes go to the
// kernel until the switch points, to the fabric after them:
// each fabric message carries its stream offset, so the reader drains the
// companion socket up to the peer's switch point and then reads the ring.
// Every method returns a value or -errno; only the shims touch errno.
#pragma once
#include "fork_hooks.hpp"
#include "phase.hpp"
#include "prefix.hpp"
#include "sharers.hpp"
#include "transport/conn.hpp"
#include "transport/datapath.hpp"
#include "transport/engine.hpp"
#include "transport/wait.hpp"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/epoll.h>
#include <sys/uio.h>
#include <vector>

namespace sd::fallback {

class Stream {
  public:
    // The kernel socket: one of the fd numbers that map to this stream
    // (after dup and a close of the original, another one; the private fd
    // of hold_for_calls). Only on_kfd() (and the data path's
    // SocketSide::on_kfd, which counts in the same fd_users) uses it
    // across a syscall that a close may race.
    std::atomic<int> fd{-1};
    int domain = 0;
    // With the stream's address, a pair no other socket of this process
    // had (a sleep keeps its kernel socket registered under both:
    // transport::Interest): first a number no earlier call gave, then one
    // more each time the pool gives the stream out again, since the same
    // fd number may come with it for another socket while the file of the
    // one before lives on elsewhere (in a child that inherited it).
    std::uint64_t serial = transport::next_watch_serial();
    // The socket's inode, looked up at its first need (inode()): exec
    // finds the socket by it among the fds a new program inherits, even
    // where this process's own fd is closed (a vfork child). Not at
    // creation: a connection that never meets an exec would pay a system
    // call for nothing. 0: not looked up yet.
    std::atomic<std::uint64_t> ino{0};
    std::atomic<int> refs{0};   // fd mappings + calls in progress
    // Calls of the application in progress (the shims' CallRef). A close()
    // while there are some keeps the kernel socket open until the last one
    // is over, as the kernel's calls hold their file: `held_fd` is the
    // private copy that does it (semantics.cpp).
    std::atomic<int> calls{0};
    std::atomic<int> held_fd{-1};
    std::atomic<int> fds{0};    // fd numbers mapping to this stream (dup)
    // Read freely; changed only by the three below (phase.cpp), each
    // change one of phase.hpp's table, which debug builds check.
    std::atomic<Phase> phase{Phase::fresh};
    // The socket's inode (ino), looked up now if not yet: on our fd, or in
    // a vfork child (whose fds may differ from the table's) on the fd of
    // the process that owns the table, through /proc. 0 if neither can.
    std::uint64_t inode() noexcept;
    // From `from` to `to`, if it is still in `from` (compare-exchange).
    bool move(Phase from, Phase to) noexcept;
    // To `to` from whatever phase it is in, a move each try: as a store,
    // with the move checked that it makes.
    void move_to(Phase to) noexcept;
    // A new socket (fresh) or a listening one: `to` whatever it was.
    void reset_to(Phase to) noexcept;
    std::atomic<bool> nonblock{false};
    std::atomic<bool> nodelay{false};
    std::atomic<bool> cork{false};
    std::atomic<bool> rd_shut{false};
    // Our write side was shut on the kernel socket itself (a shutdown
    // while the connection was not direct: its FIN is in the kernel's
    // stream). An upgrade afterwards does not undo it: the fabric carries
    // nothing more of ours, sends fail with EPIPE, and readiness reports
    // the hang-up once the read side is shut too, as the kernel does. Nothing
    // goes on the fabric for it, so the peer's switch is not moved.
    std::atomic<bool> kernel_wr_shut{false};
    // SO_RCVLOWAT: readiness and a blocking recv wait for this many bytes.
    std::atomic<int> rcvlowat{1};
    // SO_LINGER {1, 0}: the last close resets the connection.
    std::atomic<bool> linger_reset{false};
    // A send found the peer closed and was taken, as TCP takes the one
    // that draws the peer's reset: the next ones fail.
    std::atomic<bool> drew_reset{false};
    // On TCP for good (for_good.cpp, or a rule): no holder left after a
    // fork brings it to the fabric either.
    std::atomic<bool> for_good{false};
    // Our FIN went on the fabric after the peer's had come (TCP_INFO: the
    // second end to shut ends CLOSED, the first in TIME_WAIT).
    std::atomic<bool> shut_second{false};
    std::atomic<std::int64_t> rcvtimeo_ns{0};
    std::atomic<std::int64_t> sndtimeo_ns{0};
    std::atomic<std::uint32_t> rcvbuf{0};  // SO_RCVBUF as the application set it
    std::atomic<transport::Conn *> conn{nullptr};
    // The application's calls on it while it has a connection, counted
    // at their end (CallRef, touch), which also sets the connection's
    // readiness mark (transport::mark_touched): an epoll entry that found
    // it quiet knows it is still quiet while its mark is not set, or,
    // without a mark, while this and its connection's arrivals and state
    // are as they were (epoll.cpp). A call may change its readiness in
    // ways the connection's counts do not show (a send that found the
    // peer dead, a shutdown, SO_RCVLOWAT).
    std::atomic<std::uint32_t> touched{0};
    void touch(transport::Conn *c) noexcept {
        touched.fetch_add(1, std::memory_order_release);
        transport::mark_touched(c);
    }
    // Its connection waited SDIRECT_PEER_WAIT_MS for the peer's upgrade
    // (transport::peer_wait_over): on TCP for good from now on, so that
    // its calls and waits are the kernel's alone. No lock held.
    void stop_waiting(transport::Conn *c) noexcept {
        if (transport::Engine *e = transport::Engine::current()) e->give_up_waiting(c);
    }
    // Its peer cannot find our entry and had not published when we
    // looked (transport::ask_again_due): look again now. No lock held.
    void ask_again(transport::Conn *c) noexcept {
        if (transport::Engine *e = transport::Engine::current()) e->ask_again(c);
    }
    // Sets `conn` (once, from null) and wakes the poll/select/epoll sleeps
    // that watched the socket without one (they watch the connection next).
    void set_conn(transport::Conn *c) noexcept;
    // Connected before the engine was built: I/O runs non-blocking on the
    // kernel under pend_lock, counted, until the builder attaches us.
    std::atomic<bool> pending{false};
    transport::RankedMutex<transport::Rank::pend> pend_lock;
    // Upgrade only when it can pay (earn.cpp, SDIRECT_UPGRADE_AFTER_MS): a
    // pending connection that has not asked for its upgrade yet asks at
    // its first kernel I/O that moves bytes from this time on (monotonic
    // ns). 0: it asked already, or never will (under pend_lock).
    std::uint64_t earn_ns = 0;
    // When its ask may start the process's engine build (it has lived
    // SDIRECT_BUILD_AFTER_MS); before then it asks only once an engine
    // exists or is being built.
    std::uint64_t build_ns = 0;
    std::uint32_t earn_calls = 0;  // its kernel I/O calls that moved bytes so far
    // Calls (reads and writes, both directions) that moved bytes before a
    // connection may ask: a request/answer protocol asks after 8 exchanges.
    static constexpr std::uint32_t kEarnCalls = 16;
    // Whether a connection has earned its upgrade (earn.cpp): `calls` of
    // them, the clock past `earn_at`, and past `build_at` too where its ask
    // would start the process's engine build.
    static bool earned(std::uint32_t calls, std::uint64_t earn_at, std::uint64_t build_at) noexcept;
    // A socket shared through fork earns a take-over as a fresh connection
    // earns its upgrade (fork_protocol/share.cpp): from `take_ns`, when
    // this process began to share it, and through `take_calls`, its
    // counted kernel I/O calls that moved bytes since (under pend_lock).
    std::uint64_t take_ns = 0;
    std::uint32_t take_calls = 0;
    // Threads asleep in the kernel on a connection that has not asked for
    // its upgrade (pend_lock): in its recv, or in a readiness wait that
    // sleeps in the kernel's poll or epoll_wait (`wait_holds` of them).
    // While one is, nobody asks, since that thread would sleep through
    // the peer's switch to the fabric; `ask_held`: an ask was held back,
    // and the last of them to return makes it (a readiness wait is woken
    // for that).
    std::uint32_t kernel_waiters = 0;
    std::uint32_t wait_holds = 0;
    bool ask_held = false;
    // epoll registrations made while the socket needed nothing of ours
    // (epoll.cpp): the kernel holds each as the application asked and no
    // set shadows it, so a wait over such sockets costs what the kernel's
    // costs, whatever their number. Before anything but a call of this
    // process may bring the socket nearer the fabric (its ask, a take-over
    // after fork), each becomes a shadow and the sleeps on its set are
    // woken (epoll_unplain, at the end of that call: `ask_deferred`).
    // Under pend_lock; in a set under its lock too once one exists.
    struct PlainReg {
        int epfd;
        int fd;
        std::uint64_t set_serial;
        epoll_event ev;
    };
    static constexpr int kPlainRegs = 4;
    PlainReg plain[kPlainRegs];
    std::atomic<int> plain_n{0};  // read without the lock only by the last close
    // An ask (or a take-over) found plain registrations: the call that
    // found it makes their shadows, then the ask, as it ends (CallRef).
    std::atomic<bool> ask_deferred{false};
    void finish_deferred_ask() noexcept;
    // Whether epoll may register it plainly now (pend_lock held).
    bool plain_ok_locked() const noexcept {
        return !forked && !ask_deferred.load(std::memory_order_relaxed) && kernel_wait_ok_locked();
    }
    // On the kernel for good (pend_lock held): no connection will be
    // attached to it (its attach failed, or a rule or a change of
    // privileges keeps it on TCP), or its connection is final with no
    // holder to take it over, and nothing of ours comes before the kernel
    // socket's bytes. Its epoll shadows may become plain registrations.
    bool kernel_for_good_locked() const noexcept;
    bool acceptor = false;
    std::uint64_t pre_tx = 0;
    std::uint64_t pre_rx = 0;
    transport::Engine *engine = nullptr;
    Stream *next_free = nullptr;
    // Went through a fork: the socket may be shared, so it is
    // not upgraded while it is. `share`: it had no connection yet at the
    // fork (accepted and not used, or waiting for the engine), so its
    // holders and kernel byte counts are kept across processes; its I/O
    // runs non-blocking on the kernel, like a pending one, and the holder
    // that finds itself alone upgrades it from those counts. Without a
    // share (it had a connection not yet direct) it stays on TCP.
    // `orphan`: it was direct at the fork, in the parent; the child cannot
    // use the parent's connection.
    // `owner`: the process whose connection it is (claim_inherited asks it
    // to leave the fabric). `holders`: for a socket direct at a fork, who
    // holds it (the owner's last close leaves the fabric first while
    // another holder lives).
    bool forked = false;
    std::atomic<bool> orphan{false};
    int owner = 0;
    // The owner died (or its peer did) holding bytes of the connection
    // that no other process can read: the connection is reset here
    // (`kLostUntold` until a call has returned ECONNRESET once).
    enum : int { kNotLost, kLostUntold, kLostTold };
    std::atomic<int> orphan_lost{kNotLost};
    std::atomic<Sharers *> holders{nullptr};
    // The slot (share or holders) whose entry of this process says it has
    // used the socket (claim.cpp's use_shared): its later calls look only
    // for an owner. Not inherited: a fork child's entry is its own.
    std::atomic<Sharers *> used_mark{nullptr};
    unsigned fork_mark = 0;  // the fork pass that saw it last (dups)
    // The exec hand-over that passed this orphan on as an orphan
    // (fork_protocol/handover.cpp): that exec does not claim it.
    unsigned exec_pass = 0;
    // Our registry entry that says why this socket, never attached, does
    // not upgrade (shared through fork, a rule, for good): inherited by a
    // fork child with the rest; one for sharing is removed by the last
    // holder's close, or when the holder left alone goes on (adopt_share).
    transport::EntryMark mark;
    // That entry was written (or tried) for the sharing: once per socket
    // (forking::mark_shared).
    bool share_marked = false;
    // What SDIRECT_RULES said of this connection (rule_says_kernel, under
    // pend_lock): 0 not asked yet, 1 kernel, -1 it may go direct.
    std::int8_t rule_verdict = 0;
    std::atomic<Sharers *> share{nullptr};
    std::uint64_t share_check_ns = 0;  // next look at other holders' lives
    // The peer's bytes read before the kernel socket by every holder
    // (prefix.cpp): unread at a fork after our answer to its leave.
    std::atomic<Prefix *> prefix{nullptr};

    void reset(int fd, int domain, bool nonblock) noexcept;

    // The TCP handshake finished (connect returned 0, or an attach
    // deferred until now).
    void connected(bool acceptor) noexcept;
    // accept() returned it: attached at its first I/O, so that a server
    // that hands it to a child (accept, fork, close) upgrades in the child.
    void accepted() noexcept;
    // The fork protocol (fork_protocol/, the layer above) acts on a Stream
    // through free functions in sd::forking; this layer reaches them only
    // through fork_hooks (fork_hooks.hpp). Where the I/O path asks, the
    // state a fork leaves (orphan, holders) is checked inline first, so a
    // socket that never went through fork makes no call through the table.
    // This process uses a socket that was direct in another (inherited
    // through fork): that owner moves it back to the kernel first. False
    // if it could not: its I/O then fails with EIO, or as after a reset
    // (orphan_error) where the owner died first or its peer died with
    // bytes unread there.
    // `proof`: an fd of the socket (default: ours).
    bool claim_inherited(int proof = -1,
                         transport::Reason why = transport::Reason::shared) noexcept {
        return (!orphan.load(std::memory_order_acquire) && !share.load(std::memory_order_acquire) &&
                !holders.load(std::memory_order_acquire)) ||
               fork_hooks.claim_inherited(*this, proof, why);
    }
    // In a fork child (the fork protocol's fork_child calls it first): the
    // parent's threads are not ours, so neither are the locks they held, the
    // calls they were in, or their references (stream.cpp).
    void forget_parent_threads() noexcept;
    // The socket goes back to the kernel for good, for `why`
    // (for_good.cpp): a direct connection leaves the fabric, one not
    // direct yet (or not attached yet) never upgrades. A socket shared
    // through fork, in a process that retires (reason privilege), stays
    // shared instead: this process counts its kernel bytes for the holder
    // that upgrades it after us (retire_shared).
    void to_kernel_for_good(transport::Reason why) noexcept;
    // Whether SDIRECT_RULES keep this connection on TCP: asked of them
    // once (its addresses from the kernel), when it earns its upgrade or a
    // holder would take it over (pend_lock held).
    bool rule_says_kernel() noexcept;
    bool retire_shared() noexcept;
    // recv family; `flags` as for recvmsg. Bytes, 0 at EOF, or -errno.
    // A reset told to the application (from the fabric or from the kernel
    // socket) is told once: SO_ERROR does not report it again.
    ssize_t recv(const iovec *iov, int iovcnt, int flags) noexcept {
        return told(recv_stream(iov, iovcnt, flags));
    }
    ssize_t recv_stream(const iovec *iov, int iovcnt, int flags) noexcept;
    // What must stay with the kernel socket (semantics.cpp): urgent data
    // and the error queue are never on the fabric.
    static bool kernel_only(int flags) noexcept { return flags & (MSG_OOB | MSG_ERRQUEUE); }
    // Urgent data (MSG_OOB) is TCP's alone: before the first urgent byte
    // is sent, the connection moves to its kernel socket for good (reason
    // oob), so that the byte is out of band for the peer too, after every
    // byte sent before it (semantics.cpp).
    void leave_for_urgent() noexcept;
    // SO_ERROR: a reset from the fabric not reported yet (ECONNRESET,
    // now reported), or 0.
    int take_error() noexcept;
    // SIOCATMARK: 1 when the next byte to read is the urgent mark, as the
    // kernel says once no fabric byte precedes it; 0 while one does.
    int at_mark() noexcept;
    // send family; raises SIGPIPE on EPIPE unless MSG_NOSIGNAL.
    ssize_t send(const iovec *iov, int iovcnt, int flags) noexcept {
        return told(send_stream(iov, iovcnt, flags));
    }
    ssize_t send_stream(const iovec *iov, int iovcnt, int flags) noexcept;
    ssize_t told(ssize_t r) noexcept;
    // TCP_INFO's tcpi_state: the kernel socket's `kernel` state, or what
    // the fabric knows of the connection's end where the kernel socket
    // cannot (tcp_view.cpp).
    int tcp_state(int kernel) noexcept;
    // connect(AF_UNSPEC) is about to disconnect the kernel socket: the
    // connection moves back to it for good first (tcp_view.cpp).
    void disconnect() noexcept;
    int shutdown(int how) noexcept;
    // Our sending direction is over: a FIN or CLOSE on the fabric, or the
    // kernel's FIN before the connection went direct.
    bool wr_shut(const transport::Conn *c) const noexcept {
        return transport::wr_shut(c, kernel_wr_shut);
    }
    // FIONREAD
    int readable_bytes() noexcept;
    // The kernel socket's fd as last set (see `fd`).
    int kfd() const noexcept { return fd.load(std::memory_order_relaxed); }
    // Pushes combined bytes out (TCP_CORK removed, TCP_NODELAY set).
    void flush() noexcept;
    // The last fd of this socket is being closed: the peer learns it now.
    void last_close() noexcept;
    // The last fd is being closed while calls are in progress: the kernel
    // socket stays open under a private fd, and the peer learns of the
    // close when the last call is over (close_held). False if it could
    // not be kept (the close happens now).
    bool hold_for_calls() noexcept;
    void close_held() noexcept;
    // No fd and no call refers to it any more: release the connection.
    void destroy() noexcept;

    // dup: `nfd` now also maps to this stream.
    void fd_added(int nfd) noexcept;
    // `gone` no longer maps to it; if it was `fd`, another alias takes over.
    void fd_removed(int gone) noexcept;

    // Its bytes may travel on the fabric now or later: readiness and
    // sendfile must go through the stream, not to the kernel alone. False
    // for listeners, unconnected sockets and sockets on TCP for good.
    bool may_go_direct() const noexcept;

    // sendfile and splice (splice.cpp): bytes the kernel would move
    // between a file or pipe and this socket go through the stream's own
    // send and recv instead, counted and switched like any other.
    // True when they must: the connection is or may become direct. An
    // inherited socket whose owner is still direct is claimed first.
    bool moves_through_stream() noexcept;
    // sendfile(2) into this socket from `in`. Bytes, or -errno.
    ssize_t send_file(int in, off_t *offset, std::size_t count) noexcept;
    // splice(2) from pipe `in` into this socket, and from this socket into
    // pipe `out`. Bytes, or -errno.
    ssize_t splice_from_pipe(int in, std::size_t len, unsigned flags) noexcept;
    ssize_t splice_to_pipe(int out, std::size_t len, unsigned flags) noexcept;

    // The builder thread: attach now (pending connections).
    void finish_pending() noexcept;
    // Connected, and the connection has not earned its upgrade yet: it
    // runs on the kernel, counted, until ask_upgrade_locked() says it has.
    void start_earning() noexcept;
    // A readiness wait is about to sleep in the kernel on this socket
    // (earn.cpp): true, with its ask held back until end_kernel_wait(),
    // when it is on the kernel and has not asked for its upgrade (nothing
    // but a call of this process can then bring it to the fabric); false
    // when the wait must look at our state.
    bool hold_for_kernel_wait() noexcept;
    void end_kernel_wait() noexcept;
    // The same answer without the hold, for a process of one thread: no
    // other call can ask while its only thread sleeps.
    bool may_wait_in_kernel() noexcept;

  private:
    // Whether a kernel wait may leave it to the kernel (pend_lock held).
    bool kernel_wait_ok_locked() const noexcept;
    // Calls inside a syscall on the fd number they read from `fd`, one
    // that never blocks: a close that moves the socket to a private fd
    // (hold_for_calls) lets them finish before the old number goes, so
    // that none of them uses it once it is closed (or reused).
    std::atomic<int> fd_users{0};
    template <typename F>
    auto on_kfd(F f) noexcept {
        return transport::on_fd(fd, fd_users, f);
    }
    // What the direct data path (transport/datapath.hpp) needs of this
    // socket, lent for one call.
    transport::SocketSide side() noexcept;
    static bool closed_send(void *self, transport::Conn *c) noexcept;
    transport::RankedMutex<transport::Rank::leaf> alias_lock;
    std::vector<int> aliases;  // fd numbers besides `fd` (dup)
    transport::Conn *attached_conn() noexcept;
    // No connection, but its kernel I/O is counted for a later attach
    // (pending the engine, or shared through fork).
    bool counting() const noexcept {
        return pending.load(std::memory_order_acquire) || share.load(std::memory_order_acquire);
    }
    // The fork protocol's side of a socket shared through fork, through
    // fork_hooks (what each does: fork_hooks.hpp, fork_protocol/share.cpp
    // and claim.cpp).
    ssize_t orphan_error(bool out, int flags) noexcept {
        return fork_hooks.orphan_error(*this, out, flags);
    }
    bool adopt_share(Sharers *sh) noexcept { return fork_hooks.adopt_share(*this, sh); }
    void drop_share() noexcept { fork_hooks.drop_share(*this); }
    // Only a socket that went through fork has holders.
    Sharers *left_holders(transport::Conn *c) const noexcept {
        return holders.load(std::memory_order_acquire) ? fork_hooks.left_holders(*this, c)
                                                       : nullptr;
    }
    bool rejoin_locked(transport::Conn *c, Sharers *h) noexcept {
        return fork_hooks.rejoin_locked(*this, c, h);
    }
    // Pending, shared, or left for sharing (reads only): -EALREADY when
    // the connection got attached (or this process became the only
    // holder) meanwhile; `done` then says how many bytes already went
    // through the kernel.
    ssize_t pending_io(const iovec *iov, int iovcnt, int flags, bool out,
                       std::size_t &done) noexcept;
    // Kernel I/O of a pending connection just moved bytes (pend_lock
    // held): once it has earned its upgrade, the engine is asked for (its
    // build starts if it is the first) and the connection attached, now
    // or by the builder.
    void ask_upgrade_locked() noexcept;
    // The ask, or held back for the threads asleep in the kernel on it
    // (the last of them to return makes it).
    void ask_or_hold_locked() noexcept;
    // The ask itself, thresholds passed and nobody asleep in the kernel.
    void ask_now_locked() noexcept;
    // A rule says kernel: on TCP for good, with an entry that tells the
    // peer why (SDIRECT_RULES).
    void keep_by_rule() noexcept;
    // Our connection left the fabric for sharing: `n` bytes read on the
    // kernel since count for the holders.
    void count_after_leave(std::uint64_t n) noexcept;
    // A recv whose connection left the fabric under it, `done` bytes read:
    // the rest through the holders' count or the kernel.
    ssize_t recv_after_leave(transport::Conn *c, const iovec *iov, int iovcnt, std::size_t done,
                             std::size_t total, int flags) noexcept;
    ssize_t kernel_send(const iovec *iov, int iovcnt, int flags, transport::Conn *c) noexcept;
    // send_file of a connection still earning its upgrade, non-blocking:
    // the kernel's sendfile, counted (splice.cpp); -EALREADY otherwise.
    ssize_t earning_send_file(int in, off_t *offset, std::size_t count) noexcept;
    // A send of no bytes on a direct connection whose peer closed or reset
    // it: what TCP's would return (tcp_view.cpp).
    ssize_t send_nothing(transport::Conn *c, int flags) noexcept;
    // The peer's FIN (or close) has come on the fabric.
    static bool peer_fin_seen(transport::Conn *c) noexcept;
    // MSG_TRUNC on a connection on the fabric: up to `total` bytes
    // consumed (peeked) and thrown away, as TCP does (semantics.cpp).
    ssize_t recv_discard(std::size_t total, int flags) noexcept;
    // How many bytes a blocking recv of `total` waits for (SO_RCVLOWAT).
    std::size_t recv_target(std::size_t total, int flags) const noexcept;
    // The peer closed: the first send is taken (TCP sends it and draws
    // the peer's reset); true if this one is it (semantics.cpp).
    bool first_send_to_closed(transport::Conn *c) noexcept;
    // That send's reset, on the kernel socket too (its name, TCP_INFO and
    // SO_ERROR are the kernel's): one byte into it, which the peer's
    // closed socket answers with the kernel's own reset (tcp_view.cpp).
    void draw_kernel_reset() noexcept;
};

// splice(2) where `from` (socket `in`) or `to` (socket `out`), or both,
// move through their stream (moves_through_stream), the other null
// (splice.cpp). Bytes, or -errno.
ssize_t splice(Stream *from, int in, loff_t *off_in, Stream *to, int out, loff_t *off_out,
               std::size_t len, unsigned flags) noexcept;

// The engine build's callback for a pending stream (earn.cpp): attaches
// it, then drops the reference taken for the builder.
void finish_pending_cb(void *ctx) noexcept;

}  // namespace sd::fallback
