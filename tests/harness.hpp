// Behaviour-suite harness: starts peer programs with and without
// LD_PRELOAD, waits for them with deadlines, and reads what they printed
// and what the library wrote to SDIRECT_STATS_FILE.
//
// The configuration comes from SDIRECT_TEST_CONFIG:
//   kernel  no process preloaded (the reference; must always pass)
//   direct  every process preloaded: connections must end up direct
//   mixed   one end preloaded, the other plain (both ways round): the
//           preloaded end must stay on the kernel with reason no_peer
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <sys/types.h>
#include <vector>

namespace sdt {

enum class Config { kernel, direct, mixed };
Config config();
const char *config_name();
// The peer programs make themselves not dumpable (SDIRECT_TEST_UNDUMPABLE=1,
// the undumpable configuration): a pair goes through the queues under the
// restrictions of two uids, every byte inline, no ring offered.
bool undumpable();

// ---- skips -------------------------------------------------------------------
// Catch2 v2 has no skip: a skipped test case prints "SKIPPED: ..." and
// returns; when every selected test case skipped, main() exits 77, which
// meson shows as SKIP.
void note_skip(const std::string &reason);
void case_started();
void case_ended();
bool all_skipped();

// True when the configuration can run (the library exists, or kernel).
bool library_ready();

std::string peer_path();
std::string lib_path();
double now_s();
void sleep_s(double s);

// A private directory per test: port files, outputs, statistics and the
// registry (so concurrent tests never see each other's entries).
class Scratch {
public:
    Scratch();
    ~Scratch();
    Scratch(const Scratch &) = delete;
    Scratch &operator=(const Scratch &) = delete;
    std::string file(const std::string &name) const { return dir_ + "/" + name; }
    const std::string &registry() const { return registry_; }

private:
    std::string dir_;
    std::string registry_;
};

struct Launch {
    std::string name;                // file prefix for outputs
    std::vector<std::string> args;   // after the peer program path
    bool preload = false;
    std::vector<std::string> env;    // extra KEY=VALUE for this process
    bool ignore_sigterm = false;     // start with SIGTERM set to SIG_IGN
    unsigned uid = 0;                // not 0: run as this uid (and gid), from the start
};

struct Proc {
    std::string name;
    pid_t pid = -1;
    bool preloaded = false;
    std::string command;  // for messages
    std::string out, err, stats;
    bool reaped = false;
    bool timed_out = false;
    std::string at_timeout;  // its threads as the harness found them before the kill
    int status = 0;
    double end_s = 0;  // when it was reaped (monotonic seconds)
};

Proc spawn(const Scratch &scratch, const Launch &launch);
// Reaps the process; on timeout kills it (SIGKILL) and returns false. What
// its threads were doing is kept first (Proc::at_timeout), and those of
// `beside` (its peer) too if it still runs.
bool wait_exit(Proc &p, double timeout_s, Proc *beside = nullptr);
// Reaps it if it has already ended; true if it has.
bool poll_exit(Proc &p);
void signal_proc(const Proc &p, int sig);

bool exited_with(const Proc &p, int code);
bool killed_by(const Proc &p, int sig);
std::string status_text(const Proc &p);
// Command, status, stdout and stderr (tails), for failure messages.
std::string describe(const Proc &p);

std::string read_text(const std::string &path);
// The library's log lines of process `pid` in `log` (the text of an
// SDIRECT_LOG_FILE), and how many of `lines` contain `needle`.
std::vector<std::string> log_lines(const std::string &log, int pid);
std::size_t count_with(const std::vector<std::string> &lines, const std::string &needle);
// Waits until the file exists and contains `needle`; false on timeout.
bool wait_for_text(const std::string &path, const std::string &needle, double timeout_s);
// Waits for the port file; 0 if `owner` ended or the timeout passed.
std::uint16_t wait_port(const std::string &path, Proc &owner, double timeout_s);
// A line "SKIP: reason" printed by a peer that exited 77.
std::string skip_reason(const Proc &p);

// ---- what the peers and the library report --------------------------------------

struct StatLine {
    std::map<std::string, std::string> kv;
    int pid = 0;
    std::string local, peer, mode, reason, text;
    std::uint64_t num(const std::string &key) const;
};
std::vector<StatLine> read_stats(const std::string &path);
// The connections' lines of p's statistics file (not the process line).
std::vector<StatLine> conn_stats(const Proc &p);
// The statistics line of the one connection p reported (required).
StatLine only_conn_stat(const Proc &p);

struct ConnLine {
    int pid = 0;
    std::string role, local, peer;
};
// "conn" lines on the process's stdout (its forked children's included).
std::vector<ConnLine> conns_of(const Proc &p);

struct BytesLine {
    int pid = 0;
    std::string local, peer;
    std::uint64_t tx = 0, rx = 0;
};
std::vector<BytesLine> bytes_of(const Proc &p);

const StatLine *find_stat(const std::vector<StatLine> &stats, int pid,
                          const std::string &local, const std::string &peer);

enum class Expect { nothing, direct, kernel_no_peer };

// Every connection the process reported has one statistics line with the
// expected mode and reason. Nothing is checked for plain processes.
void check_modes(const Proc &p, Expect expect);
// tx_kernel + tx_fabric and rx_kernel + rx_fabric equal the bytes the
// application moved, per connection.
void check_byte_counts(const Proc &p);
// Lines of the stdout of p that start with prefix, in order.
std::vector<std::string> lines_with(const Proc &p, const std::string &prefix);

// ---- two-process scenarios -------------------------------------------------------

struct Placement {
    bool server_preload;
    bool client_preload;
    std::string label() const;
    Expect expect(bool server) const;
};
// The placements of the current configuration (empty, after noting a skip,
// when the library is missing).
std::vector<Placement> placements();

// A rules file (SDIRECT_RULES) for one test, removed with it.
struct RulesFile {
    std::string path;
    explicit RulesFile(const std::string &text);
    ~RulesFile();
    RulesFile(const RulesFile &) = delete;
    RulesFile &operator=(const RulesFile &) = delete;
};

struct PairSpec {
    std::vector<std::string> args;         // both ends
    std::vector<std::string> server_args;  // server only
    std::vector<std::string> client_args;  // client only
    std::vector<std::string> env;          // extra env for preloaded ends
    std::vector<std::string> client_env;   // extra env for a preloaded client only
    double timeout = 60;
    bool check_modes = true;
    // The server ends by this signal instead of exit 0 (a responder told
    // to kill itself); 0: it must exit 0.
    int server_signal = 0;
    // The hello's ping-pong, in ms (--settle-ms); empty: settle_ms().
    std::string settle_ms;
};

struct Pair {
    Proc server, client;
    std::uint16_t port = 0;
    std::string registry;  // SDIRECT_REGISTRY of the preloaded ends
};

// Both ends preloaded, one connection each: it started on TCP (bytes
// both ways on the kernel) and went direct (bytes both ways on the fabric).
void check_earned_then_direct(const Pair &pair);

// Names of the entries in a directory (none if it does not exist).
std::vector<std::string> dir_entries(const std::string &dir);

// Settle time passed to peers: long enough for an upgrade to finish.
std::string settle_ms();
Pair start_pair(const Scratch &scratch, const PairSpec &spec, const Placement &pl,
                const std::string &tag);
// start_pair for one placement, run to its end: the server's port is
// required, the client then the server waited for (spec.timeout each),
// and both must have exited 0 (described on failure).
Pair run_pair_once(const Scratch &scratch, const PairSpec &spec, const Placement &pl,
                   const std::string &tag);

// Runs the scenario once per placement; both ends must exit 0 and report
// the expected modes; `extra` adds checks. False if it was skipped.
bool run_pair(const PairSpec &spec,
              const std::function<void(Pair &, const Placement &)> &extra = {});

}  // namespace sdt
