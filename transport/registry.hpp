// The host registry's directory: which one this uid uses, whether it is
// ours alone, and the removal of what dead processes left in it.
#pragma once
#include <cstddef>
#include <cstdint>

namespace sd::transport {

inline constexpr std::uint32_t kEntryMagic = 0x45524453;  // "SDRE"

// Registry entry <registry>/c-<netns>-<family>-<local>-<peer>: one half of
// a connection, written atomically (temporary file <entry>.<pid>.tmp, then
// rename). Layout version 1, 128 bytes.
struct Entry {
    std::uint32_t magic;
    std::uint32_t version;
    std::int32_t pid;
    std::uint32_t conn_id;
    std::uint32_t gen;
    std::uint32_t acceptor;
    char addr[96];  // fabric address (fi_getname string), NUL-terminated
    // Not 0: this end stays on the kernel for this Reason (no upgrade);
    // the other end reports it (peer_kernel) instead of no_peer.
    std::uint32_t kernel_why;
    std::uint32_t pad;
};
static_assert(sizeof(Entry) == 128);
static_assert(offsetof(Entry, pid) == 8 && offsetof(Entry, addr) == 24);
static_assert(offsetof(Entry, kernel_why) == 120);

// Names tried after `base` when it belongs to someone else: base-1 ...
// base-(kRegistryTries - 1).
inline constexpr int kRegistryTries = 64;

// Picks the registry directory for `base` (the setting, UID already
// replaced): the first of base, base-1, base-2 ... that either does not
// exist or is a real directory (not a symlink) owned by our uid with no
// group or other permissions. Every process of one uid looks at the same
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
