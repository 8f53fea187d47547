// Leaving the fabric: a direct connection goes back to its
// kernel socket for good, so that every process holding the socket (a
// fork child that uses it, a program started by exec) reads and writes it
// with TCP's semantics.
//
// The side that leaves first ends its fabric stream with a `leave` at its
// send offset (flag kLeaveFirst) and sends through the kernel from then
// on. The peer answers with its own `leave` once no send of its holds the
// fabric, and reads its ring up to the first side's end, then the kernel.
// When the answer comes, the first side returns the bytes it received and
// had not read (`give_back`) and reads only the kernel from then on; the
// peer writes the returned bytes into the kernel before any new byte. Both
// kernel streams thus go on at the offsets where the fabric left them.
// Crossing leaves are two first sides: each returns, each writes back.
#include "conn_impl.hpp"
#include "engine.hpp"
#include "log.hpp"
#include "settings.hpp"
#include "sys.hpp"
#include "wait.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

namespace sd::transport {
namespace {

// The peer's leave came, and every fabric byte before its end with it.
bool answered(void *ctx) noexcept {
    auto *c = static_cast<Conn *>(ctx);
    std::lock_guard lock(c->rx_lock);
    return (c->peer_end != kNoOffset && c->rx_expect() >= c->peer_end) || c->gone();
}

bool back_arrived(void *ctx) noexcept {
    auto *c = static_cast<Conn *>(ctx);
    return c->back_complete() || c->gone();
}

// Writes what it can of buf[*done, len) into the kernel socket without
// blocking. 0 when all is written, -EAGAIN, or -errno.
int write_some(int fd, const char *buf, std::uint32_t len, std::uint32_t *done) noexcept {
    while (*done < len) {
        ssize_t n = sys.send(fd, buf + *done, len - *done, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno == EWOULDBLOCK ? -EAGAIN : -errno;
        }
        *done += std::uint32_t(n);
    }
    return 0;
}

}  // namespace

bool Conn::settle_left_locked() noexcept {
    ConnState st = state.load(std::memory_order_acquire);
    if (st == ConnState::final) return true;
    // Final also for the send side: nothing owed to the kernel any more
    // (readiness tells writability from our state until then).
    if (st != ConnState::leaving || peer_end == kNoOffset || rx_off < peer_end || ring_bytes() ||
        zc.active || tx_owed.load(std::memory_order_acquire))
        return false;
    if (const Rearm r = rearm.load(std::memory_order_acquire); r != Rearm::none) {
        // Not final: kernel mode again, by the flush pass (it needs the
        // send lock too).
        if (r == Rearm::wanted) (void)move_rearm(Rearm::wanted, Rearm::due);
        return false;
    }
    stat->mode.store(std::uint32_t(Mode::kernel), std::memory_order_relaxed);
    move_to(ConnState::final);
    wake_locked();
    return true;
}

void Engine::send_leave_locked(Conn *c, bool first, Reason why) noexcept {
    if (c->leave_sent()) return;
    // Staged bytes were accepted after everything on the fabric: they
    // follow on the kernel socket.
    if (c->staged) c->tx_owed.store(true, std::memory_order_release);
    const std::uint64_t deadline = monotonic_ns() + settings().leave_timeout_ms * 1000000ull;
    c->tx_end.store(c->tx_off, std::memory_order_release);
    c->leave_goes(first);
    c->stat->leaves.fetch_add(1, std::memory_order_relaxed);
    const std::uint32_t flags = (first ? kLeaveFirst : 0) | std::uint32_t(why) << 8;
    if (post(c, MsgType::leave, nullptr, 0, 0, c->tx_off, deadline, flags) == 0)
        ring(c);
    c->move(ConnState::direct, ConnState::leaving);
    SD_LOG(debug, "fd %d: our fabric stream ends at %llu", c->stat->fd,
           (unsigned long long)c->tx_off);
}

void Engine::on_leave(Conn *c, const MsgHeader &h) noexcept {
    if (c->switch_off == kNoOffset) c->switch_off = h.offset;
    // Its advertisement (if any) ended before it could leave. Its stream
    // ends at or after what has arrived: bytes it sent before its leave
    // may still be on their way (they are awaited, never lost).
    if (h.offset < c->rx_expect() || c->zc.active || c->peer_end != kNoOffset) {
        SD_LOG(error, "conn %u: leave at offset %llu, expected %llu: connection broken", c->id,
               (unsigned long long)h.offset, (unsigned long long)c->rx_expect());
        c->broken = true;
        return;
    }
    c->peer_end = h.offset;
    SD_LOG(debug, "conn %u/%u: the peer's fabric stream ends at %llu (%llu arrived)%s", c->id,
           c->gen, (unsigned long long)h.offset, (unsigned long long)c->rx_expect(),
           (h.flags & kLeaveFirst) ? " (it leaves first)" : "");
    // Why it left (its side's reason), for sdirect-stat here too. Unless
    // ours is there already (our leave crossed it); while we commit, the
    // reason there is from before the upgrade (a lookup's no_peer) and
    // goes.
    const std::uint32_t why = h.flags >> 8;
    if (why && why < std::uint32_t(Reason::count_) &&
        (c->stat->reason.load(std::memory_order_relaxed) == std::uint32_t(Reason::none) ||
         c->state.load(std::memory_order_acquire) == ConnState::committing))
        c->stat->reason.store(why, std::memory_order_relaxed);
    // Ours was logged where we left; this one is the peer's doing.
    if (h.flags & kLeaveFirst)
        SD_LOG_CONN(info, *c->stat, "back to the kernel: %s (peer pid %d left the fabric)",
                    reason_name(Reason(c->stat->reason.load(std::memory_order_relaxed))),
                    c->peer ? int(c->peer->pid) : 0);
    if (h.flags & kLeaveFirst) {
        (void)c->move_give_back(GiveBack::none, GiveBack::awaited);
        c->tx_owed.store(true, std::memory_order_release);
    }
    // Left for a reason after which the peer's side may upgrade again
    // (shared: whichever process takes its socket over; inherited: an
    // exec'd image that runs the library), with both directions open and
    // not crossing a leave of ours: we wait for it in kernel mode.
    if ((why == std::uint32_t(Reason::shared) || why == std::uint32_t(Reason::inherited)) &&
        c->fin_off == kNoOffset &&
        !c->fin_sent(std::memory_order_relaxed) && !c->broken &&
        c->tx_end.load(std::memory_order_acquire) == kNoOffset)
        (void)c->move_rearm(Rearm::none, Rearm::wanted);
    // Our own leave is owed (a no-op if we sent ours already): the next
    // holder of the send lock, or the flush pass, sends it. Owed before
    // the state says leaving, never after: a send that holds the send lock
    // (it does not take rx_lock) and finds the connection not direct
    // writes to the kernel at once unless it sees our leave owed, and our
    // leave sent after such bytes would end our fabric stream past them,
    // so the peer would wait for fabric bytes that went to the kernel.
    // The flush pass may send the leave before the state below changes:
    // everything above is set by then (rearm looks at tx_end).
    c->peer_left();
    c->move(ConnState::direct, ConnState::leaving);
    if (const std::uint32_t us = settings().leave_pause_us) pause_us(us);
    want_flush(c);
    c->settle_left_locked();
}

void Engine::on_give_back(Conn *c, const MsgHeader &h, const char *payload) noexcept {
    const bool first = c->back_off == kNoOffset;
    const std::uint64_t expect = first ? h.offset : c->back_off + c->back_len;
    const std::uint64_t end = c->tx_end.load(std::memory_order_acquire);  // before our leave
    bool ok = c->give_back.load(std::memory_order_relaxed) == GiveBack::awaited &&
              h.offset == expect &&
              end != kNoOffset && h.offset + h.len <= end &&
              end - (first ? h.offset : c->back_off) <= c->peer_ring_cap;
    if (ok && (h.flags & kGiveBackLast)) ok = h.offset + h.len == end;
    char *grown = nullptr;
    if (ok && h.len) {
        grown = static_cast<char *>(std::realloc(c->back, c->back_len + h.len));
        ok = grown != nullptr;
    }
    if (!ok) {
        SD_LOG(error, "conn %u: returned bytes at offset %llu do not fit our stream (ends at "
                      "%llu): connection broken", c->id, (unsigned long long)h.offset,
               (unsigned long long)end);
        c->broken = true;
        return;
    }
    SD_LOG(debug, "conn %u: %u returned bytes at %llu%s", c->id, h.len,
           (unsigned long long)h.offset, (h.flags & kGiveBackLast) ? " (last)" : "");
    if (first) c->back_off = h.offset;
    if (h.len) {
        c->back = grown;
        std::memcpy(c->back + c->back_len, payload, h.len);
        c->back_len += h.len;
    }
    if (h.flags & kGiveBackLast) {
        (void)c->move_give_back(GiveBack::awaited, GiveBack::complete);
        want_flush(c);
    }
}

int Engine::leave_work_locked(Conn *c) noexcept {
    if (!c->leave_sent()) {
        if (!c->leave_due()) return 0;
        send_leave_locked(c, false, Reason::none);
    }
    if (c->tx_owed.load(std::memory_order_acquire))
        if (int rc = write_owed_locked(c)) return rc;
    // A shutdown(SHUT_WR) made on the fabric: the kernel's FIN follows
    // the owed bytes.
    if (c->shut_wr_deferred.exchange(false, std::memory_order_acq_rel))
        (void)sys.shutdown(c->app_fd(), SHUT_WR);
    // Writable now; the receive side may be done too.
    std::lock_guard rx(c->rx_lock);
    if (!c->settle_left_locked()) c->wake_locked();
    if (c->rearm_due()) {
        if (final_to_handoff_locked(c)) return 0;
        rearm_locked(c);
        return 1;
    }
    return 0;
}

bool Engine::final_to_handoff_locked(Conn *c) noexcept {
    // A handoff is set: another process may take the socket over, and this
    // process may close its copy at any time (a forking server does at
    // once). Were the connection rearmed here, in kernel mode under our
    // offsets, the handoff would never learn where the kernel took over,
    // and whoever takes over would start from offsets of its own: its
    // switch would skip or repeat bytes. So the answering side hands over
    // as a side that left first does: final, its offsets given to the
    // handoff (everything of the fabric is read and nothing is owed by
    // now).
    const Conn::HandoffRef h = c->handoff();
    if (!h) return false;
    c->rearm_forget();
    c->stat->reason.store(std::uint32_t(h.ops->why), std::memory_order_relaxed);
    c->stat->mode.store(std::uint32_t(Mode::kernel), std::memory_order_relaxed);
    c->move_to(ConnState::final);
    h.take(c->tx_off, c->rx_off);
    c->wake_locked();
    SD_LOG_CONN(info, *c->stat, "back to the kernel: %s (after its peer) at offsets %llu "
                                "sent, %llu received; its handoff goes on from there",
                reason_name(h.ops->why), (unsigned long long)c->tx_off,
                (unsigned long long)c->rx_off);
    return true;
}

bool Engine::unread_to_handoff_locked(Conn *c) noexcept {
    const HandoffRoom sp = c->handoff_room;
    const std::uint64_t n = c->ring_bytes();
    // Every fabric byte of the peer is here and nothing more comes on the
    // fabric: what the ring holds is exactly what precedes the kernel's.
    // A handoff that does not read the room would read the kernel's bytes
    // past them: nothing is put there, and the bytes stay this process's
    // to read.
    const Conn::HandoffRef h = c->handoff();
    if (!sp.len || !n || n > sp.cap || c->zc.active || c->peer_end == kNoOffset ||
        c->rx_expect() < c->peer_end || c->rx_off + n != c->peer_end ||
        c->tx_owed.load(std::memory_order_acquire) || !h || !h.reads_room())
        return false;
    for (std::uint64_t done = 0; done < n;) {
        const std::uint32_t at = c->ring_at(c->ring_head + done);
        const std::uint64_t run = std::min<std::uint64_t>(n - done, c->ring_cap - at);
        std::memcpy(sp.bytes + done, c->ring + at, run);
        done += run;
    }
    sp.len->store(n, std::memory_order_release);
    c->handoff_room = HandoffRoom{};
    c->ring_head += n;
    c->rx_off += n;
    SD_LOG(info, "fd %d: %llu unread bytes of the peer's fabric stream go to the holders of the "
                 "socket, read first", c->stat->fd, (unsigned long long)n);
    // Final here (or due to be rearmed, which it must not be: the handoff
    // goes on from our offsets, past the bytes just moved).
    (void)c->settle_left_locked();
    return final_to_handoff_locked(c);
}

bool Engine::peer_conn_closed(const Conn *c) const noexcept {
    // Its slot in the peer's process page: closed, or already another
    // connection's (the ports name the connection; a slot reused for the
    // same ports within a leave is not a case worth a generation field).
    ConnStat buf;
    const ConnStat *s = peer_slot(c->peer, c->peer_id, &buf);
    if (!s) return false;
    return s->state.load(std::memory_order_acquire) != std::uint32_t(SlotState::live) ||
           s->local_port != c->tuple.peer_port || s->peer_port != c->tuple.local_port;
}

int Engine::write_owed_locked(Conn *c) noexcept {
    const int fd = c->app_fd();
    if (c->give_back.load(std::memory_order_acquire) != GiveBack::none) {
        if (!c->back_complete()) progress();  // it may be here
        // A closed end posted everything before its slot said so: take in
        // what is queued for us before judging.
        const bool closed = !c->back_complete() && peer_conn_closed(c);
        for (int pass = 0; closed && pass < 4 && !c->back_complete(); ++pass)
            progress_blocking();
        if (!c->back_complete()) {
            if (!c->gone() && peer_alive(c->peer) && !closed) return -EAGAIN;
            // It died, or closed its end, between its leave and its
            // returned bytes: they are lost with it (its holders' next
            // reads see a gap otherwise impossible; the log says so).
            // Waiting on would never end.
            SD_LOG(error, "fd %d: the peer %s before returning our unread bytes", fd,
                   peer_alive(c->peer) ? "closed its end" : "died");
        } else if (int rc = write_some(fd, c->back, c->back_len, &c->back_done)) {
            return rc;
        }
        c->give_back_forget();
        std::free(c->back);
        c->back = nullptr;
    }
    if (c->staged) {
        std::uint32_t done = 0;
        int rc = write_some(fd, c->stage, c->staged, &done);
        c->tx_off += done;
        bump(c->stat->tx_kernel, done);
        std::memmove(c->stage, c->stage + done, c->staged - done);
        c->staged -= done;
        if (rc) return rc;
    }
    c->tx_owed.store(false, std::memory_order_release);
    c->tx_seq.fetch_add(1, std::memory_order_release);  // writable again
    mark_touched(c);
    return 0;
}

void Engine::rearm_locked(Conn *c) noexcept {
    // Everything of the fabric is over: the connection is as it was before
    // its upgrade, at today's offsets (the peer's side attaches again, from
    // whichever process holds its socket then; our old peer is released
    // when a new one replaces it).
    c->rearm_forget();
    c->switch_off = c->fin_off = c->peer_end = kNoOffset;
    // The ring stays (a later upgrade reuses it): its count toward huge
    // pages restarts with its offsets; a ring collapsed or given up stays so.
    c->ring_head = c->ring_tail = c->ring_base = c->huge_after = 0;
    c->zc = SrcAvail{};
    c->zc_total = 0;
    c->sink = SinkAvail{};
    c->sink_total = 0;
    c->psink = PeerSink{};
    c->psink_valid.store(false, std::memory_order_relaxed);
    c->psink_last = c->psink_busy = 0;  // the next peer numbers its sinks afresh
    c->tx_fabric = false;
    c->tx_ring = 0;
    c->credits.store(0, std::memory_order_relaxed);
    c->unreturned.store(0, std::memory_order_relaxed);
    c->zc_answer_off.store(kNoOffset, std::memory_order_relaxed);
    c->leave_forget();
    c->tx_end.store(kNoOffset, std::memory_order_relaxed);
    c->give_back_forget();
    std::free(c->back);
    c->back = nullptr;
    c->back_len = c->back_done = 0;
    c->back_off = kNoOffset;
    c->kernel_eof.store(false, std::memory_order_relaxed);
    // The next peer's counters start from zero.
    c->tx_fabric_base = c->stat->tx_fabric.load(std::memory_order_relaxed);
    c->stat->mode.store(std::uint32_t(Mode::kernel), std::memory_order_relaxed);
    // Until upgraded: why it came back (the peer's exec, or sharing).
    if (c->stat->reason.load(std::memory_order_relaxed) != std::uint32_t(Reason::inherited))
        c->stat->reason.store(std::uint32_t(Reason::shared), std::memory_order_relaxed);
    c->stat->peer_pid = 0;
    c->move_to(ConnState::kernel);
    publish(c);
    c->initiate_due.store(true, std::memory_order_release);
    want_flush(c);
    c->wake_locked();
    SD_LOG_CONN(info, *c->stat, "back in kernel mode: %s, at offsets %llu sent, %llu "
                                "received; it may be upgraded again",
                reason_name(Reason(c->stat->reason.load(std::memory_order_relaxed))),
                (unsigned long long)c->tx_off, (unsigned long long)c->rx_off);
}

bool Engine::take_back_locked(Conn *c, std::uint64_t sent, std::uint64_t received) noexcept {
    std::lock_guard rx(c->rx_lock);
    if (c->state.load(std::memory_order_acquire) != ConnState::final || c->gone() ||
        c->fin_sent(std::memory_order_relaxed) || c->fin_off != kNoOffset ||
        c->shut_wr_deferred.load(std::memory_order_acquire) || c->staged ||
        c->tx_owed.load(std::memory_order_acquire) || c->reset_seen())
        return false;
    c->tx_off = sent;
    c->rx_off = received;
    c->leave_wanted.store(false, std::memory_order_release);
    c->handoff_ctx.store(nullptr, std::memory_order_release);
    c->upgrades_barred.store(false, std::memory_order_release);
    rearm_locked(c);
    return true;
}

int Engine::leave_flush_locked(Conn *c, bool blocking, std::uint64_t deadline_ns) noexcept {
    // Sleeps of at most 10 ms: on the bell while the peer's returned bytes
    // are owed, else on the socket's room in the kernel.
    struct Flush : BellWaiter {
        bool blocking;
        long look() noexcept {
            int rc = e->leave_work_locked(c);
            if (rc == 1) return 0;  // rearmed: all done (the flush pass looks for the peer)
            if (rc != -EAGAIN || !blocking) return rc;
            return kWaitOn;
        }
        int sleep(std::uint64_t now) noexcept {
            const int ms =
                deadline_ns ? int(std::min<std::uint64_t>((deadline_ns - now) / 1000000 + 1, 10))
                            : 10;
            if (c->give_back.load(std::memory_order_acquire) == GiveBack::awaited)
                return sleep_once(e, c, -1, 0, back_arrived, c, ms);
            pollfd p{c->app_fd(), POLLOUT, 0};
            return sys.poll(&p, 1, ms) < 0 && errno == EINTR ? -EINTR : 0;
        }
        long interrupted() noexcept { return -EINTR; }
    } w{{this, c, back_arrived, c, -1, 0, 0, deadline_ns}, blocking};
    SpinSlot slot;
    return int(wait_on_bell(w, slot));
}

int Engine::leave(Conn *c, Reason why) noexcept {
    std::lock_guard lock(conn_lock_);
    return leave_locked(c, why);
}

int Engine::leave_locked(Conn *c, Reason why) noexcept {
    ConnState st = c->state.load(std::memory_order_acquire);
    if (st != ConnState::direct && st != ConnState::leaving) return 1;
    const int fd = c->app_fd();
    const std::uint64_t deadline = monotonic_ns() + settings().leave_timeout_ms * 1000000ull;
    // The send lock: a send waiting for credits or for its advertisement's
    // reader lets go when it sees leave_wanted.
    c->leave_wanted.store(true, std::memory_order_release);
    {
        std::lock_guard rx(c->rx_lock);
        c->wake_locked();
    }
    std::unique_lock tx(c->tx_lock, std::defer_lock);
    if (wait_until({.nap_ns = 50000}, deadline, [&] { return tx.try_lock(); },
                   [&](std::uint64_t, std::uint64_t) {
                       progress();
                       return true;
                   }) != Waited::ready) {
        c->leave_wanted.store(false, std::memory_order_release);
        SD_LOG(error, "fd %d: a send of ours held the connection for %u ms: it stays direct", fd,
               settings().leave_timeout_ms);
        return -ETIMEDOUT;
    }
    // First or not (the peer may have left meanwhile), we return what we
    // hold unread: every holder of the socket reads the kernel from now on.
    if (!c->leave_sent()) {
        send_leave_locked(c, true, why);
    } else if (!c->leave_first()) {
        // We answered the peer's leave already, keeping our unread bytes
        // to read them ourselves: too late to return them. What we owe
        // the kernel goes now; with everything read, the fabric part is
        // over (handed over, if a handoff is set).
        c->leave_wanted.store(false, std::memory_order_release);
        (void)leave_flush_locked(c, true, deadline);
        tx.unlock();
        std::lock_guard rx(c->rx_lock);
        // Final, or rearmed (kernel mode): nothing of it is on the fabric.
        const ConnState now = c->state.load(std::memory_order_acquire);
        if (now != ConnState::direct && now != ConnState::leaving) return 1;
        if (c->settle_left_locked()) return 1;  // nothing left unread
        if (unread_to_handoff_locked(c)) return 1;
        SD_LOG(error, "fd %d: the peer left the fabric first while bytes of it were unread "
                      "here; they can be read by this process only", fd);
        return -EBUSY;
    }
    c->leave_wanted.store(false, std::memory_order_release);
    // Our staged bytes (and the peer's returned ones if it left first too)
    // go to the kernel once we have returned ours: the flush pass, or the
    // next send, writes them.
    if (c->tx_owed.load(std::memory_order_acquire)) want_flush(c);
    tx.unlock();

    // The peer answers at its next progress pass: at once if one of its
    // threads is in the library, else its control thread's (kick_overdue).
    struct Answer : BellWaiter {
        int fd;
        std::uint64_t asked, kicked = 0;
        long look() noexcept {
            return answered(c) || !e->peer_alive(c->peer) ? 0 : kWaitOn;
        }
        long timed_out() noexcept {
            std::uint64_t end, arrived;
            {
                std::lock_guard rx(c->rx_lock);
                end = c->peer_end;
                arrived = c->rx_expect();
            }
            if (end == kNoOffset)
                SD_LOG(error, "fd %d: peer pid %d did not answer our leave in %u ms: its bytes "
                              "stay on the fabric for this process", fd, int(c->peer->pid),
                       settings().leave_timeout_ms);
            else
                SD_LOG(error, "fd %d: peer pid %d ended its fabric stream at %llu, but its bytes "
                              "from %llu did not arrive in %u ms: they stay on the fabric for "
                              "this process", fd, int(c->peer->pid), (unsigned long long)end,
                       (unsigned long long)arrived, settings().leave_timeout_ms);
            return -ETIMEDOUT;
        }
        int sleep(std::uint64_t now) noexcept {
            const std::uint64_t kick_at = e->kick_overdue(c->peer, asked, &kicked);
            const int ms = int(std::clamp<std::uint64_t>((kick_at - now) / 1000000, 1, 10));
            return sleep_once(e, c, -1, 0, answered, c, ms);
        }
        long interrupted() noexcept { return kWaitOn; }
    } w{{this, c, answered, c, -1, 0, 0, deadline}, fd, monotonic_ns()};
    SpinSlot slot;
    if (long r = wait_on_bell(w, slot)) return int(r);

    // What we received and did not read goes back to where it came from.
    char *give = nullptr;
    std::uint32_t n = 0;
    std::uint64_t from = 0, received = 0;
    bool gone, zc_unread;
    if (!answered(c)) progress_blocking();  // what a dead peer posted before it died
    {
        std::lock_guard rx(c->rx_lock);
        received = c->rx_off;
        zc_unread = c->zc.active;
        gone = c->gone() || c->peer_end == kNoOffset;
        n = std::uint32_t(c->ring_bytes());
        from = c->peer_end == kNoOffset ? 0 : c->peer_end - n;
        if (n && !gone && (give = static_cast<char *>(std::malloc(n)))) {
            for (std::uint32_t i = 0; i < n;) {
                std::uint32_t at = c->ring_at(c->ring_head + i);
                std::uint32_t run = std::min(n - i, c->ring_cap - at);
                std::memcpy(give + i, c->ring + at, run);
                i += run;
            }
        }
        if (!gone) {
            c->ring_head = c->ring_tail;
            c->peer_end = from;
        }
        c->stat->reason.store(std::uint32_t(why), std::memory_order_relaxed);
        c->stat->mode.store(std::uint32_t(Mode::kernel), std::memory_order_relaxed);
        c->move_to(ConnState::final);
        c->show_flow(true);
        c->wake_locked();
    }
    if (gone) {
        if (!c->gone()) {
            // It died without answering: nothing more comes from it, on the
            // fabric or the kernel. Bytes of it still in our ring (or its
            // advertised buffer) can be read by this process only: for
            // the other holders of the socket they are lost, so the
            // connection is reset for them; with none, the kernel socket
            // carries everything that is left (its EOF or reset).
            const bool lost = n != 0 || zc_unread;
            SD_LOG(error, "fd %d: peer pid %d died without answering our leave (%s)%s", fd,
                   c->peer ? int(c->peer->pid) : 0, reason_name(why),
                   lost ? ", with bytes of it unread here: lost for whoever the socket goes to" : "");
            return lost ? -ECONNRESET : 0;
        }
        SD_LOG(debug, "fd %d: leave (%s) after the peer's close or a broken stream", fd,
               reason_name(why));
        return 0;
    }
    if (n && !give) {
        SD_LOG(error, "fd %d: no memory to return %u unread bytes", fd, n);
        c->broken = true;
        return -ENOMEM;
    }
    int rc = 0;
    std::uint32_t at = 0;
    do {
        // Inline messages, as data: within the provider's inject size.
        std::uint32_t len = std::min(n - at, chunk_);
        iovec v{give + at, len};
        const bool last = at + len == n;
        rc = post(c, MsgType::give_back, &v, len ? 1 : 0, len, from + at, deadline,
                  last ? kGiveBackLast : 0);
        at += len;
    } while (rc == 0 && at < n);
    std::free(give);
    if (rc) {
        SD_LOG(error, "fd %d: returning %u unread bytes failed: %s", fd, n, std::strerror(-rc));
        return rc;
    }
    ring(c);
    // Received on the fabric and returned unread: they come again through
    // the kernel, counted there, so the fabric's count gives them back.
    if (n) c->stat->rx_fabric.fetch_sub(n, std::memory_order_relaxed);
    SD_LOG_CONN(info, *c->stat, "back to the kernel: %s, at offsets %llu sent, %llu received; "
                                "%u unread bytes returned to pid %d", reason_name(why),
           (unsigned long long)c->tx_end.load(std::memory_order_relaxed), (unsigned long long)from, n, int(c->peer->pid));
    // Our staged bytes go into the kernel now, before another holder's.
    tx.lock();
    // A signal does not end it: the socket's other holders need these
    // bytes on the kernel before anything of theirs, and the handoff our
    // offsets after them.
    int frc;
    do frc = leave_flush_locked(c, true, deadline);
    while (frc == -EINTR && monotonic_ns() < deadline);
    if (frc != 0) {
        SD_LOG(error, "fd %d: writing what we owe the kernel after our leave failed: %s; its "
                      "handoff is not given the offsets", fd, std::strerror(frc < 0 ? -frc : EIO));
        return 0;
    }
    // A leave for the handoff's reason: it takes over from our offsets
    // (and may upgrade again: the peer waits for it, rearmed).
    if (const Conn::HandoffRef h = c->handoff(); h && why == h.ops->why)
        h.take(c->tx_off, received);
    return 0;
}

int Engine::hand_on(Conn *c, std::uint64_t &tx, std::uint64_t &rx) noexcept {
    ConnState st = c->state.load(std::memory_order_acquire);
    if (st == ConnState::direct || st == ConnState::leaving)
        if (int rc = leave(c, Reason::inherited); rc < 0) return rc;
    // An upgrade request of ours in flight ends first (bounded).
    (void)wait_until({.nap_ns = 1000000, .max_naps = 200}, 0, [c] {
        const ConnState now = c->state.load(std::memory_order_acquire);
        return now != ConnState::initiating && now != ConnState::committing;
    });
    std::lock_guard lock(conn_lock_);
    std::lock_guard tx_guard(c->tx_lock);
    std::lock_guard rx_guard(c->rx_lock);
    st = c->state.load(std::memory_order_acquire);
    if (st != ConnState::kernel && st != ConnState::final) return -EBUSY;
    // Everything of the fabric is over and the kernel socket holds the
    // stream from our offsets on: nothing owed, nothing unread of the
    // peer's fabric stream, no end of stream either way.
    if (c->broken || c->staged || c->tx_owed.load(std::memory_order_acquire) ||
        c->shut_wr_deferred.load(std::memory_order_acquire) || c->ring_bytes() ||
        c->fin_off != kNoOffset || c->fin_sent(std::memory_order_relaxed) ||
        c->reset_seen() ||
        c->handoff_ctx.load(std::memory_order_acquire))
        return -EBUSY;
    if (st == ConnState::kernel) {
        // Waiting for the peer: unpublished without a mark (a mark would
        // tell the peer to give the upgrade up; the new image publishes).
        c->barred_why.store(std::uint32_t(Reason::inherited), std::memory_order_relaxed);
        c->upgrades_barred.store(true, std::memory_order_release);
        c->verdict_due.store(false, std::memory_order_relaxed);
        c->move_to(ConnState::final);
        unpublish(c);
    }
    c->stat->reason.store(std::uint32_t(Reason::inherited), std::memory_order_relaxed);
    c->stat->mode.store(std::uint32_t(Mode::kernel), std::memory_order_relaxed);
    tx = c->tx_off;
    rx = c->rx_off;
    return 0;
}

}  // namespace sd::transport
