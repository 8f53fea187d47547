// Processes: connections inside one process, pre-forked servers, fork with
// open connections, programs without TCP, and the library switched off.
#include <catch2/catch.hpp>

#include "harness.hpp"

#include <csignal>
#include <set>

using namespace sdt;

namespace {

// Whether a single process runs preloaded in this configuration; false
// (after noting a skip) where the configuration has no meaning for it.
bool single_process(bool *preload) {
    if (!library_ready()) return false;
    switch (config()) {
    case Config::kernel: *preload = false; return true;
    case Config::direct: *preload = true; return true;
    case Config::mixed: break;
    }
    note_skip("one process cannot be half preloaded (the direct configuration covers it)");
    return false;
}

void expect_exit_0(Proc &p, double timeout) {
    wait_exit(p, timeout);
    INFO(describe(p));
    REQUIRE(exited_with(p, 0));
}

// Both ends of each in-process connection: same mode, and either direct
// or kernel for the stated reason.
void check_local_modes(const Proc &p, bool allow_direct) {
    const auto stats = read_stats(p.stats);
    const auto conns = conns_of(p);
    INFO(describe(p));
    INFO("statistics file:\n" << read_text(p.stats));
    REQUIRE(conns.size() == 2);
    const StatLine *a = find_stat(stats, conns[0].pid, conns[0].local, conns[0].peer);
    const StatLine *b = find_stat(stats, conns[1].pid, conns[1].local, conns[1].peer);
    REQUIRE(a != nullptr);
    REQUIRE(b != nullptr);
    CHECK(a->mode == b->mode);
    for (const StatLine *s : {a, b}) {
        INFO(s->text);
        const bool direct = s->mode == "direct" && s->reason == "none";
        const bool kernel = s->mode == "kernel" && s->reason == "same_process";
        CHECK((kernel || (allow_direct && direct)));
    }
}

void run_local(const std::vector<std::string> &env, bool allow_direct) {
    bool preload = false;
    if (!single_process(&preload)) return;
    const std::vector<std::vector<std::string>> scenarios = {
        {"--scenario", "bulk", "--size", "1048576"},
        {"--scenario", "duplex", "--size", "1048576"},
        {"--scenario", "pingpong", "--rounds", "2000"},
        {"--scenario", "peek"},
    };
    for (const auto &args : scenarios) {
        Scratch scratch;
        Launch l{"local", {"local", "--settle-ms", settle_ms()}, preload, env};
        l.args.insert(l.args.end(), args.begin(), args.end());
        Proc p = spawn(scratch, l);
        expect_exit_0(p, 60);
        if (preload) check_local_modes(p, allow_direct);
    }
}

// A program that never opens TCP: the library must stay out of sight.
void idle_run(bool ignore_sigterm) {
    bool preload = false;
    if (!single_process(&preload)) return;
    Scratch scratch;
    const std::string ready = scratch.file("ready");
    Launch l{"idle", {"idle", "--ready", ready}, preload, {}, ignore_sigterm};
    if (ignore_sigterm) l.args.insert(l.args.end(), {"--expect-ignored", "1"});
    Proc p = spawn(scratch, l);
    const bool is_ready = wait_for_text(ready, "1", 20);
    signal_proc(p, SIGTERM);
    wait_exit(p, 20);
    INFO(describe(p));
    REQUIRE(is_ready);
    if (ignore_sigterm) CHECK(exited_with(p, 0));
    else CHECK(killed_by(p, SIGTERM));
    const auto entries = dir_entries(scratch.registry());
    INFO("registry entries: " << entries.size() << (entries.empty() ? "" : ", first " + entries[0]));
    CHECK(entries.empty());
    CHECK(read_stats(p.stats).empty());
}

}  // namespace

TEST_CASE("a connection inside one process is byte-exact and reports its mode",
          "[same-process]") {
    run_local({}, true);
}

TEST_CASE("SDIRECT_SAME_PROCESS=0 keeps an in-process connection on the kernel",
          "[same-process]") {
    if (config() == Config::kernel) {
        note_skip("a setting of the library");
        return;
    }
    run_local({"SDIRECT_SAME_PROCESS=0"}, false);
}

TEST_CASE("connections accepted by pre-forked workers are upgraded", "[prefork]") {
    const auto pls = placements();
    for (const Placement &pl : pls) {
        INFO("placement: " << pl.label());
        Scratch scratch;
        const std::string port_file = scratch.file("prefork.port");
        Launch master{"prefork", {"prefork", port_file, "--workers", "3", "--conns", "9",
                                  "--settle-ms", settle_ms()},
                      pl.server_preload};
        Proc server = spawn(scratch, master);
        const std::uint16_t port = wait_port(port_file, server, 20);
        INFO(describe(server));
        REQUIRE(port != 0);
        std::vector<Proc> clients;
        for (int i = 0; i < 9; ++i) {
            Launch c{"client" + std::to_string(i),
                     {"client", std::to_string(port), "--scenario", "bulk", "--size", "262144",
                      "--seed", std::to_string(100 + i), "--settle-ms", settle_ms()},
                     pl.client_preload};
            clients.push_back(spawn(scratch, c));
        }
        for (Proc &c : clients) expect_exit_0(c, 60);
        expect_exit_0(server, 60);
        std::set<int> workers;
        for (const ConnLine &c : conns_of(server)) workers.insert(c.pid);
        INFO("connections were served by " << workers.size() << " workers");
        CHECK(conns_of(server).size() == 9);
        CHECK(workers.size() >= 2);
        CHECK(workers.count(server.pid) == 0);
        check_modes(server, pl.expect(true));
        for (const Proc &c : clients) check_modes(c, pl.expect(false));
    }
}

TEST_CASE("a forked child's new connection is upgraded while the parent's keeps working "
          "exactly",
          "[fork]") {
    const auto pls = placements();
    for (const Placement &pl : pls) {
        INFO("placement: " << pl.label());
        Scratch scratch;
        Launch s1{"server1", {"server", scratch.file("s1.port"), "--scenario", "fork",
                              "--settle-ms", settle_ms()},
                  pl.server_preload};
        Launch s2{"server2", {"server", scratch.file("s2.port"), "--scenario", "bulk",
                              "--settle-ms", settle_ms()},
                  pl.server_preload};
        Proc server1 = spawn(scratch, s1);
        Proc server2 = spawn(scratch, s2);
        const std::uint16_t port1 = wait_port(scratch.file("s1.port"), server1, 20);
        const std::uint16_t port2 = wait_port(scratch.file("s2.port"), server2, 20);
        REQUIRE(port1 != 0);
        REQUIRE(port2 != 0);
        Launch c{"client", {"client", std::to_string(port1), "--scenario", "fork", "--port2",
                            std::to_string(port2), "--settle-ms", settle_ms()},
                 pl.client_preload};
        Proc client = spawn(scratch, c);
        expect_exit_0(client, 90);
        expect_exit_0(server1, 30);
        expect_exit_0(server2, 30);
        std::set<int> pids;
        for (const ConnLine &l : conns_of(client)) pids.insert(l.pid);
        CHECK(pids.size() == 2);  // the parent's connection and the child's
        check_modes(client, pl.expect(false));
        check_modes(server1, pl.expect(true));
        check_modes(server2, pl.expect(true));
    }
}

TEST_CASE("100 children forked by a process with a connection, which they never use, leave "
          "it as it was",
          "[fork]") {
    // Some children close their copy, some exit through exit(): the
    // parent's connection keeps its mode and every byte.
    PairSpec spec;
    spec.args = {"--scenario", "fork-loop", "--settle-ms", settle_ms()};
    run_pair(spec);
}

TEST_CASE("a process without TCP connections dies of SIGTERM as without the library and "
          "leaves no registry files",
          "[no-tcp]") {
    idle_run(false);
}

TEST_CASE("an inherited SIG_IGN for SIGTERM stays ignored", "[no-tcp]") {
    idle_run(true);
}

TEST_CASE("SDIRECT_ENABLE=0 keeps every connection on the kernel, tracking none",
          "[disabled]") {
    if (config() == Config::kernel) {
        note_skip("a setting of the library");
        return;
    }
    // A pass-through: no socket is the library's, so no connection has
    // counters, nothing is written to the registry, and the library has
    // nothing to say even at debug (tracked, a forked child's socket said
    // "the only holder left after fork").
    const std::vector<std::vector<std::string>> runs = {
        {"--scenario", "bulk", "--size", std::to_string(1u << 20)},
        {"--scenario", "pingpong", "--rounds", "2000"},
        {"--scenario", "fork-loop", "--settle-ms", settle_ms()},
    };
    for (const Placement &pl : placements()) {
        for (const auto &args : runs) {
            INFO("placement: " << pl.label() << ", scenario " << args.at(1));
            Scratch scratch;
            const std::string log = scratch.file("log");
            PairSpec spec;
            spec.args = args;
            spec.env = {"SDIRECT_ENABLE=0", "SDIRECT_LOG=debug", "SDIRECT_LOG_FILE=" + log};
            spec.check_modes = false;
            Pair pair = run_pair_once(scratch, spec, pl, "disabled");
            for (const Proc *p : {&pair.server, &pair.client}) {
                INFO("statistics file:\n" << read_text(p->stats));
                CHECK(read_stats(p->stats).empty());
            }
            CHECK(dir_entries(pair.registry).empty());
            CHECK(read_text(log).empty());
        }
    }
}
