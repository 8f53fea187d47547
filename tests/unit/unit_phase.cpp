// A socket's phases (shm_fallback/phase.hpp): the moves the table allows
// and those it does not, and Stream::move as a compare-exchange that a
// checked build stops on a move outside the table.
#include <catch2/catch.hpp>

#include "unit_child.hpp"

#include "shm_fallback/stream.hpp"
#include "transport/lock_order.hpp"

#include <csignal>
#include <iterator>
#include <sys/wait.h>
#include <unistd.h>

using namespace sd::fallback;

namespace {

constexpr Phase kAll[] = {Phase::fresh,     Phase::connecting, Phase::deferred,
                          Phase::attaching, Phase::attached,   Phase::listener};


}  // namespace

TEST_CASE("a socket's life moves forward through the table: connect, accept, first use, attach",
          "[phase]") {
    static_assert(phase_move_allowed(Phase::fresh, Phase::connecting));
    static_assert(phase_move_allowed(Phase::fresh, Phase::deferred));
    static_assert(phase_move_allowed(Phase::fresh, Phase::attaching));
    static_assert(phase_move_allowed(Phase::connecting, Phase::attaching));
    static_assert(phase_move_allowed(Phase::deferred, Phase::attaching));
    static_assert(phase_move_allowed(Phase::attaching, Phase::attached));
    // Never attached: TCP for good, an exec's hand-over, a take-over.
    CHECK(phase_move_allowed(Phase::connecting, Phase::attached));
    CHECK(phase_move_allowed(Phase::deferred, Phase::attached));
    // A fork child, or the last holder of a shared socket: attached at
    // its next call.
    CHECK(phase_move_allowed(Phase::connecting, Phase::deferred));
    CHECK(phase_move_allowed(Phase::attaching, Phase::deferred));
    CHECK(phase_move_allowed(Phase::attached, Phase::deferred));
}

TEST_CASE("no move back to fresh or connecting, none out of or into listener, none to itself",
          "[phase]") {
    for (Phase p : kAll) {
        CHECK_FALSE(phase_move_allowed(p, p));
        CHECK_FALSE(phase_move_allowed(p, Phase::fresh));
        CHECK_FALSE(phase_move_allowed(p, Phase::listener));
        CHECK_FALSE(phase_move_allowed(Phase::listener, p));
        if (p != Phase::fresh) CHECK_FALSE(phase_move_allowed(p, Phase::connecting));
    }
    // An attached socket is never attached again in the same process.
    CHECK_FALSE(phase_move_allowed(Phase::attached, Phase::attaching));
    CHECK_FALSE(phase_move_allowed(Phase::fresh, Phase::attached));
    // Only a new socket and listen() set a phase whatever it was.
    CHECK(phase_reset_allowed(Phase::fresh));
    CHECK(phase_reset_allowed(Phase::listener));
    for (Phase p : {Phase::connecting, Phase::deferred, Phase::attaching, Phase::attached})
        CHECK_FALSE(phase_reset_allowed(p));
    int moves = 0;
    for (Phase from : kAll)
        for (Phase to : kAll) moves += phase_move_allowed(from, to);
    CHECK(moves == int(std::size(kPhaseMoves)));  // no pair listed twice
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
    const int allowed = in_child([] {
        Stream s;
        s.move(Phase::fresh, Phase::connecting);
    });
    CHECK((WIFEXITED(allowed) && WEXITSTATUS(allowed) == 0));
    // Debug and sanitizer builds (SDIRECT_LOCK_CHECK) check phases as they
    // check the lock order.
    if (!sd::transport::lock_order::checked()) {
        WARN("SKIPPED: this build does not check moves (release)");
        return;
    }
    const int backwards = in_child([] {
        Stream s;
        s.move(Phase::fresh, Phase::attaching);
        s.move(Phase::attaching, Phase::fresh);
    });
    CHECK((WIFSIGNALED(backwards) && WTERMSIG(backwards) == SIGABRT));
    const int out_of_listener = in_child([] {
        Stream s;
        s.reset_to(Phase::listener);
        s.move_to(Phase::deferred);
    });
    CHECK((WIFSIGNALED(out_of_listener) && WTERMSIG(out_of_listener) == SIGABRT));
    const int reset_to_attached = in_child([] {
        Stream s;
        s.reset_to(Phase::attached);
    });
    CHECK((WIFSIGNALED(reset_to_attached) && WTERMSIG(reset_to_attached) == SIGABRT));
}
