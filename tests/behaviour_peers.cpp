// The peer cache: a process that connects to the same peer process again
// and again attaches it once; one whose peer ended attaches the next
// process afresh; SDIRECT_PEER_CACHE bounds the idle peers kept. Every
// connection is byte-exact and in the mode of its configuration.
#include <catch2/catch.hpp>

#include "harness.hpp"

using namespace sdt;

namespace {

// The "process" statistics line of `p` (its own pid).
const StatLine *process_line(const Proc &p, std::vector<StatLine> &keep) {
    keep = read_stats(p.stats);
    for (const StatLine &s : keep)
        if (s.pid == p.pid && s.text.rfind("process ", 0) == 0) return &s;
    return nullptr;
}

const std::vector<std::string> kBulk = {"--scenario", "bulk", "--size", "65536", "--seed", "5"};

struct Server {
    Proc proc;
    std::uint16_t port = 0;
};

// A server for `conns` sequential connections; false (after a skip) when
// the peer cannot run here.
bool start_server(const Scratch &scratch, const Placement &pl, int conns,
                  const std::vector<std::string> &env, Server *s) {
    const std::string port_file = scratch.file("server.port");
    Launch l{"server", {"server", port_file, "--conns", std::to_string(conns)}, pl.server_preload,
             env};
    l.args.insert(l.args.end(), kBulk.begin(), kBulk.end());
    s->proc = spawn(scratch, l);
    s->port = wait_port(port_file, s->proc, 20);
    if (s->port) return true;
    wait_exit(s->proc, 5);
    if (exited_with(s->proc, 77)) {
        note_skip(skip_reason(s->proc));
        return false;
    }
    FAIL("server did not publish its port\n" << describe(s->proc));
    return false;
}

Proc start_client(const Scratch &scratch, const Placement &pl, const std::string &name,
                  std::uint16_t port, int conns, const std::vector<std::string> &extra = {}) {
    Launch l{name, {"client", std::to_string(port), "--conns", std::to_string(conns)},
             pl.client_preload};
    l.args.insert(l.args.end(), kBulk.begin(), kBulk.end());
    l.args.insert(l.args.end(), extra.begin(), extra.end());
    return spawn(scratch, l);
}

void finish(Proc &p, double timeout) {
    wait_exit(p, timeout);
    INFO(describe(p));
    REQUIRE(exited_with(p, 0));
}

bool both_preloaded(const Placement &pl) { return pl.server_preload && pl.client_preload; }

}  // namespace

TEST_CASE("sequential connections between two processes attach the peer once and reuse it, "
          "byte-exact",
          "[peers]") {
    run_pair(
        [] {
            PairSpec spec;
            spec.args = kBulk;
            spec.args.insert(spec.args.end(), {"--conns", "20"});
            spec.timeout = 90;
            return spec;
        }(),
        [](Pair &pair, const Placement &pl) {
            if (!both_preloaded(pl)) return;
            for (const Proc *p : {&pair.server, &pair.client}) {
                std::vector<StatLine> stats;
                const StatLine *s = process_line(*p, stats);
                INFO(p->name << " statistics:\n" << read_text(p->stats));
                REQUIRE(s != nullptr);
                // Both ends attach their peer for each upgrade (one as the
                // initiator, one as the responder): once afresh, then from
                // the table.
                CHECK(s->num("peers_attached") == 1);
                CHECK(s->num("peer_reuses") >= 19);
                CHECK(s->num("peers_evicted") == 0);
            }
        });
}

TEST_CASE("a peer process that ended is dropped from the cache and the next client process is "
          "attached afresh, byte-exact",
          "[peers]") {
    for (const Placement &pl : placements()) {
        INFO("placement: " << pl.label());
        Scratch scratch;
        Server server;
        if (!start_server(scratch, pl, 4, {}, &server)) return;
        Proc first = start_client(scratch, pl, "client-a", server.port, 2);
        finish(first, 60);
        Proc second = start_client(scratch, pl, "client-b", server.port, 2);
        finish(second, 60);
        finish(server.proc, 30);
        // Each bulk round checks its bytes against the pattern.
        for (Proc *p : {&server.proc, &first, &second}) check_modes(*p, pl.expect(p == &server.proc));
        if (!both_preloaded(pl)) continue;
        std::vector<StatLine> stats;
        const StatLine *s = process_line(server.proc, stats);
        INFO("server statistics:\n" << read_text(server.proc.stats));
        REQUIRE(s != nullptr);
        // Each client process attached once, its second connection reusing
        // it; the first client's state dropped when it exited.
        CHECK(s->num("peers_attached") == 2);
        CHECK(s->num("peer_reuses") >= 2);
        CHECK(s->num("peers_gone") >= 1);
    }
}

TEST_CASE("with SDIRECT_PEER_CACHE=1 two client processes taking turns evict each other's idle "
          "peer and every connection still goes through, byte-exact",
          "[peers]") {
    for (const Placement &pl : placements()) {
        INFO("placement: " << pl.label());
        Scratch scratch;
        Server server;
        if (!start_server(scratch, pl, 6, {"SDIRECT_PEER_CACHE=1"}, &server)) return;
        // One connection each every second, the second client half a
        // second later: while one is served the other's peer is idle.
        Proc a = start_client(scratch, pl, "client-a", server.port, 3, {"--gap-ms", "1000"});
        sleep_s(0.5);
        Proc b = start_client(scratch, pl, "client-b", server.port, 3, {"--gap-ms", "1000"});
        finish(a, 60);
        finish(b, 60);
        finish(server.proc, 30);
        for (Proc *p : {&server.proc, &a, &b}) check_modes(*p, pl.expect(p == &server.proc));
        if (!both_preloaded(pl)) continue;
        std::vector<StatLine> stats;
        const StatLine *s = process_line(server.proc, stats);
        INFO("server statistics:\n" << read_text(server.proc.stats));
        REQUIRE(s != nullptr);
        CHECK(s->num("peers_evicted") >= 1);
        CHECK(s->num("peers_attached") >= 3);
    }
}
