// Sockets shared through fork: before a fork, each connected socket is
// marked shared (its holders counted together in the sharers arena, or,
// for one already direct, who holds it kept for the owner's last close);
// after it, the child keeps none of its parent's connection state. The
// holder that finds itself alone takes the shared counts as its own and
// upgrades the socket again (adopt_share), or, where its own connection
// left the fabric for the sharing, takes that connection back to kernel
// mode from the holders' counts (rejoin_locked). The connection of a
// socket with holders hands its leave to them through its handoff
// (kHoldersHandoff: transport calls it, knowing nothing of the slot).
#include "share.hpp"

#include "shm_fallback/table.hpp"
#include "transport/engine.hpp"
#include "transport/log.hpp"
#include "transport/renew.hpp"
#include "transport/sys.hpp"
#include "transport/settings.hpp"

#include <unistd.h>

#include <mutex>
#include <utility>

namespace sd::forking {

using fallback::Phase;
using fallback::prefix_from_ring;
using fallback::prefix_reserve;
using fallback::sharers_alone;
using fallback::sharers_born;
using fallback::sharers_count;
using fallback::sharers_expect_child;
using fallback::sharers_hand_back;
using fallback::sharers_leave;
using fallback::sharers_left;
using fallback::sharers_open;
using fallback::sharers_received;
using fallback::sharers_sent;
using fallback::sharers_stick;
using fallback::sharers_stuck;
using fallback::sharers_use;
using fallback::Prefix;
using fallback::Sharers;
using fallback::Stream;
using transport::Conn;
using transport::ConnState;

namespace {

// A leave for sharing hands the connection to the holders' slot: our
// offsets added to its counts, marked left; what the owner leaves unread
// goes into the prefix unless a holder cannot map it (an exec'd image).
const transport::HandoffOps kHoldersHandoff = {
    .why = transport::Reason::shared,
    .take = [](void *ctx, std::uint64_t sent, std::uint64_t received) noexcept {
        sharers_hand_back(static_cast<Sharers *>(ctx), sent, received);
    },
    .taken = [](void *ctx) noexcept { return sharers_left(static_cast<Sharers *>(ctx)); },
    .reads_room = [](void *ctx) noexcept {
        return !fallback::sharers_is_blind(static_cast<Sharers *>(ctx));
    },
};

// The holders in `h` take over when `c` leaves for sharing.
void hand_to_holders(Conn *c, Sharers *h) noexcept {
    transport::set_handoff(c, &kHoldersHandoff, h);
}

// The registry's entry that says the socket is shared, so that a peer
// asking for its upgrade learns why no holder makes one: once per socket
// (share_marked), at a fork or at a holder's I/O after it; the holder
// left last replaces it, or the last close removes it.
void mark_shared(Stream &s) noexcept {
    if (std::exchange(s.share_marked, true)) return;
    transport::mark_unattached(s.kfd(), transport::Reason::shared, &s.mark);
}

}  // namespace

void fork_prepare(Stream &s, unsigned mark) noexcept {
    // Nothing to do, and nothing written (the page stays shared with the
    // child), for a socket not connected.
    Phase p = s.phase.load(std::memory_order_acquire);
    if (p == Phase::fresh || p == Phase::listener) return;
    if (s.fork_mark == mark) return;  // another fd of the same socket
    s.fork_mark = mark;
    s.forked = true;
    if (!s.take_ns) s.take_ns = transport::monotonic_ns();  // we share it from now
    // Whether this process uses it from the fork on: a call of ours on it
    // under way, or an epoll set that watches it (each holds a reference
    // besides the fds'). Then no child may take it over from us; else a
    // child that uses it while we do not may (what we did before the fork
    // does not count: a server forks the child that serves the connection
    // once it has nothing more to say on it). Our next call marks us again.
    // A process in a sandbox counts as using it for its whole life: it
    // could not ask a taker to leave (the sandbox may forbid the call). One
    // retired by a change of ids can (sshd's monitor, which forks the
    // session child that serves the connection as the user).
    const bool busy = transport::sandboxed() ||
                      s.refs.load(std::memory_order_acquire) > s.fds.load(std::memory_order_acquire);
    struct Busy {
        Stream &s;
        bool busy;
        ~Busy() {
            s.used_mark.store(nullptr, std::memory_order_release);
            for (Sharers *sl : {s.holders.load(std::memory_order_relaxed),
                                s.share.load(std::memory_order_relaxed)}) {
                if (!sl) continue;
                if (busy) sharers_use(sl);
                else fallback::sharers_unuse(sl);
            }
        }
    } mark_busy{s, busy};
    if (s.orphan.load(std::memory_order_relaxed)) {
        // Another process's connection: the child holds it too.
        if (Sharers *h = s.holders.load(std::memory_order_relaxed)) sharers_expect_child(h);
        return;
    }
    if (Conn *c = s.conn.load(std::memory_order_acquire)) {
        // Not direct yet: it stays with the kernel, shared from now on.
        if (s.engine) s.engine->bar_upgrades(c, transport::Reason::shared);
        // Direct: it stays so until the child uses it; who holds it is
        // kept, for our last close.
        if (transport::on_fabric(c)) {
            Sharers *h = s.holders.load(std::memory_order_relaxed);
            if (!h && (h = sharers_open(0, 0))) {
                s.holders.store(h, std::memory_order_relaxed);
                hand_to_holders(c, h);
            }
            if (h) sharers_expect_child(h);
            // Answered the peer's leave with its bytes unread: whoever
            // reads next gets them (the holders' counts start after them).
            if (h && transport::is_leaving(c) && !s.prefix.load(std::memory_order_relaxed))
                if (Prefix *p = prefix_from_ring(c)) {
                    s.prefix.store(p, std::memory_order_release);
                    if (s.engine) s.engine->want_flush(c);
                }
            // Still direct: room for what a later answer to the peer's
            // leave would keep unread, in memory the child maps too.
            if (h && !s.prefix.load(std::memory_order_relaxed))
                if (Prefix *p = prefix_reserve(c)) s.prefix.store(p, std::memory_order_release);
        } else if (Sharers *h = left_holders(s, c)) {
            sharers_expect_child(h);  // left for sharing: one holder more
        }
        return;
    }
    // No connection yet: the holders keep count together, and the last
    // one left upgrades it; unless it is on TCP for good.
    if (s.for_good.load(std::memory_order_acquire)) return;
    std::lock_guard lock(s.pend_lock);
    // The peer asks for its upgrade on the same terms as we do: once it
    // may be asking, an entry of ours tells it that no holder makes one
    // while the socket is shared. Before then (a server that forks the
    // child serving a connection it has just accepted), the entry is left
    // to a holder that still finds it shared later (mark_while_shared):
    // the usual child, alone once its parent closes, would only remove it.
    const bool peer_may_ask = !transport::settings().upgrade_after_ms ||
                              (s.earn_ns && transport::monotonic_ns() >= s.earn_ns);
    if (s.earn_ns) {
        // Still earning its upgrade: no builder will come for it, and
        // the holder left last upgrades it from the shared counts.
        s.earn_ns = 0;
        s.pending.store(false, std::memory_order_release);
    }
    Sharers *sh = s.share.load(std::memory_order_relaxed);
    // The last holder's entry replaces ours.
    if (!sh && peer_may_ask) mark_shared(s);
    if (!sh && !(sh = sharers_open(s.pre_tx, s.pre_rx))) return;
    s.share.store(sh, std::memory_order_release);
    sharers_expect_child(sh);
}

SD_CHILD_PATH void fork_child(Stream &s, unsigned mark, int parent) noexcept {
    Phase p = s.phase.load(std::memory_order_relaxed);
    if (p == Phase::fresh || p == Phase::listener) {
        // Only the parent's threads to forget, once or for each fd alike;
        // nothing written that is as new already (a forking server's
        // listener stays on a page the child shares).
        s.forget_parent_threads();
        transport::renew(s.used_mark, nullptr);
        return;
    }
    if (s.fork_mark == mark) return;
    s.fork_mark = mark;
    s.forget_parent_threads();
    // The child's epoll sets start without shadows (epoll_after_fork_child)
    // and know nothing of the parent's plain registrations either.
    s.plain_n.store(0, std::memory_order_relaxed);
    s.ask_deferred.store(false, std::memory_order_relaxed);
    s.used_mark.store(nullptr, std::memory_order_relaxed);  // the parent's entry, not ours
    s.take_ns = fallback::table_fork_ns();
    s.take_calls = 0;
    // The parent's connection state stays the parent's: the kernel socket
    // is all the child has.
    Conn *c = s.conn.exchange(nullptr, std::memory_order_relaxed);
    // Our parent's connection left the fabric for sharing: its holders
    // count, and so do we.
    Sharers *left = c && s.engine ? left_holders(s, c) : nullptr;
    s.engine = nullptr;
    s.pending.store(false, std::memory_order_relaxed);
    s.earn_ns = 0;
    s.forked = true;
    if (c && (transport::on_fabric(c) || transport::state_of(c) == ConnState::initiating ||
              transport::state_of(c) == ConnState::committing)) {
        // Its bytes travel through the parent's endpoint: the parent moves
        // it to the kernel when we use it (claim_inherited).
        s.orphan.store(true, std::memory_order_relaxed);
        s.owner = parent;
    }
    // Watched by an epoll set we inherited (its reference besides the
    // fds'): the child uses it from the start.
    const bool busy = s.refs.load(std::memory_order_relaxed) > s.fds.load(std::memory_order_relaxed);
    if (Sharers *sh = s.share.load(std::memory_order_relaxed)) sharers_born(sh, parent, busy);
    if (Sharers *h = s.holders.load(std::memory_order_relaxed)) sharers_born(h, parent, busy);
    if (left) {
        s.holders.store(nullptr, std::memory_order_relaxed);
        s.share.store(left, std::memory_order_relaxed);
    } else if (c && !s.orphan.load(std::memory_order_relaxed) &&
               !s.share.load(std::memory_order_relaxed)) {
        // On the kernel in the parent (upgrades barred, or for good): its
        // bytes there were counted by nobody, so no holder here may upgrade
        // it from counts (a later fork of ours would start them at stale
        // offsets).
        if (Sharers *sh = sharers_open(0, 0)) {
            sharers_stick(sh);
            s.share.store(sh, std::memory_order_relaxed);
        }
    }
    s.share_check_ns = 0;
    s.move_to(Phase::deferred);
}

namespace {

// The other holders live but none has used the socket since its last
// fork (a parent that keeps an idle copy while the child it forked serves
// the connection; SDIRECT_TAKE_OVER=1, or a holder that changed its ids
// afresh): this process takes it over,
// attached at once from the
// counts, and stays in the slot as the owner; a holder that uses the
// socket later asks it to leave first (claim_inherited). Only with an
// engine ready, so that such a claim always finds a control thread to
// answer it (the first call starts the build; a later one takes over).
bool take_over(Stream &s, Sharers *sh) noexcept {
    // Earned as a fresh connection earns its upgrade (SDIRECT_UPGRADE_AFTER_MS
    // and 16 calls that moved bytes, counted since this process shares
    // it; SDIRECT_BUILD_AFTER_MS before it may start the engine's build):
    // a forking server's child that answers one request and closes costs
    // what TCP costs.
    const transport::Settings &set = transport::settings();
    if (set.upgrade_after_ms &&
        !Stream::earned(s.take_calls, s.take_ns + std::uint64_t(set.upgrade_after_ms) * 1000000ull,
                        s.take_ns + std::uint64_t(set.build_after_ms) * 1000000ull))
        return false;
    // A rule that says kernel keeps it there: heard once, as a fresh
    // connection hears the rules at its ask. No take-over then; the
    // holders count on, and one left alone hears them at its own ask.
    if (s.rule_says_kernel()) return false;
    if (transport::builds_held()) return false;
    transport::Engine *e = transport::Engine::ready();
    if (!e || !fallback::sharers_take(sh)) return false;
    s.pre_tx = sharers_sent(sh);
    s.pre_rx = sharers_received(sh);
    // Our connection's offsets go back into the counts when it leaves.
    fallback::sharers_reset_counts(sh);
    Conn *c = e->attach(s.kfd(), s.acceptor, s.rcvbuf.load(std::memory_order_relaxed), s.pre_tx,
                        s.pre_rx);
    if (!c) {
        sharers_count(sh, true, s.pre_tx);
        sharers_count(sh, false, s.pre_rx);
        fallback::sharers_disown(sh, fallback::own_pid());
        return false;
    }
    hand_to_holders(c, sh);
    s.share.store(nullptr, std::memory_order_release);
    s.holders.store(sh, std::memory_order_release);
    s.engine = e;
    transport::unmark_unattached(s.kfd(), s.mark);
    s.set_conn(c);
    s.move_to(Phase::attached);
    fallback::sharers_took(sh);
    SD_LOG(info, "fd %d: taken over from holders that have not used it since the fork; kernel "
                 "mode at offsets %llu/%llu until the peer upgrades it",
           s.kfd(), (unsigned long long)s.pre_tx, (unsigned long long)s.pre_rx);
    return true;
}

// Still shared after SDIRECT_UPGRADE_AFTER_MS, at a holder's I/O: the peer
// may be asking for an upgrade that no holder makes; an entry of ours
// tells it why (mark_shared).
void mark_while_shared(Stream &s) noexcept {
    if (s.share_marked || s.for_good.load(std::memory_order_acquire)) return;
    const std::uint64_t after = std::uint64_t(transport::settings().upgrade_after_ms) * 1000000ull;
    if (transport::monotonic_ns() < s.take_ns + after) return;
    mark_shared(s);
}

}  // namespace

SD_CHILD_PATH bool adopt_share(Stream &s, Sharers *sh) noexcept {
    // Still waiting for this process's engine (the builder clears pending);
    // retired: never attaches.
    if (s.pending.load(std::memory_order_relaxed) || transport::retired()) return false;
    const int may = fallback::sharers_may_take(sh, &s.share_check_ns);
    // A process that changed its ids afresh holding the socket (a
    // privilege-separated server's child, become the user it serves)
    // takes it over by default: the process that forked it keeps an idle
    // copy while the child serves the connection (sshd's monitor).
    if (may == 2 && (transport::settings().take_over || transport::ids_renewed()) &&
        take_over(s, sh))
        return true;
    if (may != 1) {
        mark_while_shared(s);
        return false;
    }
    s.pre_tx = sharers_sent(sh);
    s.pre_rx = sharers_received(sh);
    sharers_leave(sh);
    s.share.store(nullptr, std::memory_order_release);
    s.forked = false;
    // No longer shared: our entry's reason is over (the entry our own
    // upgrade publishes replaces it, if it comes).
    transport::unmark_unattached(s.kfd(), s.mark);
    SD_LOG(debug, "fd %d: the only holder left after fork; upgrading at offsets %llu/%llu",
           s.kfd(), (unsigned long long)s.pre_tx, (unsigned long long)s.pre_rx);
    s.move_to(Phase::deferred);
    return true;
}

void drop_share(Stream &s) noexcept {
    std::lock_guard lock(s.pend_lock);
    if (Sharers *sh = s.share.exchange(nullptr, std::memory_order_acq_rel)) sharers_leave(sh);
}

Sharers *left_holders(const Stream &s, Conn *c) noexcept {
    Sharers *h = s.holders.load(std::memory_order_acquire);
    if (!h || !transport::has_handoff(c) || sharers_stuck(h) ||
        transport::state_of(c) != ConnState::final ||
        transport::stats(c).reason.load(std::memory_order_relaxed) !=
            std::uint32_t(transport::Reason::shared))
        return nullptr;
    return h;
}

bool rejoin_locked(Stream &s, Conn *c, Sharers *h) noexcept {
    // Its leave has added our offsets (the mark), and nobody else holds it.
    if (!sharers_left(h) || !sharers_alone(h, &s.share_check_ns)) return false;
    const std::uint64_t sent = sharers_sent(h), received = sharers_received(h);
    const bool back = s.engine->take_back_locked(c, sent, received);
    s.holders.store(nullptr, std::memory_order_release);
    sharers_leave(h);
    s.forked = false;
    if (back)
        SD_LOG(debug, "fd %d: the only holder left after its leave; kernel mode at offsets "
                      "%llu/%llu until the peer upgrades it again",
               s.kfd(), (unsigned long long)sent, (unsigned long long)received);
    return true;
}

}  // namespace sd::forking
