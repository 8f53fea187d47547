// Spin slots (wait.hpp): one spinner per CPU, and the back-off of a thread
// whose spins end in sleep.
#include <catch2/catch.hpp>

#include "unit_env.hpp"

#include "transport/settings.hpp"
#include "transport/wait.hpp"

#include <cstdlib>
#include <sched.h>
#include <string>
#include <unistd.h>

using namespace sd::transport;

TEST_CASE("spin slots: one spinner per CPU; a thread whose spins end in sleep backs off "
          "1, 2, 4 ... waits and spins again once a spin is satisfied",
          "[spin]") {
    char dir[] = "/tmp/sdirect-unit-XXXXXX";
    REQUIRE(mkdtemp(dir) != nullptr);
    EnvGuard reg("SDIRECT_REGISTRY", dir);
    load_settings();
    // This thread stays on the CPU it runs on, so every slot is that CPU's.
    cpu_set_t old, one;
    REQUIRE(sched_getaffinity(0, sizeof old, &old) == 0);
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
    const std::uint64_t ns = 50000;
    const std::uint64_t now = monotonic_ns();
    auto spins = [&] {
        SpinSlot s;
        const bool spun = s.start(now, ns) == now + ns;
        s.release();  // the spin ended in a sleep
        return spun;
    };
    {
        SpinSlot a, b;
        CHECK(a.start(now, ns) == now + ns);
        CHECK_FALSE(a.wanted());
        CHECK(b.start(now, ns) == now);  // the CPU's slot is taken
        // b's look at the held slot asks a to end its spin.
        CHECK(a.wanted());
        CHECK_FALSE(b.wanted());  // b holds nothing
        // a is dropped satisfied at the end of the scope (the wanted bit
        // does not keep the slot), b never spun.
    }
    {
        // The slot is free again, and no longer wanted.
        SpinSlot c;
        CHECK(c.start(now, ns) == now + ns);
        CHECK_FALSE(c.wanted());
    }
    // Failures in a row: the first two spin, then 1 wait without, a probe,
    // 2 without, a probe, 4 without, a probe.
    const bool expect[] = {true, true, false, true, false, false, true,
                           false, false, false, false, true};
    for (std::size_t i = 0; i < sizeof expect; ++i) {
        INFO("wait " << i);
        CHECK(spins() == expect[i]);
    }
    {
        // Skips over (8 without), then a satisfied spin resets the count.
        for (int i = 0; i < 8; ++i) CHECK_FALSE(spins());
        SpinSlot ok;
        CHECK(ok.start(now, ns) == now + ns);
    }
    CHECK(spins());
    CHECK(spins());
    CHECK_FALSE(spins());
    REQUIRE(sched_setaffinity(0, sizeof old, &old) == 0);
    std::string file = std::string(dir) + "/spin";
    unlink(file.c_str());
    rmdir(dir);
}
