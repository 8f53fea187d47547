// TCP's corners (peer_semantics.cpp): each scenario's driver checks the
// exact results the kernel gives, with the connection direct, on TCP
// (mixed) and with nothing preloaded.
#include <catch2/catch.hpp>

#include "harness.hpp"

using namespace sdt;

namespace {

PairSpec scenario(const char *name) {
    PairSpec spec;
    spec.args = {"--scenario", name, "--driver", "client"};
    return spec;
}

}  // namespace

TEST_CASE("read and readv of nothing return 0 at once; recv of nothing returns 0 with bytes "
          "queued, EAGAIN without",
          "[semantics]") {
    run_pair(scenario("sem-zero-read"));
}

TEST_CASE("with SDIRECT_ENABLE=0, read and readv of nothing return 0 at once too",
          "[semantics]") {
    if (config() == Config::kernel) {
        note_skip("a setting of the library");
        return;
    }
    PairSpec spec = scenario("sem-zero-read");
    spec.env = {"SDIRECT_ENABLE=0"};
    spec.check_modes = false;  // no connection is the library's: checked below
    run_pair(spec, [](Pair &pair, const Placement &) {
        for (const Proc *p : {&pair.server, &pair.client}) {
            INFO("statistics file:\n" << read_text(p->stats));
            CHECK(read_stats(p->stats).empty());
        }
    });
}

TEST_CASE("recv with MSG_TRUNC discards the bytes without copying them", "[semantics]") {
    run_pair(scenario("sem-trunc"));
}

TEST_CASE("recvmsg(MSG_ERRQUEUE) with an empty error queue fails with EAGAIN and leaves the "
          "stream whole",
          "[semantics]") {
    run_pair(scenario("sem-errqueue"));
}

TEST_CASE("SO_RCVLOWAT holds poll, select, epoll and a blocking recv until enough bytes are "
          "there",
          "[semantics]") {
    run_pair(scenario("sem-rcvlowat"));
}

TEST_CASE("after shutdown(SHUT_RD) recv returns EOF at once, and bytes sent later",
          "[semantics]") {
    run_pair(scenario("sem-shut-rd"));
}

TEST_CASE("close with SO_LINGER {1, 0} resets the connection; POLLERR|POLLHUP, then "
          "ECONNRESET, then EOF",
          "[semantics]") {
    run_pair(scenario("sem-linger-reset"));
}

TEST_CASE("after an abortive close by the peer, SO_ERROR reports ECONNRESET once and recv "
          "then returns EOF",
          "[semantics]") {
    PairSpec spec = scenario("sem-linger-reset");
    spec.args.insert(spec.args.end(), {"--read-error", "so_error"});
    run_pair(spec);
}

TEST_CASE("the first send after the peer closed is taken; the ones after the reset fail "
          "with EPIPE",
          "[semantics]") {
    run_pair(scenario("sem-send-after-close"));
}

TEST_CASE("close() while another thread is blocked in recv; the recv gets the bytes that come",
          "[semantics]") {
    run_pair(scenario("sem-close-in-recv"));
}

TEST_CASE("bytes that reach an end shut both ways draw a reset: POLLERR, then ECONNRESET "
          "once, then EOF",
          "[semantics]") {
    run_pair(scenario("sem-shut-rdwr-reset"));
}

TEST_CASE("sending to an end shut both ways draws its reset (POLLERR, then EPIPE) even when "
          "its process makes no call",
          "[semantics]") {
    run_pair(scenario("sem-send-to-shut-end"));
}

TEST_CASE("connect(AF_UNSPEC) resets the connection both ways; a direct one moves to the "
          "kernel first (reason disconnect)",
          "[semantics]") {
    PairSpec spec = scenario("sem-disconnect");
    spec.check_modes = false;  // direct until the disconnect: checked below
    run_pair(spec, [](Pair &pair, const Placement &pl) {
        for (bool server : {true, false}) {
            const Proc &p = server ? pair.server : pair.client;
            const Expect expect = pl.expect(server);
            if (!p.preloaded || expect == Expect::nothing) continue;
            const auto stats = read_stats(p.stats);
            INFO(describe(p));
            INFO("statistics file:\n" << read_text(p.stats));
            for (const ConnLine &c : conns_of(p)) {
                const StatLine *s = find_stat(stats, c.pid, c.local, c.peer);
                REQUIRE(s != nullptr);
                CHECK(s->mode == "kernel");
                if (expect == Expect::direct) {
                    CHECK(s->num("upgrades") == 1);
                    CHECK(s->num("leaves") == 1);
                    if (!server) CHECK(s->reason == "disconnect");
                } else {
                    CHECK((s->reason == "no_peer" || s->reason == "disconnect"));
                }
            }
        }
    });
}

TEST_CASE("after the peer shut both ways and closed, the first send is taken and draws the "
          "reset; the next ones fail with EPIPE",
          "[semantics]") {
    run_pair(scenario("sem-send-after-shut-close"));
}

TEST_CASE("TCP_INFO says CLOSE_WAIT once the peer's FIN is read", "[semantics]") {
    run_pair(scenario("sem-tcp-info-fin"));
}

TEST_CASE("bytes held back by TCP_CORK or MSG_MORE go out after about 200 ms with no further "
          "write",
          "[semantics]") {
    run_pair(scenario("sem-cork"));
}

TEST_CASE("urgent data: POLLPRI, SIOCATMARK, recv(MSG_OOB) and SO_OOBINLINE as on TCP; a "
          "direct connection moves to the kernel for it (reason oob)",
          "[semantics]") {
    PairSpec spec = scenario("sem-urgent");
    spec.check_modes = false;  // direct until the urgent byte: checked below
    run_pair(spec, [](Pair &pair, const Placement &pl) {
        for (bool server : {true, false}) {
            const Proc &p = server ? pair.server : pair.client;
            const Expect expect = pl.expect(server);
            if (!p.preloaded || expect == Expect::nothing) continue;
            const auto stats = read_stats(p.stats);
            INFO(describe(p));
            INFO("statistics file:\n" << read_text(p.stats));
            for (const ConnLine &c : conns_of(p)) {
                const StatLine *s = find_stat(stats, c.pid, c.local, c.peer);
                REQUIRE(s != nullptr);
                CHECK(s->mode == "kernel");
                if (expect == Expect::direct) {
                    CHECK(s->reason == "oob");
                    CHECK(s->num("upgrades") == 1);
                    CHECK(s->num("leaves") == 1);
                } else {
                    // Never direct: found without a peer, or held on TCP by
                    // the urgent byte before that was known.
                    CHECK((s->reason == "no_peer" || s->reason == "oob"));
                }
            }
        }
    });
}
