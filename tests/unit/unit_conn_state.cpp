// A connection's states (transport/conn_state.hpp): the moves the table
// allows and those it does not, Conn::move as a compare-exchange that a
// checked build stops on a move outside the table, Conn::move_to, and the
// states as the rest of the library reads them: every state is exactly one
// of "an upgrade may still happen", direct, leaving, or on TCP for good.
#include <catch2/catch.hpp>

#include "unit_child.hpp"

#include "transport/conn_impl.hpp"
#include "unit_moves.hpp"

#include <memory>

using namespace sd::transport;

namespace {

constexpr auto kAll = all_states<ConnState>(kConnStateNames);

}  // namespace

TEST_CASE("an upgrade moves through the table: request, answer, commit, leave", "[conn-state]") {
    check_table(kConnMoves, kConnStateNames,
                {{ConnState::kernel, ConnState::initiating},
                 {ConnState::kernel, ConnState::committing},
                 {ConnState::initiating, ConnState::direct},
                 {ConnState::committing, ConnState::direct},
                 {ConnState::direct, ConnState::leaving},
                 {ConnState::leaving, ConnState::final},
                 // Crossed requests: the accepting side's wins, the
                 // connecting side's yields.
                 {ConnState::initiating, ConnState::committing},
                 {ConnState::initiating, ConnState::kernel},
                 // On TCP for good from any state before the upgrade is
                 // done.
                 {ConnState::kernel, ConnState::final},
                 {ConnState::initiating, ConnState::final},
                 {ConnState::committing, ConnState::final},
                 // Back in kernel mode after a leave for sharing or exec,
                 // or a rejoin by the last holder of a socket shared
                 // through fork.
                 {ConnState::leaving, ConnState::kernel},
                 {ConnState::final, ConnState::kernel}},
                {});
}

TEST_CASE("no connection goes direct or leaving but through the handshake, nor final from direct",
          "[conn-state]") {
    for (ConnState s : kAll) {
        if (s != ConnState::direct) CHECK_FALSE(conn_move_allowed(s, ConnState::leaving));
        if (s != ConnState::initiating && s != ConnState::committing)
            CHECK_FALSE(conn_move_allowed(s, ConnState::direct));
        // Only our own request (from kernel) is ever in flight.
        if (s != ConnState::kernel) CHECK_FALSE(conn_move_allowed(s, ConnState::initiating));
    }
    // A final connection comes back to kernel mode only.
    for (ConnState s : kAll)
        if (s != ConnState::kernel) CHECK_FALSE(conn_move_allowed(ConnState::final, s));
    check_table(kConnMoves, kConnStateNames, {},
                // A direct connection reaches the kernel only by leaving.
                {{ConnState::direct, ConnState::final},
                 {ConnState::direct, ConnState::kernel},
                 {ConnState::direct, ConnState::committing},
                 // A commit we wait for ends direct or on TCP, never back
                 // to kernel.
                 {ConnState::committing, ConnState::kernel},
                 {ConnState::committing, ConnState::initiating}});
}

TEST_CASE("a connection's move happens only from the state the caller saw; move_to from any",
          "[conn-state]") {
    auto c = std::make_unique<Conn>();
    CHECK(c->state.load() == ConnState::kernel);  // a new connection
    CHECK_FALSE(c->move(ConnState::initiating, ConnState::kernel));
    CHECK(c->state.load() == ConnState::kernel);
    CHECK(c->move(ConnState::kernel, ConnState::initiating));
    CHECK(c->state.load() == ConnState::initiating);
    CHECK_FALSE(c->move(ConnState::kernel, ConnState::initiating));  // another thread was first
    c->move_to(ConnState::committing);  // the peer's request crossed ours and won
    CHECK_FALSE(c->move(ConnState::initiating, ConnState::kernel));  // ours yields: too late
    CHECK(c->state.load() == ConnState::committing);
    c->move_to(ConnState::direct);
    CHECK(c->state.load() == ConnState::direct);
    c->move_to(ConnState::direct);  // already there: written again, nothing moves
    CHECK(c->state.load() == ConnState::direct);
    CHECK(c->move(ConnState::direct, ConnState::leaving));
    CHECK_FALSE(c->move(ConnState::direct, ConnState::leaving));  // the peer's leave was first
    c->move_to(ConnState::final);
    CHECK(c->state.load() == ConnState::final);
    c->move_to(ConnState::final);
    CHECK(c->state.load() == ConnState::final);
    c->move_to(ConnState::kernel);  // rejoined by the last holder
    CHECK(c->state.load() == ConnState::kernel);
}

TEST_CASE("every connection state is exactly one of upgrading, direct, leaving and final",
          "[conn-state]") {
    auto c = std::make_unique<Conn>();
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
    // In the table's order, each a move of it: a new connection's request,
    // the peer's crossing one, the commit, a leave, its end.
    for (const auto &w : want) {
        INFO("state " << conn_state_name(w.st));
        c->move_to(w.st);
        CHECK(c->state.load() == w.st);
        CHECK(c->upgrading() == w.upgrading);
        CHECK(c->is_direct() == w.direct);
        CHECK(c->is_leaving() == w.leaving);
    }
}

TEST_CASE("a connection's move outside the table aborts a checked build", "[conn-state]") {
    CHECK(exited_cleanly(in_child([] {
        auto c = std::make_unique<Conn>();
        c->move(ConnState::kernel, ConnState::initiating);
        c->move_to(ConnState::final);
    })));
    if (!moves_checked()) return;
    // Direct without the handshake.
    CHECK(aborted(in_child([] {
        auto c = std::make_unique<Conn>();
        c->move(ConnState::kernel, ConnState::direct);
    })));
    // Checked before the compare-exchange, whatever the state really is.
    CHECK(aborted(in_child([] {
        auto c = std::make_unique<Conn>();
        c->move(ConnState::final, ConnState::direct);
    })));
    CHECK(aborted(in_child([] {
        auto c = std::make_unique<Conn>();
        c->move_to(ConnState::committing);
        c->move_to(ConnState::direct);
        c->move_to(ConnState::final);  // a direct connection must leave first
    })));
}
