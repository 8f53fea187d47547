// Descriptors, socket information and invalid arguments. The last two are
// differential: a preloaded run must print exactly what a run on the plain
// kernel prints.
#include <catch2/catch.hpp>

#include "harness.hpp"

#include <algorithm>

using namespace sdt;

namespace {

PairSpec scenario(const char *name, const char *driver) {
    PairSpec spec;
    spec.args = {"--scenario", name, "--driver", driver};
    return spec;
}

Proc &driver_of(Pair &pair, const char *driver) {
    return std::string(driver) == "client" ? pair.client : pair.server;
}

// Lines starting with `prefix` that the driver prints on the plain kernel.
std::vector<std::string> kernel_reference(const char *name, const char *driver,
                                          const std::string &prefix) {
    Scratch scratch;
    PairSpec spec = scenario(name, driver);
    Pair pair = run_pair_once(scratch, spec, Placement{false, false}, "reference");
    return lines_with(driver_of(pair, driver), prefix);
}

void same_as_kernel(const char *name, const std::string &prefix,
                    void (*sanity)(const std::vector<std::string> &)) {
    for (const char *driver : {"client", "server"}) {
        INFO("driver " << driver);
        const auto reference = kernel_reference(name, driver, prefix);
        sanity(reference);
        const bool ran = run_pair(scenario(name, driver), [&](Pair &pair, const Placement &) {
            const auto lines = lines_with(driver_of(pair, driver), prefix);
            REQUIRE(lines.size() == reference.size());
            for (std::size_t i = 0; i < lines.size(); ++i) {
                INFO("kernel: " << reference[i]);
                CHECK(lines[i] == reference[i]);
            }
        });
        if (!ran) return;
    }
}

bool has(const std::vector<std::string> &lines, const std::string &line) {
    return std::find(lines.begin(), lines.end(), line) != lines.end();
}

void sockinfo_sanity(const std::vector<std::string> &lines) {
    REQUIRE(lines.size() == 1);
    for (const char *want : {"addrlen=16", "so_error=0", "optlen=4", "so_type=1", "so_domain=2",
                             "so_protocol=6", "acceptconn=0", "nodelay=0,1", "tcpi_state=1"}) {
        INFO(lines[0] << " should contain " << want);
        CHECK(lines[0].find(want) != std::string::npos);
    }
}

// The test logic itself: the kernel gives the documented errors.
void probe_sanity(const std::vector<std::string> &lines) {
    REQUIRE(has(lines, "probe done"));
    const char *expected[] = {
        "probe send_notsock rc=-1 errno=ENOTSOCK",
        "probe recv_notsock rc=-1 errno=ENOTSOCK",
        "probe send_m1 rc=-1 errno=EBADF",
        "probe recv_m1 rc=-1 errno=EBADF",
        "probe send_closed rc=-1 errno=EBADF",
        "probe recv_badptr rc=-1 errno=EFAULT",
        "probe fionread_after_efault rc=100",
        "probe data_exact_after_efault rc=1",
        "probe send_badptr rc=-1 errno=EFAULT",
        "probe stream_intact_after_efault rc=1",
        "probe connect_refused rc=-1 errno=ECONNREFUSED",
        "probe shutdown_unconnected rc=-1 errno=ENOTCONN",
        "probe setsockopt_bad_level rc=-1 errno=ENOPROTOOPT",
        "probe connect_connected rc=-1 errno=EISCONN",
        "probe accept_nonblocking_empty rc=-1 errno=EAGAIN",
    };
    for (const char *line : expected) {
        INFO("expected on the kernel: " << line);
        CHECK(has(lines, line));
    }
}

}  // namespace

TEST_CASE("dup, dup2, dup3 and fcntl duplicates carry the same exact stream, and closing "
          "the original keeps them working",
          "[dup]") {
    for (const char *driver : {"client", "server"}) {
        INFO("driver " << driver);
        if (!run_pair(scenario("dup", driver))) return;
    }
}

TEST_CASE("getsockname, getpeername and getsockopt give what the kernel gives", "[sockinfo]") {
    if (!library_ready()) return;
    same_as_kernel("sockinfo", "info ", sockinfo_sanity);
}

TEST_CASE("invalid arguments give the same results and errno as the kernel", "[bad-input]") {
    if (!library_ready()) return;
    same_as_kernel("bad-input", "probe ", probe_sanity);
}
