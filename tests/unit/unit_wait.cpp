// The wait primitive (wait.hpp): wait_until looks, runs its round hook
// every `every` failed looks, naps with the pace's growth, and ends on
// the look, the hook, the deadline or the bound on naps; wait_on_bell,
// its doorbell form, sleeps after a failed look (with a spin first),
// ends at the deadline with -EAGAIN and on a signal as the socket would;
// latch_waker, a delivery's look at a sleeper's word, wakes it once.
#include <catch2/catch.hpp>

#include "transport/conn.hpp"
#include "transport/procpage.hpp"
#include "transport/wait.hpp"

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <string>
#include <vector>

using namespace sd::transport;

TEST_CASE("wait_until: a look that succeeds at once returns ready without a round", "[wait]") {
    int looks = 0, rounds = 0;
    const Waited w = wait_until(
        {.nap_ns = 1000000}, 0,
        [&] {
            ++looks;
            return true;
        },
        [&](std::uint64_t, std::uint64_t) {
            ++rounds;
            return true;
        });
    CHECK(w == Waited::ready);
    CHECK(looks == 1);
    CHECK(rounds == 0);
}

TEST_CASE("wait_until: ready after N failed looks, one round per `every` of them", "[wait]") {
    int looks = 0, rounds = 0;
    const Waited w = wait_until(
        {.nap_ns = 0, .every = 4}, 0, [&] { return ++looks > 10; },
        [&](std::uint64_t start, std::uint64_t now) {
            CHECK(now >= start);
            ++rounds;
            return true;
        });
    CHECK(w == Waited::ready);
    CHECK(looks == 11);  // 10 failed, the 11th succeeds
    CHECK(rounds == 2);  // after the 4th and the 8th failed look
}

TEST_CASE("wait_until: a round that says stop ends the wait as stopped", "[wait]") {
    int looks = 0, rounds = 0;
    const Waited w = wait_until(
        {.nap_ns = 0, .every = 2}, 0,
        [&] {
            ++looks;
            return false;
        },
        [&](std::uint64_t, std::uint64_t) { return ++rounds < 3; });
    CHECK(w == Waited::stopped);
    CHECK(rounds == 3);
    CHECK(looks == 6);
}

TEST_CASE("wait_until: a deadline that passes returns timed_out, not before it", "[wait]") {
    const std::uint64_t start = monotonic_ns();
    const std::uint64_t deadline = start + 3000000;
    int looks = 0;
    const Waited w = wait_until({.nap_ns = 100000}, deadline, [&] {
        ++looks;
        return false;
    });
    CHECK(w == Waited::timed_out);
    CHECK(monotonic_ns() >= deadline);
    // 100 us naps: at most 30 of them fit before the deadline.
    CHECK(looks >= 2);
    CHECK(looks <= 31);
}

TEST_CASE("wait_until: max_naps naps, then one last look, then timed_out", "[wait]") {
    int looks = 0, rounds = 0;
    const Waited w = wait_until(
        {.nap_ns = 10000, .max_naps = 5}, 0,
        [&] {
            ++looks;
            return false;
        },
        [&](std::uint64_t, std::uint64_t) {
            ++rounds;
            return true;
        });
    CHECK(w == Waited::timed_out);
    CHECK(looks == 6);
    CHECK(rounds == 6);  // the last round finds the bound reached
    int late = 0;
    CHECK(wait_until({.nap_ns = 10000, .max_naps = 5}, 0, [&] { return ++late == 6; }) ==
          Waited::ready);
}

TEST_CASE("wait_until: naps grow from nap_ns to late_nap_ns once late_ns have passed",
          "[wait]") {
    const Pace p{.nap_ns = 10000, .late_nap_ns = 50000, .late_ns = 200000};
    CHECK(p.nap_after(0) == 10000);
    CHECK(p.nap_after(200000) == 10000);
    CHECK(p.nap_after(200001) == 50000);
    CHECK(Pace{.nap_ns = 1000000}.nap_after(5000000000ull) == 1000000);
    CHECK(Pace{.nap_ns = 0, .late_nap_ns = 50000, .late_ns = 200000}.nap_after(100000) == 0);

    // Each nap lasts at least its length: looks before late_ns are 10 us
    // apart or more, looks after it 50 us or more.
    std::vector<std::uint64_t> at;
    at.reserve(64);
    std::uint64_t first_fail = 0;
    const Waited w = wait_until(p, 0, [&] {
        at.push_back(monotonic_ns());
        return at.size() == 40;
    }, [&](std::uint64_t start, std::uint64_t) {
        first_fail = start;
        return true;
    });
    REQUIRE(w == Waited::ready);
    std::size_t short_gaps = 0, long_gaps = 0;
    for (std::size_t i = 1; i < at.size(); ++i) {
        const std::uint64_t gap = at[i] - at[i - 1];
        // The nap before look i was chosen by the round's clock, read
        // after look i-1.
        if (at[i - 1] > first_fail + p.late_ns) {
            CHECK(gap >= 50000);
            ++long_gaps;
        } else {
            CHECK(gap >= 10000);
            ++short_gaps;
        }
    }
    CHECK(short_gaps >= 1);
    CHECK(long_gaps >= 1);
}

TEST_CASE("wait_until: without a round hook, only the looks and the naps", "[wait]") {
    int looks = 0;
    CHECK(wait_until({.nap_ns = 1000, .every = 8}, 0, [&] { return ++looks == 20; }) ==
          Waited::ready);
    CHECK(looks == 20);
}

// wait_on_bell with a sleep that does not sleep: counts, and answers what
// the case says (0 or -EINTR).
namespace {

struct FakeBell : BellWaiter {
    int looks = 0, sleeps = 0, ready_at = 1 << 30;
    int sleep_rc = 0;
    long result = 7;
    long look() noexcept { return ++looks >= ready_at ? result : kWaitOn; }
    int sleep(std::uint64_t) noexcept {
        ++sleeps;
        return sleep_rc;
    }
};

}  // namespace

TEST_CASE("wait_on_bell: a first look that succeeds returns its result without a sleep",
          "[wait]") {
    FakeBell w;
    w.ready_at = 1;
    SpinSlot slot;
    CHECK(wait_on_bell(w, slot) == 7);
    CHECK(w.looks == 1);
    CHECK(w.sleeps == 0);
}

TEST_CASE("wait_on_bell: without a spin, every failed look is followed by one sleep", "[wait]") {
    FakeBell w;
    w.ready_at = 5;
    w.result = 0;
    SpinSlot slot;
    CHECK(wait_on_bell(w, slot) == 0);
    CHECK(w.looks == 5);
    CHECK(w.sleeps == 4);
}

TEST_CASE("wait_on_bell: a passed deadline ends the wait with -EAGAIN before any sleep",
          "[wait]") {
    FakeBell w;
    w.deadline_ns = 1;  // long past
    SpinSlot slot;
    CHECK(wait_on_bell(w, slot) == -EAGAIN);
    CHECK(w.looks == 1);
    CHECK(w.sleeps == 0);
}

TEST_CASE("wait_on_bell: a signal on a socket with a timeout ends the wait with -EINTR",
          "[wait]") {
    FakeBell w;
    w.sleep_rc = -EINTR;
    w.timeout_ns = 1000000000;
    w.deadline_ns = monotonic_ns() + 60'000'000'000ull;
    SpinSlot slot;
    CHECK(wait_on_bell(w, slot) == -EINTR);
    CHECK(w.sleeps == 1);
}

TEST_CASE("wait_on_bell: a signal without a timeout goes on if the kernel would restart",
          "[wait]") {
    // The test runner's own handlers decide which: both answers are checked.
    const bool restart = restart_after_signal();
    FakeBell w;
    w.sleep_rc = -EINTR;
    w.ready_at = 4;
    SpinSlot slot;
    if (restart) {
        CHECK(wait_on_bell(w, slot) == 7);
        CHECK(w.sleeps == 3);
    } else {
        CHECK(wait_on_bell(w, slot) == -EINTR);
        CHECK(w.sleeps == 1);
    }
}

TEST_CASE("wait_on_bell: the waiter's hooks run in order and can end the wait", "[wait]") {
    struct Hooks : FakeBell {
        std::vector<char> *seen;
        int missed_calls = 0;
        long missed(std::uint64_t) noexcept {
            seen->push_back('m');
            // The first miss made headway, the second asks for a look
            // at once, the others let the wait sleep.
            ++missed_calls;
            return missed_calls == 1 ? kMoved : missed_calls == 2 ? kLookAgain : kWaitOn;
        }
        long before_sleep() noexcept {
            seen->push_back('b');
            return sleeps == 1 ? -ENOTCONN : kWaitOn;
        }
        int sleep(std::uint64_t now) noexcept {
            seen->push_back('s');
            return FakeBell::sleep(now);
        }
    };
    std::vector<char> seen;
    Hooks w;
    w.seen = &seen;
    SpinSlot slot;
    CHECK(wait_on_bell(w, slot) == -ENOTCONN);
    CHECK(std::string(seen.begin(), seen.end()) == "mmmbsmb");
    CHECK(w.looks == 4);
}

TEST_CASE("wait_on_bell: timed_out may ask for another look instead of ending", "[wait]") {
    struct Late : FakeBell {
        int timeouts = 0;
        long timed_out() noexcept {
            ++timeouts;
            deadline_ns = 0;  // as a cancellation would: no deadline any more
            return kLookAgain;
        }
    };
    Late w;
    w.deadline_ns = 1;
    w.ready_at = 3;
    SpinSlot slot;
    CHECK(wait_on_bell(w, slot) == 7);
    CHECK(w.timeouts == 1);
    CHECK(w.looks == 3);
    CHECK(w.sleeps == 1);
}

TEST_CASE("wait_on_bell: an interrupted hook that goes on keeps the wait", "[wait]") {
    struct Keep : FakeBell {
        int signals = 0;
        long interrupted() noexcept {
            ++signals;
            return kWaitOn;
        }
    };
    Keep w;
    w.sleep_rc = -EINTR;
    w.timeout_ns = 1;  // would end it with -EINTR by default
    w.ready_at = 3;
    SpinSlot slot;
    CHECK(wait_on_bell(w, slot) == 7);
    CHECK(w.signals == 2);
}

// latch_waker: a delivery to a connection whose word announces a sleeper
// wakes it once. Words as sleepers announce them: of our uid the mark in
// the high half and the eventfd's number in the low one; across uids the
// mark is the eventfd's number + 1 and the low half a token.
TEST_CASE("latch_waker: another thread's announced word is latched, and the delivery wakes it",
          "[wait]") {
    const std::uint64_t word = std::uint64_t(7) << 32 | 42;
    std::atomic<std::uint64_t> slot{word};
    const RungWaker r = latch_waker(slot, false);
    // Latched: the peer's post finds the latch and writes nothing.
    CHECK(slot.load() == (word | kWakeRung));
    // Nothing to skip: the delivery's own wake-up is the sleeper's one.
    CHECK(r.bell == -1);
    CHECK(r.slot_bit == 0);

    const std::uint64_t xword = std::uint64_t(43) << 32 | 9;
    std::atomic<std::uint64_t> xslot{xword};
    const RungWaker x = latch_waker(xslot, true);
    CHECK(xslot.load() == (xword | kWakeRung));
    CHECK(x.bell == -1);
    CHECK(x.slot_bit == 0);
}

TEST_CASE("latch_waker: a word latched already names the sleeper the delivery skips", "[wait]") {
    std::atomic<std::uint64_t> slot{(std::uint64_t(7) << 32 | 42) | kWakeRung};
    const RungWaker r = latch_waker(slot, false);
    CHECK(r.bell == 42);
    CHECK(r.slot_bit == 0);
    // Across uids the bell is the mark - 1.
    std::atomic<std::uint64_t> xslot{(std::uint64_t(43) << 32 | 9) | kWakeRung};
    const RungWaker x = latch_waker(xslot, true);
    CHECK(x.bell == 42);
    CHECK(x.slot_bit == 0);
}

TEST_CASE("latch_waker: the calling thread's own sleep is never latched", "[wait]") {
    const std::uint64_t own = bell_word();
    REQUIRE(own != 0);
    std::atomic<std::uint64_t> slot{own};
    const RungWaker r = latch_waker(slot, false);
    // Left for the peer: a latch here would keep it from waking this
    // thread for a later message.
    CHECK(slot.load() == own);
    CHECK(r.bell == -1);
    CHECK(r.slot_bit == 0);
    std::atomic<std::uint64_t> xslot{std::uint64_t(own_bell() + 1) << 32 | 5};
    (void)latch_waker(xslot, true);
    CHECK(xslot.load() == (std::uint64_t(own_bell() + 1) << 32 | 5));
}

TEST_CASE("latch_waker: no word, nothing latched and nothing skipped", "[wait]") {
    std::atomic<std::uint64_t> slot{0};
    const RungWaker r = latch_waker(slot, false);
    CHECK(slot.load() == 0);
    CHECK(r.bell == -1);
    CHECK(r.slot_bit == 0);
}
