// The upgrade is all or nothing: whatever disturbs the handshake (a
// process stopped at any step, signals, an fd limit) changes the mode of a
// connection, never its bytes, and both of its ends always agree on it.
#include <catch2/catch.hpp>

#include "harness.hpp"

#include <cstdio>
#include <map>

using namespace sdt;

namespace {

// Runs `peer upgrade --scenario NAME` (it forks its own client, so both
// ends run preloaded or both plain) and returns the statistics of both
// ends of every connection, paired; none in the kernel configuration.
struct Ends {
    const StatLine *server = nullptr, *client = nullptr;
};

void run_upgrade(const std::string &scenario, double timeout,
                 const std::function<void(const std::vector<Ends> &)> &check) {
    if (!library_ready()) return;
    if (config() == Config::mixed) {
        note_skip("the scenario forks its own client, which runs what its parent runs "
                  "(the direct configuration covers it)");
        return;
    }
    const bool preload = config() == Config::direct;
    Scratch scratch;
    Launch l{"upgrade", {"upgrade", "--scenario", scenario}, preload, {}};
    Proc p = spawn(scratch, l);
    wait_exit(p, timeout);
    INFO(describe(p));
    REQUIRE(exited_with(p, 0));
    if (!preload) return;
    const auto stats = read_stats(p.stats);
    INFO("statistics file:\n" << read_text(p.stats));
    std::map<std::string, Ends> by_conn;  // keyed by the server's view
    std::size_t reported = 0;
    for (const ConnLine &c : conns_of(p)) {
        const StatLine *s = find_stat(stats, c.pid, c.local, c.peer);
        INFO("connection pid " << c.pid << " " << c.local << " -> " << c.peer);
        REQUIRE(s != nullptr);
        if (c.role == "server") by_conn[c.local + " " + c.peer].server = s;
        else by_conn[c.peer + " " + c.local].client = s;
        ++reported;
    }
    std::vector<Ends> ends;
    for (const auto &[key, e] : by_conn) {
        INFO("connection " << key);
        REQUIRE(e.server != nullptr);
        REQUIRE(e.client != nullptr);
        INFO(e.server->text << "\n" << e.client->text);
        CHECK(e.server->mode == e.client->mode);
        ends.push_back(e);
    }
    CHECK(reported == 2 * by_conn.size());
    check(ends);
}

std::size_t direct_count(const std::vector<Ends> &ends) {
    std::size_t n = 0;
    for (const Ends &e : ends) n += e.server->mode == "direct";
    return n;
}

}  // namespace

TEST_CASE("a client stopped while it is asked to upgrade leaves both ends on TCP, byte-exact",
          "[upgrade]") {
    run_upgrade("stopped", 60, [](const std::vector<Ends> &ends) {
        REQUIRE(ends.size() == 1);
        for (const StatLine *s : {ends[0].server, ends[0].client}) {
            INFO(s->text);
            CHECK(s->mode == "kernel");
            CHECK(s->reason == "timeout");
        }
    });
}

TEST_CASE("upgrades under a 200 us interval timer in both processes lose no byte and agree",
          "[upgrade]") {
    run_upgrade("signals", 90, [](const std::vector<Ends> &ends) {
        CHECK(ends.size() == 30);
        // The timer slows the handshake, it does not stop it.
        CHECK(direct_count(ends) > 0);
    });
}

TEST_CASE("a server with no fd left when it starts an upgrade keeps the connection on TCP, "
          "byte-exact, and says fd_limit",
          "[upgrade]") {
    run_upgrade("fdlast", 60, [](const std::vector<Ends> &ends) {
        REQUIRE(ends.size() == 2);
        std::size_t limited = 0;
        for (const Ends &e : ends) {
            INFO(e.server->text << "\n" << e.client->text);
            if (e.server->mode == "direct") continue;
            CHECK(e.server->reason == "fd_limit");
            // The server could not publish its end either (one free fd is
            // enough for a whole upgrade once the peer is attached).
            CHECK(e.client->reason == "no_peer");
            ++limited;
        }
        CHECK(limited == 1);
    });
}

TEST_CASE("upgrades of a client at its fd limit lose no byte and agree", "[upgrade]") {
    run_upgrade("fdlimit", 90, [](const std::vector<Ends> &ends) {
        CHECK(ends.size() == 50);
        for (const Ends &e : ends) {
            INFO(e.client->text);
            const bool ok = e.client->mode == "direct" ||
                            (e.client->mode == "kernel" && e.client->reason != "none");
            CHECK(ok);
        }
    });
}

TEST_CASE("the first connection of a fresh process sends its first bytes without waiting for "
          "the engine, and goes direct once it has earned it",
          "[upgrade]") {
    PairSpec spec;
    // Three seconds of paced exchange: the connection earns its upgrade
    // after SDIRECT_UPGRADE_AFTER_MS, then both processes build their
    // engines (a few hundred ms each) while the bytes go on over TCP.
    spec.args = {"--scenario", "pingpong", "--earn-ms", "3000"};
    spec.env = {"SDIRECT_UPGRADE_AFTER_MS="};  // empty: the library's default policy
    run_pair(spec, [](Pair &pair, const Placement &pl) {
        const auto lines = lines_with(pair.client, "first-exchange ");
        REQUIRE(lines.size() == 1);
        unsigned long long us = 0;
        int engine = -1;
        REQUIRE(std::sscanf(lines[0].c_str(), "first-exchange us=%llu engine=%d", &us, &engine) == 2);
        INFO(lines[0]);
        // Connect and a round trip on TCP: microseconds (milliseconds on
        // a loaded host); building the engine takes hundreds of ms.
        CHECK(us < 100000);
        // Not only fast: the process had not even started its engine.
        CHECK(engine == 0);
        if (!pl.client_preload || !pl.server_preload) return;
        // It started on TCP and went direct afterwards, in both processes.
        check_earned_then_direct(pair);
    });
}
