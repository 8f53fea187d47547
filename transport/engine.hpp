// The per-process engine: one fabric endpoint, CQ and address vector, the
// process page, the doorbell, the peer table, the connection table and the
// control thread that answers upgrade requests. Created lazily by the first
// TCP connection of a process; a forked child builds its own and never
// touches the parent's (see fork_protocol/).
#pragma once
#include "conn.hpp"
#include "fabric.hpp"
#include "procpage.hpp"
#include "regcache.hpp"
#include "regionlock.hpp"
#include "registry.hpp"
#include "wire.hpp"
#include "xqueue.hpp"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <sys/types.h>
#include <sys/uio.h>

namespace sd::transport {

struct PeerSink;  // conn_impl.hpp
struct WakeCache;  // wake.cpp

// A peer process we have direct connections with, or had: one whose last
// connection closed stays attached, idle, in the peer cache (peers.cpp).
// Under conn_lock_.
struct Peer {
    pid_t pid = 0;
    fi_addr_t addr = FI_ADDR_UNSPEC;
    int doorbell = -1;                 // its eventfd, passed with SCM_RIGHTS
    int pidfd = -1;                    // readable once it has exited
    std::uint64_t pidfd_serial = 0;    // names this pidfd among all of the process's
    ProcPage *page = nullptr;  // its process page: read, but for the sink claim words
    std::uint32_t conns = 0;           // connections using it (under conn lock)
    RegionLock region;                 // its shm region's lock, watched before each send
    // Its fabric address, which names the process incarnation (pid and a
    // per-process nonce): a cached peer serves only the same incarnation,
    // never a process that reused the pid or an exec of it.
    char name[96] = {};
    std::uint64_t idle_since = 0;      // the cache's clock when it went idle
    // Its process ended while in use: drop when idle. Set by the control
    // thread (table lock, through std::atomic_ref); a send reads it so,
    // without the lock.
    bool ended = false;
    // Of another uid (SDIRECT_CROSS_USER), or of ours where either end is
    // not dumpable: nothing of the provider with it (no address vector
    // entry: `addr` is kQueueAddr), no process_vm_*;
    // its messages and ours go through the queues of link `xl`
    // (xqlink.cpp), and its control socket and page are in `dir`, its
    // uid's registry.
    bool cross = false;
    // Its messages and ours go through link `xl`: every peer `cross`, and
    // a trusted one under SDIRECT_QUEUES=all (which keeps all the rest:
    // its address vector entry for RMA, its mapped page, every message
    // type).
    bool queued = false;
    int xl = -1;
    int page_fd = -1;  // its page, read with pread (page points to zeros)
    char dir[64] = {};
    // Our copies of the eventfds its sleeping threads announce
    // (ConnStat::waker), for its direct wake-ups (Engine::ring): a peer
    // of our uid in another process; nullptr for the others, which we
    // wake through the doorbell alone.
    WakeCache *wake = nullptr;
};

// The direct wake-ups' copies of one peer's eventfds (wake.cpp): made when
// a peer of our uid in another process is attached, closed when dropped.
WakeCache *wake_cache_new() noexcept;
void wake_cache_free(WakeCache *w) noexcept;

// The `addr` of a peer of another uid: it is in no address vector.
inline constexpr fi_addr_t kQueueAddr = FI_ADDR_UNSPEC - 1;

// The two queues between us and one process of another uid (xqlink.cpp):
// ours, which it writes and progress() reads, and its, which post()
// writes. Found by the process's pid and fabric address (its incarnation);
// kept while a handshake or the peer table refers to it (`refs`, under
// the table lock). `state` hands the slot between the table lock's holders
// and progress: only progress unmaps our queue (retired), so a pass never
// reads a queue that goes under it.
enum : int { kLinkFree = 0, kLinkLive = 1, kLinkRetired = 2, kLinkPoisoned = 3 };
struct XLink {
    std::atomic<int> state{kLinkFree};
    XqReader in;                             // progress alone
    int in_fd = -1;                          // passed again with every handshake
    std::atomic<const Peer *> peer{nullptr}; // whose connections its messages may reach
    pid_t pid = 0;                           // table lock
    char name[96] = {};
    std::uint32_t refs = 0;
    XqWriter out;                            // its queue, under out.lock
    // The bell it rings us by (a datagram socket pair: we poll bell_rx
    // through xbells_ep_; it holds bell_tx, passed with every handshake).
    // Of its own, and a socket: it can neither drain our wake-ups nor make
    // our writes block (an eventfd passed to it would let it do both).
    // bell_rx is set under the table lock (link_for) and read by the
    // drain under the progress lock, before which it is registered.
    std::atomic<int> bell_rx{-1};
    int bell_tx = -1;
    // Made anew each time the slot takes a link (table lock; read after
    // `state`): a sleeper's bell for an older link of the slot is stale.
    std::atomic<std::uint32_t> serial{0};
    // The peer's threads' bells (direct wake-ups, xqueue.hpp's wakers):
    // sockets it passed over our link bell with a token each, under
    // out.lock; the oldest goes when a new one finds the table full.
    struct WakeFd {
        std::uint32_t token = 0;
        int fd = -1;
    };
    static constexpr int kWakeFds = 16;
    WakeFd wake[kWakeFds];
    unsigned wake_next = 0;
    // Senders that took an fd of `wake` under out.lock and send on it
    // after letting the lock go (a system call under it queued every
    // other post of ours to the peer behind it): a bell taken out of the
    // table is closed once none is in flight, never under a send.
    std::atomic<int> wake_inflight{0};
};
inline constexpr std::uint32_t kMaxLinks = 256;
// The token in the first bytes of a bell's registration (the rest: the
// token), sent with SCM_RIGHTS over a link bell.
inline constexpr std::uint32_t kXWakeMagic = 0x57584453;  // "SDXW"
// A thread's bell for one link, the receiving end kept (wait.cpp).
struct XBell {
    int link = -1;
    std::uint32_t serial = 0;
    int rx = -1;
    std::uint32_t token = 0;
    // rx -1: the offer failed (the peer's bell full, our fd budget spent);
    // not made again before this time (CLOCK_MONOTONIC ns), nor more
    // often than `backoff_ns`, which doubles at each failure.
    std::uint64_t retry_ns = 0;
    std::uint64_t backoff_ns = 0;
    // Last taken by a sleep (CLOCK_MONOTONIC ns).
    std::uint64_t used_ns = 0;
};

// An RMA operation in flight; completed by progress(). `ctx` must come
// first. It lives on the heap and may be given up while pending
// (kOpAbandoned: its initiator stopped waiting, the peer being gone):
// whoever comes second, the completion or the initiator, deletes it.
struct WriteOp {
    fi_context ctx{};
    std::atomic<int> state{0};  // 0 pending, 1 done, -1 failed
};
inline constexpr int kOpAbandoned = 2;

// Receive buffer posted with FI_MULTI_RECV; `ctx` must come first.
struct RxBuffer {
    fi_context ctx;
    char *mem;
    std::size_t size;
};

// Most local pieces of one zero-copy read.
inline constexpr int kMaxRmaIov = 64;

// Largest payload carried inline in one message.
inline constexpr std::uint32_t kMaxInline = 16384 - 32;

class Engine;
Engine *the_engine_for_exit() noexcept;
struct Entry;   // registry.hpp
struct CtlMsg;  // control.hpp

// The process changed its privileges or sandbox (retire.cpp): from then on
// nothing is upgraded, no engine is built and no request is answered; its
// connections are on the kernel for good.
bool retired() noexcept;
// `sandbox`: chroot, unshare, setns or seccomp, for the rest of the
// process's life; else a change of ids, which a later change afresh ends
// (end_afresh). False when it already was retired.
bool set_retired(bool sandbox) noexcept;
// Retired by a sandbox (not only by a change of ids).
bool sandboxed() noexcept;
// Retired by a change of ids alone: no longer (true), or not so (false).
bool end_retirement() noexcept;
// A process that changes its ids while it holds nothing of the fabric
// goes on afresh as its new ids (afresh.cpp). begin_afresh: true when no
// engine exists (or the one built never held a connection or a peer, and
// is given up), none is being built or failed here, and none is built
// from now until end_afresh; false in a sandbox. A process retired by an
// earlier change of ids may go on afresh on the same terms (a fork child
// of a process that retired has no engine of its own).
bool begin_afresh() noexcept;
// After begin_afresh, before the ids change: every map of the old
// registry's files and of fabric regions (a fork left them) becomes
// private zeros, and control sockets bound in the old registry are closed.
void drop_old_ids() noexcept;
// After the call: `settled_ids` (real, effective and saved ids are one
// uid and one gid) derives the registry and the spin file of the ids in
// force, and ends a retirement by ids; builds may start again.
void end_afresh(bool settled_ids) noexcept;
// The process went on afresh after it had retired, or while it held
// sockets shared through fork (renewed, afresh.cpp): its connections'
// sockets may have been made by its old uid, which the kernel names as
// their owner where a peer of another uid looks for them, so it never
// waits for such a peer to ask for an upgrade (try_initiate); and it
// takes a shared socket over from holders that do not use it
// (fork_protocol/share.cpp).
bool ids_renewed() noexcept;
void note_ids_renewed() noexcept;
// An id change is under way: no engine build starts.
bool builds_held() noexcept;
// A receive ring of `cap` bytes, in a mapping of its own (ringmem.cpp),
// aligned to a huge page when it spans one and kept on small pages until
// a whole ring's worth has been read from it (Engine::ring_filled).
char *ring_alloc(std::uint32_t cap) noexcept;

// Asks process `owner`, whose connection socket `fd` also is here, to
// move it back to the kernel (leave, or its handoff's hand_off), because
// of `why`, over the control channel (handoff.cpp). 0 when the kernel
// socket carries it all now; -ESRCH (no such owner), -EIO (it could not),
// -ECONNRESET (bytes were lost), -EAGAIN (ask again), -ETIMEDOUT.
int request_leave(pid_t owner, int fd, Reason why) noexcept;
// The registry entry of the connection end `t`, and writing it (whole,
// through a temporary file and rename) (publish.cpp).
void entry_path(char *out, std::size_t n, const Tuple &t) noexcept;
bool write_entry(const Tuple &t, Entry &e, std::uint64_t *dev, std::uint64_t *ino) noexcept;
// A connection this process never attached (accepted and never used)
// stays on the kernel, or waits while it is shared (fork): our entry for
// it says why, so that its peer reports peer_kernel, not no_peer
// (verdict.cpp). The entry's identity goes to `mark` (the Stream keeps
// it): the last holder's close removes it (unmark_unattached); else it
// stays until this pid ends. Best effort.
struct EntryMark {
    std::uint64_t dev = 0, ino = 0;
};
void mark_unattached(int fd, Reason why, EntryMark *mark = nullptr) noexcept;
// The entry `mark` names, if it is still the one at `fd`'s name.
void unmark_unattached(int fd, EntryMark &mark) noexcept;
// `addr` (family AF_INET: 4 bytes, AF_INET6: 16) is one of this host's
// (loopback, or an interface's address); true when that cannot be told.
bool address_is_local(std::uint16_t family, const std::uint8_t *addr) noexcept;

class Engine {
  public:
    // This process's engine if it is built (else nullptr).
    static Engine *current() noexcept;
    // The engine, or nullptr while it is being built on a thread of its
    // own (started by this call) or when it cannot be built here.
    static Engine *ready() noexcept;
    // ready(), waiting up to `ms` for a build under way.
    static Engine *wait_ready(std::uint32_t ms) noexcept;
    // Runs fn(ctx) on the builder thread once the build has finished (or
    // failed). False when no build is under way: call ready() again.
    static bool when_ready(void (*fn)(void *), void *ctx) noexcept;
    // No engine here: none built, none being built, none failed (a failed
    // build may have left files and maps behind).
    static bool idle_process() noexcept;
    // This process listened, or is a fork child of one that did: a
    // server, which lives long enough to pay for a build at its first
    // connection that earns its upgrade (SDIRECT_BUILD_AFTER_MS is for
    // clients). Kept across fork; an exec starts over.
    static void note_server() noexcept;
    static bool serving() noexcept;
    // A change of ids (afresh.cpp) in a process whose engine never held a
    // connection or a peer (a server that listened before it dropped its
    // ids): the engine is given up as a fork child gives up its parent's.
    // Its files leave the registry (the ids have not changed yet), its
    // control thread ends, and the next build makes a new one. False (and
    // nothing changed) when there is no engine or it held something.
    static bool give_up_unused() noexcept;
    int init_for_thread() noexcept;
    // Before fork: waits (bounded) for a build under way, whose thread
    // would not exist in the child while its locks stayed taken there,
    // then for that thread's end. False when the build was still going
    // on when the wait ended.
    static bool settle_before_fork() noexcept;
    // Before fork, after settle_before_fork: waits (bounded) until the
    // control thread is between requests, and keeps it there until
    // resume_after_fork() in the parent. The child then holds no lock of
    // a thread of ours that it does not have, the allocator's included
    // (an allocator without fork handlers, such as a sanitizer's, would
    // otherwise stay locked in the child whenever our thread was freeing).
    static void park_for_fork() noexcept;
    static void resume_after_fork() noexcept;
    // Forget the engine of the parent (in a fork child, before any use).
    // `settled` is what settle_before_fork() answered: if false, the child
    // may hold locks of the parent's builder and never builds its own.
    static void forget_after_fork(bool settled) noexcept;
    // At exit: counters to SDIRECT_STATS_FILE, registry files removed.
    static void shutdown_at_exit() noexcept;
    // Once per process: every connection's counters to SDIRECT_STATS_FILE,
    // our page to <registry>/exited (exitstats.cpp). `from_signal`: called
    // by a handler, so only async-signal-safe steps.
    void write_final_stats(bool from_signal) noexcept;

    // Connected TCP socket `fd`: allocate its Conn (stat slot), publish it
    // and start the upgrade if the peer already published. `rcvbuf` is the
    // application's SO_RCVBUF (0 = not set): it sizes the receive window.
    // `sent`/`received`: stream bytes that already went through the kernel.
    // nullptr if the connection table is full.
    Conn *attach(int fd, bool acceptor, std::uint32_t rcvbuf, std::uint64_t sent = 0,
                 std::uint64_t received = 0) noexcept;
    // Last close: tell the peer, unpublish, free the slot.
    void detach(Conn *c) noexcept;
    // No upgrade, ours or the peer's, of a connection not direct from now
    // on, until a take-back (handoff.cpp; the policy is the caller's: a
    // fork, an exec, urgent data, a change of privileges). Waits (bounded)
    // for an upgrade request of ours in flight; one still under way after
    // that is marked too: it commits nothing, or leaves as soon as it is
    // direct. `why`: what the peer is told (mark_kernel).
    void bar_upgrades(Conn *c, Reason why) noexcept;
    // The mark alone, with conn_lock_ held (no wait for an upgrade).
    void bar_upgrades_locked(Conn *c, Reason why) noexcept;
    // After bar_upgrades(): waits (within the upgrade timeout) for an
    // upgrade under way to end. True if it ended direct (then the caller
    // makes it leave).
    bool settle_upgrade(Conn *c) noexcept;

    // Leaving the fabric (leave.cpp): the connection goes back
    // to its kernel socket at stream offsets, for every process that holds
    // the socket. We end our fabric stream, wait
    // (up to SDIRECT_LEAVE_TIMEOUT_MS) for the peer to end its own, return
    // it what we received and had not read, and read the kernel from then
    // on; a leave for its handoff's reason gives the handoff our offsets
    // (HandoffOps::take). The caller holds conn_lock_ (`c` cannot be
    // detached meanwhile) and no lock of `c`. 0 (on the kernel now), 1 (it
    // was already), -ETIMEDOUT (the peer did not answer: the log says what
    // changed), -EPIPE.
    int leave_locked(Conn *c, Reason why) noexcept;
    // The same for an application thread of ours (exec, posix_spawn).
    int leave(Conn *c, Reason why) noexcept;
    // The connection goes to its handoff whatever its state: direct, it
    // leaves for `why`; otherwise, with a handoff set, its upgrades are
    // barred (an upgrade under way is waited for) and it goes final, its
    // offsets handed over. 0, or -errno as for leave.
    int hand_off(Conn *c, Reason why) noexcept;
    // The same with conn_lock_ held, without waiting: -EAGAIN while an
    // upgrade is under way or a call of ours holds the connection.
    int hand_off_locked(Conn *c, Reason why) noexcept;
    // A connection that is not direct stays on the kernel for good, for
    // `why` (retire.cpp): unpublished, no upgrade either way. One that left
    // for sharing no longer comes back.
    void stay_on_kernel(Conn *c, Reason why) noexcept;
    // Another program takes the connection's kernel socket over from our
    // offsets (leave.cpp; an exec in place of a program that runs the
    // library): the connection goes back to its kernel socket (a direct
    // one leaves for the reason `inherited`, which rearms the peer; one in
    // kernel mode is unpublished without a mark), and `tx`/`rx` are the
    // stream offsets where the successor goes on. -EBUSY when it cannot be
    // handed on (an upgrade under way, bytes still owed, half-closed), or
    // the leave's error.
    int hand_on(Conn *c, std::uint64_t &tx, std::uint64_t &rx) noexcept;
    // Waits (bounded by the upgrade timeout) while an upgrade of `c` is
    // under way, ours or the peer's, so that it ends direct or on TCP.
    void await_upgrade(const Conn *c) noexcept;
    // A connection on the kernel since attach with no sign of the peer
    // (verdict.cpp): once the upgrade timeout has passed, or `at_end`
    // (close, exit), its reason is made as exact as we can tell (no_peer,
    // other_registry, other_user, peer_kernel) and logged, once.
    void judge(Conn *c, bool at_end) noexcept;
    // After a kernel read (`rx`) or write of `moved` bytes: judge(c,
    // false) once its verdict is due; past it, whether the wait for the
    // peer's upgrade has run out (peer_wait_due).
    void judge_due(Conn *c, bool rx, std::uint64_t moved) noexcept;
    // A connection published and still on the kernel SDIRECT_PEER_WAIT_MS
    // after its entry was written, and Conn::kPeerWaitTurns turns of the
    // conversation since (a peer with the library that talks with us that
    // much has asked by then, unless something of its own holds its ask
    // back, such as a thread blocked in a read): its wait is over
    // (Conn::give_up_due), acted on by give_up_waiting at the end of the
    // call. Any lock.
    void peer_wait_due(Conn *c, bool rx) noexcept;
    // Its wait over: on TCP for good, its entry marked peer_wait (a peer
    // that asks later is told why), the reason its verdict gave kept. An
    // upgrade that came first wins. Takes conn_lock_: no lock held.
    void give_up_waiting(Conn *c) noexcept;
    // Its look for the peer's entry is due again (Conn::ask_again_ns, set
    // by ask_later): try_initiate once more. At the end of a call, with
    // no lock held.
    void ask_again(Conn *c) noexcept;
    // After every connection left (retired()): the peers' process pages
    // and fabric regions are no longer mapped here, their doorbells and
    // pidfds closed, our entries gone from the registry.
    void forget_peers() noexcept;
    // Send side of a connection that left (tx_lock held): our own leave if
    // the peer left first, then the bytes the peer returned, then our
    // staged ones, into the kernel socket, before anything new. Waits until
    // `deadline_ns` (0: no limit) when `blocking`. 0, -EAGAIN or -errno.
    int leave_flush_locked(Conn *c, bool blocking, std::uint64_t deadline_ns) noexcept;
    // Take-back of a connection that was handed over (final), at stream
    // offsets `sent` and `received` the caller knows (tx_lock held): kernel
    // mode again, its handoff forgotten and upgrades no longer barred,
    // waiting for the peer (rearmed when it saw our leave) to upgrade it
    // with us. False when it cannot come back (either side half-closed, an
    // error): it stays final.
    bool take_back_locked(Conn *c, std::uint64_t sent, std::uint64_t received) noexcept;

    // Progress the CQ if no other thread does (try-lock), or wait for it.
    // progress(): the completions taken (0 also when another thread had it).
    std::size_t progress() noexcept;
    // progress() for the sake of one direct connection `c` (a recv's first
    // look, a send's look for its peer's close): of the links, only the
    // queue its peer writes to us is read; the provider's part is as in
    // every pass. The other links' messages wait for a pass of their own
    // readers (a recv on one of their connections, a poll, a sleeper's
    // pass): a process with many peers (a client of 8 backends, a server
    // of 50 clients) read every peer's queue at each recv.
    std::size_t progress_for(const Conn *c) noexcept;
    void progress_blocking() noexcept;
    // A sleeper's last look after announcing its sleep: a pass that starts
    // after this call did. A plain try-lock would leave it to the holder,
    // whose read of the queue may have come before a message whose sender
    // saw no sleeper and rang no doorbell; with only the connection's own
    // pollers rung, nothing else would wake the sleeper. So the call marks
    // a pass owed, then takes the lock if it is free; if not, it returns at
    // once and the holder runs the owed pass before it lets go
    // (unlock_progress): threads that go to sleep together do not queue on
    // the lock one behind the other (8 server threads of one process: a
    // third of a futex call per request went to that queue).
    // Passes until the queue is empty (a pass takes a bounded number).
    void progress_before_sleep() noexcept;
    // The doorbell was found rung: drains it, clears the latch (kRung),
    // then takes in what is queued, which includes every message whose
    // sender saw the latch set and rang no more.
    void take_ring() noexcept;

    // Sends one message (header + iov payload, total within inject size),
    // retrying -FI_EAGAIN (the peer's queue is full: it is rung, then
    // kicked) until `deadline_ns` (0 = forever while the peer lives).
    // 0, -EAGAIN on deadline, -EPIPE if the peer is gone, -EIO.
    int post(Conn *c, MsgType type, const iovec *iov, int iovcnt, std::uint32_t len,
             std::uint64_t offset, std::uint64_t deadline_ns, std::uint32_t flags = 0) noexcept;
    // Writes `len` bytes of iov straight into the peer's ring (RMA), then
    // announces them; both only once credits cover `len`. 0 or -errno.
    int post_ring(Conn *c, const iovec *iov, int iovcnt, std::uint32_t len,
                  std::uint64_t deadline_ns) noexcept;
    // Read zero-copy, send side (tx_lock held): registers `len` bytes at
    // `buf` for the peer to read and advertises them at offset tx_off.
    // One host: not registered (the peer reads with process_vm_readv);
    // otherwise through the registration cache. 0 or -errno; `*ref` is
    // what release_advert() takes back.
    int advertise(Conn *c, const char *buf, std::uint32_t len, RegCache::Ref *ref) noexcept;
    // Asks the peer to end our advertisement at `off` early.
    int cancel_advert(Conn *c, std::uint64_t off) noexcept;
    void release_advert(const RegCache::Ref &ref) noexcept;
    // The receiver could not read an unregistered advertisement: asks the
    // sender to register from now on (src_need_key).
    void need_key(Conn *c) noexcept;
    // Read zero-copy, receive side: reads `len` bytes of the peer's
    // registered memory at `addr` into iov (rx_lock not held). 0 or -errno
    // (-EIO: the peer's memory is gone; -ENOKEY: the buffer is not
    // registered and the kernel refuses process_vm_readv).
    int read_remote(Conn *c, const iovec *iov, int iovcnt, std::uint64_t addr,
                    std::uint64_t key, std::size_t len) noexcept;
    // Ends the advertisement being read (rx_lock held); the caller then
    // answers with answer_advert() after releasing rx_lock.
    static void finish_advert_locked(Conn *c, std::uint64_t *off, std::uint32_t *done) noexcept;
    void answer_advert(Conn *c, std::uint64_t off, std::uint32_t done) noexcept;
    // Write zero-copy (sink.cpp). Receive side: sinks are possible here
    // (SDIRECT_SINK_MIN set).
    bool sink_ok() const noexcept;
    // Advertises `len` bytes at `buf` (a prefix of them, where the
    // registration budget is short) for the stream bytes from rx_off (no
    // lock of c held): 0, or -EAGAIN when the queue is not empty, the
    // buffer could not be registered or the message could not go.
    int advertise_sink(Conn *c, void *buf, std::uint32_t len) noexcept;
    // Ends our sink: 0 (cancelled, or over: the buffer is the
    // application's again) or 1 (wait for the peer's word: it claimed the
    // sink, or was asked with sink_cancel; finish_sink() then).
    int cancel_sink(Conn *c) noexcept;
    // While we wait for the peer's word (cancel_sink() said 1, asked at
    // `asked_ns`): true when it will not come (the peer is gone, the
    // connection broken). A registered sink's answer that is slow to come
    // is chased here (the cancel again, the peer's control thread).
    bool sink_writer_lost(Conn *c, std::uint64_t asked_ns) noexcept;
    // The sink is over (no lock of c held): deregistered, so that nothing
    // lands in it any more. The bytes the peer wrote into it (already
    // counted in rx_off).
    std::uint32_t finish_sink(Conn *c) noexcept;
    // Send side (tx_lock held): writes up to `len` bytes of iov into the
    // peer's sink if it waits at tx_off. Bytes written, 0 (none), -errno.
    long take_sink(Conn *c, const iovec *iov, int iovcnt, std::size_t len) noexcept;
    // One host: copies between our iov and the peer's memory with
    // process_vm_readv/writev. 0, -EPIPE (gone), -EIO, or -ENOSYS when the
    // kernel refuses (the caller then uses the provider's RMA).
    int cma_copy(pid_t pid, const iovec *local, int nlocal, const iovec *remote, int nremote,
                 bool write) noexcept;
    // Copies with this connection's peer may use process_vm_*: one host,
    // and never across users.
    bool cma_with(const Conn *c) const noexcept;
    // The provider can read remote memory (read zero-copy is possible).
    bool can_read() const noexcept { return can_read_; }
    // Largest local iovec count of one RMA operation.
    int rma_iov_limit() const noexcept { return rma_iov_limit_; }
    // `len` bytes went into the peer's ring (inline or by RMA): stream
    // offset, ring position, credits and counters move (tx_lock held).
    void sent_into_ring(Conn *c, std::uint32_t len) noexcept;
    // Sends the staged bytes (caller holds tx_lock) once credits cover
    // them, waiting until `deadline_ns`. 0 or -errno.
    int post_stage_locked(Conn *c, std::uint64_t deadline_ns) noexcept;
    // The stage of `c` holds accepted bytes that wait for credits (tx_lock
    // held): the next progress() that finds the credits sends them.
    void want_flush(Conn *c) noexcept;
    // A flush found its credits but could not send yet (look again soon).
    bool flush_pending() const noexcept { return flush_retry_.load(std::memory_order_relaxed); }
    // Tells the peer our send switch point now (upgrade just finished).
    void announce_switch(Conn *c) noexcept;
    // The same with tx_lock held: a send that went through the kernel
    // while the upgrade finished makes the announcement it skipped.
    void announce_switch_locked(Conn *c) noexcept;
    // Rings the peer's doorbell if one of its threads sleeps.
    void ring(const Peer *p) noexcept;
    // A doorbell eventfd and the sleepers word it goes with (a process
    // page's, ours or a peer's): written when the word counts sleepers and
    // its latch (kRung) was not set yet; the latch is set first.
    static void ring_doorbell(std::atomic<std::uint32_t> &word, int doorbell) noexcept;
    // After a post to `c`: wakes the peer's thread that sleeps on it, by
    // writing that thread's own eventfd where the peer announced one
    // (ConnStat::waker) and we hold a copy of it; else ring(c->peer).
    void ring(const Conn *c) noexcept;
    // A thread of ours goes to sleep (+1) or wakes (-1): our process page
    // counts it, and, for peers of other uids, which never map our page,
    // the queues they write to (seq_cst: a sleeper's recheck follows).
    void announce_sleep(int delta) noexcept;
    // Slot `id` of the peer's process page (nullptr: none). A peer of
    // another uid owns that file and may shrink it: its slot is read with
    // pread into `buf`, never through a map (a read past its end would be
    // SIGBUS); for others, the slot in the mapped page.
    const ConnStat *peer_slot(const Peer *p, std::uint32_t id, ConnStat *buf) const noexcept;
    // Our bytes went on the fabric (tx_lock held): after the peer's FIN,
    // the first time, its process is made to take them (abort.cpp).
    void sent_past_fin_locked(Conn *c) noexcept;
    // Makes the peer process progress its fabric, through its control
    // thread, until its queue is empty (for an answer it owes while none
    // of its threads may call in: a cancelled advertisement, a leave; or
    // room in its queue, full of messages its application has not called
    // in to take).
    void kick(const Peer *p) noexcept;
    // The one policy for an answer the peer owes us since `asked_ns` (a
    // cancelled advertisement or sink, a leave): a peer with a thread in
    // the library answers within microseconds; past kKickAfterNs its
    // control thread is kicked, again every kKickAgainNs. `*kicked_ns`:
    // when we last kicked (0: never), updated. Returns when the next kick
    // is due, for the caller's sleep.
    static constexpr std::uint64_t kKickAfterNs = 1'000'000;
    static constexpr std::uint64_t kKickAgainNs = 100'000'000;
    // A kicked control thread's progress passes at most (one takes up to
    // 256 completions: 16 cover the CQ's 4096).
    static constexpr int kKickPasses = 16;
    std::uint64_t kick_overdue(const Peer *p, std::uint64_t asked_ns,
                               std::uint64_t *kicked_ns) noexcept;
    // Returns accumulated credits now if they reach the threshold.
    void maybe_return_credits(Conn *c) noexcept;
    bool peer_alive(const Peer *p) const noexcept;
    // The peer process closed its end of `c` (its page slot says so).
    bool peer_conn_closed(const Conn *c) const noexcept;
    // The peer process of `c` is gone: no more reading on its side; a
    // reset if it left bytes of ours unread.
    void peer_died(Conn *c) noexcept;
    // Fabric bytes of ours the peer's application has read, from its
    // process page (its counters outlive it); kNoOffset if unknown.
    std::uint64_t peer_read(const Conn *c) const noexcept;
    // Waits up to `ms` for the peer process to end; true if it has.
    bool peer_exit_wait(const Peer *p, int ms) const noexcept;

    int doorbell() const noexcept { return doorbell_; }
    // The epoll set of the bells that peers of other uids ring us by (-1:
    // no such peer yet); a sleeper that watches the doorbell watches it
    // too, and calls take_xbells() when it is readable.
    int xbells() const noexcept { return xbells_ep_.load(std::memory_order_acquire); }
    void take_xbells() noexcept;
    // Direct wake-ups across users (xqueue.hpp's wakers). The link of a
    // direct connection to a peer of another uid (its serial in *serial),
    // or -1.
    int xlink_of(const Conn *c, std::uint32_t *serial) noexcept;
    // Passes `tx`, one end of a thread's bell, to the peer of `c` over
    // its link bell, with `token` (the peer keeps it: take_wake_offer).
    // 0 or -errno.
    int offer_wake_bell(const Conn *c, int tx, std::uint32_t token) noexcept;
    // Puts `word` (wait.hpp's CrossWake) in connection `id`'s word of
    // link `xl`'s queue (if the link is still the one of `serial` and the
    // word is free): the peer, when it posts to the connection, sends a
    // byte on the bell of its token. True if it went in.
    bool xwaker_announce(int xl, std::uint32_t serial, std::uint32_t id, std::uint64_t word) noexcept;
    // Takes it out again: true if the peer had rung the bell meanwhile.
    bool xwaker_withdraw(int xl, std::uint32_t serial, std::uint32_t id, std::uint64_t word) noexcept;
    // No thread enters the provider until reopen_provider() (regionlock.hpp):
    // before a call that ends the process's other threads wherever they
    // are (an exec replaces the image). True if the gate was closed.
    static bool close_provider() noexcept;
    static void reopen_provider() noexcept;
    // The fabric, and our region not left locked by a dead process.
    bool fabric_usable() const noexcept { return fabric_ok_ && !own_region_.wedged(); }
    std::uint32_t chunk() const noexcept { return chunk_; }
    pid_t pid() const noexcept { return pid_; }

    // --- control channel (control.cpp) ---
    void control_loop() noexcept;

  private:
    // progress()'s pass, with progress_lock_ taken; releases it. `link`:
    // as for pass_locked.
    std::size_t progress_pass(int link = -1) noexcept;
    // The pass itself: progress_lock_ taken, and still taken on return.
    // `*flush` (if given) false: the region or the provider's gate kept
    // it out, and staged sends are better left for a later pass.
    // `link`: only that link's queue (progress_for), -1 every live one.
    std::size_t pass_locked(bool *flush = nullptr, int link = -1) noexcept;
    // Lets progress_lock_ go. A pass owed to a sleeper that found the lock
    // taken (progress_before_sleep) runs first: after the release, if one
    // is owed and the lock is free, this thread takes it again and passes,
    // until none is owed; should the owed passes go on past a bound, it
    // rings our own doorbell, whose drainer passes (take_ring).
    void unlock_progress() noexcept;
    // progress_lock_ held for a scope without a pass of its own (a fence
    // against deliveries); its release serves an owed pass.
    class ProgressHeld {
      public:
        explicit ProgressHeld(Engine &e) noexcept : e_(e) { e_.progress_lock_.lock(); }
        ~ProgressHeld() { e_.unlock_progress(); }
        ProgressHeld(const ProgressHeld &) = delete;
        ProgressHeld &operator=(const ProgressHeld &) = delete;

      private:
        Engine &e_;
    };
    int init() noexcept;
    int open_page() noexcept;
    int open_fabric() noexcept;
    void start_regcache() noexcept;
    // The cache's counters into our process page.
    void publish_regstats() noexcept;
    void post_rx(RxBuffer *b) noexcept;
    // deliver.cpp: a received message, handled under its connection's
    // rx_lock by the handler of its type (a table indexed by MsgType).
    // `from`: the link whose queue it came by (a peer of another uid): it
    // reaches that peer's connections alone.
    void deliver(const char *buf, std::size_t len, const XLink *from = nullptr) noexcept;
    struct Rx;
    // leave.cpp: the messages (rx_lock held), and the send side's work
    // without blocking (tx_lock held): 0 done, -EAGAIN not yet, -errno.
    void on_leave(Conn *c, const MsgHeader &h) noexcept;
    void on_give_back(Conn *c, const MsgHeader &h, const char *payload) noexcept;
    void on_sink_avail(Conn *c, const MsgHeader &h, const char *payload) noexcept;
    void on_sink_done(Conn *c, const MsgHeader &h, const char *payload) noexcept;
    // A sink_cancel (send side): true when we answer it (sink_done of 0,
    // posted by the caller once rx_lock is released).
    bool on_sink_cancel(Conn *c, const MsgHeader &h, const char *payload) noexcept;
    void answer_sink_cancel(Conn *c, std::uint64_t seq, std::uint64_t off) noexcept;
    // abort.cpp: `len` stream bytes came (rx_lock held). True when they
    // are refused: our end is shut both ways, so TCP answers with a reset;
    // `*answer` is set the first time, and the caller then posts the
    // reset (answer_reset) once rx_lock is released.
    bool refuse_at_shut_end_locked(Conn *c, std::uint64_t len, bool *answer) noexcept;
    void answer_reset(Conn *c) noexcept;
    // The peer's CLOSE without a reset came (rx_lock held): bytes of ours
    // that reached it only after its close draw TCP's reset all the same.
    void closed_before_ours_locked(Conn *c) noexcept;
    // A stream message of the peer came (rx_lock held): a registered sink
    // of ours it follows is never written.
    static void sink_passed_locked(Conn *c) noexcept;
    // sink.cpp: the two ways a sink is written, and the RMA write itself.
    long take_sink_cma(Conn *c, const PeerSink &ps, const iovec *iov, int iovcnt,
                       std::size_t len) noexcept;
    long take_sink_rma(Conn *c, const PeerSink &ps, const iovec *iov, int iovcnt,
                       std::size_t len) noexcept;
    // Which kind of sink we advertise to the peer of `c`: the one place
    // that chooses between the claim word (one host) and registration.
    bool sink_by_cma(const Conn *c) const noexcept;
    // Reserves up to `want` bytes of the sinks' registration budget.
    std::uint32_t reserve_sink(std::uint32_t want) noexcept;
    // Sets an RMA write's outcome (progress); deletes an abandoned one.
    void complete_write(WriteOp *op, int state) noexcept;
    void send_leave_locked(Conn *c, bool first, Reason why) noexcept;
    int leave_work_locked(Conn *c) noexcept;
    // The peer left for a reason after which its side may upgrade again
    // (on_leave) and everything of the fabric is done here
    // (tx_lock and rx_lock held): back to kernel mode, as a connection
    // before its upgrade (publish and try_initiate follow, unlocked).
    void rearm_locked(Conn *c) noexcept;
    // Instead of rearming: a handoff is set, so it takes over from our
    // offsets (final here). False if none is set.
    bool final_to_handoff_locked(Conn *c) noexcept;
    // The peer's unread fabric bytes into the handoff's room, read first
    // by whoever takes over; then final for this process, the offsets
    // (past those bytes) handed over. rx_lock held.
    bool unread_to_handoff_locked(Conn *c) noexcept;
    int write_owed_locked(Conn *c) noexcept;
    // The provider's RMA write or read of our iov (with `flags` too),
    // waited for as long as the peer lives. 0, -EIO, -EPIPE (a write whose
    // peer died first: nothing of it counts).
    int rma(Conn *c, const iovec *iov, int iovcnt, const fi_rma_iov *remote, int nremote,
            bool write, std::uint64_t flags = 0) noexcept;
    void flush_due_stages() noexcept;
    // ringmem.cpp: the end of a closed connection's ring (detach, after the
    // last delivery). `keep`: the peer may still write into it
    // (peer_may_write, judged before our reference to the peer goes), so
    // its addresses stay reserved, inaccessible, and a reference to the
    // peer with them, until reap_rings_locked (conn_lock_ held: at the end
    // of each ring and before each attach_peer) finds the peer's
    // connection closed or the peer gone.
    bool peer_may_write(Conn *c) noexcept;
    void end_ring(Conn *c, bool keep) noexcept;
  public:
    // The reader has consumed a whole ring's worth (every page of it was
    // written, so it is all resident): its memory becomes huge pages where
    // it spans them (SDIRECT_RING_HUGE), at no cost in memory. The caller
    // holds the connection, not rx_lock (the collapse copies the ring).
    void ring_filled(Conn *c) noexcept;
  private:
    void reap_rings_locked() noexcept;
    struct RetiredRing {
        char *mem;
        std::size_t len;
        Peer *peer;
        std::uint32_t peer_id;
    };
    RetiredRing retired_[1024] = {};
    std::size_t nretired_ = 0;
    Conn *lookup(std::uint32_t id, std::uint32_t gen) noexcept;

    // peers.cpp: the peer table and its cache of idle peers (conn_lock_
    // held). attach_peer takes `doorbell` (kept or closed) and returns the
    // peer with one more reference, or nullptr with `*why`; release_peer
    // drops a reference (an idle peer stays cached, up to
    // SDIRECT_PEER_CACHE, the least recently used going first).
    // xqlink.cpp: the links to peers of other uids (table lock held but
    // for read_links). link_for: the link to process `pid` of fabric
    // address `name`, with one more reference (created, with our queue,
    // if there is none): its index, or -errno (-EPROTO: it broke ours
    // before). link_put drops a reference; the last retires the link.
    int link_for(pid_t pid, const char *name) noexcept;
    void link_put(int xl) noexcept;
    // The peer's queue `fd` (taken: kept mapped or closed) for link `xl`:
    // checked (xq_check) and mapped, in place of another it passed before.
    // 0 or -EPERM (not a queue we can trust the size of).
    int link_set_out(int xl, int fd) noexcept;
    // Progress's part (progress_lock_ held): reads every live link's queue,
    // delivers, unmaps retired ones. Messages taken. read_link: link `l`'s
    // queue alone.
    std::size_t read_links() noexcept;
    std::size_t read_link(XLink &l) noexcept;
    void reap_links_locked() noexcept;
    // A link's bell pair, its receiving end in xbells_ep_ (made at the
    // first link) under the link's index; 0 or -errno. drop_bell: both
    // closed (progress_lock_ held).
    int make_bell(XLink &l) noexcept;
    void drop_bell(XLink &l) noexcept;
    // A queue that broke its rules: not read again, and every connection
    // with its peer broken (progress_lock_ held).
    void poison_link(XLink &l) noexcept;
    XLink links_[kMaxLinks];
    std::atomic<std::uint32_t> links_used_{0};  // slots not free: progress's one test
    // Whether the provider may have work for us: a peer whose messages
    // come through the provider was attached (for good: late messages of
    // a cached or closed peer still come), RMA operations of ours are in
    // flight (posted, not completed; one abandoned by a dead peer may
    // never complete, and the queue is then read at every pass as
    // before), or our doorbell rang (a peer's RMA into our memory that
    // the provider carries through our region waits for our progress,
    // and rings while it waits). Otherwise progress reads the provider's
    // queue once in kQuietPasses passes: a spinning thread's passes
    // serve such an RMA within a few microseconds, a sleeping one's ring.
    std::atomic<bool> provider_msgs_{false};
    std::atomic<std::uint32_t> rma_pending_{0};
    std::atomic<bool> provider_due_{false};
    std::uint32_t quiet_passes_ = 0;  // progress_lock_
    static constexpr std::uint32_t kQuietPasses = 64;
    std::atomic<std::uint32_t> links_hi_{0};    // slots ever used: the passes stop there
    // Orders the copies of our sleepers count into the links' queues, and
    // keeps our queues mapped while a sleeper writes its word in one
    // (outside the ranked order: nothing is taken under it but, in
    // reap_links_locked, bells_lock_ and a link's out.lock).
    std::mutex mirror_lock_;
    std::atomic<int> xbells_ep_{-1};
    // Held while the links' bells are drained and while one is closed
    // (outside the lock order: nothing is taken under it but a link's
    // out.lock, a leaf).
    std::mutex bells_lock_;
    void drain_xbells_locked() noexcept;
    // A datagram with fds on link `l`'s bell: a bell of a thread of the
    // peer's, kept (under out.lock) if it is one; every other fd closed.
    void take_wake_offer(XLink &l, const msghdr &m, unsigned len) noexcept;
    void close_wake_fds_locked(XLink &l) noexcept;
    void close_wake_fd_locked(XLink &l, XLink::WakeFd &w) noexcept;
    // After a post to `c`, whose peer is of another uid: the peer's
    // thread that announced its bell in the connection's word is woken on
    // it. False if none was (the caller rings the link's bell).
    bool ring_xwaker(const Conn *c) noexcept;
    void mirror_sleepers_locked() noexcept;
    char xq_msg_[sizeof(MsgHeader) + kMaxInline];  // a message copied out (progress_lock_)

    // Opens our process page to `uid` (SDIRECT_CROSS_USER):
    // called once its process proved to be our connection's peer, or is
    // the owner of the registry where we found the peer's entry (which
    // then must prove it too before we commit). 0 or -errno.
    int open_to_uid(unsigned uid) noexcept;
    // `pid` is an attached peer (a kick from another uid is taken from
    // those alone).
    bool is_peer(pid_t pid) noexcept;
    // `dir`: the peer's registry when it is of another uid, else nullptr.
    // `xl`: its link (a reference taken over: kept or dropped), -1 if of our uid.
    Peer *attach_peer(pid_t pid, const char *addr, int doorbell, Reason *why,
                      const char *dir = nullptr, int xl = -1) noexcept;
    void release_peer(Peer *p) noexcept;
    // Unmaps and forgets a peer nobody uses.
    void drop_peer(Peer *p) noexcept;
    // Drops idle peers, least recently used first, until at most `keep`
    // are left. False if there was none to drop.
    bool evict_idle(std::uint32_t keep) noexcept;
    // Peers whose process may have ended (their pidfd fired): idle ones
    // are dropped, those in use dropped when their last connection goes.
    void reap_ended_peers() noexcept;
    // The control thread's wait: our control socket, the wake-up eventfd
    // and the pidfds of the attached peers. Fills `fds`, returns its count.
    int gather_watch(struct pollfd *fds, int max) noexcept;
    std::uint64_t peer_clock_ = 0;
    std::uint32_t idle_peers_ = 0;
    int watch_fd_ = -1;  // eventfd: a peer was attached, watch its pidfd

    // control.cpp: the control socket and its thread, which hands each
    // request to its answer below.
    int start_control() noexcept;
    void handle_request(int fd) noexcept;
    // publish.cpp: our half of a connection in the registry.
    // kernel_why: see mark_kernel.
    void publish(Conn *c, Reason kernel_why = Reason::none) noexcept;
    void unpublish(Conn *c) noexcept;
    Conn *find_tuple(const Tuple &t) noexcept;
    // handshake.cpp: the upgrade, as its initiator and as its responder
    // (the control thread, for request `req` and the fds it passed).
    void try_initiate(Conn *c) noexcept;
    // try_initiate found no entry of the peer and the peer cannot find
    // ours (Conn::ask_again_ns): look again at the end of a later call,
    // while the connection is on the kernel and waits for its peer
    // (SDIRECT_PEER_WAIT_MS). ask_again, with no lock held, looks once it
    // is due.
    void ask_later(Conn *c) noexcept;
    static constexpr std::uint32_t kAskStepMaxMs = 1024;
    // The connecting side found the acceptor's entry: its request is sure
    // to come.
    bool acceptor_will_ask(const Conn *c, const Entry &e) noexcept;
    // `queue`: the initiator's queue for our messages (across users, or
    // where either end is not dumpable).
    void answer_upgrade(int fd, CtlMsg &req, int proof, int bell, int queue, int xbell) noexcept;
    // Both ends committed: the connection is direct from here (conn_lock_).
    void go_direct(Conn *c) noexcept;
    // The receive ring; `offer`: registered with the provider too, for a
    // peer that may write it.
    int make_ring(Conn *c, bool offer) noexcept;
    std::uint64_t next_key_ = 1;
    void set_final(Conn *c, Reason r) noexcept;
    // handoff.cpp: another process that holds one of our connections'
    // sockets asks us to leave (request_leave).
    void handle_leave(int fd, pid_t pid, const Tuple &tuple, int proof, Reason why) noexcept;
    // verdict.cpp: our entry stays, marked: this end will not upgrade,
    // because of `r` (its peer reports peer_kernel). Replaces unpublish
    // for such ends.
    void mark_kernel(Conn *c, Reason r) noexcept;

    // afresh.cpp: give_up_unused's steps. forsake_if_unused marks the
    // engine given up (under conn_lock_: attach() then refuses) when it
    // holds no connection and never attached a peer; forsake_after removes
    // its files and ends its control thread.
    bool forsake_if_unused() noexcept;
    void forsake_after() noexcept;
    std::atomic<bool> given_up_{false};
    std::atomic<bool> control_gone_{false};
    // Held by the control thread from its wake-up to its next sleep, and
    // by a fork's prepare step (park_for_fork) until the fork is done.
    RankedMutex<Rank::control> control_busy_;

    pid_t pid_ = 0;
    std::uint64_t nonce_ = 0;
    bool fabric_ok_ = false;
    std::uint32_t chunk_ = 0;
    std::uint32_t window_ = 0;
    Endpoint ep_;
    RegionLock own_region_;  // our region's lock: progress takes it
    int doorbell_ = -1;
    int ctl_fd_ = -1;
    ProcPage *page_ = nullptr;
    RxBuffer *rx_ = nullptr;

    bool can_read_ = false;
    std::atomic<bool> cma_ok_{false};  // reads by process_vm_readv (shm only)
    // Write zero-copy through the provider: the flags that make a write's
    // completion mean "the bytes are in the peer's memory" before our
    // sink_done can be seen (sink.cpp), and the bytes registered for sinks
    // now (bounded by half the soft RLIMIT_MEMLOCK).
    std::uint64_t sink_write_flags_ = 0;
    std::atomic<std::uint64_t> sink_bytes_{0};
    int rma_iov_limit_ = 1;
    std::atomic<std::uint64_t> zc_keys_{1ull << 40};  // apart from the rings' keys
    RankedMutex<Rank::progress> progress_lock_;
    // A sleeper asked for a pass that starts after its request, and found
    // progress_lock_ taken: its holder owes it (unlock_progress).
    std::atomic<bool> pass_owed_{false};
    // Held while flush_due_stages() uses connections (detach waits for it).
    RankedMutex<Rank::flush> flush_lock_;
    std::atomic<int> flush_due_count_{0};
    std::atomic<bool> flush_retry_{false};
    // Guards the connection and peer tables and upgrade state changes.
    // The order of these locks and the connections' is in lock_order.hpp.
    RankedMutex<Rank::table> conn_lock_;
    std::atomic<Conn *> conns_[kSlots] = {};
    std::uint32_t next_slot_ = 0;
    Peer peers_[1024];
    std::uint32_t npeers_ = 0;
};

}  // namespace sd::transport
