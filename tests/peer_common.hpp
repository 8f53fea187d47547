// The behaviour-suite peer: a plain sockets program that runs with and
// without LD_PRELOAD. Everything it sends is a deterministic pattern, so
// every received byte is checked against the byte the stream must hold at
// that offset. Any deviation prints one "FAIL" line and exits 1; a scenario
// that cannot run on this machine exits 77.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <sys/socket.h>
#include <sys/types.h>

namespace peer {

inline constexpr int kExitSkip = 77;

// ---- diagnostics -----------------------------------------------------------

[[noreturn]] void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] void skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// One line on stdout, flushed at once (the harness parses stdout).
void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *errno_name(int err);
std::uint64_t now_ns();
void sleep_us(std::uint64_t us);
// Waits up to 25 s for a child (its watchdog ends it after 20), which must
// have exited 0 or, with sig, died of that signal; fails otherwise.
void reap(pid_t pid, const char *what, int sig = 0);
// Re-arms the watchdog: SIGALRM's default action ends a stuck process.
void arm_watchdog(unsigned seconds);

// ---- stream pattern --------------------------------------------------------

std::uint64_t mix(std::uint64_t a, std::uint64_t b);
void pattern_fill(std::uint64_t seed, std::uint64_t offset, void *buf, std::size_t len);
// Index of the first byte that differs from the pattern, or len.
std::size_t pattern_check(std::uint64_t seed, std::uint64_t offset, const void *buf,
                          std::size_t len);
// Checks and fails with a precise message on the first wrong byte.
void pattern_expect(std::uint64_t seed, std::uint64_t offset, const void *buf,
                    std::size_t len, const char *what);

// ---- call families ---------------------------------------------------------

// writev-many / readv-many: writev and readv over up to 64 pieces of
// assorted sizes, some of them empty.
enum class Tx : std::uint32_t { write, send, writev, sendmsg, sendto, writev_many, count };
enum class Rx : std::uint32_t { read, recv, readv, recvmsg, recvfrom, readv_many, count };
const char *tx_name(Tx api);
const char *rx_name(Rx api);
Tx parse_tx(const std::string &name);
Rx parse_rx(const std::string &name);

// One call of the chosen family; the buffer is split into several iovecs
// for the vector calls. Returns what the call returned (errno untouched).
ssize_t tx_once(int fd, Tx api, const void *buf, std::size_t len, int flags);
ssize_t rx_once(int fd, Rx api, void *buf, std::size_t len, int flags);

// Byte counts per fd, as the application sees them (peeks excluded); the
// harness compares them with the library's counters.
void count_tx(int fd, std::uint64_t n);
void count_rx(int fd, std::uint64_t n);
std::uint64_t counted_tx(int fd);
std::uint64_t counted_rx(int fd);

// Blocking loops over the chosen family; EINTR is retried, anything else
// (and EOF inside the expected length) fails.
void send_pattern(int fd, Tx api, std::uint64_t seed, std::uint64_t size,
                  std::uint32_t max_chunk, std::uint32_t gap_us);
void recv_pattern(int fd, Rx api, std::uint64_t seed, std::uint64_t size,
                  std::uint32_t max_chunk, const char *what);
void write_all(int fd, const void *buf, std::size_t len);
// `size` bytes of `seed` in one send call: the peer sees them arrive at once.
void send_whole(int fd, std::uint64_t seed, std::uint64_t size);
void read_all(int fd, void *buf, std::size_t len, const char *what);
// Like read_all, but a clean EOF before the first byte returns false.
bool read_all_or_eof(int fd, void *buf, std::size_t len, const char *what);
void expect_eof(int fd, const char *what);

// ---- commands (driver -> responder, in the stream itself) --------------------

enum class Op : std::uint32_t {
    exit = 1,     // responder closes and ends the session
    send,         // send size bytes of seed with tx api, chunk, gaps (kWhole: one call)
    recv,         // receive size bytes of seed with rx api; ack 'A' unless no_ack
    echo,         // receive size of seed, answer size of seed2
    duplex,       // receive size of seed while a thread sends size2 of seed2; ack
    pingpong,     // size rounds of messages up to chunk bytes
    recv_eof,     // receive size of seed, expect EOF, send size2 of seed2, close
    send_shut,    // send size of seed, then shutdown(SHUT_WR)
    send_close,   // send size of seed, close, stay alive size2 milliseconds
    hang,         // print "ready" and block until killed
    sockinfo,     // send own local and peer address
    records_in,   // receive records of size writers, size2 each (peer_records.hpp); ack
    records_out,  // send size records while reading size2 replies (peer_records.hpp); ack
    echo_eof,     // send size of seed, then shutdown(SHUT_WR), while reading the same
                  // back; expect EOF after it; close
    send_die,     // a thread sends size of seed (chunk); SIGKILL self after size2 us
    recv_die,     // receive size2 bytes of seed, then SIGKILL self (size: the whole)
    send_exit,    // a thread sends size of seed (chunk, MSG_NOSIGNAL, until an error);
                  // exit(0) after size2 us
    linger_close, // SO_LINGER {1, 0}, close (a reset), stay alive size2 milliseconds
    urgent,       // send size of seed, one urgent byte kUrgentByte (MSG_OOB), size2 of seed2
    handoff,      // fork: the parent closes its copy and waits; the child answers the
                  // next commands after size2 us
    shut_idle,    // shutdown(SHUT_RDWR), then sleep size2 ms outside the socket calls,
                  // then close and end the session
    await_reset,  // block in recv until the connection is reset (ECONNRESET expected),
                  // then close and end the session
    shut_close,   // shutdown(SHUT_RDWR), close, stay alive size2 ms
    fork_die,     // fork: the parent dies by SIGKILL at once, its copy open; the child
                  // looks at the socket after size2 us (recv MSG_PEEK): on a reset it
                  // prints "holder: reset" and exits 0, else "holder: goes on" and
                  // answers the next commands
    unread_hang,  // receive size2 of the size bytes of seed sent (the rest stays unread),
                  // send chunk single bytes 2 ms apart twice, 500 ms between, print
                  // "ready", block until killed
};
inline constexpr char kUrgentByte = 'U';

inline constexpr std::uint32_t kCmdMagic = 0x53445443;  // "SDTC"
inline constexpr std::uint32_t kNoAck = 1;
inline constexpr std::uint32_t kWhole = 2;  // send, echo: all in one call (one arrival)
// Before its pause, the responder caps SO_RCVBUF at 64 KiB, so the kernel's
// receive autotuning (up to tcp_rmem max, 32 MiB on recent kernels) cannot
// absorb a stream that is meant to fill up.
inline constexpr std::uint32_t kSmallRcvbuf = 4;
// records_out: the writer thread sends with MSG_DONTWAIT and sleeps while
// the socket is full, never waiting inside the library, so every arrival
// (credits, the peer's leave) is taken by the reading thread.
inline constexpr std::uint32_t kPassiveWriter = 8;

// Layout: magic, op, api, chunk (4 x u32), size, seed, size2, seed2
// (4 x u64), pre_delay_us, gap_us, flags, pad (4 x u32) = 64 bytes.
struct Cmd {
    std::uint32_t magic = kCmdMagic;
    Op op = Op::exit;
    std::uint32_t api = 0;
    std::uint32_t chunk = 65536;
    std::uint64_t size = 0;
    std::uint64_t seed = 0;
    std::uint64_t size2 = 0;
    std::uint64_t seed2 = 0;
    std::uint32_t pre_delay_us = 0;
    std::uint32_t gap_us = 0;
    std::uint32_t flags = 0;
    std::uint32_t pad = 0;
};
static_assert(sizeof(Cmd) == 64);

void send_cmd(int fd, const Cmd &cmd);

// Starts `cat` (path given) on `fd` as its stdin and stdout, without the
// library or its settings in its environment; returns its pid.
pid_t spawn_plain_cat(const char *cat, int fd);
void expect_ack(int fd, const char *what);

// Serves commands until Op::exit or a clean EOF between commands.
// Returns with the socket still open unless *fd was set to -1 (send_close).
void respond(int *fd);
// The commands of peer_semantics.cpp.
void respond_linger_close(int *fd, const Cmd &cmd);
void respond_urgent(int fd, const Cmd &cmd);

// ---- options and connections -------------------------------------------------

struct Options {
    std::map<std::string, std::string> kv;
    std::string get(const std::string &key, const std::string &fallback = "") const;
    std::uint64_t num(const std::string &key, std::uint64_t fallback) const;
    bool has(const std::string &key) const { return kv.count(key) != 0; }
};

int family_of(const Options &opt);  // AF_INET or AF_INET6 from --family 4|6
// Binds the loopback address of the family to port 0 and listens.
// The loopback address of `family` with `port`; its length.
socklen_t loopback_addr(int family, std::uint16_t port, sockaddr_storage *ss);
int listen_loopback(int family, int backlog, std::uint16_t *port);
void write_port_file(const std::string &path, std::uint16_t port);
int connect_loopback(int family, std::uint16_t port);

std::string endpoint_text(const sockaddr *sa);
std::string local_text(int fd);
std::string peer_text(int fd);
// "conn pid=.. role=.. local=.. peer=.." on stdout, for the harness to
// find this connection in the library's statistics.
void report_conn(int fd, const char *role);
// "bytes pid=.. local=.. peer=.. tx=.. rx=.." with the counted totals.
void report_bytes(int fd);

// Hello plus a ping-pong of settle_ms, driven by the connecting side, so
// that an accelerated connection has switched before the scenario starts.
// `paced`: a round per millisecond (a connection that goes on exchanging,
// which earns its upgrade), else as fast as it goes. The process's first
// hello prints "first-exchange us=N engine=0|1": its time from before the
// first connect() to the hello's answer, and whether the process had its
// fabric engine (its page in SDIRECT_REGISTRY) by then.
void settle_client(int fd, std::uint32_t settle_ms, bool paced = false);
void settle_server(int fd);

// ---- scenarios ---------------------------------------------------------------

// Runs the named driver scenario on a connected, settled socket. Returns
// normally on success (the socket is closed by the caller if still >= 0).
void drive(const std::string &scenario, int *fd, const Options &opt);
bool is_driver_scenario(const std::string &scenario);

// Scenario "many": nonblocking full-duplex exchange on many connections
// at once, driven by poll().
void many_exchange(int *fds, std::size_t n, bool client, const Options &opt);

// An unlinked regular file (in TMPDIR) holding `size` bytes of stream
// `seed`; its fd. A file's own offset.
int pattern_file(std::uint64_t seed, std::uint64_t size);
off_t file_position(int f);

}  // namespace peer
