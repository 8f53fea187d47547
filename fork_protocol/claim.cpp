// A socket direct in another process and inherited through fork (an
// orphan): its first use here asks that owner to move the connection back
// to the kernel (claim_inherited); and a socket a new program started by
// exec inherits, a program that may not run the library, goes back to the
// kernel for good first (before_exec).
#include "claim.hpp"

#include "handover.hpp"

#include "transport/clock.hpp"
#include "transport/log.hpp"
#include "transport/settings.hpp"
#include "transport/sys.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <ctime>
#include <sys/socket.h>

namespace sd::forking {

using fallback::Phase;
using fallback::Sharers;
using fallback::sharers_left;
using fallback::sharers_stick;
using fallback::Stream;
using transport::Conn;
using transport::ConnState;
using transport::epipe;
using transport::sys;

namespace {

// The connection reset where its bytes died with another process: the
// kernel connection is reset too (connect(AF_UNSPEC) sends the RST and
// keeps the descriptor), so the peer's kernel side ends as ours does.
void reset_lost(Stream &s) noexcept {
    sockaddr unspec{};
    unspec.sa_family = AF_UNSPEC;
    (void)sys.connect(s.kfd(), &unspec, sizeof unspec);
    s.orphan_lost.store(Stream::kLostUntold, std::memory_order_release);
}

// A holder of a shared socket uses it: its entry says so first, and if
// another holder took the socket over meanwhile (share.cpp's take_over),
// that owner moves the connection back to the kernel, its offsets added
// to the counts, before this process touches the kernel socket.
bool use_shared(Stream &s, int proof) noexcept {
    bool pending = false;
    {
        // Marked already, and nobody took it over: every call after the
        // first, without the lock.
        Sharers *sh = s.share.load(std::memory_order_acquire);
        if (!sh) sh = s.holders.load(std::memory_order_acquire);
        if (!sh) return true;
        if (s.used_mark.load(std::memory_order_acquire) == sh &&
            !fallback::sharers_owner(sh, &pending) &&
            s.orphan_lost.load(std::memory_order_relaxed) == Stream::kNotLost)
            return true;
    }
    std::lock_guard lock(s.pend_lock);
    Sharers *sh = s.share.load(std::memory_order_relaxed);
    if (!sh) sh = s.holders.load(std::memory_order_relaxed);
    if (!sh) return true;
    if (s.orphan_lost.load(std::memory_order_relaxed) != Stream::kNotLost) return false;
    fallback::sharers_use(sh);
    s.used_mark.store(sh, std::memory_order_release);
    // The clock only once this waits (a child's first read would fault in
    // the clock's code for nothing).
    std::uint64_t start = 0;
    auto waited_ns = [&start] {
        const std::uint64_t now = transport::monotonic_ns();
        if (!start) start = now;
        return now - start;
    };
    for (;;) {
        const int owner = fallback::sharers_owner(sh, &pending);
        if (!owner) return true;
        if (pending) {
            // Attaching (a few system calls): wait for it, unless it died.
            if (waited_ns() > 1000000000ull &&
                fallback::sharers_owner_dead(owner))
                fallback::sharers_disown(sh, owner);
            timespec nap{0, 200000};
            nanosleep(&nap, nullptr);
            continue;
        }
        const int rc = transport::request_leave(owner, proof >= 0 ? proof : s.kfd(),
                                                     transport::Reason::shared);
        if (rc == -EAGAIN &&
            waited_ns() <
                (std::uint64_t(transport::settings().upgrade_timeout_ms) + 2000) * 1000000ull) {
            // Its upgrade is under way, or a call of its holds it: soon.
            timespec nap{0, 2000000};
            nanosleep(&nap, nullptr);
            continue;
        }
        if (rc == 0) {
            // Its connection left without adding its offsets (it had left
            // for good before: an exec, a change of privileges): nobody
            // knows where the kernel took over, so no holder may upgrade
            // it from the counts again.
            if (!sharers_left(sh)) sharers_stick(sh);
            fallback::sharers_disown(sh, owner);
            SD_LOG(info, "fd %d: pid %d had taken it over, and moved it back to the kernel",
                   s.kfd(), owner);
            continue;
        }
        if (rc == -ESRCH || rc == -ECONNRESET) {
            SD_LOG(error, "fd %d: pid %d had taken it over, and %s before moving it back to the "
                          "kernel: the connection is reset", s.kfd(), owner,
                   rc == -ESRCH ? "that process died" : "the peer died with bytes unread there");
            fallback::sharers_disown(sh, owner);
            sharers_stick(sh);
            reset_lost(s);
            return false;
        }
        static std::atomic<bool> said{false};
        if (!said.exchange(true))
            SD_LOG(error, "fd %d: pid %d had taken it over, and could not move it back to the "
                          "kernel (%s): its I/O fails with EIO here", s.kfd(), owner,
                   std::strerror(-rc));
        return false;
    }
}

}  // namespace

SD_CHILD_PATH bool claim_inherited(Stream &s, int proof, transport::Reason why) noexcept {
    if (!s.orphan.load(std::memory_order_acquire)) return use_shared(s, proof);
    std::lock_guard lock(s.pend_lock);
    if (!s.orphan.load(std::memory_order_relaxed)) return true;
    if (s.orphan_lost.load(std::memory_order_relaxed) != Stream::kNotLost) return false;
    Sharers *h = s.holders.load(std::memory_order_relaxed);
    // Used here: no other holder takes it over while we live.
    if (h) fallback::sharers_use(h);
    // Left already (its owner closed its copy, or another holder claimed
    // it): the counts say where the kernel took over.
    int rc = h && sharers_left(h)
                 ? 0
                 : transport::request_leave(s.owner, proof >= 0 ? proof : s.kfd(), why);
    if (rc == -ESRCH || rc == -ECONNRESET) {
        // The owner died before it moved the connection to the kernel
        // (or its peer died with bytes unread there): the bytes it held
        // died with it, and the kernel stream alone would go on past a
        // gap. What TCP gives for a connection that lost its bytes is a
        // reset.
        SD_LOG(error, "fd %d: inherited from pid %d while on the fabric, and %s before moving it "
                      "back to the kernel: the connection is reset", s.kfd(), s.owner,
               rc == -ESRCH ? "that process died" : "the peer died with bytes unread there");
        reset_lost(s);
        return false;
    }
    if (rc != 0) {
        static std::atomic<bool> said{false};
        if (!said.exchange(true))
            SD_LOG(error, "fd %d: inherited from pid %d while on the fabric, and that process "
                          "could not move it back to the kernel (%s): its I/O fails with EIO here",
                   s.kfd(), s.owner, std::strerror(-rc));
        return false;
    }
    SD_LOG(info, "fd %d: inherited from pid %d, which moved it back to the kernel", s.kfd(),
           s.owner);
    if (h && sharers_left(h)) {
        // Counted from now on, like a socket shared before its upgrade:
        // the last holder left upgrades it again.
        s.holders.store(nullptr, std::memory_order_relaxed);
        s.share.store(h, std::memory_order_release);
    } else if (h) {
        // Its owner's connection was off the fabric without adding its
        // offsets: nobody knows where the kernel took over, so no holder
        // may ever upgrade it from the counts.
        sharers_stick(h);
        s.holders.store(nullptr, std::memory_order_relaxed);
        s.share.store(h, std::memory_order_release);
    }
    s.orphan.store(false, std::memory_order_release);
    return true;
}

ssize_t orphan_error(Stream &s, bool out, int flags) noexcept {
    // Lost with its owner: the reset once (as a TCP socket's pending
    // error), then EOF for reads and EPIPE for writes. Otherwise the owner
    // lives and could not leave (its peer did not answer): EIO.
    int told = Stream::kLostUntold;
    if (s.orphan_lost.compare_exchange_strong(told, Stream::kLostTold, std::memory_order_acq_rel))
        return -ECONNRESET;
    if (told == Stream::kNotLost) return -EIO;
    return out ? epipe(flags) : 0;
}

void before_exec(Stream &s, bool vforked, int kept) noexcept {
    Phase p = s.phase.load(std::memory_order_acquire);
    if (p == Phase::fresh || p == Phase::listener) return;
    if (s.orphan.load(std::memory_order_acquire)) {
        if (!handed_as_orphan(s)) (void)claim_inherited(s, kept, transport::Reason::exec);
        return;
    }
    Conn *c = s.conn.load(std::memory_order_acquire);
    SD_LOG(debug, "fd %d before exec: phase %d, %s, state %d", s.kfd(), int(p),
           c ? "a connection" : "no connection", c ? int(transport::state_of(c)) : -1);
    // Never used here: the peer may wait for an upgrade that cannot come.
    if (!c && (p == Phase::deferred || p == Phase::connecting))
        transport::mark_unattached(s.kfd(), transport::Reason::exec);
    if (!c || !s.engine) return;  // the kernel has it, and counts (if shared) stay ours
    ConnState st = transport::state_of(c);
    if (st == ConnState::direct || st == ConnState::leaving) {
        // In a vfork child, the process that owns the engine acts.
        if (vforked)
            (void)transport::request_leave(s.engine->pid(), kept, transport::Reason::exec);
        else if (const int rc = s.engine->leave(c, transport::Reason::exec); rc < 0)
            SD_LOG(error, "fd %d: before exec, the connection could not leave the fabric: %s",
                   s.kfd(), std::strerror(-rc));
    } else if (st != ConnState::final) {
        // No upgrade from now on: the new program may not know of it.
        s.engine->bar_upgrades(c, transport::Reason::exec);
        // An upgrade under way that still ended direct leaves before the
        // new program starts (the peer would write into memory the exec
        // replaces).
        if (s.engine->settle_upgrade(c))
            if (const int rc = s.engine->leave(c, transport::Reason::exec); rc < 0)
                SD_LOG(error, "fd %d: before exec, the connection could not leave the fabric: %s",
                       s.kfd(), std::strerror(-rc));
    }
}

}  // namespace sd::forking
