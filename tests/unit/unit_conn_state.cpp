// A connection's state (transport/conn.hpp, ConnState) as the rest of the
// library reads it: every state is exactly one of "an upgrade may still
// happen", direct, leaving, or on TCP for good. The transitions
// themselves are stores and compare-and-swaps spread over handshake.cpp,
// leave.cpp and conn.cpp (there is no single transition function), and
// run only with a fabric and a peer: the behaviour suites cover them.
#include <catch2/catch.hpp>

#include "transport/conn.hpp"

#include <memory>

using namespace sd::transport;

TEST_CASE("every connection state is exactly one of upgrading, direct, leaving and final",
          "[conn-state]") {
    auto c = std::make_unique<Conn>();
    CHECK(c->state.load() == ConnState::kernel);  // a new connection
    const struct {
        ConnState st;
        bool upgrading, direct, leaving;
    } want[] = {
        {ConnState::kernel, true, false, false},
        {ConnState::initiating, true, false, false},
        {ConnState::committing, true, false, false},
        {ConnState::direct, false, true, false},
        {ConnState::leaving, false, false, true},
        {ConnState::final, false, false, false},
    };
    for (const auto &w : want) {
        INFO("state " << int(w.st));
        c->state.store(w.st);
        CHECK(c->upgrading() == w.upgrading);
        CHECK(c->is_direct() == w.direct);
        CHECK(c->is_leaving() == w.leaving);
    }
}
