// Unit tests of the pieces that need no fabric and no second process:
// settings parsing, shared-memory and wire layouts, the connection record
// format, 4-tuple handling.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "transport/conn.hpp"
#include "transport/procpage.hpp"
#include "transport/settings.hpp"
#include "transport/sys.hpp"
#include "transport/wire.hpp"

#include <arpa/inet.h>
#include <cstdlib>
#include <cstring>
#include <memory>
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
    CHECK(settings().window == 1048576);
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
    STATIC_REQUIRE(kPageVersion == 4);
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
          "sink_cancels=0 upgrades=1 leaves=1");
    s->family = AF_INET6;
    inet_pton(AF_INET6, "::1", s->local_addr);
    inet_pton(AF_INET6, "::1", s->peer_addr);
    s->mode.store(std::uint32_t(Mode::kernel));
    s->reason.store(std::uint32_t(Reason::av_full));
    line = format_conn(1, "x", *s);
    CHECK(line.find("mode=kernel reason=av_full local=[::1]:5201 peer=[::1]:40000") !=
          std::string::npos);
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
