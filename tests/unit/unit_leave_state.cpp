// A leave of the fabric (transport/leave_state.hpp): ours owed when the
// peer's leave comes, sent first or as the answer, the peer's leave after
// ours, kernel mode again; the bytes the peer returns awaited, complete,
// written or given up; a rearm wanted, due, done; and a move outside any
// of the tables stopping a checked build; the handoff a leave calls.
#include <catch2/catch.hpp>

#include "unit_child.hpp"

#include "transport/conn_impl.hpp"
#include "unit_moves.hpp"

#include <memory>

using namespace sd::transport;

namespace {

constexpr auto kAll = all_states<OurLeave>(kOurLeaveNames);

}  // namespace

TEST_CASE("our leave is owed, sent first or as the answer, and forgotten in kernel mode",
          "[leave-state]") {
    check_table(kLeaveMoves, kOurLeaveNames,
                {{OurLeave::none, OurLeave::owed},
                 {OurLeave::owed, OurLeave::answered},
                 {OurLeave::none, OurLeave::first},
                 {OurLeave::first, OurLeave::first_answered},
                 // Crossing: we leave with the peer's leave here and not
                 // answered.
                 {OurLeave::owed, OurLeave::first}},
                // An answer answers a leave that came.
                {{OurLeave::none, OurLeave::answered},
                 {OurLeave::none, OurLeave::first_answered},
                 {OurLeave::answered, OurLeave::first_answered}});
    for (OurLeave s : kAll) {
        // Once sent, ours is never owed again, nor sent the other way.
        if (leave_sent(s)) {
            CHECK_FALSE(leave_move_allowed(s, OurLeave::owed));
            CHECK_FALSE(leave_move_allowed(s, OurLeave::answered));
            CHECK_FALSE(leave_move_allowed(s, OurLeave::first));
        }
        if (s != OurLeave::none) CHECK(leave_move_allowed(s, OurLeave::none));
    }
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
    check_table(kGiveBackMoves, kGiveBackNames,
                {{GiveBack::none, GiveBack::awaited},
                 {GiveBack::awaited, GiveBack::complete},
                 {GiveBack::complete, GiveBack::none},
                 {GiveBack::awaited, GiveBack::none}},  // the peer died
                // Complete only once awaited; never awaited again once here.
                {{GiveBack::none, GiveBack::complete}, {GiveBack::complete, GiveBack::awaited}});

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
    check_table(kRearmMoves, kRearmNames,
                {{Rearm::none, Rearm::wanted},
                 {Rearm::wanted, Rearm::due},
                 {Rearm::due, Rearm::none},
                 {Rearm::wanted, Rearm::none}},
                {{Rearm::none, Rearm::due},  // due only once wanted
                 {Rearm::due, Rearm::wanted}});

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
    CHECK(exited_cleanly(in_child([] {
        auto c = std::make_unique<Conn>();
        c->peer_left();
        c->leave_goes(false);
        c->leave_forget();
    })));
    if (!moves_checked()) return;
    CHECK(aborted(in_child([] {
        auto c = std::make_unique<Conn>();
        c->leave_goes(false);  // nothing to answer
    })));
    // Owed again once sent.
    CHECK(aborted(in_child([] {
        auto c = std::make_unique<Conn>();
        c->move_leave(OurLeave::answered, OurLeave::owed);
    })));
    // Returned bytes complete that were never awaited.
    CHECK(aborted(in_child([] {
        auto c = std::make_unique<Conn>();
        c->move_give_back(GiveBack::none, GiveBack::complete);
    })));
    // A rearm due that was never wanted.
    CHECK(aborted(in_child([] {
        auto c = std::make_unique<Conn>();
        c->move_rearm(Rearm::none, Rearm::due);
    })));
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
