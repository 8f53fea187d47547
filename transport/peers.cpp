// The peer table and its cache. Attaching a peer process costs a dozen
// system calls and the faults of fresh maps (its shm region through the
// address vector, its process page, its region's lock word, a pidfd, its
// doorbell); a program that makes many short connections to the same
// process (a client of a database, a benchmark of connection set-up) paid
// that for every connection, and again to tear it down. So a peer whose
// last connection closed stays attached, idle, up to SDIRECT_PEER_CACHE of
// them, the least recently used going first when room is needed.
//
// A cached peer is valid for one process incarnation only: it is found by
// pid and fabric address, and the address carries the process's nonce, so
// a process that reused the pid, or the same process after exec, never
// meets another's maps. An idle peer whose process ended is dropped at
// once: the control thread watches every attached peer's pidfd.
#include "engine.hpp"
#include "log.hpp"
#include "settings.hpp"
#include "sys.hpp"
#include "wait.hpp"

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace sd::transport {
namespace {

// The page of every peer of another uid, as far as a map would show it:
// zeros (its page is only ever read with pread: Engine::peer_slot).
ProcPage absent_page{};

}  // namespace

Peer *Engine::attach_peer(pid_t pid, const char *addr, int doorbell, Reason *why,
                          const char *dir, int xl) noexcept {
    // The doorbell and the link's reference are ours from here on every
    // path: kept, or closed (each refused request would otherwise leave
    // one open fd behind).
    auto refuse = [&](Reason r) -> Peer * {
        *why = r;
        if (doorbell >= 0) sys.close(doorbell);
        link_put(xl);
        return nullptr;
    };
    // A ring retired at a close (its peer could still write into it)
    // holds a reference to its peer until reaped: reaped here too, a peer
    // whose connections have all ended counts as idle for the bound below
    // (else two client processes taking turns would each find the other's
    // peer still held by a retired ring, and the cache never evicts).
    reap_rings_locked();
    for (std::uint32_t i = 0; i < npeers_; ++i) {
        Peer &q = peers_[i];
        if (!q.page || q.pid != pid) continue;
        if (std::strncmp(q.name, addr, sizeof q.name) != 0) {
            // Another incarnation of the pid (an exec, or the pid reused):
            // nothing of it serves this one; an idle one is of no more use.
            if (!q.conns) {
                drop_peer(&q);
                page_->header.peers_gone.fetch_add(1, std::memory_order_relaxed);
            }
            continue;
        }
        if (q.ended || q.addr == FI_ADDR_UNSPEC) continue;  // gone, or forgotten (retired)
        // Through the provider before, through the queues now (or the
        // reverse: one end's dumpability changed): a peer of each kind.
        if (q.cross != (dir != nullptr) || q.queued != (xl >= 0)) continue;
        if (q.idle_since) {
            q.idle_since = 0;
            --idle_peers_;
        }
        ++q.conns;
        page_->header.peer_reuses.fetch_add(1, std::memory_order_relaxed);
        // Our own initiation may have attached it first, without a
        // doorbell (that comes with the answer, and may never come):
        // the first doorbell offered is the one kept.
        if (doorbell >= 0 && q.doorbell < 0) q.doorbell = doorbell;
        else if (doorbell >= 0) sys.close(doorbell);
        link_put(xl);  // the peer holds its own (the same link: found by the same name)
        return &q;
    }
    auto count_live = [&] {
        std::uint32_t live = 0;
        for (std::uint32_t i = 0; i < npeers_; ++i) live += peers_[i].page != nullptr;
        return live;
    };
    auto free_slot = [&]() -> Peer * {
        for (std::uint32_t i = 0; i < npeers_; ++i)
            if (!peers_[i].page) return &peers_[i];
        return npeers_ < std::size(peers_) ? &peers_[npeers_++] : nullptr;
    };
    // At the bound, an idle peer makes room for one that has a connection.
    if (count_live() >= settings().max_peers && (!idle_peers_ || !evict_idle(idle_peers_ - 1)))
        return refuse(Reason::av_full);
    Peer *p = free_slot();
    if (!p && (!idle_peers_ || !evict_idle(idle_peers_ - 1) || !(p = free_slot())))
        return refuse(Reason::av_full);
    *p = Peer{};
    p->pid = pid;
    if (dir) {
        // Of another uid: nothing of the provider (xqlink.cpp).
        if (xl < 0) return refuse(Reason::fabric_error);
        p->addr = kQueueAddr;
    } else {
        Guard guard;
        InProvider in;  // refused: the process is exiting
        int rc = in.ok() ? fi_av_insert(ep_.av, addr, 1, &p->addr, 0, nullptr) : 0;
        if (rc != 1) {
            SD_LOG(info, "address vector insert for pid %d failed (%d)", int(pid), rc);
            *p = Peer{};
            return refuse(Reason::av_full);
        }
    }
    if (pid == pid_ && !dir) {
        p->page = page_;
        p->doorbell = doorbell_;
        if (doorbell >= 0) sys.close(doorbell);
    } else if (dir) {
        // Of another uid: its page is opened to us read only, and never
        // mapped (it owns the file and could shrink it under a map: a read
        // past its end is SIGBUS). The few reads of it are preads
        // (peer_slot); `page` points to zeros, and its sleepers count comes
        // through its queue (ring).
        char path[300];
        std::snprintf(path, sizeof path, "%s/p%d", dir, int(pid));
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        std::int32_t owner = 0;
        if (fd < 0 || pread(fd, &owner, sizeof owner, offsetof(ProcHeader, pid)) != sizeof owner ||
            owner != pid) {
            if (fd >= 0) sys.close(fd);
            *p = Peer{};
            return refuse(Reason::peer_refused);
        }
        p->page = &absent_page;
        p->page_fd = fd;
        p->doorbell = doorbell;
        p->cross = true;
        std::snprintf(p->dir, sizeof p->dir, "%s", dir);
        p->pidfd = int(syscall(SYS_pidfd_open, pid, 0));
        p->pidfd_serial = next_watch_serial();
    } else {
        char path[300];
        std::snprintf(path, sizeof path, "%s/p%d", settings().registry, int(pid));
        // Writable for the claim words of its advertised recv buffers
        // (write zero-copy); everything else in it we only read.
        int fd = open(path, O_RDWR | O_CLOEXEC);
        void *map = fd < 0 ? MAP_FAILED
                           : mmap(nullptr, sizeof(ProcPage), PROT_READ | PROT_WRITE, MAP_SHARED,
                                  fd, 0);
        if (fd >= 0) sys.close(fd);
        if (map == MAP_FAILED || static_cast<ProcPage *>(map)->header.pid != pid) {
            if (map != MAP_FAILED) munmap(map, sizeof(ProcPage));
            {
                Guard guard;
                InProvider in;
                if (in.ok()) fi_av_remove(ep_.av, &p->addr, 1, 0);
            }
            *p = Peer{};
            return refuse(Reason::peer_refused);
        }
        p->page = static_cast<ProcPage *>(map);
        p->doorbell = doorbell;
        p->pidfd = int(syscall(SYS_pidfd_open, pid, 0));
        p->pidfd_serial = next_watch_serial();
        if (pid != pid_ && p->pidfd >= 0) p->wake = wake_cache_new();
    }
    if (xl >= 0) {
        // From here progress() delivers the link's messages to it.
        p->queued = true;
        p->xl = xl;
        links_[xl].peer.store(p, std::memory_order_release);
    } else {
        // Before our answer: its messages come through the provider.
        provider_msgs_.store(true, std::memory_order_release);
    }
    std::snprintf(p->name, sizeof p->name, "%s", addr);
    if (!p->cross) p->region.watch(addr, pid);  // no view of another uid's region
    p->conns = 1;
    page_->header.peers_attached.fetch_add(1, std::memory_order_relaxed);
    // The control thread watches its pidfd from now on.
    if (p->pidfd >= 0 && watch_fd_ >= 0) {
        std::uint64_t one = 1;
        (void)sys.write(watch_fd_, &one, sizeof one);
    }
    return p;
}

bool Engine::is_peer(pid_t pid) noexcept {
    std::lock_guard lock(conn_lock_);
    for (std::uint32_t i = 0; i < npeers_; ++i)
        if (peers_[i].page && peers_[i].pid == pid && peers_[i].addr != FI_ADDR_UNSPEC) return true;
    return false;
}

void Engine::release_peer(Peer *p) noexcept {
    if (!p || --p->conns) return;
    if (p->ended || !settings().peer_cache || retired() || p->addr == FI_ADDR_UNSPEC) {
        if (p->ended) page_->header.peers_gone.fetch_add(1, std::memory_order_relaxed);
        drop_peer(p);
        return;
    }
    p->idle_since = ++peer_clock_;
    ++idle_peers_;
    evict_idle(settings().peer_cache);
}

void Engine::drop_peer(Peer *p) noexcept {
    if (p->idle_since) --idle_peers_;
    if (p->queued) link_put(p->xl);  // else forget_peers() let it go
    if (!p->cross && p->addr != FI_ADDR_UNSPEC) {  // else forget_peers() removed it
        // Through the gate: a peer that ends while this process exits is
        // dropped by the control thread, and the provider's removal reads
        // the endpoint names libfabric's destructor frees (TSan: a
        // heap-use-after-free in the shm provider's map removal, the
        // main thread in exit()). Refused, the entry goes with the process.
        Guard guard;
        InProvider in;
        if (in.ok()) fi_av_remove(ep_.av, &p->addr, 1, 0);
    }
    if (p->pid != pid_ || p->cross) {
        if (p->cross) {
            if (p->page_fd >= 0) sys.close(p->page_fd);
        } else {
            munmap(const_cast<ProcPage *>(p->page), sizeof(ProcPage));
        }
        if (p->doorbell >= 0) sys.close(p->doorbell);
        if (p->pidfd >= 0) sys.close(p->pidfd);
    }
    if (p->wake) wake_cache_free(p->wake);
    p->region.unwatch();
    *p = Peer{};
}

bool Engine::evict_idle(std::uint32_t keep) noexcept {
    bool any = false;
    while (idle_peers_ > keep) {
        Peer *lru = nullptr;
        for (std::uint32_t i = 0; i < npeers_; ++i) {
            Peer &q = peers_[i];
            if (q.page && q.idle_since && (!lru || q.idle_since < lru->idle_since)) lru = &q;
        }
        if (!lru) break;
        drop_peer(lru);
        page_->header.peers_evicted.fetch_add(1, std::memory_order_relaxed);
        any = true;
    }
    return any;
}

void Engine::reap_ended_peers() noexcept {
    std::lock_guard lock(conn_lock_);
    for (std::uint32_t i = 0; i < npeers_; ++i) {
        Peer &p = peers_[i];
        if (!p.page || p.pid == pid_ || p.pidfd < 0 || p.ended) continue;
        // Asked afresh: the pidfd that fired may have been another's by
        // the time the table was locked.
        pollfd pfd{p.pidfd, POLLIN, 0};
        if (sys.poll(&pfd, 1, 0) != 1) continue;
        if (p.conns) {
            // Its connections learn it their own way (a send: at once).
            std::atomic_ref<bool>(p.ended).store(true, std::memory_order_release);
            continue;
        }
        SD_LOG(debug, "pid %d ended: its cached peer state is dropped", int(p.pid));
        drop_peer(&p);
        page_->header.peers_gone.fetch_add(1, std::memory_order_relaxed);
    }
}

int Engine::gather_watch(pollfd *fds, int max) noexcept {
    std::lock_guard lock(conn_lock_);
    int n = 0;
    fds[n++] = pollfd{ctl_fd_, POLLIN, 0};
    fds[n++] = pollfd{watch_fd_, POLLIN, 0};
    for (std::uint32_t i = 0; i < npeers_ && n < max; ++i) {
        const Peer &p = peers_[i];
        if (p.page && p.pid != pid_ && p.pidfd >= 0 && !p.ended && p.addr != FI_ADDR_UNSPEC)
            fds[n++] = pollfd{p.pidfd, POLLIN, 0};
    }
    return n;
}

}  // namespace sd::transport
