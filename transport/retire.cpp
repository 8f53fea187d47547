// Connections that stay on the kernel for good, and a process that gives
// the fabric up altogether because it changed its privileges or entered a
// sandbox: a process of another uid can no longer reach its peers'
// memory (process_vm_* is refused one way), nor should it keep maps of
// their pages, and a seccomp filter may forbid the calls an upgrade makes.
#include "conn_impl.hpp"
#include "engine.hpp"
#include "log.hpp"
#include "sys.hpp"

#include <sys/mman.h>
#include <utility>

namespace sd::transport {

namespace {
// Why the process retired: kIds (a change of ids), kSandbox (chroot,
// unshare, setns, seccomp), both; 0 while it has not.
enum : unsigned { kIds = 1, kSandbox = 2 };
std::atomic<unsigned> retired_why{0};
}  // namespace

SD_CHILD_PATH bool retired() noexcept { return retired_why.load(std::memory_order_acquire) != 0; }

bool sandboxed() noexcept { return retired_why.load(std::memory_order_acquire) & kSandbox; }

bool set_retired(bool sandbox) noexcept {
    if (retired_why.fetch_or(sandbox ? kSandbox : kIds, std::memory_order_acq_rel)) return false;
    if (sandbox)
        SD_LOG(info, "sandbox entered: every connection of this process stays on the kernel "
                     "from now on");
    else
        SD_LOG(info, "ids changed while holding the fabric: every connection of this process "
                     "stays on the kernel, unless a later change of ids settles one uid");
    return true;
}

bool end_retirement() noexcept {
    unsigned ids = kIds;
    return retired_why.compare_exchange_strong(ids, 0, std::memory_order_acq_rel);
}

void Engine::stay_on_kernel(Conn *c, Reason why) noexcept {
    bar_upgrades(c, why);  // waits for an upgrade request of ours in flight
    std::lock_guard lock(conn_lock_);
    const ConnState st = c->state.load(std::memory_order_acquire);
    if (st == ConnState::kernel) {
        set_final(c, why);
    } else if (st == ConnState::final &&
               c->stat->reason.load(std::memory_order_relaxed) == std::uint32_t(Reason::shared)) {
        // Handed over for sharing: a take-back would bring it back; not
        // any more.
        c->stat->reason.store(std::uint32_t(why), std::memory_order_relaxed);
    }
}

void Engine::forget_peers() noexcept {
    std::lock_guard lock(conn_lock_);
    for (std::uint32_t i = 0; i < kSlots; ++i)
        // The ones on the kernel for good keep their entry, marked, so that
        // their peers can tell why (mark_kernel).
        if (Conn *c = conns_[i].load(std::memory_order_acquire);
            c && c->state.load(std::memory_order_acquire) != ConnState::final)
            unpublish(c);
    for (std::uint32_t i = 0; i < npeers_; ++i) {
        Peer &p = peers_[i];
        if (!p.page || p.pid == pid_ || p.addr == FI_ADDR_UNSPEC) continue;
        if (!p.conns) {  // idle in the cache: nothing uses it
            drop_peer(&p);
            continue;
        }
        // A connection still leaving (the peer left first and returns our
        // bytes on the fabric) keeps its peer until it is done.
        bool busy = false;
        for (std::uint32_t k = 0; k < kSlots && !busy; ++k) {
            Conn *c = conns_[k].load(std::memory_order_acquire);
            busy = c && c->peer == &p && c->state.load(std::memory_order_acquire) != ConnState::final;
        }
        if (busy) {
            SD_LOG(error, "pid %d: a connection with it has not finished leaving the fabric; its "
                          "maps stay", int(p.pid));
            continue;
        }
        // Both queues unmapped (ours at once, where this thread may wait
        // for progress; else by the next pass); a post of a connection
        // that still names the peer finds no queue.
        if (p.queued) link_put(std::exchange(p.xl, -1));
        if (!p.cross) {
            Guard guard;
            InProvider in;
            if (in.ok()) fi_av_remove(ep_.av, &p.addr, 1, 0);  // the provider unmaps the peer's region
        }
        p.region.forget();  // our own read-only view of its lock word too
        if (p.cross) {
            if (p.page_fd >= 0) sys.close(std::exchange(p.page_fd, -1));  // never mapped
        } else {
            // The page's place stays mapped (a thread may still look at it)
            // but holds zeros now, nothing of the peer.
            void *z = mmap(const_cast<ProcPage *>(p.page), sizeof(ProcPage),
                           PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            if (z == MAP_FAILED)
                SD_LOG(error, "could not unmap the process page of pid %d", int(p.pid));
        }
        if (p.doorbell >= 0) sys.close(std::exchange(p.doorbell, -1));
        if (p.pidfd >= 0) sys.close(std::exchange(p.pidfd, -1));
        p.addr = FI_ADDR_UNSPEC;
    }
}

}  // namespace sd::transport
