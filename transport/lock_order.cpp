// The holders' tokens and the checked build's held-lock list behind
// lock_order.hpp.
#include "lock_order.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace sd::transport::lock_order {
#ifdef SDIRECT_LOCK_CHECK
namespace {

struct HeldLock {
    const void *m;
    Rank r;
};

constexpr int kMaxHeld = 12;
thread_local HeldLock held_locks[kMaxHeld];
thread_local int nheld = 0;

[[noreturn]] void violation(const char *what, Rank r) noexcept {
    std::fprintf(stderr, "sdirect: lock order violated: %s (rank %u; held:", what, unsigned(r));
    for (int i = 0; i < nheld; ++i) std::fprintf(stderr, " %u", unsigned(held_locks[i].r));
    std::fprintf(stderr, ")\n");
    std::abort();
}

}  // namespace
#endif

#ifdef SDIRECT_LOCK_CHECK
void check(const void *m, Rank r, bool blocking) noexcept {
    for (int i = 0; i < nheld; ++i) {
        if (held_locks[i].m == m) violation("a lock taken again by its holder", r);
        // Nested epoll sets: a set's lock under its containers' (the
        // kernel refuses loops, so they nest in one order).
        if (blocking && held_locks[i].r >= r && !(r == Rank::epoll && held_locks[i].r == r))
            violation("a blocking lock under one of higher rank", r);
    }
}
#endif

#ifdef SDIRECT_LOCK_CHECK
void acquired(const void *m, Rank r) noexcept {
    if (nheld < kMaxHeld) held_locks[nheld] = {m, r};
    else violation("too many locks held", r);
    ++nheld;
}

void released(const void *m) noexcept {
    // Usually the last one; unique_lock may release out of order.
    for (int i = (nheld < kMaxHeld ? nheld : kMaxHeld) - 1; i >= 0; --i) {
        if (held_locks[i].m != m) continue;
        for (int j = i + 1; j < nheld && j < kMaxHeld; ++j) held_locks[j - 1] = held_locks[j];
        --nheld;
        return;
    }
    if (nheld > kMaxHeld) --nheld;
}
#endif

std::uint32_t new_token() noexcept {
    static std::atomic<std::uint32_t> next{0};
    std::uint32_t t;
    do t = next.fetch_add(1, std::memory_order_relaxed) + 1;
    while (t == 0);
    self_token = t;
    return t;
}

bool checked() noexcept {
#ifdef SDIRECT_LOCK_CHECK
    return true;
#else
    return false;
#endif
}

}  // namespace sd::transport::lock_order

namespace sd::transport {

void FutexMutex::lock_contended(std::uint32_t c) noexcept {
    // First a short spin while nobody sleeps on it: the locks are held for
    // a delivery or a look at a connection's state, far less than a futex
    // sleep and wake-up cost both threads (a poll's look against a
    // delivery on another CPU took two futex calls a message).
    for (int spin = 0; spin < kSpins && c == 1; ++spin) {
        cpu_relax();
        c = w_.load(std::memory_order_relaxed);
        if (c == 0 && w_.compare_exchange_strong(c, 1, std::memory_order_acquire,
                                                 std::memory_order_relaxed))
            return;
    }
    // Marked as slept on (2) before each sleep, so the holder's unlock
    // wakes one; a wake-up (or EINTR, EAGAIN) tries again, as 2: another
    // sleeper may be left. errno stays the caller's, as a pthread mutex
    // leaves it.
    const int saved = errno;
    if (c != 2) c = w_.exchange(2, std::memory_order_acquire);
    while (c != 0) {
        (void)syscall(SYS_futex, &w_, FUTEX_WAIT_PRIVATE, 2u, nullptr, nullptr, 0);
        c = w_.exchange(2, std::memory_order_acquire);
    }
    errno = saved;
}

void FutexMutex::wake_one() noexcept {
    const int saved = errno;
    (void)syscall(SYS_futex, &w_, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
    errno = saved;
}

}  // namespace sd::transport
