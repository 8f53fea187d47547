// Every SDIRECT_* setting, declared once: name, kind, default, help.
// Values are read from the environment once, in the library constructor,
// before any thread exists; afterwards the table is read-only.
#pragma once
#include <cstdint>
#include <string_view>

namespace sd::transport {

enum class SettingKind : std::uint8_t { integer, text, boolean };

struct Setting {
    const char *name;      // environment variable
    SettingKind kind;
    const char *fallback;  // default, as text
    const char *help;
};

// Index of each setting in the table; keep in step with settings.cpp.
enum class Key : std::uint8_t {
    enable,
    log,
    provider,
    registry,
    window,
    chunk,
    rma_min,
    zcopy_min,
    stream_ring,
    ring_huge,
    protocols,
    tune_file,
    sink_min,
    cma,
    reg_cache_mb,
    spin_us,
    rx_buffers,
    rx_buffer_size,
    max_peers,
    peer_cache,
    same_process,
    cross_user,
    take_over,
    queues,
    upgrade_timeout_ms,
    peer_wait_ms,
    leave_timeout_ms,
    leave_pause_us,
    commit_pause_us,
    engine_wait_ms,
    upgrade_after_ms,
    build_after_ms,
    listen_build,
    exec_stdio,
    stats_file,
    log_file,
    rules,
    count_
};

struct Settings {
    bool enable;
    int log;                  // 0 silent, 1 error, 2 info, 3 debug
    const char *provider;
    const char *registry;     // directory of the per-uid host registry
    std::uint32_t window;     // receive window per connection, bytes
    std::uint32_t chunk;      // largest buffered message payload
    std::uint32_t rma_min;    // smallest piece written straight into the peer's ring
    std::uint32_t zcopy_min;  // smallest piece sent by read zero-copy (0: never)
    bool stream_ring;         // a stream's large sends go through the ring (thresholds)
    bool ring_huge;           // a ring read through becomes huge pages
    std::uint32_t sink_min;   // smallest recv buffer advertised for write zero-copy (0: never)
    bool cma;                 // one host: process_vm_readv/writev copies
    std::uint32_t reg_cache_mb;  // registration cache budget (0: off)
    std::uint32_t spin_us;
    std::uint32_t rx_buffers;
    std::uint32_t rx_buffer_size;
    std::uint32_t max_peers;
    std::uint32_t peer_cache;  // idle peers kept attached (0: none)
    bool same_process;        // accelerate connections within one process
    bool cross_user;          // connections between processes of different uids may go direct
    bool take_over;           // a holder of a shared socket takes it over from idle holders
    bool queues_all;          // our message queues between processes of one uid too
    std::uint32_t upgrade_timeout_ms;
    std::uint32_t peer_wait_ms;      // a connection waits this long for its peer's upgrade (0: for ever)
    std::uint32_t leave_timeout_ms;  // longest wait for a peer to answer our leave
    std::uint32_t leave_pause_us;    // tests: a peer's leave is delivered this much slower
    std::uint32_t commit_pause_us;   // tests: a peer's commit is read this much later
    std::uint32_t engine_wait_ms;  // connect/accept wait this long for the engine
    std::uint32_t upgrade_after_ms;  // a connection asks to go direct at this age (0: at once)
    std::uint32_t build_after_ms;    // ... and at this age when its ask would start a build
    bool listen_build;               // listen() starts the engine build
    bool exec_stdio;  // an exec'd program re-adopts inherited sockets on fds 0-2 too
    const char *stats_file;   // counters appended here at exit ("" = off)
    const char *log_file;     // log lines appended here instead of stderr ("" = stderr)
    const char *protocols;    // thresholds, auto, buffered, ring, zcopy (protocol.hpp)
    const char *tune_file;    // sdirect-tune's table
    const char *rules;        // rules file (rules.hpp; "" = none)
};

// The table, for sdirect-info and the parser.
const Setting *setting_table(std::size_t *count) noexcept;

// Parsed values; valid after load_settings().
const Settings &settings() noexcept;

// Reads the environment. Unparsable values keep the default and are
// reported once on stderr (one line each).
void load_settings() noexcept;
// The registry for the real uid in force (SDIRECT_REGISTRY's UID): at
// load, and again when a process that holds nothing of the fabric changes
// its ids (afresh.cpp). Never while an engine exists.
void derive_registry() noexcept;

}  // namespace sd::transport
