// The connection table: attach a Conn to a new TCP connection, detach it at
// the last close, and write the counters out at exit.
#include "conn_impl.hpp"
#include "engine.hpp"
#include "log.hpp"
#include "settings.hpp"
#include "sys.hpp"
#include "wait.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <algorithm>
#include <new>
#include <sys/mman.h>
#include <unistd.h>

namespace sd::transport {
namespace {
std::uint32_t generations[kSlots];
}

Conn *Engine::attach(int fd, bool acceptor, std::uint32_t rcvbuf, std::uint64_t sent,
                     std::uint64_t received) noexcept {
    if (retired()) return nullptr;  // not even a getsockname: a sandbox may forbid it
    Tuple t;
    if (tuple_of(fd, t) != 0) return nullptr;
    Conn *c = nullptr;
    {
        std::lock_guard lock(conn_lock_);
        if (given_up_.load(std::memory_order_relaxed)) return nullptr;  // afresh.cpp
        for (std::uint32_t n = 0; n < kSlots; ++n) {
            std::uint32_t i = (next_slot_ + n) % kSlots;
            if (conns_[i].load(std::memory_order_relaxed)) continue;
            void *mem = std::malloc(sizeof(Conn));
            if (!mem) return nullptr;
            c = new (mem) Conn();
            c->id = i;
            c->gen = ++generations[i];
            next_slot_ = i + 1;
            break;
        }
        if (!c) {
            SD_LOG(info, "connection table full; fd %d stays on TCP untracked", fd);
            return nullptr;
        }
        c->acceptor = acceptor;
        // SO_RCVBUF semantics: the memory a connection may hold unread.
        std::uint32_t w = rcvbuf ? rcvbuf : window_;
        c->window = std::clamp<std::uint32_t>(w, 16384, 64u << 20);
        c->tuple = t;
        ConnStat *s = &page_->slots[c->id];
        s->state.store(std::uint32_t(SlotState::free), std::memory_order_relaxed);
        s->fd = fd;
        s->mode.store(std::uint32_t(Mode::kernel), std::memory_order_relaxed);
        s->reason.store(std::uint32_t(fabric_ok_ ? Reason::no_peer : Reason::no_fabric),
                        std::memory_order_relaxed);
        s->family = t.family;
        s->local_port = t.local_port;
        s->peer_port = t.peer_port;
        s->peer_pid = 0;
        s->peer_reason = 0;
        std::memcpy(s->local_addr, t.local_addr, 16);
        std::memcpy(s->peer_addr, t.peer_addr, 16);
        for (auto *ctr : {&s->tx_fabric, &s->rx_fabric, &s->tx_msgs, &s->rx_msgs, &s->tx_inline,
                          &s->tx_ring, &s->tx_zcopy, &s->rx_zcopy})
            ctr->store(0, std::memory_order_relaxed);
        for (auto *ctr : {&s->adverts, &s->cancels, &s->upgrades, &s->leaves})
            ctr->store(0, std::memory_order_relaxed);
        s->lookup_ns.store(0, std::memory_order_relaxed);
        s->tx_kernel.store(sent, std::memory_order_relaxed);
        s->rx_kernel.store(received, std::memory_order_relaxed);
        c->tx_off = sent;
        c->rx_off = received;
        s->state.store(std::uint32_t(SlotState::live), std::memory_order_release);
        c->stat = s;
        conns_[c->id].store(c, std::memory_order_release);
    }
    if (!fabric_ok_) {
        c->move_to(ConnState::final);
        SD_LOG_CONN(info, *c->stat, "stays on TCP: no_fabric (see the log line about the fabric)");
        return c;
    }
    c->born_ns = monotonic_ns();
    c->verdict_due.store(true, std::memory_order_relaxed);
    // Waiting for the peer from its entry on, for SDIRECT_PEER_WAIT_MS at
    // most (judge_due). Only this first wait: a connection rearmed after a
    // leave (the peer's fork or exec) waits for its holder as long as it
    // takes, the leave's own protocol bounding it.
    c->awaiting_peer.store(settings().peer_wait_ms != 0, std::memory_order_relaxed);
    publish(c);
    try_initiate(c);
    return c;
}

void Engine::await_upgrade(const Conn *c) noexcept {
    (void)wait_until({.nap_ns = 1000000, .max_naps = settings().upgrade_timeout_ms + 100}, 0, [c] {
        const ConnState st = c->state.load(std::memory_order_acquire);
        return st != ConnState::initiating && st != ConnState::committing;
    });
}

void Engine::detach(Conn *c) noexcept {
    // An upgrade we accepted waits for its commit: once the peer has sent
    // it, it may be sending on the fabric, and only a direct connection
    // can tell it that we closed.
    await_upgrade(c);
    if (c->verdict_due.load(std::memory_order_relaxed)) judge(c, true);
    if (c->is_direct()) {
        std::lock_guard tx(c->tx_lock);
        // Broken: nothing more goes, and no CLOSE either.
        if (c->broken) (void)c->move_fin_out(FinOut::open, FinOut::fin);
        else if (c->close_out() && post(c, MsgType::close, nullptr, 0, 0, c->tx_off, 0) == 0)
            ring(c);
    }
    bool keep_ring = false;
    {
        std::lock_guard lock(conn_lock_);
        if (c->state.load() != ConnState::direct) unpublish(c);
        conns_[c->id].store(nullptr, std::memory_order_release);
        // The peer may still write into our ring: it keeps its reference
        // to the peer until end_ring lets the ring go.
        keep_ring = c->ring && peer_may_write(c);
        if (!keep_ring) release_peer(c->peer);
        c->stat->state.store(std::uint32_t(SlotState::closed), std::memory_order_release);
    }
    // No delivery may still be using it: deliveries run under the progress
    // lock and look the connection up afresh each time.
    { ProgressHeld barrier(*this); }
    { std::lock_guard barrier(flush_lock_); }
    if (c->flush_due.exchange(false)) flush_due_count_.fetch_sub(1, std::memory_order_relaxed);
    if (c->ring_mr) {
        Guard guard;
        InProvider in;  // refused: the process is exiting
        if (in.ok()) fi_close(&c->ring_mr->fid);
    }
    // A sink's recv holds the socket until its sink is over: none is left
    // registered here, but a registration must not outlive the connection.
    if (c->sink_mr) {
        Guard guard;
        InProvider in;
        if (in.ok()) fi_close(&c->sink_mr->fid);
        sink_bytes_.fetch_sub(c->sink_held, std::memory_order_relaxed);
    }
    end_ring(c, keep_ring);
    std::free(c->stage);
    std::free(c->back);
    c->~Conn();
    std::free(c);
}

void Engine::shutdown_at_exit() noexcept {
    Engine *e = the_engine_for_exit();
    if (!e || e->pid_ != getpid()) return;
    for (std::uint32_t i = 0; i < kSlots; ++i)
        if (Conn *c = e->conns_[i].load(std::memory_order_acquire))
            if (c->verdict_due.load(std::memory_order_relaxed)) e->judge(c, true);
    e->write_final_stats(false);  // the page goes to <registry>/exited
    for (std::uint32_t i = 0; i < kSlots; ++i)
        if (Conn *c = e->conns_[i].load(std::memory_order_acquire))
            if (c->state.load() != ConnState::direct) e->unpublish(c);
    // The provider leaves its region file behind; peers have it mapped
    // already, so the name can go now.
    if (e->fabric_ok_ && !std::strncmp(e->ep_.name, "fi_shm://", 9)) shm_unlink(e->ep_.name + 9);
    char path[300];
    std::snprintf(path, sizeof path, "%s/ctl-%d", settings().registry, int(e->pid_));
    unlink(path);
}

}  // namespace sd::transport
