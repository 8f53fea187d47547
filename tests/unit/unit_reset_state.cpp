// A connection's reset (transport/reset_state.hpp): the moves its table
// allows, each reset reported exactly once (ECONNRESET, or EPIPE after the
// peer's FIN), a reset the kernel socket told first never told again, and
// a move outside the table stopping a checked build.
#include <catch2/catch.hpp>

#include "unit_child.hpp"

#include "transport/conn_impl.hpp"
#include "unit_moves.hpp"

#include <cerrno>
#include <memory>

using namespace sd::transport;

namespace {

constexpr auto kAll = all_states<ResetState>(kResetStateNames);

}  // namespace

TEST_CASE("a reset comes once, is reported once, and never goes away", "[reset-state]") {
    check_table(kResetMoves, kResetStateNames,
                {{ResetState::none, ResetState::unreported},
                 {ResetState::none, ResetState::unreported_after_fin},
                 {ResetState::unreported, ResetState::reported},
                 {ResetState::unreported_after_fin, ResetState::reported},
                 {ResetState::unreported, ResetState::unreported_after_fin},
                 {ResetState::none, ResetState::reported}},  // the kernel told it
                // EPIPE is never turned back into ECONNRESET.
                {{ResetState::unreported_after_fin, ResetState::unreported}});
    for (ResetState s : kAll) {
        CHECK_FALSE(reset_move_allowed(s, ResetState::none));     // a reset stays
        CHECK_FALSE(reset_move_allowed(ResetState::reported, s));  // reported once
    }
}

TEST_CASE("recv or send reports a reset once: ECONNRESET, or EPIPE after the peer's FIN",
          "[reset-state]") {
    auto c = std::make_unique<Conn>();
    CHECK_FALSE(c->reset_seen());
    CHECK(c->take_reset() == 0);
    c->reset_comes();
    CHECK(c->reset_seen());
    CHECK(reset_unreported(c->reset.load()));
    c->reset_comes(true);  // a second word of it changes nothing
    CHECK(c->reset.load() == ResetState::unreported);
    CHECK(c->take_reset() == ECONNRESET);
    CHECK(c->take_reset() == 0);
    CHECK(c->reset_seen());
    c->reset_after_fin();  // reported already: stays so
    CHECK(c->reset.load() == ResetState::reported);

    auto d = std::make_unique<Conn>();
    d->reset_comes(true);  // came after the peer's FIN
    CHECK(d->take_reset() == EPIPE);
    CHECK(d->take_reset() == 0);

    // Bytes of ours reached the peer after its close: the reset they drew
    // is reported as EPIPE, whether or not one was noted before.
    auto e = std::make_unique<Conn>();
    e->reset_comes();
    e->reset_after_fin();
    CHECK(e->reset.load() == ResetState::unreported_after_fin);
    CHECK(e->take_reset() == EPIPE);
    auto f = std::make_unique<Conn>();
    f->reset_after_fin();
    CHECK(f->take_reset() == EPIPE);
}

TEST_CASE("a reset the kernel socket reported first is not reported again", "[reset-state]") {
    auto c = std::make_unique<Conn>();
    c->reset_told();  // before the fabric's word of it
    CHECK(c->reset_seen());
    c->reset_comes();  // the fabric's word finds it told
    CHECK(c->take_reset() == 0);
    auto d = std::make_unique<Conn>();
    d->reset_comes();
    d->reset_told();
    CHECK(d->take_reset() == 0);
    CHECK(d->reset.load() == ResetState::reported);
}

TEST_CASE("a reset's move outside the table aborts a checked build", "[reset-state]") {
    CHECK(exited_cleanly(in_child([] {
        auto c = std::make_unique<Conn>();
        c->reset_comes();
        c->reset_after_fin();
        (void)c->take_reset();
        c->reset_told();
    })));
    if (!moves_checked()) return;
    // A reset stays.
    CHECK(aborted(in_child([] {
        auto c = std::make_unique<Conn>();
        c->reset_comes();
        c->move_reset(ResetState::unreported, ResetState::none);
    })));
    // EPIPE is never turned back into ECONNRESET.
    CHECK(aborted(in_child([] {
        auto c = std::make_unique<Conn>();
        c->move_reset(ResetState::unreported_after_fin, ResetState::unreported);
    })));
}
