// exec in place of a program that runs the library too: the connections
// it inherits are handed over instead of leaving the fabric for good.
// The exec'ing image moves each such connection back to its kernel socket
// (the peer waits there, rearmed, for an upgrade) and tells the new image
// the stream offsets where the kernel took over, in one environment
// variable; the new image, at the first use of such an fd, tracks the
// socket again from those offsets and upgrades it as it would a fresh
// connection. A new image without the library never reads the variable:
// the socket is plain TCP there, as before.
#pragma once
#include <cstddef>
#include <cstdint>

namespace sd::fallback {
class Stream;
}

namespace sd::forking {

// The variable's name ("SDIRECT_INHERIT").
extern const char kInheritVar[];

// Whether the environment `envp` preloads this library: LD_PRELOAD names
// a file with this library's file name. (A new image may still not run
// it: a static or set-user-ID program; it then keeps TCP.)
bool env_preloads_library(char *const envp[]) noexcept;

// Before an exec in place whose new image preloads the library (not in a
// vfork child): every inherited socket that can be handed over is, the
// others go back to the kernel for good (exec, as table_before_exec).
// A socket on fd 0, 1 or 2 of the new program is handed over only when
// `envp` sets SDIRECT_EXEC_STDIO (glibc's stdin, stdout and stderr write
// and read through calls no interposer sees).
// Writes "SDIRECT_INHERIT=..." into `out` (at most `cap` bytes, NUL
// included) and returns its length, 0 when nothing was handed over.
std::size_t table_hand_over_for_exec(char *const envp[], char *out, std::size_t cap) noexcept;

// The exec returned (it failed): what was prepared for the new image only
// is undone (the arena's fd closes on exec again). The sockets stay on TCP.
void hand_over_failed() noexcept;

// The hand-over under way passed this orphan on as one: the exec leaves
// it to the new image, which asks its owner to leave at its first use.
bool handed_as_orphan(const fallback::Stream &s) noexcept;

// The new image, at its start: reads (and removes) the variable when it
// was written for this process.
void inherit_init() noexcept;

// Sockets handed over wait to be tracked at their first use (cheap when
// nothing was handed over).
bool inherit_waiting() noexcept;
// The table found no stream at `fd` (shm_fallback's acquire, through
// fork_hooks): one handed over to this image by an exec in place is
// tracked now, with the table's reference and one for the caller; else
// nullptr.
fallback::Stream *adopt_inherited(int fd) noexcept;

// The kernel socket's own position: bytes written into it and bytes read
// from it, up to constants of the connection (retransmissions, FINs and
// arrivals do not move them; a read or a write does). False if the
// kernel does not say (no tcp_info fields).
bool kernel_position(int fd, std::uint64_t &written, std::uint64_t &read) noexcept;

}  // namespace sd::forking
