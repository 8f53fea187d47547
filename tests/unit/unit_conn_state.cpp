// A connection's states (transport/conn_state.hpp): the moves the table
// allows and those it does not, Conn::move as a compare-exchange that a
// checked build stops on a move outside the table, Conn::move_to, and the
// states as the rest of the library reads them: every state is exactly one
// of "an upgrade may still happen", direct, leaving, or on TCP for good.
#include <catch2/catch.hpp>

#include "unit_child.hpp"

#include "transport/conn_impl.hpp"
#include "transport/lock_order.hpp"

#include <csignal>
#include <iterator>
#include <memory>
#include <sys/wait.h>
#include <unistd.h>

using namespace sd::transport;

namespace {

constexpr ConnState kAll[] = {ConnState::kernel, ConnState::initiating, ConnState::committing,
                              ConnState::direct, ConnState::leaving,    ConnState::final};

}  // namespace

TEST_CASE("an upgrade moves through the table: request, answer, commit, leave", "[conn-state]") {
    static_assert(conn_move_allowed(ConnState::kernel, ConnState::initiating));
    static_assert(conn_move_allowed(ConnState::kernel, ConnState::committing));
    static_assert(conn_move_allowed(ConnState::initiating, ConnState::direct));
    static_assert(conn_move_allowed(ConnState::committing, ConnState::direct));
    static_assert(conn_move_allowed(ConnState::direct, ConnState::leaving));
    static_assert(conn_move_allowed(ConnState::leaving, ConnState::final));
    // Crossed requests: the accepting side's wins, the connecting side's
    // yields.
    CHECK(conn_move_allowed(ConnState::initiating, ConnState::committing));
    CHECK(conn_move_allowed(ConnState::initiating, ConnState::kernel));
    // On TCP for good from any state before the upgrade is done.
    CHECK(conn_move_allowed(ConnState::kernel, ConnState::final));
    CHECK(conn_move_allowed(ConnState::initiating, ConnState::final));
    CHECK(conn_move_allowed(ConnState::committing, ConnState::final));
    // Back in kernel mode after a leave for sharing or exec, or a rejoin
    // by the last holder of a socket shared through fork.
    CHECK(conn_move_allowed(ConnState::leaving, ConnState::kernel));
    CHECK(conn_move_allowed(ConnState::final, ConnState::kernel));
}

TEST_CASE("no connection goes direct or leaving but through the handshake, nor final from direct",
          "[conn-state]") {
    for (ConnState s : kAll) {
        CHECK_FALSE(conn_move_allowed(s, s));
        if (s != ConnState::direct) CHECK_FALSE(conn_move_allowed(s, ConnState::leaving));
        if (s != ConnState::initiating && s != ConnState::committing)
            CHECK_FALSE(conn_move_allowed(s, ConnState::direct));
        // Only our own request (from kernel) is ever in flight.
        if (s != ConnState::kernel) CHECK_FALSE(conn_move_allowed(s, ConnState::initiating));
    }
    // A direct connection reaches the kernel only by leaving.
    CHECK_FALSE(conn_move_allowed(ConnState::direct, ConnState::final));
    CHECK_FALSE(conn_move_allowed(ConnState::direct, ConnState::kernel));
    CHECK_FALSE(conn_move_allowed(ConnState::direct, ConnState::committing));
    // A commit we wait for ends direct or on TCP, never back to kernel.
    CHECK_FALSE(conn_move_allowed(ConnState::committing, ConnState::kernel));
    CHECK_FALSE(conn_move_allowed(ConnState::committing, ConnState::initiating));
    // A final connection comes back to kernel mode only.
    for (ConnState s : kAll)
        if (s != ConnState::kernel) CHECK_FALSE(conn_move_allowed(ConnState::final, s));
    int moves = 0;
    for (ConnState from : kAll)
        for (ConnState to : kAll) moves += conn_move_allowed(from, to);
    CHECK(moves == int(std::size(kConnMoves)));  // no pair listed twice
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
    const int allowed = in_child([] {
        auto c = std::make_unique<Conn>();
        c->move(ConnState::kernel, ConnState::initiating);
        c->move_to(ConnState::final);
    });
    CHECK((WIFEXITED(allowed) && WEXITSTATUS(allowed) == 0));
    // Debug and sanitizer builds (SDIRECT_LOCK_CHECK) check states as they
    // check the lock order.
    if (!sd::transport::lock_order::checked()) {
        WARN("SKIPPED: this build does not check moves (release)");
        return;
    }
    const int skips_the_handshake = in_child([] {
        auto c = std::make_unique<Conn>();
        c->move(ConnState::kernel, ConnState::direct);
    });
    CHECK((WIFSIGNALED(skips_the_handshake) && WTERMSIG(skips_the_handshake) == SIGABRT));
    // Checked before the compare-exchange, whatever the state really is.
    const int wrong_from = in_child([] {
        auto c = std::make_unique<Conn>();
        c->move(ConnState::final, ConnState::direct);
    });
    CHECK((WIFSIGNALED(wrong_from) && WTERMSIG(wrong_from) == SIGABRT));
    const int direct_to_final = in_child([] {
        auto c = std::make_unique<Conn>();
        c->move_to(ConnState::committing);
        c->move_to(ConnState::direct);
        c->move_to(ConnState::final);  // a direct connection must leave first
    });
    CHECK((WIFSIGNALED(direct_to_final) && WTERMSIG(direct_to_final) == SIGABRT));
}
