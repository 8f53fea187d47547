// Stream content: every byte arrives once, in order, unchanged, whatever
// the sizes, call families, direction, concurrency or address family.
#include <catch2/catch.hpp>

#include "harness.hpp"

#include <cstdio>
#include <string>

using namespace sdt;

namespace {

PairSpec bulk(std::uint64_t size, const std::string &driver = "client") {
    PairSpec spec;
    spec.args = {"--scenario", "bulk", "--size", std::to_string(size), "--driver", driver};
    return spec;
}

// Above a few chunks, a direct connection must carry the payload on the fabric.
void expect_fabric_traffic(Pair &pair, const Placement &pl) {
    if (!(pl.server_preload && pl.client_preload)) return;
    for (const Proc *p : {&pair.server, &pair.client}) {
        const auto stats = read_stats(p->stats);
        for (const ConnLine &c : conns_of(*p)) {
            const StatLine *s = find_stat(stats, c.pid, c.local, c.peer);
            REQUIRE(s != nullptr);
            INFO(s->text);
            CHECK(s->num("tx_fabric") > 0);
            CHECK(s->num("rx_fabric") > 0);
        }
    }
}

}  // namespace

TEST_CASE("bulk transfer is byte-exact in both directions at every size", "[stream]") {
    const std::uint64_t sizes[] = {1, 4095, 65536, (1u << 20) + 3, 8u << 20};
    for (std::uint64_t size : sizes) {
        INFO("size " << size);
        if (!run_pair(bulk(size), size >= (1u << 20) ? expect_fabric_traffic : nullptr)) return;
    }
}

TEST_CASE("bulk transfer is byte-exact when the accepting side drives", "[stream]") {
    for (std::uint64_t size : {std::uint64_t(1), std::uint64_t(8u << 20)}) {
        INFO("size " << size);
        if (!run_pair(bulk(size, "server"))) return;
    }
}

TEST_CASE("every send call family pairs byte-exactly with every receive call family",
          "[stream]") {
    const char *txs[] = {"write", "send", "writev", "sendmsg", "sendto"};
    const char *rxs[] = {"read", "recv", "readv", "recvmsg", "recvfrom"};
    std::string combos;
    for (const char *tx : txs)
        for (const char *rx : rxs) combos += std::string(combos.empty() ? "" : ",") + tx + ":" + rx;
    for (const char *driver : {"client", "server"}) {
        INFO("driver " << driver);
        PairSpec spec = bulk(100003, driver);
        spec.args.insert(spec.args.end(), {"--combos", combos, "--chunk", "8192"});
        if (!run_pair(spec)) return;
    }
}

TEST_CASE("writev and readv over many pieces of assorted sizes are byte-exact", "[stream]") {
    // Small calls travel inline, large ones are written into the peer's
    // ring: both must carry every piece.
    for (const char *chunk : {"3001", "4096", "65536", "300000"}) {
        INFO("chunk " << chunk);
        PairSpec spec = bulk(1000003);
        spec.args.insert(spec.args.end(),
                         {"--combos", "writev-many:readv-many,writev-many:read,write:readv-many",
                          "--chunk", chunk});
        if (!run_pair(spec)) return;
    }
}

TEST_CASE("simultaneous transfer in both directions is byte-exact", "[stream]") {
    for (const char *driver : {"client", "server"}) {
        INFO("driver " << driver);
        PairSpec spec;
        spec.args = {"--scenario", "duplex", "--size", std::to_string(8u << 20), "--driver", driver};
        if (!run_pair(spec)) return;
    }
}

TEST_CASE("a tiny SDIRECT_WINDOW still moves every byte exactly", "[stream]") {
    PairSpec spec = bulk(4u << 20);
    spec.env = {"SDIRECT_WINDOW=4096"};
    if (!run_pair(spec)) return;
    spec.args = {"--scenario", "duplex", "--size", std::to_string(2u << 20)};
    run_pair(spec);
}

TEST_CASE("statistics count every byte the application moved", "[stream]") {
    if (config() == Config::kernel) {
        note_skip("no statistics without the library");
        return;
    }
    run_pair(bulk((1u << 20) + 17), [](Pair &pair, const Placement &) {
        check_byte_counts(pair.server);
        check_byte_counts(pair.client);
    });
}

TEST_CASE("the peer program calls the FORTIFY variants of the receive calls", "[stream]") {
    FILE *nm = popen(("nm -D " + peer_path() + " 2>/dev/null").c_str(), "r");
    REQUIRE(nm != nullptr);
    std::string symbols;
    char line[512];
    for (int i = 0; i < 100000 && std::fgets(line, sizeof line, nm); ++i) symbols += line;
    const int rc = pclose(nm);
    if (rc != 0 || symbols.empty()) {
        note_skip("nm is not available");
        return;
    }
    CHECK(symbols.find("__read_chk") != std::string::npos);
    CHECK(symbols.find("__recv_chk") != std::string::npos);
    CHECK(symbols.find("__recvfrom_chk") != std::string::npos);
}

TEST_CASE("ping-pong of small messages stays exact over many round trips", "[pingpong]") {
    for (const char *driver : {"client", "server"}) {
        INFO("driver " << driver);
        PairSpec spec;
        spec.args = {"--scenario", "pingpong", "--rounds", "20000", "--max-msg", "64",
                     "--driver", driver};
        if (!run_pair(spec)) return;
    }
}

TEST_CASE("ping-pong of messages up to 4 KiB stays exact", "[pingpong]") {
    PairSpec spec;
    spec.args = {"--scenario", "pingpong", "--rounds", "3000", "--max-msg", "4096"};
    run_pair(spec);
}

TEST_CASE("IPv6 loopback connections are byte-exact", "[ipv6]") {
    PairSpec spec = bulk(8u << 20);
    spec.args.insert(spec.args.end(), {"--family", "6"});
    if (!run_pair(spec, expect_fabric_traffic)) return;
    spec.args = {"--scenario", "pingpong", "--rounds", "5000", "--family", "6"};
    if (!run_pair(spec)) return;
    spec.args = {"--scenario", "duplex", "--size", std::to_string(4u << 20), "--family", "6"};
    run_pair(spec);
}

TEST_CASE("IPv6 connections report their addresses like the kernel", "[ipv6]") {
    PairSpec spec;
    spec.args = {"--scenario", "sockinfo", "--family", "6"};
    run_pair(spec, [](Pair &pair, const Placement &) {
        const auto info = lines_with(pair.client, "info ");
        REQUIRE(info.size() == 1);
        CHECK(info[0].find("addrlen=28") != std::string::npos);
        CHECK(info[0].find("so_domain=10") != std::string::npos);
    });
}

TEST_CASE("a receive ring read through is backed by huge pages, and the stream stays exact",
          "[stream]") {
    if (config() == Config::kernel) {
        note_skip("receive rings");
        return;
    }
    for (const Placement &pl : placements()) {
        if (pl.expect(true) != Expect::direct || pl.expect(false) != Expect::direct) continue;
        INFO("placement: " << pl.label());
        for (const bool huge : {true, false}) {
            INFO("SDIRECT_RING_HUGE=" << huge);
            Scratch scratch;
            const std::string log = scratch.file("log");
            // 32 MiB each way through 2 MiB rings: each is read through 16
            // times, room for every try (a collapse refused while the
            // peer's write holds a page is asked again a ring later).
            PairSpec spec = bulk(32u << 20);
            spec.env = {"SDIRECT_LOG=debug", "SDIRECT_LOG_FILE=" + log,
                        std::string("SDIRECT_RING_HUGE=") + (huge ? "1" : "0")};
            Pair pair = run_pair_once(scratch, spec, pl, huge ? "huge" : "small");
            expect_fabric_traffic(pair, pl);
            const std::string text = read_text(log);
            INFO("log:\n" << text);
            for (const Proc *p : {&pair.server, &pair.client}) {
                check_modes(*p, Expect::direct);
                const auto lines = log_lines(text, conns_of(*p).at(0).pid);
                if (!huge) {
                    CHECK(count_with(lines, "backed by huge pages") == 0);
                    continue;
                }
                if (count_with(lines, "ring not backed by huge pages (try 1): Invalid argument")) {
                    note_skip("huge pages for rings (this kernel has no MADV_COLLAPSE)");
                    return;
                }
                // Once per connection, within its first tries. A ring
                // never offered to the peer starts over whenever a delivery
                // finds it empty: read through only where the reader lags.
                if (undumpable())
                    CHECK(count_with(lines, "ring of 2048 KiB backed by huge pages") <= 1);
                else
                    CHECK(count_with(lines, "ring of 2048 KiB backed by huge pages") == 1);
            }
        }
        return;  // one direct placement is enough
    }
    note_skip("huge pages for rings (no placement with both ends direct)");
}
