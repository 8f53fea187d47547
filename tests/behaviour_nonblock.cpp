// Non-blocking sockets, threads sharing a connection, and sendfile/splice:
// the peer checks every return value, errno and byte against the kernel's.
#include <catch2/catch.hpp>

#include "harness.hpp"

using namespace sdt;

namespace {

PairSpec scenario(const std::string &name, std::vector<std::string> extra = {},
                  const std::string &driver = "client") {
    PairSpec spec;
    spec.args = {"--scenario", name, "--driver", driver};
    spec.args.insert(spec.args.end(), extra.begin(), extra.end());
    return spec;
}

}  // namespace

// ---- non-blocking ------------------------------------------------------------------

TEST_CASE("O_NONBLOCK, FIONBIO and MSG_DONTWAIT give EAGAIN on an empty and on a full "
          "connection, partial counts in between, and O_NONBLOCK is shared by dups",
          "[nonblock]") {
    run_pair(scenario("nonblock-io"));
}

TEST_CASE("non-blocking connect: EINPROGRESS, then POLLOUT and SO_ERROR 0; to a closed port "
          "POLLERR|POLLHUP and ECONNREFUSED; the connection then runs as usual",
          "[nonblock]") {
    PairSpec spec = scenario("ready-data", {"--apis", "poll", "--conns", "2"});
    spec.client_args = {"--connect", "nonblock"};
    run_pair(spec);
}

TEST_CASE("non-blocking accept and accept4 give EAGAIN with nothing pending, then a "
          "connection once poll or epoll reports the listener readable",
          "[nonblock]") {
    PairSpec spec = scenario("ready-data", {"--apis", "epoll", "--conns", "2"});
    spec.server_args = {"--accept", "nonblock"};
    run_pair(spec);
}

// ---- threads -------------------------------------------------------------------------

TEST_CASE("a thread blocked in recv gets the answers to what another thread sends on the "
          "same socket",
          "[threads]") {
    run_pair(scenario("thread-recv"));
}

TEST_CASE("a thread blocked in recv before the connection earned its upgrade gets every byte, "
          "and the connection goes direct once it is back",
          "[threads]") {
    // The pause before the answer leaves time for both engines' builds and
    // an upgrade (a few hundred ms each, seconds on a loaded host): asked
    // while the reader sleeps in the kernel, the answer would go on the
    // fabric and the reader would never see it.
    PairSpec spec = scenario("earn-blocked-reader", {"--pause-us", "4000000"});
    // Empty: the library's default policy. The server asks first and the
    // client's ask, held back by its reader, comes 4 s later, then its
    // engine's build: past SDIRECT_PEER_WAIT_MS, by which the server
    // would have given up waiting.
    spec.env = {"SDIRECT_UPGRADE_AFTER_MS=", "SDIRECT_PEER_WAIT_MS=0"};
    run_pair(spec, [](Pair &pair, const Placement &pl) {
        if (!pl.client_preload || !pl.server_preload) return;
        // Both the earning (on TCP) and the upgrade happened.
        check_earned_then_direct(pair);
    });
}

TEST_CASE("close from another thread does not wake a blocked epoll_wait; shutdown(SHUT_RDWR) "
          "from another thread wakes a blocked select, poll and epoll_wait with IN|RDHUP|HUP",
          "[threads]") {
    run_pair(scenario("thread-wake", {"--parts", "close,shutdown,shutdown,shutdown", "--apis",
                                      "epoll,select,poll,epoll", "--conns", "4"}));
}

TEST_CASE("several threads each wait and do I/O on their own connection", "[threads]") {
    run_pair(scenario("wakeup-loop", {"--conns", "4", "--parallel", "1", "--apis",
                                      "poll,epoll,select,ppoll", "--rounds", "500"}));
}

TEST_CASE("several threads that each sleep on their own connection are woken by every answer "
          "at once, never by the safety net",
          "[threads]") {
    // No spin: every wait sleeps, and the answer's wake-up (the thread's
    // own, or the process doorbell's) is what ends it. A wake-up left to
    // the 200 ms safety net shows as a slow wait.
    PairSpec spec = scenario("wakeup-loop", {"--conns", "4", "--parallel", "1", "--apis",
                                             "poll,epoll,select,ppoll", "--rounds", "400",
                                             "--slow-ms", "150"});
    spec.env = {"SDIRECT_SPIN_US=0"};
    run_pair(spec);
}

TEST_CASE("no wake-up is lost: 1000 answers each wake a wait in poll, epoll and select",
          "[threads]") {
    run_pair(scenario("wakeup-loop", {"--conns", "3", "--apis", "poll,epoll,select",
                                      "--rounds", "1000"}));
}

TEST_CASE("no wake-up is lost when one thread sends and another waits for every answer",
          "[threads]") {
    run_pair(scenario("thread-wake-loop", {"--conns", "2", "--apis", "epoll,poll",
                                           "--rounds", "1000"}));
}

// ---- sendfile and splice ------------------------------------------------------------------

TEST_CASE("sendfile and sendfile64 send a regular file exactly, with and without an offset, "
          "with short counts at the end and while non-blocking",
          "[sendfile]") {
    run_pair(scenario("sendfile"));
}

TEST_CASE("splice moves bytes exactly from a pipe into a connection", "[sendfile]") {
    run_pair(scenario("splice", {"--part", "in"}));
}

TEST_CASE("splice moves bytes exactly from a connection into a pipe", "[sendfile]") {
    run_pair(scenario("splice", {"--part", "out"}));
}
