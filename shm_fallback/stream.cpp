#include "stream.hpp"


#include "table.hpp"

#include "transport/log.hpp"
#include "transport/memguard.hpp"
#include "transport/protocol.hpp"
#include "transport/rules.hpp"
#include "transport/settings.hpp"
#include "transport/sys.hpp"
#include "transport/wait.hpp"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <fcntl.h>
#include <cstring>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

namespace sd::fallback {

using transport::Conn;
using transport::ConnState;
using transport::kNoOffset;
using transport::MsgType;
using transport::monotonic_ns;
using transport::sys;

namespace {

constexpr int kMaxSlice = 64;

std::size_t iov_total(const iovec *iov, int n) noexcept {
    std::size_t t = 0;
    for (int i = 0; i < n; ++i) t += iov[i].iov_len;
    return t;
}

// out[] = the bytes [skip, skip + len) of iov[]; returns the count of
// entries (at most `max`, so the slice may come out shorter).
int slice(const iovec *iov, int n, std::size_t skip, std::size_t len, iovec *out,
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

std::size_t sliced(const iovec *v, int k) noexcept { return iov_total(v, k); }

// Copies n ring bytes starting at stream position `head` into the slice.
void ring_copy_out(const Conn *c, std::uint64_t head, const iovec *v, int k) noexcept {
    for (int i = 0; i < k; ++i) {
        auto *dst = static_cast<char *>(v[i].iov_base);
        std::size_t left = v[i].iov_len;
        while (left) {
            std::uint32_t at = std::uint32_t(head % c->ring_cap);
            std::size_t run = std::min<std::size_t>(left, c->ring_cap - at);
            std::memcpy(dst, c->ring + at, run);
            dst += run;
            left -= run;
            head += run;
        }
    }
}

bool readable(void *ctx) noexcept {
    auto *c = static_cast<Conn *>(ctx);
    std::lock_guard lock(c->rx_lock);
    return c->rx_ready() || c->fin_off != kNoOffset || c->broken ||
           c->state.load(std::memory_order_relaxed) == ConnState::final;
}

// The connection is leaving the fabric (ours or the peer's doing): a send
// lets go of the send lock, and the rest goes through the kernel.
bool leave_requested(const Conn *c) noexcept {
    return c->leave_wanted.load(std::memory_order_acquire) ||
           c->leave_due.load(std::memory_order_acquire) || !c->is_direct();
}

// A sender waiting for `need` bytes of credit.
struct CreditWait {
    Conn *c;
    std::int64_t need;
};

bool enough_credit(void *ctx) noexcept {
    auto *w = static_cast<CreditWait *>(ctx);
    if (leave_requested(w->c)) return true;
    std::lock_guard lock(w->c->rx_lock);
    return w->c->credits.load(std::memory_order_relaxed) >= w->need || w->c->gone();
}

// A zero-copy send waits for its reader; it gives way (cancels, the rest
// goes buffered) when its own side has unread bytes piling up: the peer
// may itself be blocked sending to us, and would never read.
bool zcopy_should_yield(Conn *c) noexcept {
    if (leave_requested(c)) return true;
    std::lock_guard lock(c->rx_lock);
    return c->zc.active || c->ring_bytes() >= c->ring_cap / 2;
}

bool zcopy_answered(void *ctx) noexcept {
    auto *c = static_cast<Conn *>(ctx);
    return c->zc_answer_off.load(std::memory_order_acquire) != kNoOffset || c->gone() ||
           zcopy_should_yield(c);
}

// Something arrived or changed that ends a recv's sink or needs the recv to
// end it (rx_lock held).
bool sink_event_locked(Conn *c) noexcept {
    return c->sink.done || c->sink.over || !c->sink.active || c->ring_bytes() || c->zc.active ||
           c->fin_off != kNoOffset || c->peer_end != kNoOffset || c->gone() || !c->is_direct() ||
           c->rx_expect() != c->sink.off;
}

// A recv waiting on its sink: written, or something else to look at.
bool sink_over(void *ctx) noexcept {
    auto *c = static_cast<Conn *>(ctx);
    std::lock_guard lock(c->rx_lock);
    return sink_event_locked(c);
}

bool state_changed(void *ctx) noexcept {
    return !static_cast<Conn *>(ctx)->upgrading();
}

// How long a read zero-copy advertisement waits for a reader whose read
// counter does not move.
constexpr std::uint64_t kReaderPatienceNs = 2'000'000;

// How long a non-blocking send waits for room in the peer's message queue
// (its control thread is kicked after 1 ms to make it): a peer that cannot
// run at all (stopped) must not hold it.
constexpr std::uint64_t kQueueWaitNs = 10'000'000;

// Watches the peer's read counter (its process page) during an
// advertisement: a reader copying our buffer, or bytes before it, is not
// kept waiting for; one that has done nothing for kReaderPatienceNs is.
class ReaderWatch {
  public:
    ReaderWatch(transport::Engine *e, const Conn *c, std::uint64_t now) noexcept
        : engine_(e), conn_(c), read_(e->peer_read(c)), moved_(now) {}
    bool idle(std::uint64_t now) noexcept {
        const std::uint64_t r = engine_->peer_read(conn_);
        if (r != read_) {
            read_ = r;
            moved_ = now;
        }
        return now - moved_ >= kReaderPatienceNs;
    }
    // When to look again: the patience's end, or `deadline` if sooner.
    std::uint64_t due(std::uint64_t deadline) const noexcept {
        const std::uint64_t end = moved_ + kReaderPatienceNs;
        return deadline && deadline < end ? deadline : end;
    }

  private:
    transport::Engine *engine_;
    const Conn *conn_;
    std::uint64_t read_;
    std::uint64_t moved_;
};

ssize_t epipe(int flags) noexcept {
    if (!(flags & MSG_NOSIGNAL)) raise(SIGPIPE);
    return -EPIPE;
}

int ms_until(std::uint64_t deadline) noexcept {
    if (!deadline) return -1;
    std::uint64_t now = monotonic_ns();
    return now >= deadline ? 0 : int((deadline - now + 999999) / 1000000);
}

// After our own sleep was interrupted: should the call go on?
bool keep_going_after_eintr(std::int64_t timeout_ns) noexcept {
    // A socket with a timeout always reports EINTR, as the kernel does.
    return timeout_ns == 0 && transport::restart_after_signal();
}

}  // namespace

void Stream::reset(int f, int dom, bool nb) noexcept {
    fd.store(f, std::memory_order_relaxed);
    {
        std::lock_guard lock(alias_lock);
        aliases.clear();
    }
    domain = dom;
    struct stat st;
    ino = fstat(f, &st) == 0 ? std::uint64_t(st.st_ino) : 0;
    fds.store(1, std::memory_order_relaxed);
    phase.store(Phase::fresh, std::memory_order_relaxed);
    nonblock.store(nb, std::memory_order_relaxed);
    nodelay.store(false, std::memory_order_relaxed);
    cork.store(false, std::memory_order_relaxed);
    rd_shut.store(false, std::memory_order_relaxed);
    kernel_wr_shut.store(false, std::memory_order_relaxed);
    rcvlowat.store(1, std::memory_order_relaxed);
    linger_reset.store(false, std::memory_order_relaxed);
    drew_reset.store(false, std::memory_order_relaxed);
    for_good.store(false, std::memory_order_relaxed);
    shut_second.store(false, std::memory_order_relaxed);
    rcvtimeo_ns.store(0, std::memory_order_relaxed);
    sndtimeo_ns.store(0, std::memory_order_relaxed);
    rcvbuf.store(0, std::memory_order_relaxed);
    conn.store(nullptr, std::memory_order_relaxed);
    engine = nullptr;
    next_free = nullptr;
    forked = false;
    orphan.store(false, std::memory_order_relaxed);
    orphan_lost.store(kNotLost, std::memory_order_relaxed);
    owner = 0;
    holders.store(nullptr, std::memory_order_relaxed);
    fork_mark = 0;
    share.store(nullptr, std::memory_order_relaxed);
    prefix.store(nullptr, std::memory_order_relaxed);
    share_check_ns = 0;
    pre_tx = pre_rx = 0;
    earn_ns = 0;
    earn_calls = 0;
    calls.store(0, std::memory_order_relaxed);
    held_fd.store(-1, std::memory_order_relaxed);
    fd_users.store(0, std::memory_order_relaxed);
    refs.store(1, std::memory_order_release);
}

void Stream::accepted() noexcept {
    acceptor = true;
    Phase p = Phase::fresh;
    phase.compare_exchange_strong(p, Phase::deferred);
}

void Stream::fork_prepare(unsigned mark) noexcept {
    if (fork_mark == mark) return;  // another fd of the same socket
    fork_mark = mark;
    Phase p = phase.load(std::memory_order_acquire);
    if (p == Phase::fresh || p == Phase::listener) return;
    forked = true;
    if (orphan.load(std::memory_order_relaxed)) {
        // Another process's connection: the child holds it too.
        if (Sharers *h = holders.load(std::memory_order_relaxed)) sharers_expect_child(h);
        return;
    }
    if (Conn *c = conn.load(std::memory_order_acquire)) {
        // Not direct yet: it stays with the kernel, shared from now on.
        if (engine) engine->hold(c);
        // Direct: it stays so until the child uses it; who holds it is
        // kept, for our last close.
        if (c->is_direct() || c->is_leaving()) {
            Sharers *h = holders.load(std::memory_order_relaxed);
            if (!h && (h = sharers_open(0, 0))) {
                holders.store(h, std::memory_order_relaxed);
                c->holder_counts.store(sharers_counts(h), std::memory_order_release);
            }
            if (h) sharers_expect_child(h);
            // Answered the peer's leave with its bytes unread: whoever
            // reads next gets them (the holders' counts start after them).
            if (h && c->is_leaving() && !prefix.load(std::memory_order_relaxed))
                if (Prefix *p = prefix_from_ring(c)) {
                    prefix.store(p, std::memory_order_release);
                    if (engine) engine->want_flush(c);
                }
            // Still direct: room for what a later answer to the peer's
            // leave would keep unread, in memory the child maps too.
            if (h && !prefix.load(std::memory_order_relaxed))
                if (Prefix *p = prefix_reserve(c)) prefix.store(p, std::memory_order_release);
        } else if (Sharers *h = left_holders(c)) {
            sharers_expect_child(h);  // left for sharing: one holder more
        }
        return;
    }
    // No connection yet: the holders keep count together, and the last
    // one left upgrades it; unless it is on TCP for good.
    if (for_good.load(std::memory_order_acquire)) return;
    std::lock_guard lock(pend_lock);
    if (earn_ns) {
        // Still earning its upgrade: no builder will come for it, and
        // the holder left last upgrades it from the shared counts.
        earn_ns = 0;
        pending.store(false, std::memory_order_release);
    }
    Sharers *sh = share.load(std::memory_order_relaxed);
    // The peer may wait for an upgrade that no holder makes while it is
    // shared: our entry tells it why (the last holder's replaces it).
    if (!sh) transport::mark_unattached(kfd(), transport::Reason::shared);
    if (!sh && !(sh = sharers_open(pre_tx, pre_rx))) return;
    share.store(sh, std::memory_order_release);
    sharers_expect_child(sh);
}

void Stream::fork_child(unsigned mark, int parent) noexcept {
    if (fork_mark == mark) return;
    fork_mark = mark;
    new (&pend_lock) std::mutex();
    kernel_waiters = wait_holds = 0;  // the threads blocked in the parent are not here
    new (&alias_lock) std::mutex();
    refs.store(fds.load(std::memory_order_relaxed), std::memory_order_relaxed);
    calls.store(0, std::memory_order_relaxed);  // the parent's threads are not ours
    next_free = nullptr;
    Phase p = phase.load(std::memory_order_relaxed);
    if (p == Phase::fresh || p == Phase::listener) return;
    // The parent's connection state stays the parent's: the kernel socket
    // is all the child has.
    Conn *c = conn.exchange(nullptr, std::memory_order_relaxed);
    // Our parent's connection left the fabric for sharing: its holders
    // count, and so do we.
    Sharers *left = c && engine ? left_holders(c) : nullptr;
    engine = nullptr;
    pending.store(false, std::memory_order_relaxed);
    earn_ns = 0;
    forked = true;
    if (c && (c->is_direct() || c->is_leaving() || c->state.load() == ConnState::initiating ||
              c->state.load() == ConnState::committing)) {
        // Its bytes travel through the parent's endpoint: the parent moves
        // it to the kernel when we use it (claim_inherited).
        orphan.store(true, std::memory_order_relaxed);
        owner = parent;
    }
    if (Sharers *sh = share.load(std::memory_order_relaxed)) sharers_born(sh, parent);
    if (Sharers *h = holders.load(std::memory_order_relaxed)) sharers_born(h, parent);
    if (left) {
        holders.store(nullptr, std::memory_order_relaxed);
        share.store(left, std::memory_order_relaxed);
    } else if (c && !orphan.load(std::memory_order_relaxed) &&
               !share.load(std::memory_order_relaxed)) {
        // On the kernel in the parent (held, or for good): its bytes there
        // were counted by nobody, so no holder here may upgrade it from
        // counts (a later fork of ours would start them at stale offsets).
        if (Sharers *sh = sharers_open(0, 0)) {
            sharers_stick(sh);
            share.store(sh, std::memory_order_relaxed);
        }
    }
    share_check_ns = 0;
    phase.store(Phase::deferred, std::memory_order_relaxed);
}

bool Stream::adopt_share(Sharers *sh) noexcept {
    // Still waiting for this process's engine (the builder clears pending).
    if (pending.load(std::memory_order_relaxed) || !sharers_alone(sh, &share_check_ns))
        return false;
    pre_tx = sharers_sent(sh);
    pre_rx = sharers_received(sh);
    sharers_leave(sh);
    share.store(nullptr, std::memory_order_release);
    forked = false;
    SD_LOG(debug, "fd %d: the only holder left after fork; upgrading at offsets %llu/%llu",
           kfd(), (unsigned long long)pre_tx, (unsigned long long)pre_rx);
    phase.store(Phase::deferred, std::memory_order_release);
    return true;
}

void Stream::drop_share() noexcept {
    std::lock_guard lock(pend_lock);
    if (Sharers *sh = share.exchange(nullptr, std::memory_order_acq_rel)) sharers_leave(sh);
}

Sharers *Stream::left_holders(Conn *c) const noexcept {
    Sharers *h = holders.load(std::memory_order_acquire);
    if (!h || !c->holder_counts.load(std::memory_order_acquire) || sharers_stuck(h) ||
        c->state.load(std::memory_order_acquire) != ConnState::final ||
        c->stat->reason.load(std::memory_order_relaxed) != std::uint32_t(transport::Reason::shared))
        return nullptr;
    return h;
}

bool Stream::rejoin_locked(Conn *c, Sharers *h) noexcept {
    // Its leave has added our offsets (the mark), and nobody else holds it.
    if (!sharers_left(h) || !sharers_alone(h, &share_check_ns)) return false;
    const std::uint64_t sent = sharers_sent(h), received = sharers_received(h);
    const bool back = engine->rejoin_locked(c, sent, received);
    holders.store(nullptr, std::memory_order_release);
    sharers_leave(h);
    forked = false;
    if (back)
        SD_LOG(debug, "fd %d: the only holder left after its leave; kernel mode at offsets "
                      "%llu/%llu until the peer upgrades it again",
               kfd(), (unsigned long long)sent, (unsigned long long)received);
    return true;
}

void Stream::fd_added(int nfd) noexcept {
    std::lock_guard lock(alias_lock);
    aliases.push_back(nfd);
}

void Stream::fd_removed(int gone) noexcept {
    std::lock_guard lock(alias_lock);
    if (fd.load(std::memory_order_relaxed) != gone) {
        std::erase(aliases, gone);
        return;
    }
    if (aliases.empty()) return;  // the last fd: the stream goes with it
    int next = aliases.back();
    aliases.pop_back();
    fd.store(next, std::memory_order_relaxed);
    if (transport::Conn *c = conn.load(std::memory_order_acquire))
        std::atomic_ref<std::int32_t>(c->stat->fd).store(next, std::memory_order_relaxed);
}

void Stream::connected(bool accepted) noexcept {
    Phase p = phase.load(std::memory_order_acquire);
    if (p != Phase::fresh && p != Phase::connecting && p != Phase::deferred) {
        // Another thread's first call attaches it: ours goes the same way,
        // not past a connection that is not there yet.
        while (phase.load(std::memory_order_acquire) == Phase::attaching) {
            timespec nap{0, 100000};
            nanosleep(&nap, nullptr);
        }
        return;
    }
    if (!phase.compare_exchange_strong(p, Phase::attaching)) return connected(accepted);
    acceptor = accepted;
    if (transport::rules_keep_fd_on_kernel(kfd(), accepted)) {
        // On TCP for good, before it touches the engine; the peer's
        // upgrade finds our entry and says why.
        for_good.store(true, std::memory_order_release);
        transport::mark_unattached(kfd(), transport::Reason::rule);
        SD_LOG(info, "fd %d stays on TCP: %s", kfd(),
               transport::rules().error[0] ? "the rules file is unusable" : "a rule says kernel");
        phase.store(Phase::attached, std::memory_order_release);
        return;
    }
    if (transport::settings().upgrade_after_ms) return start_earning();
    if ((engine = transport::Engine::wait_ready(transport::settings().engine_wait_ms))) {
        // pre_tx/pre_rx: bytes through the kernel before now (0 unless the
        // socket was shared through fork).
        conn.store(engine->attach(kfd(), acceptor, rcvbuf.load(std::memory_order_relaxed), pre_tx,
                                  pre_rx),
                   std::memory_order_release);
        phase.store(Phase::attached, std::memory_order_release);
        return;
    }
    std::lock_guard lock(pend_lock);
    refs.fetch_add(1, std::memory_order_relaxed);  // the builder's, until it is done
    pending.store(true, std::memory_order_release);
    if (!transport::Engine::when_ready(finish_pending_cb, this)) {
        pending.store(false, std::memory_order_release);
        refs.fetch_sub(1, std::memory_order_relaxed);
    }
    phase.store(Phase::attached, std::memory_order_release);
}

// Until the engine exists, the kernel carries the bytes. Once a connection
// has asked for its upgrade, the calls never block in the kernel (it may
// turn direct meanwhile, and a thread blocked in recv would never see the
// fabric); they poll instead. Before it asks, nothing can upgrade it but
// a call of ours (it is in no registry), so a blocking recv is the
// kernel's own, one system call as without the library, and holds the
// ask back until it returns (kernel_waiters).
ssize_t Stream::pending_io(const iovec *iov, int iovcnt, int flags, bool out,
                           std::size_t &done) noexcept {
    const bool nb = nonblock.load(std::memory_order_relaxed) || (flags & MSG_DONTWAIT);
    const std::int64_t tmo = (out ? sndtimeo_ns : rcvtimeo_ns).load(std::memory_order_relaxed);
    const std::uint64_t deadline = tmo ? monotonic_ns() + std::uint64_t(tmo) : 0;
    std::size_t total = iov_total(iov, iovcnt);
    done = 0;
    for (;;) {
        ssize_t n;
        {
            std::unique_lock lock(pend_lock);
            Sharers *sh = share.load(std::memory_order_relaxed);
            // Left the fabric for sharing: our connection is final, counted
            // for the holders (reads only; sends count under tx_lock).
            Conn *c = sh ? nullptr : conn.load(std::memory_order_acquire);
            Sharers *left = c && !out ? left_holders(c) : nullptr;
            bool redo;
            if (sh) {
                redo = adopt_share(sh);
            } else if (left) {
                // Alone now: kernel mode again, unless a send of ours holds
                // the connection (its next call does it).
                redo = c->tx_lock.try_lock();
                if (redo) {
                    redo = rejoin_locked(c, left);
                    c->tx_lock.unlock();
                }
            } else {
                redo = c || !pending.load(std::memory_order_relaxed);
            }
            if (redo) return -EALREADY;  // attached, or ours alone: redo
            iovec v[kMaxSlice];
            int k = slice(iov, iovcnt, done, total - done, v, kMaxSlice);
            if (!out && !nb && !sh && !left && earn_ns) {
                ++kernel_waiters;
                lock.unlock();
                // Like the recv of a connection on TCP for good: the
                // kernel waits, times out and restarts as it was asked.
                n = transport::kernel_readv(kfd(), v, k, flags);
                const int err = errno;
                lock.lock();
                --kernel_waiters;
                if (n > 0 && !(flags & MSG_PEEK)) {
                    // A fork while we waited made the socket shared: its
                    // holders count together from the counts at the fork.
                    if (Sharers *now = share.load(std::memory_order_relaxed)) {
                        sharers_count(now, false, std::uint64_t(n));
                    } else {
                        pre_rx += std::uint64_t(n);
                        if (earn_ns) ask_upgrade_locked();
                    }
                }
                if (n < 0) return done ? ssize_t(done) : -err;
                return ssize_t(done) + n;
            }
            n = on_kfd([&](int f) {
                return out ? transport::kernel_writev(f, v, k, flags | MSG_DONTWAIT)
                           : transport::kernel_readv(f, v, k, (flags & ~MSG_WAITALL) | MSG_DONTWAIT);
            });
            if (n > 0 && !(flags & MSG_PEEK)) {
                if (sh || left) {
                    sharers_count(sh ? sh : left, out, std::uint64_t(n));
                } else {
                    (out ? pre_tx : pre_rx) += std::uint64_t(n);
                    if (earn_ns) ask_upgrade_locked();
                }
                if (left) transport::bump(c->stat->rx_kernel, std::uint64_t(n));
            }
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return done ? ssize_t(done) : -errno;
        if (n == 0 && !out) return ssize_t(done);
        if (n > 0) {
            done += std::size_t(n);
            bool whole = out || (flags & MSG_WAITALL);
            if (!whole || done == total || (flags & MSG_PEEK)) return ssize_t(done);
            continue;
        }
        if (nb) return done ? ssize_t(done) : -EAGAIN;
        if (deadline && monotonic_ns() >= deadline) return done ? ssize_t(done) : -EAGAIN;
        pollfd p{kfd(), short(out ? POLLOUT : POLLIN), 0};
        int t = deadline ? std::min(10, ms_until(deadline)) : 10;
        if (sys.poll(&p, 1, t) < 0 && errno == EINTR && !keep_going_after_eintr(tmo))
            return done ? ssize_t(done) : -EINTR;
    }
}

Conn *Stream::attached_conn() noexcept {
    Phase p = phase.load(std::memory_order_acquire);
    if (p == Phase::connecting && !forked) {
        // Non-blocking connect: attach once the handshake is done.
        transport::Tuple t;
        if (transport::tuple_of(kfd(), t) == 0) connected(false);
    } else if ((p == Phase::deferred && !forked) || p == Phase::attaching) {
        connected(acceptor);
    }
    return conn.load(std::memory_order_acquire);
}

bool Stream::may_go_direct() const noexcept {
    Phase p = phase.load(std::memory_order_acquire);
    if (p == Phase::fresh || p == Phase::listener || orphan.load(std::memory_order_acquire))
        return false;
    if (Conn *c = conn.load(std::memory_order_acquire))
        return c->state.load(std::memory_order_acquire) != ConnState::final || left_holders(c);
    if (counting()) return true;
    // Connected, not attached yet: another thread's first call attaches it
    // (an application thread polling while another sends).
    return !forked && (p == Phase::connecting || p == Phase::deferred || p == Phase::attaching);
}

bool Stream::claim_inherited(int proof, transport::Reason why) noexcept {
    if (!orphan.load(std::memory_order_acquire)) return true;
    std::lock_guard lock(pend_lock);
    if (!orphan.load(std::memory_order_relaxed)) return true;
    if (orphan_lost.load(std::memory_order_relaxed) != kNotLost) return false;
    Sharers *h = holders.load(std::memory_order_relaxed);
    // Left already (its owner closed its copy, or another holder claimed
    // it): the counts say where the kernel took over.
    int rc = h && sharers_left(h) ? 0
                                  : transport::ask_owner_to_leave(owner, proof >= 0 ? proof : kfd(), why);
    if (rc == -ESRCH || rc == -ECONNRESET) {
        // The owner died before it moved the connection to the kernel
        // (or its peer died with bytes unread there): the bytes it held
        // died with it, and the kernel stream alone would go on past a
        // gap. What TCP gives for a connection that lost its bytes is a
        // reset: the kernel connection is reset too (connect(AF_UNSPEC)
        // sends the RST and keeps the descriptor), so the peer's kernel
        // side ends as ours does.
        SD_LOG(error, "fd %d: inherited from pid %d while on the fabric, and %s before moving it "
                      "back to the kernel: the connection is reset", kfd(), owner,
               rc == -ESRCH ? "that process died" : "the peer died with bytes unread there");
        sockaddr unspec{};
        unspec.sa_family = AF_UNSPEC;
        (void)sys.connect(kfd(), &unspec, sizeof unspec);
        orphan_lost.store(kLostUntold, std::memory_order_release);
        return false;
    }
    if (rc != 0) {
        static std::atomic<bool> said{false};
        if (!said.exchange(true))
            SD_LOG(error, "fd %d: inherited from pid %d while on the fabric, and that process "
                          "could not move it back to the kernel (%s): its I/O fails with EIO here",
                   kfd(), owner, std::strerror(-rc));
        return false;
    }
    SD_LOG(info, "fd %d: inherited from pid %d, which moved it back to the kernel", kfd(), owner);
    if (h && sharers_left(h)) {
        // Counted from now on, like a socket shared before its upgrade:
        // the last holder left upgrades it again.
        holders.store(nullptr, std::memory_order_relaxed);
        share.store(h, std::memory_order_release);
    } else if (h) {
        // Its owner's connection was off the fabric without adding its
        // offsets: nobody knows where the kernel took over, so no holder
        // may ever upgrade it from the counts.
        sharers_stick(h);
        holders.store(nullptr, std::memory_order_relaxed);
        share.store(h, std::memory_order_release);
    }
    orphan.store(false, std::memory_order_release);
    return true;
}

void Stream::before_exec(bool vforked, int kept) noexcept {
    Phase p = phase.load(std::memory_order_acquire);
    if (p == Phase::fresh || p == Phase::listener) return;
    if (orphan.load(std::memory_order_acquire)) {
        (void)claim_inherited(kept, transport::Reason::exec);
        return;
    }
    Conn *c = conn.load(std::memory_order_acquire);
    SD_LOG(debug, "fd %d before exec: phase %d, %s, state %d", kfd(), int(p),
           c ? "a connection" : "no connection", c ? int(c->state.load()) : -1);
    // Never used here: the peer may wait for an upgrade that cannot come.
    if (!c && (p == Phase::deferred || p == Phase::connecting))
        transport::mark_unattached(kfd(), transport::Reason::exec);
    if (!c || !engine) return;  // the kernel has it, and counts (if shared) stay ours
    ConnState st = c->state.load(std::memory_order_acquire);
    if (st == ConnState::direct || st == ConnState::leaving) {
        // In a vfork child, the process that owns the engine acts.
        if (vforked) (void)transport::ask_owner_to_leave(engine->pid(), kept, transport::Reason::exec);
        else if (const int rc = engine->leave(c, transport::Reason::exec); rc < 0)
            SD_LOG(error, "fd %d: before exec, the connection could not leave the fabric: %s",
                   kfd(), std::strerror(-rc));
    } else if (st != ConnState::final) {
        engine->hold(c, transport::Reason::exec);  // no upgrade from now on: the new program may not know of it
        // An upgrade under way that still ended direct leaves before the
        // new program starts (the peer would write into memory the exec
        // replaces).
        if (engine->settle_upgrade(c))
            if (const int rc = engine->leave(c, transport::Reason::exec); rc < 0)
                SD_LOG(error, "fd %d: before exec, the connection could not leave the fabric: %s",
                       kfd(), std::strerror(-rc));
    }
}

ssize_t Stream::orphan_error(bool out, int flags) noexcept {
    // Lost with its owner: the reset once (as a TCP socket's pending
    // error), then EOF for reads and EPIPE for writes. Otherwise the owner
    // lives and could not leave (its peer did not answer): EIO.
    int told = kLostUntold;
    if (orphan_lost.compare_exchange_strong(told, kLostTold, std::memory_order_acq_rel))
        return -ECONNRESET;
    if (told == kNotLost) return -EIO;
    return out ? epipe(flags) : 0;
}

void Stream::count_after_leave(std::uint64_t n) noexcept {
    // Read on the kernel after our connection left the fabric (final):
    // past the offset its leave gave the holders.
    if (Sharers *h = holders.load(std::memory_order_acquire)) sharers_count(h, false, n);
}

ssize_t Stream::kernel_recv(const iovec *iov, int iovcnt, int flags, Conn *c) noexcept {
    ssize_t n = on_kfd([&](int f) { return transport::kernel_readv(f, iov, iovcnt, flags); });
    if (n < 0) return -errno;
    if (c && engine) engine->judge_due(c);
    if (c && !(flags & MSG_PEEK)) {
        c->rx_off += std::uint64_t(n);
        c->stat->rx_kernel.fetch_add(std::uint64_t(n), std::memory_order_relaxed);
    }
    return n;
}

ssize_t Stream::recv_stream(const iovec *iov, int iovcnt, int flags) noexcept {
    if (kernel_only(flags)) {
        // Urgent data and the error queue are never carried on the fabric:
        // the companion socket answers (EINVAL or EAGAIN when it has
        // nothing, as on any TCP connection), and the stream stays intact.
        msghdr mh{};
        mh.msg_iov = const_cast<iovec *>(iov);
        mh.msg_iovlen = std::size_t(iovcnt);
        ssize_t n = sys.recvmsg(kfd(), &mh, flags);
        return n < 0 ? -errno : n;
    }
    if (!claim_inherited()) return orphan_error(false, flags);
    if (Prefix *p = prefix.load(std::memory_order_acquire)) {
        // Before anything the kernel socket holds.
        const ssize_t n = prefix_recv(p, iov, iovcnt, flags);
        const std::size_t total = iov_total(iov, iovcnt);
        if (n <= 0 || std::size_t(n) == total || !(flags & MSG_WAITALL)) {
            if (n != 0) return n;
        } else {
            iovec v[kMaxSlice];
            const int k = slice(iov, iovcnt, std::size_t(n), total - std::size_t(n), v, kMaxSlice);
            const ssize_t r = recv_stream(v, k, flags);
            return r < 0 ? n : n + r;
        }
    }
    Conn *c = attached_conn();
    // A redo can find the stream counting again: the last holder of a
    // socket shared through fork that adopted it may start by earning its
    // upgrade (pending), and its bytes must be counted from there too.
    for (int redo = 0; redo < 4 && ((!c && counting()) || (c && left_holders(c))); ++redo) {
        std::size_t done = 0;
        ssize_t n = pending_io(iov, iovcnt, flags, false, done);
        if (n != -EALREADY) return n;
        if (done) {
            // Attached in the middle of a MSG_WAITALL: the rest comes the new way.
            iovec v[kMaxSlice];
            int k = slice(iov, iovcnt, done, iov_total(iov, iovcnt) - done, v, kMaxSlice);
            ssize_t r = recv(v, k, flags);
            return r < 0 ? ssize_t(done) : ssize_t(done) + r;
        }
        c = attached_conn();
    }
    std::size_t total = iov_total(iov, iovcnt);
    if (!c || c->state.load(std::memory_order_acquire) == ConnState::final) {
        // On TCP for good: the kernel blocks as the application asked.
        // Only the counters are ours (no later switch needs rx_off).
        ssize_t n = transport::kernel_readv(kfd(), iov, iovcnt, flags);
        if (n < 0) return -errno;
        if (c && !(flags & MSG_PEEK)) {
            c->stat->rx_kernel.fetch_add(std::uint64_t(n), std::memory_order_relaxed);
            count_after_leave(std::uint64_t(n));
        }
        return n;
    }
    if (flags & MSG_TRUNC) return recv_discard(total, flags);
    // Shut for reading: what is there (TCP keeps taking bytes), else EOF
    // at once.
    const bool shut = rd_shut.load(std::memory_order_relaxed);
    const bool nb = shut || nonblock.load(std::memory_order_relaxed) || (flags & MSG_DONTWAIT);
    const std::size_t target = recv_target(total, flags);
    const std::int64_t tmo = rcvtimeo_ns.load(std::memory_order_relaxed);
    std::uint64_t deadline = tmo ? monotonic_ns() + std::uint64_t(tmo) : 0;
    std::uint64_t spin_until = 0;
    transport::SpinSlot slot;
    std::size_t done = 0;
    bool check_kernel = true;
    for (;;) {
        ssize_t r = try_recv(c, iov, iovcnt, done, total, flags, check_kernel);
        if (r == -ESTALE) {
            iovec v[kMaxSlice];
            int k = slice(iov, iovcnt, done, total - done, v, kMaxSlice);
            if (left_holders(c)) {
                // Left for sharing: counted for the holders, never blocking
                // in the kernel (this process may be left alone with it).
                ssize_t n = recv(v, k, flags);
                return n < 0 ? (done ? ssize_t(done) : n) : ssize_t(done) + n;
            }
            // Off the fabric now: the kernel has the rest, and blocks as
            // the application asked.
            ssize_t n = transport::kernel_readv(kfd(), v, k, flags);
            if (n < 0) return done ? ssize_t(done) : -errno;
            if (!(flags & MSG_PEEK)) {
                c->stat->rx_kernel.fetch_add(std::uint64_t(n), std::memory_order_relaxed);
                count_after_leave(std::uint64_t(n));
            }
            return ssize_t(done) + n;
        }
        if (r > 0) {
            done += std::size_t(r);
            if ((flags & MSG_PEEK) || done >= target) return ssize_t(done);
            spin_until = 0;
            continue;
        }
        if (r == 0) return ssize_t(done);
        if (r != -EAGAIN) return done ? ssize_t(done) : r;
        if (nb) return done ? ssize_t(done) : shut ? 0 : -EAGAIN;
        std::uint64_t now = monotonic_ns();
        if (!spin_until)
            spin_until = slot.start(now, std::uint64_t(transport::settings().spin_us) * 1000);
        if (deadline && now >= deadline) return done ? ssize_t(done) : -EAGAIN;
        // Write zero-copy: nothing to read, and a large buffer waits.
        const std::uint32_t sink_min = transport::settings().sink_min;
        if (!(flags & MSG_PEEK) && c->is_direct() && engine->sink_ok()) {
            iovec piece{};
            slice(iov, iovcnt, done, total - done, &piece, 1);
            if (piece.iov_len >= sink_min) {
                // The sink's wait spins on our slot (one waiter, one of
                // the host's slots), in a window of its own.
                ssize_t n = recv_sink(c, piece, deadline, tmo, slot);
                if (n != -EALREADY) spin_until = 0;
                if (n > 0) {
                    done += std::size_t(n);
                    if (done >= target) return ssize_t(done);
                    spin_until = 0;
                    continue;
                }
                if (n == -EINTR) return done ? ssize_t(done) : -EINTR;
                if (n == -EAGAIN) continue;  // look again, the usual way
            }
        }
        if (now < spin_until && c->is_direct()) {
            check_kernel = false;  // spin on the fabric only: no syscalls
            continue;
        }
        slot.release();
        check_kernel = true;
        const bool upgrading = c->upgrading();
        int w = transport::sleep_once(engine, c, kfd(), POLLIN | POLLRDHUP,
                                      upgrading ? state_changed : readable, c,
                                      ms_until(deadline));
        if (w == -EINTR && !keep_going_after_eintr(tmo)) return done ? ssize_t(done) : -EINTR;
    }
}

ssize_t Stream::try_recv(Conn *c, const iovec *iov, int iovcnt, std::size_t skip,
                         std::size_t total, int flags, bool check_kernel) noexcept {
    engine->progress();
    std::unique_lock lock(c->rx_lock);
    for (int round = 0; round < 2; ++round) {
        if (c->broken) return -ECONNRESET;
        if (c->state.load(std::memory_order_acquire) == ConnState::final) return -ESTALE;
        iovec v[kMaxSlice];
        if (c->rx_off < c->switch_off) {
            // Bytes still due on the companion socket: before the peer's
            // switch point, or the peer has not switched at all.
            if (!check_kernel) return -EAGAIN;
            std::uint64_t due = c->switch_off - c->rx_off;
            int k = slice(iov, iovcnt, skip, std::min<std::uint64_t>(total - skip, due), v, kMaxSlice);
            ssize_t n = kernel_recv(v, k, (flags & MSG_PEEK) | MSG_DONTWAIT, c);
            if (n != 0 || c->switch_off != kNoOffset) return n;
            // Kernel EOF with no switch point known: the peer may have
            // moved to the fabric and closed; its messages precede its FIN.
            lock.unlock();
            engine->progress_blocking();
            lock.lock();
            if (c->switch_off == kNoOffset) return 0;
            continue;
        }
        if (c->peer_end != kNoOffset && c->rx_off >= c->peer_end && !c->ring_bytes() &&
            !c->zc.active) {
            // The peer's fabric stream is over and read: the kernel's turn.
            const bool final = c->settle_left_locked();
            if (!c->rearm) {
                if (final) return -ESTALE;  // the kernel alone, blocking as asked
            } else if (c->rearm_due.load(std::memory_order_acquire)) {
                engine->want_flush(c);  // kernel mode again, with both locks
            }
            // Until then: counted (an upgrade later starts at rx_off), and
            // never blocking in the kernel (the fabric may come back).
            if (!check_kernel) return -EAGAIN;
            int k = slice(iov, iovcnt, skip, total - skip, v, kMaxSlice);
            return kernel_recv(v, k, (flags & MSG_PEEK) | MSG_DONTWAIT, c);
        }
        if (std::uint64_t avail = c->ring_bytes()) {
            int k = slice(iov, iovcnt, skip, std::min<std::uint64_t>(total - skip, avail), v,
                          kMaxSlice);
            std::size_t n = sliced(v, k);
            if (!transport::guarded([&] { ring_copy_out(c, c->ring_head, v, k); }))
                return -EFAULT;  // nothing consumed
            if (!(flags & MSG_PEEK)) {
                c->ring_head += n;
                c->rx_off += n;
                c->unreturned.fetch_add(std::uint32_t(n), std::memory_order_relaxed);
                c->show_flow(true);
                lock.unlock();
                engine->maybe_return_credits(c);
            }
            return ssize_t(n);
        }
        if (c->zc.active && c->rx_off == c->zc.off + c->zc.done)
            return skip == total ? 0 : read_advert(c, lock, iov, iovcnt, skip, total, flags);
        if (c->fin_off != kNoOffset && c->rx_off >= c->fin_off)
            // A reset after the peer's FIN is the next send's to report.
            return c->reset_after_fin.load(std::memory_order_acquire) ? 0 : -c->take_reset();
        if (!check_kernel) return -EAGAIN;
        // Nothing on the fabric. A companion at EOF without a fabric FIN
        // means the peer process is gone: deliver what arrived, then EOF.
        char probe;
        ssize_t n = on_kfd([&](int f) { return sys.recv(f, &probe, 1, MSG_PEEK | MSG_DONTWAIT); });
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
            // The kernel reset the connection (the peer's exit closed its
            // socket with bytes of ours unread there): the probe took the
            // error, which the kernel reports once; it is ours to report.
            if (n < 0 && errno == ECONNRESET) c->note_reset();
            if (round == 1) {
                // The peer is gone or closed without a word: sending to it
                // fails from now on, as after a reset.
                if (!engine->peer_alive(c->peer)) engine->peer_died(c);
                if (int e = c->take_reset()) return -e;
                return n == 0 ? 0 : -errno;
            }
            lock.unlock();
            engine->progress_blocking();
            lock.lock();
            continue;
        }
        return -EAGAIN;
    }
    return -EAGAIN;
}

ssize_t Stream::recv_sink(Conn *c, const iovec &piece, std::uint64_t deadline,
                          std::int64_t tmo, transport::SpinSlot &slot) noexcept {
    const auto len = std::uint32_t(std::min<std::size_t>(piece.iov_len, transport::kMaxSink));
    // A bad buffer: the usual way reports EFAULT when bytes come.
    if (!transport::writable(piece.iov_base, len)) return -EALREADY;
    if (engine->advertise_sink(c, piece.iov_base, len) != 0) return -EALREADY;
    const std::uint64_t spin_until =
        slot.start(monotonic_ns(), std::uint64_t(transport::settings().spin_us) * 1000);
    // Waiting for the peer's word: it claimed the sink (one host) or was
    // asked to end it (registered); only that word, or its loss, ends it.
    bool asked = false;
    std::uint64_t asked_at = 0;
    bool interrupted = false;
    // Every way out: the sink is over (deregistered), its bytes counted.
    auto over = [&]() -> ssize_t {
        const std::uint32_t got = engine->finish_sink(c);
        return got ? ssize_t(got) : interrupted ? -EINTR : -EAGAIN;
    };
    for (;;) {
        engine->progress();
        bool ended, other;
        {
            std::lock_guard lock(c->rx_lock);
            ended = c->sink.done || c->sink.over || !c->sink.active;
            other = sink_event_locked(c);
        }
        if (ended) return over();
        if (asked) {
            if (engine->sink_writer_lost(c, asked_at)) return over();
            (void)transport::sleep_once(engine, c, -1, 0, sink_over, c, 10);
            continue;
        }
        const std::uint64_t now = monotonic_ns();
        // The companion socket too: its EOF or error (the peer died) is
        // for the usual way to sort out.
        bool end = other || (deadline && now >= deadline);
        if (!end && now >= spin_until) {
            slot.release();
            pollfd p{kfd(), POLLIN | POLLRDHUP, 0};
            end = sys.poll(&p, 1, 0) > 0;
            if (!end) {
                int w = transport::sleep_once(engine, c, kfd(), POLLIN | POLLRDHUP, sink_over, c,
                                              ms_until(deadline));
                end = interrupted = w == -EINTR && !keep_going_after_eintr(tmo);
            }
        }
        if (!end) continue;
        if (engine->cancel_sink(c) == 0) return over();
        asked = true;
        asked_at = monotonic_ns();
    }
}

ssize_t Stream::read_advert(Conn *c, transport::RxLock &lock, const iovec *iov, int iovcnt,
                            std::size_t skip, std::size_t total, int flags) noexcept {
    // Another thread of ours is reading it: its wake-up brings us back.
    if (c->zc.busy) return -EAGAIN;
    iovec v[kMaxSlice];
    std::size_t want = std::min<std::size_t>(total - skip, c->zc.len - c->zc.done);
    int k = slice(iov, iovcnt, skip, want, v, std::min(kMaxSlice, engine->rma_iov_limit()));
    std::size_t n = sliced(v, k);
    // The kernel would fault on a bad buffer before taking a byte.
    for (int i = 0; i < k; ++i)
        if (!transport::writable(v[i].iov_base, v[i].iov_len)) return -EFAULT;
    const std::uint64_t addr = c->zc.addr + c->zc.done, key = c->zc.key;
    c->zc.busy = true;
    lock.unlock();
    int rc = engine->read_remote(c, v, k, addr, key, n);
    lock.lock();
    c->zc.busy = false;
    if (rc == -ENOKEY) {
        // Not registered, and the kernel refuses to let us read it: the
        // sender registers from now on; this advertisement ends unread
        // (its send goes on buffered).
        std::uint64_t answer_off = kNoOffset;
        std::uint32_t answer_len = 0;
        engine->need_key(c);
        transport::Engine::finish_advert_locked(c, &answer_off, &answer_len);
        c->wake_locked();
        lock.unlock();
        engine->answer_advert(c, answer_off, answer_len);
        lock.lock();
        return -EAGAIN;
    }
    if (rc) {
        // The sender's memory is gone (it died, or the advert was torn
        // down under us): the stream cannot go on.
        SD_LOG(info, "fd %d: reading the peer's advertised buffer failed: %s", kfd(),
               std::strerror(-rc));
        c->broken = true;
        c->wake_locked();
        return -ECONNRESET;
    }
    std::uint64_t answer_off = kNoOffset;
    std::uint32_t answer_len = 0;
    if (!(flags & MSG_PEEK)) {
        c->zc.done += std::uint32_t(n);
        c->rx_off += n;
        transport::bump(c->stat->rx_fabric, n);
        transport::bump(c->stat->rx_zcopy, n);
    }
    if (c->zc.done == c->zc.len || c->zc.cancel)
        transport::Engine::finish_advert_locked(c, &answer_off, &answer_len);
    c->wake_locked();  // readers that found it busy
    lock.unlock();
    if (answer_off != kNoOffset) engine->answer_advert(c, answer_off, answer_len);
    return ssize_t(n);
}

long Stream::send_zcopy(Conn *c, const char *buf, std::uint32_t len, std::uint64_t deadline,
                        int *cut) noexcept {
    transport::RegCache::Ref reg;
    const std::uint64_t off = c->tx_off;
    if (int rc = engine->advertise(c, buf, len, &reg)) return rc;
    bool cancelled = false;
    // A cancellation for the caller (timeout, signal): when it was asked,
    // and when the reader's control thread was last kicked for its answer.
    std::uint64_t asked = 0, kicked = 0;
    long result = 0;
    // The reader copies our buffer now: spin for about as long as that
    // takes (len / 4 ns: 4 GB/s), not only the usual spin, so that the
    // answer does not find us asleep (a wake-up costs more than the spin).
    transport::SpinSlot slot;
    const std::uint64_t spin_until =
        slot.start(monotonic_ns(), std::uint64_t(transport::settings().spin_us) * 1000 +
                                       std::min<std::uint64_t>(len / 4, 2'000'000));
    // A reader that does not come: the kernel's send buffer would have
    // taken these bytes without it, and a program may well wait for this
    // send before it tells its peer to read. So the advertisement lasts
    // while the reader reads (its read counter moves); once it has been
    // still for kReaderPatienceNs the advertisement is cancelled and the
    // rest goes buffered, as far as the window takes it.
    ReaderWatch reader(engine, c, monotonic_ns());
    for (;;) {
        engine->progress();
        if (c->zc_answer_off.load(std::memory_order_acquire) == off) {
            result = long(c->zc_answer_len.load(std::memory_order_relaxed));
            break;
        }
        engine->maybe_return_credits(c);
        if (c->gone() || !engine->peer_alive(c->peer)) {
            // The reader is gone. What it read of the buffer was sent, as
            // by a TCP send cut short (its counters say how much: every
            // fabric byte of ours before the advertisement was read
            // first); if nothing, the send fails.
            const std::uint64_t read = engine->peer_read(c);
            const std::uint64_t before =
                c->stat->tx_fabric.load(std::memory_order_relaxed) - c->tx_fabric_base;
            result = read != kNoOffset && read > before
                         ? long(std::min<std::uint64_t>(read - before, len))
                         : -EPIPE;
            break;
        }
        if (!cancelled && zcopy_should_yield(c)) {
            cancelled = engine->cancel_advert(c, off) == 0;
            continue;
        }
        std::uint64_t now = monotonic_ns();
        if (!cancelled && reader.idle(now)) {
            cancelled = engine->cancel_advert(c, off) == 0;
            asked = now;
            continue;
        }
        if (deadline && now >= deadline && !cancelled) {
            // SO_SNDTIMEO: what was read counts; the rest goes buffered,
            // as far as the window takes it (the kernel's send buffer
            // would have taken it too), or the send times out there.
            cancelled = engine->cancel_advert(c, off) == 0;
            asked = now;
            continue;
        }
        // No answer yet: the reader may be busy outside the library, so
        // its control thread answers the cancellation.
        const std::uint64_t kick_at = asked ? engine->kick_overdue(c->peer, asked, &kicked) : 0;
        if (now < spin_until) continue;
        slot.release();
        int w = transport::sleep_once(engine, c, -1, 0, zcopy_answered, c,
                                      kick_at     ? ms_until(kick_at)
                                      : cancelled ? -1
                                                  : ms_until(reader.due(deadline)));
        if (w == -EINTR && !cancelled &&
            !keep_going_after_eintr(sndtimeo_ns.load(std::memory_order_relaxed))) {
            // As a TCP send hit by a signal: what was taken counts, the
            // rest is not sent. The reader may be copying right now, so the
            // answer (how much) must come before we return.
            *cut = -EINTR;
            cancelled = engine->cancel_advert(c, off) == 0;
            asked = monotonic_ns();
        }
    }
    engine->release_advert(reg);
    if (result > 0) {
        c->tx_off += std::uint64_t(result);
        transport::bump(c->stat->tx_fabric, std::uint64_t(result));
        transport::bump(c->stat->tx_zcopy, std::uint64_t(result));
    }
    return result;
}

ssize_t Stream::kernel_send(const iovec *iov, int iovcnt, int flags, Conn *c) noexcept {
    ssize_t n = transport::kernel_writev(kfd(), iov, iovcnt, flags);
    if (n < 0) return -errno;
    if (c && engine) engine->judge_due(c);
    if (c) {
        c->tx_off += std::uint64_t(n);
        transport::bump(c->stat->tx_kernel, std::uint64_t(n));
    }
    return n;
}

ssize_t Stream::send_stream(const iovec *iov, int iovcnt, int flags) noexcept {
    if (!claim_inherited()) return orphan_error(true, flags);
    if (flags & MSG_OOB) leave_for_urgent();
    Conn *c = attached_conn();
    // As in recv_stream: an adopted share may be counting again.
    for (int redo = 0; redo < 4 && !c && counting(); ++redo) {
        std::size_t done = 0;
        ssize_t n = pending_io(iov, iovcnt, flags, true, done);  // the kernel raised SIGPIPE
        if (n != -EALREADY) return n;
        if (done) {
            // Attached in the middle of this send: the rest goes the new way,
            // after the bytes the kernel already took.
            iovec v[kMaxSlice];
            int k = slice(iov, iovcnt, done, iov_total(iov, iovcnt) - done, v, kMaxSlice);
            ssize_t r = send(v, k, flags);
            return r < 0 ? ssize_t(done) : ssize_t(done) + r;
        }
        c = attached_conn();
    }
    if (!c) return kernel_send(iov, iovcnt, flags, nullptr);
    const std::size_t total = iov_total(iov, iovcnt);
    std::size_t done = 0;
    for (;;) {
        std::unique_lock tx(c->tx_lock);
        // The caller's iov as it is, or (after a leave cut a send short)
        // what is left of it.
        iovec rest[kMaxSlice];
        const iovec *v = iov;
        int k = iovcnt;
        if (done) {
            k = slice(iov, iovcnt, done, total - done, rest, kMaxSlice);
            v = rest;
        }
        if (!c->is_direct() || total == 0) {
            if (wr_shut(c) && c->is_direct()) return epipe(flags);
            if (c->gone() && c->is_direct()) return send_nothing(c, flags);
            if (c->leave_under_way()) {
                // Left the fabric: what is owed to the kernel goes first.
                const bool nb = nonblock.load(std::memory_order_relaxed) || (flags & MSG_DONTWAIT);
                const std::int64_t tmo = sndtimeo_ns.load(std::memory_order_relaxed);
                int rc = engine->leave_flush_locked(c, !nb, tmo ? monotonic_ns() + std::uint64_t(tmo) : 0);
                if (rc == -EPIPE || rc == -ECONNRESET) return done ? ssize_t(done) : epipe(flags);
                if (rc) return done ? ssize_t(done) : rc;
            }
            if (Sharers *h = left_holders(c)) {
                std::lock_guard pend(pend_lock);
                (void)rejoin_locked(c, h);  // alone: kernel mode, counted by c
            }
            ssize_t r = kernel_send(v, k, flags, c);
            // Left for sharing: the holders count past our offsets (added
            // under this lock when the mark was set).
            Sharers *h = holders.load(std::memory_order_acquire);
            if (r > 0 && h && sharers_left(h)) sharers_count(h, true, std::uint64_t(r));
            // The upgrade finished while this send held the lock: the peer
            // must still learn our switch point, or its readiness (EPOLLOUT
            // after a full window) keeps asking an idle kernel socket.
            if (c->is_direct()) engine->announce_switch_locked(c);
            if (r < 0) return done ? ssize_t(done) : r;
            return ssize_t(done) + r;
        }
        bool left = false;
        ssize_t r = direct_send(c, v, k, done ? sliced(v, k) : total, flags, &left);
        if (r > 0) engine->sent_past_fin_locked(c);
        // An error told is the reset drawn: no later send is taken silently.
        if (r == -EPIPE || r == -ECONNRESET) drew_reset.store(true, std::memory_order_release);
        if (!left) return r < 0 && done ? ssize_t(done) : (r < 0 ? r : ssize_t(done) + r);
        if (r > 0) done += std::size_t(r);
        const bool nb = nonblock.load(std::memory_order_relaxed) || (flags & MSG_DONTWAIT);
        if (done == total || (done && nb)) return ssize_t(done);
        // The connection leaves the fabric: let the leave through, then the
        // rest goes the kernel's way.
        tx.unlock();
        while (c->leave_wanted.load(std::memory_order_acquire) && c->is_direct()) {
            engine->progress();
            timespec nap{0, 20000};
            nanosleep(&nap, nullptr);
        }
    }
}

int Stream::wait_credit(Conn *c, std::uint64_t deadline, std::int64_t need) noexcept {
    transport::SpinSlot slot;
    const std::uint64_t spin_until =
        slot.start(monotonic_ns(), std::uint64_t(transport::settings().spin_us) * 1000);
    CreditWait want{c, need};
    for (;;) {
        engine->progress();
        // A leave first: it needs the send lock we hold, and the peer
        // waiting for our answer returns no credits meanwhile.
        if (leave_requested(c)) return -ESTALE;
        if (c->credits.load(std::memory_order_acquire) >= need) return 0;
        // Credits our reader owes the peer go out too: if both sides wait
        // for credits, each must return what it has consumed.
        engine->maybe_return_credits(c);
        if (c->gone()) return -EPIPE;
        if (!engine->peer_alive(c->peer)) return -EPIPE;
        std::uint64_t now = monotonic_ns();
        if (deadline && now >= deadline) return -EAGAIN;
        if (now < spin_until) continue;
        slot.release();
        int w = transport::sleep_once(engine, c, -1, 0, enough_credit, &want, ms_until(deadline));
        if (w == -EINTR && !keep_going_after_eintr(sndtimeo_ns.load(std::memory_order_relaxed)))
            return -EINTR;
    }
}

std::int64_t Stream::credit_after_progress(Conn *c, std::size_t need) noexcept {
    std::int64_t credit = c->credits.load(std::memory_order_acquire);
    if (credit >= std::int64_t(need)) return credit;
    // Credits the reader returned may wait in our queue: only a progress
    // pass takes them in, and a sender that neither polls nor reads (it
    // retries after a sleep) would otherwise never see them.
    engine->progress();
    return c->credits.load(std::memory_order_acquire);
}

int Stream::send_failed(Conn *c, int rc) noexcept {
    // A write into the peer's ring failed while the peer lives: it closed
    // (its ring is out of reach), and its CLOSE, posted before, waits in
    // our queue.
    if (rc == -EIO) {
        engine->progress_blocking();
        if (c->gone()) rc = -EPIPE;
    }
    if (rc == -EPIPE && !c->tx_fin) {
        if (int e = c->take_reset()) rc = -e;
        // Its CLOSE came only now: this is the send that TCP takes (0).
        else if (first_send_to_closed(c)) rc = 0;
    }
    return rc;
}

int Stream::post_data(Conn *c, const iovec *iov, int iovcnt, std::uint32_t len,
                      std::uint64_t deadline) noexcept {
    // Protocol choice, in one place: large pieces are written straight into
    // the peer's ring (one copy), small ones travel inline in the message.
    int rc = len > engine->chunk() ? engine->post_ring(c, iov, iovcnt, len, deadline)
                                   : engine->post(c, MsgType::data, iov, iovcnt, len, c->tx_off,
                                                  deadline);
    if (rc) return rc;
    engine->sent_into_ring(c, len);
    return 0;
}

int Stream::flush_locked(Conn *c, bool blocking, std::uint64_t deadline) noexcept {
    while (c->staged) {
        if (c->credits.load(std::memory_order_acquire) < std::int64_t(c->staged)) {
            if (!blocking) {
                engine->want_flush(c);
                return -EAGAIN;
            }
            // All of the stage goes in one message: wait for that much.
            if (int w = wait_credit(c, deadline, std::int64_t(c->staged))) {
                if (w == -EAGAIN || w == -EINTR) engine->want_flush(c);
                return w;
            }
            continue;
        }
        if (int rc = engine->post_stage_locked(c, deadline)) {
            if (rc == -EAGAIN) engine->want_flush(c);
            return rc;
        }
    }
    return 0;
}

ssize_t Stream::direct_send(Conn *c, const iovec *iov, int iovcnt, std::size_t total,
                            int flags, bool *left) noexcept {
    if (leave_requested(c)) {
        *left = true;
        return -ESTALE;
    }
    if (c->gone() || wr_shut(c)) {
        SD_LOG(debug, "fd %d: send refused: %s", kfd(),
               wr_shut(c) ? "shut down for writing" : c->broken ? "connection broken" : "peer closed");
        if (int e = wr_shut(c) ? 0 : c->take_reset()) return e == EPIPE ? epipe(flags) : -e;
        if (first_send_to_closed(c)) return ssize_t(total);  // to nobody, as TCP's
        return epipe(flags);
    }
    if (!c->tx_fabric) {
        c->tx_fabric = true;
        SD_LOG(debug, "fd %d: send switch point at offset %llu", kfd(),
               (unsigned long long)c->tx_off);
    }
    const bool nb = nonblock.load(std::memory_order_relaxed) || (flags & MSG_DONTWAIT);
    const std::int64_t tmo = sndtimeo_ns.load(std::memory_order_relaxed);
    const std::uint64_t deadline = tmo ? monotonic_ns() + std::uint64_t(tmo) : 0;
    // Messages wait for room in the peer's queue until this: a full queue
    // is a full window to a non-blocking send (EAGAIN), if only briefly.
    const std::uint64_t post_by = nb ? monotonic_ns() + kQueueWaitNs : deadline;
    const std::uint32_t chunk = engine->chunk();

    // MSG_MORE and TCP_CORK hold nothing back: a byte send() accepted must
    // be in the peer's ring (or on its way there in the provider's queue)
    // before send returns, or it would die with this process, where the
    // kernel's corked bytes survive it. Combining would save messages only.
    // Write zero-copy: the peer's recv waits on its own buffer for these
    // bytes; the rest (if any) goes the usual way. To a peer that
    // advertises, a large send looks at the fabric first: an advertisement
    // that came while the caller was busy (copying what it read, or
    // sleeping) would otherwise be found only after our own bytes had
    // crossed it. Before the first one is seen, a process that advertises
    // itself looks too: its peers most likely run with its settings, and a
    // pure sender would otherwise never take in an advertisement at all.
    if (!c->staged && total > chunk &&
        (c->psink_seen.load(std::memory_order_relaxed) || engine->sink_ok()))
        engine->progress();
    if (!c->staged && c->psink_valid.load(std::memory_order_acquire)) {
        long r = engine->take_sink(c, iov, iovcnt, total);
        if (r == -EPIPE) return epipe(flags);
        if (r < 0) return r;
        if (std::size_t(r) == total) return r;
        if (r > 0) {
            iovec rest[kMaxSlice];
            int k = slice(iov, iovcnt, std::size_t(r), total - std::size_t(r), rest, kMaxSlice);
            ssize_t more_sent = direct_send(c, rest, k, sliced(rest, k), flags, left);
            return more_sent > 0 ? r + more_sent : r;
        }
    }
    if (!c->staged && total <= chunk && credit_after_progress(c, total) >= std::int64_t(total)) {
        // The common small write: straight from the caller's buffer.
        iovec v[3];
        int k = slice(iov, iovcnt, 0, total, v, 3);
        if (sliced(v, k) == total) {
            if (!transport::readable_iov(v, k, total)) return -EFAULT;
            int rc = post_data(c, v, k, std::uint32_t(total), post_by);
            if (rc == 0) {
                engine->ring(c->peer);
                return ssize_t(total);
            }
            rc = send_failed(c, rc);
            if (rc == 0) return ssize_t(total);  // to nobody, as TCP's
            if (rc == -EPIPE) return epipe(flags);
            if (rc != -EAGAIN) return rc;
        }
    }
    if (int rc = flush_locked(c, !nb, deadline)) {
        if (rc == -EPIPE) return epipe(flags);
        *left = rc == -ESTALE;
        return rc;
    }

    std::size_t sent = 0;
    int rc = 0;
    bool interrupted = false;  // by a signal, in read zero-copy: no more waiting
    // Read zero-copy only for blocking sends (the peer reads them straight
    // from the caller's buffer while we wait, at most until SO_SNDTIMEO's
    // deadline); which pieces: transport/protocol.hpp.
    bool zc_ok = !nb && engine->can_read() && total > transport::settings().chunk;
    while (sent < total) {
        if (leave_requested(c)) {
            rc = -ESTALE;
            break;
        }
        // The peer's recv advertised its buffer meanwhile: straight into it.
        if (c->psink_valid.load(std::memory_order_acquire) && !c->staged) {
            iovec rest[kMaxSlice];
            int k = slice(iov, iovcnt, sent, total - sent, rest, kMaxSlice);
            long r = engine->take_sink(c, rest, k, sliced(rest, k));
            if (r < 0) {
                rc = int(r);
                break;
            }
            if (r > 0) {
                sent += std::size_t(r);
                continue;
            }
        }
        if (zc_ok) {
            // The rest of the iov piece we are in.
            iovec piece{};
            slice(iov, iovcnt, sent, total - sent, &piece, 1);
            // Not to a peer of another uid: its read would go through the
            // provider's SAR buffers (two copies, no gain), and with ring
            // writes going through them the other way an echo between
            // users hung in 2 of 10 runs (none in 10 without zero-copy).
            if (transport::use_zcopy(piece.iov_len) && !(c->peer && c->peer->cross)) {
                const char *p = static_cast<const char *>(piece.iov_base);
                std::uint32_t len = std::uint32_t(std::min<std::size_t>(piece.iov_len, 1u << 30));
                if (!transport::readable(p, len)) {
                    rc = -EFAULT;
                    break;
                }
                int cut = 0;
                long r = send_zcopy(c, p, len, deadline, &cut);
                if (r < 0) {
                    rc = int(r);
                    break;
                }
                sent += std::size_t(r);
                if (cut) {
                    // A signal: what was read counts; if nothing was, what
                    // the window takes now without waiting, as the
                    // kernel's send buffer would have; else EINTR.
                    if (r > 0) break;
                    interrupted = true;
                    zc_ok = false;
                    continue;
                }
                // Cut short (the peer had to be let through): the rest of
                // this send goes buffered.
                if (std::uint32_t(r) < len) zc_ok = false;
                continue;
            }
        }
        std::int64_t credit = credit_after_progress(c, 1);
        if (credit <= 0) {
            engine->ring(c->peer);
            if (nb || interrupted) {
                rc = interrupted ? -EINTR : -EAGAIN;
                break;
            }
            if ((rc = wait_credit(c, deadline))) break;
            continue;
        }
        std::size_t left = total - sent;
        bool rma = c->peer_ring_addr && transport::use_ring(left, credit);
        std::size_t n = rma ? std::min<std::size_t>({left, std::size_t(credit), c->peer_ring_cap / 2})
                            : std::min<std::size_t>({left, chunk, std::size_t(credit)});
        iovec v[4];
        // At most three pieces fit beside an inline header; four in a write.
        int k = slice(iov, iovcnt, sent, n, v, rma ? 4 : 3);
        n = sliced(v, k);
        if (!transport::readable_iov(v, k, n)) {
            rc = -EFAULT;
            break;
        }
        if ((rc = post_data(c, v, k, std::uint32_t(n), post_by))) {
            rc = send_failed(c, rc);
            if (rc == 0) sent = total;  // the rest to nobody, as TCP's
            break;
        }
        sent += n;
    }
    if (sent) engine->ring(c->peer);
    *left = rc == -ESTALE;
    // EAGAIN with credits left: the peer's queue stayed full (post_by).
    // Readiness still says writable, but an edge-triggered waiter is told
    // only of credits coming back, which may never happen: a new edge, so
    // that it tries again.
    if (rc == -EAGAIN && c->credits.load(std::memory_order_acquire) > 0)
        c->tx_seq.fetch_add(1, std::memory_order_release);
    if (sent) return ssize_t(sent);
    if (rc == -EPIPE) return epipe(flags);
    return rc;
}

void Stream::flush() noexcept {
    Conn *c = conn.load(std::memory_order_acquire);
    if (!c || !c->is_direct()) return;
    std::lock_guard tx(c->tx_lock);
    (void)flush_locked(c, !nonblock.load(std::memory_order_relaxed), 0);
}

int Stream::shutdown(int how) noexcept {
    // A half-closed shared socket stays on TCP (the switch would not know
    // of the kernel's FIN).
    if (Sharers *sh = share.load(std::memory_order_acquire)) {
        sharers_stick(sh);
        drop_share();
    }
    (void)claim_inherited();
    if (Sharers *h = holders.load(std::memory_order_acquire)) sharers_stick(h);
    Conn *c = conn.load(std::memory_order_acquire);
    // An upgrade under way is waited for (bounded): shut down while the
    // responder commits, the connection would turn direct with its kernel
    // socket already shut, and nothing on the fabric would say so.
    if (c && engine) engine->await_upgrade(c);
    int kernel_how = how;
    if (c && how != SHUT_WR) c->rd_shut.store(true, std::memory_order_release);
    if (c && (how == SHUT_WR || how == SHUT_RDWR)) {
        std::lock_guard tx(c->tx_lock);
        const bool direct = c->is_direct() && !leave_requested(c);
        int rc = direct && !wr_shut(c) ? flush_locked(c, true, 0) : 0;
        if (direct && rc != -ESTALE) {
            // Shut on the kernel before the upgrade: the peer read our end
            // there, and the fabric says nothing more of it.
            const bool post_fin = !wr_shut(c);
            if (post_fin) shut_second.store(peer_fin_seen(c), std::memory_order_release);
            // Marked before the FIN goes: the peer may answer it at once
            // (its close), and a thread of ours polling meanwhile must see
            // our side shut with it (POLLHUP), as it is.
            c->tx_fin = true;
            if (post_fin && engine->post(c, MsgType::fin, nullptr, 0, 0, c->tx_off, 0) == 0)
                engine->ring(c->peer);
        }
        if (c->is_direct() || c->leave_sent || c->leave_due.load(std::memory_order_acquire) ||
            c->leave_wanted.load(std::memory_order_acquire)) {
            // On the fabric (or leaving it): the kernel's FIN waits until
            // a leave has written what it owes the kernel socket (returned
            // and staged bytes), or until close.
            c->shut_wr_deferred.store(true, std::memory_order_release);
            kernel_how = how == SHUT_RDWR ? SHUT_RD : -1;
            if (!c->is_direct())
                (void)engine->leave_flush_locked(c, true, monotonic_ns() + 1000000000ull);
        }
    }
    // Our state first: the kernel's shutdown wakes a thread blocked in
    // poll or epoll on the socket, which must then see both directions
    // shut (POLLHUP), as the kernel shows them at once; so must one whose
    // connection turns direct only afterwards (kernel_wr_shut).
    const bool rd = how == SHUT_RD || how == SHUT_RDWR;
    const bool wr = kernel_how == SHUT_WR || kernel_how == SHUT_RDWR;
    const bool was_shut = rd_shut.load(std::memory_order_relaxed);
    const bool was_wr_shut = kernel_wr_shut.load(std::memory_order_relaxed);
    // The write side first: a reader that sees rd_shut (acquire) sees it.
    if (wr) kernel_wr_shut.store(true, std::memory_order_release);
    if (rd) rd_shut.store(true, std::memory_order_release);
    if (kernel_how >= 0 && sys.shutdown(kfd(), kernel_how) != 0) {
        const int err = errno;
        if (rd) rd_shut.store(was_shut, std::memory_order_release);
        if (wr) kernel_wr_shut.store(was_wr_shut, std::memory_order_release);
        return -err;
    }
    return 0;
}

int Stream::readable_bytes() noexcept {
    (void)claim_inherited();
    Conn *c = attached_conn();
    int kernel = 0;
    if (sys.ioctl(kfd(), FIONREAD, &kernel) != 0) return -errno;
    if (Prefix *p = prefix.load(std::memory_order_acquire))
        kernel = int(std::min<std::uint64_t>(std::uint64_t(kernel) + prefix_left(p), 0x7fffffff));
    if (!c || (!c->is_direct() && !c->is_leaving())) return kernel;
    engine->progress();
    std::lock_guard lock(c->rx_lock);
    if (c->settle_left_locked() ||
        (c->peer_end != kNoOffset && c->rx_off >= c->peer_end && !c->rx_ready()))
        return kernel;
    std::uint64_t n = c->rx_ready();
    if (c->rx_off < c->switch_off)
        n = c->switch_off == kNoOffset ? std::uint64_t(kernel)
                                       : std::min<std::uint64_t>(kernel, c->switch_off - c->rx_off);
    return int(std::min<std::uint64_t>(n, 0x7fffffff));
}

void Stream::last_close() noexcept {
    if (share.load(std::memory_order_acquire)) drop_share();  // one holder fewer
    Conn *c = conn.load(std::memory_order_acquire);
    const bool on_fabric = c && engine && (c->is_direct() || c->is_leaving());
    if (Sharers *h = holders.exchange(nullptr, std::memory_order_acq_rel)) {
        // A process we forked may hold it still and use it after us: the
        // kernel must carry the connection before ours closes.
        std::uint64_t look_now = 0;
        const bool alone = sharers_alone(h, &look_now);
        sharers_leave(h);
        if (!alone && on_fabric) {
            if (const int rc = engine->leave(c, transport::Reason::shared); rc < 0)
                SD_LOG(error, "fd %d: closing while a process we forked holds it, and the "
                              "connection could not leave the fabric first: %s", kfd(),
                       std::strerror(-rc));
        }
    } else if (forked && on_fabric) {
        if (const int rc = engine->leave(c, transport::Reason::shared); rc < 0)  // holders unknown
            SD_LOG(error, "fd %d: closing after a fork, and the connection could not leave the "
                          "fabric first: %s", kfd(), std::strerror(-rc));
    }
    if (!c) return;
    if (!c->is_direct()) {
        // Left the fabric: what is owed to the kernel goes before its close.
        std::lock_guard tx(c->tx_lock);
        // Bounded, and not ended by a signal (the bytes are the holders').
        const std::uint64_t until = monotonic_ns() + 1000000000ull;
        while (c->leave_under_way() &&
               engine->leave_flush_locked(c, true, until) == -EINTR && monotonic_ns() < until) {
        }
        return;
    }
    std::lock_guard tx(c->tx_lock);
    // SO_LINGER {1, 0}: an abortive close, whatever is unsent or unread.
    const bool abort = linger_reset.load(std::memory_order_relaxed);
    // Bounded: a peer that stopped reading must not hang close().
    if (!abort) (void)flush_locked(c, true, monotonic_ns() + 1000000000ull);
    // Closing with the peer's bytes unread resets the connection (TCP).
    engine->progress();
    bool unread = abort;
    {
        std::lock_guard lock(c->rx_lock);
        unread = unread || c->rx_ready() != 0 ||
                 (c->switch_off != kNoOffset && c->rx_off < c->switch_off);
    }
    // Shut for writing before: the FIN went, but the peer must still learn
    // that we read no more (its sends draw a reset from now on, as TCP's).
    if (!c->close_sent.exchange(true) &&
        engine->post(c, MsgType::close, nullptr, 0, 0, c->tx_off, 0,
                     unread ? transport::kCloseReset : 0) == 0)
        engine->ring(c->peer);
    c->tx_fin = true;
}

void Stream::destroy() noexcept {
    Conn *c = conn.exchange(nullptr, std::memory_order_acq_rel);
    if (c) {
        // The spill buffer is the prefix's memory: gone with it.
        std::lock_guard rx(c->rx_lock);
        c->spill = transport::Spill{};
    }
    if (Prefix *p = prefix.exchange(nullptr, std::memory_order_acq_rel)) prefix_release(p);
    if (c) engine->detach(c);
}

}  // namespace sd::fallback
