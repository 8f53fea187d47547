// A connection's reset (transport/reset_state.hpp): the moves its table
// allows, each reset reported exactly once (ECONNRESET, or EPIPE after the
// peer's FIN), a reset the kernel socket told first never told again, and
// a move outside the table stopping a checked build.
#include <catch2/catch.hpp>

#include "unit_child.hpp"

#include "transport/conn_impl.hpp"
#include "transport/lock_order.hpp"

#include <cerrno>
#include <csignal>
#include <iterator>
#include <memory>
#include <sys/wait.h>

using namespace sd::transport;

namespace {

constexpr ResetState kAll[] = {ResetState::none, ResetState::unreported,
                               ResetState::unreported_after_fin, ResetState::reported};

}  // namespace

TEST_CASE("a reset comes once, is reported once, and never goes away", "[reset-state]") {
    static_assert(reset_move_allowed(ResetState::none, ResetState::unreported));
    static_assert(reset_move_allowed(ResetState::none, ResetState::unreported_after_fin));
    static_assert(reset_move_allowed(ResetState::unreported, ResetState::reported));
    static_assert(reset_move_allowed(ResetState::unreported_after_fin, ResetState::reported));
    CHECK(reset_move_allowed(ResetState::unreported, ResetState::unreported_after_fin));
    CHECK(reset_move_allowed(ResetState::none, ResetState::reported));  // the kernel told it
    for (ResetState s : kAll) {
        CHECK_FALSE(reset_move_allowed(s, s));
        CHECK_FALSE(reset_move_allowed(s, ResetState::none));     // a reset stays
        CHECK_FALSE(reset_move_allowed(ResetState::reported, s));  // reported once
    }
    // EPIPE is never turned back into ECONNRESET.
    CHECK_FALSE(reset_move_allowed(ResetState::unreported_after_fin, ResetState::unreported));
    int moves = 0;
    for (ResetState from : kAll)
        for (ResetState to : kAll) moves += reset_move_allowed(from, to);
    CHECK(moves == int(std::size(kResetMoves)));  // no pair listed twice
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
    const int allowed = in_child([] {
        auto c = std::make_unique<Conn>();
        c->reset_comes();
        c->reset_after_fin();
        (void)c->take_reset();
        c->reset_told();
    });
    CHECK((WIFEXITED(allowed) && WEXITSTATUS(allowed) == 0));
    if (!sd::transport::lock_order::checked()) {
        WARN("SKIPPED: this build does not check moves (release)");
        return;
    }
    const int back_to_none = in_child([] {
        auto c = std::make_unique<Conn>();
        c->reset_comes();
        c->move_reset(ResetState::unreported, ResetState::none);
    });
    CHECK((WIFSIGNALED(back_to_none) && WTERMSIG(back_to_none) == SIGABRT));
    const int epipe_to_econnreset = in_child([] {
        auto c = std::make_unique<Conn>();
        c->move_reset(ResetState::unreported_after_fin, ResetState::unreported);
    });
    CHECK((WIFSIGNALED(epipe_to_econnreset) && WTERMSIG(epipe_to_econnreset) == SIGABRT));
}
