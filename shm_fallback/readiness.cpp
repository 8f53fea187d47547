#include "readiness.hpp"

#include "kernel_sleep.hpp"
#include "table.hpp"
#include "transport/settings.hpp"
#include "transport/sys.hpp"
#include "transport/wait.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <sys/mman.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>
#include <vector>

namespace sd::fallback {

using transport::Conn;
using transport::kNoOffset;
using transport::monotonic_ns;
using transport::sys;

namespace {

constexpr short kReadBits = POLLIN | POLLRDNORM;
constexpr short kWriteBits = POLLOUT | POLLWRNORM;
// The companion's answers that mean its TCP peer went away.
constexpr short kKernelEnd = POLLIN | POLLRDHUP | POLLHUP | POLLERR;

// Readiness from our own state, when the connection is direct and every
// byte the kernel was due to carry has been read. `ask`: what to ask the
// companion (POLLRDHUP while the fabric has not said EOF: a hint that the
// peer died). False: the kernel knows better (not direct yet, or bytes
// still due on the companion socket).
bool user_view(Stream *s, short &bits, short &ask) noexcept {
    Conn *c = s->conn.load(std::memory_order_acquire);
    if (!c) return false;
    const transport::ConnState st = c->state.load(std::memory_order_acquire);
    const bool leaving = st == transport::ConnState::leaving;
    if (st != transport::ConnState::direct && !leaving) return false;
    std::lock_guard lock(c->rx_lock);
    // Leaving the fabric with all of it read: the kernel answers from now on.
    if (leaving && c->settle_left_locked()) return false;
    if (c->switch_off == kNoOffset || c->rx_off < c->switch_off) return false;
    short b = 0;
    const bool fin = c->fin_off != kNoOffset;
    const bool eof = c->kernel_eof.load(std::memory_order_relaxed);
    // The companion's EOF without a fabric word: if the peer process is
    // gone, its counters say whether it left our bytes unread (a reset).
    if (eof && !fin && !c->peer_closed.load(std::memory_order_relaxed))
        if (auto *e = transport::Engine::current(); e && !e->peer_alive(c->peer)) e->peer_died(c);
    const bool closed = c->peer_closed.load(std::memory_order_relaxed);
    if (c->broken.load(std::memory_order_relaxed)) {
        b = kReadBits | kWriteBits | POLLRDHUP | POLLERR | POLLHUP;
    } else {
        // SO_RCVLOWAT: readable from that many bytes on, as TCP's poll.
        if (c->rx_ready() >= std::uint64_t(s->rcvlowat.load(std::memory_order_relaxed)))
            b |= kReadBits;
        // Leaving, with the fabric part read (but bytes still owed to the
        // kernel, so not final yet): the kernel has what comes next.
        if (leaving && !c->rx_ready() && c->peer_end != kNoOffset && c->rx_off >= c->peer_end) {
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
        if (fin || closed || eof || s->rd_shut.load(std::memory_order_relaxed))
            b |= kReadBits | POLLRDHUP;
        // Leaving: sends take the kernel socket once what is owed to it is there.
        if (leaving ? !c->tx_owed.load(std::memory_order_acquire)
                    : c->credits.load(std::memory_order_acquire) > 0 || closed || eof)
            b |= kWriteBits;
        // Both directions shut (the peer's FIN or our SHUT_RD, and our
        // SHUT_WR, on the fabric or on the kernel before the upgrade): TCP
        // reports a hang-up.
        if ((fin || closed || eof || s->rd_shut.load(std::memory_order_acquire)) && s->wr_shut(c))
            b |= POLLHUP;
        // A reset (the peer closed or died with our bytes unread): the
        // kernel's socket is closed, with an error until one call reports it.
        if (c->peer_reset.load(std::memory_order_acquire)) {
            b |= kReadBits | kWriteBits | POLLRDHUP | POLLHUP;
            if (c->reset_unreported.load(std::memory_order_acquire)) b |= POLLERR;
        }
    }
    ask = fin || closed || eof ? 0 : POLLRDHUP;
    bits = b;
    return true;
}

bool has_prefix(Stream *s) noexcept {
    Prefix *p = s->prefix.load(std::memory_order_acquire);
    return p && prefix_left(p);
}

// The companion said its TCP peer is gone while the fabric is silent.
void kernel_hint(Stream *s) noexcept {
    Conn *c = s->conn.load(std::memory_order_acquire);
    if (!c || c->kernel_eof.exchange(true)) return;
    // A peer that closes or shuts down says so on the fabric before its
    // companion does; without that word it is exiting (its fds close
    // before its pidfd fires): wait briefly for that, so that the first
    // report already knows whether it was a reset.
    if (auto *e = transport::Engine::current(); e && c->is_direct()) {
        e->progress_blocking();
        bool word;
        {
            std::lock_guard lock(c->rx_lock);
            word = c->fin_off != kNoOffset || c->peer_closed.load(std::memory_order_relaxed);
        }
        bool gone = !word && e->peer_exit_wait(c->peer, 200);
        if (gone) e->peer_died(c);
    }
    c->rx_seq.fetch_add(1, std::memory_order_release);
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

// Stack storage for small sets, heap for large ones.
template <typename T, std::size_t N>
class Scratch {
  public:
    explicit Scratch(std::size_t n) noexcept
        : p_(n <= N ? inline_ : static_cast<T *>(std::malloc(n * sizeof(T)))) {}
    ~Scratch() {
        if (p_ != inline_) std::free(p_);
    }
    Scratch(const Scratch &) = delete;
    Scratch &operator=(const Scratch &) = delete;
    T *get() const noexcept { return p_; }
    T &operator[](std::size_t i) noexcept { return p_[i]; }

  private:
    T inline_[N];
    T *p_;
};

// ---- epoll shadows ----------------------------------------------------------------

constexpr std::uint64_t kTag = 0x5d1eull << 48;
constexpr std::uint64_t kTagMask = 0xffffull << 48;

struct EpollSet;

struct Entry {
    int fd = -1;
    Stream *s = nullptr;       // a socket of ours (reference held) ...
    EpollSet *inner = nullptr; // ... or an epoll set inside this one (reference held)
    epoll_event ev{};          // as the application registered it
    bool trimmed = false;      // kernel registration is the death hint only
    bool armed = true;         // EPOLLONESHOT has not fired
    std::uint32_t seen_rx = ~0u, seen_tx = ~0u;  // EPOLLET: what was reported
};

struct EpollSet {
    std::atomic<int> refs{1};
    int epfd = -1;
    std::mutex lock;
    std::vector<Entry> entries;
    std::size_t cursor = 0;  // fairness when maxevents is small
    std::atomic<unsigned> turn{0};  // odd: the kernel's events go first
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
    bool kernel_sleeper = false;
    std::vector<Stream *> held;
    ~EpollSet() {
        if (wake_fd >= 0) sys.close(wake_fd);
    }
};

std::atomic<EpollSet *> *sets = nullptr;
int nsets = 0;
std::once_flag sets_once;

void sets_init() noexcept {
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    rlim_t n = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > (1u << 20) ? (1u << 20) : rl.rlim_max;
    if (n < 1024) n = 1024;
    void *mem = mmap(nullptr, n * sizeof(std::atomic<EpollSet *>), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) return;
    sets = static_cast<std::atomic<EpollSet *> *>(mem);
    nsets = int(n);
}

std::atomic<int> live_sets{0};

void set_release(EpollSet *set) noexcept;

void entry_drop(Entry &e) noexcept {
    if (e.s) release(e.s);
    if (e.inner) set_release(e.inner);
    e.s = nullptr;
    e.inner = nullptr;
}

void set_release(EpollSet *set) noexcept {
    if (set->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    for (Entry &e : set->entries) entry_drop(e);
    delete set;
}

// Sets are only ever looked up by the thread calling into the set, with a
// reference taken under the table slot's value; a racing close may free
// the set only after our reference is dropped.
std::mutex sets_lock;

EpollSet *set_acquire(int fd) noexcept {
    if (!sets || fd < 0 || fd >= nsets || live_sets.load(std::memory_order_acquire) == 0)
        return nullptr;
    std::lock_guard lock(sets_lock);
    EpollSet *set = sets[fd].load(std::memory_order_acquire);
    if (set) set->refs.fetch_add(1, std::memory_order_relaxed);
    return set;
}

// The kernel registration of a socket that now answers from our state:
// only its peer's end (EPOLLRDHUP, edge) with our tag.
// `fd` refers to `s` right now.
bool fd_is(int fd, Stream *s) noexcept {
    Stream *now = acquire(fd);
    if (now) release(now);
    return now == s;
}

bool trim(EpollSet *set, Entry &e) noexcept {
    // The registered fd was closed while a dup keeps the file (and the
    // kernel's registration) alive: nobody can change that registration
    // any more; our state reports, as it would after a trim.
    if (!fd_is(e.fd, e.s)) {
        e.trimmed = true;
        return true;
    }
    epoll_event kev{};
    kev.events = EPOLLRDHUP | EPOLLET;
    kev.data.u64 = kTag | reinterpret_cast<std::uintptr_t>(e.s);
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

bool inner_ready(EpollSet *set, int depth) noexcept;

// The events of one entry now, as epoll_wait would report them, or 0.
// `commit`: the report happens (EPOLLET and EPOLLONESHOT state advance).
std::uint32_t entry_events(EpollSet *set, Entry &e, bool commit, int depth) noexcept {
    if (!e.armed) return 0;
    if (e.inner) {
        // An epoll fd is readable when one of its events is pending.
        if (!(e.ev.events & EPOLLIN) || !inner_ready(e.inner, depth + 1)) return 0;
        return EPOLLIN;
    }
    short bits = 0, ask = 0;
    if (!user_view(e.s, bits, ask)) {
        if (commit && e.trimmed) untrim(set, e);
        // Bytes of the peer left to the holders at a fork come first, and
        // the kernel socket knows nothing of them.
        if (has_prefix(e.s) && (e.ev.events & EPOLLIN)) {
            if (commit && (e.ev.events & EPOLLONESHOT)) e.armed = false;
            return EPOLLIN;
        }
        return 0;  // the kernel reports it
    }
    // A report trims the kernel's registration first (or the kernel would
    // report too); a mere look (nested sets, peeks) needs no trim.
    if (commit && !e.trimmed && !trim(set, e)) return 0;
    const std::uint32_t want = (e.ev.events & (EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLPRI |
                                               EPOLLRDNORM | EPOLLWRNORM)) |
                               EPOLLERR | EPOLLHUP;
    std::uint32_t ev = std::uint32_t(std::uint16_t(bits)) & want;
    if (!ev) return 0;
    if (e.ev.events & EPOLLET) {
        Conn *c = e.s->conn.load(std::memory_order_acquire);
        std::uint32_t rx = c->rx_seq.load(std::memory_order_acquire);
        std::uint32_t tx = c->tx_seq.load(std::memory_order_acquire);
        if (rx == e.seen_rx && tx == e.seen_tx) return 0;  // nothing new since the last report
        if (commit) {
            e.seen_rx = rx;
            e.seen_tx = tx;
        }
    }
    if (commit && (e.ev.events & EPOLLONESHOT)) e.armed = false;
    return ev;
}

bool inner_ready(EpollSet *set, int depth) noexcept {
    if (depth > 4) return false;  // the kernel limits nesting too
    std::lock_guard lock(set->lock);
    for (Entry &e : set->entries)
        if (entry_events(set, e, false, depth)) return true;
    return false;
}

// Trims the kernel's registration of every socket our state answers now,
// before the kernel is asked: its own socket (idle, always writable)
// would report for it otherwise.
void settle(EpollSet *set) noexcept {
    std::lock_guard lock(set->lock);
    for (Entry &e : set->entries) {
        short bits = 0, ask = 0;
        if (!e.s || !e.armed) continue;
        const bool ours = user_view(e.s, bits, ask);
        if (ours && !e.trimmed) trim(set, e);
        else if (!ours && e.trimmed && e.s->conn.load(std::memory_order_acquire)) untrim(set, e);
    }
}

// Entries of sockets closed since (set->lock held).
void drop_closed(EpollSet *set) noexcept {
    std::erase_if(set->entries, [](Entry &e) {
        if (!e.s || e.s->fds.load(std::memory_order_acquire) > 0) return false;
        entry_drop(e);
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

// Our sockets' events appended to out[*n..max); stale entries (socket
// closed) go. out[0..*kernel) are the kernel's events of this round: a
// socket that turned ours since settle() (its upgrade finished) may be
// among them, from the registration trimmed only now; its kernel event
// goes, so no socket is reported twice in one call.
void scan(EpollSet *set, epoll_event *out, int *n, int max, int *kernel) noexcept {
    std::lock_guard lock(set->lock);
    drop_closed(set);
    auto &v = set->entries;
    const std::size_t size = v.size();
    for (std::size_t k = 0; k < size && *n < max; ++k) {
        Entry &e = v[(set->cursor + k) % size];
        const bool was_trimmed = e.trimmed;
        std::uint32_t ev = entry_events(set, e, true, 0);
        if (e.trimmed && !was_trimmed && *kernel > 0) {
            int dropped = drop_data(out, kernel, e.ev.data.u64);
            if (dropped) {
                std::copy(out + *kernel + dropped, out + *n, out + *kernel);
                *n -= dropped;
            }
        }
        if (ev) out[(*n)++] = {ev, e.ev.data};
    }
    if (size) set->cursor = (set->cursor + 1) % size;
}

// ---- the wait loop shared by poll and epoll --------------------------------------

// While spinning, the kernel is asked about the application's kernel fds
// and the companions' death hints at most this often: a kernel poll of a
// few sockets costs more than a whole look at our own state, and pgbench's
// poll() over 8 direct sockets spent most of its CPU in it.
inline constexpr std::uint64_t kAskKernelEveryNs = 20000;

// Spins (SDIRECT_SPIN_US) then sleeps on `kfds` until `check(ask_kernel)`
// finds something, the timeout passes or a signal arrives. `ask_kernel`:
// this look includes the kernel's view (the first, every
// kAskKernelEveryNs of a spin, and the first after each sleep).
template <typename Check>
int wait_loop(Check check, pollfd *kfds, nfds_t nk, int timeout_ms, const sigset_t *mask,
              bool (*peek)(void *), void *ctx) noexcept {
    transport::Engine *engine = transport::Engine::current();
    const std::uint64_t deadline = deadline_of(timeout_ms);
    const std::uint64_t spin_ns = std::uint64_t(transport::settings().spin_us) * 1000;
    std::uint64_t spin_until = 0;
    std::uint64_t ask_kernel_at = 0;
    transport::SpinSlot slot;
    for (;;) {
        if (engine) engine->progress();
        std::uint64_t now = monotonic_ns();
        const bool ask_kernel = now >= ask_kernel_at;
        if (ask_kernel) ask_kernel_at = now + kAskKernelEveryNs;
        int n = check(ask_kernel);
        if (n != 0 || timeout_ms == 0) return n;
        if (deadline && now >= deadline) {
            if (ask_kernel) return 0;
            ask_kernel_at = 0;  // the last look before timing out asks the kernel too
            continue;
        }
        if (!spin_until) spin_until = slot.start(now, spin_ns);
        if (!mask && now < spin_until) continue;
        slot.release();
        int left = ms_left(deadline, timeout_ms);
        if (!engine) {
            // Connections wait for the engine being built: look again soon.
            engine = transport::Engine::current();
            if (left < 0 || left > 20) left = 20;
        }
        ask_kernel_at = 0;  // what woke us may be the kernel's
        int r = engine ? transport::sleep_on_fds(engine, kfds, nk, mask, left, peek, ctx)
                       : (mask ? [&] {
                             timespec ts{left / 1000, long(left % 1000) * 1000000};
                             return sys.ppoll(kfds, nk, left < 0 ? nullptr : &ts, mask);
                         }()
                               : sys.poll(kfds, nk, left));
        if (r < 0 && (r == -1 ? errno : -r) == EINTR) return -EINTR;
    }
}

// ---- poll -------------------------------------------------------------------------

struct PollCtx {
    pollfd *fds;     // the application's
    pollfd *k;       // what the kernel is asked
    Stream **ours;   // our sockets (reference held) or null
    EpollSet **eps;  // epoll sets of ours or null
    bool *user;      // readiness from our state this round
    short *bits;
    nfds_t n;
};

// Builds the kernel's view for this round; true if our state alone
// already has something to report.
bool poll_prepare(PollCtx &p) noexcept {
    bool any = false;
    for (nfds_t i = 0; i < p.n; ++i) {
        p.k[i] = p.fds[i];
        p.k[i].revents = 0;
        p.user[i] = false;
        p.bits[i] = 0;
        short ask = 0;
        if (p.ours[i] && has_prefix(p.ours[i])) {
            p.bits[i] = kReadBits;  // before the kernel socket: see prefix.cpp
            if (p.fds[i].events & kReadBits) any = true;
        }
        short mine = 0;
        if (p.ours[i] && user_view(p.ours[i], mine, ask)) {
            p.bits[i] |= mine;
            p.user[i] = true;
            p.k[i].events = ask;
            if (!ask) p.k[i].fd = -1;  // nothing to ask: the kernel skips it
            if (p.bits[i] & (p.fds[i].events | POLLERR | POLLHUP)) any = true;
        } else if (p.eps[i] && (p.fds[i].events & POLLIN) && inner_ready(p.eps[i], 0)) {
            p.bits[i] = POLLIN;
            any = true;
        }
    }
    return any;
}

// POLLRDHUP if the kernel socket `fd` is at its peer's FIN. The kernel's
// poll reads the socket without its lock: a FIN being queued counts as a
// readable byte a moment before the read side is shut, and a poll that
// falls in that moment (ours spins) says POLLIN alone. A peek takes the
// lock and sees the FIN whole.
short kernel_rdhup(int fd) noexcept {
    char c;
    return sys.recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0 ? POLLRDHUP : 0;
}

int poll_finish(PollCtx &p) noexcept {
    int count = 0;
    for (nfds_t i = 0; i < p.n; ++i) {
        short rev;
        if (p.user[i]) {
            if (p.k[i].revents & kKernelEnd) {
                kernel_hint(p.ours[i]);
                // Seen again with the hint (a reset adds POLLERR|POLLHUP).
                short b = 0, ask = 0;
                if (user_view(p.ours[i], b, ask)) p.bits[i] = b;
                p.bits[i] |= kReadBits | POLLRDHUP | kWriteBits;
            }
            rev = short(p.bits[i] & (p.fds[i].events | POLLERR | POLLHUP));
        } else {
            rev = short(p.k[i].revents | (p.bits[i] & p.fds[i].events));
            if (p.ours[i] && (rev & POLLIN) && !(rev & POLLRDHUP) && (p.fds[i].events & POLLRDHUP))
                rev |= kernel_rdhup(p.k[i].fd);
        }
        p.fds[i].revents = rev;
        if (rev) ++count;
    }
    return count;
}

bool poll_peek(void *ctx) noexcept {
    auto &p = *static_cast<PollCtx *>(ctx);
    for (nfds_t i = 0; i < p.n; ++i) {
        short bits = 0, ask = 0;
        if (p.ours[i] && user_view(p.ours[i], bits, ask) &&
            (bits & (p.fds[i].events | POLLERR | POLLHUP)))
            return true;
        if (p.eps[i] && inner_ready(p.eps[i], 0)) return true;
    }
    return false;
}

}  // namespace

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

int poll_fds(pollfd *fds, nfds_t n, int timeout_ms, const sigset_t *mask) noexcept {
    // Which fds are ours? With none, the kernel answers everything.
    Scratch<Stream *, 64> ours(n);
    Scratch<EpollSet *, 64> eps(n);
    if (!ours.get() || !eps.get()) return -ENOMEM;
    bool any = false;
    for (nfds_t i = 0; i < n; ++i) {
        ours[i] = nullptr;
        eps[i] = nullptr;
        Stream *s = acquire(fds[i].fd);
        if (s) s->claim_inherited();
        if (s && s->may_go_direct()) {
            ours[i] = s;
            any = true;
        } else if (s) {
            release(s);
        } else if ((eps[i] = set_acquire(fds[i].fd))) {
            any = true;
        }
    }
    int r;
    if (!any) {
        if (mask || timeout_ms > 0x7fffffff) {
            timespec ts{timeout_ms / 1000, long(timeout_ms % 1000) * 1000000};
            r = sys.ppoll(fds, n, timeout_ms < 0 ? nullptr : &ts, mask);
        } else {
            r = sys.poll(fds, n, timeout_ms);
        }
        return r < 0 ? -errno : r;
    }
    // None of ours needs our state (and no epoll set of ours is among
    // them): the kernel's own poll, as often as a wake-up for us ends it.
    bool inner = false;
    for (nfds_t i = 0; i < n && !inner; ++i) inner = eps[i] != nullptr;
    const std::uint64_t deadline = deadline_of(timeout_ms);
    for (int left = timeout_ms, last = 1; !inner;) {
        bool again = false;
        r = poll_in_kernel(fds, n, ours.get(), left, mask, &again);
        if (r == kNotHere) {
            timeout_ms = left;  // the rest is our wait's
            break;
        }
        if (!again || (left == 0 && last == 0)) {
            for (nfds_t i = 0; i < n; ++i)
                if (ours[i]) release(ours[i]);
            return again ? 0 : r;
        }
        last = left;
        left = ms_left(deadline, timeout_ms);
    }
    Scratch<pollfd, 64> k(n);
    Scratch<bool, 64> user(n);
    Scratch<short, 64> bits(n);
    if (!k.get() || !user.get() || !bits.get()) {
        r = -ENOMEM;
    } else {
        PollCtx p{fds, k.get(), ours.get(), eps.get(), user.get(), bits.get(), n};
        r = wait_loop(
            [&](bool ask_kernel) {
                poll_prepare(p);
                if (ask_kernel && sys.poll(p.k, p.n, 0) < 0) return -errno;
                return poll_finish(p);
            },
            k.get(), n, timeout_ms, mask, poll_peek, &p);
        if (r == 0) {
            // Timed out: every revents reads 0, as the kernel leaves them.
            for (nfds_t i = 0; i < n; ++i) fds[i].revents = 0;
        }
    }
    for (nfds_t i = 0; i < n; ++i) {
        if (ours[i]) release(ours[i]);
        if (eps[i]) set_release(eps[i]);
    }
    return r;
}

int select_fds(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, int timeout_ms,
               const sigset_t *mask) noexcept {
    // As the kernel maps poll bits to select sets.
    constexpr short kInSet = POLLIN | POLLRDNORM | POLLRDBAND | POLLHUP | POLLERR;
    constexpr short kOutSet = POLLOUT | POLLWRNORM | POLLWRBAND | POLLERR;
    constexpr short kExSet = POLLPRI;
    std::vector<pollfd> p;
    for (int fd = 0; fd < nfds; ++fd) {
        short ev = 0;
        if (rd && FD_ISSET(fd, rd)) ev |= POLLIN | POLLRDNORM | POLLRDBAND;
        if (wr && FD_ISSET(fd, wr)) ev |= POLLOUT | POLLWRNORM | POLLWRBAND;
        if (ex && FD_ISSET(fd, ex)) ev |= POLLPRI;
        if (ev) p.push_back({fd, ev, 0});
    }
    int r = poll_fds(p.data(), p.size(), timeout_ms, mask);
    if (r < 0) return r;
    for (const pollfd &f : p)
        if (f.revents & POLLNVAL) return -EBADF;
    if (rd) FD_ZERO(rd);
    if (wr) FD_ZERO(wr);
    if (ex) FD_ZERO(ex);
    int count = 0;
    for (const pollfd &f : p) {
        if (rd && (f.events & POLLIN) && (f.revents & kInSet)) FD_SET(f.fd, rd), ++count;
        if (wr && (f.events & POLLOUT) && (f.revents & kOutSet)) FD_SET(f.fd, wr), ++count;
        if (ex && (f.events & POLLPRI) && (f.revents & kExSet)) FD_SET(f.fd, ex), ++count;
    }
    return count;
}

// ---- epoll ------------------------------------------------------------------------

void epoll_created(int epfd) noexcept {
    std::call_once(sets_once, sets_init);
    if (!sets || epfd < 0 || epfd >= nsets) return;
    auto *set = new (std::nothrow) EpollSet;
    if (!set) return;
    set->epfd = epfd;
    std::lock_guard lock(sets_lock);
    if (EpollSet *old = sets[epfd].exchange(set)) set_release(old);
    live_sets.fetch_add(1, std::memory_order_release);
}

void epoll_fd_closed(int fd) noexcept {
    if (!sets || fd < 0 || fd >= nsets || !sets[fd].load(std::memory_order_acquire)) return;
    EpollSet *set;
    {
        std::lock_guard lock(sets_lock);
        set = sets[fd].exchange(nullptr);
    }
    if (set) set_release(set);
}

void epoll_fd_dup(int fd, int nfd) noexcept {
    EpollSet *set = set_acquire(fd);
    if (!set) return;
    if (nfd < 0 || nfd >= nsets) return set_release(set);
    std::lock_guard lock(sets_lock);
    if (EpollSet *old = sets[nfd].exchange(set)) set_release(old);
}

int epoll_control(int epfd, int op, int fd, epoll_event *ev) noexcept {
    EpollSet *set = set_acquire(epfd);
    Stream *s = set ? acquire(fd) : nullptr;
    if (s) s->claim_inherited();  // watching it is using it
    if (s && !s->conn.load(std::memory_order_acquire) &&
        s->phase.load(std::memory_order_acquire) == Phase::listener) {
        release(s);  // listeners stay with the kernel
        s = nullptr;
    }
    EpollSet *inner = set && !s && fd != epfd ? set_acquire(fd) : nullptr;
    if (!s && !inner) {
        if (set) set_release(set);
        return sys.epoll_ctl(epfd, op, fd, ev) == 0 ? 0 : -errno;
    }
    int r = 0;
    {
        std::lock_guard lock(set->lock);
        auto &v = set->entries;
        auto it = std::find_if(v.begin(), v.end(), [&](const Entry &e) {
            return e.fd == fd && (s ? e.s == s : e.inner == inner);
        });
        // The kernel has the registration in every case (trimmed or not):
        // its answer stands (EEXIST, ENOENT, EINVAL ...), except for MOD of
        // an exclusive entry, which it refuses but would accept on the
        // hint registration that replaced it.
        if (op == EPOLL_CTL_MOD && it != v.end() && (it->ev.events & EPOLLEXCLUSIVE)) {
            r = -EINVAL;
        } else if (sys.epoll_ctl(epfd, op, fd, ev) != 0) {
            r = -errno;
        } else if (op == EPOLL_CTL_ADD) {
            Entry e;
            e.fd = fd;
            e.s = s;
            e.inner = inner;
            e.ev = *ev;
            v.push_back(e);
            s = nullptr;  // the entry holds the references now
            inner = nullptr;
        } else if (op == EPOLL_CTL_MOD && it != v.end()) {
            if (it->ev.events & EPOLLEXCLUSIVE) {
                r = -EINVAL;
            } else {
                it->ev = *ev;
                it->trimmed = false;
                it->armed = true;
                it->seen_rx = it->seen_tx = ~0u;
            }
        } else if (op == EPOLL_CTL_DEL && it != v.end()) {
            entry_drop(*it);
            v.erase(it);
        }
        // A thread asleep in the kernel on this set looks at it again.
        if (set->kernel_sleeper) kernel_sleep_signal(set->wake_fd, &set->signalled);
    }
    if (s) release(s);
    if (inner) set_release(inner);
    set_release(set);
    // A thread blocked in epoll_wait on this set looks again.
    transport::wake_pollers();
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
        bool ours = false;
        {
            std::lock_guard lock(set->lock);
            for (const Entry &e : set->entries) ours |= e.s == hinted && e.trimmed;
        }
        if (ours) kernel_hint(hinted);
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
    return keep_events(set, out, k, hints, &woken);
}

bool epoll_peek(void *ctx) noexcept { return inner_ready(static_cast<EpollCtx *>(ctx)->set, 0); }

bool has_entries(EpollSet *set) noexcept {
    std::lock_guard lock(set->lock);
    return !set->entries.empty();
}

bool got_entries(void *ctx) noexcept { return has_entries(static_cast<EpollSet *>(ctx)); }

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
    ev.data.u64 = kWakeTag | (std::uint64_t(getpid()) & ~kTagMask);
    if (fd >= 0 && sys.epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        sys.close(fd);
        fd = -1;
    }
    set->wake_data.store(ev.data.u64, std::memory_order_relaxed);
    if (fd >= 0) set->tagged.store(true, std::memory_order_release);
    set->wake_fd.store(fd < 0 ? -2 : fd, std::memory_order_release);  // -2: do not try again
    return fd;
}

// The kernel's own epoll_wait on the set, when none of our sockets in it
// needs our state (kernel_sleep.hpp): the application's events (or
// -errno), or kNotHere. `again`: woken with nothing for the application.
int epoll_in_kernel(EpollSet *set, int epfd, epoll_event *out, int max, int timeout_ms,
                    const sigset_t *mask, bool *again) noexcept {
    *again = false;
    if (transport::Engine *e = transport::Engine::current(); e && e->flush_pending())
        return kNotHere;  // bytes owed by a leave wait for progress passes
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
                // A trimmed entry answers from our state; an inner set
                // may hold anything.
                ok = e.s && !e.trimmed && kernel_may_answer(e.s, &held);
                if (held) set->held.push_back(e.s);
                if (!ok) break;
            }
        }
    }
    int r = kNotHere;
    bool woken = false;
    if (ok) {
        const int k = mask ? sys.epoll_pwait(epfd, out, max, timeout_ms, mask)
                           : sys.epoll_wait(epfd, out, max, timeout_ms);
        if (k < 0) {
            r = -errno;
        } else {
            int hints = 0;
            r = keep_events(set, out, k, &hints, &woken);
            *again = k > 0 && r == 0;
        }
    }
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
int plain_wait(EpollSet *set, int epfd, epoll_event *out, int max, int timeout_ms,
               const sigset_t *mask) noexcept {
    const bool tagged = set && max > 0 && set->tagged.load(std::memory_order_acquire);
    const std::uint64_t deadline = deadline_of(timeout_ms);
    for (int left = timeout_ms;;) {
        const int k = mask ? sys.epoll_pwait(epfd, out, max, left, mask)
                           : sys.epoll_wait(epfd, out, max, left);
        if (k < 0) return -errno;
        if (!tagged || k == 0) return k;
        int hints = 0;
        bool woken = false;
        if (const int kept = keep_events(set, out, k, &hints, &woken); kept > 0) return kept;
        if ((left = ms_left(deadline, timeout_ms)) == 0) return 0;
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
        shadowed = !set->entries.empty();
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
            int w = transport::sleep_on_fds(engine, &k, 1, mask, left, got_entries, set);
            if (w == -EINTR || (w == -1 && errno == EINTR)) {
                set_release(set);
                return -EINTR;
            }
        }
        set_release(set);
        return 0;
    }
    if (!shadowed || max <= 0) {
        const int r = plain_wait(set, epfd, out, max, timeout_ms, mask);
        if (set) set_release(set);
        return r;
    }
    pollfd kfd{epfd, POLLIN, 0};
    EpollCtx ctx{set};
    int r = wait_loop(
        [&](bool ask_kernel) -> int {
            // The kernel's events and ours take turns going first, so that
            // a small maxevents serves every ready entry in turn.
            const bool kernel_first =
                ask_kernel && (set->turn.fetch_add(1, std::memory_order_relaxed) & 1);
            for (;;) {
                int n = 0, hints = 0, kernel = 0;
                settle(set);
                if (kernel_first) {
                    n = kernel_events(set, epfd, out, max, &hints);
                    if (n < 0) return n;
                    kernel = n;
                }
                scan(set, out, &n, max, &kernel);
                if (ask_kernel && !kernel_first && n < max) {
                    int k = kernel_events(set, epfd, out + n, max - n, &hints);
                    if (k < 0) return n ? n : k;
                    n += k;
                }
                if (n > 0 || !hints) return n;
                // Only hints: their sockets now report; look again.
            }
        },
        &kfd, 1, timeout_ms, mask, epoll_peek, &ctx);
    set_release(set);
    return r;
}

void epoll_after_fork_child() noexcept {
    kernel_sleeps_after_fork_child();
    // The child's shadows describe the parent's connections: forget them
    // (the sets are left as the kernel has them). A set's wake-up eventfd
    // stays registered while the parent holds it (the epoll instance is
    // shared): the child drops its copy, makes its own at its first
    // kernel sleep, and tells the two apart by the pid in their data.
    if (!sets) return;
    new (&sets_lock) std::mutex();
    for (int fd = 0; fd < nsets; ++fd)
        if (EpollSet *set = sets[fd].load(std::memory_order_relaxed)) {
            new (&set->lock) std::mutex();
            set->entries.clear();
            set->held.clear();  // the parent's references (fork_child recounted them)
            set->kernel_sleeper = false;
            set->signalled.store(false, std::memory_order_relaxed);
            if (int w = set->wake_fd.exchange(-1, std::memory_order_relaxed); w >= 0) sys.close(w);
        }
}

}  // namespace sd::fallback
