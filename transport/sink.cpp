// Write zero-copy (SDP SinkAvail, brief §5), on one host: a recv that
// finds nothing to read advertises the application's buffer; the peer's
// next send writes straight into it with process_vm_writev and says how
// much with sink_done, so the bytes are copied once and the sender does not
// wait for the reader.
//
// Who may touch the buffer is settled by one word in the receiver's
// process page (ConnStat::sink_word), which the peer maps writable: the
// receiver opens it (seq | open), the sender claims it (open -> taken)
// before writing, and the receiver cancels it (open -> cancelled) without
// a round trip when other bytes, a timeout or a signal come first. Only a
// claimed sink makes the receiver wait, for a sender that is inside send()
// writing it (or dead).
//
// Order: a sink names the stream offset it starts at. The sender takes it
// only when that is its next byte (nothing of its own in flight, nothing
// staged), and its sink_done precedes every later message, so the bytes
// land in stream order.
#include "engine.hpp"
#include "log.hpp"
#include "memguard.hpp"
#include "settings.hpp"

#include <algorithm>
#include <cstring>

namespace sd::transport {

bool Engine::sink_ok() const noexcept {
    return settings().sink_min && cma_ok_.load(std::memory_order_relaxed);
}

int Engine::advertise_sink(Conn *c, void *buf, std::uint32_t len) noexcept {
    SinkAvailBody body{};
    std::uint64_t off = 0;
    {
        std::lock_guard lock(c->rx_lock);
        // Only with an empty queue: everything the peer sent so far is
        // read, and no advertisement of its own waits.
        if (c->sink.active || !c->is_direct() || c->gone() || c->ring_bytes() || c->zc.active ||
            c->switch_off == kNoOffset || c->rx_off != c->rx_expect() ||
            c->fin_off != kNoOffset || c->peer_end != kNoOffset || !c->peer || !c->peer->page)
            return -EAGAIN;
        c->sink = SinkAvail{};
        c->sink.active = true;
        c->sink.seq = ++c->sink_seq;
        c->sink.off = off = c->rx_off;
        c->sink.len = len;
        c->stat->sink_word.store(c->sink.seq << 2 | kSinkOpen, std::memory_order_release);
        body.addr = reinterpret_cast<std::uint64_t>(buf);
        body.seq = c->sink.seq;
    }
    iovec v{&body, sizeof body};
    if (post(c, MsgType::sink_avail, &v, 1, sizeof body, off, 0, len) != 0) {
        (void)cancel_sink(c);
        return -EAGAIN;
    }
    ring(c->peer);
    c->stat->sinks.fetch_add(1, std::memory_order_relaxed);
    return 0;
}

int Engine::cancel_sink(Conn *c) noexcept {
    std::lock_guard lock(c->rx_lock);
    if (!c->sink.active) return 0;
    if (c->sink.done) return 1;
    std::uint64_t open = c->sink.seq << 2 | kSinkOpen;
    if (!c->stat->sink_word.compare_exchange_strong(open, c->sink.seq << 2 | kSinkCancelled,
                                                    std::memory_order_acq_rel))
        return 1;  // taken: the sender is writing it, sink_done follows
    c->sink.active = false;
    c->stat->sink_cancels.fetch_add(1, std::memory_order_relaxed);
    return 0;
}

std::uint32_t Engine::finish_sink_locked(Conn *c) noexcept {
    const std::uint32_t got = c->sink.done ? c->sink.got : 0;
    c->sink.active = false;
    return got;
}

long Engine::take_sink(Conn *c, const iovec *iov, int iovcnt, std::size_t len) noexcept {
    PeerSink ps;
    {
        std::lock_guard lock(c->rx_lock);
        if (!c->psink_valid.exchange(false, std::memory_order_acq_rel)) return 0;
        ps = c->psink;  // used or stale: one try each
    }
    // Not our next byte (ours crossed its advertisement): the receiver
    // cancels it when our bytes come.
    if (ps.off != c->tx_off || c->staged || !c->peer || !c->peer->page) return 0;
    // As much as it holds, from as many pieces of ours as one copy takes.
    iovec local[kMaxRmaIov];
    int k = 0;
    std::size_t n = 0;
    for (int i = 0; i < iovcnt && k < kMaxRmaIov && n < std::min<std::size_t>(len, ps.len); ++i) {
        if (!iov[i].iov_len) continue;
        local[k] = iov[i];
        local[k].iov_len = std::min(iov[i].iov_len, std::min<std::size_t>(len, ps.len) - n);
        n += local[k++].iov_len;
    }
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
    if (prc == 0) ring(c->peer);
    if (rc) return rc == -EPIPE || !peer_alive(c->peer) ? -EPIPE : rc;
    if (prc) return prc;
    c->tx_off += n;
    bump(c->stat->tx_fabric, n);
    bump(c->stat->tx_sink, n);
    return long(n);
}

void Engine::on_sink_avail(Conn *c, const MsgHeader &h, const char *payload) noexcept {
    SinkAvailBody body;
    if (h.len != sizeof body || !h.flags) {
        SD_LOG(error, "conn %u: malformed sink advertisement: connection broken", c->id);
        c->broken = true;
        return;
    }
    std::memcpy(&body, payload, sizeof body);
    c->psink = PeerSink{body.seq, h.offset, body.addr, h.flags};
    c->psink_valid.store(true, std::memory_order_release);
}

void Engine::on_sink_done(Conn *c, const MsgHeader &h, const char *payload) noexcept {
    std::uint64_t seq = 0;
    if (h.len == sizeof seq) std::memcpy(&seq, payload, sizeof seq);
    if (h.len != sizeof seq || !c->sink.active || c->sink.done || seq != c->sink.seq ||
        h.offset != c->sink.off || h.offset != c->rx_expect() || h.flags > c->sink.len) {
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

}  // namespace sd::transport
