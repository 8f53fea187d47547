// send() keeps the kernel's contract: it takes what the kernel's socket
// buffers would take without waiting for the reader, a non-blocking sender
// sees the window open again without polling, and every byte it accepted
// is delivered whatever the sender does next (peer_sendpath.cpp).
#include <catch2/catch.hpp>

#include "harness.hpp"

#include <csignal>

using namespace sdt;

namespace {

PairSpec scenario(const std::string &name, std::vector<std::string> extra = {},
                  std::vector<std::string> env = {}) {
    PairSpec spec;
    spec.args = {"--scenario", name};
    spec.args.insert(spec.args.end(), extra.begin(), extra.end());
    spec.env = std::move(env);
    spec.timeout = 60;
    return spec;
}

// The number after `prefix` on the one line of p's stdout that has it.
std::uint64_t printed(const Proc &p, const std::string &prefix) {
    const auto lines = lines_with(p, prefix);
    INFO(describe(p));
    REQUIRE(lines.size() == 1);
    return std::stoull(lines[0].substr(prefix.size()));
}

}  // namespace

TEST_CASE("a blocking send that the kernel's buffers would take returns before the peer "
          "starts reading",
          "[sendpath]") {
    struct Case {
        const char *size;
        std::vector<std::string> env;
    };
    const Case cases[] = {
        {"131072", {}},
        {"1048576", {}},
        {"2000000", {}},
        {"2000000", {"SDIRECT_ZCOPY_MIN=0"}},
    };
    for (const Case &c : cases) {
        INFO("size " << c.size << (c.env.empty() ? "" : ", " + c.env[0]));
        if (!run_pair(scenario("sp-bigsend", {"--size", c.size, "--delay-ms", "1000"}, c.env)))
            return;
    }
}

TEST_CASE("a non-blocking sender that sleeps after EAGAIN, without poll or recv, sends again "
          "once the reader has drained",
          "[sendpath]") {
    run_pair(scenario("sp-eagain-sleep", {"--size", "8388608", "--delay-ms", "300"}));
}

TEST_CASE("every byte a non-blocking send accepted reaches the reader, then EOF, when the "
          "sender closes, exits or is killed right after; close returns at once",
          "[sendpath]") {
    for (const char *how : {"close", "exit", "kill"}) {
        INFO("the sender then: " << how);
        PairSpec spec = scenario("sp-tail", {"--how", how, "--delay-ms", "500"});
        const bool dies = std::string(how) != "close";
        if (std::string(how) == "kill") spec.server_signal = SIGKILL;
        // A sender that dies writes no statistics: the reader's are checked.
        spec.check_modes = !dies;
        const bool ran = run_pair(spec, [&](Pair &pair, const Placement &pl) {
            if (dies) check_modes(pair.client, pl.expect(false));
            CHECK(printed(pair.client, "received ") == printed(pair.server, "accepted "));
        });
        if (!ran) return;
    }
}

TEST_CASE("after the reader closed with bytes unread, the sender's sends fail with "
          "ECONNRESET or EPIPE, and so does the next one",
          "[sendpath]") {
    for (const char *chunk : {"65536", "1048576"}) {
        INFO("sends of " << chunk << " bytes");
        PairSpec spec = scenario("sp-reset-sender", {"--chunk", chunk, "--conns", "20"});
        spec.timeout = 120;
        if (!run_pair(spec)) return;
    }
}

TEST_CASE("a line written by one thread, which then closes, reaches the reading thread "
          "whole, then EOF, in every one of 50 rounds",
          "[sendpath]") {
    if (!library_ready()) return;
    if (config() == Config::mixed) {
        note_skip("one process cannot be half preloaded (the direct configuration covers it)");
        return;
    }
    const bool preload = config() == Config::direct;
    Scratch scratch;
    Proc p = spawn(scratch, Launch{"local",
                                   {"local", "--scenario", "sp-close-line", "--rounds", "50",
                                    "--settle-ms", settle_ms()},
                                   preload});
    wait_exit(p, 60);
    INFO(describe(p));
    REQUIRE(exited_with(p, 0));
    if (!preload) return;
    // Every connection of the rounds was direct at both ends.
    const auto stats = read_stats(p.stats);
    const auto conns = conns_of(p);
    REQUIRE(conns.size() == 102);
    for (const ConnLine &c : conns) {
        const StatLine *st = find_stat(stats, c.pid, c.local, c.peer);
        INFO(c.role << " " << c.local << " -> " << c.peer);
        REQUIRE(st != nullptr);
        CHECK(st->mode == "direct");
    }
}
