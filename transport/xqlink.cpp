// Links to peers of other uids: the two message queues (xqueue.hpp) between
// this process and one process of another uid, which carry every message
// of their direct connections instead of the provider. Ours is created
// here, mapped, read by progress() and passed to the peer with each
// handshake; the peer's is checked, mapped and written by post().
//
// What a peer of another uid can do through them: write anything anywhere
// in the queue we read, and in its own. We read only our own private head
// on, copy each message out before looking at it, and deliver it only to a
// connection whose peer is that process (deliver()): it can at most break
// its own connections, which is what poison_link() does when the queue
// itself makes no sense. It cannot shrink the queue we map (sealed, and
// checked when passed), so no access of ours ever faults.
#include "conn_impl.hpp"
#include "control.hpp"
#include "crossuser.hpp"
#include "engine.hpp"
#include "log.hpp"
#include "procpage.hpp"
#include "sys.hpp"
#include "wait.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <utility>

namespace sd::transport {

static_assert(kXqWakers == kSlots, "a queue's wakers are indexed by connection id");

int Engine::link_for(pid_t pid, const char *name) noexcept {
    XLink *free = nullptr;
    for (XLink &l : links_) {
        const int st = l.state.load(std::memory_order_acquire);
        if (st == kLinkFree) {
            if (!free) free = &l;
            continue;
        }
        if (st == kLinkRetired || l.pid != pid || std::strncmp(l.name, name, sizeof l.name) != 0)
            continue;
        if (st == kLinkPoisoned) return -EPROTO;
        ++l.refs;
        return int(&l - links_);
    }
    if (!free) return -ENOSPC;
    const int fd = xq_create();
    if (fd < 0) return fd;
    char *base = xq_map(fd);
    if (!base) {
        sys.close(fd);
        return -ENOMEM;
    }
    XLink &l = *free;
    const std::uint32_t index = std::uint32_t(&l - links_);
    if (const int rc = make_bell(l); rc != 0) {
        xq_unmap(base);
        sys.close(fd);
        return rc;
    }
    if (links_hi_.load(std::memory_order_relaxed) <= index)
        links_hi_.store(index + 1, std::memory_order_release);  // before the slot is live
    l.in.base = base;
    l.in.head = 0;
    l.in_fd = fd;
    l.peer.store(nullptr, std::memory_order_relaxed);
    l.pid = pid;
    std::snprintf(l.name, sizeof l.name, "%s", name);
    l.refs = 1;
    l.serial.fetch_add(1, std::memory_order_relaxed);
    // Counted before our sleepers are copied in: a thread that announces
    // its sleep either sees the count (and copies into this queue too) or
    // is in the page's count copied here (announce_sleep: the two fences).
    links_used_.fetch_add(1, std::memory_order_seq_cst);
    {
        std::lock_guard mirror(mirror_lock_);
        reinterpret_cast<XqHeader *>(base)->sleepers.store(
            page_->header.sleepers.load(std::memory_order_seq_cst) & ~kRung,
            std::memory_order_seq_cst);
    }
    // Everything above before progress sees the slot live.
    l.state.store(kLinkLive, std::memory_order_release);
    return int(&l - links_);
}

int Engine::make_bell(XLink &l) noexcept {
    int ep = xbells_ep_.load(std::memory_order_acquire);
    if (ep < 0) {
        // Made once, under the table lock (link_for's caller holds it).
        // Out of the application's low numbers, as the threads' bells.
        ep = out_of_the_way(sys.epoll_create1(EPOLL_CLOEXEC));
        if (ep < 0) return -errno;
        xbells_ep_.store(ep, std::memory_order_release);
    }
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0) return -errno;
    pair[0] = out_of_the_way(pair[0]);
    pair[1] = out_of_the_way(pair[1]);
    // Set before it is registered: a drain that finds it ready finds it.
    l.bell_rx.store(pair[0], std::memory_order_release);
    l.bell_tx = pair[1];
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = std::uint32_t(&l - links_);
    if (sys.epoll_ctl(ep, EPOLL_CTL_ADD, pair[0], &ev) != 0) {
        const int err = errno;
        l.bell_rx.store(-1, std::memory_order_relaxed);
        l.bell_tx = -1;
        sys.close(pair[0]);
        sys.close(pair[1]);
        return -err;
    }
    return 0;
}

void Engine::drop_bell(XLink &l) noexcept {
    // Not while a drain may read it (no number closed under a recv).
    std::lock_guard bells(bells_lock_);
    if (const int rx = l.bell_rx.exchange(-1, std::memory_order_relaxed); rx >= 0) {
        // Out of the set first: the peer's copy of the pair keeps the
        // socket alive, and with it an epoll entry a close would leave.
        (void)sys.epoll_ctl(xbells_ep_.load(std::memory_order_relaxed), EPOLL_CTL_DEL, rx, nullptr);
        sys.close(rx);
    }
    if (l.bell_tx >= 0) sys.close(std::exchange(l.bell_tx, -1));
}

void Engine::take_xbells() noexcept {
    // The bells first, the queues after: a ring drained here was sent
    // after its message was queued, and the pass below starts later.
    // Drained by the thread that found them rung, at once: left to the
    // progress lock's holder, a bell stayed readable while that thread
    // slept on it again and again (mariadbd's watcher: 30 polls a query).
    {
        std::lock_guard bells(bells_lock_);
        drain_xbells_locked();
    }
    progress_before_sleep();
}

void Engine::drain_xbells_locked() noexcept {
    epoll_event ev[16];
    const int n = sys.epoll_wait(xbells_ep_.load(std::memory_order_relaxed), ev, 16, 0);
    for (int i = 0; i < n; ++i) {
        const std::uint32_t at = ev[i].data.u32;
        if (at >= kMaxLinks) continue;
        XLink &l = links_[at];
        const int rx = l.bell_rx.load(std::memory_order_acquire);
        if (rx < 0) continue;
        // A ring is one byte, and a peer rings at every post while we
        // have sleepers: all of them go (a bell left readable made every
        // sleep of its watcher end at once, mariadbd's watcher polling
        // 30 times a query), 64 at a time, within a bound (a peer that
        // keeps ringing cannot keep us here; what it left is drained by
        // the next pass). A datagram with fds is a bell of one of the
        // peer's threads (take_wake_offer).
        constexpr int kBatch = 64;
        constexpr std::size_t kCtl = CMSG_SPACE(4 * sizeof(int));
        char bytes[kBatch][8];
        alignas(cmsghdr) char ctl[kBatch][kCtl];
        iovec iov[kBatch];
        mmsghdr msgs[kBatch];
        for (int round = 0; round < 32; ++round) {
            for (int k = 0; k < kBatch; ++k) {
                iov[k] = {bytes[k], sizeof bytes[k]};
                msgs[k] = {};
                msgs[k].msg_hdr.msg_iov = &iov[k];
                msgs[k].msg_hdr.msg_iovlen = 1;
                msgs[k].msg_hdr.msg_control = ctl[k];
                msgs[k].msg_hdr.msg_controllen = kCtl;
            }
            const int got = sys.recvmmsg(rx, msgs, kBatch, MSG_DONTWAIT | MSG_CMSG_CLOEXEC, nullptr);
            for (int k = 0; k < got; ++k)
                if (msgs[k].msg_hdr.msg_controllen > 0) take_wake_offer(l, msgs[k].msg_hdr, msgs[k].msg_len);
            if (got < kBatch) break;
        }
        // The latch after the drain (as take_ring): a ring whose latch we
        // clear was sent before the pass that follows, which takes its
        // message in; a writer that finds it clear rings again. A link
        // still being made has its bell before its queue: only a live
        // one's queue is read here (mapped until drop_bell, which waits
        // for us).
        const int st = l.state.load(std::memory_order_acquire);
        if (st == kLinkLive || st == kLinkPoisoned || st == kLinkRetired)
            reinterpret_cast<XqHeader *>(l.in.base)->rung.store(0, std::memory_order_seq_cst);
    }
}

void Engine::take_wake_offer(XLink &l, const msghdr &m, unsigned len) noexcept {
    // Every fd that came is ours to close but the one bell we keep: a
    // peer may send anything, as many as fit.
    int fds[4];
    const int nfds = take_fds(m, fds, 4);
    std::uint32_t word[2];
    std::memcpy(word, static_cast<const char *>(m.msg_iov[0].iov_base), sizeof word);
    const bool offer = nfds == 1 && len == sizeof word && word[0] == kXWakeMagic && word[1] != 0 &&
                       is_bell_socket(fds[0]);
    if (!offer) {
        for (int j = 0; j < nfds; ++j) sys.close(fds[j]);
        return;
    }
    const int fd = out_of_the_way(fds[0]);
    if (fd < 0) return;
    std::lock_guard out(l.out.lock);
    XLink::WakeFd *put = nullptr;
    for (XLink::WakeFd &w : l.wake)
        if (w.fd >= 0 && w.token == word[1]) put = &w;
    if (!put)
        for (XLink::WakeFd &w : l.wake)
            if (!put && w.fd < 0) put = &w;
    if (!put) put = &l.wake[l.wake_next++ % XLink::kWakeFds];
    if (put->fd >= 0) close_wake_fd_locked(l, *put);
    put->fd = fd;
    put->token = word[1];
}

void Engine::close_wake_fd_locked(XLink &l, XLink::WakeFd &w) noexcept {
    // Out of the table first (no sender takes it from now on: we hold
    // out.lock), closed once the sends that took it are over (each a
    // non-blocking system call).
    const int fd = std::exchange(w.fd, -1);
    w.token = 0;
    while (l.wake_inflight.load(std::memory_order_seq_cst) != 0) sched_yield();
    sys.close(fd);
}

void Engine::close_wake_fds_locked(XLink &l) noexcept {
    for (XLink::WakeFd &w : l.wake)
        if (w.fd >= 0) close_wake_fd_locked(l, w);
}

int Engine::xlink_of(const Conn *c, std::uint32_t *serial) noexcept {
    // `peer` is published by the release store of state == direct.
    if (!c->is_direct()) return -1;
    const Peer *p = c->peer;
    if (!p || !p->cross || p->xl < 0 || p->doorbell < 0) return -1;
    XLink &l = links_[p->xl];
    if (l.state.load(std::memory_order_acquire) != kLinkLive) return -1;
    *serial = l.serial.load(std::memory_order_relaxed);
    return p->xl;
}

int Engine::offer_wake_bell(const Conn *c, int tx, std::uint32_t token) noexcept {
    if (!c->is_direct() || !c->peer || !c->peer->cross || c->peer->doorbell < 0) return -EPERM;
    const std::uint32_t word[2] = {kXWakeMagic, token};
    return send_with_fds(c->peer->doorbell, word, sizeof word, &tx, 1, MSG_DONTWAIT) == ssize_t(sizeof word)
               ? 0
               : -errno;
}

bool Engine::xwaker_announce(int xl, std::uint32_t serial, std::uint32_t id, std::uint64_t word) noexcept {
    if (xl < 0 || xl >= int(kMaxLinks) || id >= kXqWakers) return false;
    // Under mirror_lock_: the queue stays mapped (reap_links_locked).
    std::lock_guard mirror(mirror_lock_);
    XLink &l = links_[xl];
    if (l.state.load(std::memory_order_acquire) != kLinkLive || l.serial.load(std::memory_order_relaxed) != serial)
        return false;
    std::uint64_t none = 0;
    // Before the sleeper's last look (seq_cst): a peer that posts after
    // that look sees the word (Engine::ring).
    return xq_wakers(l.in.base)[id].compare_exchange_strong(none, word, std::memory_order_seq_cst);
}

bool Engine::xwaker_withdraw(int xl, std::uint32_t serial, std::uint32_t id, std::uint64_t word) noexcept {
    std::lock_guard mirror(mirror_lock_);
    XLink &l = links_[xl];
    const int st = l.state.load(std::memory_order_acquire);
    if ((st != kLinkLive && st != kLinkPoisoned) || l.serial.load(std::memory_order_relaxed) != serial)
        return false;
    auto &w = xq_wakers(l.in.base)[id];
    // The peer may have written anything there: only our own word goes.
    std::uint64_t v = w.load(std::memory_order_relaxed);
    while ((v & ~kXWakeRung) == word)
        if (w.compare_exchange_weak(v, 0, std::memory_order_seq_cst)) return v & kXWakeRung;
    return false;
}

bool Engine::ring_xwaker(const Conn *c) noexcept {
    const Peer *p = c->peer;
    const int xl = p->xl;
    if (xl < 0 || c->peer_id >= kXqWakers) return false;
    XLink &l = links_[xl];
    int fd = -1;
    {
        std::lock_guard out(l.out.lock);
        if (!l.out.base) return false;
        auto &w = xq_wakers(l.out.base)[c->peer_id];
        // Pairs with the sleeper's announce-then-recheck: either it sees
        // our message on its recheck, or we see its word here.
        std::atomic_thread_fence(std::memory_order_seq_cst);
        std::uint64_t v = w.load(std::memory_order_relaxed);
        if (!v) return false;
        // Written already and not withdrawn yet: its sleeper takes our
        // message in when it withdraws the word.
        if (v & kXWakeRung) return true;
        for (const XLink::WakeFd &f : l.wake)
            if (f.fd >= 0 && f.token == std::uint32_t(v)) fd = f.fd;
        if (fd < 0 || !w.compare_exchange_strong(v, v | kXWakeRung, std::memory_order_seq_cst)) return false;
        l.wake_inflight.fetch_add(1, std::memory_order_seq_cst);
    }
    // A socket of the peer's thread (checked when it came): a full queue
    // means woken already; anything else, the link's bell as before.
    const char one = 1;
    const bool sent = sys.send(fd, &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1 || errno == EAGAIN;
    l.wake_inflight.fetch_sub(1, std::memory_order_release);
    make_way();
    return sent;
}

void Engine::announce_sleep(int delta) noexcept {
    auto &sleepers = page_->header.sleepers;
    if (!links_used_.load(std::memory_order_seq_cst)) {
        sleepers.fetch_add(std::uint32_t(delta), std::memory_order_seq_cst);
        // A link made meanwhile copied the count before or after this.
        if (!links_used_.load(std::memory_order_seq_cst)) return;
        std::lock_guard mirror(mirror_lock_);
        mirror_sleepers_locked();
        return;
    }
    // Under the lock, so that the last copy in each queue is the count
    // after the last change (stores of two threads cannot cross).
    std::lock_guard mirror(mirror_lock_);
    sleepers.fetch_add(std::uint32_t(delta), std::memory_order_seq_cst);
    mirror_sleepers_locked();
}

void Engine::mirror_sleepers_locked() noexcept {
    const std::uint32_t n = page_->header.sleepers.load(std::memory_order_seq_cst) & ~kRung;
    const std::uint32_t hi = links_hi_.load(std::memory_order_acquire);
    for (std::uint32_t i = 0; i < hi; ++i) {
        XLink &l = links_[i];
        const int st = l.state.load(std::memory_order_acquire);
        // A live or poisoned link's queue is mapped, and stays so while
        // we hold mirror_lock_ (reap_links_locked unmaps under it).
        if (st == kLinkLive || st == kLinkPoisoned)
            reinterpret_cast<XqHeader *>(l.in.base)->sleepers.store(n, std::memory_order_seq_cst);
    }
}

const ConnStat *Engine::peer_slot(const Peer *p, std::uint32_t id, ConnStat *buf) const noexcept {
    if (!p || !p->page || id >= kSlots) return nullptr;
    if (!p->cross) return &p->page->slots[id];
    const off_t at = off_t(offsetof(ProcPage, slots) + std::size_t(id) * sizeof(ConnStat));
    if (p->page_fd < 0 ||
        pread(p->page_fd, static_cast<void *>(buf), sizeof *buf, at) != ssize_t(sizeof *buf))
        return nullptr;
    return buf;
}

void Engine::link_put(int xl) noexcept {
    if (xl < 0 || xl >= int(kMaxLinks)) return;
    XLink &l = links_[xl];
    if (!l.refs || --l.refs) return;
    {
        // A post in flight finishes first; later ones find no queue.
        std::lock_guard out(l.out.lock);
        xq_unmap(l.out.base);
        l.out.base = nullptr;
        l.out.dev = 0;
        l.out.ino = 0;
        close_wake_fds_locked(l);
    }
    l.peer.store(nullptr, std::memory_order_relaxed);
    l.state.store(kLinkRetired, std::memory_order_release);
    // Our queue goes at once where this thread may wait for progress (the
    // order: table, tx, progress): a process that changes its uid keeps
    // nothing of its peers. Elsewhere the next progress pass unmaps it.
    if (!lock_order::holds_rank(Rank::progress) && !lock_order::holds_rank(Rank::rx)) {
        ProgressHeld pass(*this);
        reap_links_locked();
    }
}

int Engine::link_set_out(int xl, int fd) noexcept {
    XLink &l = links_[xl];
    dev_t dev;
    ino_t ino;
    if (fd < 0 || xq_check(fd, &dev, &ino) != 0) {
        if (fd >= 0) sys.close(fd);
        return -EPERM;
    }
    if (l.out.base && l.out.dev == dev && l.out.ino == ino) {
        sys.close(fd);  // the one we write already
        return 0;
    }
    char *base = xq_map(fd);
    sys.close(fd);
    if (!base) return -EPERM;
    // Another queue than the one we write: the peer made a new one (it
    // dropped its link to us while we kept ours). The old one is no longer
    // read; we go on where the new one's writer left it (a fresh one: 0).
    std::lock_guard out(l.out.lock);
    xq_unmap(l.out.base);
    l.out.base = base;
    l.out.dev = dev;
    l.out.ino = ino;
    const XqHeader *h = reinterpret_cast<const XqHeader *>(base);
    l.out.tail = h->tail.load(std::memory_order_acquire);
    // Skips only where the reader reads them (an older library's queue
    // says version 1; a header that lies breaks only its own queue).
    l.out.skips = h->version >= 2;
    return 0;
}

std::size_t Engine::read_link(XLink &l) noexcept {
    if (l.state.load(std::memory_order_acquire) != kLinkLive ||
        !l.peer.load(std::memory_order_acquire))
        return 0;
    std::size_t taken = 0;
    // A bounded pass: a writer that keeps the queue full cannot keep us
    // here.
    for (int n = 0; n < 256; ++n) {
        const long len = xq_take(l.in, xq_msg_, sizeof(MsgHeader), sizeof xq_msg_);
        if (len == 0) break;
        if (len < 0) {
            poison_link(l);
            break;
        }
        deliver(xq_msg_, std::size_t(len), &l);
        ++taken;
    }
    return taken;
}

std::size_t Engine::read_links() noexcept {
    std::size_t taken = 0;
    bool retired = false;
    const std::uint32_t hi = links_hi_.load(std::memory_order_acquire);
    for (std::uint32_t i = 0; i < hi; ++i) {
        retired |= links_[i].state.load(std::memory_order_acquire) == kLinkRetired;
        taken += read_link(links_[i]);
    }
    if (retired) reap_links_locked();
    return taken;
}

void Engine::reap_links_locked() noexcept {
    // Not while a sleeper copies its count into our queues.
    std::lock_guard mirror(mirror_lock_);
    for (XLink &l : links_) {
        if (l.state.load(std::memory_order_acquire) != kLinkRetired) continue;
        // The bell first: a drain that finds it, under bells_lock_, finds
        // the queue still mapped (it clears the latch there).
        drop_bell(l);
        {
            // A drain before the bell's close may have taken a bell after
            // link_put closed the others.
            std::lock_guard out(l.out.lock);
            close_wake_fds_locked(l);
        }
        xq_unmap(l.in.base);
        l.in = XqReader{};
        if (l.in_fd >= 0) sys.close(l.in_fd);
        l.in_fd = -1;
        l.pid = 0;
        l.name[0] = '\0';
        links_used_.fetch_sub(1, std::memory_order_relaxed);
        l.state.store(kLinkFree, std::memory_order_release);
    }
}

void Engine::poison_link(XLink &l) noexcept {
    const Peer *p = l.peer.load(std::memory_order_acquire);
    int expect = kLinkLive;
    if (!l.state.compare_exchange_strong(expect, kLinkPoisoned)) return;
    SD_LOG(error, "pid %d broke the queue it writes to us: its connections are reset",
           int(l.pid));
    for (std::uint32_t id = 0; id < kSlots; ++id) {
        Conn *c = conns_[id].load(std::memory_order_acquire);
        if (!c) continue;
        std::lock_guard rx(c->rx_lock);
        if (c->peer != p) continue;
        c->broken = true;
        c->reset_comes();
        c->wake_locked();
    }
}

}  // namespace sd::transport
