// Receive and send flags, ioctls, timeouts and signals: each scenario's
// peer checks the exact return values and errno the kernel gives.
#include <catch2/catch.hpp>

#include "harness.hpp"

using namespace sdt;

namespace {

PairSpec scenario(const char *name, const char *driver = "client") {
    PairSpec spec;
    spec.args = {"--scenario", name, "--driver", driver};
    return spec;
}

// The same scenario with either end of the connection as the checking side.
void both_ends(const char *name) {
    for (const char *driver : {"client", "server"}) {
        INFO("driver " << driver);
        if (!run_pair(scenario(name, driver))) return;
    }
}

}  // namespace

TEST_CASE("MSG_PEEK returns the same bytes the next read returns", "[recv-flags]") {
    both_ends("peek");
}

TEST_CASE("MSG_WAITALL fills the whole buffer from many small sends", "[recv-flags]") {
    both_ends("waitall");
}

TEST_CASE("MSG_DONTWAIT on an empty socket fails with EAGAIN", "[recv-flags]") {
    both_ends("dontwait");
}

TEST_CASE("send with MSG_DONTWAIT on a full connection fails with EAGAIN and loses nothing",
          "[recv-flags]") {
    run_pair(scenario("send-dontwait"));
}

TEST_CASE("small MSG_DONTWAIT sends on a full connection arrive without a later send",
          "[recv-flags]") {
    // Small sends accepted while the window is shut must go out when it
    // opens: the responder acknowledges only after the very last byte.
    PairSpec spec = scenario("send-dontwait");
    spec.args.insert(spec.args.end(), {"--size", std::to_string((4u << 20) + 333), "--piece", "1000",
                                       "--reader-delay-us", "2000000"});
    run_pair(spec);
}

TEST_CASE("tiny MSG_DONTWAIT sends to a reader that does not read fail with EAGAIN at once "
          "when the connection is full",
          "[recv-flags]") {
    // 100-byte sends are one message each: the peer's message queue fills
    // twenty times over before the window does, and the reader calls
    // nothing meanwhile.
    PairSpec spec = scenario("send-dontwait");
    spec.args.insert(spec.args.end(), {"--size", std::to_string((3u << 20) + 77), "--piece", "100",
                                       "--reader-delay-us", "2000000"});
    run_pair(spec);
}

TEST_CASE("FIONREAD reports exactly the unread bytes", "[recv-flags]") {
    both_ends("fionread");
}

TEST_CASE("FIONBIO and O_NONBLOCK make reads on an empty socket fail with EAGAIN",
          "[recv-flags]") {
    both_ends("nonblock");
}

TEST_CASE("SO_RCVTIMEO makes a receive on an empty socket fail with EAGAIN after the timeout",
          "[timeouts]") {
    both_ends("rcvtimeo");
}

TEST_CASE("a signal without SA_RESTART interrupts a blocked recv with EINTR; with SA_RESTART "
          "the recv goes on and gets the data",
          "[signals]") {
    both_ends("eintr");
}
