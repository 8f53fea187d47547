// Upgrade only when it can pay. An upgrade costs the process its fabric
// engine (~6 ms wall and ~5 ms of CPU, once) and the connection a
// handshake on both ends; a connection that is over after a request and
// its answer gains nothing from it. So a connection starts on the kernel,
// counted as a pending one, and asks for its upgrade only once it has
// earned it: at its first I/O that moves bytes after it has lived
// SDIRECT_UPGRADE_AFTER_MS, once kEarnCalls of its calls have moved
// bytes (a connection that goes on exchanging, not one that says a few
// words at its start and its end, such as a test's control connection
// whose last words would otherwise race its upgrade with its shutdown).
// Until then it is in no registry, and a
// process none of whose connections ever earns never builds its engine.
// Both ends follow the same rule; the one that asks later finds the
// other's half in the registry and initiates.
#include "kernel_sleep.hpp"
#include "readiness.hpp"
#include "stream.hpp"
#include "table.hpp"

#include "transport/log.hpp"
#include "transport/rules.hpp"
#include "transport/settings.hpp"
#include "transport/sys.hpp"
#include "transport/wait.hpp"

namespace sd::fallback {

void finish_pending_cb(void *ctx) noexcept {
    auto *s = static_cast<Stream *>(ctx);
    s->finish_pending();
    release(s);
}

SD_CHILD_PATH void Stream::start_earning() noexcept {
    std::lock_guard lock(pend_lock);
    pending.store(true, std::memory_order_release);
    // A socket that went through a fork has lived at least since this
    // process began to share it (take_ns, the fork's own clock in a
    // child): its life counts from there, and a forked server's child
    // reads no clock for it (its first read would fault in the clock's
    // code pages).
    const std::uint64_t now = take_ns ? take_ns : transport::monotonic_ns();
    earn_ns = now + std::uint64_t(transport::settings().upgrade_after_ms) * 1000000ull;
    build_ns = now + std::uint64_t(transport::settings().build_after_ms) * 1000000ull;
    earn_calls = 0;
    ask_held = false;
    move_to(Phase::attached);
}

bool Stream::earned(std::uint32_t calls, std::uint64_t earn_at, std::uint64_t build_at) noexcept {
    if (calls < kEarnCalls) return false;
    const std::uint64_t now = transport::monotonic_ns();
    if (now < earn_at) return false;
    // An ask that would start the build, in a client, waits for
    // SDIRECT_BUILD_AFTER_MS: a build costs ~5 ms of CPU and the teardown
    // at exit, which a short-lived client process would not earn back. A
    // server (or a child it forked) asks at once.
    return now >= build_at || transport::Engine::current() || !transport::Engine::idle_process() ||
           transport::Engine::serving();
}

SD_CHILD_PATH void Stream::ask_upgrade_locked() noexcept {
    if (!earned(++earn_calls, earn_ns, build_ns)) return;
    if (plain_n.load(std::memory_order_relaxed)) {
        // Registered plainly in epoll sets, where no sleep watches our
        // state: their shadows come first, at the end of this call.
        ask_deferred.store(true, std::memory_order_relaxed);
        return;
    }
    ask_or_hold_locked();
}

void Stream::ask_or_hold_locked() noexcept {
    if (kernel_waiters) {
        // A blocked recv asks when it returns; a readiness wait asleep in
        // the kernel is woken to make the ask.
        ask_held = true;
        if (wait_holds) kernel_waits_wake();
        return;
    }
    ask_now_locked();
}

void Stream::ask_now_locked() noexcept {
    // Another thread is changing the process's ids: no engine may be
    // built now (transport/afresh.cpp); a later call asks.
    if (transport::builds_held()) return;
    earn_ns = 0;
    ask_held = false;
    // The rules are heard here, once the connection has earned, not at
    // its start: a connection that never earns costs what TCP costs,
    // rules or not (no addresses asked of the kernel, no entry written).
    // The peer follows the same earning rule, so our entry is there when
    // its upgrade looks for us. Shared through fork: the holder left
    // alone asks again.
    if (!share.load(std::memory_order_relaxed) && rule_says_kernel()) {
        pending.store(false, std::memory_order_release);
        keep_by_rule();
        return;
    }
    transport::Engine *e = transport::Engine::ready();  // the first asks for the build
    if (!e) {
        refs.fetch_add(1, std::memory_order_relaxed);  // the builder's, until it is done
        if (transport::Engine::when_ready(finish_pending_cb, this)) return;
        refs.fetch_sub(1, std::memory_order_relaxed);
        // No build under way: it finished since ready() (or cannot be).
        e = transport::Engine::current();
    }
    engine = e;
    if (e && fds.load(std::memory_order_acquire) > 0 && !share.load(std::memory_order_relaxed))
        set_conn(e->attach(kfd(), acceptor, rcvbuf.load(std::memory_order_relaxed), pre_tx,
                             pre_rx));
    pending.store(false, std::memory_order_release);
}

bool Stream::rule_says_kernel() noexcept {
    if (!rule_verdict) rule_verdict = transport::rules_keep_fd_on_kernel(kfd(), acceptor) ? 1 : -1;
    return rule_verdict > 0;
}

void Stream::keep_by_rule() noexcept {
    // On TCP for good, before it touches the engine; the peer's upgrade
    // finds our entry and says why.
    for_good.store(true, std::memory_order_release);
    transport::mark_unattached(kfd(), transport::Reason::rule, &mark);
    SD_LOG(info, "fd %d stays on TCP: %s", kfd(),
           transport::rules().error[0] ? "the rules file is unusable" : "a rule says kernel");
}

void Stream::finish_deferred_ask() noexcept {
    // Every plain registration a shadow, and every sleep on its set woken
    // to look at it again (epoll.cpp): from here on a wait holds the ask
    // back as for any socket of ours, or watches our state.
    epoll_unplain(this);
    std::lock_guard lock(pend_lock);
    if (!ask_deferred.exchange(false, std::memory_order_relaxed)) return;
    // Shared through fork meanwhile, or the ask made otherwise: its next
    // call goes on (a take-over is no longer held back).
    if (plain_n.load(std::memory_order_relaxed) || !pending.load(std::memory_order_relaxed) ||
        !earn_ns || share.load(std::memory_order_relaxed))
        return;
    ask_or_hold_locked();
}

bool Stream::hold_for_kernel_wait() noexcept {
    std::lock_guard lock(pend_lock);
    if (!kernel_wait_ok_locked()) return false;
    ++kernel_waiters;
    ++wait_holds;
    return true;
}

bool Stream::may_wait_in_kernel() noexcept {
    std::lock_guard lock(pend_lock);
    return kernel_wait_ok_locked();
}

bool Stream::kernel_wait_ok_locked() const noexcept {
    // Connected but not attached yet (accepted, or its non-blocking
    // connect under way): its first I/O attaches it, and only starts it
    // earning (start_earning, under this lock), so nothing but a call of
    // ours brings it nearer the fabric either. Not with upgrades at once
    // (SDIRECT_UPGRADE_AFTER_MS=0): that first call attaches it outright.
    const Phase p = phase.load(std::memory_order_acquire);
    const bool unattached = !forked && (p == Phase::connecting || p == Phase::deferred) &&
                            transport::settings().upgrade_after_ms;
    // Asked already (the builder may attach it at any time), shared
    // through fork, or an ask due: our state has to be watched.
    return !((!unattached && (!pending.load(std::memory_order_relaxed) || !earn_ns || ask_held)) ||
             share.load(std::memory_order_relaxed) || conn.load(std::memory_order_relaxed));
}

bool Stream::kernel_for_good_locked() const noexcept {
    if (forked || counting() || ask_deferred.load(std::memory_order_relaxed) ||
        prefix.load(std::memory_order_acquire) ||
        phase.load(std::memory_order_acquire) != Phase::attached)
        return false;
    transport::Conn *c = conn.load(std::memory_order_acquire);
    return !c || (transport::state_of(c) == transport::ConnState::final && !left_holders(c));
}

void Stream::end_kernel_wait() noexcept {
    std::lock_guard lock(pend_lock);
    --kernel_waiters;
    --wait_holds;
    if (!kernel_waiters && ask_held && earn_ns) ask_now_locked();
}

void Stream::finish_pending() noexcept {
    std::lock_guard lock(pend_lock);
    if (!pending.load(std::memory_order_relaxed)) return;
    engine = transport::Engine::current();
    // Shared through fork meanwhile: the last holder left attaches it.
    if (engine && fds.load(std::memory_order_acquire) > 0 && !share.load(std::memory_order_relaxed))
        set_conn(engine->attach(kfd(), acceptor, rcvbuf.load(std::memory_order_relaxed), pre_tx,
                                  pre_rx));
    pending.store(false, std::memory_order_release);
}

}  // namespace sd::fallback
