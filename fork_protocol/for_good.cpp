// Sockets that go back to the kernel for good: a stdio stream uses one
// (glibc's stdio reads and writes through calls nobody can interpose), one
// is passed to another process, or the process changes its privileges.
#include "shm_fallback/table.hpp"

#include "transport/log.hpp"

#include <cstring>
#include <ctime>

namespace sd::fallback {

using transport::Conn;
using transport::ConnState;
using transport::Reason;

void Stream::to_kernel_for_good(Reason why) noexcept {
    Phase p = phase.load(std::memory_order_acquire);
    if (p == Phase::fresh || p == Phase::listener) return;
    for_good.store(true, std::memory_order_release);
    // Direct in the process we inherited it from: that one leaves, for good.
    if (orphan.load(std::memory_order_acquire)) (void)claim_inherited(-1, why);
    // Another thread's first call is attaching it: let it finish.
    for (int i = 0; i < 10000 && phase.load(std::memory_order_acquire) == Phase::attaching; ++i) {
        timespec nap{0, 100000};
        nanosleep(&nap, nullptr);
    }
    // Not attached yet: it never will be. Its peer may wait for an upgrade
    // that cannot come: our entry tells it why.
    for (Phase from : {Phase::connecting, Phase::deferred}) {
        Phase expect = from;
        if (phase.compare_exchange_strong(expect, Phase::attached, std::memory_order_acq_rel) &&
            !conn.load(std::memory_order_acquire))
            transport::mark_unattached(kfd(), why);
    }
    {
        std::lock_guard lock(pend_lock);
        pending.store(false, std::memory_order_release);  // the builder attaches nothing
        earn_ns = 0;                                       // nor asks for it
    }
    drop_share();  // shared through fork: no holder brings it to the fabric
    Conn *c = conn.load(std::memory_order_acquire);
    if (!c || !engine) return;
    ConnState st = c->state.load(std::memory_order_acquire);
    if (st != ConnState::direct && st != ConnState::leaving) {
        engine->stay_on_kernel(c, why);
        // An upgrade under way that still ended direct leaves like one
        // that was direct.
        (void)engine->settle_upgrade(c);
        st = c->state.load(std::memory_order_acquire);
    }
    if (st == ConnState::direct || st == ConnState::leaving) {
        const int rc = engine->leave(c, why);
        if (rc < 0)
            SD_LOG(error, "fd %d could not leave the fabric (%s): %s", kfd(),
                   transport::reason_name(why), std::strerror(-rc));
    }
}

void table_to_kernel_for_good(const int *fds, int nfds, Reason why) noexcept {
    if (foreign_process()) return;  // a vfork child: its parent's table
    const int end = nfds < 0 ? table_size() : nfds;
    for (int i = 0; i < end; ++i) {
        const int fd = nfds < 0 ? i : fds[i];
        Stream *s = acquire(fd);
        if (!s) continue;
        // Every stream once (dups map several fds to it), unless named.
        if (nfds >= 0 || s->fd.load(std::memory_order_relaxed) == fd) s->to_kernel_for_good(why);
        release(s);
    }
}

void table_retire() noexcept {
    if (foreign_process()) return;
    // First: no upgrade starts while the sockets leave. Once is enough.
    if (!transport::set_retired()) return;
    table_to_kernel_for_good(nullptr, -1, Reason::privilege);
    if (transport::Engine *e = transport::Engine::current()) e->forget_peers();
    transport::spin_table_detach();
}

}  // namespace sd::fallback
