// Unit tests of the pieces that need no fabric and no second process:
// settings parsing, shared-memory and wire layouts, the connection record
// format, 4-tuple handling.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "transport/conn.hpp"
#include "transport/engine.hpp"
#include "transport/procpage.hpp"
#include "transport/regcache.hpp"
#include "transport/settings.hpp"
#include "transport/sink.hpp"
#include "transport/sys.hpp"
#include "transport/wait.hpp"
#include "transport/wire.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sched.h>
#include <sys/resource.h>
#include <utility>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace sd::transport;

namespace {
struct EnvGuard {
    const char *name;
    explicit EnvGuard(const char *n, const char *v) : name(n) { setenv(n, v, 1); }
    ~EnvGuard() { unsetenv(name); }
};
}  // namespace

TEST_CASE("every setting has a name, a default and help text") {
    std::size_t n = 0;
    const Setting *t = setting_table(&n);
    REQUIRE(n == std::size_t(Key::count_));
    for (std::size_t i = 0; i < n; ++i) {
        CHECK(std::strncmp(t[i].name, "SDIRECT_", 8) == 0);
        CHECK(t[i].fallback != nullptr);
        CHECK(std::strlen(t[i].help) > 20);
    }
}

TEST_CASE("settings fall back to defaults on bad values") {
    EnvGuard w("SDIRECT_WINDOW", "lots");
    EnvGuard l("SDIRECT_LOG", "loud");
    EnvGuard e("SDIRECT_ENABLE", "maybe");
    load_settings();
    CHECK(settings().window == 2097152);
    CHECK(settings().log == 0);
    CHECK(settings().enable);
}

TEST_CASE("settings parse numbers, booleans and log level names") {
    EnvGuard w("SDIRECT_WINDOW", "0x10000");
    EnvGuard l("SDIRECT_LOG", "info");
    EnvGuard e("SDIRECT_SAME_PROCESS", "off");
    EnvGuard r("SDIRECT_REGISTRY", "/tmp/some-registry");
    load_settings();
    CHECK(settings().window == 65536);
    CHECK(settings().log == 2);
    CHECK_FALSE(settings().same_process);
    CHECK(std::string(settings().registry) == "/tmp/some-registry");
}

TEST_CASE("cross-user connections are off by default, and only on with the default registry") {
    load_settings();
    CHECK_FALSE(settings().cross_user);
    {
        EnvGuard x("SDIRECT_CROSS_USER", "1");
        load_settings();
        CHECK(settings().cross_user);
        // The other uid's registry is found by its default name only.
        EnvGuard r("SDIRECT_REGISTRY", "/tmp/some-registry");
        load_settings();
        CHECK_FALSE(settings().cross_user);
    }
    load_settings();
}

TEST_CASE("the default registry is per user") {
    load_settings();
    CHECK(std::string(settings().registry) == "/dev/shm/sdirect-" + std::to_string(getuid()));
}

TEST_CASE("the message header is the documented 32-byte contract") {
    STATIC_REQUIRE(sizeof(MsgHeader) == 32);
    STATIC_REQUIRE(offsetof(MsgHeader, dst_conn) == 4);
    STATIC_REQUIRE(offsetof(MsgHeader, offset) == 16);
    STATIC_REQUIRE(offsetof(MsgHeader, flags) == 28);
}

TEST_CASE("the process page layout is versioned and fixed") {
    STATIC_REQUIRE(sizeof(ProcHeader) == 128);
    STATIC_REQUIRE(sizeof(ConnStat) == 256);
    STATIC_REQUIRE(sizeof(ProcPage) == 128 + 256 * kSlots);
    STATIC_REQUIRE(kPageVersion == 7);
    STATIC_REQUIRE(offsetof(ProcHeader, reg_hits) == 72);
    STATIC_REQUIRE(offsetof(ConnStat, sink_word) == 200);
}

TEST_CASE("a connection record prints in the sdirect-stat format") {
    auto s = std::make_unique<ConnStat>();
    std::memset(static_cast<void *>(s.get()), 0, sizeof *s);
    s->state.store(std::uint32_t(SlotState::live));
    s->fd = 7;
    s->mode.store(std::uint32_t(Mode::direct));
    s->reason.store(std::uint32_t(Reason::none));
    s->family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", s->local_addr);
    inet_pton(AF_INET, "127.0.0.2", s->peer_addr);
    s->local_port = 5201;
    s->peer_port = 40000;
    s->peer_pid = 99;
    s->tx_fabric.store(1024);
    s->tx_window.store(-5);
    s->rx_queued.store(300);
    s->rx_owed.store(7);
    s->tx_inline.store(24);
    s->tx_ring.store(1000);
    s->rx_zcopy.store(3);
    s->adverts.store(2);
    s->tx_sink.store(5);
    s->sinks.store(4);
    s->upgrades.store(1);
    s->leaves.store(1);
    std::string line = format_conn(12, "iperf3", *s);
    CHECK(line ==
          "pid=12 comm=iperf3 fd=7 state=live mode=direct reason=none local=127.0.0.1:5201 "
          "peer=127.0.0.2:40000 peer_pid=99 tx_kernel=0 rx_kernel=0 tx_fabric=1024 rx_fabric=0 "
          "tx_msgs=0 rx_msgs=0 tx_window=-5 rx_queued=300 rx_owed=7 tx_inline=24 tx_ring=1000 "
          "tx_zcopy=0 rx_zcopy=3 tx_sink=5 rx_sink=0 adverts=2 cancels=0 sinks=4 "
          "sink_cancels=0 upgrades=1 leaves=1 peer_reason=none");
    s->family = AF_INET6;
    inet_pton(AF_INET6, "::1", s->local_addr);
    inet_pton(AF_INET6, "::1", s->peer_addr);
    s->mode.store(std::uint32_t(Mode::kernel));
    s->reason.store(std::uint32_t(Reason::av_full));
    line = format_conn(1, "x", *s);
    CHECK(line.find("mode=kernel reason=av_full local=[::1]:5201 peer=[::1]:40000") !=
          std::string::npos);
}

TEST_CASE("the signal-safe record names every address as inet_ntop does") {
    auto s = std::make_unique<ConnStat>();
    s->family = AF_INET6;
    s->local_port = 1;
    s->peer_port = 2;
    for (const char *a : {"::1", "::", "1::", "fe80::1:0:0:2", "2001:db8::8:800:200c:417a",
                          "::ffff:127.0.0.1", "::10.0.0.1", "1:0:2:0:0:3:0:4", "1:2:3:4:5:6:7:8",
                          "0:0:1:0:0:0:1:0", "::1:0:0:0", "ff02::0:1", "::fffe:1:2"}) {
        inet_pton(AF_INET6, a, s->local_addr);
        inet_pton(AF_INET6, a, s->peer_addr);
        char want[INET6_ADDRSTRLEN];
        inet_ntop(AF_INET6, s->local_addr, want, sizeof want);
        char got[200];
        format_endpoints(got, sizeof got, *s);
        INFO(a);
        CHECK(std::string(got) == "[" + std::string(want) + "]:1 > [" + want + "]:2");
    }
    char tiny[8];
    CHECK(format_endpoints(tiny, sizeof tiny, *s) == 7);
    CHECK(std::strlen(tiny) == 7);
}

TEST_CASE("loopback and this host's interface addresses are local, a documentation address "
          "is not") {
    std::uint8_t a[16] = {};
    inet_pton(AF_INET, "127.0.0.1", a);
    CHECK(address_is_local(AF_INET, a));
    inet_pton(AF_INET, "127.9.8.7", a);
    CHECK(address_is_local(AF_INET, a));
    inet_pton(AF_INET6, "::1", a);
    CHECK(address_is_local(AF_INET6, a));
    inet_pton(AF_INET, "192.0.2.1", a);  // TEST-NET-1: never assigned
    CHECK(!address_is_local(AF_INET, a));
    inet_pton(AF_INET6, "2001:db8::1", a);
    CHECK(!address_is_local(AF_INET6, a));
    ifaddrs *all = nullptr;
    REQUIRE(getifaddrs(&all) == 0);
    for (ifaddrs *i = all; i; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET) {
            const auto *in = reinterpret_cast<const sockaddr_in *>(i->ifa_addr);
            CHECK(address_is_local(AF_INET, reinterpret_cast<const std::uint8_t *>(&in->sin_addr)));
        }
    freeifaddrs(all);
}

TEST_CASE("every fallback reason has a distinct name") {
    for (std::uint32_t a = 0; a < std::uint32_t(Reason::count_); ++a)
        for (std::uint32_t b = a + 1; b < std::uint32_t(Reason::count_); ++b)
            CHECK(std::string(reason_name(Reason(a))) != reason_name(Reason(b)));
    CHECK(std::string(reason_name(Reason(999))) == "?");
}

TEST_CASE("a reversed tuple is the peer's view and reverses back") {
    Tuple t{};
    t.family = AF_INET;
    t.local_port = 1;
    t.peer_port = 2;
    t.local_addr[0] = 10;
    t.peer_addr[0] = 20;
    Tuple r = reversed(t);
    CHECK(r.local_port == 2);
    CHECK(r.peer_port == 1);
    CHECK(r.local_addr[0] == 20);
    CHECK(r.peer_addr[0] == 10);
    CHECK(reversed(r) == t);
    CHECK_FALSE(r == t);
}

TEST_CASE("tuple_of reads a connected socket and refuses others") {
    resolve_sys();
    int l = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(l, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0);
    REQUIRE(::listen(l, 1) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(l, reinterpret_cast<sockaddr *>(&a), &len) == 0);
    int c = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(::connect(c, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0);
    int s = ::accept(l, nullptr, nullptr);
    REQUIRE(s >= 0);
    Tuple tc{}, ts{};
    REQUIRE(tuple_of(c, tc) == 0);
    REQUIRE(tuple_of(s, ts) == 0);
    CHECK(reversed(tc) == ts);
    CHECK(ts.local_port == ntohs(a.sin_port));
    Tuple tl{};
    CHECK(tuple_of(l, tl) == -ENOTCONN);
    ::close(c);
    ::close(s);
    ::close(l);
}

// ---- the registration cache (regcache.hpp), with a fake provider ---------

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

TEST_CASE("spin slots: one spinner per CPU; a thread whose spins end in sleep backs off "
          "1, 2, 4 ... waits and spins again once a spin is satisfied",
          "[spin]") {
    char dir[] = "/tmp/sdirect-unit-XXXXXX";
    REQUIRE(mkdtemp(dir) != nullptr);
    EnvGuard reg("SDIRECT_REGISTRY", dir);
    load_settings();
    // This thread stays on the CPU it runs on, so every slot is that CPU's.
    cpu_set_t old, one;
    REQUIRE(sched_getaffinity(0, sizeof old, &old) == 0);
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
    const std::uint64_t ns = 50000;
    const std::uint64_t now = monotonic_ns();
    auto spins = [&] {
        SpinSlot s;
        const bool spun = s.start(now, ns) == now + ns;
        s.release();  // the spin ended in a sleep
        return spun;
    };
    {
        SpinSlot a, b;
        CHECK(a.start(now, ns) == now + ns);
        CHECK(b.start(now, ns) == now);  // the CPU's slot is taken
        // a is dropped satisfied at the end of the scope, b never spun.
    }
    // Failures in a row: the first two spin, then 1 wait without, a probe,
    // 2 without, a probe, 4 without, a probe.
    const bool expect[] = {true, true, false, true, false, false, true,
                           false, false, false, false, true};
    for (std::size_t i = 0; i < sizeof expect; ++i) {
        INFO("wait " << i);
        CHECK(spins() == expect[i]);
    }
    {
        // Skips over (8 without), then a satisfied spin resets the count.
        for (int i = 0; i < 8; ++i) CHECK_FALSE(spins());
        SpinSlot ok;
        CHECK(ok.start(now, ns) == now + ns);
    }
    CHECK(spins());
    CHECK(spins());
    CHECK_FALSE(spins());
    REQUIRE(sched_setaffinity(0, sizeof old, &old) == 0);
    std::string file = std::string(dir) + "/spin";
    unlink(file.c_str());
    rmdir(dir);
}

TEST_CASE("a sink advertisement is the documented 24-byte contract", "[sink]") {
    STATIC_REQUIRE(sizeof(SinkAvailBody) == 24);
    STATIC_REQUIRE(offsetof(SinkAvailBody, seq) == 8);
    STATIC_REQUIRE(offsetof(SinkAvailBody, key) == 16);
    // The messages that end a registered sink of the receiver unasked.
    STATIC_REQUIRE(is_stream_msg(MsgType::data) && is_stream_msg(MsgType::ring) &&
                   is_stream_msg(MsgType::src_avail) && is_stream_msg(MsgType::fin) &&
                   is_stream_msg(MsgType::close) && is_stream_msg(MsgType::leave));
    STATIC_REQUIRE(!is_stream_msg(MsgType::credit) && !is_stream_msg(MsgType::sink_done) &&
                   !is_stream_msg(MsgType::sink_avail) && !is_stream_msg(MsgType::sink_cancel) &&
                   !is_stream_msg(MsgType::src_done) && !is_stream_msg(MsgType::give_back));
}

TEST_CASE("a registered sink is written only at the sender's next byte, with nothing staged, "
          "and never after a stream message of the sender at or past it",
          "[sink]") {
    CHECK(rma_sink_takeable(100, 100, false, kNoOffset));
    CHECK(rma_sink_takeable(100, 100, false, 99));
    CHECK_FALSE(rma_sink_takeable(100, 100, false, 100));  // e.g. a src_avail read 0 bytes
    CHECK_FALSE(rma_sink_takeable(100, 150, false, 100));  // our bytes crossed it
    CHECK_FALSE(rma_sink_takeable(100, 100, true, kNoOffset));
    CHECK(rma_sink_takeable(0, 0, false, kNoOffset));
    CHECK_FALSE(rma_sink_takeable(0, 0, false, 0));  // the switch announcement at 0
}

TEST_CASE("sinks register at most half the soft RLIMIT_MEMLOCK together, a prefix of a "
          "larger buffer, and nothing with a limit of 0",
          "[sink]") {
    CHECK(sink_budget_fit(1 << 20, 0, kNoOffset) == 1u << 20);
    CHECK(sink_budget_fit(1 << 20, 0, 8u << 20) == 1u << 20);
    CHECK(sink_budget_fit(8u << 20, 0, 8u << 20) == 4u << 20);
    CHECK(sink_budget_fit(1 << 20, 3u << 20, 8u << 20) == 1u << 20);
    CHECK(sink_budget_fit(2u << 20, 3u << 20, 8u << 20) == 1u << 20);
    CHECK(sink_budget_fit(1 << 20, 4u << 20, 8u << 20) == 0);
    CHECK(sink_budget_fit(1 << 20, 0, 0) == 0);
}

TEST_CASE("a write into a sink waits for delivery unless sends are ordered after writes both "
          "ways",
          "[sink]") {
    fi_tx_attr tx{};
    fi_rx_attr rx{};
    fi_info info{};
    info.tx_attr = &tx;
    info.rx_attr = &rx;
    tx.msg_order = FI_ORDER_SAS;  // shm 1.17
    rx.msg_order = FI_ORDER_SAS | FI_ORDER_SAW;
    CHECK(sink_write_flags(&info) == FI_DELIVERY_COMPLETE);
    tx.msg_order = FI_ORDER_SAS | FI_ORDER_SAW;  // tcp;ofi_rxm 1.17
    CHECK(sink_write_flags(&info) == 0);
    rx.msg_order = FI_ORDER_SAS;
    CHECK(sink_write_flags(&info) == FI_DELIVERY_COMPLETE);
    CHECK(sink_write_flags(nullptr) == FI_DELIVERY_COMPLETE);
}
