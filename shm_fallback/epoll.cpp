// epoll over sockets whose bytes may travel on the fabric (readiness.hpp):
// the sets' shadows of our sockets, epoll_ctl, epoll_wait, and the sets
// after fork.
#include "readiness.hpp"
#include "readiness_impl.hpp"

#include "kernel_sleep.hpp"
#include "table.hpp"
#include "transport/lock_order.hpp"
#include "transport/renew.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <mutex>
#include <new>
#include <sys/mman.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>
#include <vector>

namespace sd::fallback {

using transport::Conn;
using namespace detail;

// ---- epoll shadows ----------------------------------------------------------------

namespace {

constexpr std::uint64_t kTag = 0x5d1eull << 48;
constexpr std::uint64_t kTagMask = 0xffffull << 48;

struct Entry {
    int fd = -1;
    // The next entry of the set with the same fd number (its slot + 1; 0:
    // none): EpollSet::by_fd's chain.
    std::uint32_t next_fd = 0;
    Stream *s = nullptr;       // a socket of ours (reference held) ...
    EpollSet *inner = nullptr; // ... or an epoll set inside this one (reference held)
    epoll_event ev{};          // as the application registered it
    bool trimmed = false;      // kernel registration is the death hint only
    bool armed = true;         // EPOLLONESHOT has not fired, nor is it parked
    // Deleted by the application while trimmed: the kernel keeps the hint
    // registration, so that adding the socket again (as event loops do
    // between a write and a read) makes no system call. Absent to the
    // application in every other way.
    bool parked = false;
    // EPOLLET: the counts and events at the last report (none yet: fresh).
    bool fresh = true;
    std::uint32_t seen_rx = 0, seen_tx = 0, seen_bits = 0;
    // A direct socket this entry had nothing to report for: while nothing
    // has happened to it since, it has nothing still, and a look need not
    // ask its connection (a set of many idle direct sockets: each look
    // took every connection's receive lock). With its readiness mark
    // linked to the connection it was quiet on (`linked`: the mark of its
    // slot in the set, transport::mark_link), nothing has happened while
    // the mark is not set, and a look passes it by without reading
    // anything of it (it is off the set's `active` list until the mark is
    // set); without one, while what it had then (Quiet) is all unchanged.
    bool quiet = false;
    bool linked = false;
    // The connection the entry's mark was last linked to (null: none).
    const Conn *mark_conn = nullptr;
    // On the set's `active` list (kept when the slot is freed, until the
    // list drops it).
    bool active = false;
    // Off the list with the kernel's registration the application's own
    // (not trimmed): counted in EpollSet::kernel_rests.
    bool kernel_rest = false;
    // The look (EpollSet::looks) whose settle() found it still quiet: the
    // same look's scan takes that answer.
    std::uint32_t quiet_look = 0;
    struct Quiet {
        const Conn *c = nullptr;
        std::uint32_t rx = 0, tx = 0, touched = 0;
        transport::ConnState state{};
        bool operator==(const Quiet &) const = default;
    } was;
};

// What an entry's socket is now, as Entry::Quiet remembers it; false if
// it has no connection or the connection is not direct.
bool quiet_key(const Entry &e, Entry::Quiet &q) noexcept {
    Conn *c = e.s->conn.load(std::memory_order_acquire);
    if (!c) return false;
    q.c = c;
    q.state = transport::quiet_marks(c, q.rx, q.tx);
    if (q.state != transport::ConnState::direct) return false;
    q.touched = e.s->touched.load(std::memory_order_acquire);
    return true;
}

// The entry found its socket quiet, and nothing has happened to it since:
// linked, its mark was not set (the set's marks were taken before the
// look: a set one ended the quiet), or, without a mark, what it
// remembered is as it was.
bool still_quiet(const Entry &e) noexcept {
    if (!e.quiet) return false;
    if (e.linked) return true;
    Entry::Quiet now;
    return quiet_key(e, now) && now == e.was;
}

// A slot of a set's `entries` that holds an entry (not a freed one).
bool live(const Entry &e) noexcept { return e.s || e.inner; }

}  // namespace

namespace detail {

struct EpollSet {
    std::atomic<int> refs{1};
    int epfd = -1;
    // A number no other set of this process had (a sleep keeps the
    // kernel's set registered under it: transport::Interest).
    const std::uint64_t serial = transport::next_watch_serial();
    transport::RankedMutex<transport::Rank::epoll> lock;
    // Under `lock`. An entry keeps its slot for life (its mark is the
    // slot's): a freed slot is reused by the next entry (`holes`).
    std::vector<Entry> entries;
    std::vector<std::uint32_t> holes;
    // Under `lock`. The entries by fd number: the slot + 1 of the newest
    // entry of each fd (0: none), the others chained through
    // Entry::next_fd (a socket closed while another fd held it keeps its
    // entry, and the number may name another socket by then).
    std::vector<std::uint32_t> by_fd;
    std::size_t live_n = 0;   // entries
    // Entries off the active list whose sockets the kernel reports
    // (Entry::kernel_rest): while there are any, the kernel holds
    // registrations of the application's (`all_trimmed` is false).
    std::size_t kernel_rests = 0;
    std::size_t shown_n = 0;  // entries not parked
    // The slots a look looks at: every entry but those quiet and linked
    // (whose marks add them back when set), and perhaps freed slots and
    // entries quiet since (the next scan drops them).
    std::vector<std::uint32_t> active;
    // The slots of the last few entries a scan reported: a sleep watches
    // their connections even when quiet (their peers then wake the
    // sleeping thread directly, not through the set's mask).
    static constexpr std::size_t kLately = 4;
    std::uint32_t lately[kLately] = {};
    std::size_t lately_next = 0;
    // Whether `entries` holds any: set under `lock` at each change, read
    // without it (a wait's first look).
    std::atomic<bool> any{false};
    std::size_t cursor = 0;  // fairness when maxevents is small (in `active`)
    // Looks at the entries (under `lock`): settle() starts one, which the
    // scan after it shares (Entry::quiet_look); a scan without a settle()
    // before it, and any other look, starts its own. `closes`: last_closes
    // when closed sockets' entries last went.
    std::uint32_t looks = 1;
    std::uint64_t closes = 0;
    std::atomic<unsigned> turn{0};  // odd: the kernel's events go first
    // The kernel's last answer for the set had nothing for the
    // application (none, or only our own companions' death hints): a
    // wait's first look then leaves the kernel out if our entries have
    // nothing either (its sleep's poll asks it).
    std::atomic<bool> kernel_quiet{false};
    // Registrations the application made through us of fds that are not
    // ours (a listener, a pipe), less those it deleted: 0, and every entry
    // of ours trimmed (`all_trimmed`, as the last scan found), means the
    // kernel holds nothing of the application's in the set, only our hints.
    // (A registration whose fd was closed stays counted: the kernel is
    // asked as before.)
    std::atomic<int> foreign{0};
    std::atomic<bool> all_trimmed{false};
    // Sleeping in the kernel's epoll_wait (kernel_sleep.hpp): at most one
    // thread at a time (`kernel_sleeper`, under `lock`), which owns `held`
    // (the streams whose asks it holds back) until it clears the flag.
    // `wake_fd`: an eventfd registered in the set with `wake_data`, made
    // at the first such sleep (-2: could not be); `signalled`: written
    // since the sleeper last drained it. `tagged`: the kernel's events of
    // the set may hold wake-ups, ours or (after fork) another process's.
    std::atomic<int> wake_fd{-1};
    std::atomic<std::uint64_t> wake_data{0};
    std::atomic<bool> signalled{false};
    std::atomic<bool> tagged{false};
    // Sleeps (sleep_on_fds) on this set, directly or through a set or a
    // poll that holds it: epoll_ctl wakes them, and so does the first
    // setting of an entry's mark (the group's mask, in memory never freed:
    // transport::mark_alloc).
    const std::uint32_t group = transport::group_alloc();
    transport::PollerMask &pollers = transport::group_pollers(group);
    // When every entry is looked at afresh, quiet or not: what changed
    // without setting a mark is found by then.
    std::uint64_t full_at = 0;
    bool kernel_sleeper = false;
    std::vector<Stream *> held;
    // Threads in the kernel's epoll_wait on the set while it had no
    // shadow (plain_wait): a shadow added meanwhile (epoll_ctl, or a plain
    // registration that became one) writes `wake_fd` to end their sleep.
    std::atomic<int> plain_sleepers{0};
    ~EpollSet() {
        if (wake_fd >= 0) sys.close(wake_fd);
        transport::group_free(group);
    }
};

}  // namespace detail

namespace {

std::atomic<EpollSet *> *sets = nullptr;
int nsets = 0;

std::atomic<int> live_sets{0};
// One past the highest epoll fd ever given a set: a fork child's pass over
// the sets stops there.
std::atomic<int> sets_used{0};

void note_set(int fd) noexcept {
    int seen = sets_used.load(std::memory_order_relaxed);
    while (seen <= fd && !sets_used.compare_exchange_weak(seen, fd + 1, std::memory_order_release)) {
    }
}

// The mark of the entry in slot `i` (0: none).
std::uint32_t mark_at(const EpollSet *set, std::size_t i) noexcept {
    return transport::mark_of(set->group, std::uint32_t(i));
}

// The connection of the entry in slot `i` forgets its mark (it lives
// while the socket holds it, and the entry holds the socket).
void unlink_mark(EpollSet *set, std::size_t i) noexcept {
    Entry &e = set->entries[i];
    if (e.s && e.mark_conn && e.s->conn.load(std::memory_order_acquire) == e.mark_conn)
        transport::mark_unlink(const_cast<Conn *>(e.mark_conn), mark_at(set, i));
    e.mark_conn = nullptr;
    e.linked = false;
    e.quiet = false;
}

// Drops the references of the entry in slot `i`.
void entry_drop(EpollSet *set, std::size_t i) noexcept {
    unlink_mark(set, i);
    Entry &e = set->entries[i];
    if (e.s) release(e.s);
    if (e.inner) set_release(e.inner);
    e.s = nullptr;
    e.inner = nullptr;
}

// `any` after an entry was added, removed, parked or unparked (set->lock held).
void note_any(EpollSet *set) noexcept { set->any.store(set->shown_n > 0, std::memory_order_release); }

// Puts slot `i` on the set's active list (set->lock held).
void activate(EpollSet *set, std::size_t i) noexcept {
    Entry &e = set->entries[i];
    if (e.active) return;
    e.active = true;
    if (e.kernel_rest) {
        e.kernel_rest = false;
        --set->kernel_rests;
    }
    set->active.push_back(std::uint32_t(i));
}

// Adds `e` to the set (set->lock held), in a freed slot if there is one.
void add_entry(EpollSet *set, const Entry &e) noexcept {
    std::size_t i;
    if (!set->holes.empty()) {
        i = set->holes.back();
        set->holes.pop_back();
        const bool active = set->entries[i].active;
        set->entries[i] = e;
        set->entries[i].active = active;
    } else {
        i = set->entries.size();
        set->entries.push_back(e);
    }
    const auto fd = std::size_t(e.fd);
    if (fd >= set->by_fd.size()) set->by_fd.resize(fd + 1, 0);
    set->entries[i].next_fd = set->by_fd[fd];
    set->by_fd[fd] = std::uint32_t(i + 1);
    ++set->live_n;
    if (!e.parked) ++set->shown_n;
    note_any(set);
    activate(set, i);
}

// Removes the entry in slot `i` (set->lock held).
void remove_entry(EpollSet *set, std::size_t i) noexcept {
    entry_drop(set, i);
    Entry &e = set->entries[i];
    std::uint32_t *link = &set->by_fd[std::size_t(e.fd)];
    while (*link != i + 1) link = &set->entries[*link - 1].next_fd;
    *link = e.next_fd;
    if (!e.parked) --set->shown_n;
    if (e.kernel_rest) --set->kernel_rests;
    const bool active = e.active;
    e = Entry{};
    e.active = active;
    --set->live_n;
    set->holes.push_back(std::uint32_t(i));
    note_any(set);
}

constexpr std::size_t kNoSlot = ~std::size_t(0);

// The slot of the entry registered through fd number `fd` that `match`
// accepts, or kNoSlot (set->lock held).
template <typename Match>
std::size_t find_entry(const EpollSet *set, int fd, Match match) noexcept {
    const auto at = std::size_t(fd);
    for (std::uint32_t j = fd >= 0 && at < set->by_fd.size() ? set->by_fd[at] : 0; j;
         j = set->entries[j - 1].next_fd)
        if (match(set->entries[j - 1])) return j - 1;
    return kNoSlot;
}

// Links the mark of the entry in slot `i` to its socket's connection,
// before the caller reads the socket's state: the connection linked, or
// null (none, no mark, or the socket's entry in another set has it).
const Conn *link_mark(EpollSet *set, std::size_t i) noexcept {
    Entry &e = set->entries[i];
    Conn *c = e.s->conn.load(std::memory_order_acquire);
    const std::uint32_t m = mark_at(set, i);
    if (!c || !m || !transport::mark_link(c, m)) return nullptr;
    e.mark_conn = c;
    return c;
}

// The marks set since the last time: their entries go on the active list
// and are quiet no more (set->lock held).
void gather(EpollSet *set) noexcept {
    transport::marks_take(
        set->group,
        [](void *ctx, std::uint32_t i) {
            auto *set = static_cast<EpollSet *>(ctx);
            if (i >= set->entries.size() || !live(set->entries[i])) return;
            set->entries[i].quiet = false;
            activate(set, i);
        },
        set);
}

// At most this many parked entries in a set; a delete beyond them goes to
// the kernel.
constexpr int kMaxParked = 16;

// Every entry of a set is looked at afresh this often, quiet or not: a
// change that set no mark (none is known; a sleep's safety net is as
// long) is found within it.
constexpr std::uint64_t kFullLookNs = 200'000'000;


// A shadow was just added to the set (`any` stored): a thread asleep in
// the kernel's epoll_wait on it since before (plain_wait) looks again. Its
// count and `any` are read each after the other's store (fences), so
// either it saw the shadow or we see it.
void wake_plain_sleepers(EpollSet *set) noexcept {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (set->plain_sleepers.load(std::memory_order_relaxed) == 0) return;
    if (const int w = set->wake_fd.load(std::memory_order_acquire); w >= 0)
        kernel_sleep_signal(w, &set->signalled);
}

// Sets are only ever looked up by the thread calling into the set, with a
// reference taken under the table slot's value; a racing close may free
// the set only after our reference is dropped. A leaf of the lock order: a
// set it replaces is released after it (its last reference drops the
// set's sockets, whose detach takes the engine's locks).
transport::RankedMutex<transport::Rank::leaf> sets_lock;

// `fd` refers to `s` right now.
bool fd_is(int fd, Stream *s) noexcept {
    Stream *now = acquire(fd);
    if (now) release(now);
    return now == s;
}

// The kernel registration of a socket that answers from our state: only
// its peer's end (EPOLLRDHUP, edge) with our tag.
epoll_event hint_of(Stream *s) noexcept {
    epoll_event kev{};
    kev.events = EPOLLRDHUP | EPOLLET;
    kev.data.u64 = kTag | reinterpret_cast<std::uintptr_t>(s);
    return kev;
}

// The entry's kernel registration becomes the hint (hint_of).
bool trim(EpollSet *set, Entry &e) noexcept {
    // The registered fd was closed while a dup keeps the file (and the
    // kernel's registration) alive: nobody can change that registration
    // any more; our state reports, as it would after a trim.
    if (!fd_is(e.fd, e.s)) {
        e.trimmed = true;
        return true;
    }
    epoll_event kev = hint_of(e.s);
    if (e.ev.events & EPOLLEXCLUSIVE) {
        // The kernel refuses MOD on exclusive entries (and EPOLLRDHUP with
        // EPOLLEXCLUSIVE): register the hint afresh. The application's
        // later MODs are refused by us, as the kernel would.
        if (sys.epoll_ctl(set->epfd, EPOLL_CTL_DEL, e.fd, nullptr) != 0) return false;
        if (sys.epoll_ctl(set->epfd, EPOLL_CTL_ADD, e.fd, &kev) != 0) return false;
    } else if (sys.epoll_ctl(set->epfd, EPOLL_CTL_MOD, e.fd, &kev) != 0) {
        return false;
    }
    e.trimmed = true;
    return true;
}

// A socket our state answered goes back to the kernel (it left the
// fabric): the application's own registration again.
void untrim(EpollSet *set, Entry &e) noexcept {
    if (!fd_is(e.fd, e.s)) return;  // nobody can change it any more
    epoll_event kev = e.ev;
    if (e.ev.events & EPOLLEXCLUSIVE) {
        if (sys.epoll_ctl(set->epfd, EPOLL_CTL_DEL, e.fd, nullptr) != 0 ||
            sys.epoll_ctl(set->epfd, EPOLL_CTL_ADD, e.fd, &kev) != 0)
            return;
    } else if (sys.epoll_ctl(set->epfd, EPOLL_CTL_MOD, e.fd, &kev) != 0) {
        return;
    }
    e.trimmed = false;
}

// The entry in slot `i`, whose kernel registration is the application's
// own (not trimmed), leaves the set for a plain registration of its
// socket when the socket is on the kernel for good: no look or sleep pays
// for it again (a server's connections from peers without the library,
// or beyond its connection table). Set->lock held; true when done.
bool to_plain(EpollSet *set, std::size_t i) noexcept {
    Entry &e = set->entries[i];
    Stream *s = e.s;
    if (e.trimmed || e.parked || !s || !fd_is(e.fd, s)) return false;
    {
        std::lock_guard lock(s->pend_lock);
        const int n = s->plain_n.load(std::memory_order_relaxed);
        if (n == Stream::kPlainRegs || !s->kernel_for_good_locked()) return false;
        s->plain[n] = {set->epfd, e.fd, set->serial, e.ev};
        s->plain_n.store(n + 1, std::memory_order_relaxed);
        set->foreign.fetch_add(1, std::memory_order_relaxed);
    }
    remove_entry(set, i);  // its reference goes, not under pend_lock
    return true;
}

// The connection's readiness is its kernel socket's, whatever else
// happens to it, until its state moves (transport::Conn::move sets its
// mark): published and waiting for an upgrade, or asking for one. (A
// final one's holders may take the socket over with a connection of
// their own, whose changes set no mark of this one's.)
bool kernel_reports(const Conn *c) noexcept {
    const transport::ConnState st = transport::state_of(c);
    return st == transport::ConnState::kernel || st == transport::ConnState::initiating;
}

// Whether something came since the entry's last report that would wake an
// edge-triggered watcher of TCP with its events: bytes arriving wake the
// watchers of input only, space coming back after there was none (or a
// send that may try again) or the socket turning writable those of
// output only, and a change of state (the peer's end, a reset, an error)
// every watcher.
bool edge_news(const Entry &e, std::uint32_t rx, std::uint32_t tx, std::uint32_t all) noexcept {
    constexpr std::uint32_t kInput = EPOLLIN | EPOLLRDNORM | EPOLLRDBAND | EPOLLPRI;
    constexpr std::uint32_t kOutput = EPOLLOUT | EPOLLWRNORM | EPOLLWRBAND;
    constexpr std::uint32_t kState = EPOLLRDHUP | EPOLLHUP | EPOLLERR;
    if (rx != e.seen_rx && (e.ev.events & kInput)) return true;
    if (tx != e.seen_tx && (e.ev.events & kOutput)) return true;
    const std::uint32_t turned = all & ~e.seen_bits;
    return (turned & kState) || ((turned & EPOLLOUT) && (e.ev.events & kOutput));
}

// The entry had nothing to report for its direct socket, as `key` says.
void rest(Entry &e, const Entry::Quiet &key, const Conn *linked) noexcept {
    e.quiet = true;
    e.was = key;
    e.linked = linked == key.c;
}

// EPOLLONESHOT fired for the entry in slot `i`: nothing is reported
// until EPOLL_CTL_MOD, and the calls on its socket meanwhile (from the
// thread it was handed to) set no mark that would wake the set's sleeps.
void disarm(EpollSet *set, std::size_t i) noexcept {
    set->entries[i].armed = false;
    unlink_mark(set, i);
}

// The events of one entry now, as epoll_wait would report them, or 0.
// `commit`: the report happens (EPOLLET and EPOLLONESHOT state advance).
std::uint32_t entry_events(EpollSet *set, std::size_t i, bool commit, int depth) noexcept {
    Entry &e = set->entries[i];
    if (!e.armed || !live(e)) return 0;
    if (e.inner) {
        // An epoll fd is readable when one of its events is pending.
        if (!(e.ev.events & EPOLLIN) || !inner_ready(e.inner, depth + 1)) return 0;
        return EPOLLIN;
    }
    if (e.quiet && e.quiet_look == set->looks) return 0;  // this look's settle() saw it
    if (still_quiet(e)) return 0;
    e.quiet = false;
    // The mark linked, then the key read, before the look: a change after
    // the link sets the mark, one after the key changes the key.
    const Conn *linked = link_mark(set, i);
    Entry::Quiet key;
    const bool keyed = quiet_key(e, key);
    short bits = 0, ask = 0;
    if (!user_view(e.s, bits, ask)) {
        if (commit && e.trimmed) untrim(set, e);
        if (commit && to_plain(set, i)) return 0;
        // Bytes of the peer left to the holders at a fork come first, and
        // the kernel socket knows nothing of them.
        if (has_prefix(e.s)) {
            if (!(e.ev.events & EPOLLIN)) return 0;
            if (commit && (e.ev.events & EPOLLONESHOT)) disarm(set, i);
            return EPOLLIN;
        }
        // The kernel reports it, and goes on doing so until its
        // connection's state moves (its upgrade, asked by the peer or by
        // us), which sets the mark linked above: it rests until then, as
        // a quiet direct one does (a server's connections from peers that
        // never ask: no look or sleep walks them).
        if (linked && !e.trimmed && kernel_reports(linked)) {
            e.quiet = true;
            e.linked = true;
        }
        return 0;
    }
    // A report trims the kernel's registration first (or the kernel would
    // report too); a mere look (nested sets, peeks) needs no trim.
    if (commit && !e.trimmed && !trim(set, e)) return 0;
    const std::uint32_t want = (e.ev.events & (EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLPRI |
                                               EPOLLRDNORM | EPOLLWRNORM)) |
                               EPOLLERR | EPOLLHUP;
    const std::uint32_t all = std::uint16_t(bits);
    std::uint32_t ev = all & want;
    // Nothing for it (a trimmed entry: the kernel reports nothing for it
    // either): remembered, when the socket is direct.
    const bool quiet = keyed && e.trimmed;
    if (!ev) {
        if (quiet) rest(e, key, linked);
        return 0;
    }
    if (e.ev.events & EPOLLET) {
        Conn *c = e.s->conn.load(std::memory_order_acquire);
        std::uint32_t rx, tx;
        transport::arrivals(c, rx, tx);
        if (!e.fresh && !edge_news(e, rx, tx, all)) {
            if (quiet) rest(e, key, linked);
            return 0;
        }
        if (commit) {
            e.fresh = false;
            e.seen_rx = rx;
            e.seen_tx = tx;
            e.seen_bits = all;
        }
    }
    if (commit && (e.ev.events & EPOLLONESHOT)) disarm(set, i);
    return ev;
}

// A wait's look begins (set->lock held): its number, and, when `clock`
// and the full look that is due every kFullLookNs has come, every entry
// on the active list again (the looks that may read the clock ask the
// kernel: a wait's first, and those after a sleep or 20 us of spin).
std::uint32_t start_look(EpollSet *set, bool clock) noexcept {
    const std::uint32_t look = ++set->looks;
    if (const std::uint64_t now = clock ? monotonic_ns() : 0; clock && now >= set->full_at) {
        set->full_at = now + kFullLookNs;
        for (std::size_t i = 0; i < set->entries.size(); ++i)
            if (live(set->entries[i])) {
                set->entries[i].quiet = false;
                activate(set, i);
            }
    }
    return look;
}

// Starts a look and trims the kernel's registration of every socket our
// state answers now, before the kernel is asked: its own socket (idle,
// always writable) would report for it otherwise. Needed only where the
// kernel is asked before the scan: a scan trims (and untrims) every entry
// it looks at, and one that asks the kernel after it has looked at all.
void settle(EpollSet *set, bool clock) noexcept {
    std::lock_guard lock(set->lock);
    const std::uint32_t look = start_look(set, clock);
    gather(set);
    for (const std::uint32_t i : set->active) {
        Entry &e = set->entries[i];
        short bits = 0, ask = 0;
        if (!e.s || !e.armed) continue;
        // Quiet and trimmed, and nothing happened to it since: so it is
        // for this look's scan too.
        if (still_quiet(e)) {
            e.quiet_look = look;
            continue;
        }
        const bool ours = user_view(e.s, bits, ask);
        if (ours && !e.trimmed) trim(set, e);
        else if (!ours && e.trimmed && e.s->conn.load(std::memory_order_acquire)) untrim(set, e);
    }
}

// Entries of sockets closed since (set->lock held): none when no socket
// of the process was closed since the last time. Only active entries are
// looked at: a quiet one's close sets its mark (close_prepare), and the
// marks were gathered.
void drop_closed(EpollSet *set) noexcept {
    const std::uint64_t closes = last_closes();
    if (closes == set->closes) return;
    set->closes = closes;
    gather(set);
    for (const std::uint32_t i : set->active) {
        const Entry &e = set->entries[i];
        if (e.s && e.s->fds.load(std::memory_order_acquire) == 0) remove_entry(set, i);
    }
}

// Off the active list: freed slots, and entries quiet with their marks
// linked (set->lock held).
void trim_active(EpollSet *set) noexcept {
    std::erase_if(set->active, [set](std::uint32_t i) {
        Entry &e = set->entries[i];
        if (live(e) && !(e.quiet && e.linked)) return false;
        e.active = false;
        if (live(e) && !e.trimmed) {
            e.kernel_rest = true;
            ++set->kernel_rests;
        }
        return true;
    });
}

// Drops from out[0..*n) the events whose data is `data`; returns how many.
int drop_data(epoll_event *out, int *n, std::uint64_t data) noexcept {
    epoll_event *end = std::remove_if(out, out + *n, [&](const epoll_event &k) {
        return k.data.u64 == data;
    });
    int dropped = *n - int(end - out);
    *n = int(end - out);
    return dropped;
}

// How a scan's look begins: settle() began it, or the scan does (reading
// the clock for the full look, or not).
enum class Begun { settled, here, here_clock };

// Our sockets' events appended to out[*n..max); stale entries (socket
// closed) go. out[0..*kernel) are the kernel's events of this round: a
// socket that turned ours since settle() (its upgrade finished) may be
// among them, from the registration trimmed only now; its kernel event
// goes, so no socket is reported twice in one call.
void scan(EpollSet *set, epoll_event *out, int *n, int max, int *kernel, Begun begun) noexcept {
    std::lock_guard lock(set->lock);
    if (begun != Begun::settled) (void)start_look(set, begun == Begun::here_clock);
    gather(set);
    drop_closed(set);
    trim_active(set);
    const auto &act = set->active;
    const std::size_t size = act.size();
    // (An entry off the list is quiet, so trimmed, but for those the
    // kernel reports.)
    set->all_trimmed.store(set->kernel_rests == 0 &&
                               std::all_of(act.begin(), act.end(), [set](std::uint32_t i) {
                                   const Entry &e = set->entries[i];
                                   return e.parked || (e.s && e.trimmed);
                               }),
                           std::memory_order_relaxed);
    for (std::size_t k = 0; k < size && *n < max; ++k) {
        const std::uint32_t i = act[(set->cursor + k) % size];
        Entry &e = set->entries[i];
        const bool was_trimmed = e.trimmed;
        std::uint32_t ev = entry_events(set, i, true, 0);
        if (e.trimmed && !was_trimmed && *kernel > 0) {
            int dropped = drop_data(out, kernel, e.ev.data.u64);
            if (dropped) {
                std::copy(out + *kernel + dropped, out + *n, out + *kernel);
                *n -= dropped;
            }
        }
        if (ev) {
            out[(*n)++] = {ev, e.ev.data};
            set->lately[set->lately_next++ % EpollSet::kLately] = i;
        }
    }
    if (size) set->cursor = (set->cursor + 1) % size;
}

}  // namespace

// What poll.cpp shares of the sets (readiness_impl.hpp).
namespace detail {

void set_release(EpollSet *set) noexcept {
    if (set->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    for (std::size_t i = 0; i < set->entries.size(); ++i) entry_drop(set, i);
    delete set;
}

EpollSet *set_acquire(int fd) noexcept {
    if (!sets || fd < 0 || fd >= nsets || live_sets.load(std::memory_order_acquire) == 0)
        return nullptr;
    std::lock_guard lock(sets_lock);
    EpollSet *set = sets[fd].load(std::memory_order_acquire);
    if (set) set->refs.fetch_add(1, std::memory_order_relaxed);
    return set;
}

bool inner_ready(EpollSet *set, int depth) noexcept {
    if (depth > 4) return false;  // the kernel limits nesting too
    std::lock_guard lock(set->lock);
    ++set->looks;  // a look of its own: no settle() answers for it
    gather(set);
    for (const std::uint32_t i : set->active)
        if (entry_events(set, i, false, depth)) return true;
    return false;
}

namespace {

void drop_stream(void *s) noexcept { release(static_cast<Stream *>(s)); }
void drop_set(void *set) noexcept { set_release(static_cast<EpollSet *>(set)); }

void enlist_entries(EpollSet *set, transport::Watch &w, int depth) noexcept {
    if (depth > 4) return;  // as inner_ready
    std::lock_guard lock(set->lock);
    // The active entries; a quiet one's mark wakes the sleep through the
    // set's mask (enlist_set), but for those reported lately, whose
    // connections are watched too (their peers' direct wake-ups).
    for (const std::uint32_t i : set->active) {
        Entry &e = set->entries[i];
        if (!e.armed) continue;  // until EPOLL_CTL_MOD, which wakes the set's sleeps
        // The entry's reference keeps each alive under the lock; ours
        // keeps it through the sleep, whatever the set's entries become.
        if (e.inner) {
            e.inner->refs.fetch_add(1, std::memory_order_relaxed);
            w.on(e.inner->pollers, drop_set, e.inner);
            enlist_entries(e.inner, w, depth + 1);
        } else if (e.s && !(e.quiet && e.linked)) {
            e.s->refs.fetch_add(1, std::memory_order_relaxed);
            enlist_stream(e.s, w, drop_stream, e.s);
        }
    }
    const std::size_t n = std::min(set->lately_next, EpollSet::kLately);
    for (std::size_t k = 0; k < n; ++k) {
        const std::uint32_t i = set->lately[k];
        if (std::find(set->lately, set->lately + k, i) != set->lately + k) continue;
        if (i >= set->entries.size()) continue;
        Entry &e = set->entries[i];
        if (!e.s || !e.armed || !(e.quiet && e.linked)) continue;
        e.s->refs.fetch_add(1, std::memory_order_relaxed);
        enlist_stream(e.s, w, drop_stream, e.s);
    }
}

}  // namespace

void enlist_set(EpollSet *set, transport::Watch &w) noexcept {
    // The set first: an entry added after the walk below wakes us.
    w.on(set->pollers);
    enlist_entries(set, w, 0);
}

}  // namespace detail

// ---- epoll ------------------------------------------------------------------------

void epoll_init() noexcept {
    // As many as the socket table; mapped once, before the process forks
    // (a forking server's children then make no system call of ours at
    // their first epoll_create). Pages are touched only where sets are.
    const int n = table_size();
    if (n <= 0) return;
    void *mem = mmap(nullptr, std::size_t(n) * sizeof(std::atomic<EpollSet *>),
                     PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) return;
    sets = static_cast<std::atomic<EpollSet *> *>(mem);
    nsets = n;
}

void epoll_created(int epfd) noexcept {
    if (!sets || epfd < 0 || epfd >= nsets) return;
    auto *set = new (std::nothrow) EpollSet;
    if (!set) return;
    set->epfd = epfd;
    EpollSet *old;
    {
        std::lock_guard lock(sets_lock);
        note_set(epfd);
        old = sets[epfd].exchange(set);
        live_sets.fetch_add(1, std::memory_order_release);
    }
    if (old) set_release(old);
}

SD_CHILD_PATH void epoll_fd_closed(int fd) noexcept {
    if (!sets || fd < 0 || fd >= nsets || !sets[fd].load(std::memory_order_acquire)) return;
    EpollSet *set;
    {
        std::lock_guard lock(sets_lock);
        set = sets[fd].exchange(nullptr);
    }
    if (set) set_release(set);
}

bool epoll_fd_known(int fd) noexcept {
    return sets && fd >= 0 && fd < nsets && sets[fd].load(std::memory_order_acquire);
}

void epoll_fd_dup(int fd, int nfd) noexcept {
    EpollSet *set = set_acquire(fd);
    if (!set) return;
    if (nfd < 0 || nfd >= nsets) return set_release(set);
    EpollSet *old;
    {
        std::lock_guard lock(sets_lock);
        note_set(nfd);
        old = sets[nfd].exchange(set);
    }
    if (old) set_release(old);
}

namespace {

// The kernel's part of epoll_ctl on a socket of ours (the set's lock held; `e`:
// its entry, if the set has one): 0 or -errno, the kernel's answer. A
// socket our state answers now gets the hint registration at once (ADD,
// or MOD of an entry whose registration is the application's), or keeps
// it (MOD of a trimmed entry: no system call; the kernel's answer would be
// 0, as the registration is there and the events are not exclusive), and
// `*trimmed` says so; otherwise the application's events go to the kernel
// and settle() trims them at the next wait.
int kernel_ctl(int epfd, int op, int fd, epoll_event *ev, Stream *s, Entry *e,
               bool *trimmed) noexcept {
    short bits = 0, ask = 0;
    if (s && ev && (op == EPOLL_CTL_ADD || (op == EPOLL_CTL_MOD && e)) &&
        !(ev->events & EPOLLEXCLUSIVE) && user_view(s, bits, ask) && fd_is(fd, s)) {
        if (op == EPOLL_CTL_MOD && e->trimmed) {
            *trimmed = true;
            return 0;
        }
        epoll_event kev = hint_of(s);
        if (sys.epoll_ctl(epfd, op, fd, &kev) != 0) return -errno;
        *trimmed = true;
        return 0;
    }
    return sys.epoll_ctl(epfd, op, fd, ev) == 0 ? 0 : -errno;
}

// Our state answers for the entry's socket now, through the fd it was
// registered with: its kernel registration may stay the hint.
bool answers_here(const Entry &e) noexcept {
    short bits = 0, ask = 0;
    return e.s && user_view(e.s, bits, ask) && fd_is(e.fd, e.s);
}

// The kernel holds nothing of the application's in the set, only our
// hints (EpollSet::foreign, as the last scan found the entries).
bool only_hints(const EpollSet *set) noexcept {
    return set->foreign.load(std::memory_order_relaxed) == 0 &&
           set->all_trimmed.load(std::memory_order_relaxed);
}

// EPOLL_CTL_DEL of the entry in slot `i`, parked instead when it can be
// (set->lock held).
bool park(EpollSet *set, std::size_t i) noexcept {
    Entry &e = set->entries[i];
    if (!e.trimmed || (e.ev.events & EPOLLEXCLUSIVE)) return false;
    if (set->live_n - set->shown_n >= std::size_t(kMaxParked)) return false;
    if (!answers_here(e)) return false;
    e.parked = true;
    e.armed = false;
    --set->shown_n;
    note_any(set);
    return true;
}

// EPOLL_CTL_ADD of the parked entry in slot `i` with `ev`, done without
// the kernel if its hint registration can stand for it (set->lock held).
bool unpark(EpollSet *set, std::size_t i, const epoll_event *ev) noexcept {
    Entry &e = set->entries[i];
    if (!ev || (ev->events & EPOLLEXCLUSIVE) || !answers_here(e)) return false;
    e.ev = *ev;
    e.parked = false;
    e.armed = true;
    e.fresh = true;
    e.quiet = false;
    ++set->shown_n;
    note_any(set);
    activate(set, i);
    return true;
}

// The socket's plain registration in `set` for `fd`, or -1 (pend_lock held).
int plain_of(const Stream *s, std::uint64_t serial, int fd) noexcept {
    for (int i = 0, n = s->plain_n.load(std::memory_order_relaxed); i < n; ++i)
        if (s->plain[i].set_serial == serial && s->plain[i].fd == fd) return i;
    return -1;
}

void plain_drop(Stream *s, int i) noexcept {
    const int n = s->plain_n.load(std::memory_order_relaxed);
    s->plain[i] = s->plain[n - 1];
    s->plain_n.store(n - 1, std::memory_order_relaxed);
}

// epoll_ctl on a socket that needs nothing of ours (its ask for its
// upgrade not made, nothing shared): the kernel's registration as the
// application asked, and no shadow (Stream::plain). True when done so,
// `*r` the kernel's answer: an ADD now, and a MOD or DEL of a plain
// registration. The socket's pend_lock orders it with its ask, which
// turns the registrations into shadows first (epoll_unplain) and takes
// each set's lock before it.
bool plain_ctl(EpollSet *set, int epfd, int op, int fd, epoll_event *ev, Stream *s,
               int *r) noexcept {
    std::lock_guard lock(s->pend_lock);
    const int i = plain_of(s, set->serial, fd);
    if (i < 0 && (op != EPOLL_CTL_ADD || !ev || !s->plain_ok_locked() ||
                  s->plain_n.load(std::memory_order_relaxed) == Stream::kPlainRegs))
        return false;
    if (sys.epoll_ctl(epfd, op, fd, ev) != 0) {
        *r = -errno;
        return true;
    }
    *r = 0;
    if (i < 0) {
        const int n = s->plain_n.load(std::memory_order_relaxed);
        s->plain[n] = {epfd, fd, set->serial, *ev};
        s->plain_n.store(n + 1, std::memory_order_relaxed);
        // The kernel holds a registration of the application's.
        set->foreign.fetch_add(1, std::memory_order_relaxed);
    } else if (op == EPOLL_CTL_MOD) {
        s->plain[i].ev = *ev;
    } else if (op == EPOLL_CTL_DEL) {
        plain_drop(s, i);
        set->foreign.fetch_sub(1, std::memory_order_relaxed);
    }
    return true;
}

}  // namespace

int epoll_control(int epfd, int op, int fd, epoll_event *ev) noexcept {
    EpollSet *set = set_acquire(epfd);
    Stream *s = set ? acquire(fd) : nullptr;
    if (s) s->claim_inherited();  // watching it is using it
    if (s && !s->conn.load(std::memory_order_acquire) &&
        s->phase.load(std::memory_order_acquire) == Phase::listener) {
        release(s);  // listeners stay with the kernel
        s = nullptr;
    }
    if (int r; s && plain_ctl(set, epfd, op, fd, ev, s, &r)) {
        release(s);
        set_release(set);
        return r;
    }
    EpollSet *inner = set && !s && fd != epfd ? set_acquire(fd) : nullptr;
    if (!s && !inner) {
        const int r = sys.epoll_ctl(epfd, op, fd, ev) == 0 ? 0 : -errno;
        if (set && r == 0 && op == EPOLL_CTL_ADD) set->foreign.fetch_add(1, std::memory_order_relaxed);
        if (set && r == 0 && op == EPOLL_CTL_DEL && set->foreign.load(std::memory_order_relaxed) > 0)
            set->foreign.fetch_sub(1, std::memory_order_relaxed);
        if (set) set_release(set);
        return r;
    }
    int r = 0;
    {
        std::lock_guard lock(set->lock);
        bool trimmed = false;
        auto &v = set->entries;
        // Its slot (kNoSlot: none).
        std::size_t at = find_entry(set, fd, [&](const Entry &e) {
            return s ? e.s == s : e.inner == inner;
        });
        // A parked entry is not there for the application; added again
        // while our state answers, it comes back without a system call.
        // Otherwise its hint registration goes before the kernel is asked.
        if (at != kNoSlot && v[at].parked) {
            if (op != EPOLL_CTL_ADD) {
                // The kernel's checks before it looks the fd up: a bad op,
                // no event, MOD with EPOLLEXCLUSIVE.
                const bool looked_up =
                    op == EPOLL_CTL_DEL ||
                    (op == EPOLL_CTL_MOD && ev && !(ev->events & EPOLLEXCLUSIVE));
                r = !looked_up && sys.epoll_ctl(epfd, op, fd, ev) != 0 ? -errno : -ENOENT;
                goto done;
            }
            if (unpark(set, at, ev)) goto done;
            (void)sys.epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
            remove_entry(set, at);
            at = kNoSlot;
        }
        // A delete of a trimmed entry whose socket our state answers parks
        // it: the kernel's answer would be 0.
        if (op == EPOLL_CTL_DEL && at != kNoSlot && park(set, at)) goto done;
        // The kernel has the registration in every case (trimmed or not):
        // its answer stands (EEXIST, ENOENT, EINVAL ...), except for MOD of
        // an exclusive entry, which it refuses but would accept on the
        // hint registration that replaced it.
        if (op == EPOLL_CTL_MOD && at != kNoSlot && (v[at].ev.events & EPOLLEXCLUSIVE)) {
            r = -EINVAL;
        } else if ((r = kernel_ctl(epfd, op, fd, ev, s, at != kNoSlot ? &v[at] : nullptr,
                                   &trimmed)) != 0) {
        } else if (op == EPOLL_CTL_ADD) {
            Entry e;
            e.fd = fd;
            e.s = s;
            e.inner = inner;
            e.ev = *ev;
            e.trimmed = trimmed;
            add_entry(set, e);
            wake_plain_sleepers(set);
            s = nullptr;  // the entry holds the references now
            inner = nullptr;
        } else if (op == EPOLL_CTL_MOD && at != kNoSlot) {
            Entry &e = v[at];
            if (e.ev.events & EPOLLEXCLUSIVE) {
                r = -EINVAL;
            } else {
                e.ev = *ev;
                e.trimmed = trimmed;
                e.armed = true;
                e.fresh = true;
                e.quiet = false;
                activate(set, at);
            }
        } else if (op == EPOLL_CTL_DEL && at != kNoSlot) {
            remove_entry(set, at);
        }
    done:
        // A thread asleep in the kernel on this set looks at it again.
        if (set->kernel_sleeper) kernel_sleep_signal(set->wake_fd, &set->signalled);
    }
    if (s) release(s);
    if (inner) set_release(inner);
    // A thread blocked in epoll_wait on this set (or on one holding it, or
    // in a poll holding it) looks again.
    transport::wake_pollers(set->pollers);
    set_release(set);
    return r;
}

namespace {

struct EpollCtx {
    EpollSet *set;
};

// The application's events among the kernel's k in out[]. Our tags are
// not events: a hint is applied (to a socket still in the set) and
// counted in *hints; a wake-up of this set's kernel sleeper only sets
// *woken. Events kept.
// A hint for `s` is for a trimmed, shown entry of the set: one under the
// socket's fd number (the index), or, registered through another of its
// fds (a dup), one found by a walk.
bool hinted_here(EpollSet *set, const Stream *s) noexcept {
    std::lock_guard lock(set->lock);
    auto mine = [s](const Entry &e) { return e.s == s && e.trimmed && !e.parked; };
    return find_entry(set, s->fd.load(std::memory_order_relaxed), mine) != kNoSlot ||
           std::any_of(set->entries.begin(), set->entries.end(), mine);
}

int keep_events(EpollSet *set, epoll_event *out, int k, int *hints, bool *woken) noexcept {
    int kept = 0;
    for (int i = 0; i < k; ++i) {
        std::uint64_t d = out[i].data.u64;
        if ((d & kTagMask) == kWakeTag) {
            *woken |= d == set->wake_data.load(std::memory_order_relaxed);
            continue;
        }
        if ((d & kTagMask) != kTag) {
            out[kept++] = out[i];
            continue;
        }
        ++*hints;
        auto *hinted = reinterpret_cast<Stream *>(d & ~kTagMask);
        if (hinted_here(set, hinted)) kernel_hint(hinted);
    }
    return kept;
}

// The kernel's ready events of the set, without waiting, or -errno. A
// wake-up of the thread asleep in the kernel on this set is its own to
// drain (it is awake already).
int kernel_events(EpollSet *set, int epfd, epoll_event *out, int max, int *hints) noexcept {
    if (max <= 0) return 0;
    int k = sys.epoll_wait(epfd, out, max, 0);
    if (k < 0) return -errno;
    bool woken = false;
    k = keep_events(set, out, k, hints, &woken);
    set->kernel_quiet.store(k == 0, std::memory_order_relaxed);
    return k;
}

bool epoll_peek(void *ctx) noexcept { return inner_ready(static_cast<EpollCtx *>(ctx)->set, 0); }
void epoll_enlist(void *ctx, transport::Watch &w) noexcept {
    enlist_set(static_cast<EpollCtx *>(ctx)->set, w);
}

bool has_entries(EpollSet *set) noexcept { return set->any.load(std::memory_order_acquire); }

bool got_entries(void *ctx) noexcept { return has_entries(static_cast<EpollSet *>(ctx)); }

// The sleep's one kernel fd is the set's own (Interest::owner): with the
// set as ctx, and with an EpollCtx.
const void *set_owner(void *ctx, std::size_t, std::uint64_t *serial) noexcept {
    auto *set = static_cast<EpollSet *>(ctx);
    *serial = set->serial;
    return set;
}
const void *ctx_set_owner(void *ctx, std::size_t i, std::uint64_t *serial) noexcept {
    return set_owner(static_cast<EpollCtx *>(ctx)->set, i, serial);
}
// Only epoll_ctl, which rings the set, can change that.
void enlist_set_only(void *ctx, transport::Watch &w) noexcept {
    w.on(static_cast<EpollSet *>(ctx)->pollers);
}

// The set's wake-up eventfd, registered in it at the first kernel sleep;
// -1 when none could be made (the set then always takes our wait).
int wake_fd_of(EpollSet *set, int epfd) noexcept {
    int fd = set->wake_fd.load(std::memory_order_acquire);
    if (fd != -1) return fd < 0 ? -1 : fd;
    std::lock_guard lock(set->lock);
    if ((fd = set->wake_fd.load(std::memory_order_relaxed)) != -1) return fd < 0 ? -1 : fd;
    fd = transport::out_of_the_way(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeTag | (std::uint64_t(own_pid()) & ~kTagMask);
    if (fd >= 0 && sys.epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        sys.close(fd);
        fd = -1;
    }
    set->wake_data.store(ev.data.u64, std::memory_order_relaxed);
    if (fd >= 0) set->tagged.store(true, std::memory_order_release);
    set->wake_fd.store(fd < 0 ? -2 : fd, std::memory_order_release);  // -2: do not try again
    return fd;
}

}  // namespace

void epoll_unplain(Stream *s) noexcept {
    for (;;) {
        Stream::PlainReg reg;
        {
            std::lock_guard lock(s->pend_lock);
            if (!s->plain_n.load(std::memory_order_relaxed)) return;
            reg = s->plain[0];
        }
        EpollSet *set = set_acquire(reg.epfd);
        if (set && set->serial != reg.set_serial) {
            set_release(set);
            set = nullptr;
        }
        if (!set) {
            // Its set is closed: nothing left to shadow.
            std::lock_guard lock(s->pend_lock);
            if (const int i = plain_of(s, reg.set_serial, reg.fd); i >= 0) plain_drop(s, i);
            continue;
        }
        bool made = false;
        {
            std::lock_guard lock(set->lock);
            std::lock_guard plock(s->pend_lock);
            if (const int i = plain_of(s, reg.set_serial, reg.fd); i >= 0) {
                Entry e;
                e.fd = s->plain[i].fd;
                e.s = s;
                e.ev = s->plain[i].ev;
                e.trimmed = false;  // the kernel's registration is the application's
                s->refs.fetch_add(1, std::memory_order_relaxed);  // the entry's
                add_entry(set, e);
                set->foreign.fetch_sub(1, std::memory_order_relaxed);
                plain_drop(s, i);
                made = true;
                if (set->kernel_sleeper) kernel_sleep_signal(set->wake_fd, &set->signalled);
                wake_plain_sleepers(set);
            }
        }
        if (made) transport::wake_pollers(set->pollers);
        set_release(set);
    }
}

void epoll_plain_closed(Stream *s) noexcept {
    Stream::PlainReg regs[Stream::kPlainRegs];
    int n;
    {
        std::lock_guard lock(s->pend_lock);
        n = s->plain_n.load(std::memory_order_relaxed);
        std::copy(s->plain, s->plain + n, regs);
        s->plain_n.store(0, std::memory_order_relaxed);
    }
    // A socket shared through fork may live on in another process, and so
    // may the kernel's registrations of it: they stay counted.
    if (s->forked) return;
    for (int i = 0; i < n; ++i) {
        EpollSet *set = set_acquire(regs[i].epfd);
        if (!set) continue;
        if (set->serial == regs[i].set_serial && set->foreign.load(std::memory_order_relaxed) > 0)
            set->foreign.fetch_sub(1, std::memory_order_relaxed);
        set_release(set);
    }
}

namespace {

// The kernel's own wait on a set none of whose entries needs our state:
// the application's events (or -errno). `again`: woken with nothing for
// the application; `woken`: our wake-up eventfd was among the events.
int kernel_epoll(EpollSet *set, int epfd, epoll_event *out, int max, int timeout_ms,
                 const sigset_t *mask, bool *again, bool *woken) noexcept {
    const int k = mask ? sys.epoll_pwait(epfd, out, max, timeout_ms, mask)
                       : sys.epoll_wait(epfd, out, max, timeout_ms);
    if (k < 0) return -errno;
    int hints = 0;
    const int r = keep_events(set, out, k, &hints, woken);
    *again = k > 0 && r == 0;
    return r;
}

// epoll_in_kernel in a process of one thread (kernel_sleep.hpp): no
// wake-up fd, no sleep list, nothing held, and no other sleeper on the set
// to keep out.
int epoll_alone(EpollSet *set, int epfd, epoll_event *out, int max, int timeout_ms,
                const sigset_t *mask, bool *again) noexcept {
    {
        std::lock_guard lock(set->lock);
        drop_closed(set);
        for (Entry &e : set->entries) {
            bool held = false;
            if (e.parked || !live(e)) continue;  // a parked entry's hint is no event
            if (!e.s || e.trimmed || !kernel_may_answer(e.s, &held, true)) return kNotHere;
        }
    }
    bool woken = false;
    return kernel_epoll(set, epfd, out, max, timeout_ms, mask, again, &woken);
}

// The kernel's own epoll_wait on the set, when none of our sockets in it
// needs our state (kernel_sleep.hpp): the application's events (or
// -errno), or kNotHere. `again`: woken with nothing for the application.
int epoll_in_kernel(EpollSet *set, int epfd, epoll_event *out, int max, int timeout_ms,
                    const sigset_t *mask, bool *again) noexcept {
    *again = false;
    if (transport::Engine *e = transport::Engine::current(); e && e->flush_pending())
        return kNotHere;  // bytes owed by a leave wait for progress passes
    // The last scan found every shown entry answered by our state: the
    // kernel cannot answer alone, and the look below would find the first
    // such entry (an answer gone stale since only sends this wait the
    // longer way, which serves every case).
    if (has_entries(set) && set->all_trimmed.load(std::memory_order_relaxed)) return kNotHere;
    if (transport::one_thread()) return epoll_alone(set, epfd, out, max, timeout_ms, mask, again);
    const int wfd = wake_fd_of(set, epfd);
    if (wfd < 0) return kNotHere;
    KernelSleep me;
    me.efd = wfd;
    me.signalled = &set->signalled;
    // On the list before any ask is held back: an ask held from now on
    // finds us there.
    kernel_sleep_enter(me);
    bool owner = false, ok = false;
    {
        std::lock_guard lock(set->lock);
        if (!set->kernel_sleeper) {
            owner = ok = set->kernel_sleeper = true;
            drop_closed(set);
            for (Entry &e : set->entries) {
                bool held = false;
                if (e.parked || !live(e)) continue;  // a parked entry's hint is no event
                // A trimmed entry answers from our state; an inner set
                // may hold anything.
                ok = e.s && !e.trimmed && kernel_may_answer(e.s, &held, false);
                if (held) set->held.push_back(e.s);
                if (!ok) break;
            }
        }
    }
    int r = kNotHere;
    bool woken = false;
    if (ok) r = kernel_epoll(set, epfd, out, max, timeout_ms, mask, again, &woken);
    // The asks held back are made now, before another sleeper can take
    // `held` over.
    if (owner)
        for (Stream *s : set->held) kernel_wait_done(s);
    // Off the list first: no wake-up writes the eventfd after that but
    // epoll_ctl's, under the set's lock while we are its sleeper. So the
    // drain below leaves it unreadable until the next sleep.
    kernel_sleep_leave(me);
    if (owner) {
        std::lock_guard lock(set->lock);
        set->held.clear();
        set->kernel_sleeper = false;
        if (set->signalled.exchange(false, std::memory_order_acq_rel) || woken) drain_fd(wfd);
    }
    return r;
}

// The kernel's epoll_wait for a set we need not look into. A set whose
// wake-up eventfd is registered may report it while another thread
// sleeps in the kernel on it (until that thread drains it): not an event.
// Ours (a socket's plain registration in the set became a shadow while
// we slept, epoll_unplain) ends the wait with kNotHere: `*rest` ms are
// left for a look at the set as it is now. Whether the set is tagged is
// read after the sleep: the eventfd may be registered during it.
int plain_wait(EpollSet *set, int epfd, epoll_event *out, int max, int timeout_ms,
               const sigset_t *mask, int *rest) noexcept {
    struct Counted {
        EpollSet *set;
        ~Counted() {
            if (set) set->plain_sleepers.fetch_sub(1, std::memory_order_relaxed);
        }
    } counted{nullptr};
    if (set && max > 0 && timeout_ms != 0) {
        // Another thread may add a shadow while we sleep: the set's
        // wake-up fd is there first (none is needed alone: nobody else
        // can), then we count, then look.
        if (!transport::one_thread()) (void)wake_fd_of(set, epfd);
        set->plain_sleepers.fetch_add(1, std::memory_order_relaxed);
        counted.set = set;
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (has_entries(set)) {
            *rest = timeout_ms;
            return kNotHere;
        }
    }
    const std::uint64_t deadline = deadline_of(timeout_ms);
    for (int left = timeout_ms;;) {
        const int k = mask ? sys.epoll_pwait(epfd, out, max, left, mask)
                           : sys.epoll_wait(epfd, out, max, left);
        if (k < 0) return -errno;
        if (!set || max <= 0 || k == 0 || !set->tagged.load(std::memory_order_acquire)) return k;
        int hints = 0;
        bool woken = false;
        if (const int kept = keep_events(set, out, k, &hints, &woken); kept > 0) return kept;
        left = ms_left(deadline, timeout_ms);
        if (woken) {
            *rest = left;
            return kNotHere;
        }
        if (left == 0) return 0;
    }
}

}  // namespace

int epoll_wait_fds(int epfd, epoll_event *out, int max, int timeout_ms,
                   const sigset_t *mask) noexcept {
    EpollSet *set = set_acquire(epfd);
    // A set with nothing of ours in a process without an engine goes
    // straight to the kernel below, without a wake-up fd of ours.
    if (set && max > 0 && (has_entries(set) || transport::Engine::current())) {
        // Nothing in the set needs our state: the kernel's own wait, as
        // often as a wake-up for us (not for the application) ends it.
        const std::uint64_t deadline = deadline_of(timeout_ms);
        for (int left = timeout_ms, last = 1;;) {
            bool again = false;
            const int r = epoll_in_kernel(set, epfd, out, max, left, mask, &again);
            if (r == kNotHere) {
                timeout_ms = left;  // the rest is our wait's
                break;
            }
            if (!again || (left == 0 && last == 0)) {
                set_release(set);
                return again ? 0 : r;
            }
            last = left;
            left = ms_left(deadline, timeout_ms);
        }
    }
    bool shadowed = false;
    if (set) {
        std::lock_guard lock(set->lock);
        shadowed = set->live_n > 0;
    }
    transport::Engine *engine = transport::Engine::current();
    if (!shadowed && set && max > 0 && engine && timeout_ms != 0) {
        // Nothing of ours in the set yet, but another thread may add one
        // while we wait (its data never wakes the kernel's epoll): sleep
        // where epoll_ctl's wake-up reaches us, without spinning.
        const std::uint64_t deadline = deadline_of(timeout_ms);
        for (;;) {
            int hints = 0;
            int r = kernel_events(set, epfd, out, max, &hints);
            if (r != 0) {
                set_release(set);
                return r;
            }
            int left = ms_left(deadline, timeout_ms);
            if (has_entries(set)) {
                set_release(set);
                return epoll_wait_fds(epfd, out, max, left, mask);
            }
            if (left == 0) break;
            pollfd k{epfd, POLLIN, 0};
            int w = transport::sleep_on_fds(engine, &k, 1, mask, left,
                                            {got_entries, enlist_set_only, set, set_owner});
            if (w == -EINTR || (w == -1 && errno == EINTR)) {
                set_release(set);
                return -EINTR;
            }
        }
        set_release(set);
        return 0;
    }
    if (!shadowed || max <= 0) {
        int rest = 0;
        const int r = plain_wait(set, epfd, out, max, timeout_ms, mask, &rest);
        if (set) set_release(set);
        return r == kNotHere ? epoll_wait_fds(epfd, out, max, rest, mask) : r;
    }
    pollfd kfd{epfd, POLLIN, 0};
    EpollCtx ctx{set};
    // The first look of a wait that may sleep, when the kernel's last
    // answer for the set was quiet, asks the kernel only if our entries
    // have something to report (then the kernel's events go with them, a
    // dead peer's end among them): with nothing, the sleep's poll of the
    // set asks it, and a spin asks within kAskKernelEveryNs. One system
    // call less on each wait of a server whose set's kernel fds are
    // quiet (a postgres backend's latch and postmaster pipe beside its
    // direct connection).
    // And when the kernel holds nothing of the application's in the set
    // (EpollSet::foreign), a look whose entries report asks it nothing:
    // what it could add is a hint, which matters only when our entries
    // have nothing (redis-benchmark's set of its own connections: one
    // epoll_wait less a wait).
    bool first = timeout_ms != 0;
    int r = wait_loop(
        [&](bool ask_kernel) -> int {
            const bool quiet_first =
                first && ask_kernel && set->kernel_quiet.load(std::memory_order_relaxed);
            first = false;
            // The kernel's events and ours take turns going first, so that
            // a small maxevents serves every ready entry in turn.
            const bool kernel_first = ask_kernel && !quiet_first && !only_hints(set) &&
                                      (set->turn.fetch_add(1, std::memory_order_relaxed) & 1);
            for (;;) {
                int n = 0, hints = 0, kernel = 0;
                // Where the kernel is asked after the scan (or not at all),
                // the scan's look does settle()'s work: one pass, one
                // view of each socket.
                if (kernel_first) {
                    settle(set, ask_kernel);
                    n = kernel_events(set, epfd, out, max, &hints);
                    if (n < 0) return n;
                    kernel = n;
                }
                scan(set, out, &n, max, &kernel,
                     kernel_first ? Begun::settled
                     : ask_kernel ? Begun::here_clock
                                  : Begun::here);
                if (quiet_first && n == 0) return 0;
                // (As the scan just found it.)
                if (ask_kernel && !kernel_first && n < max && !(n > 0 && only_hints(set))) {
                    int k = kernel_events(set, epfd, out + n, max - n, &hints);
                    if (k < 0) return n ? n : k;
                    n += k;
                }
                if (n > 0 || !hints) return n;
                // Only hints: their sockets now report; look again.
            }
        },
        &kfd, 1, timeout_ms, mask, {epoll_peek, epoll_enlist, &ctx, ctx_set_owner});
    set_release(set);
    return r;
}

SD_CHILD_PATH void epoll_after_fork_child() noexcept {
    kernel_sleeps_after_fork_child();
    // The child's shadows describe the parent's connections: forget them
    // (the sets are left as the kernel has them). A set's wake-up eventfd
    // stays registered while the parent holds it (the epoll instance is
    // shared): the child drops its copy, makes its own at its first
    // kernel sleep, and tells the two apart by the pid in their data.
    if (!sets) return;
    transport::renew(sets_lock);
    for (int fd = 0, end = sets_used.load(std::memory_order_acquire); fd < end; ++fd)
        if (EpollSet *set = sets[fd].load(std::memory_order_relaxed)) {
            // Written only where not as it should be already (renew.hpp).
            transport::renew(set->lock);
            if (!set->entries.empty()) set->entries.clear();
            if (!set->holes.empty()) set->holes.clear();
            if (!set->by_fd.empty()) set->by_fd.clear();
            if (!set->active.empty()) set->active.clear();
            transport::renew(set->live_n, 0);
            transport::renew(set->shown_n, 0);
            transport::renew(set->kernel_rests, 0);
            transport::renew(set->lately_next, 0);
            transport::renew(set->any, false);
            // The kernel's set holds the parent's registrations too, which
            // the child knows nothing of: it always asks the kernel.
            transport::renew(set->foreign, 1);
            // The parent's references (fork_child recounted them).
            if (!set->held.empty()) set->held.clear();
            transport::renew(set->kernel_sleeper, false);
            transport::renew(set->signalled, false);
            if (int w = set->wake_fd.load(std::memory_order_relaxed); w != -1) {
                set->wake_fd.store(-1, std::memory_order_relaxed);
                if (w >= 0) sys.close(w);
            }
        }
}

}  // namespace sd::fallback
