// The tune file (protocol.hpp): the lines sdirect-tune writes with
// format_tune_line are what parse_tune reads back; malformed files are
// refused whole, naming the line; tune_lookup's size classes.
#include <catch2/catch.hpp>

#include "transport/protocol.hpp"

#include <string>

using namespace sd::transport;

TEST_CASE("a tune line names the size, the best protocol and the measured medians",
          "[tune]") {
    const double all[3] = {812.4, 1500.6, 2999.5};
    CHECK(format_tune_line(4096, Protocol::zcopy, all) ==
          "4096 best=zcopy buffered=812 ring=1501 zcopy=3000");
    const double some[3] = {700, -1, 0};
    CHECK(format_tune_line(65536, Protocol::buffered, some) ==
          "65536 best=buffered buffered=700 zcopy=0");
}

TEST_CASE("what sdirect-tune writes reads back, comments and blank lines skipped", "[tune]") {
    const double mbps[3] = {1000, 2000, 3000};
    std::string text = "# sdirect-tune 2026-01-01 00:00 UTC: stream MB/s\n";
    text += std::string(kTuneColumns) + "\n\n";
    const Protocol best[] = {Protocol::buffered, Protocol::ring, Protocol::zcopy, Protocol::ring};
    for (int i = 0; i < 4; ++i)
        text += format_tune_line(4096ull << (2 * i), best[i], mbps) + "  # note\n";
    TuneTable t;
    std::string error;
    REQUIRE(parse_tune(text, &t, &error) == 4);
    CHECK(error.empty());
    REQUIRE(t.n == 4);
    for (int i = 0; i < 4; ++i) {
        CHECK(t.size[i] == 4096ull << (2 * i));
        CHECK(t.best[i] == best[i]);
    }
    CHECK(parse_tune("# nothing measured\n\n", &t, &error) == 0);
    CHECK(t.n == 0);
}

TEST_CASE("a malformed tune file is refused whole, naming its line", "[tune]") {
    TuneTable t;
    std::string ok = "4096 best=ring\n";
    REQUIRE(parse_tune(ok, &t, nullptr) == 1);
    const struct {
        const char *text;
        const char *error;
    } bad[] = {
        {"4096 best=ring\n1024 best=zcopy\n", "line 2: '1024 best=zcopy'"},  // not ascending
        {"4096 best=ring\n4096 best=zcopy\n", "line 2: '4096 best=zcopy'"},
        {"0 best=ring\n", "line 1: '0 best=ring'"},
        {"4k best=ring\n", "line 1: '4k best=ring'"},
        {"# x\n4096 ring=12\n", "line 2: '4096 ring=12'"},  // no best
        {"4096 best=fast\n", "line 1: '4096 best=fast'"},
        {"best=ring\n", "line 1: 'best=ring'"},
    };
    for (const auto &b : bad) {
        INFO(b.text);
        std::string error;
        TuneTable u;
        u.n = 7;
        CHECK(parse_tune(b.text, &u, &error) == -1);
        CHECK(error == b.error);
        CHECK(u.n == 7);  // the table is not touched
    }
    // At most TuneTable::kMax sizes.
    std::string many;
    for (int i = 1; i <= TuneTable::kMax; ++i) many += std::to_string(i * 1000) + " best=ring\n";
    CHECK(parse_tune(many, &t, nullptr) == TuneTable::kMax);
    many += "999999999 best=ring\n";
    std::string error;
    CHECK(parse_tune(many, &t, &error) == -1);
    CHECK(error == "line " + std::to_string(TuneTable::kMax + 1) + ": '999999999 best=ring'");
}

TEST_CASE("a size's class reaches up to the next measured size; below the first, buffered",
          "[tune]") {
    TuneTable t;
    REQUIRE(parse_tune("4096 best=zcopy\n65536 best=ring\n1048576 best=zcopy\n", &t, nullptr) ==
            3);
    CHECK(tune_lookup(t, 0) == Protocol::buffered);
    CHECK(tune_lookup(t, 4095) == Protocol::buffered);
    CHECK(tune_lookup(t, 4096) == Protocol::zcopy);
    CHECK(tune_lookup(t, 65535) == Protocol::zcopy);
    CHECK(tune_lookup(t, 65536) == Protocol::ring);
    CHECK(tune_lookup(t, 1048575) == Protocol::ring);
    CHECK(tune_lookup(t, 1048576) == Protocol::zcopy);
    CHECK(tune_lookup(t, std::size_t(1) << 40) == Protocol::zcopy);
    TuneTable empty;
    CHECK(tune_lookup(empty, 1 << 20) == Protocol::buffered);
}
