// End of a connection: half-close, close, writes to a closed peer, and the
// death of the peer process.
#include <catch2/catch.hpp>

#include "harness.hpp"

#include <csignal>
#include <cstdlib>

using namespace sdt;

namespace {

void both_ends(const char *name) {
    for (const char *driver : {"client", "server"}) {
        INFO("driver " << driver);
        PairSpec spec;
        spec.args = {"--scenario", name, "--driver", driver};
        if (!run_pair(spec)) return;
    }
}

// The driver blocks in recv; the harness kills the responder with `sig`.
// The survivor must see EOF or ECONNRESET within a second.
void kill_responder(const char *driver, int sig, bool nonblocking = false) {
    const auto pls = placements();
    for (const Placement &pl : pls) {
        Scratch scratch;
        PairSpec spec;
        spec.args = {"--scenario", "peer-death", "--driver", driver};
        if (nonblocking) spec.args.insert(spec.args.end(), {"--nonblocking", "1"});
        Pair pair = start_pair(scratch, spec, pl, "death");
        INFO("placement: " << pl.label() << ", driver " << driver);
        REQUIRE(pair.port != 0);
        const bool client_drives = std::string(driver) == "client";
        Proc &victim = client_drives ? pair.server : pair.client;
        Proc &survivor = client_drives ? pair.client : pair.server;
        const bool ready = wait_for_text(victim.out, "ready", 20);
        sleep_s(0.1);  // the survivor is in recv by now
        const double t0 = now_s();
        signal_proc(victim, sig);
        wait_exit(survivor, 10);
        const double took = survivor.end_s - t0;
        wait_exit(victim, 10);
        INFO(describe(victim));
        INFO(describe(survivor));
        REQUIRE(ready);
        CHECK(killed_by(victim, sig));
        REQUIRE(exited_with(survivor, 0));
        // The survivor's own measure: how long its recv was blocked (it
        // entered recv about 0.1 s before the kill). Its exit may take
        // longer under a sanitizer; that is not the library's doing.
        double blocked = -1;
        for (const std::string &l : lines_with(survivor, "survivor recv="))
            if (auto at = l.find(" after "); at != std::string::npos)
                blocked = std::atof(l.c_str() + at + 7);
        INFO("survivor's recv returned after " << blocked << " s; it ended " << took
                                               << " s after the kill");
        CHECK(blocked >= 0);
        CHECK(blocked < 1.1);
        CHECK(took < 5.0);
        check_modes(survivor, pl.expect(!client_drives));
    }
}

}  // namespace

TEST_CASE("recv returns 0 after peer shutdown(SHUT_WR), and the peer still reads",
          "[shutdown]") {
    both_ends("peer-shutdown-wr");
}

TEST_CASE("after shutdown(SHUT_WR) the peer reads all data then EOF, and the half-closed "
          "side still receives what the peer sends back",
          "[shutdown]") {
    both_ends("shutdown-wr");
}

// The accepting end touches its socket only after the connecting end's
// shutdown, so a preloaded pair upgrades after it: the answer comes on the
// fabric, and the shut end still gives TCP's results.
TEST_CASE("a connection shut down before its upgrade refuses sends with EPIPE after it, and "
          "poll reports IN|OUT|RDHUP|HUP once both directions are shut",
          "[shutdown]") {
    // "wr-late": the connecting end, which answers the upgrade, reads the
    // peer's commit 300 ms late (SDIRECT_COMMIT_PAUSE_US): the answer, the
    // peer's FIN and its close all come on the fabric before, and every
    // result (EOF, poll, EPIPE) is given while it still commits.
    for (const std::string part : {"wr", "rdwr", "wr-late"}) {
        INFO("--part " << part);
        PairSpec spec;
        const bool late = part == "wr-late";
        spec.args = {"--scenario", "shut-then-upgrade", "--part", late ? "wr" : part};
        if (late) spec.env = {"SDIRECT_COMMIT_PAUSE_US=300000"};
        const bool rdwr = part == "rdwr";
        const bool ran = run_pair(spec, [rdwr](Pair &pair, const Placement &pl) {
            if (pl.expect(false) != Expect::direct) return;
            // Direct when the checks ran: upgraded once, after the request
            // went on the kernel; the answer (SHUT_WR) came on the fabric.
            const auto stats = read_stats(pair.client.stats);
            const auto conns = conns_of(pair.client);
            REQUIRE(conns.size() == 1);
            const StatLine *s = find_stat(stats, conns[0].pid, conns[0].local, conns[0].peer);
            REQUIRE(s != nullptr);
            INFO(s->text);
            CHECK(s->num("upgrades") == 1);
            CHECK(s->num("tx_kernel") == 3000);
            CHECK(s->num("tx_fabric") == 0);
            CHECK(s->num("rx_kernel") == 0);
            CHECK(s->num("rx_fabric") == (rdwr ? 0 : 100000));
        });
        if (!ran) return;
    }
}

TEST_CASE("after the peer closes, the reader gets every byte, then EOF, then EPIPE with "
          "MSG_NOSIGNAL",
          "[close]") {
    both_ends("close-epipe");
}

TEST_CASE("writing to a closed peer raises SIGPIPE, which kills by default", "[close]") {
    const auto pls = placements();
    for (const Placement &pl : pls) {
        for (const char *driver : {"client", "server"}) {
            Scratch scratch;
            PairSpec spec;
            spec.args = {"--scenario", "close-sigpipe", "--driver", driver};
            Pair pair = start_pair(scratch, spec, pl, "sigpipe");
            INFO("placement: " << pl.label() << ", driver " << driver);
            REQUIRE(pair.port != 0);
            wait_exit(pair.client, 30);
            wait_exit(pair.server, 30);
            const bool client_drives = std::string(driver) == "client";
            Proc &writer = client_drives ? pair.client : pair.server;
            Proc &closer = client_drives ? pair.server : pair.client;
            INFO(describe(writer));
            INFO(describe(closer));
            CHECK(killed_by(writer, SIGPIPE));
            REQUIRE(exited_with(closer, 0));
            check_modes(closer, pl.expect(!client_drives));
        }
    }
}

TEST_CASE("a peer killed with SIGKILL wakes a blocked recv with EOF or ECONNRESET within a "
          "second",
          "[peer-death]") {
    kill_responder("client", SIGKILL);
    kill_responder("server", SIGKILL);
}

// The reader neither blocks nor polls: its looks that find nothing ask the
// kernel socket for the peer's end only now and then, and the death must
// still come through, and stay.
TEST_CASE("a peer killed with SIGKILL ends non-blocking recvs without poll, 1 ms apart, with "
          "EOF or ECONNRESET within a second, and every recv after",
          "[peer-death]") {
    kill_responder("client", SIGKILL, true);
    kill_responder("server", SIGKILL, true);
}

// The connection starts on TCP (the default upgrade policy), so the bytes
// the victim leaves unread are in its kernel socket; then it goes direct.
// Its death resets the connection in the kernel: the survivor must see
// the reset as over TCP (before, a direct survivor read EOF).
TEST_CASE("a peer killed with bytes of ours unread in its kernel socket, after the connection "
          "went direct, draws ECONNRESET, then EOF",
          "[peer-death]") {
    for (const Placement &pl : placements()) {
        Scratch scratch;
        PairSpec spec;
        spec.args = {"--scenario", "killed-unread", "--driver", "client"};
        spec.env = {"SDIRECT_UPGRADE_AFTER_MS=20"};
        Pair pair = start_pair(scratch, spec, pl, "unread");
        INFO("placement: " << pl.label());
        REQUIRE(pair.port != 0);
        const bool ready = wait_for_text(pair.server.out, "ready", 20);
        sleep_s(0.1);  // the survivor is in recv by now
        signal_proc(pair.server, SIGKILL);
        wait_exit(pair.client, 10);
        wait_exit(pair.server, 10);
        INFO(describe(pair.server));
        INFO(describe(pair.client));
        REQUIRE(ready);
        CHECK(killed_by(pair.server, SIGKILL));
        CHECK(exited_with(pair.client, 0));
        CHECK(lines_with(pair.client, "survivor recv=-1 errno=ECONNRESET").size() == 1);
        check_modes(pair.client, pl.expect(false));
    }
}

TEST_CASE("SIGTERM ends a process with an open connection as without the library",
          "[peer-death]") {
    kill_responder("client", SIGTERM);
    kill_responder("server", SIGTERM);
}

TEST_CASE("a peer that calls exit() while another of its threads sends ends the stream "
          "exactly, and the reader never hangs",
          "[peer-death]") {
    // A thread killed by the exit inside the provider, holding the
    // reader's region lock, would leave the reader spinning for ever.
    for (int run = 0; run < 16; ++run) {
        INFO("run " << run);
        PairSpec spec;
        spec.args = {"--scenario", "exit-while-sending", "--watchdog", "30"};
        spec.client_args = {"--exit-after-us", std::to_string(1000 + run * 1700), "--chunk",
                            run % 2 ? "1000" : "16000"};
        spec.timeout = 20;
        if (!run_pair(spec, [](Pair &pair, const Placement &) {
                INFO(describe(pair.client));
                CHECK(lines_with(pair.client, "stream of an exiting peer").size() == 1);
            }))
            return;
    }
}
