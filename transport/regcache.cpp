#include "regcache.hpp"
#include "sys.hpp"
#include "renew.hpp"

#include <algorithm>
#include <new>
#include <sys/resource.h>

namespace sd::transport {
namespace {

// Registrations are released outside the lock, a few at a time.
constexpr int kBatch = 16;

// Set while this thread holds the cache lock: a hook reached from inside
// (nothing under the lock allocates, but a sanitizer's runtime might)
// must not take it again.
__attribute__((tls_model("initial-exec"))) thread_local bool in_cache = false;

struct CacheLock {
    std::unique_lock<std::mutex> lock;
    explicit CacheLock(std::mutex &m) : lock(m) { in_cache = true; }
    ~CacheLock() { in_cache = false; }
    void unlock() {
        in_cache = false;
        lock.unlock();
    }
};

}  // namespace

void RegCache::configure(RegisterFn reg, ReleaseFn rel, void *ctx, std::size_t max_bytes,
                         unsigned max_entries) noexcept {
    CacheLock h(lock_);
    reg_ = reg;
    rel_ = rel;
    ctx_ = ctx;
    max_bytes_ = max_bytes;
    max_entries_ = std::min(max_entries, kMaxEntries);
    if (!max_entries_) max_bytes_ = 0;
    live_.store(max_bytes_ != 0, std::memory_order_relaxed);
}

void RegCache::bounds_locked() noexcept {
    std::uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (const Entry &e : entries_) {
        if (e.state != Entry::live) continue;
        lo = std::min(lo, e.lo);
        hi = std::max(hi, e.hi);
    }
    lo_bound_.store(lo, std::memory_order_release);
    hi_bound_.store(hi, std::memory_order_release);
}

void RegCache::drop_locked(Entry &e) noexcept {
    e.state = Entry::dropped;  // released once unused (collect_locked)
}

int RegCache::collect_locked(void **out, int cap) noexcept {
    int n = 0;
    for (Entry &e : entries_) {
        if (n == cap) break;
        if (e.state != Entry::dropped || e.refs) continue;
        out[n++] = e.handle;
        bytes_ -= e.hi - e.lo;
        e = Entry{};
    }
    return n;
}

int RegCache::evict_locked(std::size_t need, void **out, int cap) noexcept {
    int n = 0;
    for (;;) {
        unsigned live = 0;
        Entry *oldest = nullptr;
        for (Entry &e : entries_) {
            if (e.state == Entry::empty) continue;
            ++live;
            if (e.state == Entry::live && !e.refs && (!oldest || e.used < oldest->used))
                oldest = &e;
        }
        const bool room = live < max_entries_ && bytes_ + need <= max_bytes_;
        if (room || !oldest || n == cap) return n;
        out[n++] = oldest->handle;
        bytes_ -= oldest->hi - oldest->lo;
        ++stats_.evicted;
        *oldest = Entry{};
    }
}

int RegCache::acquire(const void *buf, std::size_t len, Ref *out) noexcept {
    const auto lo = reinterpret_cast<std::uintptr_t>(buf), hi = lo + len;
    void *old[kBatch];
    int nold = 0;
    {
        CacheLock h(lock_);
        if (max_bytes_) {
            for (int i = 0; i < int(kMaxEntries); ++i) {
                Entry &e = entries_[i];
                if (e.state != Entry::live || e.lo > lo || e.hi < hi) continue;
                ++e.refs;
                e.used = ++clock_;
                ++stats_.hits;
                *out = Ref{e.handle, e.key, i};
                return 0;
            }
        }
        ++stats_.misses;
        nold = collect_locked(old, kBatch);
    }
    for (int i = 0; i < nold; ++i) rel_(ctx_, old[i]);

    void *handle = nullptr;
    std::uint64_t key = 0;
    if (int rc = reg_(ctx_, buf, len, &handle, &key)) return rc;
    *out = Ref{handle, key, -1};
    if (!max_bytes_ || len > max_bytes_) return 0;

    CacheLock h(lock_);
    nold = evict_locked(len, old, kBatch);
    unsigned used = 0;
    Entry *slot = nullptr;
    for (Entry &e : entries_) {
        if (e.state != Entry::empty) ++used;
        else if (!slot) slot = &e;
    }
    if (slot && used < max_entries_ && bytes_ + len <= max_bytes_) {
        *slot = Entry{lo, hi, handle, key, ++clock_, 1, Entry::live};
        filled_ = true;
        bytes_ += len;
        out->slot = int(slot - entries_);
        bounds_locked();
    }
    stats_.bytes = bytes_;
    h.unlock();
    for (int i = 0; i < nold; ++i) rel_(ctx_, old[i]);
    return 0;
}

void RegCache::release(const Ref &ref) noexcept {
    if (ref.slot < 0) {
        if (ref.handle) rel_(ctx_, ref.handle);
        return;
    }
    void *old[kBatch];
    int nold = 0;
    {
        CacheLock h(lock_);
        Entry &e = entries_[ref.slot];
        if (e.refs) --e.refs;
        if (e.state == Entry::dropped && !e.refs) nold = collect_locked(old, kBatch);
        stats_.bytes = bytes_;
    }
    for (int i = 0; i < nold; ++i) rel_(ctx_, old[i]);
}

void RegCache::invalidate(const void *addr, std::size_t len) noexcept {
    const auto lo = reinterpret_cast<std::uintptr_t>(addr);
    const std::uintptr_t hi = len > UINTPTR_MAX - lo ? UINTPTR_MAX : lo + len;
    if (in_cache || !may_hold(lo, hi)) return;
    CacheLock h(lock_);
    bool any = false;
    for (Entry &e : entries_) {
        if (e.state != Entry::live || e.hi <= lo || e.lo >= hi) continue;
        drop_locked(e);
        ++stats_.invalidated;
        any = true;
    }
    if (any) bounds_locked();
}

void RegCache::drain() noexcept {
    void *old[kBatch];
    for (;;) {
        int n = 0;
        {
            CacheLock h(lock_);
            for (Entry &e : entries_)
                if (e.state == Entry::live && !e.refs) drop_locked(e);
            bounds_locked();
            n = collect_locked(old, kBatch);
            stats_.bytes = bytes_;
        }
        for (int i = 0; i < n; ++i) rel_(ctx_, old[i]);
        if (n < kBatch) return;
    }
}

SD_CHILD_PATH void RegCache::forget() noexcept {
    // The lock may have been held by a thread that does not exist here.
    // Only what differs from new (renew.hpp): every page written here is
    // one the fork copies for the child, at every fork (an empty entry is
    // Entry{}).
    renew(lock_);
    if (filled_) {
        for (Entry &e : entries_)
            if (e.state != Entry::empty) e = Entry{};
        filled_ = false;
    }
    renew(bytes_, 0);
    renew(max_bytes_, 0);
    renew(live_, false);
    renew(stats_);
    renew(lo_bound_, UINTPTR_MAX);
    renew(hi_bound_, 0);
}

RegCacheStats RegCache::stats() const noexcept {
    std::lock_guard g(lock_);
    return stats_;
}

namespace {
std::atomic<bool> hooks_on{false};
}
bool memhooks_active() noexcept { return hooks_on.load(std::memory_order_relaxed); }
void set_memhooks_active(bool on) noexcept { hooks_on.store(on, std::memory_order_relaxed); }

constinit RegCache detail::the_regcache;

std::size_t regcache_budget(std::size_t setting_bytes) noexcept {
    rlimit r{};
    if (getrlimit(RLIMIT_MEMLOCK, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
        setting_bytes = std::min<std::size_t>(setting_bytes, std::size_t(r.rlim_cur / 2));
    return setting_bytes;
}

}  // namespace sd::transport
