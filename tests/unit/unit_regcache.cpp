// The registration cache (regcache.hpp), with a fake provider.
#include <catch2/catch.hpp>

#include "transport/regcache.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <sys/resource.h>
#include <utility>

using namespace sd::transport;

namespace {
struct FakeProvider {
    int registered = 0, released = 0, live = 0;
    int fail_next = 0;  // -errno for the next registration
    std::uint64_t next_key = 100;
    static int reg(void *ctx, const void *, std::size_t, void **handle, std::uint64_t *key) {
        auto *f = static_cast<FakeProvider *>(ctx);
        if (f->fail_next) return std::exchange(f->fail_next, 0);
        ++f->registered;
        ++f->live;
        *key = f->next_key++;
        *handle = reinterpret_cast<void *>(*key);
        return 0;
    }
    static void rel(void *ctx, void *) {
        auto *f = static_cast<FakeProvider *>(ctx);
        ++f->released;
        --f->live;
    }
};
}  // namespace

TEST_CASE("registration cache: a buffer sent again finds its registration; a contained "
          "range too; a range sticking out registers anew",
          "[regcache]") {
    auto cache = std::make_unique<RegCache>();
    FakeProvider f;
    cache->configure(FakeProvider::reg, FakeProvider::rel, &f, 1 << 20, 8);
    static char buf[65536];
    RegCache::Ref a, b, c;
    REQUIRE(cache->acquire(buf, 32768, &a) == 0);
    cache->release(a);
    REQUIRE(cache->acquire(buf, 32768, &b) == 0);
    CHECK(b.key == a.key);
    cache->release(b);
    REQUIRE(cache->acquire(buf + 100, 1000, &b) == 0);
    CHECK(b.key == a.key);
    cache->release(b);
    REQUIRE(cache->acquire(buf + 100, 40000, &c) == 0);
    CHECK(c.key != a.key);
    cache->release(c);
    const RegCacheStats s = cache->stats();
    CHECK(s.hits == 2);
    CHECK(s.misses == 2);
    CHECK(f.registered == 2);
    CHECK(f.released == 0);
    CHECK(s.bytes == 32768 + 40000);
    cache->drain();
    CHECK(f.live == 0);
    CHECK(cache->stats().bytes == 0);
}

TEST_CASE("registration cache: freed or unmapped memory drops every overlapping entry, "
          "at once if unused, at its release if in use",
          "[regcache]") {
    auto cache = std::make_unique<RegCache>();
    FakeProvider f;
    cache->configure(FakeProvider::reg, FakeProvider::rel, &f, 1 << 20, 8);
    static char buf[3 * 4096];
    RegCache::Ref a, b, c;
    REQUIRE(cache->acquire(buf, 4096, &a) == 0);
    REQUIRE(cache->acquire(buf + 4096, 4096, &b) == 0);
    cache->release(a);
    CHECK(cache->may_hold(reinterpret_cast<std::uintptr_t>(buf),
                          reinterpret_cast<std::uintptr_t>(buf) + 1));
    // A range touching neither: nothing happens.
    cache->invalidate(buf + 2 * 4096, 4096);
    CHECK(cache->stats().invalidated == 0);
    // One byte of each: both go; b is still in use (its send goes on).
    cache->invalidate(buf + 4095, 2);
    CHECK(cache->stats().invalidated == 2);
    CHECK(!cache->may_hold(reinterpret_cast<std::uintptr_t>(buf),
                           reinterpret_cast<std::uintptr_t>(buf) + sizeof buf));
    // Released when unused: b at its release; a at the next look.
    CHECK(f.released == 0);
    cache->release(b);
    CHECK(f.released >= 1);
    REQUIRE(cache->acquire(buf, 4096, &c) == 0);
    CHECK(c.key != a.key);  // registered anew
    CHECK(f.released == 2);
    cache->release(c);
    cache->drain();
    CHECK(f.live == 0);
}

TEST_CASE("registration cache: bounded in entries and bytes, least recently used unused "
          "entry out first; an entry in use is never evicted",
          "[regcache]") {
    auto cache = std::make_unique<RegCache>();
    FakeProvider f;
    cache->configure(FakeProvider::reg, FakeProvider::rel, &f, 3 * 4096, 2);
    static char buf[8 * 4096];
    RegCache::Ref r[4];
    REQUIRE(cache->acquire(buf, 4096, &r[0]) == 0);
    REQUIRE(cache->acquire(buf + 4096, 4096, &r[1]) == 0);
    cache->release(r[0]);
    cache->release(r[1]);
    // Touch 0, so 1 is the oldest.
    REQUIRE(cache->acquire(buf, 4096, &r[0]) == 0);
    cache->release(r[0]);
    REQUIRE(cache->acquire(buf + 2 * 4096, 4096, &r[2]) == 0);  // evicts 1
    CHECK(cache->stats().evicted == 1);
    CHECK(f.live == 2);
    // 0 in use, 2 in use: a third cannot be cached; it is registered for
    // this send only and released with it.
    REQUIRE(cache->acquire(buf, 4096, &r[0]) == 0);
    REQUIRE(cache->acquire(buf + 4 * 4096, 4096, &r[3]) == 0);
    CHECK(r[3].slot == -1);
    CHECK(f.live == 3);
    cache->release(r[3]);
    CHECK(f.live == 2);
    // Larger than the whole budget: never cached.
    RegCache::Ref big;
    REQUIRE(cache->acquire(buf, 4 * 4096, &big) == 0);
    CHECK(big.slot == -1);
    cache->release(big);
    cache->release(r[0]);
    cache->release(r[2]);
    CHECK(cache->stats().bytes <= 3 * 4096);
    cache->drain();
    CHECK(f.live == 0);
}

TEST_CASE("registration cache: off (budget 0) registers for every send and keeps nothing; "
          "a failed registration is the caller's error",
          "[regcache]") {
    auto cache = std::make_unique<RegCache>();
    FakeProvider f;
    cache->configure(FakeProvider::reg, FakeProvider::rel, &f, 0, 8);
    CHECK(!cache->on());
    static char buf[4096];
    RegCache::Ref a;
    for (int i = 0; i < 3; ++i) {
        REQUIRE(cache->acquire(buf, sizeof buf, &a) == 0);
        cache->release(a);
    }
    CHECK(f.registered == 3);
    CHECK(f.live == 0);
    f.fail_next = -ENOMEM;
    CHECK(cache->acquire(buf, sizeof buf, &a) == -ENOMEM);
    CHECK(f.live == 0);
}

TEST_CASE("registration cache budget: at most half the soft RLIMIT_MEMLOCK", "[regcache]") {
    rlimit old{};
    REQUIRE(getrlimit(RLIMIT_MEMLOCK, &old) == 0);
    rlimit lim = old;
    lim.rlim_cur = 1 << 20;
    if (old.rlim_max != RLIM_INFINITY && old.rlim_max < lim.rlim_cur) lim.rlim_cur = old.rlim_max;
    REQUIRE(setrlimit(RLIMIT_MEMLOCK, &lim) == 0);
    CHECK(regcache_budget(64u << 20) == lim.rlim_cur / 2);
    CHECK(regcache_budget(1000) == std::min<std::size_t>(1000, lim.rlim_cur / 2));
    lim.rlim_cur = 0;
    REQUIRE(setrlimit(RLIMIT_MEMLOCK, &lim) == 0);
    CHECK(regcache_budget(64u << 20) == 0);
    REQUIRE(setrlimit(RLIMIT_MEMLOCK, &old) == 0);
}

TEST_CASE("registration cache: forget (a fork child) drops every entry without releasing "
          "it; a cache forgotten twice, or never filled, stays empty",
          "[regcache]") {
    auto cache = std::make_unique<RegCache>();
    FakeProvider f;
    cache->forget();  // never filled: nothing to drop
    CHECK(cache->stats().bytes == 0);
    cache->configure(FakeProvider::reg, FakeProvider::rel, &f, 1 << 20, 8);
    static char buf[8192];
    RegCache::Ref a;
    REQUIRE(cache->acquire(buf, 4096, &a) == 0);
    cache->release(a);
    cache->forget();
    // The handles are the parent's: none released here, none found again.
    CHECK(f.released == 0);
    CHECK(cache->stats().bytes == 0);
    CHECK_FALSE(cache->may_hold(reinterpret_cast<std::uintptr_t>(buf),
                                reinterpret_cast<std::uintptr_t>(buf) + 4096));
    cache->forget();
    // Configured again (the child's own engine): a fresh registration.
    cache->configure(FakeProvider::reg, FakeProvider::rel, &f, 1 << 20, 8);
    RegCache::Ref b;
    REQUIRE(cache->acquire(buf, 4096, &b) == 0);
    CHECK(f.registered == 2);
    cache->release(b);
    cache->forget();
    CHECK(cache->stats().bytes == 0);
}
