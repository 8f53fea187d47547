#include "conn_impl.hpp"
#include "wait.hpp"

#include "log.hpp"
#include "registry.hpp"
#include "renew.hpp"
#include "settings.hpp"
#include "sys.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <utility>
#include <csignal>
#include <ctime>
#include <fcntl.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace sd::transport {
namespace {

// Each thread's wake-up fd, made on its first sleep and closed at its
// exit. The fd is a plain thread-local: a fork child's handler reads it
// without constructing anything; the closer, whose destructor the thread's
// exit runs, is touched (and so registered) only when an fd is made.
struct BellCloser {
    int *fd;
    ~BellCloser() {
        if (*fd >= 0) sys.close(std::exchange(*fd, -1));
    }
};
thread_local int bell_fd = -1;
// The bell's mark (ConnStat::waker): a number no other eventfd of this
// process had, so that a peer's copy of an older eventfd of the same fd
// number is never taken for this one.
thread_local std::uint32_t bell_mark = 0;
std::atomic<std::uint32_t> bell_marks{0};
// The marks of the poller slots' eventfds (each made once in a process)
// are kSlotMarks + 1 + the slot's index; bells take those below.
constexpr std::uint32_t kSlotMarks = 0x40000000;
int bell_get() noexcept {
    if (bell_fd < 0) {
        bell_fd = out_of_the_way(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
        thread_local BellCloser closer{&bell_fd};
        (void)closer;
        if (bell_fd >= 0) bell_mark = bell_marks.fetch_add(1, std::memory_order_relaxed) % kSlotMarks + 1;
    }
    return bell_fd;
}

// This thread's bells for links to peers of other uids (announce_cross):
// the receiving ends, a few links at a time, the oldest replaced once no
// sleep has taken it for kXBellIdleNs (a thread whose sleeps watch more
// links than it has bells, a different few each time, would otherwise
// make a bell at nearly every sleep). An
// entry whose offer failed keeps rx -1 with its link, and the offer is
// made again only after a pause that doubles at each failure (10 ms up to
// 5 s), not at every sleep.
constexpr int kXBells = 4;
constexpr std::uint64_t kXBellFirstRetryNs = 10000000;
constexpr std::uint64_t kXBellLastRetryNs = 5000000000;
constexpr std::uint64_t kXBellIdleNs = 1000000000;
// The receiving ends held by all threads, within fd_budget(): a server
// with a thread per connection must not spend its fds on them.
std::atomic<int> xbells_held{0};
void xbell_close(XBell &b) noexcept {
    if (b.rx < 0) return;
    sys.close(std::exchange(b.rx, -1));
    xbells_held.fetch_sub(1, std::memory_order_relaxed);
}
struct XBellCloser {
    XBell *bells;
    ~XBellCloser() {
        for (int i = 0; i < kXBells; ++i) xbell_close(bells[i]);
    }
};
thread_local XBell xbells[kXBells];
thread_local unsigned xbell_next = 0;
std::atomic<std::uint32_t> xbell_tokens{0};

// The calling thread's bell for the link of `c` (made, and offered to
// the peer, at its first need); nullptr if none can be had. A sleep's
// bells so far (`keep`, `nkeep` of them) are never replaced (closed) to
// make room, nor is one a sleep took within kXBellIdleNs: with all of the
// thread's bells among those, a link without one gets none.
const XBell *xbell_for(Engine *e, Conn *c, const int *keep, int nkeep) noexcept {
    std::uint32_t serial = 0;
    const int xl = e->xlink_of(c, &serial);
    if (xl < 0) return nullptr;
    const auto kept = [&](const XBell &b) {
        return b.rx >= 0 && std::find(keep, keep + nkeep, b.rx) != keep + nkeep;
    };
    XBell *pick = nullptr;
    std::uint64_t backoff = 0;
    const std::uint64_t now = monotonic_ns();
    for (XBell &b : xbells) {
        if (b.link == xl && b.serial == serial) {
            if (b.rx >= 0) {
                b.used_ns = now;
                return &b;
            }
            if (now < b.retry_ns) return nullptr;
            pick = &b;  // failed before: again, in place
            backoff = b.backoff_ns;
            break;
        }
        if (!pick && b.link < 0) pick = &b;
    }
    // The oldest that the sleep does not wait on, and that no sleep took
    // for a while.
    const auto idle = [&](const XBell &b) { return b.rx < 0 || now - b.used_ns >= kXBellIdleNs; };
    for (int k = 0; !pick && k < kXBells; ++k, ++xbell_next)
        if (const XBell &b = xbells[xbell_next % kXBells]; !kept(b) && idle(b))
            pick = &xbells[xbell_next++ % kXBells];
    if (!pick) return nullptr;
    xbell_close(*pick);
    thread_local XBellCloser closer{xbells};
    (void)closer;
    backoff = backoff ? std::min(2 * backoff, kXBellLastRetryNs) : kXBellFirstRetryNs;
    *pick = XBell{xl, serial, -1, 0, now + backoff, backoff, now};
    if (xbells_held.load(std::memory_order_relaxed) >= fd_budget()) return nullptr;
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0) return nullptr;
    const int rx = out_of_the_way(pair[0]);
    const int tx = out_of_the_way(pair[1]);
    std::uint32_t token;
    while ((token = xbell_tokens.fetch_add(1, std::memory_order_relaxed) + 1) == 0) {
    }
    // The peer holds the only other copy of the sending end.
    const int rc = rx >= 0 && tx >= 0 ? e->offer_wake_bell(c, tx, token) : -EBADF;
    if (tx >= 0) sys.close(tx);
    if (rc != 0) {
        if (rx >= 0) sys.close(rx);
        return nullptr;
    }
    xbells_held.fetch_add(1, std::memory_order_relaxed);
    pick->rx = rx;
    pick->token = token;
    pick->backoff_ns = 0;
    SD_LOG(debug, "wake bell %u for link %d (peer pid %d) made and offered", token, xl,
           c->peer->pid);
    return pick;
}

// Safety net: even a lost doorbell costs at most this much.
constexpr int kSafetyMs = 200;

void drain(int fd) noexcept {
    std::uint64_t v;
    (void)sys.read(fd, &v, sizeof v);
}

}  // namespace

std::uint64_t bell_word() noexcept {
    const int fd = bell_get();
    return fd < 0 ? 0 : std::uint64_t(bell_mark) << 32 | std::uint32_t(fd);
}

bool announce_waker(Conn *c, std::uint64_t word) noexcept {
    // Only a peer of our uid in another process writes our bells (one of
    // another uid cannot take a copy of them).
    if (!word || !c->is_direct() || c->peer->cross) return false;
    std::uint64_t none = 0;
    // Before the sleeper's last look (seq_cst): a peer that posts after
    // that look sees the word (Engine::ring).
    return c->stat->waker.compare_exchange_strong(none, word, std::memory_order_seq_cst);
}

bool withdraw_waker(Conn *c, std::uint64_t word) noexcept {
    std::uint64_t v = c->stat->waker.load(std::memory_order_relaxed);
    while ((v & ~kWakeRung) == word)
        if (c->stat->waker.compare_exchange_weak(v, 0, std::memory_order_seq_cst))
            return v & kWakeRung;
    return false;
}

bool announce_cross(Engine *e, Conn *c, std::uint32_t mark, CrossWake &w, const int *bells,
                    int nbells) noexcept {
    // `peer` is published by the release store of state == direct.
    if (!c->is_direct() || !c->peer->cross) return false;
    const XBell *b = xbell_for(e, c, bells, nbells);
    // A sleep waits on kCrossBells at most: another link's connections are
    // left to the link's bell (the doorbell's part).
    if (!b || (nbells == Watch::kCrossBells &&
               std::find(bells, bells + nbells, b->rx) == bells + nbells))
        return false;
    w = CrossWake{b->link, b->serial, c->id, std::uint64_t(mark & 0x7fffffff) << 32 | b->token, b->rx};
    return e->xwaker_announce(w.xl, w.serial, w.id, w.word);
}

bool withdraw_cross(Engine *e, const CrossWake &w) noexcept {
    return e->xwaker_withdraw(w.xl, w.serial, w.id, w.word);
}


int drain_cross_bell(int rx) noexcept {
    // One byte a ring, one ring a sleep on each connection that named the
    // bell (the peer latches each connection's word): all of it, a few
    // hundred at most (the socket's send buffer), or a peer that floods its
    // own wake-ups, which gets a bounded share of our reads.
    constexpr int kBatch = 32;
    char bytes[kBatch];
    iovec iov[kBatch];
    mmsghdr msgs[kBatch] = {};
    for (int k = 0; k < kBatch; ++k) {
        iov[k] = {bytes + k, 1};
        msgs[k].msg_hdr.msg_iov = &iov[k];
        msgs[k].msg_hdr.msg_iovlen = 1;
    }
    int got = 0;
    for (int round = 0; round < 16; ++round) {
        const int r = sys.recvmmsg(rx, msgs, kBatch, MSG_DONTWAIT, nullptr);
        if (r > 0) got += r;
        if (r < kBatch) break;
    }
    return got;
}

namespace {

// This thread's sleep set: an epoll fd holding what a sleep waits on,
// each fd registered once and kept while it stays the same: the thread's
// bell (blocking recv and send, sleep_once) or its poller slot's eventfd
// (poll/select/epoll, sleep_on_fds), the engine's doorbell and its link
// bells' epoll fd, and the sleep's own (its bell for a link to a peer of
// another uid, the socket's kernel fd, the peer's pidfd, the
// application's one kernel fd of a poll or its epoll set), replaced when a
// sleep names others. One epoll_wait a sleep, where a poll of up to six
// fds (each registered and removed by the kernel every time) and the
// bell's read were two system calls.
//
// All but the application's fd are edge-triggered: a write of a bell ends
// the sleep with no drain after it (an eventfd's count only grows; a link
// bell's bytes are taken before a sleep that could fill its socket:
// sleep_track_cross); an edge that came while the thread was awake ends
// its next sleep at once (one look too many at most); and a registration
// left behind (an fd of a sleep before, its file kept open elsewhere)
// wakes it at most once an event. The application's fd is level-triggered
// and one-shot, as poll() sees it: ready when registered or armed again
// (after it reported), it reports once; its data carries a generation, so
// that a report of a registration left behind is told apart.
// Slots for link bells and for the application's fds: as many as a sleep
// on the set may have of each (more, and it polls).
constexpr int kCrossSlots = Watch::kCrossBells;
constexpr int kAppSlots = 4;
enum SleepTag : std::uint64_t {
    kTagBell,
    kTagDoorbell,
    kTagXbells,
    kTagKernel,
    kTagPidfd,
    kTagSlot,
    kTagCross,                     // ... kCrossSlots of them
    kTagApp = kTagCross + kCrossSlots,  // ... kAppSlots of them
    kTags = kTagApp + kAppSlots
};
constexpr bool is_app(std::uint64_t tag) noexcept { return tag >= kTagApp && tag < kTags; }
struct SleepSet {
    struct Slot {
        int fd = -1;
        const void *owner = nullptr;  // what the fd belongs to (nullptr: unknown)
        std::uint64_t serial = 0;     // ... and which one of its kind
        std::uint32_t events = 0;
        bool armed = true;            // an application's fd: not reported since armed
        std::uint32_t gen = 0;        // ... and its registration's generation
    };
    int ep = -1;  // -2: could not be made
    Slot slots[kTags];
    // The rings each link bell may hold since its bytes were last taken.
    unsigned cross_owed[kCrossSlots] = {};
    std::uint32_t app_gens = 0;
    // The application's fd that the kernel refused to hold (a file that
    // epoll cannot watch, a set nested too deep): its sleeps poll.
    const void *refused_owner = nullptr;
    std::uint64_t refused_serial = 0;
};
thread_local SleepSet sleep_set;

// A link bell's bytes are taken before a sleep whose rings could bring
// what it holds past this many: a connection that named the bell rings it
// once a sleep at most, and the socket holds 278 one-byte datagrams (its
// default send buffer), past which a ring finds it full and makes no edge
// (the sleeper would miss it). A sleep of more connections than that
// (they all ring at once) still finds it empty when it starts.
constexpr unsigned kCrossRoom = 128;

struct SleepSetCloser {
    ~SleepSetCloser() {
        if (sleep_set.ep >= 0) sys.close(std::exchange(sleep_set.ep, -1));
    }
};

std::atomic<std::uint64_t> watch_serials{0};

// epoll_ctl on the sleep set, as the system call itself: the set only
// watches the fds it holds, never reads or writes them. (A sanitizer's
// wrapper counts a registration as a use of the fd, and the
// application's close of a socket that a blocked recv watches, which the
// kernel allows and poll() never reported, as a race.)
int sleep_ctl(int op, int fd, epoll_event *ev) noexcept {
    return int(syscall(SYS_epoll_ctl, sleep_set.ep, op, fd, ev));
}

epoll_event sleep_event(SleepTag tag, const SleepSet::Slot &s) noexcept {
    epoll_event ev{};
    if (is_app(tag)) {
        ev.events = s.events | EPOLLONESHOT;
        ev.data.u64 = std::uint64_t(s.gen) << 32 | tag;
    } else {
        ev.events = s.events | EPOLLET;
        ev.data.u64 = tag;
    }
    return ev;
}

// Slot `tag` of the set holds nothing any more: its registration is
// deleted unless another slot holds the same number.
void sleep_untrack(SleepTag tag) noexcept {
    SleepSet::Slot &s = sleep_set.slots[tag];
    if (s.fd >= 0 && std::none_of(std::begin(sleep_set.slots), std::end(sleep_set.slots),
                                  [&](const SleepSet::Slot &o) { return &o != &s && o.fd == s.fd; }))
        (void)sleep_ctl(EPOLL_CTL_DEL, s.fd, nullptr);
    s = SleepSet::Slot{};
}

// Slot `tag` of the set holds `fd` (of `owner`, the `serial`th) with
// `events`: registered anew when any of them differs, or when the owner is
// unknown; the application's fd armed again once it reported. An fd of -1
// leaves the slot as it is. false: the kernel refused. `*fresh`: newly
// registered.
bool sleep_track(SleepTag tag, int fd, const void *owner, std::uint64_t serial,
                 std::uint32_t events, bool *fresh = nullptr) noexcept {
    SleepSet::Slot &s = sleep_set.slots[tag];
    if (fd < 0) return true;
    if (owner && s.fd == fd && s.owner == owner && s.serial == serial) {
        if (s.events == events && s.armed) return true;
        SleepSet::Slot next = s;
        next.events = events;
        next.armed = true;
        epoll_event ev = sleep_event(tag, next);
        if (sleep_ctl(EPOLL_CTL_MOD, fd, &ev) == 0) {
            s = next;
            return true;
        }
    }
    // The old number may be another slot's now (its file closed, the
    // number given again): that registration stays. (A delete by a number
    // given to a file we do not hold finds nothing; the old registration,
    // if its file lives on elsewhere, stays: edge-triggered or one-shot,
    // it wakes a sleep at most once an event.)
    sleep_untrack(tag);
    SleepSet::Slot next{fd, owner, serial, events, true, is_app(tag) ? ++sleep_set.app_gens : 0};
    epoll_event ev = sleep_event(tag, next);
    // EEXIST: the same file under the same number, left by a slot before,
    // or held by another slot now (it is this one's from here on).
    if (sleep_ctl(EPOLL_CTL_ADD, fd, &ev) != 0 &&
        (errno != EEXIST || sleep_ctl(EPOLL_CTL_MOD, fd, &ev) != 0))
        return false;
    for (SleepSet::Slot &o : sleep_set.slots)
        if (&o != &s && o.fd == fd) o = SleepSet::Slot{};
    s = next;
    if (tag >= kTagCross && tag < kTagApp) sleep_set.cross_owed[tag - kTagCross] = 0;
    if (fresh) *fresh = true;
    return true;
}

// The set made, if not yet; false: it cannot be.
bool sleep_set_made() noexcept {
    if (sleep_set.ep == -2) return false;
    if (sleep_set.ep < 0) {
        const int ep = out_of_the_way(sys.epoll_create1(EPOLL_CLOEXEC));
        if (ep < 0) {
            sleep_set.ep = -2;
            return false;
        }
        sleep_set.ep = ep;
        thread_local SleepSetCloser closer;
        (void)closer;
    }
    return true;
}

// The link bell `rx` (token `token`) in link bell slot `k` of the set,
// for a sleep that `rings` connections may ring it in. Its bytes are
// taken when it is registered and before a sleep whose rings could fill
// the socket (kCrossRoom); a wake-up reads nothing. `*rung`: bytes were
// taken, so the sleep must not wait: a ring among them may be this
// sleep's own, come after its last look (the sleep only looks again).
bool sleep_track_cross(int k, int rx, std::uint32_t token, unsigned rings, bool *rung) noexcept {
    bool fresh = false;
    if (!sleep_track(SleepTag(kTagCross + k), rx, &xbells, token, EPOLLIN, &fresh)) return false;
    unsigned &owed = sleep_set.cross_owed[k];
    if (fresh || owed + rings > kCrossRoom) {
        if (drain_cross_bell(rx) > 0) *rung = true;
        owed = 0;
    }
    owed += rings;
    return true;
}

// The tag of a report of the set's (kTags: none of this sleep's). An
// application's fd, one-shot, is disarmed by its report (its
// registration's current generation only).
SleepTag sleep_tag_of(const epoll_event &ev) noexcept {
    const auto tag = SleepTag(ev.data.u64 & 0xffffffff);
    if (tag >= kTags) return kTags;
    if (!is_app(tag)) return tag;
    SleepSet::Slot &s = sleep_set.slots[tag];
    if (s.fd < 0 || s.gen != std::uint32_t(ev.data.u64 >> 32)) return kTags;  // left behind
    s.armed = false;
    return tag;
}

// The sleep set holds what this sleep waits on; false: sleep by poll.
bool sleep_set_for(Engine *e, int bell, const CrossWake *cw, int kernel_fd, short kernel_events,
                   Conn *c, bool *rung) noexcept {
    if (!sleep_set_made()) return false;
    bool ok = sleep_track(kTagBell, bell, &bell_fd, bell_mark, EPOLLIN) &&
              sleep_track(kTagDoorbell, e->doorbell(), e, 0, EPOLLIN) &&
              sleep_track(kTagXbells, e->xbells(), e, 0, EPOLLIN);
    if (ok && cw) ok = sleep_track_cross(0, cw->rx, std::uint32_t(cw->word), 1, rung);
    if (ok && kernel_fd >= 0)
        ok = sleep_track(kTagKernel, kernel_fd, c, c ? std::uint64_t(c->id) << 32 | c->gen : 0,
                         std::uint16_t(kernel_events));
    // `peer` is published by the release store of state == direct.
    if (ok && c && c->is_direct() && c->peer->pidfd >= 0)
        ok = sleep_track(kTagPidfd, c->peer->pidfd, c->peer, c->peer->pidfd_serial, EPOLLIN);
    return ok;
}

void sleep_set_forget() noexcept {
    if (sleep_set.ep >= 0) sys.close(sleep_set.ep);
    sleep_set = SleepSet{};
}

}  // namespace

std::uint64_t next_watch_serial() noexcept {
    return watch_serials.fetch_add(1, std::memory_order_relaxed) + 1;
}

int sleep_once(Engine *e, Conn *c, int kernel_fd, short kernel_events,
               bool (*ready)(void *), void *ctx, int timeout_ms) noexcept {
    Waiter w(bell_get());
    if (w.efd < 0) return 0;  // no fd to sleep on: the caller spins
    if (c) {
        std::lock_guard lock(c->rx_lock);
        c->add_waiter(&w);
    }
    // Announce, then look once more: a peer that posts after our recheck
    // sees the count and rings the doorbell, or sees our bell in the
    // connection's slot and writes it (Engine::ring); the recheck's
    // progress reads the queues of peers of other uids too.
    const std::uint64_t word = c ? bell_word() : 0;
    const bool announced = word && announce_waker(c, word);
    CrossWake cw;
    const bool xannounced =
        c && !announced && announce_cross(e, c, std::uint32_t(w.efd) + 1, cw, nullptr, 0);
    e->announce_sleep(1);
    e->progress_before_sleep();
    int rc = 0;
    const int t = timeout_ms < 0 || timeout_ms > kSafetyMs ? kSafetyMs : timeout_ms;
    if (ready(ctx)) {
    } else if (bool rung = false;
               c && c->is_direct() &&
               sleep_set_for(e, w.efd, xannounced ? &cw : nullptr, kernel_fd, kernel_events, c, &rung)) {
        // (A connection not direct, on its way or on the kernel, polls as
        // before: its kernel socket's level, not an edge, wakes it.)
        epoll_event got[kTags];
        const int r = sys.epoll_wait(sleep_set.ep, got, int(kTags), rung ? 0 : t);
        if (r < 0 && errno == EINTR) rc = -EINTR;
        // Closed under us (a close_range of the application's): the number
        // is not ours any more, maybe another file's. Made afresh next time.
        if (r < 0 && errno != EINTR) sleep_set = SleepSet{};
        for (int i = 0; i < r; ++i) {
            switch (sleep_tag_of(got[i])) {
            case kTagDoorbell: e->take_ring(); break;
            case kTagXbells: e->take_xbells(); break;
            // (A link bell's wake-up reads nothing: sleep_track_cross.)
            default: break;
            }
        }
    } else {
        pollfd p[6];
        nfds_t n = 0;
        p[n++] = {w.efd, POLLIN, 0};
        p[n++] = {e->doorbell(), POLLIN, 0};
        p[n++] = {e->xbells(), POLLIN, 0};  // -1 (none yet): skipped
        p[n++] = {xannounced ? cw.rx : -1, POLLIN, 0};
        if (kernel_fd >= 0) p[n++] = {kernel_fd, kernel_events, 0};
        // `peer` is published by the release store of state == direct.
        if (c && c->is_direct() && c->peer->pidfd >= 0) p[n++] = {c->peer->pidfd, POLLIN, 0};
        int r = sys.poll(p, n, t);
        if (r < 0 && errno == EINTR) rc = -EINTR;
        if (r > 0) {
            if (p[0].revents & POLLIN) drain(w.efd);
            if (p[1].revents & POLLIN) e->take_ring();
            if (p[2].revents & POLLIN) e->take_xbells();
            if (p[3].revents & POLLIN) (void)drain_cross_bell(cw.rx);
        }
    }
    // The peer wrote our bell: what it posted is taken in here, whatever
    // ended the sleep (a delivery of ours would wake the connection's
    // other waiters; none may be due if the sleep was over already).
    if (announced && withdraw_waker(c, word)) e->progress_before_sleep();
    if (xannounced && withdraw_cross(e, cw)) e->progress_before_sleep();
    e->announce_sleep(-1);
    if (c) {
        std::lock_guard lock(c->rx_lock);
        c->remove_waiter(&w);
    }
    return rc;
}

namespace {

// Poller slots: a poll/select/epoll sleep takes a free slot and sleeps on
// its eventfd; the masks it registers on carry the slot's bit. A slot's
// eventfd is made by its first holder and kept until a fork child drops
// it, never closed while a waker may read it: a waker that saw a bit
// just before the sleep ended writes into an eventfd that the next holder
// drains before registering (a spurious wake-up at most), never into a
// number the application has reused.
inline constexpr int kPollerSlots = 64;
std::atomic<std::uint64_t> slots_busy{0};
std::atomic<int> slot_fds[kPollerSlots];  // fd + 1; 0: not made yet
// Slots whose eventfd was written since its last drain: a waker that
// finds the bit set has nothing to write (the sleeper's wake-up is on its
// way, and it looks at everything after its drain).
std::atomic<std::uint64_t> slots_rung{0};
// The slot of this thread's sleep, if any: its own deliveries (the last
// look before the sleep, the look after it) need not wake it.
thread_local std::uint64_t own_slot_bit = 0;

// Drains slot `i`'s eventfd, then clears its bit: a waker that saw the
// bit before the clear made its change before the sleeper's next look.
void slot_drain(int i, int fd) noexcept {
    drain(fd);
    slots_rung.fetch_and(~(std::uint64_t(1) << i), std::memory_order_seq_cst);
}

// Sleeps that cannot name what they wait on (Watch::on_everything).
PollerMask wide;
PollerMask attaching;

// Sleeps without a slot (more than kPollerSlots at once, or no eventfd):
// each delivery wakes them all, on their threads' bells.
std::atomic<int> n_pollers{0};
std::mutex pollers_lock;
WaiterList pollers;

// The doorbell's watch. A peer that posts to this process rings its one
// doorbell when a thread of it sleeps; a ring wakes every thread polling
// the eventfd, though one progress pass serves them all (its deliveries
// ring the connections' own pollers). So within poll/select/epoll waits
// (PollWait) a single thread watches the doorbell: the first to sleep
// while the watch is free, until its wait returns. The others stand by,
// asleep on their slots' bells only. The watcher, awake or asleep, is in
// its wait loop: awake it progresses on every round, asleep the doorbell
// wakes it. When its wait returns it hands the watch to a thread standing
// by (rings it), which holds it from then on; none standing by, the watch
// is free. A thread that stands by takes the watch first if it is free,
// under the same lock: a sleep never stands by without a watcher. Blocking
// recv and send (sleep_once) and sleeps outside a PollWait (or without a
// slot) always sleep on the doorbell.
std::mutex watch_lock;
bool watch_taken = false;  // under watch_lock
WaiterList standby;        // under watch_lock
thread_local int wait_depth = 0;
thread_local bool watching = false;

// The slot this thread held last: taken again when free, so that a
// thread keeps the eventfd its peers hold a copy of (Engine::ring).
thread_local int last_slot = -1;

// A free slot with its eventfd, drained; -1 if none.
int slot_take() noexcept {
    std::uint64_t busy = slots_busy.load(std::memory_order_relaxed);
    for (;;) {
        if (~busy == 0) return -1;
        const int i = last_slot >= 0 && !(busy & (std::uint64_t(1) << last_slot))
                          ? last_slot
                          : __builtin_ctzll(~busy);
        if (!slots_busy.compare_exchange_weak(busy, busy | (std::uint64_t(1) << i),
                                              std::memory_order_acquire))
            continue;
        int fd = slot_fds[i].load(std::memory_order_relaxed) - 1;
        if (fd < 0) {
            fd = out_of_the_way(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
            if (fd < 0) {
                slots_busy.fetch_and(~(std::uint64_t(1) << i), std::memory_order_release);
                return -1;
            }
            slot_fds[i].store(fd + 1, std::memory_order_release);
        } else if (slots_rung.load(std::memory_order_seq_cst) & (std::uint64_t(1) << i)) {
            slot_drain(i, fd);  // rings meant for its previous holder
        }
        last_slot = i;
        return i;
    }
}

void slot_give(int i) noexcept {
    slots_busy.fetch_and(~(std::uint64_t(1) << i), std::memory_order_release);
}

}  // namespace

Watch::~Watch() {
    (void)withdraw();
    for (std::size_t i = 0; i < n_; ++i) {
        recs_[i].m->bits.fetch_and(~bit_, std::memory_order_release);
        if (recs_[i].drop) recs_[i].drop(recs_[i].hold);
    }
    if (everything_) wide.bits.fetch_and(~bit_, std::memory_order_release);
    if (recs_ != inline_) std::free(recs_);
}

void Watch::on(PollerMask &m, void (*drop)(void *), void *hold) noexcept {
    if (!bit_ || everything_) {
        if (drop) drop(hold);
        return;
    }
    if (n_ == cap_) {
        const std::size_t cap = cap_ * 2;
        Rec *r = static_cast<Rec *>(std::malloc(cap * sizeof(Rec)));
        if (!r) {
            if (drop) drop(hold);
            return on_everything();
        }
        std::copy(recs_, recs_ + n_, r);
        if (recs_ != inline_) std::free(recs_);
        recs_ = r;
        cap_ = cap;
    }
    recs_[n_++] = {&m, drop, hold, nullptr, false, false, -1, 0, 0};
    // Before the sleeper's last look (sleep_on_fds): a waker that changes
    // the state after that look sees the bit.
    m.bits.fetch_or(bit_, std::memory_order_seq_cst);
}

void Watch::on(Conn *c, void (*drop)(void *), void *hold) noexcept {
    const std::size_t n = n_;
    on(pollers_of(c), drop, hold);
    if (n_ > n) recs_[n].c = c;
}

bool Watch::announce(std::uint64_t word) noexcept {
    bool any = false, cross = false;
    Engine *e = Engine::current();
    for (std::size_t i = 0; i < n_; ++i) {
        Rec &r = recs_[i];
        if (!r.c) continue;
        if ((r.announced = announce_waker(r.c, word))) {
            any = true;
            continue;
        }
        CrossWake w;
        if (!e || !announce_cross(e, r.c, std::uint32_t(word >> 32), w, xrx_, nxrx_)) continue;
        r.xannounced = true;
        r.xl = w.xl;
        r.serial = w.serial;
        r.xword = w.word;
        cross = true;
        int k = 0;
        while (k < nxrx_ && xrx_[k] != w.rx) ++k;
        if (k < nxrx_) {
            ++xcnt_[k];
        } else if (nxrx_ < kCrossBells) {
            xtok_[nxrx_] = std::uint32_t(w.word);
            xcnt_[nxrx_] = 1;
            xrx_[nxrx_++] = w.rx;
        }
    }
    if (any) word_ = word;
    return any || cross;
}

bool Watch::withdraw() noexcept {
    bool rung = false;
    if (nxrx_) {
        Engine *e = Engine::current();
        for (std::size_t i = 0; i < n_; ++i)
            if (recs_[i].xannounced) {
                Rec &r = recs_[i];
                r.xannounced = false;
                if (e && withdraw_cross(e, CrossWake{r.xl, r.serial, r.c->id, r.xword, -1})) rung = true;
            }
        nxrx_ = 0;
    }
    if (!word_) return rung;
    for (std::size_t i = 0; i < n_; ++i)
        if (recs_[i].announced) {
            recs_[i].announced = false;
            if (withdraw_waker(recs_[i].c, word_)) rung = true;
        }
    word_ = 0;
    return rung;
}

void Watch::on_everything() noexcept {
    if (!bit_ || everything_) return;
    everything_ = true;
    wide.bits.fetch_or(bit_, std::memory_order_seq_cst);
}

namespace {

// The poller slot a waker's mark names (marks past kSlotMarks), as the bit
// of its slot; 0 for a mark of any other waiter.
std::uint64_t slot_bit_of(std::uint32_t mark) noexcept {
    return mark > kSlotMarks ? std::uint64_t(1) << ((mark - kSlotMarks - 1) % kPollerSlots) : 0;
}

}  // namespace

namespace {

// The sleeper a waker word names (its latch left out): a slot's bit, or a
// bell (of our uid: the eventfd's number in the word's low half; across
// uids: the mark, which is that number + 1).
RungWaker waker_of(std::uint64_t word, bool cross) noexcept {
    const std::uint32_t mark = std::uint32_t(word >> 32) & 0x7fffffff;
    if (const std::uint64_t bit = slot_bit_of(mark)) return {-1, bit};
    return {cross ? int(mark) - 1 : int(std::uint32_t(word)), 0};
}

}  // namespace

RungWaker latch_waker(std::atomic<std::uint64_t> &slot, bool cross) noexcept {
    static_assert(kWakeRung == kXWakeRung);
    std::uint64_t v = slot.load(std::memory_order_seq_cst);
    for (int tries = 0; v && tries < 4; ++tries) {
        if (v & kWakeRung) return waker_of(v, cross);
        // Our own sleep (this delivery is its last look before it sleeps,
        // or the look after it): a latch would keep the peer from waking
        // it for a later message.
        const RungWaker w = waker_of(v, cross);
        if (w.slot_bit ? w.slot_bit == own_slot_bit : w.bell == bell_fd) return {-1, 0};
        if (slot.compare_exchange_strong(v, v | kWakeRung, std::memory_order_seq_cst)) return {-1, 0};
    }
    return {-1, 0};
}

void wake_pollers(const PollerMask &m, std::uint64_t skip) noexcept {
    // The state change the caller made is ordered before these loads; the
    // sleeper's registration before its last look (both seq_cst).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    std::uint64_t bits =
        (m.bits.load(std::memory_order_acquire) | wide.bits.load(std::memory_order_acquire)) &
        ~own_slot_bit & ~skip;
    if (bits) bits &= ~slots_rung.fetch_or(bits, std::memory_order_seq_cst);
    const std::uint64_t one = 1;
    while (bits) {
        const int i = __builtin_ctzll(bits);
        bits &= bits - 1;
        if (int fd = slot_fds[i].load(std::memory_order_acquire) - 1; fd >= 0)
            (void)sys.write(fd, &one, sizeof one), make_way();
    }
    if (n_pollers.load(std::memory_order_seq_cst) == 0) return;
    std::lock_guard lock(pollers_lock);
    for (Waiter &w : pollers) (void)sys.write(w.efd, &one, sizeof one);
}

PollWait::PollWait() noexcept { ++wait_depth; }

PollWait::~PollWait() {
    if (--wait_depth > 0 || !watching) return;
    watching = false;
    std::lock_guard lock(watch_lock);
    if (standby.empty()) {
        watch_taken = false;
        return;
    }
    Waiter &next = standby.front();
    standby.pop_front();
    next.handed = true;
    const std::uint64_t one = 1;
    (void)sys.write(next.efd, &one, sizeof one);
}

PollerMask &attach_pollers() noexcept { return attaching; }

SD_CHILD_PATH void pollers_after_fork_child() noexcept {
    // Only the forking thread lives on; it is in no sleep. (renew.hpp:
    // what is as new already is not written.)
    renew(slots_busy, 0);
    renew(slots_rung, 0);
    renew(own_slot_bit, 0);
    renew(last_slot, -1);
    for (auto &f : slot_fds)
        if (int fd = f.load(std::memory_order_relaxed) - 1; fd >= 0) {
            f.store(0, std::memory_order_relaxed);
            sys.close(fd);
        }
    renew(wide.bits, 0);
    renew(attaching.bits, 0);
    renew(n_pollers, 0);
    renew(pollers_lock);
    if (!pollers.empty()) new (&pollers) WaiterList();
    renew(watch_lock);
    if (!standby.empty()) new (&standby) WaiterList();
    renew(watch_taken, false);
    renew(watching, false);
    // This thread's bell is the parent thread's eventfd too, and its
    // sleep set the parent thread's epoll instance.
    if (bell_fd >= 0) sys.close(std::exchange(bell_fd, -1));
    sleep_set_forget();
    renew(bell_mark, 0);
    // And its bells for links are the parent's (the links are not ours).
    for (XBell &b : xbells)
        if (b.link >= 0) {
            if (b.rx >= 0) sys.close(b.rx);
            b = XBell{};
        }
    renew(xbells_held, 0);
}

int thread_bell() noexcept { return bell_get(); }

int own_bell() noexcept { return bell_fd; }

namespace {

// The application's kernel fds of a sleep on the set, each once (an fd
// that a poll names twice is registered with the events of both): the
// number, what it is, the events, and the set's slot it is in.
struct AppFds {
    int n = 0;
    int fd[kAppSlots];
    const void *owner[kAppSlots];
    std::uint64_t serial[kAppSlots];
    std::uint32_t events[kAppSlots];
    int slot[kAppSlots];
};

// The sleep set holds what a poll/select/epoll sleep waits on: its poller
// slot's eventfd, the doorbell and the link bells' epoll fd (unless it
// stands by), its bells for links to peers of other uids, and the
// application's kernel fds (kAppSlots at most, each known by `in.owner`),
// each kept in the slot that holds it already. false: sleep by poll.
// `*rung`: as sleep_track_cross.
bool sleep_set_for_fds(Engine *e, int slot, int efd, bool standing_by, const Watch &watch,
                       const pollfd *fds, nfds_t n, const Interest &in, AppFds &app,
                       bool *rung) noexcept {
    if (watch.n_cross_bells() > kCrossSlots) return false;
    app.n = 0;
    for (nfds_t i = 0; i < n; ++i) {
        if (fds[i].fd < 0) continue;
        int j = 0;
        while (j < app.n && app.fd[j] != fds[i].fd) ++j;
        if (j < app.n) {
            app.events[j] |= std::uint16_t(fds[i].events);
            continue;
        }
        if (app.n == kAppSlots || !in.owner) return false;
        std::uint64_t serial = 0;
        const void *o = in.owner(in.ctx, i, &serial);
        if (!o || (o == sleep_set.refused_owner && serial == sleep_set.refused_serial)) return false;
        app.fd[app.n] = fds[i].fd;
        app.owner[app.n] = o;
        app.serial[app.n] = serial;
        app.events[app.n] = std::uint16_t(fds[i].events);
        app.slot[app.n] = -1;
        ++app.n;
    }
    if (!sleep_set_made()) return false;
    // Standing by, a doorbell left in the set by a watch before stays
    // until it rings (sleep_on_fds).
    bool ok = sleep_track(kTagSlot, efd, &slot_fds[slot], std::uint64_t(slot), EPOLLIN) &&
              (standing_by || (sleep_track(kTagDoorbell, e->doorbell(), e, 0, EPOLLIN) &&
                               sleep_track(kTagXbells, e->xbells(), e, 0, EPOLLIN)));
    for (int k = 0; ok && k < watch.n_cross_bells(); ++k)
        ok = sleep_track_cross(k, watch.cross_bells()[k], watch.cross_token(k), watch.cross_rings(k),
                               rung);
    if (!ok) return false;
    // Each fd in the slot that holds it already; the others in free ones.
    bool used[kAppSlots] = {};
    for (int j = 0; j < app.n; ++j)
        for (int k = 0; k < kAppSlots; ++k) {
            const SleepSet::Slot &o = sleep_set.slots[kTagApp + k];
            if (!used[k] && o.fd == app.fd[j] && o.owner == app.owner[j] && o.serial == app.serial[j]) {
                app.slot[j] = k;
                used[k] = true;
                break;
            }
        }
    for (int j = 0; j < app.n; ++j) {
        if (app.slot[j] < 0) {
            int k = 0;
            while (used[k]) ++k;
            app.slot[j] = k;
            used[k] = true;
        }
        if (!sleep_track(SleepTag(kTagApp + app.slot[j]), app.fd[j], app.owner[j], app.serial[j],
                         app.events[j])) {
            // Not for epoll (a file it cannot watch, sets nested too
            // deep): this one's sleeps poll.
            sleep_set.refused_owner = app.owner[j];
            sleep_set.refused_serial = app.serial[j];
            return false;
        }
    }
    return true;
}

}  // namespace

int sleep_on_fds(Engine *e, pollfd *fds, nfds_t n, const sigset_t *mask, int timeout_ms,
                 const Interest &in, bool *polled) noexcept {
    const int slot = in.enlist ? slot_take() : -1;
    Waiter w(slot >= 0 ? slot_fds[slot].load(std::memory_order_relaxed) - 1 : bell_get());
    if (polled) *polled = false;
    if (w.efd < 0) {
        const int r = sys.poll(fds, n, 0);
        if (polled) *polled = r >= 0;
        return r;
    }
    own_slot_bit = slot >= 0 ? std::uint64_t(1) << slot : 0;
    if (slot < 0) {
        {
            std::lock_guard lock(pollers_lock);
            pollers.push_front(w);
        }
        n_pollers.fetch_add(1, std::memory_order_seq_cst);
    }
    // Standing by: asleep without the doorbell, while another thread
    // watches it.
    bool standing_by = false;
    if (slot >= 0 && wait_depth > 0) {
        std::lock_guard lock(watch_lock);
        if (!watching && !watch_taken) watch_taken = watching = true;
        if (!watching) {
            w.handed = false;
            standby.push_front(w);
            standing_by = true;
        }
    }
    int rc = 0;
    {
        Watch watch(slot);
        if (slot >= 0) in.enlist(in.ctx, watch);
        // The slot's eventfd, announced on the direct connections enlisted:
        // their peers write it themselves (Engine::ring).
        const bool direct =
            slot >= 0 && watch.announce(std::uint64_t(kSlotMarks + 1 + slot) << 32 | std::uint32_t(w.efd));
        std::atomic_thread_fence(std::memory_order_seq_cst);
        e->announce_sleep(1);
        e->progress_before_sleep();
        AppFds app;
        bool rung = false;
        if (in.ready(in.ctx)) {
            for (nfds_t i = 0; i < n; ++i) fds[i].revents = 0;
        } else if (slot >= 0 &&
                   sleep_set_for_fds(e, slot, w.efd, standing_by, watch, fds, n, in, app, &rung)) {
            int t = timeout_ms < 0 || timeout_ms > kSafetyMs ? kSafetyMs : timeout_ms;
            // Accepted bytes wait for credits: look again soon.
            if (e->flush_pending() && t > 1) t = 1;
            epoll_event got[kTags];
            const int r = sys.epoll_pwait(sleep_set.ep, got, int(kTags), rung ? 0 : t, mask);
            for (nfds_t i = 0; i < n; ++i) fds[i].revents = 0;
            if (r < 0 && errno != EINTR) {
                // Closed under us (a close_range of the application's): the
                // number is not ours any more. Made afresh next time; this
                // sleep ends as a spurious wake-up.
                sleep_set = SleepSet{};
            } else if (r < 0) {
                rc = -EINTR;
            } else {
                if (polled) *polled = true;
                for (int i = 0; i < r; ++i) {
                    const SleepTag tag = sleep_tag_of(got[i]);
                    if (tag == kTagSlot) {
                        // No drain (edge-triggered): the bit alone says a
                        // waker need not write it again.
                        slots_rung.fetch_and(~(std::uint64_t(1) << slot), std::memory_order_seq_cst);
                    } else if (tag == kTagDoorbell || tag == kTagXbells) {
                        if (tag == kTagDoorbell) e->take_ring();
                        else e->take_xbells();
                        // Another thread watches: a ring need not wake this one.
                        if (standing_by) sleep_untrack(kTagDoorbell), sleep_untrack(kTagXbells);
                    } else if (is_app(tag)) {
                        int j = 0;
                        while (j < app.n && app.slot[j] != int(tag - kTagApp)) ++j;
                        // Every entry of that fd, as poll() fills them in.
                        for (nfds_t x = 0; j < app.n && x < n; ++x) {
                            pollfd &f = fds[x];
                            if (f.fd != app.fd[j]) continue;
                            f.revents = short(got[i].events & (std::uint32_t(f.events) | POLLERR | POLLHUP));
                            if (f.revents) ++rc;
                        }
                    }
                }
            }
        } else {
            // The caller's fds first, so their revents land in place.
            constexpr nfds_t kInline = 64;
            const nfds_t nx = nfds_t(watch.n_cross_bells());
            pollfd inline_fds[kInline + 3 + Watch::kCrossBells];
            pollfd *all = n <= kInline ? inline_fds
                                       : static_cast<pollfd *>(std::malloc((n + 3 + nx) * sizeof(pollfd)));
            if (!all) {
                rc = -ENOMEM;
            } else {
                std::copy(fds, fds + n, all);
                all[n] = {w.efd, POLLIN, 0};
                all[n + 1] = {standing_by ? -1 : e->doorbell(), POLLIN, 0};
                // The bells of peers of other uids: the doorbell's part
                // for them (-1: none).
                all[n + 2] = {standing_by ? -1 : e->xbells(), POLLIN, 0};
                // This thread's bells for links to peers of other uids.
                for (nfds_t k = 0; k < nx; ++k) all[n + 3 + k] = {watch.cross_bells()[k], POLLIN, 0};
                int t = timeout_ms < 0 || timeout_ms > kSafetyMs ? kSafetyMs : timeout_ms;
                // Accepted bytes wait for credits: look again soon.
                if (e->flush_pending() && t > 1) t = 1;
                timespec ts{t / 1000, long(t % 1000) * 1000000};
                int r = sys.ppoll(all, n + 3 + nx, &ts, mask);
                if (polled) *polled = r >= 0;
                if (r < 0) {
                    rc = -errno;
                } else {
                    if (all[n].revents & POLLIN) {
                        if (slot >= 0) slot_drain(slot, w.efd);
                        else drain(w.efd);
                        --r;
                    }
                    if (!standing_by && (all[n + 1].revents & POLLIN)) e->take_ring(), --r;
                    if (!standing_by && (all[n + 2].revents & POLLIN)) e->take_xbells(), --r;
                    for (nfds_t k = 0; k < nx; ++k)
                        if (all[n + 3 + k].revents & POLLIN) drain_cross_bell(all[n + 3 + k].fd), --r;
                    for (nfds_t i = 0; i < n; ++i) fds[i].revents = all[i].revents;
                    rc = r;
                }
                if (all != inline_fds) std::free(all);
            }
        }
        // A peer wrote the slot's eventfd: what it posted is taken in here
        // (its deliveries wake whoever waits on it), whatever ended the
        // sleep.
        if (direct && watch.withdraw()) e->progress_before_sleep();
        e->announce_sleep(-1);
    }
    if (standing_by) {
        std::lock_guard lock(watch_lock);
        if (w.handed) watching = true;  // taken off the list by the hander
        else unlink_waiter(standby, w);
    }
    own_slot_bit = 0;
    if (slot >= 0) {
        slot_give(slot);
    } else {
        n_pollers.fetch_sub(1, std::memory_order_relaxed);
        std::lock_guard lock(pollers_lock);
        unlink_waiter(pollers, w);
    }
    return rc;
}

bool restart_after_signal() noexcept {
    for (int sig = 1; sig < NSIG; ++sig) {
        // Fault signals come from the faulting instruction, never in the
        // middle of a sleep: their handlers (a sanitizer's, a runtime's)
        // say nothing about the signal that woke us.
        if (sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGTRAP ||
            sig == SIGSYS)
            continue;
        struct sigaction sa;
        if (sigaction(sig, nullptr, &sa) != 0) continue;
        if (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN) continue;
        if (!(sa.sa_flags & SA_RESTART)) return false;
    }
    return true;
}

namespace {

inline constexpr int kMaxSpinSlots = 64;
inline constexpr std::uint64_t kStaleSpinNs = 50'000'000;

struct SpinTable {
    std::atomic<std::uint64_t> *slots = nullptr;  // nullptr: no gate
    int count = 0;
};

// The registry's spin file, mapped at `at` (MAP_FIXED) or anywhere.
void *map_spin_file(void *at) noexcept {
    char path[300];
    std::snprintf(path, sizeof path, "%s/spin", settings().registry);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return MAP_FAILED;
    const std::size_t size = kMaxSpinSlots * sizeof(std::uint64_t);
    void *m = ftruncate(fd, off_t(size)) == 0
                  ? mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED | (at ? MAP_FIXED : 0), fd, 0)
                  : MAP_FAILED;
    sys.close(fd);
    return m;
}

std::atomic<bool> spin_mapped{false};

SpinTable map_spin_table() noexcept {
    SpinTable t;
    void *m = map_spin_file(nullptr);
    if (m == MAP_FAILED) return t;
    spin_mapped.store(true, std::memory_order_release);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    t.slots = static_cast<std::atomic<std::uint64_t> *>(m);
    t.count = int(std::clamp<long>(cpus, 1, kMaxSpinSlots));
    return t;
}

const SpinTable &spin_table() noexcept {
    static const SpinTable table = map_spin_table();
    return table;
}

}  // namespace

void spin_table_detach() noexcept {
    const SpinTable &t = spin_table();
    if (t.slots)
        (void)mmap(static_cast<void *>(t.slots), kMaxSpinSlots * sizeof(std::uint64_t),
                   PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
}

void spin_table_reattach() noexcept {
    // Never mapped: the first wait maps the new registry's file.
    if (!spin_mapped.load(std::memory_order_acquire)) return;
    const SpinTable &t = spin_table();
    // Our registry as the new uid (what the engine's build makes anyway);
    // without it the map stays private.
    if (t.slots && claim_registry(settings().registry) == 0 &&
        map_spin_file(static_cast<void *>(t.slots)) == MAP_FAILED)
        SD_LOG(info, "spin file of %s not mapped: %s", settings().registry, std::strerror(errno));
}

namespace {

// This thread's record of its spins: failures in a row, and how many
// waits still go without spinning.
struct SpinHistory {
    unsigned fails = 0;
    unsigned skip = 0;
    std::uint64_t rest_until = 0;  // no spin before (SpinSlot::preempted)
    long involuntary = -1;         // involuntary switches at the last jump (-1: none seen)
};
thread_local SpinHistory spin_history;

inline constexpr unsigned kMaxSpinSkip = 64;

// The slot this thread's spin holds, if any (make_way leaves it alone).
thread_local std::atomic<std::uint64_t> *own_spin = nullptr;

}  // namespace

std::uint64_t SpinSlot::start(std::uint64_t now, std::uint64_t ns) noexcept {
    if (held_ || !ns) return now + ns;
    const SpinTable &t = spin_table();
    if (!t.slots) return now + ns;
    if (spin_history.skip) {
        --spin_history.skip;
        return now;
    }
    if (now < spin_history.rest_until) return now;
    const int cpu = sched_getcpu();
    std::atomic<std::uint64_t> &slot = t.slots[cpu < 0 ? 0 : cpu % t.count];
    std::uint64_t v = slot.load(std::memory_order_relaxed);
    const std::uint64_t stamp = now & ~kWanted;
    if ((v == 0 || now - v > kStaleSpinNs) &&
        slot.compare_exchange_strong(v, stamp, std::memory_order_acq_rel)) {
        held_ = &slot;
        stamp_ = stamp;
        own_spin = &slot;
        return now + ns;
    }
    // Held by a live spinner: it ends its spin for us.
    if (v && now - v <= kStaleSpinNs && !(v & kWanted))
        slot.fetch_or(kWanted, std::memory_order_relaxed);
    return now;
}

void make_way() noexcept {
    // Never the first to map the table: a process that never spun has
    // nothing of it to read.
    if (!spin_mapped.load(std::memory_order_relaxed)) return;
    const SpinTable &t = spin_table();
    for (int i = 0; i < t.count; ++i) {
        std::atomic<std::uint64_t> &slot = t.slots[i];
        const std::uint64_t v = slot.load(std::memory_order_relaxed);
        if (v && !(v & SpinSlot::kWanted) && &slot != own_spin)
            slot.fetch_or(SpinSlot::kWanted, std::memory_order_relaxed);
    }
}

bool SpinSlot::preempted(std::uint64_t now) noexcept {
    SpinHistory &h = spin_history;
    rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) == 0) {
        const long before = std::exchange(h.involuntary, ru.ru_nivcsw);
        if (before == ru.ru_nivcsw) return false;
    }
    h.rest_until = now + kSpinRestNs;
    return true;
}

void SpinSlot::drop(bool satisfied) noexcept {
    if (!held_) return;
    std::uint64_t mine = stamp_;
    if (!held_->compare_exchange_strong(mine, 0, std::memory_order_acq_rel) &&
        mine == (stamp_ | kWanted))
        held_->compare_exchange_strong(mine, 0, std::memory_order_acq_rel);
    held_ = nullptr;
    own_spin = nullptr;
    SpinHistory &h = spin_history;
    if (satisfied) {
        h.fails = 0;
    } else if (++h.fails >= 2) {
        h.skip = std::min(1u << std::min(h.fails - 2, 6u), kMaxSpinSkip);
    }
}

}  // namespace sd::transport
