// Write zero-copy into the receiver's registered sink (sink.hpp): the
// advertisement's layout, when a sink may be written, its memory budget
// and the completion a write needs.
#include <catch2/catch.hpp>

#include "transport/conn_impl.hpp"
#include "transport/sink.hpp"
#include "transport/wire.hpp"

#include <cstddef>
#include <cstdint>

using namespace sd::transport;

TEST_CASE("a sink advertisement is the documented 24-byte contract", "[sink]") {
    STATIC_REQUIRE(sizeof(SinkAvailBody) == 24);
    STATIC_REQUIRE(offsetof(SinkAvailBody, seq) == 8);
    STATIC_REQUIRE(offsetof(SinkAvailBody, key) == 16);
    // The messages that end a registered sink of the receiver unasked.
    STATIC_REQUIRE(is_stream_msg(MsgType::data) && is_stream_msg(MsgType::written) &&
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
