// Readiness: poll, ppoll and their FORTIFY variants, select, pselect and
// epoll see exactly what the kernel shows for a connection, wake when it
// changes, and keep their timeouts, signal and mask semantics. The peer
// checks every answer against the kernel's (see peer_ready.hpp).
#include <catch2/catch.hpp>

#include "harness.hpp"

#include <csignal>

using namespace sdt;

namespace {

PairSpec scenario(const std::string &name, const std::string &apis,
                  const std::string &driver = "client") {
    PairSpec spec;
    spec.args = {"--scenario", name, "--apis", apis, "--driver", driver};
    return spec;
}

void run(const std::string &name, const std::string &apis) { run_pair(scenario(name, apis)); }

// One connection per part, in order; the first failure ends the run.
void run_parts(const std::string &name, const std::vector<std::string> &parts) {
    std::string list;
    for (const std::string &p : parts) list += (list.empty() ? "" : ",") + p;
    PairSpec spec = scenario(name, "epoll");
    spec.args.insert(spec.args.end(), {"--parts", list, "--conns", std::to_string(parts.size())});
    run_pair(spec);
}

// Connected and accepted sockets: the accepting side runs a subset.
void both_ends(const std::string &name, const std::string &apis,
               const std::string &server_apis) {
    {
        INFO("driver client");
        if (!run_pair(scenario(name, apis, "client"))) return;
    }
    INFO("driver server");
    run_pair(scenario(name, server_apis, "server"));
}

// Scenarios that end their connection: one connection per call.
void per_connection(const std::string &name, const std::string &apis, int calls) {
    PairSpec spec = scenario(name, apis);
    spec.args.insert(spec.args.end(), {"--conns", std::to_string(calls)});
    run_pair(spec);
}

// The modes of the two connections of "ready-reused-fd", from a
// preloaded end's statistics. Connection 2 ran as the placement says
// (direct, or on the kernel with no_peer); so did connection 1 on the
// kernel. With both ends preloaded connection 1 went direct before the
// fork; sharing it with the child may have taken it back to the kernel
// (reason shared), and the child's use of it (part hangup) direct again.
void check_reused_fd_modes(const Proc &p, Expect expect) {
    if (!p.preloaded || expect == Expect::nothing) return;
    const std::vector<StatLine> stats = read_stats(p.stats);
    const std::vector<ConnLine> conns = conns_of(p);
    INFO(describe(p));
    INFO("statistics file:\n" << read_text(p.stats));
    REQUIRE(conns.size() == 2);
    for (std::size_t i = 0; i < conns.size(); ++i) {
        const ConnLine &c = conns[i];
        INFO("connection " << i + 1 << ": pid " << c.pid << " " << c.local << " -> " << c.peer);
        const StatLine *s = find_stat(stats, c.pid, c.local, c.peer);
        REQUIRE(s != nullptr);
        INFO(s->text);
        if (expect == Expect::kernel_no_peer) {
            CHECK(s->mode == "kernel");
            CHECK(s->reason == "no_peer");
        } else if (i == 0) {
            CHECK(s->num("upgrades") >= 1);
            CHECK(s->num("tx_fabric") + s->num("rx_fabric") > 0);
            CHECK(((s->mode == "direct" && s->reason == "none") ||
                   (s->mode == "kernel" && s->reason == "shared")));
        } else {
            CHECK(s->mode == "direct");
            CHECK(s->reason == "none");
        }
    }
}

// The client waits with `api`; the harness kills the responding server
// with SIGKILL while 1000 bytes it never read sit in its socket.
void killed_with_unread_data(const std::string &api) {
    const auto pls = placements();
    for (const Placement &pl : pls) {
        Scratch scratch;
        Pair pair = start_pair(scratch, scenario("ready-death", api), pl, "death");
        INFO("placement: " << pl.label());
        REQUIRE(pair.port != 0);
        const bool ready = wait_for_text(pair.server.out, "ready", 20);
        sleep_s(0.2);  // the client is blocked in its wait by now
        signal_proc(pair.server, SIGKILL);
        wait_exit(pair.client, 30);
        wait_exit(pair.server, 10);
        INFO(describe(pair.server));
        INFO(describe(pair.client));
        REQUIRE(ready);
        CHECK(killed_by(pair.server, SIGKILL));
        if (exited_with(pair.client, 77)) {
            note_skip(skip_reason(pair.client));
            return;
        }
        REQUIRE(exited_with(pair.client, 0));
        check_modes(pair.client, pl.expect(false));
    }
}

}  // namespace

// ---- poll, ppoll, __poll_chk, __ppoll_chk -----------------------------------------

TEST_CASE("poll, ppoll and their FORTIFY variants report POLLOUT on a fresh connection, "
          "POLLIN only once data arrives, and keep timeouts of 0, 100 ms and none",
          "[poll]") {
    both_ends("ready-data", "poll,poll_chk,ppoll,ppoll_chk", "poll,ppoll_chk");
}

TEST_CASE("poll: POLLOUT goes away while the peer does not read and the window is full, "
          "and comes back when the peer drains it",
          "[poll]") {
    per_connection("ready-window", "poll,ppoll_chk", 2);
}

TEST_CASE("poll: the peer's shutdown(SHUT_WR) gives POLLIN|POLLRDHUP, and shutting our side "
          "too adds POLLHUP",
          "[poll]") {
    per_connection("ready-rdhup", "poll,poll_chk,ppoll,ppoll_chk", 4);
}

TEST_CASE("poll: a peer that closes with unread data gives POLLERR|POLLHUP, then "
          "ECONNRESET, then EOF",
          "[poll]") {
    per_connection("ready-reset", "poll,poll_chk,ppoll,ppoll_chk", 4);
}

TEST_CASE("a peer killed with unread data wakes a blocked poll with POLLERR|POLLHUP",
          "[poll]") {
    killed_with_unread_data("poll");
}

TEST_CASE("a signal interrupts poll and ppoll with EINTR, with SA_RESTART too", "[poll]") {
    run("ready-eintr", "poll,poll_chk,ppoll,ppoll_chk");
}

TEST_CASE("ppoll's signal mask decides whether a signal interrupts the wait", "[poll]") {
    run("ready-sigmask", "ppoll,ppoll_chk");
}

TEST_CASE("poll over a connection, a pipe, an eventfd, a timerfd, UDP and Unix sockets and a "
          "listener reports exactly the ready fds",
          "[poll]") {
    run("ready-mixed", "poll,poll_chk,ppoll,ppoll_chk");
}

// The server polls connection 1 with nothing sent (the poll sleeps), hands
// it to a forked child that keeps it open, closes its own fd and accepts
// connection 2, which gets the same fd number and may get the socket
// object the library had for connection 1. A poll on connection 2 must
// watch connection 2's socket, not connection 1's, alive in the child:
// the data sent 200 ms into it ends it at once (a poll that watched
// connection 1's socket slept through it until its timeout, on the kernel:
// mixed, the server preloaded), and connection 1's hang-up during it is
// not reported for connection 2 (part hangup).
TEST_CASE("poll on a connection accepted on the fd number of one a forked child still holds "
          "wakes for the new connection's data and not for the old one's hang-up",
          "[poll]") {
    for (const std::string part : {"data", "hangup"}) {
        DYNAMIC_SECTION("part " << part) {
            PairSpec spec = scenario("ready-reused-fd", "poll", "server");
            spec.args.insert(spec.args.end(), {"--part", part, "--conns", "2"});
            spec.client_args = {"--parallel", "1"};
            spec.check_modes = false;
            const bool ran = run_pair(spec, [](Pair &pair, const Placement &pl) {
                check_reused_fd_modes(pair.server, pl.expect(true));
                check_reused_fd_modes(pair.client, pl.expect(false));
            });
            if (!ran) return;
        }
    }
}

// ---- select, pselect ------------------------------------------------------------------

TEST_CASE("select and pselect report a fresh connection writable, readable only once data "
          "arrives, and keep timeouts of 0, 100 ms and none",
          "[select]") {
    run("ready-data", "select,pselect");
}

TEST_CASE("select: a full window is not writable until the peer drains it", "[select]") {
    per_connection("ready-window", "select,pselect", 2);
}

TEST_CASE("select: the peer's shutdown(SHUT_WR) and then our own leave the socket readable "
          "and writable",
          "[select]") {
    per_connection("ready-rdhup", "select,pselect", 2);
}

TEST_CASE("select: a peer that closes with unread data makes the socket readable and "
          "writable, and recv gives ECONNRESET",
          "[select]") {
    per_connection("ready-reset", "select,pselect", 2);
}

TEST_CASE("a peer killed with unread data wakes a blocked select", "[select]") {
    killed_with_unread_data("select");
}

TEST_CASE("a signal interrupts select and pselect with EINTR, with SA_RESTART too",
          "[select]") {
    run("ready-eintr", "select,pselect");
}

TEST_CASE("pselect's signal mask decides whether a signal interrupts the wait", "[select]") {
    run("ready-sigmask", "pselect");
}

TEST_CASE("select over a connection, a pipe, an eventfd, a timerfd, UDP and Unix sockets "
          "and a listener reports exactly the ready fds",
          "[select]") {
    run("ready-mixed", "select,pselect");
}

// ---- epoll ------------------------------------------------------------------------------

TEST_CASE("epoll_wait and epoll_pwait report EPOLLOUT on a fresh connection, EPOLLIN only "
          "once data arrives, and keep timeouts of 0, 100 ms and none",
          "[epoll]") {
    run("ready-data", "epoll,epoll_pwait");
}

TEST_CASE("epoll: EPOLLOUT goes away while the window is full and comes back when the peer "
          "drains it",
          "[epoll]") {
    per_connection("ready-window", "epoll", 1);
}

TEST_CASE("epoll: the peer's shutdown(SHUT_WR) gives EPOLLIN|EPOLLRDHUP, and shutting our "
          "side too adds EPOLLHUP",
          "[epoll]") {
    per_connection("ready-rdhup", "epoll,epoll_pwait", 2);
}

TEST_CASE("epoll: a peer that closes with unread data gives EPOLLERR|EPOLLHUP, then "
          "ECONNRESET",
          "[epoll]") {
    per_connection("ready-reset", "epoll,epoll_pwait", 2);
}

TEST_CASE("a peer killed with unread data wakes a blocked epoll_wait with EPOLLERR|EPOLLHUP",
          "[epoll]") {
    killed_with_unread_data("epoll");
}

TEST_CASE("a signal interrupts epoll_wait and epoll_pwait with EINTR, with SA_RESTART too",
          "[epoll]") {
    run("ready-eintr", "epoll,epoll_pwait");
}

TEST_CASE("epoll_pwait's signal mask decides whether a signal interrupts the wait",
          "[epoll]") {
    run("ready-sigmask", "epoll_pwait");
}

TEST_CASE("epoll_pwait2 keeps timespec timeouts and its signal mask", "[epoll]") {
    if (!run_pair(scenario("ready-data", "epoll_pwait2"))) return;
    run("ready-sigmask", "epoll_pwait2");
}

TEST_CASE("epoll over a connection, a pipe, an eventfd, a timerfd, UDP and Unix sockets and "
          "a listener reports exactly the ready fds",
          "[epoll]") {
    run("ready-mixed", "epoll,epoll_pwait");
}

TEST_CASE("epoll triggering: level-triggered entries report until the data is read, EPOLLET "
          "each arrival once, EPOLLONESHOT once until EPOLL_CTL_MOD rearms it, EPOLLEXCLUSIVE "
          "only through EPOLL_CTL_ADD",
          "[epoll]") {
    run_parts("epoll-modes", {"level", "edge", "oneshot", "exclusive"});
}

TEST_CASE("one socket in two epoll sets keeps its own mode in each; data.u64 and data.fd come "
          "back verbatim; maxevents 1 takes ready entries in turns",
          "[epoll]") {
    run_parts("epoll-modes", {"two-sets", "data"});
}

TEST_CASE("epoll_create, epoll_ctl and epoll_wait fail exactly as the kernel's do",
          "[epoll]") {
    run("epoll-errors", "epoll");
}

TEST_CASE("an epoll fd inside another epoll set, inside poll and inside select wakes with "
          "the connection",
          "[epoll]") {
    run("epoll-nested", "epoll");
}

TEST_CASE("epoll_ctl from another thread: ADD of a readable socket or of one that becomes "
          "readable, and MOD, wake a blocked epoll_wait; DEL silences it",
          "[epoll]") {
    run_parts("epoll-thread-ctl", {"add-ready", "add-then-ready", "mod", "del"});
}

TEST_CASE("an epoll registration belongs to the open file: it outlives a closed registered fd "
          "while a dup is open and goes with the last reference",
          "[epoll]") {
    run_parts("epoll-close", {"dup", "original"});
}

// ---- epoll_wait asleep across an upgrade ---------------------------------------------
// Under the earn policy a wait on sockets still earning their upgrade is
// the kernel's own epoll_wait (the peer checks the system call the thread
// sleeps in); the upgrades below happen while it sleeps.

namespace {

// Scenario epoll-earn-sleep: the driving end (`server_drives`: the
// accepting one) sleeps in epoll_wait while the connection earns its
// upgrade, then gets the answer sent once it is direct. `env`: the
// policies of both ends, `client_env`: the client's own.
void earn_sleep(bool server_drives, std::vector<std::string> env,
                std::vector<std::string> client_env) {
    PairSpec spec = scenario("epoll-earn-sleep", "epoll");
    if (server_drives) spec.args.insert(spec.args.end(), {"--driver", "server"});
    spec.env = std::move(env);
    spec.client_env = std::move(client_env);
    spec.timeout = 90;
    if (config() == Config::direct)
        (server_drives ? spec.server_args : spec.client_args) = {"--await-direct", "1"};
    run_pair(spec, [](Pair &pair, const Placement &pl) {
        if (!pl.client_preload || !pl.server_preload) return;
        // On TCP first, direct after: bytes both ways on each.
        check_earned_then_direct(pair);
    });
}

}  // namespace

TEST_CASE("a thread asleep in epoll_wait on a connection still earning its upgrade sleeps in "
          "the kernel's epoll_wait, and gets the readiness of an answer sent after the "
          "connection went direct, and every byte",
          "[epoll]") {
    // Longer than the settle (100 ms of ping-pong): still earning when the
    // scenario starts.
    earn_sleep(false, {"SDIRECT_UPGRADE_AFTER_MS=1000"}, {});
}

// The other way round: the accepting end asked at once (the harness's
// SDIRECT_UPGRADE_AFTER_MS=0) and waits for its peer, which asks only
// after a second; the acceptor's thread sleeps in epoll_wait on the
// connection meanwhile (its set's entry rests until the connection's
// state moves), and must be woken by the answer sent once it is direct.
TEST_CASE("a thread asleep in epoll_wait on an accepted connection that waits for its peer's "
          "upgrade gets the readiness of an answer sent after the peer asked and the "
          "connection went direct, and every byte",
          "[epoll]") {
    earn_sleep(true, {}, {"SDIRECT_UPGRADE_AFTER_MS=1000"});
}

TEST_CASE("a thread asleep in the kernel's epoll_wait on an earning connection is woken for a "
          "direct socket another thread adds to the set, and gets its readiness and bytes",
          "[epoll]") {
    PairSpec spec = scenario("epoll-add-direct", "epoll");
    spec.args.insert(spec.args.end(), {"--conns", "2", "--parallel", "1"});
    spec.env = {"SDIRECT_UPGRADE_AFTER_MS=1000"};
    spec.timeout = 90;
    if (config() == Config::direct) spec.client_args = {"--await-direct", "1"};
    run_pair(spec, [](Pair &pair, const Placement &pl) {
        if (!pl.client_preload || !pl.server_preload) return;
        for (const Proc *p : {&pair.client, &pair.server}) {
            const std::vector<StatLine> stats = conn_stats(*p);
            INFO(describe(*p));
            INFO("statistics file:\n" << read_text(p->stats));
            REQUIRE(stats.size() == 2);
            for (const StatLine &st : stats) {
                CHECK(st.mode == "direct");
                CHECK(st.num("rx_fabric") > 0);
                CHECK(st.num("tx_fabric") > 0);
            }
        }
    });
}

// ---- a process of one thread -------------------------------------------------
// While its only thread sleeps, nobody can ask for an upgrade, attach a
// socket or change a set: its waits on connections that have not asked
// are the kernel's, with no wake-up fd of the library's. A second thread
// (started and ended before) brings them back. The driver checks the
// eventfds it holds at the end.

TEST_CASE("a process of one thread waits in epoll_wait and poll on a connection that has not "
          "asked for its upgrade with no eventfd of the library's, and gets every answer; "
          "once it has had a second thread, its waits hold one",
          "[epoll]") {
    for (const bool thread : {false, true}) {
        DYNAMIC_SECTION((thread ? "after a second thread" : "one thread")) {
            PairSpec spec = scenario("alone-waits", "epoll");
            spec.client_args = {"--thread", thread ? "1" : "0", "--eventfds", "check"};
            // Never earns its upgrade: no engine, whose threads would count.
            spec.env = {"SDIRECT_UPGRADE_AFTER_MS=600000"};
            spec.check_modes = false;
            run_pair(spec, [](Pair &pair, const Placement &pl) {
                // Never asked: no connection of either end went direct.
                for (const Proc *p : {&pair.client, &pair.server}) {
                    if (p == &pair.client ? !pl.client_preload : !pl.server_preload) continue;
                    INFO(describe(*p));
                    for (const StatLine &st : conn_stats(*p)) CHECK(st.mode != "direct");
                }
            });
        }
    }
}
