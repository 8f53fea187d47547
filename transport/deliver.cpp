// The receive side: what each message of the peer does to its connection.
// progress() hands every received message to deliver(), which checks its
// header, finds the connection, takes its rx_lock and calls the handler of
// the message's type from one table indexed by MsgType (wire.hpp). What a
// handler must answer on the fabric is posted once rx_lock is released.
#include "conn_impl.hpp"
#include "engine.hpp"

#include "log.hpp"
#include "wait.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>

namespace sd::transport {

// One received message, under its connection's rx_lock, and the answers
// its handler leaves for after the lock.
struct Engine::Rx {
    Engine &e;
    Conn *c;
    const MsgHeader &h;
    const char *payload;                   // the h.len bytes after the header
    std::uint64_t answer_off = kNoOffset;  // a cancelled advert to answer
    std::uint32_t answer_len = 0;
    bool answer_sink = false;              // a sink_cancel to answer
    bool answer_rst = false;               // bytes came to an end shut both ways

    static void data(Rx &m) noexcept;
    static void written(Rx &m) noexcept;
    static void credit(Rx &m) noexcept;
    static void leave(Rx &m) noexcept;
    static void give_back(Rx &m) noexcept;
    static void src_avail(Rx &m) noexcept;
    static void src_done(Rx &m) noexcept;
    static void src_need_key(Rx &m) noexcept;
    static void src_cancel(Rx &m) noexcept;
    static void sink_avail(Rx &m) noexcept;
    static void sink_done(Rx &m) noexcept;
    static void sink_cancel(Rx &m) noexcept;
    static void fin_or_close(Rx &m) noexcept;

    // The handler of each type; nullptr for a type that has none (unknown:
    // logged, nobody woken, nothing answered; its credits count).
    using Handler = void (*)(Rx &m) noexcept;
    static constexpr std::size_t kTypes = std::size_t(MsgType::sink_cancel) + 1;
    static const std::array<Handler, kTypes> handlers;
};

constinit const std::array<Engine::Rx::Handler, Engine::Rx::kTypes> Engine::Rx::handlers = [] {
    std::array<Handler, kTypes> t{};
    t[std::size_t(MsgType::data)] = data;
    t[std::size_t(MsgType::credit)] = credit;
    t[std::size_t(MsgType::fin)] = fin_or_close;
    t[std::size_t(MsgType::close)] = fin_or_close;
    t[std::size_t(MsgType::written)] = written;
    t[std::size_t(MsgType::src_avail)] = src_avail;
    t[std::size_t(MsgType::src_done)] = src_done;
    t[std::size_t(MsgType::src_cancel)] = src_cancel;
    t[std::size_t(MsgType::leave)] = leave;
    t[std::size_t(MsgType::give_back)] = give_back;
    t[std::size_t(MsgType::sink_avail)] = sink_avail;
    t[std::size_t(MsgType::sink_done)] = sink_done;
    t[std::size_t(MsgType::src_need_key)] = src_need_key;
    t[std::size_t(MsgType::sink_cancel)] = sink_cancel;
    return t;
}();

Conn *Engine::lookup(std::uint32_t id, std::uint32_t gen) noexcept {
    if (id >= kSlots) return nullptr;
    Conn *c = conns_[id].load(std::memory_order_acquire);
    return c && c->gen == gen ? c : nullptr;
}

void Engine::deliver(const char *buf, std::size_t len, const XLink *from) noexcept {
    MsgHeader h;
    if (len < sizeof h) return;
    std::memcpy(&h, buf, sizeof h);
    if (h.magic != kWireMagic || h.version != kWireVersion || h.len != len - sizeof h) {
        SD_LOG(error,
               "dropping malformed fabric message (%zu bytes: magic %04x version %u type %u "
               "conn %u len %u offset %llu)",
               len, unsigned(h.magic), unsigned(h.version), unsigned(h.type), h.dst_conn, h.len,
               (unsigned long long)h.offset);
        return;
    }
    Conn *c = lookup(h.dst_conn, h.dst_gen);
    if (!c) return;  // connection already closed here: nobody reads it
    std::unique_lock lock(c->rx_lock, std::defer_lock);
    if (from) {
        // Through the queue of a peer of another uid: for its own
        // connections alone (c->peer is set under rx_lock), and only while
        // its link lives (a slot is never reused during a pass).
        lock.lock();
        if (c->peer != from->peer.load(std::memory_order_relaxed) ||
            from->state.load(std::memory_order_acquire) != kLinkLive) {
            SD_LOG(debug, "dropping a message of pid %d (its queue) for conn %u, not its own",
                   int(from->pid), h.dst_conn);
            return;
        }
        if (c->peer->cross && !across_users(MsgType(h.type))) {
            SD_LOG(error, "conn %u: message type %u from a restricted peer: connection broken",
                   c->id, unsigned(h.type));
            c->broken = true;
            c->wake_locked();
            return;
        }
    }
    // Space coming back is an edge only after there was none (TCP wakes
    // an edge-triggered writer only after a send or a poll found it full).
    if (h.credits && !c->credits.fetch_add(h.credits, std::memory_order_acq_rel))
        c->tx_seq.fetch_add(1, std::memory_order_release);
    bump(c->stat->rx_msgs, 1);
    if (!lock.owns_lock()) lock.lock();
    Rx m{*this, c, h, buf + sizeof h};
    if (is_stream_msg(MsgType(h.type))) sink_passed_locked(c);
    const Rx::Handler handle = h.type < Rx::kTypes ? Rx::handlers[h.type] : nullptr;
    if (!handle) {
        SD_LOG(error, "conn %u: unknown message type %u", c->id, unsigned(h.type));
        return;
    }
    handle(m);
    // A sleeper on a peer of another uid: its word in the queue the
    // message came through names it (only such peers have words there: a
    // queue of our uid's is not looked at); woken once (latch_waker).
    RungWaker cross{-1, 0};
    if (from && c->peer->cross && c->id < kXqWakers)
        cross = latch_waker(xq_wakers(from->in.base)[c->id], true);
    const std::uint64_t skip = c->wake_waiters_locked(cross);
    lock.unlock();
    // The connection outlives the pass (closing waits for the progress
    // lock), so its pollers' mask is still there.
    wake_pollers(c->pollers, skip);
    mark_changed(c, skip);
    if (m.answer_off != kNoOffset) answer_advert(c, m.answer_off, m.answer_len);
    if (m.answer_rst) answer_reset(c);
    if (m.answer_sink) {
        std::uint64_t seq;
        std::memcpy(&seq, m.payload, sizeof seq);
        answer_sink_cancel(c, seq, h.offset);
    }
}

void Engine::Rx::data(Rx &m) noexcept {
    Conn *c = m.c;
    const MsgHeader &h = m.h;
    if (c->switch_off == kNoOffset) c->switch_off = h.offset;
    if (m.e.refuse_at_shut_end_locked(c, h.len, &m.answer_rst)) return;
    std::uint64_t expect = c->rx_expect();
    if (!c->ring || h.offset != expect || c->ring_bytes() + h.len > c->ring_cap ||
        c->fin_off != kNoOffset || c->zc.active ||
        (c->peer_end != kNoOffset && expect + h.len > c->peer_end)) {
        SD_LOG(error, "conn %u: data at offset %llu, expected %llu: connection broken",
               c->id, (unsigned long long)h.offset, (unsigned long long)expect);
        c->broken = true;
        return;
    }
    const char *src = m.payload;
    if (!c->ring_mr && c->ring_head == c->ring_tail && c->ring_base != c->ring_tail) {
        // Empty, and only we place bytes in it: from its start again. A
        // whole ring's worth read since (bulk, not a conversation) is
        // what may earn it huge pages (recv.cpp).
        c->ring_base = c->ring_tail;
        c->huge_after = std::max(c->huge_after, c->ring_base);
    }
    std::uint32_t at = c->ring_at(c->ring_tail);
    std::uint32_t first = std::min(h.len, c->ring_cap - at);
    std::memcpy(c->ring + at, src, first);
    std::memcpy(c->ring, src + first, h.len - first);
    c->ring_tail += h.len;
    bump(c->stat->rx_fabric, h.len);
}

void Engine::Rx::written(Rx &m) noexcept {
    Conn *c = m.c;
    const MsgHeader &h = m.h;
    // The bytes are in the ring already (the peer wrote them): accept
    // them only where they continue the stream and fit.
    if (c->switch_off == kNoOffset) c->switch_off = h.offset;
    if (m.e.refuse_at_shut_end_locked(c, h.flags, &m.answer_rst)) return;
    std::uint64_t expect = c->rx_expect();
    if (!c->ring_mr || h.offset != expect || c->ring_bytes() + h.flags > c->ring_cap ||
        c->fin_off != kNoOffset || c->zc.active ||
        (c->peer_end != kNoOffset && expect + h.flags > c->peer_end)) {
        SD_LOG(error, "conn %u: ring data at offset %llu, expected %llu: connection broken",
               c->id, (unsigned long long)h.offset, (unsigned long long)expect);
        c->broken = true;
        return;
    }
    c->ring_tail += h.flags;
    bump(c->stat->rx_fabric, h.flags);
}

// Credits only: deliver() took them before the lock; the wake-up remains.
void Engine::Rx::credit(Rx &) noexcept {}

void Engine::Rx::leave(Rx &m) noexcept { m.e.on_leave(m.c, m.h); }

void Engine::Rx::give_back(Rx &m) noexcept { m.e.on_give_back(m.c, m.h, m.payload); }

void Engine::Rx::src_avail(Rx &m) noexcept {
    Conn *c = m.c;
    const MsgHeader &h = m.h;
    if (c->switch_off == kNoOffset) c->switch_off = h.offset;
    if (m.e.refuse_at_shut_end_locked(c, h.flags, &m.answer_rst)) return;
    SrcAvailBody body;
    if (h.len != sizeof body || h.offset != c->rx_expect() || c->zc.active || !h.flags ||
        c->fin_off != kNoOffset) {
        SD_LOG(error, "conn %u: advertisement at offset %llu, expected %llu: connection broken",
               c->id, (unsigned long long)h.offset, (unsigned long long)c->rx_expect());
        c->broken = true;
        return;
    }
    std::memcpy(&body, m.payload, sizeof body);
    c->zc = SrcAvail{};
    c->zc.active = true;
    c->zc.off = h.offset;
    c->zc.len = h.flags;
    c->zc.addr = body.addr;
    c->zc.key = body.key;
}

void Engine::Rx::src_done(Rx &m) noexcept {
    // Our advertisement is over (send side): the bytes read, then the
    // offset that the waiting sender matches.
    m.c->zc_answer_len.store(m.h.flags, std::memory_order_relaxed);
    m.c->zc_answer_off.store(m.h.offset, std::memory_order_release);
}

void Engine::Rx::src_need_key(Rx &m) noexcept {
    m.c->zc_need_key.store(true, std::memory_order_relaxed);
}

void Engine::Rx::src_cancel(Rx &m) noexcept {
    Conn *c = m.c;
    if (!c->zc.active || c->zc.off != m.h.offset) return;  // over already: answered
    if (c->zc.busy) c->zc.cancel = true;  // the reader answers when its read is done
    else finish_advert_locked(c, &m.answer_off, &m.answer_len);
}

void Engine::Rx::sink_avail(Rx &m) noexcept { m.e.on_sink_avail(m.c, m.h, m.payload); }

void Engine::Rx::sink_done(Rx &m) noexcept { m.e.on_sink_done(m.c, m.h, m.payload); }

void Engine::Rx::sink_cancel(Rx &m) noexcept {
    m.answer_sink = m.e.on_sink_cancel(m.c, m.h, m.payload);
}

// The peer's stream ends at h.offset: a FIN (shutdown), or a close (it no
// longer reads either; with kCloseReset, TCP's reset).
void Engine::Rx::fin_or_close(Rx &m) noexcept {
    Conn *c = m.c;
    const MsgHeader &h = m.h;
    if (c->switch_off == kNoOffset) c->switch_off = h.offset;
    if (MsgType(h.type) == MsgType::close && (h.flags & kCloseReset)) {
        // After its FIN we were in CLOSE_WAIT: TCP says EPIPE then.
        c->reset_comes(c->fin_off != kNoOffset);
    } else if (MsgType(h.type) == MsgType::close) {
        m.e.closed_before_ours_locked(c);
    }
    c->fin_off = h.offset;
    (void)c->move_fin_in(FinIn::open, FinIn::came);  // after fin_off: a release
    if (MsgType(h.type) == MsgType::close) c->peer_closed = true;
}

}  // namespace sd::transport
