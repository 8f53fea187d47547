// The direct data path, sending: small writes inline in a message, large
// ones straight into the peer's ring, blocking large ones read zero-copy
// by the peer from the caller's buffer, and any into a buffer the peer's
// recv advertised (its sink); credits, and the waits for them.
#include "conn_impl.hpp"
#include "datapath.hpp"

#include "log.hpp"
#include "memguard.hpp"
#include "protocol.hpp"
#include "regcache.hpp"
#include "settings.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <ctime>

namespace sd::transport {
namespace {

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
    ReaderWatch(Engine *e, const Conn *c, std::uint64_t now) noexcept
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
    Engine *engine_;
    const Conn *conn_;
    std::uint64_t read_;
    std::uint64_t moved_;
};

// Whether a wait's peer is gone, asked by a spinning look: the peer's
// pidfd (a system call) on the first look, every 16th, and the first
// after a sleep (slept()); the looks between see what the connection
// knows (gone()). A poll per look was a third of a 64 KiB read
// zero-copy ping-pong's time on the sending side.
struct PeerGone {
    unsigned looks = 0;
    bool now(Engine *e, Conn *c) noexcept {
        return c->gone() || ((looks++ & 15) == 0 && !e->peer_alive(c->peer));
    }
    void slept() noexcept { looks = 0; }
};

// Read zero-copy, send side: advertises `len` bytes and waits until they
// were read, at most until `deadline` (0: none; SO_SNDTIMEO: then the
// advertisement is cancelled and the caller goes on buffered). Bytes taken
// or -errno; `*cut`: -EINTR if a signal cut the send short, else 0.
long send_zcopy(const SocketSide &s, Conn *c, const char *buf, std::uint32_t len,
                std::uint64_t deadline, int *cut) noexcept {
    RegCache::Ref reg;
    const std::uint64_t off = c->tx_off;
    if (int rc = s.engine->advertise(c, buf, len, &reg)) return rc;
    // The reader copies our buffer now: spin for about as long as that
    // takes (len / 4 ns: 4 GB/s), not only the usual spin, so that the
    // answer does not find us asleep (a wake-up costs more than the spin).
    // A reader that does not come: the kernel's send buffer would have
    // taken these bytes without it, and a program may well wait for this
    // send before it tells its peer to read. So the advertisement lasts
    // while the reader reads (its read counter moves); once it has been
    // still for kReaderPatienceNs the advertisement is cancelled and the
    // rest goes buffered, as far as the window takes it.
    struct Answer : BellWaiter {
        const SocketSide &s;
        std::uint64_t off;
        std::uint32_t len;
        std::uint64_t deadline;  // SO_SNDTIMEO's: cancels, does not end the wait
        int *cut;
        ReaderWatch reader;
        PeerGone gone;
        bool cancelled = false;
        // A cancellation for the caller (timeout, signal): when it was
        // asked, and when the reader's control thread was last kicked for
        // its answer.
        std::uint64_t asked = 0, kicked = 0, kick_at = 0;

        long look() noexcept {
            s.engine->progress();
            if (c->zc_answer_off.load(std::memory_order_acquire) == off)
                return long(c->zc_answer_len.load(std::memory_order_relaxed));
            s.engine->maybe_return_credits(c);
            if (gone.now(s.engine, c)) {
                // The reader is gone. What it read of the buffer was sent,
                // as by a TCP send cut short (its counters say how much:
                // every fabric byte of ours before the advertisement was
                // read first); if nothing, the send fails.
                const std::uint64_t read = s.engine->peer_read(c);
                const std::uint64_t before =
                    c->stat->tx_fabric.load(std::memory_order_relaxed) - c->tx_fabric_base;
                return read != kNoOffset && read > before
                           ? long(std::min<std::uint64_t>(read - before, len))
                           : -EPIPE;
            }
            if (!cancelled && zcopy_should_yield(c)) {
                cancelled = s.engine->cancel_advert(c, off) == 0;
                return kLookAgain;
            }
            const std::uint64_t now = monotonic_ns();
            if (!cancelled && reader.idle(now)) {
                cancelled = s.engine->cancel_advert(c, off) == 0;
                asked = now;
                return kLookAgain;
            }
            if (deadline && now >= deadline && !cancelled) {
                // SO_SNDTIMEO: what was read counts; the rest goes
                // buffered, as far as the window takes it (the kernel's
                // send buffer would have taken it too), or the send times
                // out there.
                cancelled = s.engine->cancel_advert(c, off) == 0;
                asked = now;
                return kLookAgain;
            }
            // No answer yet: the reader may be busy outside the library,
            // so its control thread answers the cancellation.
            kick_at = asked ? s.engine->kick_overdue(c->peer, asked, &kicked) : 0;
            return kWaitOn;
        }
        int sleep(std::uint64_t) noexcept {
            gone.slept();
            return sleep_once(e, c, -1, 0, zcopy_answered, c,
                              kick_at     ? ms_left(kick_at)
                              : cancelled ? -1
                                          : ms_left(reader.due(deadline)));
        }
        long interrupted() noexcept {
            if (!cancelled &&
                !keep_going_after_eintr(s.sndtimeo_ns.load(std::memory_order_relaxed))) {
                // As a TCP send hit by a signal: what was taken counts,
                // the rest is not sent. The reader may be copying right
                // now, so the answer (how much) must come before we return.
                *cut = -EINTR;
                cancelled = s.engine->cancel_advert(c, off) == 0;
                asked = monotonic_ns();
            }
            return kWaitOn;
        }
    } w{{s.engine, c, zcopy_answered, c, -1, 0,
         std::uint64_t(settings().spin_us) * 1000 + std::min<std::uint64_t>(len / 4, 2'000'000)},
        s, off, len, deadline, cut, ReaderWatch(s.engine, c, monotonic_ns())};
    SpinSlot slot;
    const long result = wait_on_bell(w, slot);
    s.engine->release_advert(reg);
    if (result > 0) {
        c->tx_off += std::uint64_t(result);
        bump(c->stat->tx_fabric, std::uint64_t(result));
        bump(c->stat->tx_zcopy, std::uint64_t(result));
    }
    return result;
}

// Until `need` bytes of credit are there: 0, -EAGAIN (deadline),
// -EINTR, -EPIPE, or -ESTALE (the connection leaves the fabric).
int wait_credit(const SocketSide &s, Conn *c, std::uint64_t deadline,
                std::int64_t need = 1) noexcept {
    CreditWait want{c, need};
    struct Credit : BellWaiter {
        const SocketSide &s;
        std::int64_t need;
        PeerGone gone;
        long look() noexcept {
            s.engine->progress();
            // A leave first: it needs the send lock we hold, and the peer
            // waiting for our answer returns no credits meanwhile.
            if (leave_requested(c)) return -ESTALE;
            if (c->credits.load(std::memory_order_acquire) >= need) return 0;
            // Credits our reader owes the peer go out too: if both sides
            // wait for credits, each must return what it has consumed.
            s.engine->maybe_return_credits(c);
            if (gone.now(s.engine, c)) return -EPIPE;
            return kWaitOn;
        }
        int sleep(std::uint64_t now) noexcept {
            gone.slept();
            return BellWaiter::sleep(now);
        }
    } w{{s.engine, c, enough_credit, &want, -1, 0, std::uint64_t(settings().spin_us) * 1000,
         deadline, s.sndtimeo_ns.load(std::memory_order_relaxed)},
        s, need};
    SpinSlot slot;
    return int(wait_on_bell(w, slot));
}

// The credits, after a progress pass (try-lock) if they are short of
// `need`.
std::int64_t credit_after_progress(const SocketSide &s, Conn *c, std::size_t need) noexcept {
    std::int64_t credit = c->credits.load(std::memory_order_acquire);
    if (credit >= std::int64_t(need)) return credit;
    // Credits the reader returned may wait in our queue: only a progress
    // pass takes them in, and a sender that neither polls nor reads (it
    // retries after a sleep) would otherwise never see them.
    s.engine->progress();
    return c->credits.load(std::memory_order_acquire);
}

// What a failed post tells the application: -EPIPE (or the reset's
// error once, after a reset) when the peer closed meanwhile; 0 when
// this send is the one a closed peer takes (first_send_to_closed).
int send_failed(const SocketSide &s, Conn *c, int rc) noexcept {
    // A write into the peer's ring failed while the peer lives: it closed
    // (its ring is out of reach), and its CLOSE, posted before, waits in
    // our queue.
    if (rc == -EIO) {
        s.engine->progress_blocking();
        if (c->gone()) rc = -EPIPE;
    }
    if (rc == -EPIPE && !c->fin_sent(std::memory_order_seq_cst)) {
        if (int e = c->take_reset()) rc = -e;
        // Its CLOSE came only now: this is the send that TCP takes (0).
        else if (s.first_send_to_closed(c)) rc = 0;
    }
    return rc;
}

// Posts `len` bytes inline, in one message, into the peer's ring.
int post_inline(const SocketSide &s, Conn *c, const iovec *iov, int iovcnt, std::uint32_t len,
                std::uint64_t deadline) noexcept {
    if (int rc = s.engine->post(c, MsgType::data, iov, iovcnt, len, c->tx_off, deadline))
        return rc;
    s.engine->sent_into_ring(c, len);
    return 0;
}

// One direct_send past its first checks: what the choice of protocol
// reads and what each protocol's step advances.
struct SendCall {
    const SocketSide &s;
    Conn *c;
    const iovec *iov;
    int iovcnt;
    std::size_t total;
    std::uint64_t deadline;  // SO_SNDTIMEO's (0: none)
    std::uint64_t post_by;   // a full peer queue is waited for until this
    bool zc_ok;              // read zero-copy may still be chosen
    std::size_t sent = 0;
    bool interrupted = false;  // by a signal, in read zero-copy: no more waiting
    std::int64_t credit = 0;   // the window, when ring or buffered was chosen
    iovec piece{};             // zcopy: the rest of the iov piece we are in
};

// A step's result besides 0 (go on) and -errno: the send is over with
// what it sent.
constexpr int kSendOver = 1;

// Up to `most` bytes of the window (`k.credit`) in up to `pieces` iov
// pieces. A write of the ring whose first four pieces hold no more than a
// message takes goes inline all the same (one message, no write).
int post_step(SendCall &k, std::size_t most, int pieces) noexcept {
    iovec v[4];
    int n_v = slice(k.iov, k.iovcnt, k.sent, most, v, pieces);
    const std::size_t n = iov_total(v, n_v);
    int rc;
    if (n > k.s.engine->chunk()) {
        // Copied into the ring by the provider or by the kernel, neither
        // guarded (nor told apart from a peer's ring out of reach): a bad
        // buffer is found first. A message's is looked at by Engine::post.
        if (!readable_iov(v, n_v, n)) return -EFAULT;
        rc = k.s.engine->post_ring(k.c, v, n_v, std::uint32_t(n), k.post_by);
        if (rc == 0) k.s.engine->sent_into_ring(k.c, std::uint32_t(n));
    } else {
        rc = post_inline(k.s, k.c, v, n_v, std::uint32_t(n), k.post_by);
    }
    if (rc) {
        rc = send_failed(k.s, k.c, rc);
        if (rc == 0) {
            k.sent = k.total;  // the rest to nobody, as TCP's
            return kSendOver;
        }
        return rc;
    }
    k.sent += n;
    return 0;
}

// buffered: copied inline into messages, at most three pieces beside the
// header.
int send_buffered(SendCall &k) noexcept {
    const std::size_t left = k.total - k.sent;
    return post_step(k, std::min<std::size_t>({left, k.s.engine->chunk(), std::size_t(k.credit)}),
                     3);
}

// ring: written into the peer's ring, at most half of it at once.
int send_ring(SendCall &k) noexcept {
    const std::size_t left = k.total - k.sent;
    return post_step(
        k, std::min<std::size_t>({left, std::size_t(k.credit), k.c->peer_ring_cap / 2}), 4);
}

// zcopy: the piece advertised and read by the peer while we wait.
int send_zcopy_piece(SendCall &k) noexcept {
    const char *p = static_cast<const char *>(k.piece.iov_base);
    std::uint32_t len = std::uint32_t(std::min<std::size_t>(k.piece.iov_len, 1u << 30));
    if (!readable(p, len)) return -EFAULT;
    int cut = 0;
    long r = send_zcopy(k.s, k.c, p, len, k.deadline, &cut);
    if (r < 0) return int(r);
    k.sent += std::size_t(r);
    if (cut) {
        // A signal: what was read counts; if nothing was, what the window
        // takes now without waiting, as the kernel's send buffer would
        // have; else EINTR.
        if (r > 0) return kSendOver;
        k.interrupted = true;
        k.zc_ok = false;
        return 0;
    }
    // Cut short (the peer had to be let through): the rest of this send
    // goes buffered.
    if (std::uint32_t(r) < len) k.zc_ok = false;
    return 0;
}

// Each protocol's step, indexed by Protocol: sends some of what is left
// of the call, 0 (more may go), kSendOver or -errno.
using SendStep = int (*)(SendCall &k) noexcept;
constexpr std::size_t kProtocols = std::size_t(Protocol::zcopy) + 1;
constinit const std::array<SendStep, kProtocols> send_steps = [] {
    std::array<SendStep, kProtocols> t{};
    t[std::size_t(Protocol::buffered)] = send_buffered;
    t[std::size_t(Protocol::ring)] = send_ring;
    t[std::size_t(Protocol::zcopy)] = send_zcopy_piece;
    return t;
}();

// The protocol of the call's next bytes, chosen here alone (by the policy
// of protocol.hpp, and what the peer can take). Read zero-copy needs no
// window: it is weighed first, and the credit is looked at (k.credit)
// only when it is not chosen.
Protocol pick(SendCall &k) noexcept {
    if (k.zc_ok) {
        slice(k.iov, k.iovcnt, k.sent, k.total - k.sent, &k.piece, 1);
        // Not to a peer of another uid: its read would go through the
        // provider's SAR buffers (two copies, no gain), and with ring
        // writes going through them the other way an echo between
        // users hung in 2 of 10 runs (none in 10 without zero-copy).
        if (use_zcopy(k.piece.iov_len) && !(k.c->peer && k.c->peer->cross))
            return Protocol::zcopy;
    }
    k.credit = credit_after_progress(k.s, k.c, 1);
    return k.c->peer_ring_addr && use_ring(k.total - k.sent, k.credit) ? Protocol::ring
                                                                       : Protocol::buffered;
}

}  // namespace

int flush_locked(const SocketSide &s, Conn *c, bool blocking, std::uint64_t deadline) noexcept {
    while (c->staged) {
        if (c->credits.load(std::memory_order_acquire) < std::int64_t(c->staged)) {
            if (!blocking) {
                s.engine->want_flush(c);
                return -EAGAIN;
            }
            // All of the stage goes in one message: wait for that much.
            if (int w = wait_credit(s, c, deadline, std::int64_t(c->staged))) {
                if (w == -EAGAIN || w == -EINTR) s.engine->want_flush(c);
                return w;
            }
            continue;
        }
        if (int rc = s.engine->post_stage_locked(c, deadline)) {
            if (rc == -EAGAIN) s.engine->want_flush(c);
            return rc;
        }
    }
    return 0;
}

ssize_t direct_send(const SocketSide &s, Conn *c, const iovec *iov, int iovcnt, std::size_t total,
                    int flags, bool *left) noexcept {
    if (leave_requested(c)) {
        *left = true;
        return -ESTALE;
    }
    // The peer closed its end and its CLOSE waits in our queue, or its
    // process ended: a send that finds credits takes nothing in, so a
    // process that only writes would go on sending into the closed
    // connection, where TCP's second send fails with EPIPE. Its process
    // page says it closed (the slot's first line, which it writes when the
    // connection opens and closes only); the control thread marks a peer
    // whose process ended. A peer of another uid's page costs a system
    // call to read, and its messages all come through our queue from it:
    // a progress pass (no system call) takes its CLOSE in, once a
    // millisecond at most (TCP's reset takes its time to come back too).
    if (!c->gone() && c->peer) {
        const bool ended = std::atomic_ref<bool>(c->peer->ended).load(std::memory_order_acquire);
        if (c->peer->cross && !ended) {
            const std::uint64_t now = monotonic_ns();
            if (now >= c->close_look_ns) {
                c->close_look_ns = now + 1000000;
                s.engine->progress_for(c);
            }
        } else if (ended || s.engine->peer_conn_closed(c)) {
            s.engine->progress_blocking();
            if (ended && !c->gone()) s.engine->peer_died(c);
        }
    }
    if (c->gone() || wr_shut(c, s.kernel_wr_shut)) {
        SD_LOG(debug, "fd %d: send refused: %s", s.kfd(),
               wr_shut(c, s.kernel_wr_shut) ? "shut down for writing"
               : c->broken                  ? "connection broken"
                                            : "peer closed");
        if (int e = wr_shut(c, s.kernel_wr_shut) ? 0 : c->take_reset())
            return e == EPIPE ? epipe(flags) : -e;
        if (s.first_send_to_closed(c)) return ssize_t(total);  // to nobody, as TCP's
        return epipe(flags);
    }
    if (!c->tx_fabric) {
        c->tx_fabric = true;
        SD_LOG(debug, "fd %d: send switch point at offset %llu", s.kfd(),
               (unsigned long long)c->tx_off);
    }
    const bool nb = s.nonblock.load(std::memory_order_relaxed) || (flags & MSG_DONTWAIT);
    const std::int64_t tmo = s.sndtimeo_ns.load(std::memory_order_relaxed);
    const std::uint64_t deadline = tmo ? monotonic_ns() + std::uint64_t(tmo) : 0;
    // Messages wait for room in the peer's queue until this: a full queue
    // is a full window to a non-blocking send (EAGAIN), if only briefly.
    const std::uint64_t post_by = nb ? monotonic_ns() + kQueueWaitNs : deadline;
    const std::uint32_t chunk = s.engine->chunk();

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
        (c->psink_seen.load(std::memory_order_relaxed) || s.engine->sink_ok()))
        s.engine->progress();
    if (!c->staged && c->psink_valid.load(std::memory_order_acquire)) {
        long r = s.engine->take_sink(c, iov, iovcnt, total);
        if (r == -EPIPE) return epipe(flags);
        if (r < 0) return r;
        if (std::size_t(r) == total) return r;
        if (r > 0) {
            iovec rest[kMaxSlice];
            int k = slice(iov, iovcnt, std::size_t(r), total - std::size_t(r), rest, kMaxSlice);
            ssize_t more_sent = direct_send(s, c, rest, k, iov_total(rest, k), flags, left);
            return more_sent > 0 ? r + more_sent : r;
        }
    }
    if (!c->staged && total <= chunk && credit_after_progress(s, c, total) >= std::int64_t(total)) {
        // The common small write, buffered as any of at most a message's
        // bytes: straight from the caller's buffer in one message.
        iovec v[3];
        int k = slice(iov, iovcnt, 0, total, v, 3);
        if (iov_total(v, k) == total) {
            int rc = post_inline(s, c, v, k, std::uint32_t(total), post_by);
            if (rc == 0) {
                s.engine->ring(c);
                return ssize_t(total);
            }
            rc = send_failed(s, c, rc);
            if (rc == 0) return ssize_t(total);  // to nobody, as TCP's
            if (rc == -EPIPE) return epipe(flags);
            if (rc != -EAGAIN) return rc;
        }
    }
    if (int rc = flush_locked(s, c, !nb, deadline)) {
        if (rc == -EPIPE) return epipe(flags);
        *left = rc == -ESTALE;
        return rc;
    }

    // Read zero-copy only for blocking sends (the peer reads them straight
    // from the caller's buffer while we wait, at most until SO_SNDTIMEO's
    // deadline); which pieces: transport/protocol.hpp. A large send that
    // follows another with nothing taken in from the peer meanwhile is a
    // stream's, whose pieces may go through the ring instead
    // (stream_by_ring); a request-response exchange takes the answer in
    // between two sends.
    const bool large = total > settings().chunk;
    bool zc_ok = !nb && large && s.engine->can_read();
    if (large) {
        const std::uint64_t heard = c->stat->rx_fabric.load(std::memory_order_relaxed);
        if (heard == c->large_send_heard && c->peer_ring_addr &&
            stream_by_ring(total, c->peer_ring_cap))
            zc_ok = false;
        c->large_send_heard = heard;
    }
    SendCall k{s, c, iov, iovcnt, total, deadline, post_by, zc_ok};
    int rc = 0;
    while (k.sent < total) {
        // A leave takes the connection between two sends, or where this one
        // would wait for credits (wait_credit): the pieces of a send that
        // waits for nothing stay together in the stream, as the kernel
        // never splits a send that finds room in its buffer to let another
        // writer's bytes in between (a fork child's first write asks for
        // the leave, and its bytes go to the kernel once it is done).
        if (k.sent == 0 && leave_requested(c)) {
            rc = -ESTALE;
            break;
        }
        // The peer's recv advertised its buffer meanwhile: straight into it.
        if (c->psink_valid.load(std::memory_order_acquire) && !c->staged) {
            iovec rest[kMaxSlice];
            int n_v = slice(iov, iovcnt, k.sent, total - k.sent, rest, kMaxSlice);
            long r = s.engine->take_sink(c, rest, n_v, iov_total(rest, n_v));
            if (r < 0) {
                rc = int(r);
                break;
            }
            if (r > 0) {
                k.sent += std::size_t(r);
                continue;
            }
        }
        const Protocol p = pick(k);
        if (p != Protocol::zcopy && k.credit <= 0) {
            s.engine->ring(c);
            if (nb || k.interrupted) {
                rc = k.interrupted ? -EINTR : -EAGAIN;
                break;
            }
            if ((rc = wait_credit(s, c, deadline))) break;
            continue;
        }
        if (int r = send_steps[std::size_t(p)](k)) {
            rc = r < 0 ? r : 0;
            break;
        }
    }
    const std::size_t sent = k.sent;
    if (sent) s.engine->ring(c);
    *left = rc == -ESTALE;
    // EAGAIN with credits left: the peer's queue stayed full (post_by).
    // Readiness still says writable, but an edge-triggered waiter is told
    // only of credits coming back, which may never happen: a new edge, so
    // that it tries again.
    if (rc == -EAGAIN && c->credits.load(std::memory_order_acquire) > 0) {
        c->tx_seq.fetch_add(1, std::memory_order_release);
        mark_touched(c);
    }
    if (sent) return ssize_t(sent);
    if (rc == -EPIPE) return epipe(flags);
    return rc;
}

}  // namespace sd::transport
