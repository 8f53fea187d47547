// The wait primitive (wait.hpp): wait_until looks, runs its round hook
// every `every` failed looks, naps with the pace's growth, and ends on
// the look, the hook, the deadline or the bound on naps.
#include <catch2/catch.hpp>

#include "transport/wait.hpp"

#include <cstdint>
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
