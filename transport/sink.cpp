// Write zero-copy (SDP SinkAvail): a blocking recv that finds
// nothing to read advertises the application's buffer; the peer's next
// send writes straight into it and says how much with sink_done, so the
// bytes are copied once and the sender does not wait for the reader's
// application.
//
// Order: a sink names the stream offset it starts at. The sender takes it
// only when that is its next byte (nothing of its own in flight, nothing
// staged), and its sink_done precedes every later message, so the bytes
// land in stream order.
//
// Who may touch the buffer, two ways (sink_by_cma() chooses, the sender
// follows the advertisement's key):
// * One host, process_vm_writev: one word in the receiver's process page
//   (ConnStat::sink_word), which the peer maps writable, settles it: the
//   receiver opens it (seq | open), the sender claims it (open -> taken)
//   before copying, and the receiver cancels it (open -> cancelled)
//   without a round trip. Only a claimed sink makes the receiver wait,
//   for a sender that is inside send() copying (or dead).
// * Elsewhere (SDIRECT_CMA=0, other providers, other hosts): the buffer is
//   registered for remote writes and written with fi_writemsg; sink_done
//   goes only once the write's completion says the bytes are in the
//   receiver's memory (sink_write_flags). Without a shared word the end is
//   two-sided. The sender's stream is ordered and it never takes a sink at
//   or before the offset of a stream message it already sent (Conn::
//   tx_mark), so any stream message that reaches the receiver after its
//   advertisement ends the sink with nothing written: the common cases
//   (other bytes, an advertisement crossing ours, a FIN, a leave) need no
//   round trip. Only a timeout, a signal, our own leave or an event on the
//   companion socket ask (sink_cancel); the sender answers with sink_done:
//   what it wrote, or 0. A peer whose threads are all outside the library
//   answers too: past Engine::kKickAfterNs its control thread is asked to progress
//   (one host; between hosts that needs the broker, not built yet).
//
//   A sink is registered for its recv alone (never through the
//   registration cache: a registration kept after the recv returned would
//   leave the application's memory writable by the peer), within half the
//   soft RLIMIT_MEMLOCK for all sinks together (a prefix of a larger
//   buffer; none when that is 0). It is deregistered only once nothing
//   can be written into it any more: written, answered, passed by a
//   stream message, or the peer dead (its last messages taken in first).
//   Never on a timer: a write that meets an unknown key hangs its
//   initiator and, on shm 1.17, stops the receiver's command queue for
//   every peer (seen here: "unknown key", then nothing more), and on RC
//   hardware a remote access error ends the queue pair. finish_sink()
//   deregisters under the progress lock, so a write the provider places
//   during our own progress (shm's delivery-complete writes) is over
//   before.
#include "conn_impl.hpp"
#include "sink.hpp"

#include "engine.hpp"
#include "log.hpp"
#include "memguard.hpp"
#include "settings.hpp"
#include "sys.hpp"
#include "wait.hpp"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <new>
#include <sys/resource.h>

namespace sd::transport {
namespace {

// How long one attempt to post the sink_cancel may wait for room in the
// peer's queue (a peer that does not progress has none): kicked, retried.
constexpr std::uint64_t kSinkCancelPostNs = 1000000;

}  // namespace

std::uint64_t sink_write_flags(const fi_info *info) noexcept {
    const std::uint64_t tx = info && info->tx_attr ? info->tx_attr->msg_order : 0;
    const std::uint64_t rx = info && info->rx_attr ? info->rx_attr->msg_order : 0;
    return (tx & rx & FI_ORDER_SAW) ? 0 : FI_DELIVERY_COMPLETE;
}

bool Engine::sink_ok() const noexcept { return settings().sink_min != 0; }

bool Engine::sink_by_cma(const Conn *c) const noexcept {
    return cma_with(c) && c->peer && c->peer->page;
}

std::uint32_t Engine::reserve_sink(std::uint32_t want) noexcept {
    rlimit r{};
    std::uint64_t limit = kNoOffset;
    if (getrlimit(RLIMIT_MEMLOCK, &r) == 0 && r.rlim_cur != RLIM_INFINITY) limit = r.rlim_cur;
    std::uint64_t held = sink_bytes_.load(std::memory_order_relaxed);
    for (int tries = 0; tries < 64; ++tries) {
        const std::uint64_t fit = sink_budget_fit(want, held, limit);
        if (!fit) return 0;
        if (sink_bytes_.compare_exchange_weak(held, held + fit, std::memory_order_relaxed))
            return std::uint32_t(fit);
    }
    return 0;
}

int Engine::advertise_sink(Conn *c, void *buf, std::uint32_t len) noexcept {
    // Not across users: the provider's write would copy through its SAR
    // buffers, which gains nothing, and bulk RMA both ways through them
    // hung (see use_zcopy's caller in Stream::send).
    if (c->peer && c->peer->cross) return -EAGAIN;
    const bool cma = sink_by_cma(c);
    fid_mr *mr = nullptr;
    std::uint32_t held = 0;
    SinkAvailBody body{reinterpret_cast<std::uint64_t>(buf), 0, kSrcNoKey};
    if (!cma) {
        // A prefix of a buffer larger than the budget; none below the
        // setting (the usual way is as good for so few bytes).
        held = reserve_sink(std::min(len, kMaxSink));
        if (held < std::max<std::uint32_t>(settings().sink_min, 1)) {
            sink_bytes_.fetch_sub(held, std::memory_order_relaxed);
            return -EAGAIN;
        }
        len = held;
        Guard guard;
        InProvider in;
        int rc = !in.ok() ? -FI_ECANCELED
                          : fi_mr_reg(ep_.domain, buf, len, FI_REMOTE_WRITE, 0,
                                      zc_keys_.fetch_add(1, std::memory_order_relaxed), 0, &mr,
                                      nullptr);
        if (rc) {
            sink_bytes_.fetch_sub(held, std::memory_order_relaxed);
            SD_LOG(debug, "conn %u: registering a recv buffer failed: %s", c->id,
                   fabric_strerror(rc));
            return -EAGAIN;  // no sink: the usual way
        }
        body.key = fi_mr_key(mr);
    }
    std::uint64_t off = 0;
    {
        std::lock_guard lock(c->rx_lock);
        // Only with an empty queue: everything the peer sent so far is
        // read, and no advertisement of its own waits.
        const bool ok = !c->sink.active && !c->sink_mr && c->is_direct() && !c->gone() &&
                        !c->ring_bytes() && !c->zc.active && c->switch_off != kNoOffset &&
                        c->rx_off == c->rx_expect() && c->fin_off == kNoOffset &&
                        c->peer_end == kNoOffset && c->peer && (!cma || c->peer->page);
        if (ok) {
            c->sink = SinkAvail{};
            c->sink.active = true;
            c->sink.rma = !cma;
            c->sink.seq = ++c->sink_seq;
            c->sink.off = off = c->rx_off;
            c->sink.len = len;
            if (cma) c->stat->sink_word.store(c->sink.seq << 2 | kSinkOpen, std::memory_order_release);
            c->sink_mr = mr;
            c->sink_held = held;
            body.seq = c->sink.seq;
        }
        if (!ok && mr) {
            Guard guard;
            InProvider in;
            if (in.ok()) fi_close(&mr->fid);  // never advertised
            sink_bytes_.fetch_sub(held, std::memory_order_relaxed);
        }
        if (!ok) return -EAGAIN;
    }
    iovec v{&body, sizeof body};
    if (post(c, MsgType::sink_avail, &v, 1, sizeof body, off, 0, len) != 0) {
        // The peer never heard of it.
        if (cma) (void)cancel_sink(c);
        (void)finish_sink(c);
        return -EAGAIN;
    }
    ring(c);
    c->stat->sinks.fetch_add(1, std::memory_order_relaxed);
    return 0;
}

int Engine::cancel_sink(Conn *c) noexcept {
    std::uint64_t seq = 0, off = 0;
    {
        std::lock_guard lock(c->rx_lock);
        if (!c->sink.active) return 0;
        if (c->sink.done || c->sink.over || c->sink.asked) return 1;
        if (!c->sink.rma) {
            std::uint64_t open = c->sink.seq << 2 | kSinkOpen;
            if (!c->stat->sink_word.compare_exchange_strong(
                    open, c->sink.seq << 2 | kSinkCancelled, std::memory_order_acq_rel))
                return 1;  // taken: the sender is writing it, sink_done follows
            c->sink.active = false;
            c->stat->sink_cancels.fetch_add(1, std::memory_order_relaxed);
            return 0;
        }
        seq = c->sink.seq;
        off = c->sink.off;
    }
    // Not posted (no room in the peer's queue, or the peer is gone):
    // sink_writer_lost() tries again or says so.
    iovec v{&seq, sizeof seq};
    if (peer_alive(c->peer) && post(c, MsgType::sink_cancel, &v, 1, sizeof seq, off,
                                    monotonic_ns() + kSinkCancelPostNs) == 0) {
        ring(c);
        std::lock_guard lock(c->rx_lock);
        c->sink.asked = true;
    }
    return 1;
}

bool Engine::sink_writer_lost(Conn *c, std::uint64_t asked_ns) noexcept {
    bool rma, asked;
    std::uint64_t kicked;
    {
        std::lock_guard lock(c->rx_lock);
        rma = c->sink.rma;
        asked = c->sink.asked;
        kicked = c->sink.kicked_ns;
    }
    // Claimed on one host: its writer is inside send(), copying.
    if (!rma) return c->gone() || !peer_alive(c->peer);
    // A peer that broke the protocol gets its writes refused from now on.
    if (c->broken.load(std::memory_order_relaxed)) return true;
    if (!peer_alive(c->peer)) {
        // What it posted before it died is in our queue (its sink_done, or
        // a write still to be placed): take it in before the sink goes.
        progress_blocking();
        return true;
    }
    if (!asked) (void)cancel_sink(c);
    const std::uint64_t before = kicked;
    (void)kick_overdue(c->peer, asked_ns, &kicked);
    if (kicked != before) {
        std::lock_guard lock(c->rx_lock);
        c->sink.kicked_ns = kicked;
    }
    return false;
}

std::uint32_t Engine::finish_sink(Conn *c) noexcept {
    fid_mr *mr;
    std::uint32_t got, held;
    bool unwritten;
    {
        std::lock_guard lock(c->rx_lock);
        got = c->sink.done ? c->sink.got : 0;
        unwritten = c->sink.active && c->sink.rma && !c->sink.done;
        c->sink.active = false;
        mr = c->sink_mr;
        held = c->sink_held;
        c->sink_mr = nullptr;
        c->sink_held = 0;
        c->wake_locked();  // other readers: the offsets moved
    }
    if (mr) {
        // From here on no write lands in the buffer. The progress lock
        // waits out a progress pass that may be placing one right now.
        ProgressHeld fence(*this);
        Guard guard;
        InProvider in;
        if (in.ok()) fi_close(&mr->fid);
    }
    sink_bytes_.fetch_sub(held, std::memory_order_relaxed);
    if (unwritten) c->stat->sink_cancels.fetch_add(1, std::memory_order_relaxed);
    return got;
}

void Engine::sink_passed_locked(Conn *c) noexcept {
    if (c->sink.active && c->sink.rma && !c->sink.done) c->sink.over = true;
}

long Engine::take_sink(Conn *c, const iovec *iov, int iovcnt, std::size_t len) noexcept {
    PeerSink ps;
    {
        std::lock_guard lock(c->rx_lock);
        if (!c->psink_valid.exchange(false, std::memory_order_acq_rel)) return 0;
        ps = c->psink;  // used or stale: one try each
        if (ps.key != kSrcNoKey) {
            if (ps.off > c->tx_off) {
                SD_LOG(error, "conn %u: sink at offset %llu, past our %llu: connection broken",
                       c->id, (unsigned long long)ps.off, (unsigned long long)c->tx_off);
                c->broken = true;
                return -EPIPE;
            }
            // Not ours to write (the receiver reads our message at or past
            // its offset as its end), or not our next byte.
            if (!rma_sink_takeable(ps.off, c->tx_off, c->staged != 0,
                                   c->tx_mark.load(std::memory_order_relaxed)))
                return 0;
            c->psink_busy = ps.seq;  // a sink_cancel now is answered by our sink_done
        }
    }
    // Across users the peer's page is mapped read only and no claim word
    // is ever offered: such an advertisement is left untaken.
    if (ps.key == kSrcNoKey && c->peer && c->peer->cross) return 0;
    return ps.key == kSrcNoKey ? take_sink_cma(c, ps, iov, iovcnt, len)
                               : take_sink_rma(c, ps, iov, iovcnt, len);
}

namespace {
// As much of iov as `cap` bytes and `max_pieces` pieces hold.
int gather(const iovec *iov, int iovcnt, std::size_t cap, int max_pieces, iovec *out,
           std::size_t *n) noexcept {
    int k = 0;
    *n = 0;
    for (int i = 0; i < iovcnt && k < max_pieces && *n < cap; ++i) {
        if (!iov[i].iov_len) continue;
        out[k] = iov[i];
        out[k].iov_len = std::min(iov[i].iov_len, cap - *n);
        *n += out[k++].iov_len;
    }
    return k;
}
}  // namespace

long Engine::take_sink_cma(Conn *c, const PeerSink &ps, const iovec *iov, int iovcnt,
                           std::size_t len) noexcept {
    // Not our next byte (ours crossed its advertisement): the receiver
    // cancels it when our bytes come.
    if (ps.off != c->tx_off || c->staged || !c->peer || !c->peer->page) return 0;
    // As much as it holds, from as many pieces of ours as one copy takes.
    iovec local[kMaxRmaIov];
    std::size_t n = 0;
    const int k = gather(iov, iovcnt, std::min<std::size_t>(len, ps.len), kMaxRmaIov, local, &n);
    if (!n) return 0;
    if (!readable_iov(local, k, n)) return -EFAULT;
    auto &word = c->peer->page->slots[c->peer_id].sink_word;
    std::uint64_t open = ps.seq << 2 | kSinkOpen;
    if (!word.compare_exchange_strong(open, ps.seq << 2 | kSinkTaken, std::memory_order_acq_rel))
        return 0;  // the receiver cancelled it
    iovec remote{reinterpret_cast<void *>(ps.addr), n};
    int rc = cma_copy(c->peer->pid, local, k, &remote, 1, true);
    // Claimed: the receiver waits for our word whatever happened. A copy
    // that failed (the receiver is gone) says 0 bytes.
    std::uint64_t seq = ps.seq;
    iovec v{&seq, sizeof seq};
    const std::uint32_t wrote = rc == 0 ? std::uint32_t(n) : 0;
    int prc = post(c, MsgType::sink_done, &v, 1, sizeof seq, ps.off, 0, wrote);
    if (prc == 0) ring(c);
    if (rc) return rc == -EPIPE || !peer_alive(c->peer) ? -EPIPE : rc;
    if (prc) return prc;
    c->tx_off += n;
    bump(c->stat->tx_fabric, n);
    bump(c->stat->tx_sink, n);
    return long(n);
}

long Engine::take_sink_rma(Conn *c, const PeerSink &ps, const iovec *iov, int iovcnt,
                           std::size_t len) noexcept {
    iovec local[kMaxRmaIov];
    std::size_t n = 0;
    const int k = gather(iov, iovcnt, std::min<std::size_t>(len, ps.len),
                         std::min(rma_iov_limit_, kMaxRmaIov), local, &n);
    int rc = -EAGAIN;  // nothing to write
    if (n && !readable_iov(local, k, n)) rc = -EFAULT;
    else if (n) {
        // The receiver waits in its recv, progressing, until our sink_done:
        // the write completes unless it dies. No deadline: a write given up
        // while it may still be placed would leave the receiver nothing to
        // go by.
        const fi_rma_iov dst{ps.addr, n, ps.key};
        rc = rma(c, local, k, &dst, 1, true, sink_write_flags_);
    }
    // Taken: the receiver hears our word whatever happened, before any
    // later message of ours. 0 bytes when the write failed or was not
    // made (it is over either way: the receiver may deregister).
    std::uint64_t seq = ps.seq;
    iovec v{&seq, sizeof seq};
    const std::uint32_t wrote = rc == 0 ? std::uint32_t(n) : 0;
    int prc = post(c, MsgType::sink_done, &v, 1, sizeof seq, ps.off, 0, wrote);
    if (prc == 0) ring(c);
    {
        std::lock_guard lock(c->rx_lock);
        c->psink_busy = 0;
    }
    if (rc == -EFAULT || rc == -EPIPE) return rc;
    if (prc) return prc;
    if (rc) return 0;  // not written: these bytes go the usual way
    c->tx_off += n;
    bump(c->stat->tx_fabric, n);
    bump(c->stat->tx_sink, n);
    return long(n);
}

void Engine::on_sink_avail(Conn *c, const MsgHeader &h, const char *payload) noexcept {
    SinkAvailBody body{};
    if (h.len == sizeof body) std::memcpy(&body, payload, sizeof body);
    // A number that does not grow, a length past what one recv advertises
    // or an address range that wraps is not a sink of a sane peer.
    if (h.len != sizeof body || !h.flags || h.flags > kMaxSink || body.seq <= c->psink_last ||
        h.offset < c->psink.off || body.addr + h.flags < body.addr) {
        SD_LOG(error, "conn %u: malformed sink advertisement: connection broken", c->id);
        c->broken = true;
        return;
    }
    c->psink_last = body.seq;
    c->psink_seen.store(true, std::memory_order_relaxed);
    c->psink = PeerSink{body.seq, h.offset, body.addr, body.key, h.flags};
    c->psink_valid.store(true, std::memory_order_release);
}

void Engine::on_sink_done(Conn *c, const MsgHeader &h, const char *payload) noexcept {
    std::uint64_t seq = 0;
    if (h.len == sizeof seq) std::memcpy(&seq, payload, sizeof seq);
    const bool current = h.len == sizeof seq && c->sink.active && !c->sink.done &&
                         !c->sink.over && seq == c->sink.seq;
    // The answer 0 to a sink_cancel that crossed the sink's end (a stream
    // message, or the end of our wait): nothing was written.
    if (!current && h.len == sizeof seq && h.flags == 0 && seq && seq <= c->sink_seq) return;
    if (!current || h.offset != c->sink.off || h.offset != c->rx_expect() ||
        h.flags > c->sink.len) {
        SD_LOG(error, "conn %u: sink_done at offset %llu does not match our sink: connection "
                      "broken", c->id, (unsigned long long)h.offset);
        c->broken = true;
        return;
    }
    // The bytes are in the application's buffer: delivered now, so that
    // the offsets (a leave's, a reader's) count them at once.
    c->sink.done = true;
    c->sink.got = h.flags;
    c->sink_total += h.flags;
    c->rx_off += h.flags;
    bump(c->stat->rx_fabric, h.flags);
    bump(c->stat->rx_sink, h.flags);
}

bool Engine::on_sink_cancel(Conn *c, const MsgHeader &h, const char *payload) noexcept {
    std::uint64_t seq = 0;
    if (h.len == sizeof seq) std::memcpy(&seq, payload, sizeof seq);
    if (h.len != sizeof seq || !seq || seq > c->psink_last) {
        SD_LOG(error, "conn %u: cancel of a sink never advertised: connection broken", c->id);
        c->broken = true;
        return false;
    }
    if (c->psink_busy == seq) return false;  // being written: its sink_done answers
    if (c->psink.seq == seq) c->psink_valid.store(false, std::memory_order_release);
    return true;
}

void Engine::answer_sink_cancel(Conn *c, std::uint64_t seq, std::uint64_t off) noexcept {
    iovec v{&seq, sizeof seq};
    if (post(c, MsgType::sink_done, &v, 1, sizeof seq, off, 0, 0) == 0) ring(c);
}

}  // namespace sd::transport
