// The zero-copy protocols under stress: read zero-copy (the receiver reads
// the sender's buffer), write zero-copy (the sender writes the receiver's)
// and the buffered ones they fall back to, with buffers that vanish right
// after send, random sizes, call families, flags and directions, and both
// kinds of advertisement crossing. Every byte is checked by the peers; the
// statistics must show the protocol under test carried bytes.
#include <catch2/catch.hpp>

#include "harness.hpp"

#include <csignal>
#include <functional>
#include <string>
#include <vector>

using namespace sdt;

namespace {

// A counter summed over one process's connections.
std::uint64_t sum_of(const Proc &p, const char *key) {
    std::uint64_t total = 0;
    const auto stats = read_stats(p.stats);
    for (const ConnLine &c : conns_of(p)) {
        const StatLine *s = find_stat(stats, c.pid, c.local, c.peer);
        REQUIRE(s != nullptr);
        INFO(s->text);
        // Every fabric byte is counted under exactly one protocol.
        CHECK(s->num("tx_sink") + s->num("tx_zcopy") + s->num("tx_ring") + s->num("tx_inline") ==
              s->num("tx_fabric"));
        total += s->num(key);
    }
    return total;
}

std::uint64_t sum_over(const Pair &pair, const char *key) {
    return sum_of(pair.server, key) + sum_of(pair.client, key);
}

// In the direct configuration, `key` (a counter) moved bytes.
auto expect_used(const char *key) {
    return [key](Pair &pair, const Placement &pl) {
        if (!(pl.server_preload && pl.client_preload)) return;
        INFO("counter " << key);
        CHECK(sum_over(pair, key) > 0);
    };
}

std::string joined(const std::vector<std::string> &env) {
    std::string out;
    for (const std::string &e : env) out += (out.empty() ? "" : " ") + e;
    return out;
}

PairSpec zc(const std::string &scenario, const std::vector<std::string> &env,
            const std::vector<std::string> &args = {}) {
    PairSpec spec;
    spec.env = env;
    spec.args = {"--scenario", scenario};
    spec.args.insert(spec.args.end(), args.begin(), args.end());
    spec.timeout = 120;
    return spec;
}

}  // namespace

TEST_CASE("large sends from buffers freed, unmapped or remapped right after send() returns "
          "arrive byte-exact",
          "[zcopy]") {
    // malloc/free, mmap/munmap, MAP_FIXED over the same address, and one
    // buffer scribbled on after each send; read zero-copy from 64 KiB on,
    // streams too.
    const std::vector<std::string> env = {"SDIRECT_ZCOPY_MIN=65536", "SDIRECT_STREAM_RING=0"};
    if (!run_pair(zc("zc-buffers", env), expect_used("tx_zcopy"))) return;
    // No lockable memory at all: the protocols must not need pinning.
    run_pair(zc("zc-buffers", env, {"--memlock0", "1", "--seed", "2"}), expect_used("tx_zcopy"));
}

namespace {
// The "process" statistics line of the process that wrote `stats`.
const StatLine *process_line(const std::vector<StatLine> &stats, int pid) {
    for (const StatLine &s : stats)
        if (s.pid == pid && s.text.rfind("process ", 0) == 0) return &s;
    return nullptr;
}
}  // namespace

TEST_CASE("the registration cache: a buffer sent again is not registered again, and memory "
          "freed, unmapped or remapped never reuses a registration",
          "[zcopy]") {
    // SDIRECT_CMA=0: the reader uses the provider's RMA read, which needs
    // the sender's buffer registered (on one host it needs nothing). The
    // driver sends 48 pieces, 36 of them from memory that is freed,
    // unmapped, or unmapped and mapped again at the same address right
    // after; then 8 sends of one buffer that stays.
    // Pieces of 64 to 256 KiB: 48 of them fit a cache of 4 MiB (half of
    // the usual 8 MiB RLIMIT_MEMLOCK) without evictions.
    const std::vector<std::string> env = {"SDIRECT_ZCOPY_MIN=65536", "SDIRECT_CMA=0",
                                          "SDIRECT_STREAM_RING=0"};
    std::string off_why;
    const auto args = std::vector<std::string>{"--reuse", "8", "--max", "262144"};
    run_pair(zc("zc-buffers", env, args), [&](Pair &pair, const Placement &pl) {
        if (!(pl.server_preload && pl.client_preload)) return;
        CHECK(sum_over(pair, "tx_zcopy") > 0);
        const auto stats = read_stats(pair.client.stats);
        INFO("statistics file:\n" << read_text(pair.client.stats));
        const StatLine *p = process_line(stats, pair.client.pid);
        REQUIRE(p != nullptr);
        if (p->kv.at("reg_cache") != "on") {
            off_why = "the registration cache is off (memory hooks not first: a sanitizer "
                      "build?)";
            return;
        }
        if (p->num("reg_budget") < (4u << 20)) {
            off_why = "RLIMIT_MEMLOCK allows a registration cache of only " +
                      p->kv.at("reg_budget") + " bytes";
            return;
        }
        // Each buffer registered once; the kept one found 7 times more.
        CHECK(p->num("reg_hits") >= 7);
        CHECK(p->num("reg_misses") <= 48 + 1);
        // Every piece from memory that went away was dropped before it
        // went (12 freed, 12 unmapped, 12 unmapped and replaced).
        CHECK(p->num("reg_invalidated") >= 36);
        CHECK(p->num("reg_evicted") == 0);
    });
    if (!off_why.empty()) note_skip(off_why);
}

TEST_CASE("a peer killed in the middle of zero-copy transfers leaves a correct prefix, then "
          "EOF, ECONNRESET or EPIPE, without a hang",
          "[zcopy]") {
    // Large pieces (read zero-copy), recv buffers advertised (write
    // zero-copy) or neither; the peer dies while sending, or while
    // reading our sends.
    const std::vector<std::vector<std::string>> envs = {
        {},
        {"SDIRECT_SINK_MIN=65536"},
        {"SDIRECT_SINK_MIN=65536", "SDIRECT_CMA=0"},
        {"SDIRECT_ZCOPY_MIN=0"}};
    for (const auto &env : envs) {
        for (const char *way : {"in", "out"}) {
            INFO("way " << way << ", settings " << (env.empty() ? "defaults" : joined(env)));
            for (const char *seed : {"1", "2", "3"}) {
                PairSpec spec = zc("zc-peer-dies", env, {"--way", way, "--seed", seed});
                spec.client_args = {"--driver", "client"};
                spec.server_signal = SIGKILL;
                spec.check_modes = false;
                spec.timeout = 30;
                if (!run_pair(spec)) return;
            }
        }
    }
}

TEST_CASE("a randomised mix of sizes, call families, flags and directions stays byte-exact "
          "under every protocol setting",
          "[zcopy]") {
    struct Variant {
        const char *what;
        std::vector<std::string> env;
        const char *counter;
    };
    const Variant variants[] = {
        {"defaults", {}, "tx_zcopy"},
        {"read zero-copy from 4 KiB, write zero-copy from 1 KiB",
         {"SDIRECT_ZCOPY_MIN=4097", "SDIRECT_SINK_MIN=1024"},
         "tx_sink"},
        {"buffered only, small window", {"SDIRECT_ZCOPY_MIN=0", "SDIRECT_WINDOW=65536"},
         "tx_ring"},
        {"the provider's RMA (SDIRECT_CMA=0): read zero-copy from 4 KiB, write zero-copy "
         "from 1 KiB",
         {"SDIRECT_CMA=0", "SDIRECT_ZCOPY_MIN=4097", "SDIRECT_SINK_MIN=1024"},
         "rx_sink"},
    };
    for (const Variant &v : variants) {
        INFO("variant: " << v.what);
        for (const char *seed : {"1", "2"}) {
            INFO("seed " << seed);
            if (!run_pair(zc("zc-torture", v.env, {"--seed", seed, "--rounds", "24"}),
                          expect_used(v.counter)))
                return;
        }
    }
}

namespace {

// In the direct configuration, `check` of each end's bytes sent by read
// zero-copy and through the ring.
auto each_end(std::function<void(std::uint64_t zcopy, std::uint64_t ring)> check) {
    return [check](Pair &pair, const Placement &pl) {
        if (!(pl.server_preload && pl.client_preload)) return;
        for (const Proc *p : {&pair.client, &pair.server}) {
            const std::uint64_t zcopy = sum_of(*p, "tx_zcopy"), ring = sum_of(*p, "tx_ring");
            INFO(p->name << ": tx_zcopy " << zcopy << ", tx_ring " << ring);
            check(zcopy, ring);
        }
    };
}

}  // namespace

TEST_CASE("large sends of a request-response exchange go by read zero-copy, those of a stream "
          "through the ring after the first, and by size alone with SDIRECT_STREAM_RING=0",
          "[zcopy]") {
    // 20 requests of 64 KiB, each echoed whole: every send of either end
    // follows the other end's message, so each keeps the one copy (a piece
    // whose reader is late, 2 ms, goes on by the window).
    PairSpec exchange = zc("exchange", {}, {"--size", "65536", "--rounds", "20"});
    if (!run_pair(exchange, each_end([](std::uint64_t zcopy, std::uint64_t ring) {
                      CHECK(zcopy > ring);
                      CHECK(zcopy >= 10 * 65536);
                  })))
        return;
    // 4 MiB each way in pieces of up to 256 KiB, back to back: after the
    // first large piece, the ring (a piece of at most a quarter of it).
    PairSpec stream = zc("bulk", {}, {"--size", "4194304", "--chunk", "262144"});
    if (!run_pair(stream, each_end([](std::uint64_t zcopy, std::uint64_t ring) {
                      CHECK(zcopy <= 262144);
                      CHECK(ring >= 2u << 20);
                  })))
        return;
    // The same stream by size alone: pieces from 64 KiB by read zero-copy.
    stream.env = {"SDIRECT_STREAM_RING=0"};
    run_pair(stream, each_end([](std::uint64_t zcopy, std::uint64_t) { CHECK(zcopy >= 2u << 20); }));
}

namespace {

// Write zero-copy was used: some recv buffer of one end was written by
// the other (direct configuration only).
void expect_sinks(Pair &pair, const Placement &pl) {
    if (!(pl.server_preload && pl.client_preload)) return;
    const std::uint64_t advertised = sum_over(pair, "sinks");
    const std::uint64_t written = sum_over(pair, "rx_sink");
    INFO("sinks advertised " << advertised << ", bytes written into them " << written);
    CHECK(advertised > 0);
    CHECK(written > 0);
}

}  // namespace

namespace {

// The write zero-copy cases under `env` (plus the thresholds below):
// ping-pong, bulk, duplex and call families. The ping-pong and the paced
// bulk must show sinks written.
bool sink_cases(const std::vector<std::string> &env) {
    // Every recv of 1 KiB or more that finds nothing to read advertises its
    // buffer; the sender's read zero-copy off and on, so both kinds of
    // advertisement cross.
    for (const char *zcopy : {"0", "16384"}) {
        INFO("SDIRECT_ZCOPY_MIN=" << zcopy);
        std::vector<std::string> all = env;
        all.insert(all.end(), {"SDIRECT_SINK_MIN=1024", std::string("SDIRECT_ZCOPY_MIN=") + zcopy});
        PairSpec spec;
        spec.env = all;
        spec.args = {"--scenario", "pingpong", "--rounds", "3000", "--max-msg", "65536"};
        if (!run_pair(spec, expect_sinks)) return false;
        // Full speed: whether the reader ever finds its ring empty while
        // the sender is at the sink's offset is the scheduler's choice, so
        // only the bytes are checked here.
        spec = zc("bulk", all, {"--size", std::to_string(8u << 20)});
        if (!run_pair(spec, expect_used("tx_fabric"))) return false;
        // Paced: each sender pauses between its chunks, so the reader
        // drains them, waits in recv and advertises its buffer before the
        // next chunk is sent, which must then be written into it.
        spec = zc("bulk", all, {"--size", std::to_string(1u << 20), "--gap-us", "3000"});
        if (!run_pair(spec, expect_sinks)) return false;
        spec.args = {"--scenario", "duplex", "--size", std::to_string(4u << 20)};
        if (!run_pair(spec)) return false;
        spec = zc("bulk", all, {"--size", "1000003"});
        spec.args.insert(spec.args.end(),
                         {"--combos", "write:recv,writev-many:readv-many,sendmsg:recvmsg,write:read",
                          "--chunk", "65536"});
        if (!run_pair(spec)) return false;
    }
    return true;
}

}  // namespace

TEST_CASE("write zero-copy (recv buffers written by the sender) keeps every stream byte-exact",
          "[zcopy]") {
    sink_cases({});
}

TEST_CASE("write zero-copy through the provider's RMA (SDIRECT_CMA=0, as between hosts: "
          "registered recv buffers, fi_write, two-sided cancel) keeps every stream byte-exact",
          "[zcopy]") {
    // Without process_vm_writev and the shared claim word, every sink
    // taken here went through fi_writemsg: rx_sink > 0 proves it.
    sink_cases({"SDIRECT_CMA=0"});
}

TEST_CASE("a recv whose buffer is advertised ends in its SO_RCVTIMEO or a signal (EINTR) "
          "without losing or duplicating a byte",
          "[zcopy]") {
    // The receiver's timeouts and signals cancel its sinks: one-sidedly on
    // one host, by sink_cancel and the sender's answer through the
    // provider; one responder pause outlasts the bound on that answer.
    for (const char *cma : {"1", "0"}) {
        INFO("SDIRECT_CMA=" << cma);
        PairSpec spec = zc("zc-sink-cancel",
                           {std::string("SDIRECT_CMA=") + cma, "SDIRECT_SINK_MIN=65536"},
                           {"--silent", "1"});
        spec.timeout = 180;
        const bool ran = run_pair(spec, [](Pair &pair, const Placement &pl) {
            if (!(pl.server_preload && pl.client_preload)) return;
            const std::uint64_t advertised = sum_over(pair, "sinks");
            const std::uint64_t written = sum_over(pair, "rx_sink");
            const std::uint64_t cancelled = sum_over(pair, "sink_cancels");
            INFO("sinks " << advertised << ", written " << written << " bytes, cancelled "
                          << cancelled);
            CHECK(advertised > 0);
            CHECK(written > 0);
            CHECK(cancelled > 0);
        });
        if (!ran) return;
    }
}

TEST_CASE("a large send cut short by SO_SNDTIMEO or a signal ends as a TCP send (part taken, "
          "the rest left, or EINTR), also while its reader is busy outside the library",
          "[zcopy]") {
    // Read zero-copy waits for the reader; cut short, it gives up its
    // advertisement (the reader's control thread answers if the reader
    // itself does not call in) and takes what the window holds.
    // Streams too (SDIRECT_STREAM_RING=0): each send waits for its reader.
    const std::vector<std::string> env = {"SDIRECT_STREAM_RING=0"};
    if (!run_pair(zc("zc-sndtimeo", env), expect_used("tx_zcopy"))) return;
    run_pair(zc("zc-eintr", env), expect_used("tx_zcopy"));
}

TEST_CASE("large blocking sends both ways under a 200 us interval timer in both processes, "
          "with and without SA_RESTART, arrive byte-exact and each send counts exactly what "
          "its peer read",
          "[zcopy]") {
    // Read zero-copy from 128 KiB on (the sends are 128 KiB .. 1 MiB);
    // signals cut the senders' waits for their readers and the readers'
    // waits all the time. Each buffer is overwritten once send() returns.
    const std::vector<std::string> env = {"SDIRECT_ZCOPY_MIN=131072", "SDIRECT_STREAM_RING=0"};
    for (const char *restart : {"0", "1"}) {
        INFO("SA_RESTART " << restart);
        PairSpec spec = zc("storm-duplex", env, {"--restart", restart, "--size", "300000000"});
        if (!run_pair(spec, expect_used("tx_zcopy"))) return;
    }
}
