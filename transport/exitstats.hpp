// What a process leaves behind when it ends: its counters appended to
// SDIRECT_STATS_FILE and its process page kept in <registry>/exited/, so
// that sdirect-stat -a can still show its connections. Also when it dies
// of SIGTERM, SIGINT or SIGHUP while their disposition is the default one.
#pragma once
#include <csignal>
#include <cstdint>

namespace sd::transport {

// <registry>/exited holds at most this many pages, none older than
// kExitedMaxAgeS; the oldest go first (at each normal exit).
inline constexpr int kExitedMax = 64;
inline constexpr long kExitedMaxAgeS = 24 * 3600;

// Installs our handler for SIGTERM, SIGINT and SIGHUP wherever the
// disposition is SIG_DFL (once; the engine's first build calls it). The
// handler writes the counters, then restores SIG_DFL and raises the signal
// again: the process dies of it as without the library.
void watch_exit_signals() noexcept;

// sigaction() as the application sees it: where our handler stands in for
// SIG_DFL it reports SIG_DFL; setting any disposition replaces ours (one
// set to SIG_DFL keeps ours in its place). 0 or -errno.
int app_sigaction(int sig, const struct sigaction *act, struct sigaction *old) noexcept;
// How many times the application has set `sig`'s disposition (through
// app_sigaction); and, where it has, that disposition put back as its own
// call made it (our handler for SIG_DFL of a watched signal): what the
// engine's builder restores after the provider's endpoint open when the
// application set one meanwhile, instead of the one it saved before.
std::uint32_t app_disposition_sets(int sig) noexcept;
void put_back_app_disposition(int sig) noexcept;
// signal(), bsd_signal() (flags SA_RESTART) and sysv_signal() (flags
// SA_RESETHAND | SA_NODEFER) in terms of app_sigaction. 0 or -errno.
int app_signal(int sig, sighandler_t handler, int flags, sighandler_t *old) noexcept;
// Before a call that sets a disposition we do not model (sigset): our
// handler makes way for SIG_DFL first, so the call reports SIG_DFL.
void drop_exit_handler(int sig) noexcept;

// Moves this process's page (<registry>/p<pid>) to <registry>/exited/
// and trims that folder. Async-signal-safe when `trim` is false.
void keep_exited_page(int pid, bool trim) noexcept;

}  // namespace sd::transport
