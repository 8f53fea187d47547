#include "harness.hpp"

#include <catch2/catch.hpp>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

namespace sdt {

// ---- configuration and skips -------------------------------------------------

Config config() {
    const char *c = std::getenv("SDIRECT_TEST_CONFIG");
    std::string v = c ? c : "kernel";
    if (v == "direct") return Config::direct;
    if (v == "mixed") return Config::mixed;
    return Config::kernel;
}

bool undumpable() {
    const char *u = std::getenv("SDIRECT_TEST_UNDUMPABLE");
    return u && *u == '1';
}

const char *config_name() {
    switch (config()) {
    case Config::kernel: return "kernel";
    case Config::direct: return "direct";
    case Config::mixed: return "mixed";
    }
    return "?";
}

namespace {
int cases_run = 0;
int cases_skipped = 0;
bool current_skipped = false;
}  // namespace

void note_skip(const std::string &reason) {
    if (!current_skipped) {
        std::printf("SKIPPED: %s [%s]: %s\n",
                    Catch::getResultCapture().getCurrentTestName().c_str(), config_name(),
                    reason.c_str());
        std::fflush(stdout);
    }
    current_skipped = true;
}

void case_started() {
    current_skipped = false;
    ++cases_run;
}

void case_ended() {
    if (current_skipped) ++cases_skipped;
}

bool all_skipped() { return cases_run > 0 && cases_skipped == cases_run; }

std::string peer_path() {
    const char *p = std::getenv("SDIRECT_TEST_PEER");
    return p ? p : "";
}

std::string lib_path() {
    const char *p = std::getenv("SDIRECT_TEST_LIB");
    return p && *p && access(p, R_OK) == 0 ? p : "";
}

bool library_ready() {
    if (config() == Config::kernel) return true;
    if (!lib_path().empty()) return true;
    note_skip("libsdirect.so is not built (SDIRECT_TEST_LIB unset or missing)");
    return false;
}

double now_s() {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}

void sleep_s(double s) {
    timespec ts{time_t(s), long((s - double(time_t(s))) * 1e9)};
    for (int i = 0; i < 100 && nanosleep(&ts, &ts) != 0 && errno == EINTR; ++i) {
    }
}

// ---- scratch directory ---------------------------------------------------------

Scratch::Scratch() {
    const char *base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/sdirect-test-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) FAIL("mkdtemp " << tmpl << ": " << std::strerror(errno));
    dir_ = buf.data();
    registry_ = dir_ + "/registry";
    if (mkdir(registry_.c_str(), 0700) != 0) FAIL("mkdir " << registry_);
}

Scratch::~Scratch() {
    const char *keep = std::getenv("SDIRECT_TEST_KEEP");
    if (keep && *keep == '1') {
        std::printf("kept %s\n", dir_.c_str());
        return;
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
}

// ---- processes ---------------------------------------------------------------------

namespace {

bool is_library_var(const char *entry) {
    return std::strncmp(entry, "SDIRECT_", 8) == 0 || std::strncmp(entry, "LD_PRELOAD=", 11) == 0;
}

std::vector<std::string> child_env(const Scratch &scratch, const Launch &l, const Proc &p) {
    std::vector<std::string> env;
    for (char **e = environ; *e; ++e)
        if (!is_library_var(*e)) env.emplace_back(*e);
    if (l.preload) {
        // Sanitizer builds: ASan's runtime must come before everything;
        // TSan's after the library (see tests/meson.build).
        const char *first = std::getenv("SDIRECT_TEST_PRELOAD_FIRST");
        const char *after = std::getenv("SDIRECT_TEST_PRELOAD_AFTER");
        env.push_back("LD_PRELOAD=" + (first && *first ? std::string(first) + " " : "") + lib_path() +
                      (after && *after ? " " + std::string(after) : ""));
        // getenv() takes the first of two equal names: a test's own
        // registry replaces the scratch one instead of following it.
        bool own_registry = false;
        for (const std::string &v : l.env) own_registry |= v.rfind("SDIRECT_REGISTRY=", 0) == 0;
        if (!own_registry) env.push_back("SDIRECT_REGISTRY=" + scratch.registry());
        env.push_back("SDIRECT_STATS_FILE=" + p.stats);
        // The tests assert the mode each connection ran in: on a loaded
        // machine (many processes loading libfabric at once) the engine
        // may take longer than the default wait, and a connection that
        // ends before its late upgrade would stay on TCP. Tests of that
        // path set their own value.
        bool own_wait = false;
        for (const std::string &v : l.env) own_wait |= v.rfind("SDIRECT_ENGINE_WAIT_MS=", 0) == 0;
        if (!own_wait) env.push_back("SDIRECT_ENGINE_WAIT_MS=30000");
        // Most tests assert modes for connections that live a few ms or
        // less, so they upgrade at once; the tests of the library's own
        // policy (connections earn their upgrade) set SDIRECT_UPGRADE_AFTER_MS
        // themselves (empty: the library's default).
        bool own_policy = false;
        for (const std::string &v : l.env) own_policy |= v.rfind("SDIRECT_UPGRADE_AFTER_MS=", 0) == 0;
        if (!own_policy) env.push_back("SDIRECT_UPGRADE_AFTER_MS=0");
        if (const char *log = std::getenv("SDIRECT_TEST_LOG")) env.push_back(std::string("SDIRECT_LOG=") + log);
        // The whole suite runs under either message path: SDIRECT_QUEUES
        // set for the test run reaches every preloaded process that does
        // not set its own.
        bool own_queues = false;
        for (const std::string &v : l.env) own_queues |= v.rfind("SDIRECT_QUEUES=", 0) == 0;
        if (const char *q = std::getenv("SDIRECT_QUEUES"); q && !own_queues)
            env.push_back(std::string("SDIRECT_QUEUES=") + q);
        // The undumpable configuration reaches every peer program.
        if (const char *u = std::getenv("SDIRECT_TEST_UNDUMPABLE"))
            env.push_back(std::string("SDIRECT_TEST_UNDUMPABLE=") + u);
        for (const std::string &v : l.env) env.push_back(v);
    }
    return env;
}

std::string tail(const std::string &text, std::size_t max) {
    return text.size() <= max ? text : "..." + text.substr(text.size() - max);
}

void record(Proc &p, int status) {
    p.reaped = true;
    p.status = status;
    p.end_s = now_s();
}

}  // namespace

Proc spawn(const Scratch &scratch, const Launch &l) {
    Proc p;
    p.name = l.name;
    p.preloaded = l.preload;
    p.out = scratch.file(l.name + ".out");
    p.err = scratch.file(l.name + ".err");
    p.stats = scratch.file(l.name + ".stats");
    std::vector<std::string> args{peer_path()};
    args.insert(args.end(), l.args.begin(), l.args.end());
    for (const std::string &a : args) p.command += a + " ";
    if (l.preload) p.command = "LD_PRELOAD=... " + p.command;
    const std::vector<std::string> env = child_env(scratch, l, p);
    // Everything the child needs is built before fork: after it, only
    // async-signal-safe calls.
    std::vector<char *> argv, envp;
    for (const std::string &a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    for (const std::string &e : env) envp.push_back(const_cast<char *>(e.c_str()));
    envp.push_back(nullptr);
    // O_APPEND: forked children of the peer share these files.
    int out = open(p.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    int err = open(p.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    REQUIRE(out >= 0);
    REQUIRE(err >= 0);
    std::fflush(stdout);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        dup2(out, 1);
        dup2(err, 2);
        // As the peers expect them, whatever the harness inherited (under
        // nohup, SIGHUP is ignored, and an ignored signal stays so
        // across exec: a peer killed by SIGHUP would live on).
        const int reset[] = {SIGPIPE, SIGALRM, SIGUSR1, SIGINT, SIGCHLD, SIGHUP, SIGQUIT};
        for (int sig : reset) signal(sig, SIG_DFL);
        signal(SIGTERM, l.ignore_sigterm ? SIG_IGN : SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, nullptr);
        if (l.uid && (setgid(gid_t(l.uid)) != 0 || setuid(uid_t(l.uid)) != 0)) _exit(126);
        execve(argv[0], argv.data(), envp.data());
        _exit(127);
    }
    close(out);
    close(err);
    p.pid = pid;
    return p;
}

bool poll_exit(Proc &p) {
    if (p.reaped || p.pid <= 0) return true;
    int status = 0;
    pid_t got = waitpid(p.pid, &status, WNOHANG);
    if (got == p.pid) {
        record(p, status);
        return true;
    }
    return false;
}

namespace {

std::string first_line(const std::string &path) {
    std::string line = read_text(path);
    if (const auto nl = line.find('\n'); nl != std::string::npos) line.resize(nl);
    return line;
}

// What a process that did not end was doing: each thread's name, state,
// kernel wait channel and system call (number and arguments, from /proc),
// and, where gdb is installed, every thread's stack.
std::string threads_of(pid_t pid) {
    std::ostringstream o;
    const std::string dir = "/proc/" + std::to_string(pid) + "/task";
    std::error_code ec;
    for (const auto &task : std::filesystem::directory_iterator(dir, ec)) {
        const std::string t = task.path().string();
        const std::string stat = first_line(t + "/stat");
        const auto close_paren = stat.rfind(')');
        const char state = close_paren + 2 < stat.size() ? stat[close_paren + 2] : '?';
        o << "\n    tid " << task.path().filename().string() << " (" << first_line(t + "/comm")
          << ") " << state << " wchan=" << first_line(t + "/wchan")
          << " syscall=" << first_line(t + "/syscall");
    }
    if (access("/usr/bin/gdb", X_OK) == 0) {
        const std::string cmd = "timeout 30 /usr/bin/gdb -p " + std::to_string(pid) +
                                " -batch -ex 'thread apply all bt 30' 2>&1 | grep -E '^(Thread|#)'";
        if (FILE *f = popen(cmd.c_str(), "r")) {
            char line[512];
            while (std::fgets(line, sizeof line, f)) {
                line[std::strcspn(line, "\n")] = 0;
                o << "\n    " << line;
            }
            pclose(f);
        }
    }
    return o.str();
}

}  // namespace

bool wait_exit(Proc &p, double timeout_s, Proc *beside) {
    const double deadline = now_s() + timeout_s;
    // Bounded by the deadline; 1 ms steps keep exit times precise.
    for (long i = 0; i < 10000000; ++i) {
        if (poll_exit(p)) return !p.timed_out;
        if (now_s() > deadline) break;
        sleep_s(0.001);
    }
    p.at_timeout = threads_of(p.pid);
    if (beside && !poll_exit(*beside)) beside->at_timeout = threads_of(beside->pid);
    kill(p.pid, SIGKILL);
    int status = 0;
    waitpid(p.pid, &status, 0);
    record(p, status);
    p.timed_out = true;
    return false;
}

void signal_proc(const Proc &p, int sig) {
    if (p.pid > 0 && !p.reaped) kill(p.pid, sig);
}

bool exited_with(const Proc &p, int code) {
    return p.reaped && !p.timed_out && WIFEXITED(p.status) && WEXITSTATUS(p.status) == code;
}

bool killed_by(const Proc &p, int sig) {
    return p.reaped && !p.timed_out && WIFSIGNALED(p.status) && WTERMSIG(p.status) == sig;
}

std::string status_text(const Proc &p) {
    if (!p.reaped) return "still running";
    if (p.timed_out) return "timed out (killed by the harness)";
    if (WIFEXITED(p.status)) return "exit " + std::to_string(WEXITSTATUS(p.status));
    if (WIFSIGNALED(p.status))
        return std::string("killed by signal ") + std::to_string(WTERMSIG(p.status)) + " (" +
               strsignal(WTERMSIG(p.status)) + ")";
    return "status " + std::to_string(p.status);
}

std::string describe(const Proc &p) {
    std::ostringstream o;
    o << p.name << " [pid " << p.pid << "]: " << p.command << "\n  -> " << status_text(p);
    if (!p.at_timeout.empty()) o << "\n  threads before the kill:" << tail(p.at_timeout, 6000);
    o << "\n  stdout: " << tail(read_text(p.out), 1500) << "\n  stderr: "
      << tail(read_text(p.err), 1500);
    return o.str();
}

std::string read_text(const std::string &path) {
    std::ifstream in(path);
    std::ostringstream o;
    o << in.rdbuf();
    return o.str();
}

std::vector<std::string> log_lines(const std::string &log, int pid) {
    std::vector<std::string> out;
    const std::string who = "sdirect[" + std::to_string(pid) + "] ";
    std::size_t at = 0;
    while (at < log.size()) {
        std::size_t end = log.find('\n', at);
        if (end == std::string::npos) end = log.size();
        if (log.compare(at, who.size(), who) == 0) out.push_back(log.substr(at, end - at));
        at = end + 1;
    }
    return out;
}

std::size_t count_with(const std::vector<std::string> &lines, const std::string &needle) {
    std::size_t n = 0;
    for (const std::string &l : lines) n += l.find(needle) != std::string::npos;
    return n;
}

bool wait_for_text(const std::string &path, const std::string &needle, double timeout_s) {
    const double deadline = now_s() + timeout_s;
    for (int i = 0; i < 1000000 && now_s() < deadline; ++i) {
        if (read_text(path).find(needle) != std::string::npos) return true;
        sleep_s(0.002);
    }
    return false;
}

std::uint16_t wait_port(const std::string &path, Proc &owner, double timeout_s) {
    const double deadline = now_s() + timeout_s;
    for (int i = 0; i < 1000000 && now_s() < deadline; ++i) {
        std::string text = read_text(path);
        if (!text.empty()) return std::uint16_t(std::strtoul(text.c_str(), nullptr, 10));
        if (poll_exit(owner)) return 0;
        sleep_s(0.002);
    }
    return 0;
}

std::string skip_reason(const Proc &p) {
    std::istringstream in(read_text(p.out));
    for (std::string line; std::getline(in, line);)
        if (line.rfind("SKIP: ", 0) == 0) return p.name + ": " + line.substr(6);
    return p.name + " exited 77";
}

// ---- reports ---------------------------------------------------------------------------

namespace {

std::map<std::string, std::string> fields(const std::string &line) {
    std::map<std::string, std::string> kv;
    std::istringstream in(line);
    for (std::string word; in >> word;) {
        auto eq = word.find('=');
        if (eq != std::string::npos) kv[word.substr(0, eq)] = word.substr(eq + 1);
    }
    return kv;
}

std::uint64_t to_u64(const std::string &s) { return std::strtoull(s.c_str(), nullptr, 10); }

}  // namespace

std::uint64_t StatLine::num(const std::string &key) const {
    auto it = kv.find(key);
    return it == kv.end() ? 0 : to_u64(it->second);
}

std::vector<StatLine> conn_stats(const Proc &p) {
    std::vector<StatLine> out;
    for (const StatLine &s : read_stats(p.stats))
        if (!s.mode.empty()) out.push_back(s);
    return out;
}

StatLine only_conn_stat(const Proc &p) {
    const auto stats = read_stats(p.stats);
    const auto conns = conns_of(p);
    INFO(describe(p));
    INFO("statistics file:\n" << read_text(p.stats));
    REQUIRE(conns.size() == 1);
    const StatLine *s = find_stat(stats, conns[0].pid, conns[0].local, conns[0].peer);
    REQUIRE(s != nullptr);
    return *s;
}

std::vector<StatLine> read_stats(const std::string &path) {
    std::vector<StatLine> out;
    std::istringstream in(read_text(path));
    for (std::string line; std::getline(in, line);) {
        if (line.find("pid=") == std::string::npos) continue;
        StatLine s;
        s.text = line;
        s.kv = fields(line);
        s.pid = int(to_u64(s.kv["pid"]));
        s.local = s.kv["local"];
        s.peer = s.kv["peer"];
        s.mode = s.kv["mode"];
        s.reason = s.kv["reason"];
        out.push_back(s);
    }
    return out;
}

std::vector<std::string> lines_with(const Proc &p, const std::string &prefix) {
    std::vector<std::string> out;
    std::istringstream in(read_text(p.out));
    for (std::string line; std::getline(in, line);)
        if (line.rfind(prefix, 0) == 0) out.push_back(line);
    return out;
}

std::vector<ConnLine> conns_of(const Proc &p) {
    std::vector<ConnLine> out;
    for (const std::string &line : lines_with(p, "conn ")) {
        auto kv = fields(line);
        out.push_back({int(to_u64(kv["pid"])), kv["role"], kv["local"], kv["peer"]});
    }
    return out;
}

std::vector<BytesLine> bytes_of(const Proc &p) {
    std::vector<BytesLine> out;
    for (const std::string &line : lines_with(p, "bytes ")) {
        auto kv = fields(line);
        out.push_back({int(to_u64(kv["pid"])), kv["local"], kv["peer"], to_u64(kv["tx"]),
                       to_u64(kv["rx"])});
    }
    return out;
}

const StatLine *find_stat(const std::vector<StatLine> &stats, int pid, const std::string &local,
                          const std::string &peer) {
    const StatLine *found = nullptr;
    for (const StatLine &s : stats)
        if (s.pid == pid && s.local == local && s.peer == peer) found = &s;
    return found;
}

void check_modes(const Proc &p, Expect expect) {
    if (!p.preloaded || expect == Expect::nothing) return;
    const auto stats = read_stats(p.stats);
    const auto conns = conns_of(p);
    INFO(describe(p));
    INFO("statistics file:\n" << read_text(p.stats));
    REQUIRE(!conns.empty());
    for (const ConnLine &c : conns) {
        INFO("connection pid " << c.pid << " " << c.local << " -> " << c.peer);
        const StatLine *s = find_stat(stats, c.pid, c.local, c.peer);
        REQUIRE(s != nullptr);
        if (expect == Expect::direct) {
            CHECK(s->mode == "direct");
            CHECK(s->reason == "none");
        } else {
            CHECK(s->mode == "kernel");
            CHECK(s->reason == "no_peer");
        }
    }
}

void check_earned_then_direct(const Pair &pair) {
    for (const Proc *p : {&pair.client, &pair.server}) {
        const std::vector<StatLine> stats = conn_stats(*p);
        INFO(describe(*p));
        INFO("statistics file:\n" << read_text(p->stats));
        REQUIRE(stats.size() == 1);
        CHECK(stats[0].mode == "direct");
        CHECK(stats[0].num("tx_kernel") > 0);
        CHECK(stats[0].num("tx_fabric") > 0);
        CHECK(stats[0].num("rx_kernel") > 0);
        CHECK(stats[0].num("rx_fabric") > 0);
    }
}

void check_byte_counts(const Proc &p) {
    if (!p.preloaded) return;
    const auto stats = read_stats(p.stats);
    const auto bytes = bytes_of(p);
    INFO(describe(p));
    INFO("statistics file:\n" << read_text(p.stats));
    REQUIRE(!bytes.empty());
    for (const BytesLine &b : bytes) {
        INFO("connection pid " << b.pid << " " << b.local << " -> " << b.peer
                               << ": application sent " << b.tx << ", received " << b.rx);
        const StatLine *s = find_stat(stats, b.pid, b.local, b.peer);
        REQUIRE(s != nullptr);
        CHECK(s->num("tx_kernel") + s->num("tx_fabric") == b.tx);
        CHECK(s->num("rx_kernel") + s->num("rx_fabric") == b.rx);
    }
}

std::vector<std::string> dir_entries(const std::string &dir) {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto &e : std::filesystem::directory_iterator(dir, ec))
        out.push_back(e.path().filename().string());
    return out;
}

// ---- pairs ---------------------------------------------------------------------------

std::string Placement::label() const {
    auto side = [](bool preload) { return preload ? "preloaded" : "plain"; };
    return std::string("server ") + side(server_preload) + ", client " + side(client_preload);
}

Expect Placement::expect(bool server) const {
    const bool mine = server ? server_preload : client_preload;
    const bool theirs = server ? client_preload : server_preload;
    if (!mine) return Expect::nothing;
    return theirs ? Expect::direct : Expect::kernel_no_peer;
}

std::vector<Placement> placements() {
    if (!library_ready()) return {};
    switch (config()) {
    case Config::kernel: return {{false, false}};
    case Config::direct: return {{true, true}};
    case Config::mixed: return {{true, false}, {false, true}};
    }
    return {};
}

RulesFile::RulesFile(const std::string &text) {
    char name[] = "/tmp/sdirect-rules-XXXXXX";
    const int fd = mkstemp(name);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, text.data(), text.size()) == ssize_t(text.size()));
    close(fd);
    path = name;
}

RulesFile::~RulesFile() { unlink(path.c_str()); }

std::string settle_ms() {
    if (const char *v = std::getenv("SDIRECT_TEST_SETTLE_MS")) return v;
    // The reference needs no time to settle; preloaded runs give the
    // upgrade time to finish before the scenario starts.
    return config() == Config::kernel ? "0" : "100";
}

Pair start_pair(const Scratch &scratch, const PairSpec &spec, const Placement &pl,
                const std::string &tag) {
    Pair pair;
    pair.registry = scratch.registry();
    const std::string port_file = scratch.file(tag + ".port");
    Launch server{tag + "-server", {"server", port_file}, pl.server_preload, spec.env};
    server.args.insert(server.args.end(), spec.args.begin(), spec.args.end());
    server.args.insert(server.args.end(), spec.server_args.begin(), spec.server_args.end());
    const std::string settle = spec.settle_ms.empty() ? settle_ms() : spec.settle_ms;
    server.args.insert(server.args.end(), {"--settle-ms", settle});
    pair.server = spawn(scratch, server);
    pair.port = wait_port(port_file, pair.server, 20);
    if (pair.port == 0) return pair;
    Launch client{tag + "-client", {"client", std::to_string(pair.port)}, pl.client_preload,
                  spec.env};
    client.env.insert(client.env.end(), spec.client_env.begin(), spec.client_env.end());
    client.args.insert(client.args.end(), spec.args.begin(), spec.args.end());
    client.args.insert(client.args.end(), spec.client_args.begin(), spec.client_args.end());
    client.args.insert(client.args.end(), {"--settle-ms", settle});
    pair.client = spawn(scratch, client);
    return pair;
}

Pair run_pair_once(const Scratch &scratch, const PairSpec &spec, const Placement &pl,
                   const std::string &tag) {
    Pair pair = start_pair(scratch, spec, pl, tag);
    REQUIRE(pair.port != 0);
    wait_exit(pair.client, spec.timeout, &pair.server);
    wait_exit(pair.server, spec.timeout);
    INFO(describe(pair.server));
    INFO(describe(pair.client));
    REQUIRE(exited_with(pair.client, 0));
    REQUIRE(exited_with(pair.server, 0));
    return pair;
}

bool run_pair(const PairSpec &spec, const std::function<void(Pair &, const Placement &)> &extra) {
    const auto pls = placements();
    if (pls.empty()) return false;
    for (const Placement &pl : pls) {
        Scratch scratch;
        Pair pair = start_pair(scratch, spec, pl, "pair");
        INFO("placement: " << pl.label());
        if (pair.port == 0) {
            wait_exit(pair.server, 5);
            if (exited_with(pair.server, 77)) {
                note_skip(skip_reason(pair.server));
                return false;
            }
            FAIL("server did not publish its port\n" << describe(pair.server));
        }
        wait_exit(pair.client, spec.timeout, &pair.server);
        // A failed client can leave the server waiting for connections
        // that never come: its verdict is in already.
        const bool client_done = exited_with(pair.client, 0) || exited_with(pair.client, 77);
        wait_exit(pair.server, client_done ? spec.timeout : 5);
        if (exited_with(pair.client, 77) || exited_with(pair.server, 77)) {
            note_skip(skip_reason(exited_with(pair.client, 77) ? pair.client : pair.server));
            return false;
        }
        INFO(describe(pair.server));
        INFO(describe(pair.client));
        REQUIRE(exited_with(pair.client, 0));
        if (spec.server_signal) REQUIRE(killed_by(pair.server, spec.server_signal));
        else REQUIRE(exited_with(pair.server, 0));
        if (spec.check_modes) {
            check_modes(pair.server, pl.expect(true));
            check_modes(pair.client, pl.expect(false));
        }
        if (extra) extra(pair, pl);
    }
    return true;
}

}  // namespace sdt
