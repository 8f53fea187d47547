// The host registry's directory: which one this uid uses, whether it is
// ours alone, and the removal of what dead processes left in it.
#pragma once
#include <cstddef>
#include <cstdint>

namespace sd::transport {

inline constexpr std::uint32_t kEntryMagic = 0x45524453;  // "SDRE"

// Registry entry <registry>/c-<netns>-<family>-<local>-<peer>: one half of
// a connection. Layout version 3, 128 bytes. Created with O_EXCL and
// written with one write(); a reader that comes between the two, or in the
// middle of the write, finds it short or its check wrong and takes it as
// not published yet (each end writes its own entry before it looks for the
// other's, so one of them always sees the other's whole). A name still
// held by an earlier connection of the same 4-tuple is replaced atomically
// instead (temporary file <entry>.<pid>.tmp, then rename).
struct Entry {
    std::uint32_t magic;
    std::uint32_t version;
    std::int32_t pid;
    std::uint32_t conn_id;
    std::uint32_t gen;
    std::uint32_t acceptor;
    char addr[80];  // fabric address (fi_getname string), NUL-terminated
    // Not 0: this end stays on the kernel for this Reason (no upgrade);
    // the other end reports it (peer_kernel) instead of no_peer.
    std::uint32_t kernel_why;
    // Not 0: this end takes its peers' messages only through the message
    // queues (it was not dumpable when it wrote this): the initiator
    // offers its queue in the request (handshake.cpp).
    std::uint32_t queues;
    // CLOCK_MONOTONIC just before the entry was written: a connecting
    // side that finished writing its own entry before this time knows that
    // the acceptor's lookup, which follows its write, finds it (and so
    // initiates): it does not cross that request with one of its own.
    std::uint64_t written_ns;
    std::uint64_t check;  // entry_check() of the bytes before it
};
static_assert(sizeof(Entry) == 128);
static_assert(offsetof(Entry, pid) == 8 && offsetof(Entry, addr) == 24);
static_assert(offsetof(Entry, kernel_why) == 104 && offsetof(Entry, written_ns) == 112 &&
              offsetof(Entry, check) == 120);
inline constexpr std::uint32_t kEntryVersion = 3;

// FNV-1a of the entry's first 120 bytes.
inline std::uint64_t entry_check(const Entry &e) noexcept {
    const auto *b = reinterpret_cast<const unsigned char *>(&e);
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (std::size_t i = 0; i < offsetof(Entry, check); ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

// A whole entry of this layout.
inline bool entry_valid(const Entry &e) noexcept {
    return e.magic == kEntryMagic && e.version == kEntryVersion && e.pid > 0 &&
           e.check == entry_check(e);
}

// Names tried after `base` when it belongs to someone else: base-1 ...
// base-(kRegistryTries - 1).
inline constexpr int kRegistryTries = 64;

// Picks the registry directory for `base` (the setting, UID already
// replaced): the first of base, base-1, base-2 ... that either does not
// exist or is a real directory (not a symlink) owned by our uid that
// no group or other may read or write (search, 0711, is allowed: see
// crossuser.hpp). Every process of one uid looks at the same
// names in the same order, so both ends of a connection agree; a name
// another user created first (squatting) is passed over. No name fits:
// `base` itself, which claim_registry() then refuses. Creates nothing.
void choose_registry(const char *base, char *out, std::size_t n) noexcept;

// Creates the chosen directory if needed (mode 0700) and checks it is
// ours alone: a directory another user could write would let them plant
// entries and control sockets. 0 or -errno (-EPERM: someone else's).
int claim_registry(const char *dir) noexcept;

// Logs, once per process, that the first name was someone else's.
void report_registry_choice() noexcept;

// Removes what processes that could not clean up (SIGKILL, crash) left in
// `dir`: connection entries and their temporary files, control sockets and
// pages whose pid is gone, and their shm regions. Bounded work per call.
void sweep_registry(const char *dir) noexcept;

}  // namespace sd::transport
