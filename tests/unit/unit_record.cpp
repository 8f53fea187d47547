// The connection record (a process page slot) as sdirect-stat prints it,
// the signal-safe address formatting and the fallback reasons' names.
#include <catch2/catch.hpp>

#include "transport/procpage.hpp"

#include <arpa/inet.h>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <sys/socket.h>

using namespace sd::transport;

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
        char expect[2 * INET6_ADDRSTRLEN + 16];
        std::snprintf(expect, sizeof expect, "[%s]:1 > [%s]:2", want, want);
        CHECK(std::string(got) == expect);
    }
    char tiny[8];
    CHECK(format_endpoints(tiny, sizeof tiny, *s) == 7);
    CHECK(std::strlen(tiny) == 7);
}

TEST_CASE("every fallback reason has a distinct name") {
    for (std::uint32_t a = 0; a < std::uint32_t(Reason::count_); ++a)
        for (std::uint32_t b = a + 1; b < std::uint32_t(Reason::count_); ++b)
            CHECK(std::string(reason_name(Reason(a))) != reason_name(Reason(b)));
    CHECK(std::string(reason_name(Reason(999))) == "?");
}
