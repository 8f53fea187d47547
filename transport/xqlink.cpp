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
#include "engine.hpp"
#include "log.hpp"
#include "sys.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <utility>

namespace sd::transport {

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
        // the next pass).
        char bytes[64];
        iovec iov[64];
        mmsghdr msgs[64] = {};
        for (int k = 0; k < 64; ++k) {
            iov[k] = {bytes + k, 1};
            msgs[k].msg_hdr.msg_iov = &iov[k];
            msgs[k].msg_hdr.msg_iovlen = 1;
        }
        for (int round = 0; round < 32; ++round)
            if (sys.recvmmsg(rx, msgs, 64, MSG_DONTWAIT, nullptr) < 64) break;
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
    l.out.tail = reinterpret_cast<XqHeader *>(base)->tail.load(std::memory_order_acquire);
    return 0;
}

std::size_t Engine::read_links() noexcept {
    std::size_t taken = 0;
    bool retired = false;
    const std::uint32_t hi = links_hi_.load(std::memory_order_acquire);
    for (std::uint32_t i = 0; i < hi; ++i) {
        XLink &l = links_[i];
        const int st = l.state.load(std::memory_order_acquire);
        retired |= st == kLinkRetired;
        if (st != kLinkLive || !l.peer.load(std::memory_order_acquire)) continue;
        // A bounded pass: a writer that keeps the queue full cannot keep
        // us here.
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
