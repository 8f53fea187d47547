// Blocking without burning the machine: a waiter polls the
// fabric for SDIRECT_SPIN_US, then sleeps in the kernel on the companion
// socket, its own eventfd (rung by deliveries to its connection, or for
// poll/select/epoll to any connection or epoll set of its interest set)
// and the process doorbell (rung by peers that post to a process with
// sleepers; within poll/select/epoll, one watcher at a time sleeps on it).
// Waits that no bell announces look and nap in wait_until.
#pragma once
#include "clock.hpp"
#include "engine.hpp"

#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <poll.h>

namespace sd::transport {

// Waiting for a condition that no bell announces (a state another thread
// or process changes, a lock held elsewhere, a full queue): look, and
// between looks spin or nap. One loop for every such wait, shaped by its
// Pace; a wait that can sleep on the doorbell (recv, send's credits,
// poll) uses wait_on_bell, or sleep_on_fds, below instead.
struct Pace {
    // The nap between rounds, in ns (0: none, the wait spins). A nap is
    // one nanosleep, cut short by a signal (the next look comes sooner).
    long nap_ns = 0;
    // Failed looks per round (a power of two): a round runs the wait's
    // hook, checks the deadline and the bound, then naps.
    unsigned every = 1;
    // The nap once more than `late_ns` have passed since the first failed
    // look (0: nap_ns throughout).
    long late_nap_ns = 0;
    std::uint64_t late_ns = 0;
    // At most this many naps (0: no bound but the deadline).
    unsigned max_naps = 0;

    long nap_after(std::uint64_t elapsed_ns) const noexcept {
        return late_nap_ns && elapsed_ns > late_ns ? late_nap_ns : nap_ns;
    }
};

enum class Waited {
    ready,      // a look found what the wait waits for
    timed_out,  // the deadline passed, or the last of max_naps naps
    stopped,    // the round's hook ended the wait
};

inline void nap(long ns) noexcept {
    if (ns <= 0) return;
    timespec ts{time_t(ns / 1000000000), ns % 1000000000};
    nanosleep(&ts, nullptr);
}

// Until `look()` is true: looks, and after every `p.every` failed looks
// runs `round(start, now)` (start: the clock at the first failed look;
// false ends the wait), checks `deadline_ns` (0: none) and the bound, and
// naps. A first look that succeeds costs nothing more: no clock read, no
// system call. Inline, with the look and the hook inlined too: the send
// path's wait for room in a peer's queue is one of these.
template <typename Look, typename Round>
inline Waited wait_until(const Pace &p, std::uint64_t deadline_ns, Look &&look,
                         Round &&round) noexcept {
    if (look()) return Waited::ready;
    const std::uint64_t start = monotonic_ns();
    unsigned naps = 0;
    for (unsigned failed = 1;; ++failed) {
        if ((failed & (p.every - 1)) == 0) {
            const std::uint64_t now = monotonic_ns();
            if (!round(start, now)) return Waited::stopped;
            if (deadline_ns && now >= deadline_ns) return Waited::timed_out;
            if (p.max_naps && naps == p.max_naps) return Waited::timed_out;
            nap(p.nap_after(now - start));
            ++naps;
        }
        if (look()) return Waited::ready;
    }
}

// As above, with nothing to do between looks but nap.
template <typename Look>
inline Waited wait_until(const Pace &p, std::uint64_t deadline_ns, Look &&look) noexcept {
    return wait_until(p, deadline_ns, look, [](std::uint64_t, std::uint64_t) { return true; });
}

// One sleep: registers the calling thread on `c`, announces it in the
// process page, rechecks `ready` (after a last progress), then sleeps until
// an event, `timeout_ms` (-1 = the safety net only) or a signal. The caller
// re-evaluates its condition afterwards. 0, or -EINTR.
int sleep_once(Engine *e, Conn *c, int kernel_fd, short kernel_events,
               bool (*ready)(void *), void *ctx, int timeout_ms) noexcept;

// One poll/select/epoll sleep's registrations: the caller's enlist puts
// the sleep on the mask of each connection and epoll set its interest set
// holds, or on everything where it cannot name them. Unregistered (and
// the holds dropped) when the sleep ends.
class Watch {
  public:
    explicit Watch(int slot) noexcept : bit_(slot < 0 ? 0 : std::uint64_t(1) << slot) {}
    ~Watch();
    Watch(const Watch &) = delete;
    Watch &operator=(const Watch &) = delete;
    // Wakes on what rings `m`. `drop(hold)` runs after the sleep, once
    // `m` is unregistered: the caller keeps `m` alive with `hold` (null:
    // it lives longer than the sleep anyway).
    void on(PollerMask &m, void (*drop)(void *) = nullptr, void *hold = nullptr) noexcept;
    // Wakes on what rings connection `c` (its pollers), and, once
    // announce() made it so, on its peer's direct wake-ups.
    void on(Conn *c, void (*drop)(void *) = nullptr, void *hold = nullptr) noexcept;
    // Wakes on every ring (a socket with no connection yet).
    void on_everything() noexcept;
    // Announces `word`, the eventfd the sleep polls (ConnStat::waker), on
    // each connection registered with on(Conn *) that has none announced:
    // its peer may write that eventfd itself; on those whose peer is of
    // another uid, this thread's bell for that link (cross_bells()).
    // True if any took either.
    bool announce(std::uint64_t word) noexcept;
    // Ends the announcements: true when a peer wrote the eventfd meanwhile
    // (the caller then takes in what is queued). Also at destruction.
    bool withdraw() noexcept;

    // The receiving ends of this thread's bells that announce() put in
    // the words of connections to peers of other uids (one per link):
    // the sleep waits on them too (a poll reads a bell that rang; the
    // sleep set reads one before a sleep that could fill it).
    const int *cross_bells() const noexcept { return xrx_; }
    int n_cross_bells() const noexcept { return nxrx_; }
    // The token of cross_bells()[k] (its bell among this thread's).
    std::uint32_t cross_token(int k) const noexcept { return xtok_[k]; }
    // How many connections announced cross_bells()[k]: the rings it may
    // get in this sleep (each connection's word is latched).
    unsigned cross_rings(int k) const noexcept { return xcnt_[k]; }
    // At most this many (the links of one sleep's first few connections).
    static constexpr int kCrossBells = 4;

  private:
    struct Rec {
        PollerMask *m;
        void (*drop)(void *);
        void *hold;
        Conn *c;         // the connection whose pollers `m` are, if any
        bool announced;  // word_ is in its slot
        bool xannounced;  // this thread's bell for its link is in its word
        int xl;
        std::uint32_t serial;
        std::uint64_t xword;
    };
    static constexpr std::size_t kInline = 16;
    std::uint64_t bit_;  // 0: on the process-wide list, which every ring wakes
    bool everything_ = false;
    std::uint64_t word_ = 0;  // the word announced (0: none)
    int xrx_[kCrossBells];
    std::uint32_t xtok_[kCrossBells];
    unsigned xcnt_[kCrossBells];
    int nxrx_ = 0;
    Rec inline_[kInline];
    Rec *recs_ = inline_;
    std::size_t n_ = 0, cap_ = kInline;
};

// What a poll/select/epoll sleep waits for: `ready` is rechecked after
// the sleep is registered (no lost wake-up); `enlist` registers it (null:
// woken by every ring).
struct Interest {
    bool (*ready)(void *ctx);
    void (*enlist)(void *ctx, Watch &w);
    void *ctx;
    // What the sleep's kernel fd `i` is (a socket of ours, an epoll set of
    // the application's), and which one of its kind (`*serial`: with the
    // owner, a pair no other ever had): the thread's sleep set then keeps
    // it registered from one sleep to the next. Null, or nullptr returned:
    // unknown (the sleep polls).
    const void *(*owner)(void *ctx, std::size_t i, std::uint64_t *serial) = nullptr;
};

// poll/select/epoll_wait over direct sockets: sleeps in the kernel on
// `fds` (the application's kernel fds and companions, revents filled in)
// plus the doorbell and the bell of a poller slot, which a delivery rings
// when the sleep is registered on its connection (`in.enlist`). `mask`: as
// for ppoll (nullptr: none). The kernel poll's result (>= 0), or -errno
// (-EINTR). `*polled` (if given): the kernel was asked about `fds` (the
// sleep happened; not when `in.ready` found something first).
int sleep_on_fds(Engine *e, pollfd *fds, nfds_t n, const sigset_t *mask, int timeout_ms,
                 const Interest &in, bool *polled = nullptr) noexcept;
// One poll/select/epoll wait, from its first look to its return. Within
// it, the first of its sleeps to find the doorbell's watch free takes it
// and keeps it until the wait returns: only that thread sleeps on the
// process doorbell, whose ring would otherwise wake every sleeper; the
// others stand by on their own bells (wait.cpp).
class PollWait {
  public:
    PollWait() noexcept;
    ~PollWait();
    PollWait(const PollWait &) = delete;
    PollWait &operator=(const PollWait &) = delete;
};

// The sleeps watching a socket of ours that has no connection yet: rung
// when one gets its connection (the sleep then watches that).
PollerMask &attach_pollers() noexcept;

// Wakes the sleeps registered on `m`, and those that wait on everything,
// but for the poller slots of `skip`.
void wake_pollers(const PollerMask &m, std::uint64_t skip = 0) noexcept;
// In a fork child: the parent's sleeps are not ours, and the slots'
// eventfds are shared with the parent (a wake-up of ours could be drained
// there): they go, and are made afresh when needed.
void pollers_after_fork_child() noexcept;
// The calling thread's bell (an eventfd, non-blocking), made at its first
// use; -1 if none could be made. A wait may sleep on it and drain it.
int thread_bell() noexcept;
// The calling thread's bell if made, else -1 (never makes one).
int own_bell() noexcept;
// A number no earlier call returned in this process: names an fd that a
// blocking sleep keeps registered (a peer's pidfd), so that a later fd of
// the same number is not taken for it.
std::uint64_t next_watch_serial() noexcept;

// Direct wake-ups. A thread that sleeps on a direct connection announces
// the eventfd it sleeps on (its bell in sleep_once, its poller slot's in
// sleep_on_fds) in the connection's slot of our process page
// (ConnStat::waker) before its last look, and withdraws it when the sleep
// ends. A peer of our uid that posts to the connection then writes that
// eventfd, through its own copy of it (pidfd_getfd, Engine::ring),
// instead of our process doorbell: only the thread that waits wakes,
// once, where the doorbell woke its watcher, which woke the thread. The
// woken thread takes in what is queued, and its deliveries wake the other
// waiters of the connections they reach (Conn::wake_locked) as any
// delivery does. One thread at a time per connection (the first to
// announce); the others rely on the doorbell as before, which is watched
// as before. announce_waker: true if `word` went into the slot of `c`.
// withdraw_waker: ends it; true when the peer wrote the eventfd meanwhile
// (kWakeRung): the caller then takes in what is queued (the write may
// have come after its sleep).
// The word of the calling thread's bell (0: it has none).
std::uint64_t bell_word() noexcept;
// A delivery to a connection whose word (`slot`: ConnStat::waker, or
// across uids the word in the link's queue, `cross`) announces a sleeper:
// what the delivery need not wake (RungWaker, conn_impl.hpp), the sleeper
// whose latch (kWakeRung) is set already: the peer wrote its eventfd, or
// another delivery of ours wakes it. Otherwise the delivery sets the
// latch itself (the peer's post then writes nothing: the sleeper takes
// its message in when it withdraws the word) and wakes the sleeper the
// usual way, so that one message wakes a sleeper once, not from both
// ends: a thread of a busy client that takes in its neighbours' answers
// (mysqlslap's eight) found two wake-ups for most of them. Never the
// calling thread's own sleep (its last look, or the one after it): that
// latch would keep the peer from waking it for a later message.
RungWaker latch_waker(std::atomic<std::uint64_t> &slot, bool cross) noexcept;
bool announce_waker(Conn *c, std::uint64_t word) noexcept;
bool withdraw_waker(Conn *c, std::uint64_t word) noexcept;

// Direct wake-ups across users. A peer of another uid cannot be given our
// eventfds (whoever holds one can make our writes to it block, or drain
// it), nor see our process page. So a thread that sleeps on a connection
// to such a peer has a bell of its own for that link: a local datagram
// socket pair, whose sending end went to the peer over the link's bell
// (SCM_RIGHTS, with a token; the peer checks it is such a socket and
// keeps at most 16 a link), and puts the token in the connection's word
// of the queue that peer writes to us (xqueue.hpp's wakers) before its
// last look. The peer that posts to the connection latches the word and
// sends one byte on that bell (MSG_DONTWAIT: it never waits), and only
// that thread wakes, where the link's bell woke the watcher, which woke
// the thread. Withdrawn when the sleep ends: true when the peer rang
// meanwhile (the caller then takes in what is queued). A few links per
// thread (4, the oldest replaced, never one that the sleep waits on
// already nor one a sleep took within the last second); a sleep over
// connections to more links than that announces on the links with bells
// (`bells`: the sleep's bells so far), and the others' peers ring the
// link's bell as before.
// The word: the token (bits 0-31), what the sleep polls (bits 32-62: a
// poller slot's mark, as in ConnStat::waker, or the bell's fd + 1), and
// the latch (bit 63, latch_waker). A peer can forge the word only for
// its own connections.
struct CrossWake {
    int xl = -1;
    std::uint32_t serial = 0, id = 0;
    std::uint64_t word = 0;
    int rx = -1;
};
bool announce_cross(Engine *e, Conn *c, std::uint32_t mark, CrossWake &w, const int *bells,
                    int nbells) noexcept;
bool withdraw_cross(Engine *e, const CrossWake &w) noexcept;
// Takes what the peers sent on a bell, all of it (a flood: at most 512):
// how many rings (0: none, or an error).
int drain_cross_bell(int rx) noexcept;

// Spinning pays only while a CPU is free for it and the answer comes
// within the spin. So a waiter spins only while it holds the spin slot of
// the CPU it runs on (the registry file "spin", shared by every process of
// this user; a slot is a claim time, one older than 50 ms belongs to a
// waiter that died): on a host with more waiters than CPUs (8 pgbench
// clients and their 8 servers on 2 CPUs) at most one waiter per CPU burns
// it, and a lone process on its CPU always may; a waiter that finds the
// slot held marks it wanted, and the holder ends its spin at its next
// clock read (more of our waiters than CPUs: its spin would keep runnable
// work of ours off the CPU). And a thread whose spins
// keep ending in a sleep stops spinning for a while (1, 2, 4 ... 64 waits
// after the second failure in a row, probing between), so a waiter whose
// peer shares its CPU does not spin away the time that peer needs. A spin
// fails when release() is called (the waiter goes to sleep), succeeds
// when the slot is dropped with the wait over. Without the file, everyone
// spins.
// The process no longer shares the spin file (it changed its privileges):
// its map becomes private memory in place, so a waiter of ours that looks
// at it meanwhile finds zeros, and the file's owner is left alone.
void spin_table_detach() noexcept;
// The process changed its ids before any use of the fabric (afresh.cpp):
// a spin file it had mapped (now private zeros) is mapped again, in
// place, from the registry of its new ids.
void spin_table_reattach() noexcept;

class SpinSlot {
  public:
    SpinSlot() = default;
    SpinSlot(const SpinSlot &) = delete;
    SpinSlot &operator=(const SpinSlot &) = delete;
    ~SpinSlot() { drop(true); }
    // The end of a spin of `ns` starting at `now`: now + ns with the slot
    // (kept until release), `now` (no spin) when the slot is taken or this
    // thread's spins have been failing.
    std::uint64_t start(std::uint64_t now, std::uint64_t ns) noexcept;
    // The spin is over without what it waited for: the caller sleeps.
    void release() noexcept { drop(false); }
    // Another waiter of ours found this CPU's slot held since we took it:
    // more of our waiters than CPUs, and our spin would take the CPU from
    // work that is runnable. The spin ends; the caller sleeps.
    bool wanted() const noexcept {
        return held_ && (held_->load(std::memory_order_relaxed) & kWanted);
    }
    static constexpr std::uint64_t kWanted = 1;
    // The spin's clock jumped at `now`. If this thread was switched out
    // against its will since the last such jump (getrusage's involuntary
    // context switches), another thread wanted this CPU and was kept
    // waiting by us until the scheduler stepped in: the spin ends (true)
    // and this thread's waits do not spin for a while (kSpinRestNs).
    // Otherwise the time went elsewhere, with nothing of this system
    // waiting for the CPU (a virtual CPU the host ran something else on,
    // an interrupt): the spin goes on (false). On this 2-CPU VM such jumps
    // came hundreds of times a second, and resting at each kept a pinned
    // 64-byte ping-pong on sleeps and wake-ups 80% of the time (mean
    // round trip 5.7-6.2 us, p50 1.65).
    bool preempted(std::uint64_t now) noexcept;
    // A gap between two of a spin's clock reads (kClockMisses looks apart,
    // a few µs) longer than this was the scheduler's.
    static constexpr std::uint64_t kPreemptedNs = 20'000;
    static constexpr std::uint64_t kSpinRestNs = 5'000'000;

  private:
    void drop(bool satisfied) noexcept;
    std::atomic<std::uint64_t> *held_ = nullptr;
    std::uint64_t stamp_ = 0;
};

// A sleeping thread of ours was just woken (its bell, a doorbell, a
// poller's eventfd written): the spins under way in this registry end, so
// that it finds a CPU rather than waiting behind spinners. A spin pays
// when a CPU is free for it; when threads outnumber CPUs it only delays
// the thread whose work it waits for.
void make_way() noexcept;

// After EINTR from our own sleep: would the kernel have restarted the
// call? True when every installed handler has SA_RESTART.
bool restart_after_signal() noexcept;

// A wait that a doorbell announces (recv, send's credits and its read
// zero-copy answer, a sink's claim, a leave's answers): after a failed
// look it spins while its SpinSlot lets it, then sleeps once on the
// connection's bell (sleep_once: its eventfd, the process doorbell, and a
// kernel fd if it names one), and looks again. A look says one of these,
// or what the wait returns
// (far below any -errno or byte count).
//   kWaitOn     nothing yet: spin or sleep
//   kLookAgain  it changed something: look again at once
//   kMoved      it made headway: look again at once, the spin starts afresh
inline constexpr long kWaitOn = -0x7fff'ffff'0000'0000;
inline constexpr long kLookAgain = kWaitOn + 1;
inline constexpr long kMoved = kWaitOn + 2;

// What wait_on_bell asks of its waiter. A wait derives from this and
// hides what it does otherwise (the calls are resolved statically, on
// the derived type):
//   long look()                  required: kWaitOn, kLookAgain, kMoved or the result
//   long timed_out()             at deadline_ns (0: none): the result, or kLookAgain
//   long missed(now)             after the deadline's check: kWaitOn, kLookAgain,
//                                kMoved or the result (a recv tries its sink)
//   bool may_spin(), void spinning()
//                                spin now?; the next look is a spin's
//   bool quick_looks()           its first misses may be looked at again at once,
//                                before the spin and without the clock (a small
//                                answer on its way usually comes within them)
//   long before_sleep()          the spin is over: kWaitOn to sleep, or the result
//   int sleep(now)               one sleep: 0 or -EINTR
//   long interrupted()           a signal cut the sleep short: kWaitOn (go on), or the result
struct BellWaiter {
    Engine *e = nullptr;
    Conn *c = nullptr;
    // Rechecked by the sleep once it is registered (no lost wake-up).
    bool (*ready)(void *) = nullptr;
    void *ctx = nullptr;
    int kfd = -1;  // a kernel fd the sleep watches too (-1: none)
    short kevents = 0;
    std::uint64_t spin_ns = 0;      // the spin after the first failed look (SpinSlot)
    std::uint64_t deadline_ns = 0;  // SO_RCVTIMEO/SO_SNDTIMEO's (0: none)
    // The socket's timeout: a signal ends the wait with -EINTR unless the
    // kernel would restart the call (no timeout, every handler SA_RESTART).
    std::int64_t timeout_ns = 0;

    long timed_out() noexcept { return -EAGAIN; }
    long missed(std::uint64_t) noexcept { return kWaitOn; }
    bool may_spin() const noexcept { return true; }
    void spinning() noexcept {}
    bool quick_looks() const noexcept { return false; }
    long before_sleep() noexcept { return kWaitOn; }
    int sleep(std::uint64_t) noexcept {
        return sleep_once(e, c, kfd, kevents, ready, ctx, ms_left(deadline_ns));
    }
    long interrupted() noexcept {
        // A socket with a timeout always reports EINTR, as the kernel does.
        return timeout_ns == 0 && restart_after_signal() ? kWaitOn : -EINTR;
    }

    // Whole milliseconds (rounded up) until `deadline` (0: -1, none).
    static int ms_left(std::uint64_t deadline) noexcept {
        if (!deadline) return -1;
        const std::uint64_t now = monotonic_ns();
        return now >= deadline ? 0 : int((deadline - now + 999999) / 1000000);
    }
};

// Misses per read of the clock while a doorbell wait spins; as many quick
// looks (BellWaiter::quick_looks) before its spin starts.
inline constexpr unsigned kClockMisses = 16;

// The doorbell wait's one loop: look; on a miss read the clock, start the
// spin (once per stretch without headway), check the deadline, the
// waiter's own miss, spin or release the slot and sleep, and handle a
// signal. A first look that succeeds costs nothing more (no clock read):
// a recv whose bytes are there takes this way; nor do the quick looks of
// a waiter that allows them. While it spins the clock is read once per
// kClockMisses misses (it was a tenth of a 64-byte ping-pong's samples),
// and at the miss after a sleep.
template <typename W>
inline long wait_on_bell(W &w, SpinSlot &slot) noexcept {
    std::uint64_t spin_until = 0, now = 0;
    std::uint64_t last_read = 0;  // the spin's previous clock read (0: none yet)
    bool spin_started = false;
    unsigned misses = 0;
    for (;;) {
        long r = w.look();
        if (r == kMoved) {
            spin_started = false;
            misses = 0;
            last_read = 0;
            continue;
        }
        if (r == kLookAgain) continue;
        if (r != kWaitOn) return r;
        ++misses;
        if (!spin_started && misses < kClockMisses && w.spin_ns && w.quick_looks()) {
            w.spinning();
            continue;
        }
        if (!spin_started || misses % kClockMisses == 0) {
            now = monotonic_ns();
            // Descheduled while it spun: stop taking the CPU from others.
            if (spin_started && last_read && now < spin_until + SpinSlot::kPreemptedNs &&
                now - last_read > SpinSlot::kPreemptedNs) {
                if (slot.preempted(now)) spin_until = now;
            }
            last_read = now;
        }
        if (!spin_started) {
            spin_until = slot.start(now, w.spin_ns);
            spin_started = true;
        }
        if (w.deadline_ns && now >= w.deadline_ns) {
            if ((r = w.timed_out()) != kLookAgain) return r;
            continue;
        }
        if ((r = w.missed(now)) != kWaitOn) {
            if (r == kMoved) spin_started = false, last_read = 0;
            else if (r != kLookAgain) return r;
            continue;
        }
        if (now < spin_until && misses % kClockMisses == 0 && slot.wanted()) spin_until = now;
        if (now < spin_until && w.may_spin()) {
            w.spinning();
            continue;
        }
        slot.release();
        if ((r = w.before_sleep()) != kWaitOn) return r;
        now = monotonic_ns();
        if (w.sleep(now) == -EINTR && (r = w.interrupted()) != kWaitOn) return r;
        misses = kClockMisses - 1;  // the miss after a sleep reads the clock
        last_read = 0;
    }
}

}  // namespace sd::transport
