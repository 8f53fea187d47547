// The protocol choice (protocol.hpp): for each selection (thresholds, a
// forced protocol, the measured table), which protocol the next bytes of
// a send go by, as a pure function of the policy, and as the send path
// sees it after load_protocols().
#include <catch2/catch.hpp>

#include "unit_env.hpp"

#include "transport/protocol.hpp"
#include "transport/settings.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

using namespace sd::transport;

namespace {

ProtocolPolicy thresholds() {
    ProtocolPolicy p;
    p.how = Selection::thresholds;
    p.chunk = 4032;
    p.rma_min = 16384;
    p.zcopy_min = 131072;
    return p;
}

constexpr std::int64_t kPlenty = std::int64_t(1) << 40;

}  // namespace

TEST_CASE("protocol names read back, and nothing else is a protocol", "[protocol]") {
    for (Protocol p : {Protocol::buffered, Protocol::ring, Protocol::zcopy}) {
        Protocol back = Protocol::buffered;
        REQUIRE(parse_protocol(protocol_name(p), &back));
        CHECK(back == p);
    }
    CHECK(std::string(protocol_name(Protocol::buffered)) == "buffered");
    CHECK(std::string(protocol_name(Protocol::ring)) == "ring");
    CHECK(std::string(protocol_name(Protocol::zcopy)) == "zcopy");
    Protocol out = Protocol::ring;
    CHECK_FALSE(parse_protocol("auto", &out));
    CHECK_FALSE(parse_protocol("Ring", &out));
    CHECK_FALSE(parse_protocol("", &out));
    CHECK(out == Protocol::ring);  // untouched
}

TEST_CASE("thresholds: zcopy from SDIRECT_ZCOPY_MIN for a send that may wait, ring from "
          "SDIRECT_RMA_MIN of what the window takes, buffered below",
          "[protocol]") {
    const ProtocolPolicy p = thresholds();
    CHECK(choose_protocol(p, 131072, kPlenty, true) == Protocol::zcopy);
    CHECK(choose_protocol(p, 131071, kPlenty, true) == Protocol::ring);
    // A send that may not wait for its reader never goes zero-copy.
    CHECK(choose_protocol(p, 1 << 20, kPlenty, false) == Protocol::ring);
    // zcopy needs no credit; the ring does.
    CHECK(choose_protocol(p, 1 << 20, 0, true) == Protocol::zcopy);
    CHECK(choose_protocol(p, 1 << 20, 0, false) == Protocol::buffered);
    CHECK(choose_protocol(p, 1 << 20, -5, false) == Protocol::buffered);
    CHECK(choose_protocol(p, 16384, kPlenty, false) == Protocol::ring);
    CHECK(choose_protocol(p, 16383, kPlenty, false) == Protocol::buffered);
    // The credit cuts the piece: 16383 bytes now are below the threshold.
    CHECK(choose_protocol(p, 1 << 20, 16383, false) == Protocol::buffered);
    CHECK(choose_protocol(p, 1 << 20, 16384, false) == Protocol::ring);
    // The thresholds are the settings': other values, other boundaries.
    ProtocolPolicy low = p;
    low.rma_min = 5000;
    CHECK(choose_protocol(low, 6000, 5000, false) == Protocol::ring);
    CHECK(choose_protocol(low, 6000, 4999, false) == Protocol::buffered);
    CHECK(choose_protocol(low, 4999, kPlenty, false) == Protocol::buffered);
    // SDIRECT_ZCOPY_MIN=0: never zero-copy.
    ProtocolPolicy off = p;
    off.zcopy_min = 0;
    CHECK(choose_protocol(off, 1 << 30, kPlenty, true) == Protocol::ring);
}

TEST_CASE("nothing that fits one inline message goes but buffered, whatever the selection",
          "[protocol]") {
    ProtocolPolicy p = thresholds();
    p.rma_min = 1;
    p.zcopy_min = 1;
    CHECK(choose_protocol(p, 4032, kPlenty, true) == Protocol::buffered);
    CHECK(choose_protocol(p, 4033, kPlenty, true) == Protocol::zcopy);
    CHECK(choose_protocol(p, 4033, kPlenty, false) == Protocol::ring);
    CHECK(choose_protocol(p, 1 << 20, 4032, false) == Protocol::buffered);
    p.how = Selection::forced;
    for (Protocol f : {Protocol::ring, Protocol::zcopy}) {
        p.forced = f;
        CHECK(choose_protocol(p, 4032, kPlenty, true) == Protocol::buffered);
        CHECK(choose_protocol(p, 1 << 20, 4032, false) == Protocol::buffered);
    }
}

TEST_CASE("a forced protocol goes wherever it can be used; forced zcopy falls to the ring "
          "where the send may not wait",
          "[protocol]") {
    ProtocolPolicy p = thresholds();
    p.how = Selection::forced;
    p.forced = Protocol::buffered;
    CHECK(choose_protocol(p, 1 << 20, kPlenty, true) == Protocol::buffered);
    p.forced = Protocol::ring;
    CHECK(choose_protocol(p, 1 << 20, kPlenty, true) == Protocol::ring);
    CHECK(choose_protocol(p, 5000, 5000, false) == Protocol::ring);  // below SDIRECT_RMA_MIN
    p.forced = Protocol::zcopy;
    CHECK(choose_protocol(p, 5000, kPlenty, true) == Protocol::zcopy);  // below SDIRECT_ZCOPY_MIN
    CHECK(choose_protocol(p, 5000, kPlenty, false) == Protocol::ring);
    CHECK(choose_protocol(p, 5000, 0, false) == Protocol::buffered);
}

TEST_CASE("a stream's sends of up to a quarter of the peer's ring go through it, with the "
          "thresholds and SDIRECT_STREAM_RING only",
          "[protocol]") {
    constexpr std::size_t kRing = 2 << 20;
    ProtocolPolicy p = thresholds();
    p.stream_ring = true;
    CHECK(stream_takes_ring(p, 65536, kRing));
    CHECK(stream_takes_ring(p, kRing / 4, kRing));
    CHECK_FALSE(stream_takes_ring(p, kRing / 4 + 1, kRing));
    CHECK_FALSE(stream_takes_ring(p, 65536, 0));  // no ring
    p.stream_ring = false;
    CHECK_FALSE(stream_takes_ring(p, 65536, kRing));
    // A forced protocol or the measured table decides alone.
    p.stream_ring = true;
    p.how = Selection::forced;
    p.forced = Protocol::zcopy;
    CHECK_FALSE(stream_takes_ring(p, 65536, kRing));
    p.how = Selection::table;
    CHECK_FALSE(stream_takes_ring(p, 65536, kRing));
}

TEST_CASE("auto: the measured table decides per size class; the ring's class is that of "
          "what the window takes",
          "[protocol]") {
    TuneTable t;
    std::string error;
    REQUIRE(parse_tune("4096 best=buffered\n65536 best=ring\n1048576 best=zcopy\n", &t,
                       &error) == 3);
    ProtocolPolicy p = thresholds();
    p.how = Selection::table;
    p.table = &t;
    CHECK(choose_protocol(p, 2 << 20, kPlenty, true) == Protocol::zcopy);
    CHECK(choose_protocol(p, 1048576, kPlenty, true) == Protocol::zcopy);
    CHECK(choose_protocol(p, 1048575, kPlenty, true) == Protocol::ring);
    CHECK(choose_protocol(p, 65536, kPlenty, true) == Protocol::ring);
    CHECK(choose_protocol(p, 65535, kPlenty, true) == Protocol::buffered);
    // The zcopy class of a send that may not wait: written into the ring.
    CHECK(choose_protocol(p, 2 << 20, kPlenty, false) == Protocol::ring);
    CHECK(choose_protocol(p, 2 << 20, 100000, false) == Protocol::ring);
    CHECK(choose_protocol(p, 2 << 20, 20000, false) == Protocol::buffered);
    // Thresholds play no part: 20000 bytes would be ring by them.
    CHECK(choose_protocol(p, 20000, kPlenty, true) == Protocol::buffered);
}

TEST_CASE("the send path's choice follows SDIRECT_PROTOCOLS and the tune file",
          "[protocol]") {
    const std::size_t big = 1 << 20;
    {
        load_settings();
        load_protocols();
        CHECK(selection() == Selection::thresholds);
        const std::size_t zmin = settings().zcopy_min, rmin = settings().rma_min;
        REQUIRE(zmin > rmin);
        CHECK(use_zcopy(zmin));
        CHECK_FALSE(use_zcopy(zmin - 1));
        CHECK(use_ring(rmin, kPlenty));
        CHECK_FALSE(use_ring(rmin - 1, kPlenty));
        CHECK_FALSE(use_ring(big, std::int64_t(rmin) - 1));
    }
    {
        EnvGuard e("SDIRECT_PROTOCOLS", "ring");
        load_settings();
        load_protocols();
        CHECK(selection() == Selection::forced);
        CHECK_FALSE(use_zcopy(big));
        CHECK(use_ring(settings().chunk + 1, kPlenty));
        CHECK_FALSE(use_ring(settings().chunk, kPlenty));
    }
    {
        EnvGuard e("SDIRECT_PROTOCOLS", "sometimes");  // not a selection: the thresholds
        load_settings();
        load_protocols();
        CHECK(selection() == Selection::thresholds);
    }
    char path[] = "/tmp/sdirect-unit-tune-XXXXXX";
    const int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    const double mbps[3] = {900, 1200, 3000};
    const std::string text = std::string(kTuneColumns) + "\n" +
                             format_tune_line(8192, Protocol::ring, mbps) + "\n" +
                             format_tune_line(262144, Protocol::zcopy, mbps) + "\n";
    REQUIRE(write(fd, text.data(), text.size()) == ssize_t(text.size()));
    close(fd);
    {
        EnvGuard e("SDIRECT_PROTOCOLS", "auto");
        EnvGuard f("SDIRECT_TUNE_FILE", path);
        load_settings();
        load_protocols();
        CHECK(selection() == Selection::table);
        CHECK(use_zcopy(262144));
        CHECK_FALSE(use_zcopy(262143));
        CHECK(use_ring(8192, kPlenty));
        CHECK_FALSE(use_ring(8191, kPlenty));
    }
    unlink(path);
    {
        // The file is gone: the thresholds.
        EnvGuard e("SDIRECT_PROTOCOLS", "auto");
        EnvGuard f("SDIRECT_TUNE_FILE", path);
        load_settings();
        load_protocols();
        CHECK(selection() == Selection::thresholds);
    }
    load_settings();
    load_protocols();
}
