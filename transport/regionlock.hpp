// Provider calls that never wait forever on another process.
//
// shm (libfabric 1.17) guards each process's region with a spinlock in the
// region itself, in shared memory: a sender takes the receiver's lock to
// queue a message, the owner takes its own to progress. A process that ends
// while one of its threads holds such a lock (killed, or exit() while
// another thread is inside the provider) leaves it held for ever, and every
// later sender to that region, the owner included, spins inside the
// provider with no way out.
//
// Two defences. ProviderGate: at exit no thread is left inside a provider
// call (the exit waits, bounded, for those inside, and refuses new ones).
// Every call into libfabric once the endpoint is being made goes through
// it, not only those that take region locks: libfabric's destructor runs
// after the exit hook and frees the provider's state (the shm provider's
// list of endpoint names, which an address vector removal reads), so a
// thread still calling in then reads freed memory.
// RegionLock: before a call that takes a region's lock we look at that
// lock ourselves (a read-only map of the region's first page) and wait for
// it with a bound; a lock held longer than that means a holder that is
// gone, and the call is not made.
#pragma once
#include <atomic>
#include <cstdint>
#include <sys/types.h>

namespace sd::transport {

// Threads inside a provider call, and the exit that waits for them.
class ProviderGate {
public:
    // False once the process exits (for any thread but the exiting one),
    // after a second's wait for the end: the caller must not enter the
    // provider.
    bool enter() noexcept;
    // Nested entries of one thread always pass (regionlock.cpp).
    void leave() noexcept;
    // At exit: refuses new entries from other threads and waits up to
    // `ms` for the threads inside to leave. A thread still inside after
    // that is spinning on a lock it does not hold (every hold is short).
    void close(int ms) noexcept;
    // After close() for an exec that failed: the process goes on.
    void open() noexcept;
    // In a fork child: the parent's threads and exit are not ours.
    void reset() noexcept;

private:
    std::atomic<int> inside_{0};
    std::atomic<bool> closed_{false};
    std::atomic<pid_t> closer_{0};  // thread id of the exiting thread
};

ProviderGate &provider_gate() noexcept;

// RAII: enters the gate; `ok()` false when refused.
class InProvider {
public:
    InProvider() noexcept : ok_(provider_gate().enter()) {}
    ~InProvider() {
        if (ok_) provider_gate().leave();
    }
    InProvider(const InProvider &) = delete;
    InProvider &operator=(const InProvider &) = delete;
    bool ok() const noexcept { return ok_; }

private:
    bool ok_;
};

// The lock word of one shm region, watched through a private read-only
// mapping. Unmapped (no watch) unless the provider is shm of libfabric
// 1.17, whose region layout is checked on mapping (version byte, pid).
class RegionLock {
public:
    // `name` is the endpoint's address ("fi_shm://<region>").
    void watch(const char *name, pid_t pid) noexcept;
    void unwatch() noexcept;
    // Drops the peer's memory but keeps the place mapped (a thread may be
    // looking at the word): zeros in its stead, the lock word free.
    void forget() noexcept;
    // Waits, at most `bound_ns`, until the lock is free. True if it is (or
    // nothing is watched); false if it stayed held (its holder is gone or
    // stopped), or the region's owner died while we waited. After one such
    // wait, later calls look only once until the lock is seen free again.
    bool wait_free(std::uint64_t bound_ns) noexcept;
    bool watched() const noexcept { return lock_ != nullptr; }
    // Seen held past the bound, and not free since.
    bool wedged() const noexcept {
        return std::atomic_ref(wedged_).load(std::memory_order_relaxed) != 0;
    }

private:
    void *map_ = nullptr;
    pid_t owner_ = 0;
    const std::atomic<std::int32_t> *lock_ = nullptr;
    // Set once the lock stayed held past the bound (std::atomic_ref: the
    // peer table is copied by value); cleared when it is seen free.
    mutable std::uint64_t wedged_ = 0;
};

// How long a region lock may stay held before its holder counts as gone.
inline constexpr std::uint64_t kRegionLockBoundNs = 1'000'000'000;

}  // namespace sd::transport
