// The registration (pin-down) cache of read zero-copy's send buffers.
//
// A send buffer the peer reads with the provider's RMA must be registered
// first; on hardware that pins pages that costs system calls and page
// walks, and applications send from the same buffers again and again. The
// cache keeps registrations between sends, bounded in entries and bytes
// (never more than half of RLIMIT_MEMLOCK), the least recently used unused
// one going first.
//
// A registration must never outlive the pages it was made for: memory the
// application frees or unmaps is dropped from the cache before it goes.
// The memory hooks (intercept/shim_mem.cpp: free, realloc, munmap, mremap,
// madvise, mmap over a range, brk/sbrk, shmdt) call invalidate(); when
// they are not the ones the process calls (the program or a sanitizer
// defines them first) the cache stays off and every send registers anew.
//
// On one host the peer reads with process_vm_readv and needs no
// registration at all: the cache is for the provider's RMA (other hosts,
// or where the kernel refuses cross-process reads).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace sd::transport {

struct RegCacheStats {
    std::uint64_t hits = 0;         // a send found its buffer registered
    std::uint64_t misses = 0;       // registered anew
    std::uint64_t invalidated = 0;  // dropped: the memory was freed or unmapped
    std::uint64_t evicted = 0;      // dropped for room (entries, bytes)
    std::uint64_t bytes = 0;        // registered bytes held now (cached + in use)
};

class RegCache {
public:
    // The provider's side: registers [buf, buf+len) (0 or -errno, a handle
    // and the key the peer uses) and releases a handle.
    using RegisterFn = int (*)(void *ctx, const void *buf, std::size_t len, void **handle,
                               std::uint64_t *key);
    using ReleaseFn = void (*)(void *ctx, void *handle);

    static constexpr unsigned kMaxEntries = 256;

    // Off (every acquire registers, every release deregisters) until
    // configured with a nonzero budget.
    void configure(RegisterFn reg, ReleaseFn rel, void *ctx, std::size_t max_bytes,
                   unsigned max_entries) noexcept;

    struct Ref {
        void *handle = nullptr;
        std::uint64_t key = 0;
        int slot = -1;  // -1: not cached (released on release())
    };
    // A registration covering [buf, buf+len): 0 or -errno.
    int acquire(const void *buf, std::size_t len, Ref *out) noexcept;
    void release(const Ref &ref) noexcept;

    // [addr, addr+len) is being freed, unmapped or replaced: registrations
    // overlapping it are dropped (async-safe with respect to the cache:
    // no allocation, no provider call; their handles are released later).
    void invalidate(const void *addr, std::size_t len) noexcept;
    // Quick test for the hooks: may [addr, addr+len) overlap an entry?
    bool may_hold(std::uintptr_t lo, std::uintptr_t hi) const noexcept {
        return lo < hi_bound_.load(std::memory_order_acquire) &&
               hi > lo_bound_.load(std::memory_order_acquire);
    }
    bool on() const noexcept { return live_.load(std::memory_order_relaxed); }

    // Releases every unused entry and the dropped ones (engine teardown).
    void drain() noexcept;
    // In a fork child: forget every entry without releasing (the handles
    // belong to the parent's domain).
    void forget() noexcept;
    RegCacheStats stats() const noexcept;

private:
    struct Entry {
        std::uintptr_t lo = 0, hi = 0;
        void *handle = nullptr;
        std::uint64_t key = 0;
        std::uint64_t used = 0;  // LRU clock
        unsigned refs = 0;
        enum : std::uint8_t { empty, live, dropped } state = empty;
    };
    // Under lock_: moves released dropped entries' handles to `out`.
    int collect_locked(void **out, int cap) noexcept;
    int evict_locked(std::size_t need, void **out, int cap) noexcept;
    void bounds_locked() noexcept;
    void drop_locked(Entry &e) noexcept;

    RegisterFn reg_ = nullptr;
    ReleaseFn rel_ = nullptr;
    void *ctx_ = nullptr;
    std::size_t max_bytes_ = 0;
    unsigned max_entries_ = 0;

    mutable std::mutex lock_;
    Entry entries_[kMaxEntries];
    std::uint64_t clock_ = 0;
    std::size_t bytes_ = 0;
    // The span of every live entry, for the hooks' quick test.
    std::atomic<std::uintptr_t> lo_bound_{UINTPTR_MAX}, hi_bound_{0};
    std::atomic<bool> live_{false};  // configured with a budget
    // An entry was ever filled: without one, a fork child's forget() reads
    // none of the 256 (12 KiB the child would otherwise pull in per fork).
    bool filled_ = false;
    RegCacheStats stats_;
};

// True when the memory hooks are the process's free, munmap, ... (set
// by the library's constructor after it checked): the cache may be used.
bool memhooks_active() noexcept;
void set_memhooks_active(bool on) noexcept;

// The process's cache (read zero-copy's send buffers), constant-initialised:
// the hooks may run before any constructor. Inline, as every free of the
// process looks at its bounds.
namespace detail {
extern RegCache the_regcache;
}
inline RegCache &regcache() noexcept { return detail::the_regcache; }

// Budget for the cache: SDIRECT_REG_CACHE_MB, at most half the soft
// RLIMIT_MEMLOCK (0 when that is 0). 0: off.
std::size_t regcache_budget(std::size_t setting_bytes) noexcept;

}  // namespace sd::transport
