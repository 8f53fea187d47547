// The process page: one small shared-memory file per process that runs
// direct connections, <registry>/p<pid>. Peers map it to read the sleep
// count (doorbell protocol); sdirect-stat maps it to list connections.
//
// Layout (version 8), all little-endian host order:
//   0   ProcHeader   (128 bytes)
//   128 ConnStat[kSlots] (256 bytes each)
// A slot is written only by the owning process; readers tolerate torn
// counters (they are monotonic 64-bit atomics).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sd::transport {

inline constexpr std::uint32_t kPageMagic = 0x53445047;  // "SDPG"
inline constexpr std::uint32_t kPageVersion = 8;
inline constexpr std::uint32_t kSlots = 4096;

enum class Mode : std::uint32_t { kernel = 0, direct = 1 };

// Why a connection is not (or no longer) in direct mode.
enum class Reason : std::uint32_t {
    none = 0,          // direct, or upgrade still possible
    no_peer,           // peer never published (not running the library)
    peer_refused,      // peer answered no (e.g. resource limit on its side)
    other_user,        // SO_PEERCRED: different uid
    not_dumpable,      // one side not dumpable, and the request offered no queue
    proof_failed,      // passed socket does not match the connection
    av_full,           // address vector limit reached
    no_fabric,         // libfabric or the provider unavailable
    timeout,           // peer did not answer in time
    same_process,      // both ends in one process and SDIRECT_SAME_PROCESS=0
    inherited,         // socket inherited across fork, left to the kernel
    fabric_error,      // fabric failure; continued on TCP
    shared,            // was direct, went back to the kernel: shared after fork
    exec,              // was direct, went back to the kernel before exec/spawn
    passed,            // on the kernel for good: passed to another process (SCM_RIGHTS)
    privilege,         // on the kernel for good: the process changed its privileges
    oob,               // urgent data (MSG_OOB): the kernel carries the connection
    other_registry,    // the peer's entry is in another registry of our uid (SDIRECT_REGISTRY)
    peer_kernel,       // the peer's end stays on the kernel (why: ConnStat::peer_reason)
    fd_limit,          // this process had no fd to spare for the upgrade (RLIMIT_NOFILE)
    other_host,        // no entry, and the peer's address is not one of this host's
    ended_early,       // closed (or exited) while its peer, which runs the library, was about to upgrade
    disconnect,        // connect(AF_UNSPEC): the kernel disconnects it (a reset), for good
    rule,              // a rule of SDIRECT_RULES keeps it on TCP (or the rules file is unusable)
    peer_wait,         // it waited SDIRECT_PEER_WAIT_MS for its peer's upgrade, then stayed on TCP
    count_
};

const char *mode_name(Mode m) noexcept;
const char *reason_name(Reason r) noexcept;

struct ProcHeader {
    std::uint32_t magic;
    std::uint32_t version;
    std::int32_t pid;
    std::uint32_t nslots;
    // Threads blocked on the doorbell (the low 31 bits), and kRung: a peer
    // rang it since the last drain (Engine::ring, wait.cpp).
    std::atomic<std::uint32_t> sleepers;
    // Peer processes attached afresh (their maps made), upgrades that
    // found theirs attached already (cached or in use).
    std::atomic<std::uint32_t> peers_attached;
    std::uint64_t start_ns;               // CLOCK_REALTIME at creation
    char comm[32];                        // program name, NUL-terminated
    // The registration cache (regcache.hpp), process-wide: on (1) or off;
    // sends that found their buffer registered, that registered it anew;
    // entries dropped because the memory was freed or unmapped, dropped
    // for room; registered bytes held.
    std::atomic<std::uint32_t> reg_cache_on;
    std::atomic<std::uint32_t> peer_reuses;
    std::atomic<std::uint64_t> reg_hits;
    std::atomic<std::uint64_t> reg_misses;
    std::atomic<std::uint64_t> reg_invalidated;
    std::atomic<std::uint64_t> reg_evicted;
    std::atomic<std::uint64_t> reg_bytes;
    std::uint64_t reg_budget;             // its bound in bytes (0: off)
    // Idle peers dropped from the cache: for room (least recently used),
    // and because their process ended.
    std::atomic<std::uint32_t> peers_evicted;
    std::atomic<std::uint32_t> peers_gone;
};
static_assert(sizeof(ProcHeader) == 128);

// The doorbell's latch, in ProcHeader::sleepers: set by the peer whose ring
// wrote the doorbell, cleared by the thread that drains it, which then
// takes in everything queued. Until then other peers' posts need no write
// of their own: a wake-up is on its way. Without it, every post to a
// process whose sleeper had not run yet (a busy CPU) was a system call.
inline constexpr std::uint32_t kRung = 1u << 31;
static_assert(offsetof(ProcHeader, sleepers) == 16);

// ConnStat::waker's latch: the peer wrote the announced eventfd. Until
// the sleeper clears the word, other posts of the peer need no write of
// their own; the sleeper, finding the latch when it clears the word, takes
// in everything queued (the write may have woken nobody: the sleep was
// over already).
inline constexpr std::uint64_t kWakeRung = 1ull << 63;

enum class SlotState : std::uint32_t { free = 0, live = 1, closed = 2 };

struct ConnStat {
    std::atomic<std::uint32_t> state;   // SlotState
    std::int32_t fd;
    std::atomic<std::uint32_t> mode;    // Mode
    std::atomic<std::uint32_t> reason;  // Reason
    std::uint16_t family;               // AF_INET / AF_INET6
    std::uint16_t local_port;           // host order
    std::uint16_t peer_port;
    std::uint16_t peer_reason;          // Reason the peer gave (peer_kernel), else 0
    std::int32_t peer_pid;              // 0 until known
    std::uint8_t local_addr[16];        // v4 in the first 4 bytes
    std::uint8_t peer_addr[16];
    std::atomic<std::uint64_t> tx_kernel;  // bytes sent through the companion socket
    std::atomic<std::uint64_t> rx_kernel;
    std::atomic<std::uint64_t> tx_fabric;  // bytes sent over the fabric
    std::atomic<std::uint64_t> rx_fabric;
    std::atomic<std::uint64_t> tx_msgs;    // fabric messages sent (data + control)
    std::atomic<std::uint64_t> rx_msgs;
    // Flow state when last looked at (direct mode): bytes the peer may
    // still take, bytes received but not yet read, credits owed the peer.
    std::atomic<std::int64_t> tx_window;
    std::atomic<std::uint32_t> rx_queued;
    std::atomic<std::uint32_t> rx_owed;
    // Fabric bytes by protocol (tx_fabric = tx_inline + tx_ring + tx_zcopy
    // + tx_sink):
    // copied inline in messages (buffered), written straight into the
    // peer's receive ring, read by the peer from our advertised buffers
    // (read zero-copy); rx_zcopy: what we read from the peer's.
    std::atomic<std::uint64_t> tx_inline;
    std::atomic<std::uint64_t> tx_ring;
    std::atomic<std::uint64_t> tx_zcopy;
    std::atomic<std::uint64_t> rx_zcopy;
    std::atomic<std::uint32_t> adverts;    // read zero-copy advertisements made
    std::atomic<std::uint32_t> cancels;    // ... of them ended early by us
    std::atomic<std::uint32_t> upgrades;   // times it went direct
    std::atomic<std::uint32_t> leaves;     // times it left the fabric (fork, exec)
    // Write zero-copy: bytes the peer wrote into our recv buffers (rx_sink)
    // and we into its (tx_sink); our buffers advertised, and those of
    // them cancelled because other bytes came first.
    std::atomic<std::uint64_t> tx_sink;
    std::atomic<std::uint64_t> rx_sink;
    std::atomic<std::uint32_t> sinks;
    std::atomic<std::uint32_t> sink_cancels;
    // The claim word of our advertised recv buffer (wire.hpp kSink*): the
    // peer maps this page writable to claim it.
    std::atomic<std::uint64_t> sink_word;
    // CLOCK_MONOTONIC when the accepting side began looking for the
    // connecting side's registry entry (0: not yet): the connecting side
    // then knows whether its request would only cross the acceptor's.
    std::atomic<std::uint64_t> lookup_ns;
    // A thread of ours sleeps on this connection and may be woken through
    // its own eventfd (wait.cpp): its number in our process (the low 32
    // bits) and that eventfd's mark (bits 32-62: unique in this process,
    // never 0); kWakeRung once the peer wrote it. 0: none announced. Set
    // by the sleeper before its last look, cleared when its sleep ends; a
    // peer of our uid sets kWakeRung (Engine::ring).
    std::atomic<std::uint64_t> waker;
    std::uint8_t pad1[32];
};
static_assert(sizeof(ConnStat) == 256);
static_assert(offsetof(ConnStat, tx_kernel) == 64);

// Counters have one writer at a time (the lock that serialises their path
// is held): a plain load + store is enough and avoids a locked instruction
// on the fast path. Readers in other processes may see a slightly old value.
inline void bump(std::atomic<std::uint64_t> &ctr, std::uint64_t n) noexcept {
    ctr.store(ctr.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

struct ProcPage {
    ProcHeader header;
    ConnStat slots[kSlots];
};

// One connection as sdirect-stat prints it.
struct ConnRecord {
    int pid;
    std::string comm;
    const ConnStat *stat;  // valid while the snapshot's mappings live
};

// "pid=12 comm=iperf3 fd=5 state=live mode=direct reason=none
//  local=127.0.0.1:5201 peer=127.0.0.1:40112 peer_pid=13
//  tx_kernel=0 rx_kernel=0 tx_fabric=1024 rx_fabric=0 tx_msgs=1 rx_msgs=0"
std::string format_conn(int pid, const char *comm, const ConnStat &s);

// That line, and the process's ("process pid=12 comm=iperf3 reg_cache=on
// reg_budget=4194304 reg_hits=9 reg_misses=1 reg_invalidated=0
// reg_evicted=0 reg_bytes=1048576 peers_attached=1 peer_reuses=99
// peers_evicted=0 peers_gone=0"), written into `buf` (cut to fit,
// NUL-terminated), without allocation, locks or stdio: callable from a
// signal handler. Return the length written. kStatLineMax holds any line.
inline constexpr std::size_t kStatLineMax = 1024;
std::size_t format_conn_into(char *buf, std::size_t n, int pid, const char *comm,
                             const ConnStat &s) noexcept;
std::size_t format_process_into(char *buf, std::size_t n, const ProcHeader &h) noexcept;
// "127.0.0.1:40112 > 127.0.0.1:5201" (local > peer), for log lines.
std::size_t format_endpoints(char *buf, std::size_t n, const ConnStat &s) noexcept;

// Called for each connection slot a scan finds; `exited`: the page of a
// process that has ended (its slot states are as they were at its end).
using PageVisitor = void (*)(void *ctx, int pid, const char *comm, const ConnStat &s, bool exited);

// Maps every live process page in `dir` (read-only) and calls `fn` for
// each slot in use (closed ones too if `with_closed`). Pages of dead
// processes are skipped. Returns the number of pages read, or -errno.
int scan_pages(const char *dir, bool with_closed, PageVisitor fn, void *ctx) noexcept;
// The same for the pages processes left in <dir>/exited at their end
// (exitstats.hpp), every slot that was used. -ENOENT: none yet.
int scan_exited(const char *dir, PageVisitor fn, void *ctx) noexcept;

}  // namespace sd::transport
