// The soak: checksummed traffic between processes (run under the library
// by scripts/soak.sh), through forks, execs, stops, kills, uid changes,
// close_range and signal storms. See soak_main.cpp for the plan.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <sys/types.h>

namespace soak {

// The bytes of a stream are a function of its seed and offset: a receiver
// checks every byte at the offset it expects it, so a lost, duplicated or
// injected byte shows as a mismatch (or as bytes past the announced end).
std::uint8_t stream_byte(std::uint64_t seed, std::uint64_t offset) noexcept;
void stream_fill(std::uint64_t seed, std::uint64_t offset, unsigned char *out, std::size_t n) noexcept;
// Offset of the first byte of data[0..n) that is not the stream's, or n.
std::size_t stream_check(std::uint64_t seed, std::uint64_t offset, const unsigned char *data,
                         std::size_t n) noexcept;

std::uint64_t splitmix(std::uint64_t &state) noexcept;

// Actions a session may take (bits of --actions).
enum Action : unsigned {
    a_fork_handoff = 1u << 0,  // fork; the child carries on, the parent closes and waits
    a_fork_idle = 1u << 1,     // fork; the child leaves the socket alone and exits
    a_close_range = 1u << 2,   // ... after close_range(3, ~0) and file I/O on reused numbers
    a_exec = 1u << 3,          // exec this program, the socket kept open across it
    a_stop = 1u << 4,          // the session's supervisor SIGSTOPs and SIGCONTs a side
    a_kill = 1u << 5,          // the supervisor SIGKILLs one side
    a_setuid = 1u << 6,        // (root) a side drops to another uid mid-stream
    a_timer = 1u << 7,         // 100-500 us interval timer signals, with and without SA_RESTART
    a_families = 1u << 8,      // random call families (else send/recv only)
    a_sendfile = 1u << 9,      // sendfile among the families
};
unsigned parse_actions(const std::string &list);
std::string action_names(unsigned actions);

// What both sides of a session and its supervisor share (anonymous shared
// memory; a memfd, so that an exec'ed side finds it again).
struct Shared {
    std::atomic<pid_t> pid[2];             // the process running each side now
    std::atomic<std::uint64_t> verified[2];  // bytes each side received and checked
    std::atomic<std::uint64_t> sent[2];
    std::atomic<int> outcome[2];           // Outcome
    std::atomic<std::uint32_t> forks, execs, uid_drops, close_ranges, eintr;
    char error[2][160];
    // The one-shot server's counts: connections checked whole, ended early
    // (the client was killed: EOF or reset), wrong; bytes checked.
    std::atomic<std::uint64_t> os_ok, os_aborted, os_wrong, os_bytes;
    std::atomic<int> os_stop;
    std::atomic<int> port;  // the listener's, once side 0 (or the server) has one
    char os_error[160];
};

enum Outcome : int { o_running = 0, o_done = 1, o_peer_gone = 2, o_error = 3 };

// One side's state, all it needs to carry on after a fork or an exec.
struct Side {
    int fd = -1;
    int side = 0;            // 0: accepted end, 1: connecting end
    int shm_fd = -1;
    std::uint64_t seed = 0;  // session seed; the direction's stream seeds derive from it
    std::uint64_t total = 0; // bytes each direction carries
    std::uint64_t sent = 0, received = 0;
    std::uint64_t rng = 0;
    unsigned actions = 0;
    unsigned round = 0;
};

[[noreturn]] void run_side(Side s);
std::string encode(const Side &s);
bool decode(const std::string &text, Side *s);

// The one-shot half: a server of many connections and a client process
// per connection.
int oneshot_server(int listen_fd, Shared *shared, int seconds);
int oneshot_client(unsigned short port, std::uint64_t seed, std::uint64_t len);

}  // namespace soak
