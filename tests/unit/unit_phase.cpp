// A socket's phases (shm_fallback/phase.hpp): the moves the table allows
// and those it does not, and Stream::move as a compare-exchange that a
// checked build stops on a move outside the table.
#include <catch2/catch.hpp>

#include "unit_child.hpp"

#include "shm_fallback/stream.hpp"
#include "unit_moves.hpp"


using namespace sd::fallback;

namespace {

constexpr auto kAll = all_states<Phase>(kPhaseNames);

}  // namespace

TEST_CASE("a socket's life moves forward through the table: connect, accept, first use, attach",
          "[phase]") {
    check_table(kPhaseMoves, kPhaseNames,
                {{Phase::fresh, Phase::connecting},
                 {Phase::fresh, Phase::deferred},
                 {Phase::fresh, Phase::attaching},
                 {Phase::connecting, Phase::attaching},
                 {Phase::deferred, Phase::attaching},
                 {Phase::attaching, Phase::attached},
                 // Never attached: TCP for good, an exec's hand-over, a
                 // take-over.
                 {Phase::connecting, Phase::attached},
                 {Phase::deferred, Phase::attached},
                 // A fork child, or the last holder of a shared socket:
                 // attached at its next call.
                 {Phase::connecting, Phase::deferred},
                 {Phase::attaching, Phase::deferred},
                 {Phase::attached, Phase::deferred}},
                {});
}

TEST_CASE("no move back to fresh or connecting, none out of or into listener, none to itself",
          "[phase]") {
    for (Phase p : kAll) {
        CHECK_FALSE(phase_move_allowed(p, Phase::fresh));
        CHECK_FALSE(phase_move_allowed(p, Phase::listener));
        CHECK_FALSE(phase_move_allowed(Phase::listener, p));
        if (p != Phase::fresh) CHECK_FALSE(phase_move_allowed(p, Phase::connecting));
    }
    check_table(kPhaseMoves, kPhaseNames, {},
                // An attached socket is never attached again in the same
                // process.
                {{Phase::attached, Phase::attaching}, {Phase::fresh, Phase::attached}});
    // Only a new socket and listen() set a phase whatever it was.
    CHECK(phase_reset_allowed(Phase::fresh));
    CHECK(phase_reset_allowed(Phase::listener));
    for (Phase p : {Phase::connecting, Phase::deferred, Phase::attaching, Phase::attached})
        CHECK_FALSE(phase_reset_allowed(p));
}

TEST_CASE("a move happens only from the phase the caller saw; move_to from any", "[phase]") {
    Stream s;
    s.reset_to(Phase::fresh);
    CHECK_FALSE(s.move(Phase::connecting, Phase::attaching));
    CHECK(s.phase.load() == Phase::fresh);
    CHECK(s.move(Phase::fresh, Phase::deferred));
    CHECK(s.phase.load() == Phase::deferred);
    CHECK_FALSE(s.move(Phase::fresh, Phase::deferred));  // another thread was first
    CHECK(s.move(Phase::deferred, Phase::attaching));
    s.move_to(Phase::attached);
    CHECK(s.phase.load() == Phase::attached);
    s.move_to(Phase::attached);  // already there: nothing to move
    CHECK(s.phase.load() == Phase::attached);
    s.move_to(Phase::deferred);
    CHECK(s.phase.load() == Phase::deferred);
    s.reset_to(Phase::listener);
    CHECK(s.phase.load() == Phase::listener);
}

TEST_CASE("a move outside the table aborts a checked build", "[phase]") {
    CHECK(exited_cleanly(in_child([] {
        Stream s;
        s.move(Phase::fresh, Phase::connecting);
    })));
    if (!moves_checked()) return;
    // Backwards.
    CHECK(aborted(in_child([] {
        Stream s;
        s.move(Phase::fresh, Phase::attaching);
        s.move(Phase::attaching, Phase::fresh);
    })));
    // Out of listener.
    CHECK(aborted(in_child([] {
        Stream s;
        s.reset_to(Phase::listener);
        s.move_to(Phase::deferred);
    })));
    // Set whatever the phase was: only fresh and listener.
    CHECK(aborted(in_child([] {
        Stream s;
        s.reset_to(Phase::attached);
    })));
}
