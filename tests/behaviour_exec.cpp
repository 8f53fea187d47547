// exec in place of a server process: the accepted connection, direct
// after the settle, goes to a new image of the server's program started
// by execve (as sshd's re-exec or an inetd-style handler), which answers
// the client's ping-pong. Every byte is checked by the peers. With the
// library in the new image's environment, both ends must be direct again
// after the exec (the handed-over connection re-adopted and upgraded);
// without it, the new program has a plain TCP socket and the client's end
// went back to the kernel for good (reason exec).
#include <catch2/catch.hpp>

#include "harness.hpp"

using namespace sdt;

namespace {

PairSpec exec_spec(const char *how) {
    PairSpec spec;
    spec.args = {"--scenario", "pingpong", "--rounds", "20000", "--max-msg", "200"};
    spec.server_args = {"--exec-self", how};
    spec.check_modes = false;
    spec.timeout = 90;
    return spec;
}

// Both ends preloaded: true, and the case checks what the library did.
// Otherwise the modes the placement gives are checked here.
bool both_preloaded(const Pair &pair, const Placement &pl) {
    if (pl.expect(true) == Expect::direct) return true;
    check_modes(pair.server, pl.expect(true));
    check_modes(pair.client, pl.expect(false));
    return false;
}

}  // namespace

TEST_CASE("a direct connection handed to a program exec'd with the library is re-adopted there "
          "and upgraded again, byte-exact, both ends direct after the exec",
          "[exec]") {
    run_pair(exec_spec("library"), [](Pair &pair, const Placement &pl) {
        if (!both_preloaded(pair, pl)) return;
        // The server's statistics are the new image's (the old one never
        // exits): its only connection is the one it inherited.
        const StatLine server = only_conn_stat(pair.server);
        INFO("server: " << server.text);
        CHECK(server.mode == "direct");
        CHECK(server.num("upgrades") == 1);
        CHECK(server.num("tx_fabric") > 0);
        CHECK(server.num("rx_fabric") > 0);
        // The client's: direct before the exec, back to the kernel for it
        // (one leave), direct again with the new image.
        const StatLine client = only_conn_stat(pair.client);
        INFO("client: " << client.text);
        CHECK(client.mode == "direct");
        CHECK(client.num("upgrades") == 2);
        CHECK(client.num("leaves") == 1);
        CHECK(client.num("peer_pid") == std::uint64_t(pair.server.pid));
    });
}

TEST_CASE("a direct connection handed to a program exec'd without the library stays plain TCP "
          "there, byte-exact, the peer's end on the kernel for good (exec)",
          "[exec]") {
    run_pair(exec_spec("plain"), [](Pair &pair, const Placement &pl) {
        if (pl.expect(false) != Expect::direct) {
            check_modes(pair.client, pl.expect(false));
            return;
        }
        const StatLine client = only_conn_stat(pair.client);
        INFO("client: " << client.text);
        CHECK(client.mode == "kernel");
        CHECK(client.reason == "exec");
        CHECK(client.num("upgrades") == 1);
        CHECK(client.num("leaves") == 1);
        CHECK(client.num("tx_fabric") + client.num("rx_fabric") > 0);
        // Nothing on the fabric after the exec: the new program's pings
        // came through the kernel.
        CHECK(client.num("rx_kernel") > 0);
    });
}

TEST_CASE("a socket that becomes stdin and stdout of a program exec'd with the library goes "
          "direct there, and what the program echoes with getc, fread, fwrite and fflush comes "
          "back byte-exact",
          "[exec]") {
    PairSpec spec;
    // More than the kernel's buffers hold: the client's first megabytes
    // go on TCP while the server execs; the rest, both ways, direct.
    spec.args = {"--scenario", "echo-plain", "--size", "16000000"};
    spec.server_args = {"--exec-stdio", "1"};
    spec.check_modes = false;
    spec.timeout = 90;
    run_pair(spec, [](Pair &pair, const Placement &pl) {
        if (!both_preloaded(pair, pl)) return;
        // The server's statistics are the new image's.
        for (const Proc *p : {&pair.server, &pair.client}) {
            const StatLine s = only_conn_stat(*p);
            INFO(s.text);
            CHECK(s.mode == "direct");
            CHECK(s.num("tx_fabric") > 0);
            CHECK(s.num("rx_fabric") > 0);
            CHECK(s.num("tx_kernel") + s.num("tx_fabric") == 16000000);
        }
    });
}

TEST_CASE("a direct socket inherited by a forked child that execs a program with the library, "
          "which holds it unused, stays direct in its owner, byte-exact",
          "[exec]") {
    // As git clone's child execs index-pack with the clone's socket.
    PairSpec spec = exec_spec("none");
    spec.server_args = {"--fork-exec-idle-ms", "300"};
    run_pair(spec, [](Pair &pair, const Placement &pl) {
        if (!both_preloaded(pair, pl)) return;
        for (const Proc *p : {&pair.server, &pair.client}) {
            const StatLine s = only_conn_stat(*p);
            INFO(s.text);
            CHECK(s.mode == "direct");
            CHECK(s.num("upgrades") == 1);
            CHECK(s.num("leaves") == 0);
            CHECK(s.num("tx_kernel") + s.num("rx_kernel") < 1000);
        }
    });
}

TEST_CASE("a direct socket handed by a forking server to a child that execs a handler with the "
          "library is answered there byte-exact, and direct again once the server closed its copy",
          "[exec]") {
    PairSpec spec = exec_spec("none");
    spec.server_args = {"--fork-exec-handler", "1"};
    run_pair(spec, [](Pair &pair, const Placement &pl) {
        if (!both_preloaded(pair, pl)) return;
        // The client's end: direct with the server, back to the kernel
        // when the handler's first use claimed it, direct with the handler.
        const StatLine client = only_conn_stat(pair.client);
        INFO("client: " << client.text);
        CHECK(client.mode == "direct");
        CHECK(client.num("upgrades") == 2);
        CHECK(client.num("leaves") == 1);
        CHECK(client.num("rx_fabric") > 0);
    });
}
