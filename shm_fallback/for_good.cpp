// A socket that goes back to the kernel for good: connect(AF_UNSPEC)
// disconnects it, it is passed to another process, or the process changes
// its privileges (the table-wide forms:
// fork_protocol/for_good.cpp). What fork left on it (an owner elsewhere, a
// share) is settled through the fork protocol's hooks (fork_hooks.hpp).
#include "stream.hpp"

#include "transport/log.hpp"
#include "transport/wait.hpp"

#include <cstring>

namespace sd::fallback {

using transport::Conn;
using transport::ConnState;
using transport::Reason;

bool Stream::retire_shared() noexcept {
    // Direct in the process we inherited it from: that one leaves for
    // sharing (its peer waits for an upgrade again), and we count.
    if (orphan.load(std::memory_order_acquire) && holders.load(std::memory_order_acquire) &&
        !claim_inherited(-1, Reason::shared))
        return false;
    Sharers *sh = share.load(std::memory_order_acquire);
    Conn *c = sh ? nullptr : conn.load(std::memory_order_acquire);
    if (!sh && c) sh = left_holders(c);
    if (!sh || sharers_stuck(sh)) return false;
    // Ours is used: nobody takes it over while we live.
    sharers_use(sh);
    return true;
}

void Stream::to_kernel_for_good(Reason why) noexcept {
    Phase p = phase.load(std::memory_order_acquire);
    if (p == Phase::fresh || p == Phase::listener) return;
    // A socket shared through fork, in a process that retires (a server's
    // sandboxed child, sshd's pre-auth one): the other holders may bring
    // it back to the fabric once we are gone, from the counts we keep.
    if (why == Reason::privilege && retire_shared()) return;
    for_good.store(true, std::memory_order_release);
    // Direct in the process we inherited it from: that one leaves, for good.
    (void)claim_inherited(-1, why);
    // Another thread's first call is attaching it: let it finish.
    (void)transport::wait_until({.nap_ns = 100000, .max_naps = 10000}, 0, [this] {
        return phase.load(std::memory_order_acquire) != Phase::attaching;
    });
    // Not attached yet: it never will be. Its peer may wait for an upgrade
    // that cannot come: our entry tells it why.
    for (Phase from : {Phase::connecting, Phase::deferred}) {
        if (move(from, Phase::attached) && !conn.load(std::memory_order_acquire))
            transport::mark_unattached(kfd(), why, &mark);
    }
    {
        std::lock_guard lock(pend_lock);
        pending.store(false, std::memory_order_release);  // the builder attaches nothing
        earn_ns = 0;                                       // nor asks for it
    }
    drop_share();  // shared through fork: no holder brings it to the fabric
    Conn *c = conn.load(std::memory_order_acquire);
    if (!c || !engine) return;
    ConnState st = transport::state_of(c);
    if (st != ConnState::direct && st != ConnState::leaving) {
        engine->stay_on_kernel(c, why);
        // An upgrade under way that still ended direct leaves like one
        // that was direct.
        (void)engine->settle_upgrade(c);
        st = transport::state_of(c);
    }
    if (st == ConnState::direct || st == ConnState::leaving) {
        const int rc = engine->leave(c, why);
        if (rc < 0)
            SD_LOG(error, "fd %d could not leave the fabric (%s): %s", kfd(),
                   transport::reason_name(why), std::strerror(-rc));
    }
}

}  // namespace sd::fallback
