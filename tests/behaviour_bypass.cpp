// Paths around the library's socket calls: none may lose, duplicate or
// misroute a byte, or hang. Each case runs in every configuration; the
// peers check every byte and count, the statistics the mode.
#include <catch2/catch.hpp>

#include "harness.hpp"

using namespace sdt;

namespace {

PairSpec part(const std::string &name, std::vector<std::string> extra = {}) {
    PairSpec spec;
    spec.args = {"--scenario", "bypass", "--part", name};
    spec.args.insert(spec.args.end(), extra.begin(), extra.end());
    spec.timeout = 60;
    return spec;
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

TEST_CASE("close_range and closefrom close a connection's fds as close() does: EBADF after, a "
          "file that gets the number is a file, CLOSE_RANGE_CLOEXEC closes nothing, the last fd "
          "ends the stream",
          "[bypass]") {
    run_pair(part("close-range"));
}

TEST_CASE("sendmmsg and recvmmsg move every message through the connection: counts, lengths, "
          "MSG_WAITFORONE, the timeout, short counts and EAGAIN as the kernel gives them",
          "[bypass]") {
    run_pair(part("mmsg"));
}
