// The ends of a connection's streams (transport/fin_state.hpp): our end
// goes open, FIN, CLOSE and never back; the peer's FIN comes once and our
// first send after it kicks the peer once; a move outside either table
// stops a checked build.
#include <catch2/catch.hpp>

#include "unit_child.hpp"

#include "transport/conn_impl.hpp"
#include "transport/lock_order.hpp"

#include <csignal>
#include <iterator>
#include <memory>
#include <sys/wait.h>

using namespace sd::transport;

namespace {

constexpr FinOut kOut[] = {FinOut::open, FinOut::fin, FinOut::closed};
constexpr FinIn kIn[] = {FinIn::open, FinIn::came, FinIn::kicked};

}  // namespace

TEST_CASE("our end goes from open to FIN to CLOSE, or straight to CLOSE, never back",
          "[fin-state]") {
    static_assert(fin_out_move_allowed(FinOut::open, FinOut::fin));
    static_assert(fin_out_move_allowed(FinOut::open, FinOut::closed));
    static_assert(fin_out_move_allowed(FinOut::fin, FinOut::closed));
    for (FinOut s : kOut) {
        CHECK_FALSE(fin_out_move_allowed(s, s));
        CHECK_FALSE(fin_out_move_allowed(s, FinOut::open));
        CHECK_FALSE(fin_out_move_allowed(FinOut::closed, s));
    }
    int moves = 0;
    for (FinOut from : kOut)
        for (FinOut to : kOut) moves += fin_out_move_allowed(from, to);
    CHECK(moves == int(std::size(kFinOutMoves)));
}

TEST_CASE("the peer's FIN comes once, and only our first send after it kicks the peer",
          "[fin-state]") {
    static_assert(fin_in_move_allowed(FinIn::open, FinIn::came));
    static_assert(fin_in_move_allowed(FinIn::came, FinIn::kicked));
    // No kick before the FIN.
    CHECK_FALSE(fin_in_move_allowed(FinIn::open, FinIn::kicked));
    for (FinIn s : kIn) {
        CHECK_FALSE(fin_in_move_allowed(s, s));
        CHECK_FALSE(fin_in_move_allowed(s, FinIn::open));
    }
    int moves = 0;
    for (FinIn from : kIn)
        for (FinIn to : kIn) moves += fin_in_move_allowed(from, to);
    CHECK(moves == int(std::size(kFinInMoves)));

    auto c = std::make_unique<Conn>();
    CHECK_FALSE(c->peer_fin());
    CHECK_FALSE(c->move_fin_in(FinIn::came, FinIn::kicked));  // no FIN yet: no kick
    CHECK(c->move_fin_in(FinIn::open, FinIn::came));
    CHECK(c->peer_fin());
    CHECK_FALSE(c->move_fin_in(FinIn::open, FinIn::came));  // a CLOSE after the FIN
    CHECK(c->move_fin_in(FinIn::came, FinIn::kicked));
    CHECK_FALSE(c->move_fin_in(FinIn::came, FinIn::kicked));  // once
    CHECK(c->peer_fin());
}

TEST_CASE("close sends our CLOSE once, after a shutdown's FIN or without one", "[fin-state]") {
    auto c = std::make_unique<Conn>();
    CHECK_FALSE(c->fin_sent());
    CHECK(c->move_fin_out(FinOut::open, FinOut::fin));  // shutdown(SHUT_WR)
    CHECK(c->fin_sent());
    CHECK_FALSE(c->move_fin_out(FinOut::open, FinOut::fin));  // a second shutdown
    CHECK(c->close_out());
    CHECK_FALSE(c->close_out());  // the reset answer finds it sent
    CHECK(c->fin_out.load() == FinOut::closed);
    auto d = std::make_unique<Conn>();
    CHECK(d->close_out());  // no shutdown before it
    CHECK(d->fin_sent());
    CHECK_FALSE(d->move_fin_out(FinOut::open, FinOut::fin));
}

TEST_CASE("a move of a stream's end outside its table aborts a checked build", "[fin-state]") {
    const int allowed = in_child([] {
        auto c = std::make_unique<Conn>();
        c->move_fin_out(FinOut::open, FinOut::fin);
        c->close_out();
        c->move_fin_in(FinIn::open, FinIn::came);
        c->move_fin_in(FinIn::came, FinIn::kicked);
    });
    CHECK((WIFEXITED(allowed) && WEXITSTATUS(allowed) == 0));
    if (!sd::transport::lock_order::checked()) {
        WARN("SKIPPED: this build does not check moves (release)");
        return;
    }
    const int reopened = in_child([] {
        auto c = std::make_unique<Conn>();
        c->move_fin_out(FinOut::fin, FinOut::open);
    });
    CHECK((WIFSIGNALED(reopened) && WTERMSIG(reopened) == SIGABRT));
    const int kicked_early = in_child([] {
        auto c = std::make_unique<Conn>();
        c->move_fin_in(FinIn::open, FinIn::kicked);
    });
    CHECK((WIFSIGNALED(kicked_early) && WTERMSIG(kicked_early) == SIGABRT));
}
