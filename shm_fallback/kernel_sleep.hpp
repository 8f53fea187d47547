// Readiness waits that need nothing of ours sleep in the kernel's own poll
// or epoll_wait, one system call as without the library.
//
// A socket of ours needs nothing of ours while it is on the kernel and has
// not asked for its upgrade: until it asks, only a call of this process
// can bring it to the fabric (it is in no registry), and the ask is held
// back while the wait sleeps (Stream::hold_for_kernel_wait, as a blocking
// recv holds it back). A call that would ask meanwhile wakes the wait
// (kernel_waits_wake), which makes the ask as it returns and looks again,
// so a thread asleep in the kernel never sleeps through the peer's switch
// to the fabric. A socket on the kernel for good needs nothing of ours
// either. Anything else (a direct or shared socket, one that asked, bytes
// read before its kernel socket, an epoll set with shadows inside) and
// the wait is the library's (poll.cpp, epoll.cpp).
//
// Every such wait sleeps on one more fd, written to wake it: the thread's
// bell for poll, select and their variants; for epoll, an eventfd of the
// set registered in it once (its data word tagged, kWakeTag, with our
// pid), which epoll_ctl from another thread also writes when it changes
// the set's sockets of ours. A woken wait that found nothing for the
// application looks again with the time left; timeouts, signals and masks
// are the kernel's own.
//
// In a process that never started a second thread (transport::one_thread:
// a forked server's child, a single-threaded event loop, without an
// engine, whose threads would count) nobody can ask, attach, change the
// set or ring while its only thread sleeps, and a signal's handler ends
// the sleep (poll and epoll_wait are never restarted): such a wait holds
// nothing, joins no list and sleeps on no extra fd (no eventfd is made).
#pragma once
#include "stream.hpp"

#include <atomic>
#include <boost/intrusive/list.hpp>
#include <climits>
#include <csignal>
#include <cstdint>
#include <poll.h>

namespace sd::fallback {

// A wait needs the library's wait, not the kernel's.
inline constexpr int kNotHere = INT_MIN;

// The data word of an epoll set's wake-up eventfd: the tag, then the pid
// of the process that registered it (a set shared through fork may hold
// the parent's too).
inline constexpr std::uint64_t kWakeTag = 0x5d1full << 48;

// A wait asleep in the kernel, on the list kernel_waits_wake() walks from
// enter to leave. `efd` wakes it; `signalled` (optional) makes repeated
// wake-ups write it once until the sleeper drains it.
struct KernelSleep : boost::intrusive::list_base_hook<> {
    int efd = -1;
    std::atomic<bool> *signalled = nullptr;
};
void kernel_sleep_enter(KernelSleep &k) noexcept;
void kernel_sleep_leave(KernelSleep &k) noexcept;
// Writes `efd`, unless `signalled` says it was written already.
void kernel_sleep_signal(int efd, std::atomic<bool> *signalled) noexcept;
void drain_fd(int fd) noexcept;

// A connection whose ask a readiness wait holds back has earned its
// upgrade: every wait asleep in the kernel returns and looks again. Takes
// no lock of a stream or a set (it runs under pend_lock).
void kernel_waits_wake() noexcept;

// Whether a wait asleep in the kernel may leave `s` to the kernel. `held`:
// its ask is held back, and a reference taken, until kernel_wait_done(s).
// `alone`: the process has one thread (transport::one_thread()), and
// nothing is held: while that thread sleeps, no call can ask.
bool kernel_may_answer(Stream *s, bool *held, bool alone) noexcept;
void kernel_wait_done(Stream *s) noexcept;

// poll over `fds` (ours[i]: our socket at fds[i], reference held, or
// null) in the kernel: what poll returns (-errno on failure), or kNotHere.
// `again`: woken for us with nothing for the application (revents all 0);
// the caller looks again with the time left.
int poll_in_kernel(pollfd *fds, nfds_t n, Stream *const *ours, int timeout_ms,
                   const sigset_t *mask, bool *again) noexcept;

// After fork, in the child: the sleeping waits are the parent's threads'.
void kernel_sleeps_after_fork_child() noexcept;

}  // namespace sd::fallback
