// The host registry and the control channel as other processes of the
// host meet them: requests that are refused, entries of dead processes,
// a registry name another user took first.
#include <catch2/catch.hpp>

#include "harness.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace sdt;

namespace {

// The library's control message (layout version 1, 184 bytes): magic,
// version, type, sender pid, connection id, generation, window, status,
// dumpable, the sender's 4-tuple (family, local port, peer port, pad,
// local address, peer address), fabric address, ring address and key.
struct CtlRequest {
    std::uint32_t magic = 0x54434453;
    std::uint16_t version = 4;  // kCtlVersion
    std::uint16_t type = 1;  // upgrade request
    std::int32_t pid = 0;
    std::uint32_t conn_id = 1, gen = 1, window = 1u << 20, status = 0, dumpable = 1;
    std::uint16_t family = AF_INET, local_port = 0, peer_port = 0, pad = 0;
    std::uint8_t local_addr[16] = {}, peer_addr[16] = {};
    char addr[96] = {};
    std::uint64_t ring_addr = 0, ring_key = 0;
};
static_assert(sizeof(CtlRequest) == 184);

int connect_v4(std::uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
        close(fd);
        return -1;
    }
    timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

bool exchange(int fd, const char *out, std::size_t n, const char *expect) {
    if (write(fd, out, n) != ssize_t(n)) return false;
    std::string got(n, '\0');
    std::size_t have = 0;
    while (have < n) {
        ssize_t r = read(fd, got.data() + have, n - have);
        if (r <= 0) return false;
        have += std::size_t(r);
    }
    return got == expect;
}

// Sends an upgrade request for connection `tcp` (its own socket as proof,
// an eventfd as doorbell) with the fabric address `addr`; the answer's
// status, or -1 if none came.
long ask_upgrade(const std::string &ctl, int tcp, const char *addr) {
    CtlRequest req;
    req.pid = getpid();
    sockaddr_in l{}, p{};
    socklen_t ll = sizeof l, pl = sizeof p;
    getsockname(tcp, reinterpret_cast<sockaddr *>(&l), &ll);
    getpeername(tcp, reinterpret_cast<sockaddr *>(&p), &pl);
    req.local_port = ntohs(l.sin_port);
    req.peer_port = ntohs(p.sin_port);
    std::memcpy(req.local_addr, &l.sin_addr, 4);
    std::memcpy(req.peer_addr, &p.sin_addr, 4);
    std::snprintf(req.addr, sizeof req.addr, "%s", addr);
    int bell = eventfd(0, EFD_CLOEXEC);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    timeval tv{5, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::snprintf(sa.sun_path, sizeof sa.sun_path, "%s", ctl.c_str());
    long status = -1;
    if (connect(s, reinterpret_cast<sockaddr *>(&sa), sizeof sa) == 0) {
        iovec iov{&req, sizeof req};
        alignas(cmsghdr) char cbuf[CMSG_SPACE(2 * sizeof(int))] = {};
        msghdr mh{};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = cbuf;
        mh.msg_controllen = sizeof cbuf;
        cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(2 * sizeof(int));
        const int fds[2] = {tcp, bell};
        std::memcpy(CMSG_DATA(cm), fds, sizeof fds);
        CtlRequest rep;
        if (sendmsg(s, &mh, MSG_NOSIGNAL) == ssize_t(sizeof req) &&
            recv(s, &rep, sizeof rep, 0) == ssize_t(sizeof rep))
            status = long(rep.status);
    }
    close(s);
    close(bell);
    return status;
}

int open_fds(pid_t pid) {
    return int(dir_entries("/proc/" + std::to_string(pid) + "/fd").size());
}

// A pid that no process has now: a child that has exited and been reaped.
pid_t dead_pid() {
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    int status = 0;
    waitpid(pid, &status, 0);
    return pid;
}

void plant_entry(const std::string &path, pid_t pid) {
    struct {
        std::uint32_t magic = 0x45524453, version = 1;
        std::int32_t pid;
        std::uint32_t conn_id = 0, gen = 1, acceptor = 0;
        char addr[96] = "fi_shm://nobody";
        std::uint64_t pad = 0;
    } e;
    static_assert(sizeof e == 128);
    e.pid = pid;
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char *>(&e), sizeof e);
}

// The connections' entries in registry `reg` (names "c-...").
std::vector<std::string> conn_entries(const std::string &reg) {
    std::vector<std::string> left;
    for (const std::string &n : dir_entries(reg))
        if (n.rfind("c-", 0) == 0) left.push_back(n);
    return left;
}

// A forking server (a child per connection serves it, the server closes
// its copy at once) and its client, both preloaded: 20 short connections
// that end before they earn their upgrade (5 s here), run to their end.
Pair run_forking_server(const Scratch &scratch, const std::string &tag) {
    PairSpec spec;
    spec.args = {"--scenario", "pingpong", "--rounds", "3", "--conns", "20"};
    spec.server_args = {"--fork-serve", "1"};
    spec.env = {"SDIRECT_UPGRADE_AFTER_MS=5000"};
    spec.check_modes = false;
    Pair pair = run_pair_once(scratch, spec, placements()[0], tag);
    // Every connection stayed on TCP, as the case needs: none asked for
    // an upgrade, so neither end built an engine (no statistics at all).
    for (const Proc *p : {&pair.client, &pair.server}) {
        INFO("statistics:\n" << read_text(p->stats));
        CHECK(conn_stats(*p).empty());
    }
    return pair;
}

bool is_ours_0700(const std::string &dir) {
    struct stat st;
    return lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == getuid() &&
           (st.st_mode & 0777) == 0700;
}

}  // namespace

TEST_CASE("an upgrade request whose fabric address is refused leaves no fd behind",
          "[registry]") {
    if (config() == Config::kernel || !library_ready()) {
        note_skip("the library's control channel");
        return;
    }
    constexpr int kRequests = 40;
    Scratch scratch;
    const std::string port_file = scratch.file("victim.port");
    Launch v{"victim", {"server", port_file, "--scenario", "bulk", "--conns",
                        std::to_string(kRequests), "--watchdog", "60"},
             true};
    Proc victim = spawn(scratch, v);
    const std::uint16_t port = wait_port(port_file, victim, 20);
    REQUIRE(port != 0);
    const std::string ctl = scratch.registry() + "/ctl-" + std::to_string(victim.pid);
    int baseline = -1, last = -1;
    std::vector<long> statuses;
    for (int i = 0; i < kRequests; ++i) {
        INFO("request " << i);
        int tcp = connect_v4(port);
        INFO("connect: " << (tcp < 0 ? std::strerror(errno) : "done"));
        if (tcp < 0) poll_exit(victim);
        INFO(describe(victim));
        REQUIRE(tcp >= 0);
        REQUIRE(exchange(tcp, "SDHELLO1", 8, "SDHELLO2"));
        // accept() waited for the engine: its control socket is there.
        REQUIRE(access(ctl.c_str(), F_OK) == 0);
        // shm names its regions after the address: a slash is refused.
        char addr[64];
        std::snprintf(addr, sizeof addr, "fi_shm://no/such-%d", i);
        statuses.push_back(ask_upgrade(ctl, tcp, addr));
        REQUIRE(exchange(tcp, "q", 1, "q"));
        // Counted with this connection open, once the control thread is
        // done with the request (it closes its end after answering).
        if (i == 2) {
            sleep_s(0.2);
            baseline = open_fds(victim.pid);
        }
        for (int t = 0; i == kRequests - 1 && t < 100; ++t) {
            last = open_fds(victim.pid);
            if (last <= baseline + 1) break;
            sleep_s(0.02);
        }
        close(tcp);
    }
    wait_exit(victim, 30);
    INFO(describe(victim));
    CHECK(exited_with(victim, 0));
    INFO("victim fds with one connection open: " << baseline << " after 3 requests, " << last
                                                 << " after " << kRequests);
    // One more at most: a thread's wake-up eventfd is made at its first
    // sleep, which may come after the baseline (a leak was one per request).
    CHECK(last <= baseline + 1);
    for (long s : statuses) CHECK(s > 0);  // refused, never accepted
    // Every connection stayed on the kernel, for the refusal's reason.
    const auto stats = conn_stats(victim);
    INFO("statistics file:\n" << read_text(victim.stats));
    REQUIRE(stats.size() == std::size_t(kRequests));
    for (const StatLine &s : stats) {
        INFO(s.text);
        CHECK(s.mode == "kernel");
        CHECK(s.reason == "av_full");
    }
}

TEST_CASE("registry entries of dead processes are removed when an engine starts",
          "[registry]") {
    if (config() != Config::direct || !library_ready()) {
        note_skip("the library's registry (one preloaded process: the direct configuration)");
        return;
    }
    Scratch scratch;
    const std::string reg = scratch.registry();
    const pid_t gone = dead_pid();
    const std::string tuple = "-1-2-7f000001.40000-7f000001.";
    for (int i = 0; i < 100; ++i) plant_entry(reg + "/c-1" + tuple + std::to_string(i), gone);
    // A temporary file of a writer that died before its rename.
    plant_entry(reg + "/c-1" + tuple + "8." + std::to_string(gone) + ".tmp", gone);
    // A live process's entry stays: ours.
    const std::string live = reg + "/c-1" + tuple + "live";
    plant_entry(live, getpid());
    Launch l{"local", {"local", "--scenario", "bulk", "--size", "65536", "--settle-ms",
                       settle_ms()},
             true};
    Proc p = spawn(scratch, l);
    wait_exit(p, 60);
    INFO(describe(p));
    REQUIRE(exited_with(p, 0));
    const std::vector<std::string> left = conn_entries(reg);
    INFO("entries left: " << left.size() << (left.empty() ? "" : ", first " + left[0]));
    REQUIRE(left.size() == 1);
    CHECK(reg + "/" + left[0] == live);
    // The process ran as always: its in-process connection went direct.
    const auto stats = conn_stats(p);
    INFO("statistics file:\n" << read_text(p.stats));
    REQUIRE(stats.size() == 2);
    for (const StatLine &s : stats) CHECK(s.mode == "direct");
}

TEST_CASE("a registry name another user created first is passed over, and connections go "
          "direct",
          "[registry]") {
    if (config() == Config::kernel || !library_ready()) {
        note_skip("a setting of the library");
        return;
    }
    if (getuid() != 0) {
        note_skip("making a directory another user owns needs root");
        return;
    }
    struct Squat {
        const char *what;
        std::function<void(const std::string &, const Scratch &)> make;
    };
    const Squat squats[] = {
        {"a directory of uid 65534, mode 0700",
         [](const std::string &d, const Scratch &) {
             mkdir(d.c_str(), 0700);
             REQUIRE(chown(d.c_str(), 65534, 65534) == 0);
         }},
        {"a directory of uid 65534, mode 0777",
         [](const std::string &d, const Scratch &) {
             mkdir(d.c_str(), 0700);
             chmod(d.c_str(), 0777);
             REQUIRE(chown(d.c_str(), 65534, 65534) == 0);
         }},
        {"a symlink to a directory of ours",
         [](const std::string &d, const Scratch &s) {
             mkdir(s.file("elsewhere").c_str(), 0700);
             REQUIRE(symlink(s.file("elsewhere").c_str(), d.c_str()) == 0);
         }},
    };
    for (const Squat &squat : squats) {
        INFO("the registry's name was taken by " << squat.what);
        Scratch taken;
        const std::string base = taken.file("sdirect-reg");
        squat.make(base, taken);
        // The first fallback name is taken too: the next one serves.
        mkdir((base + "-1").c_str(), 0700);
        REQUIRE(chown((base + "-1").c_str(), 65534, 65534) == 0);
        PairSpec spec;
        spec.args = {"--scenario", "bulk", "--size", "262144"};
        spec.env = {"SDIRECT_REGISTRY=" + base};
        spec.timeout = 60;
        run_pair(spec, [&](Pair &pair, const Placement &) {
            check_byte_counts(pair.server);
            check_byte_counts(pair.client);
        });
        CHECK(is_ours_0700(base + "-2"));
        std::string where = base;
        struct stat st;
        if (lstat(base.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) where = taken.file("elsewhere");
        INFO("entries in the squatted name: " << dir_entries(where).size());
        CHECK(dir_entries(where).empty());
        CHECK(dir_entries(base + "-1").empty());
    }
}

TEST_CASE("a forking server that lives on leaves no registry entry behind for connections "
          "its children served on TCP",
          "[registry]") {
    if (config() != Config::direct) {
        note_skip("needs both ends preloaded");
        return;
    }
    // A child per connection serves it (a short exchange: the connection
    // ends before it earns its upgrade) while the server closes its copy
    // at once: each fork wrote the entry that says the socket is shared,
    // and nothing removed it until the server ended (a postmaster with
    // pgbench -C: one per connection).
    Scratch scratch;
    const Pair pair = run_forking_server(scratch, "forking");
    // Nothing has swept the registry since (no engine started after them).
    const std::vector<std::string> left = conn_entries(scratch.registry());
    INFO("entries left: " << left.size() << (left.empty() ? "" : ", first " + left[0]));
    INFO(describe(pair.server));
    INFO(describe(pair.client));
    // At most the last connection's, whose child may still be closing
    // (both holders closing at once may each see the other).
    CHECK(left.size() <= 2);
}

TEST_CASE("a forking server whose children serve short connections writes no registry entry "
          "for them",
          "[registry]") {
    if (config() != Config::direct) {
        note_skip("needs both ends preloaded");
        return;
    }
    // As above, watched as it happens: the entry that tells a waiting peer
    // the socket is shared is written only once the peer may be asking
    // (the connection has earned its time); a child alone once its parent
    // closed would only remove it. Each fork wrote one, and each child's
    // first I/O removed it: nine system calls per connection.
    Scratch scratch;
    const int watch = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    REQUIRE(watch >= 0);
    REQUIRE(inotify_add_watch(watch, scratch.registry().c_str(),
                              IN_CREATE | IN_MOVED_TO | IN_DELETE) >= 0);
    run_forking_server(scratch, "forking-quiet");
    std::vector<std::string> names;
    alignas(inotify_event) char buf[8192];
    for (ssize_t n; (n = read(watch, buf, sizeof buf)) > 0;)
        for (char *at = buf; at < buf + n;) {
            auto *ev = reinterpret_cast<inotify_event *>(at);
            names.push_back(ev->len ? std::string(ev->name) : std::string("?"));
            at += sizeof(inotify_event) + ev->len;
        }
    close(watch);
    INFO("registry events: " << names.size() << (names.empty() ? "" : ", first " + names[0]));
    CHECK(names.empty());
}
