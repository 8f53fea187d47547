#include "settings.hpp"
#include "registry.hpp"
#include "sys.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

namespace sd::transport {
namespace {

constexpr Setting table[] = {
    {"SDIRECT_ENABLE", SettingKind::boolean, "1",
     "0 makes the library a pure pass-through (every call goes to libc)."},
    {"SDIRECT_LOG", SettingKind::text, "silent",
     "Log level on stderr: silent, error, info (one line per upgrade, "
     "switch and fallback) or debug."},
    {"SDIRECT_PROVIDER", SettingKind::text, "shm",
     "libfabric provider used for direct mode between processes of this host. "
     "psm2 or psm also loads the real libpsm2 or libpsm_infinipath, whose "
     "clock calibration takes ~100 ms each, instead of the library's "
     "stand-ins (loaded where no Omni-Path or TrueScale device exists)."},
    {"SDIRECT_REGISTRY", SettingKind::text, "/dev/shm/sdirect-UID",
     "Directory of the per-user host registry (mode 0700); UID is replaced "
     "by the real user id. If another user owns that name, the first of "
     "NAME-1, NAME-2 ... that is ours or free is used instead."},
    {"SDIRECT_WINDOW", SettingKind::integer, "2097152",
     "Receive window of one direct connection in bytes (credits the peer may "
     "use; its ring's pages are touched only as bytes pass); an SO_RCVBUF the "
     "application sets takes precedence. 0: the default. It is what a blocking "
     "send takes with nobody reading (loopback TCP takes about 4 MB)."},
    {"SDIRECT_CHUNK", SettingKind::integer, "4032",
     "Largest payload of one buffered-protocol message in bytes (header "
     "included it fits the provider's inject size)."},
    {"SDIRECT_RMA_MIN", SettingKind::integer, "16384",
     "Smallest piece of a send that is written straight into the peer's "
     "receive ring with an RMA write (one copy) instead of inline messages."},
    {"SDIRECT_ZCOPY_MIN", SettingKind::integer, "65536",
     "Smallest piece of a blocking send that goes by read zero-copy: the "
     "sender advertises its buffer and the receiver reads it straight into "
     "its own (one copy); the send returns once all was read, or goes on "
     "buffered when the reader has not read for 2 ms. 0: never."},
    {"SDIRECT_STREAM_RING", SettingKind::boolean, "1",
     "With the size thresholds: a blocking send of at most a quarter of "
     "the peer's ring that follows another large send with nothing taken "
     "in from the peer meanwhile (a stream) goes through the ring, where "
     "the sender's copy overlaps the reader's, rather than by read "
     "zero-copy, whose sender waits for each reader. 0: by size alone."},
    {"SDIRECT_RING_HUGE", SettingKind::boolean, "1",
     "A connection's receive ring, once a whole ring's worth has been read "
     "from it (every page already in memory), is backed by huge pages "
     "(madvise MADV_COLLAPSE, Linux 6.1 on): the peer's copies into it "
     "and the reader's out of it handle one page per 2 MB instead of 512. "
     "No memory beyond what the ring holds already. 0: small pages."},
    {"SDIRECT_PROTOCOLS", SettingKind::text, "thresholds",
     "How a send's bytes pick their protocol: thresholds (by size: "
     "SDIRECT_RMA_MIN, SDIRECT_ZCOPY_MIN), auto (per size, the fastest "
     "measured on this host by sdirect-tune, read from SDIRECT_TUNE_FILE; "
     "the thresholds if there is none), or buffered, ring, zcopy (that "
     "protocol wherever it applies)."},
    {"SDIRECT_TUNE_FILE", SettingKind::text, "HOME/.config/sdirect/protocols",
     "The table sdirect-tune writes and SDIRECT_PROTOCOLS=auto reads; HOME "
     "is replaced by $HOME."},
    {"SDIRECT_SINK_MIN", SettingKind::integer, "0",
     "Smallest blocking recv buffer that goes by write zero-copy when "
     "nothing is there to read: the receiver advertises it and the peer's "
     "next send writes straight into it (one copy; the sender does not wait "
     "for the reader). One host: process_vm_writev; otherwise "
     "(SDIRECT_CMA=0, other providers) the provider's RMA write into the "
     "buffer, registered for that recv (all such buffers within half of "
     "RLIMIT_MEMLOCK). 0 (the default, measured faster here): never."},
    {"SDIRECT_CMA", SettingKind::boolean, "1",
     "One host: copy straight between the two processes with "
     "process_vm_readv/writev (ring writes, read zero-copy, write "
     "zero-copy). 0: the provider's RMA, as between hosts (advertised send "
     "buffers are then registered, through the registration cache; recv "
     "buffers advertised for write zero-copy, for their recv alone)."},
    {"SDIRECT_REG_CACHE_MB", SettingKind::integer, "64",
     "Registrations of advertised send buffers kept between sends (the "
     "pin-down cache), in MiB; at most half of RLIMIT_MEMLOCK. 0: register "
     "for every send. Unused where process_vm_readv does the reads."},
    {"SDIRECT_SPIN_US", SettingKind::integer, "50",
     "Microseconds a blocked call polls the fabric before it sleeps on the "
     "doorbell."},
    {"SDIRECT_RX_BUFFERS", SettingKind::integer, "4",
     "Number of multi-receive buffers posted on the process endpoint."},
    {"SDIRECT_RX_BUFFER_SIZE", SettingKind::integer, "1048576",
     "Size of one multi-receive buffer in bytes."},
    {"SDIRECT_MAX_PEERS", SettingKind::integer, "256",
     "Peer processes in the address vector; connections to further peers "
     "stay on TCP."},
    {"SDIRECT_PEER_CACHE", SettingKind::integer, "16",
     "Peer processes kept attached (address vector entry, maps of their "
     "process page and region, doorbell) after their last connection "
     "closed, so that the next connection to them upgrades without "
     "attaching again; the least recently used goes first, and one whose "
     "process ended goes at once. 0: none. At most 64."},
    {"SDIRECT_SAME_PROCESS", SettingKind::boolean, "1",
     "Accelerate connections whose two ends live in the same process."},
    {"SDIRECT_CROSS_USER", SettingKind::boolean, "1",
     "Let a connection between processes of two different uids go direct "
     "(both ends, default registry only). Such a pair never shares the "
     "provider's shm region: its messages go through two queues of the "
     "library's own (a sealed memfd per direction, created by the "
     "receiver, whose reader validates everything), and each side opens "
     "only its process page, read only, to the other's uid. 0: only "
     "processes of one uid go direct (see docs/ARCHITECTURE.md, \"Between "
     "users\")."},
    {"SDIRECT_TAKE_OVER", SettingKind::boolean, "0",
     "1: a process holding a socket shared through fork upgrades it again "
     "while the other holders live, if none of them has used it since its "
     "last fork (a server whose parent keeps an idle copy of each "
     "connection its child serves); one that uses it later has it moved "
     "back to the kernel first. Cost: should the process that took it over "
     "die while direct, the bytes it had not read die with it, and the "
     "other holders get a reset (ECONNRESET) where TCP would go on. 0: the "
     "socket stays on TCP while more than one process holds it."},
    {"SDIRECT_QUEUES", SettingKind::text, "all",
     "Which pairs of processes carry their messages through the library's "
     "own queues instead of the provider's: all (every pair; the ring and "
     "zero-copy stay, by process_vm_* or the provider's RMA) or cross "
     "(only pairs of two uids, and pairs where either end is not dumpable, "
     "which must; one uid's other pairs use the provider's shm queues, "
     "whose shared spinlock a busy host can preempt). Both ends of a pair "
     "follow the initiator's choice."},
    {"SDIRECT_UPGRADE_TIMEOUT_MS", SettingKind::integer, "1000",
     "Longest wait for a peer's answer to an upgrade request, and for the "
     "peer's commit after this side accepted one; on expiry both ends of the "
     "connection stay on TCP."},
    {"SDIRECT_PEER_WAIT_MS", SettingKind::integer, "3000",
     "How long a connection that asked for its upgrade waits for its peer's "
     "(a peer without the library never asks): past it, and 16 turns of the "
     "conversation since its ask, at its next read or write it stays on TCP "
     "for good and its calls cost what the kernel's "
     "cost; a peer that asks later is told so. 0: it waits for as long as "
     "it lives."},
    {"SDIRECT_LEAVE_TIMEOUT_MS", SettingKind::integer, "3000",
     "Longest wait for a peer to answer when a direct connection goes back "
     "to the kernel (shared after fork, exec): on expiry the process that "
     "asked gets EIO on it and the log says why."},
    {"SDIRECT_LEAVE_PAUSE_US", SettingKind::integer, "0",
     "For tests: microseconds the delivery of a peer's leave pauses once "
     "this side's senders can see the connection leaving, which widens the "
     "window in which a send of ours races our answer. 0: no pause."},
    {"SDIRECT_COMMIT_PAUSE_US", SettingKind::integer, "0",
     "For tests: microseconds this side waits, after accepting a peer's "
     "upgrade, before it reads the peer's commit, which widens the window in "
     "which the peer's first fabric bytes arrive before the commit is read. "
     "0: no pause."},
    {"SDIRECT_ENGINE_WAIT_MS", SettingKind::integer, "1000",
     "How long connect() and accept() may wait for the process's fabric "
     "engine while it is first built (~6 ms; longer where libfabric loads "
     "its psm libraries, see README). 0: never wait; connections made meanwhile start on TCP and "
     "are upgraded once the engine is ready."},
    {"SDIRECT_UPGRADE_AFTER_MS", SettingKind::integer, "20",
     "Upgrade only when it can pay: a connection starts on TCP and asks to "
     "go direct at its first read or write that moves bytes once it has "
     "lived this many ms and 16 of its calls have moved bytes (it goes on "
     "exchanging); until then it touches neither the registry nor "
     "the fabric, and the process builds its fabric engine only when its "
     "first connection asks. A connection that is over sooner (one request "
     "and its answer) costs what TCP costs. 0: at once (connect() and "
     "listen() start the engine build, connect() and accept() wait for it "
     "up to SDIRECT_ENGINE_WAIT_MS, and the connection is direct from its "
     "first byte when its server has accepted it by then; against a server "
     "that accepts later it starts on TCP and goes direct when the server's "
     "upgrade comes)."},
    {"SDIRECT_BUILD_AFTER_MS", SettingKind::integer, "250",
     "A connection of a client process that has no fabric engine yet (none "
     "built, none being built) asks to go direct only once it has lived "
     "this many ms too (and SDIRECT_UPGRADE_AFTER_MS): its ask starts the "
     "build, about 6 ms and 5 ms of CPU, and its exit tears the engine "
     "down, which a client that lives a few tens of ms would not earn "
     "back. A server (a process that listened, or a child it forked) and "
     "a process with an engine upgrade at SDIRECT_UPGRADE_AFTER_MS. 0: no "
     "more than SDIRECT_UPGRADE_AFTER_MS; ignored when that is 0."},
    {"SDIRECT_LISTEN_BUILD", SettingKind::boolean, "0",
     "1: a listen() starts the process's fabric engine build at once, in "
     "the background, so that its first connection that earns its upgrade "
     "needs no build (~6 ms). The price: every fork of a process with an "
     "engine copies libfabric's mappings, and each child's exit tears them "
     "down (a fork, exit and wait took 0.41 ms here against 0.21 ms "
     "without an engine), which a server forking a child per short "
     "connection (pgbench -C against PostgreSQL) pays per connection; its "
     "children build their own engine anyway. 0: a server builds at its "
     "first connection that earns its upgrade."},
    {"SDIRECT_EXEC_STDIO", SettingKind::boolean, "1",
     "A program started by exec in place of one that runs the library, and "
     "running it too, re-adopts the connections it inherits and upgrades "
     "them again, those on fd 0, 1 and 2 included: its stdin, stdout and "
     "stderr over a TCP socket are streams whose reads and writes go "
     "through the library. 0: sockets on fd 0, 1 or 2 stay on TCP in the "
     "new program (for one that reaches them through a stream the library "
     "does not see, such as C++'s std::cout). Read from the environment "
     "the exec passes."},
    {"SDIRECT_STATS_FILE", SettingKind::text, "",
     "If set, every connection's counters are appended to this file when the "
     "process exits (one line per connection, sdirect-stat format), also "
     "when it dies of SIGTERM, SIGINT or SIGHUP left at their default. A "
     "connection that never earned its upgrade (SDIRECT_UPGRADE_AFTER_MS) "
     "has none, and a process that never built its engine writes nothing."},
    {"SDIRECT_LOG_FILE", SettingKind::text, "",
     "If set, log lines (SDIRECT_LOG) are appended to this file instead of "
     "stderr, which a daemon may have closed or sent to /dev/null."},
    {"SDIRECT_RULES", SettingKind::text, "",
     "If set, the file of rules that decide which connections may go "
     "direct: one per line, `direct` or `kernel`, then any of program=NAME "
     "user=UID|NAME role=client|server local=ADDR:PORT remote=ADDR:PORT "
     "(ADDR: *, a.b.c.d or [v6], with /PREFIX; PORT: *, N or LOW-HIGH); "
     "the first match decides, and no match means direct. A file that "
     "cannot be read or parsed keeps every connection on TCP, with one "
     "error line. sdirect-info shows the rules in force."},
};
static_assert(sizeof(table) / sizeof(table[0]) == std::size_t(Key::count_));

Settings values{};
// Two, so that a process whose ids change derives its new registry into
// the one nobody reads and then points `values.registry` at it.
char registry_paths[2][256];
int registry_turn = 0;
// SDIRECT_REGISTRY as read at load: the environment may be written over
// by then (a server's process title).
const char *registry_setting = nullptr;
char tune_path[512];

const char *raw(Key key) noexcept {
    const Setting &s = table[std::size_t(key)];
    const char *env = std::getenv(s.name);
    return env && *env ? env : s.fallback;
}

// One line naming the setting, what it takes, and the default used.
void complain(Key key, const char *text, const char *valid) noexcept {
    std::fprintf(stderr, "sdirect: ignoring %s=%s (valid: %s), using %s\n",
                 table[std::size_t(key)].name, text, valid,
                 table[std::size_t(key)].fallback);
}

std::uint32_t integer(Key key) noexcept {
    const char *text = raw(key);
    char *end = nullptr;
    unsigned long long v = std::strtoull(text, &end, 0);
    if (end == text || *end != '\0' || v > 0xffffffffull) {
        complain(key, text, "a number from 0 to 4294967295");
        v = std::strtoull(table[std::size_t(key)].fallback, nullptr, 0);
    }
    return std::uint32_t(v);
}

bool boolean(Key key) noexcept {
    const char *text = raw(key);
    if (!std::strcmp(text, "1") || !std::strcmp(text, "yes") || !std::strcmp(text, "on"))
        return true;
    if (!std::strcmp(text, "0") || !std::strcmp(text, "no") || !std::strcmp(text, "off"))
        return false;
    complain(key, text, "1, yes, on, 0, no, off");
    return table[std::size_t(key)].fallback[0] == '1';
}

// A copy that lives as long as the process (never freed: settings are
// loaded once); the original when no memory is left.
const char *copy(const char *text) noexcept {
    char *dup = strdup(text);
    return dup ? dup : text;
}

int log_level(const char *text) noexcept {
    static constexpr const char *names[] = {"silent", "error", "info", "debug"};
    for (int i = 0; i < 4; ++i)
        if (!std::strcmp(text, names[i])) return i;
    if (text[0] >= '0' && text[0] <= '3' && text[1] == '\0') return text[0] - '0';
    complain(Key::log, text, "silent, error, info, debug, 0-3");
    return 0;
}

// SDIRECT_QUEUES: all or cross.
bool queues_all(const char *text) noexcept {
    if (!std::strcmp(text, "all")) return true;
    if (!std::strcmp(text, "cross")) return false;
    complain(Key::queues, text, "all, cross");
    return !std::strcmp(table[std::size_t(Key::queues)].fallback, "all");
}

}  // namespace

void derive_registry() noexcept {
    const char *reg = registry_setting ? registry_setting : raw(Key::registry);
    char *out = registry_paths[registry_turn];
    registry_turn ^= 1;
    char base[sizeof registry_paths[0]];
    if (!std::strcmp(reg, table[std::size_t(Key::registry)].fallback))
        std::snprintf(base, sizeof base, "/dev/shm/sdirect-%u", unsigned(getuid()));
    else
        std::snprintf(base, sizeof base, "%s", reg);
    choose_registry(base, out, sizeof registry_paths[0]);
    values.registry = out;
}

const Setting *setting_table(std::size_t *count) noexcept {
    *count = sizeof(table) / sizeof(table[0]);
    return table;
}

SD_CHILD_PATH const Settings &settings() noexcept { return values; }

void load_settings() noexcept {
    values.enable = boolean(Key::enable);
    values.log = log_level(raw(Key::log));
    // Copies: programs such as servers that set their process title write
    // over the environment strings later.
    values.provider = copy(raw(Key::provider));
    // Decided here, before any thread exists; a name another user took
    // is passed over.
    registry_setting = copy(raw(Key::registry));
    derive_registry();
    const char *reg = registry_setting;
    values.window = integer(Key::window);
    values.chunk = integer(Key::chunk);
    if (values.chunk < 64) values.chunk = 64;
    values.rma_min = integer(Key::rma_min);
    values.cma = boolean(Key::cma);
    values.reg_cache_mb = integer(Key::reg_cache_mb);
    values.zcopy_min = integer(Key::zcopy_min);
    values.stream_ring = boolean(Key::stream_ring);
    values.ring_huge = boolean(Key::ring_huge);
    values.sink_min = integer(Key::sink_min);
    if (values.zcopy_min && values.zcopy_min < values.chunk + 1) values.zcopy_min = values.chunk + 1;
    if (values.rma_min < values.chunk + 1) values.rma_min = values.chunk + 1;
    values.spin_us = integer(Key::spin_us);
    values.rx_buffers = integer(Key::rx_buffers);
    if (values.rx_buffers < 2) values.rx_buffers = 2;
    values.rx_buffer_size = integer(Key::rx_buffer_size);
    if (values.rx_buffer_size < (1u << 16)) values.rx_buffer_size = 1u << 16;
    values.max_peers = integer(Key::max_peers);
    values.peer_cache = integer(Key::peer_cache);
    if (values.peer_cache > 64) values.peer_cache = 64;
    values.same_process = boolean(Key::same_process);
    values.take_over = boolean(Key::take_over);
    // Only between default registries: the other uid's is found by its
    // name (/dev/shm/sdirect-UID).
    values.cross_user =
        boolean(Key::cross_user) && !std::strcmp(reg, table[std::size_t(Key::registry)].fallback);
    values.queues_all = queues_all(raw(Key::queues));
    values.upgrade_timeout_ms = integer(Key::upgrade_timeout_ms);
    values.peer_wait_ms = integer(Key::peer_wait_ms);
    values.leave_timeout_ms = integer(Key::leave_timeout_ms);
    values.leave_pause_us = integer(Key::leave_pause_us);
    values.commit_pause_us = integer(Key::commit_pause_us);
    values.engine_wait_ms = integer(Key::engine_wait_ms);
    values.upgrade_after_ms = integer(Key::upgrade_after_ms);
    values.build_after_ms = integer(Key::build_after_ms);
    values.listen_build = boolean(Key::listen_build);
    values.exec_stdio = boolean(Key::exec_stdio);
    values.stats_file = copy(raw(Key::stats_file));
    values.log_file = copy(raw(Key::log_file));
    values.rules = copy(raw(Key::rules));
    values.protocols = copy(raw(Key::protocols));
    const char *tune = raw(Key::tune_file);
    const char *home = std::getenv("HOME");
    if (!std::strncmp(tune, "HOME/", 5))
        std::snprintf(tune_path, sizeof tune_path, "%s/%s", home && *home ? home : "/", tune + 5);
    else
        std::snprintf(tune_path, sizeof tune_path, "%s", tune);
    values.tune_file = tune_path;
}

}  // namespace sd::transport
