// A leave of the fabric (transport/leave_state.hpp): ours owed when the
// peer's leave comes, sent first or as the answer, the peer's leave after
// ours, kernel mode again; the bytes the peer returns awaited, complete,
// written or given up; a rearm wanted, due, done; and a move outside any
// of the tables stopping a checked build; the handoff a leave calls.
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

constexpr OurLeave kAll[] = {OurLeave::none, OurLeave::owed, OurLeave::answered, OurLeave::first,
                             OurLeave::first_answered};

}  // namespace

TEST_CASE("our leave is owed, sent first or as the answer, and forgotten in kernel mode",
          "[leave-state]") {
    static_assert(leave_move_allowed(OurLeave::none, OurLeave::owed));
    static_assert(leave_move_allowed(OurLeave::owed, OurLeave::answered));
    static_assert(leave_move_allowed(OurLeave::none, OurLeave::first));
    static_assert(leave_move_allowed(OurLeave::first, OurLeave::first_answered));
    // Crossing: we leave with the peer's leave here and not answered.
    CHECK(leave_move_allowed(OurLeave::owed, OurLeave::first));
    for (OurLeave s : kAll) {
        CHECK_FALSE(leave_move_allowed(s, s));
        // Once sent, ours is never owed again, nor sent the other way.
        if (leave_sent(s)) {
            CHECK_FALSE(leave_move_allowed(s, OurLeave::owed));
            CHECK_FALSE(leave_move_allowed(s, OurLeave::answered));
            CHECK_FALSE(leave_move_allowed(s, OurLeave::first));
        }
        if (s != OurLeave::none) CHECK(leave_move_allowed(s, OurLeave::none));
    }
    // An answer answers a leave that came.
    CHECK_FALSE(leave_move_allowed(OurLeave::none, OurLeave::answered));
    CHECK_FALSE(leave_move_allowed(OurLeave::none, OurLeave::first_answered));
    CHECK_FALSE(leave_move_allowed(OurLeave::answered, OurLeave::first_answered));
    int moves = 0;
    for (OurLeave from : kAll)
        for (OurLeave to : kAll) moves += leave_move_allowed(from, to);
    CHECK(moves == int(std::size(kLeaveMoves)));
}

TEST_CASE("sent, first and due as the leave's code reads them", "[leave-state]") {
    const struct {
        OurLeave s;
        bool sent, due;
    } want[] = {
        {OurLeave::none, false, false},     {OurLeave::owed, false, true},
        {OurLeave::answered, true, false},  {OurLeave::first, true, false},
        {OurLeave::first_answered, true, true},
    };
    for (const auto &w : want) {
        INFO("leave " << our_leave_name(w.s));
        CHECK(leave_sent(w.s) == w.sent);
        CHECK(leave_due(w.s) == w.due);
    }
}

TEST_CASE("the peer's leave before ours, after ours, and crossing it", "[leave-state]") {
    auto c = std::make_unique<Conn>();
    CHECK_FALSE(c->leave_under_way());
    c->peer_left();  // it left first: ours is owed
    CHECK(c->leave_due());
    CHECK_FALSE(c->leave_sent());
    CHECK(c->leave_under_way());
    c->leave_goes(false);  // our answer
    CHECK(c->our_leave.load() == OurLeave::answered);
    CHECK(c->leave_sent());
    CHECK_FALSE(c->leave_first());
    CHECK_FALSE(c->leave_due());
    c->leave_forget();  // rearmed
    CHECK(c->our_leave.load() == OurLeave::none);
    c->leave_forget();  // already none: nothing moves
    CHECK_FALSE(c->leave_under_way());

    c->leave_goes(true);  // we leave first
    CHECK(c->leave_first());
    CHECK_FALSE(c->leave_due());
    c->peer_left();  // its answer
    CHECK(c->our_leave.load() == OurLeave::first_answered);
    CHECK(c->leave_first());
    CHECK(c->leave_due());  // the flush pass looks at the connection again
    c->peer_left();  // nothing more
    CHECK(c->our_leave.load() == OurLeave::first_answered);

    auto d = std::make_unique<Conn>();
    d->peer_left();
    d->leave_goes(true);  // crossing: ours counts as first
    CHECK(d->our_leave.load() == OurLeave::first);
}

TEST_CASE("returned bytes are awaited, complete, then written or given up", "[leave-state]") {
    static_assert(give_back_move_allowed(GiveBack::none, GiveBack::awaited));
    static_assert(give_back_move_allowed(GiveBack::awaited, GiveBack::complete));
    CHECK(give_back_move_allowed(GiveBack::complete, GiveBack::none));
    CHECK(give_back_move_allowed(GiveBack::awaited, GiveBack::none));  // the peer died
    // Complete only once awaited; never awaited again once here.
    CHECK_FALSE(give_back_move_allowed(GiveBack::none, GiveBack::complete));
    CHECK_FALSE(give_back_move_allowed(GiveBack::complete, GiveBack::awaited));
    constexpr GiveBack all[] = {GiveBack::none, GiveBack::awaited, GiveBack::complete};
    int moves = 0;
    for (GiveBack from : all)
        for (GiveBack to : all) moves += give_back_move_allowed(from, to);
    CHECK(moves == int(std::size(kGiveBackMoves)));

    auto c = std::make_unique<Conn>();
    CHECK(c->move_give_back(GiveBack::none, GiveBack::awaited));
    CHECK_FALSE(c->back_complete());
    CHECK(c->move_give_back(GiveBack::awaited, GiveBack::complete));
    CHECK(c->back_complete());
    CHECK_FALSE(c->move_give_back(GiveBack::awaited, GiveBack::complete));  // once
    c->give_back_forget();  // written
    CHECK(c->give_back.load() == GiveBack::none);
    c->give_back_forget();  // nothing to forget
    CHECK(c->give_back.load() == GiveBack::none);
}

TEST_CASE("a rearm is wanted at the peer's leave, due once its fabric part is over, then done",
          "[leave-state]") {
    static_assert(rearm_move_allowed(Rearm::none, Rearm::wanted));
    static_assert(rearm_move_allowed(Rearm::wanted, Rearm::due));
    static_assert(rearm_move_allowed(Rearm::due, Rearm::none));
    CHECK(rearm_move_allowed(Rearm::wanted, Rearm::none));
    CHECK_FALSE(rearm_move_allowed(Rearm::none, Rearm::due));  // due only once wanted
    CHECK_FALSE(rearm_move_allowed(Rearm::due, Rearm::wanted));
    constexpr Rearm all[] = {Rearm::none, Rearm::wanted, Rearm::due};
    int moves = 0;
    for (Rearm from : all)
        for (Rearm to : all) moves += rearm_move_allowed(from, to);
    CHECK(moves == int(std::size(kRearmMoves)));

    auto c = std::make_unique<Conn>();
    CHECK(c->move_rearm(Rearm::none, Rearm::wanted));
    CHECK_FALSE(c->rearm_due());
    CHECK(c->move_rearm(Rearm::wanted, Rearm::due));
    CHECK(c->rearm_due());
    c->rearm_forget();
    CHECK(c->rearm.load() == Rearm::none);
    c->rearm_forget();
    CHECK(c->rearm.load() == Rearm::none);
}

TEST_CASE("a leave's move outside the table aborts a checked build", "[leave-state]") {
    const int allowed = in_child([] {
        auto c = std::make_unique<Conn>();
        c->peer_left();
        c->leave_goes(false);
        c->leave_forget();
    });
    CHECK((WIFEXITED(allowed) && WEXITSTATUS(allowed) == 0));
    if (!sd::transport::lock_order::checked()) {
        WARN("SKIPPED: this build does not check moves (release)");
        return;
    }
    const int answer_unasked = in_child([] {
        auto c = std::make_unique<Conn>();
        c->leave_goes(false);  // nothing to answer
    });
    CHECK((WIFSIGNALED(answer_unasked) && WTERMSIG(answer_unasked) == SIGABRT));
    const int owed_again = in_child([] {
        auto c = std::make_unique<Conn>();
        c->move_leave(OurLeave::answered, OurLeave::owed);
    });
    CHECK((WIFSIGNALED(owed_again) && WTERMSIG(owed_again) == SIGABRT));
    const int complete_unawaited = in_child([] {
        auto c = std::make_unique<Conn>();
        c->move_give_back(GiveBack::none, GiveBack::complete);
    });
    CHECK((WIFSIGNALED(complete_unawaited) && WTERMSIG(complete_unawaited) == SIGABRT));
    const int due_unwanted = in_child([] {
        auto c = std::make_unique<Conn>();
        c->move_rearm(Rearm::none, Rearm::due);
    });
    CHECK((WIFSIGNALED(due_unwanted) && WTERMSIG(due_unwanted) == SIGABRT));
}

namespace {

struct Taker {
    std::uint64_t sent = 0, received = 0;
    bool took = false, reads = true;
};

const HandoffOps kTestHandoff = {
    .why = Reason::shared,
    .take = [](void *ctx, std::uint64_t sent, std::uint64_t received) noexcept {
        auto *t = static_cast<Taker *>(ctx);
        t->sent += sent;
        t->received += received;
        t->took = true;
    },
    .taken = [](void *ctx) noexcept { return static_cast<Taker *>(ctx)->took; },
    .reads_room = [](void *ctx) noexcept { return static_cast<Taker *>(ctx)->reads; },
};

}  // namespace

TEST_CASE("a connection's handoff: none until set, its calls reach the context, none once "
          "its context is cleared",
          "[leave-state]") {
    auto c = std::make_unique<Conn>();
    CHECK_FALSE(has_handoff(c.get()));
    CHECK_FALSE(bool(c->handoff()));
    Taker t;
    set_handoff(c.get(), &kTestHandoff, &t);
    CHECK(has_handoff(c.get()));
    const Conn::HandoffRef h = c->handoff();
    REQUIRE(bool(h));
    CHECK(h.ops->why == Reason::shared);
    CHECK_FALSE(h.taken());
    CHECK(h.reads_room());
    h.take(5, 7);
    CHECK(h.taken());
    CHECK(t.sent == 5);
    CHECK(t.received == 7);
    // A take-back forgets it (take_back_locked clears the context).
    c->handoff_ctx.store(nullptr);
    CHECK_FALSE(has_handoff(c.get()));
    CHECK_FALSE(bool(c->handoff()));
}
