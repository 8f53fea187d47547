// Wire and shared-memory layouts are contracts between processes (and
// versions of the library): sizes and offsets fixed here.
#include <catch2/catch.hpp>

#include "transport/procpage.hpp"
#include "transport/wire.hpp"

#include <cstddef>

using namespace sd::transport;

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
    STATIC_REQUIRE(kPageVersion == 8);
    STATIC_REQUIRE(offsetof(ProcHeader, reg_hits) == 72);
    STATIC_REQUIRE(offsetof(ConnStat, sink_word) == 200);
}
