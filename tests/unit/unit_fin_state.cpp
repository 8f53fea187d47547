// The ends of a connection's streams (transport/fin_state.hpp): our end
// goes open, FIN, CLOSE and never back; the peer's FIN comes once and our
// first send after it kicks the peer once; a move outside either table
// stops a checked build.
#include <catch2/catch.hpp>

#include "unit_child.hpp"

#include "transport/conn_impl.hpp"
#include "unit_moves.hpp"

#include <memory>

using namespace sd::transport;

namespace {

constexpr auto kOut = all_states<FinOut>(kFinOutNames);
constexpr auto kIn = all_states<FinIn>(kFinInNames);

}  // namespace

TEST_CASE("our end goes from open to FIN to CLOSE, or straight to CLOSE, never back",
          "[fin-state]") {
    check_table(kFinOutMoves, kFinOutNames,
                {{FinOut::open, FinOut::fin},
                 {FinOut::open, FinOut::closed},
                 {FinOut::fin, FinOut::closed}},
                {});
    for (FinOut s : kOut) {
        CHECK_FALSE(fin_out_move_allowed(s, FinOut::open));
        CHECK_FALSE(fin_out_move_allowed(FinOut::closed, s));
    }
}

TEST_CASE("the peer's FIN comes once, and only our first send after it kicks the peer",
          "[fin-state]") {
    check_table(kFinInMoves, kFinInNames,
                {{FinIn::open, FinIn::came}, {FinIn::came, FinIn::kicked}},
                // No kick before the FIN.
                {{FinIn::open, FinIn::kicked}});
    for (FinIn s : kIn) CHECK_FALSE(fin_in_move_allowed(s, FinIn::open));

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
    CHECK(exited_cleanly(in_child([] {
        auto c = std::make_unique<Conn>();
        c->move_fin_out(FinOut::open, FinOut::fin);
        c->close_out();
        c->move_fin_in(FinIn::open, FinIn::came);
        c->move_fin_in(FinIn::came, FinIn::kicked);
    })));
    if (!moves_checked()) return;
    // Our end never reopens.
    CHECK(aborted(in_child([] {
        auto c = std::make_unique<Conn>();
        c->move_fin_out(FinOut::fin, FinOut::open);
    })));
    // No kick before the FIN.
    CHECK(aborted(in_child([] {
        auto c = std::make_unique<Conn>();
        c->move_fin_in(FinIn::open, FinIn::kicked);
    })));
}
