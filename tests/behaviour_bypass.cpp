// Paths around the library's socket calls: none may lose, duplicate or
// misroute a byte, or hang. Each case runs in every configuration; the
// peers check every byte and count, the statistics the mode.
#include <catch2/catch.hpp>

#include "harness.hpp"

#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>

using namespace sdt;

namespace {

PairSpec part(const std::string &name, std::vector<std::string> extra = {}) {
    PairSpec spec;
    spec.args = {"--scenario", "bypass", "--part", name};
    spec.args.insert(spec.args.end(), extra.begin(), extra.end());
    spec.timeout = 60;
    return spec;
}

// Direct first, then on the kernel for good for `reason`, on both ends;
// where only one end runs the library it never left the kernel.
// `check` on the only connection of each preloaded end, with what its
// placement expects of it.
template <typename F>
void each_end(const Pair &pair, const Placement &pl, F check) {
    for (bool server : {true, false}) {
        const Proc &p = server ? pair.server : pair.client;
        const Expect expect = pl.expect(server);
        if (expect == Expect::nothing) continue;
        INFO((server ? "server" : "client") << " statistics:\n" << read_text(p.stats));
        check(only_conn_stat(p), expect);
    }
}

void check_left_for_good(const Pair &pair, const Placement &pl, const std::string &reason) {
    each_end(pair, pl, [&](const StatLine &s, Expect expect) {
        CHECK(s.mode == "kernel");
        if (expect == Expect::direct) {
            CHECK(s.reason == reason);
            CHECK(s.num("tx_fabric") + s.num("rx_fabric") > 0);
            CHECK(s.num("upgrades") == 1);
            CHECK(s.num("leaves") == 1);
        } else {
            CHECK((s.reason == "no_peer" || s.reason == reason));
        }
    });
}

// A sandboxed child (chroot, setuid, seccomp) that uses the connection
// its direct parent holds: the parent leaves the fabric for sharing, the
// retired child's kernel bytes are counted for it, and the parent, alone
// once the child has exited, upgrades again (upgrades == 2, leaves == 1)
// unless its traffic ended before that upgrade was through (1 and 1, on
// the kernel: shared). Then `after`: what the parent does next, "exit"
// (it stays as it is) or "privilege" (it drops to nobody itself: its
// connection leaves for good, once more if it was direct again).
void check_sandboxed_child(const Pair &pair, const Placement &pl, const std::string &after) {
    each_end(pair, pl, [&](const StatLine &s, Expect expect) {
        if (expect != Expect::direct) {
            CHECK(s.mode == "kernel");
            CHECK((s.reason == "no_peer" || s.reason == "privilege"));
            return;
        }
        const auto up = s.num("upgrades"), left = s.num("leaves");
        INFO("mode " << s.mode << ", reason " << s.reason << ", upgrades " << up << ", leaves "
                     << left);
        CHECK(s.num("tx_fabric") + s.num("rx_fabric") > 0);
        if (after == "privilege") {
            CHECK(s.mode == "kernel");
            CHECK(s.reason == "privilege");
            CHECK(((up == 2 && left == 2) || (up == 1 && left == 1)));
        } else if (s.mode == "direct") {
            CHECK(s.reason == "none");
            CHECK(up == 2);
            CHECK(left == 1);
        } else {
            CHECK(s.mode == "kernel");
            CHECK(s.reason == "shared");
            CHECK(up == 1);
            CHECK(left == 1);
        }
    });
}

}  // namespace

TEST_CASE("sendfile on a full non-blocking socket moves the file offset (its own or the one "
          "given) by exactly what it sent, and not at all on EAGAIN",
          "[bypass]") {
    run_pair(part("sendfile-nonblock"));
}

TEST_CASE("splice from a pipe into a full non-blocking socket takes out of the pipe exactly "
          "what it sent, and nothing on EAGAIN",
          "[bypass]") {
    run_pair(part("splice-nonblock"));
}

TEST_CASE("close_range and closefrom close a connection's fds as close() does; EBADF after, a "
          "file that gets the number is a file, CLOSE_RANGE_CLOEXEC closes nothing, the last fd "
          "ends the stream",
          "[bypass]") {
    run_pair(part("close-range"));
}

// Counts, lengths, MSG_WAITFORONE, the timeout, short counts and EAGAIN as
// the kernel gives them.
TEST_CASE("sendmmsg and recvmmsg move every message through the connection",
          "[bypass]") {
    run_pair(part("mmsg"));
}

TEST_CASE("a privilege-separated child (chroot, setuid nobody, a seccomp filter against socket "
          "calls) uses its inherited connection, then the parent drops to nobody; every byte "
          "arrives, the library makes no forbidden call and keeps no map of the peer",
          "[bypass]") {
    PairSpec spec = part("privilege");
    spec.check_modes = false;
    run_pair(spec, [](Pair &pair, const Placement &pl) {
        check_sandboxed_child(pair, pl, "privilege");
    });
}

TEST_CASE("a sandboxed child (chroot, setuid nobody, a seccomp filter that allows only read, "
          "write, poll and what memory and exit need, as sshd's pre-auth child) echoes over its "
          "inherited connection with write and read; the library makes no other call for it",
          "[bypass]") {
    // A sanitizer's runtime makes calls of its own (in the child too) that
    // the narrow filter forbids: not the library's.
    for (const char *v : {"SDIRECT_TEST_PRELOAD_FIRST", "SDIRECT_TEST_PRELOAD_AFTER"})
        if (const char *s = std::getenv(v); s && *s) {
            note_skip("a sanitizer's runtime calls what the sandbox's filter forbids");
            return;
        }
    PairSpec spec = part("sandbox");
    spec.check_modes = false;
    run_pair(spec, [](Pair &pair, const Placement &pl) {
        check_sandboxed_child(pair, pl, "exit");
    });
}

TEST_CASE("a connection handed to another process with SCM_RIGHTS goes on there, byte for byte, "
          "and the sender's close of its copy does not end it",
          "[bypass]") {
    PairSpec spec = part("hand-off");
    spec.check_modes = false;
    run_pair(spec, [](Pair &pair, const Placement &pl) {
        check_left_for_good(pair, pl, "passed");
    });
}

TEST_CASE("stdio on a connection (fdopen of a dup, fwrite, fflush, fgetc, fread) moves every "
          "byte, direct, and the socket's own fd goes on after fclose",
          "[bypass]") {
    // The stream's reads and writes are the library's: the connection
    // never leaves the fabric for it.
    PairSpec spec = part("stdio");
    spec.check_modes = false;
    run_pair(spec, [](Pair &pair, const Placement &pl) {
        each_end(pair, pl, [](const StatLine &s, Expect expect) {
            if (expect != Expect::direct) {
                CHECK(s.mode == "kernel");
                return;
            }
            CHECK(s.mode == "direct");
            CHECK(s.num("tx_fabric") > 200000);
            CHECK(s.num("rx_fabric") > 150000);
            CHECK(s.num("upgrades") == 1);
            CHECK(s.num("leaves") == 0);
        });
    });
}

TEST_CASE("SDIRECT_ENABLE=0 keeps a program on the kernel, so raw syscalls on its sockets are "
          "exact",
          "[bypass]") {
    PairSpec spec = part("raw-syscall");
    spec.env = {"SDIRECT_ENABLE=0"};
    spec.check_modes = false;
    run_pair(spec, [](Pair &pair, const Placement &) {
        for (const Proc *p : {&pair.server, &pair.client}) {
            if (!p->preloaded) continue;
            INFO("statistics file:\n" << read_text(p->stats));
            CHECK(read_stats(p->stats).empty());  // no socket was the library's
        }
    });
}

TEST_CASE("the library exports exactly the symbols its version script lists", "[bypass]") {
    const char *map = std::getenv("SDIRECT_TEST_MAP");
    if (config() == Config::kernel || !map || !*map || lib_path().empty()) {
        note_skip("no library here");
        return;
    }
    // The names between "global:" and "local:".
    std::string text = read_text(map);
    const auto from = text.find("global:"), to = text.find("local:");
    REQUIRE(from != std::string::npos);
    REQUIRE(to != std::string::npos);
    std::set<std::string> listed;
    std::istringstream words(text.substr(from + 7, to - from - 7));
    for (std::string w; std::getline(words, w, ';');) {
        const auto a = w.find_first_not_of(" \t\n"), b = w.find_last_not_of(" \t\n");
        if (a != std::string::npos) listed.insert(w.substr(a, b - a + 1));
    }
    FILE *nm = popen(("nm -D --defined-only " + lib_path() + " 2>/dev/null").c_str(), "r");
    REQUIRE(nm != nullptr);
    std::set<std::string> exported;
    char line[512];
    for (int i = 0; i < 100000 && std::fgets(line, sizeof line, nm); ++i) {
        std::istringstream in(line);
        std::string addr, kind, name;
        if (in >> addr >> kind >> name && (kind == "T" || kind == "W")) exported.insert(name);
    }
    if (pclose(nm) != 0 || exported.empty()) {
        note_skip("nm is not available");
        return;
    }
    for (const std::string &name : listed) {
        INFO("listed, not exported: " << name);
        CHECK(exported.count(name) == 1);
    }
    for (const std::string &name : exported) {
        INFO("exported, not listed: " << name);
        CHECK(listed.count(name) == 1);
    }
}
