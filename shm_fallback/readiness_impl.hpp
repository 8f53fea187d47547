// What readiness.cpp, poll.cpp and epoll.cpp share (readiness.hpp is the
// interface): our own state's view of a socket, deadlines, the epoll sets
// poll looks into, and the wait loop of poll and epoll.
#pragma once
#include "stream.hpp"
#include "transport/engine.hpp"
#include "transport/settings.hpp"
#include "transport/sys.hpp"
#include "transport/wait.hpp"

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <ctime>
#include <poll.h>

namespace sd::fallback::detail {

using transport::monotonic_ns;
using transport::sys;

constexpr short kReadBits = POLLIN | POLLRDNORM;
constexpr short kWriteBits = POLLOUT | POLLWRNORM;

// Readiness from our own state, when the connection is direct and every
// byte the kernel was due to carry has been read. `ask`: what to ask the
// companion (POLLRDHUP while the fabric has not said EOF: a hint that the
// peer died). False: the kernel knows better (not direct yet, or bytes
// still due on the companion socket).
bool user_view(Stream *s, short &bits, short &ask) noexcept;

// The socket's prefix (prefix.hpp) holds bytes still to read: they come
// before anything of its kernel socket's.
bool has_prefix(Stream *s) noexcept;

// The companion said its TCP peer is gone while the fabric is silent.
void kernel_hint(Stream *s) noexcept;

// The deadline of a wait of `timeout_ms` (0: none, for a timeout of 0 or
// forever), and the milliseconds left until it as a timeout argument
// (-1: forever).
std::uint64_t deadline_of(int timeout_ms) noexcept;
int ms_left(std::uint64_t deadline, int timeout_ms) noexcept;

// An epoll set of ours, by epoll fd (epoll.cpp): a reference taken, or
// null; released with set_release. `inner_ready`: one of its events is
// pending (`depth`: how deep in nested sets it is).
struct EpollSet;
EpollSet *set_acquire(int fd) noexcept;
void set_release(EpollSet *set) noexcept;
bool inner_ready(EpollSet *set, int depth) noexcept;
// Registers a sleep on `set` (the caller holds it) and on everything in it
// that can turn ready: its connections and the sets nested in it.
void enlist_set(EpollSet *set, transport::Watch &w) noexcept;
// Registers a sleep on the connection of our socket `s` (the caller holds
// `s`), or on everything when it has none yet but may get one.
void enlist_stream(Stream *s, transport::Watch &w, void (*drop)(void *), void *hold) noexcept;

// ---- the wait loop shared by poll and epoll --------------------------------------

// While spinning, the kernel is asked about the application's kernel fds
// and the companions' death hints at most this often: a kernel poll of a
// few sockets costs more than a whole look at our own state, and pgbench's
// poll() over 8 direct sockets spent most of its CPU in it.
inline constexpr std::uint64_t kAskKernelEveryNs = 20000;

// Spins (SDIRECT_SPIN_US) then sleeps on `kfds` and what `in` enlists
// until `check(ask_kernel)` finds something, the timeout passes or a
// signal arrives: the doorbell wait's one loop (transport::wait_on_bell)
// with poll's hooks. `ask_kernel`: this look includes the kernel's view
// (the first, every kAskKernelEveryNs of a spin, the first after a sleep
// whose poll reported one of the kernel's fds, or kAskKernelEveryNs after
// one that did not, and the last before the timeout). No spin under a signal mask
// (ppoll, pselect, epoll_pwait: the mask is the kernel's to apply); a
// signal ends the wait with -EINTR (poll and epoll are never restarted).
// Nor while `fabric` (when given) says the last look found none of the
// sockets on the fabric: the kernel reports them all (sockets waiting for
// their peer's upgrade, a peer that may never ask), and a spin would only
// ask it again and again; the sleep watches their connections, whose
// upgrade wakes it.
template <typename Check>
struct PollWaiter : transport::BellWaiter {
    Check &check;
    pollfd *kfds;
    nfds_t nk;
    int timeout_ms;
    const sigset_t *mask;
    const transport::Interest &in;
    const bool *fabric;
    std::uint64_t ask_kernel_at = 0;
    bool asked_kernel = false;

    PollWaiter(Check &ch, pollfd *f, nfds_t n, int tmo, const sigset_t *m,
               const transport::Interest &i, const bool *fab) noexcept
        : check(ch), kfds(f), nk(n), timeout_ms(tmo), mask(m), in(i), fabric(fab) {}

    long look() noexcept {
        if (e) e->progress();
        const std::uint64_t now = monotonic_ns();
        asked_kernel = now >= ask_kernel_at;
        if (asked_kernel) ask_kernel_at = now + kAskKernelEveryNs;
        const int n = check(asked_kernel);
        if (n != 0 || timeout_ms == 0) return n;
        return transport::kWaitOn;
    }
    long timed_out() noexcept {
        if (asked_kernel) return 0;
        ask_kernel_at = 0;  // the last look before timing out asks the kernel too
        return transport::kLookAgain;
    }
    bool may_spin() const noexcept { return !mask && (!fabric || *fabric); }
    int sleep(std::uint64_t) noexcept {
        int left = detail::ms_left(deadline_ns, timeout_ms);
        if (!e) {
            // Connections wait for the engine being built: look again soon.
            e = transport::Engine::current();
            if (left < 0 || left > 20) left = 20;
        }
        int r;
        if (e) {
            // The sleep's poll asked the kernel: the next look asks again
            // only if it reported one of the kernel's fds (what woke us
            // was the kernel's) or once kAskKernelEveryNs has passed.
            bool polled = false;
            r = transport::sleep_on_fds(e, kfds, nk, mask, left, in, &polled);
            ask_kernel_at = polled && r == 0 ? monotonic_ns() + kAskKernelEveryNs : 0;
        } else if (mask) {
            ask_kernel_at = 0;  // what woke us may be the kernel's
            timespec ts{left / 1000, long(left % 1000) * 1000000};
            r = sys.ppoll(kfds, nk, left < 0 ? nullptr : &ts, mask);
        } else {
            ask_kernel_at = 0;
            r = sys.poll(kfds, nk, left);
        }
        return r < 0 && (r == -1 ? errno : -r) == EINTR ? -EINTR : 0;
    }
    long interrupted() noexcept { return -EINTR; }
};

template <typename Check>
int wait_loop(Check check, pollfd *kfds, nfds_t nk, int timeout_ms, const sigset_t *mask,
              const transport::Interest &in, const bool *fabric = nullptr) noexcept {
    PollWaiter<Check> w(check, kfds, nk, timeout_ms, mask, in, fabric);
    w.e = transport::Engine::current();
    w.spin_ns = std::uint64_t(transport::settings().spin_us) * 1000;
    w.deadline_ns = deadline_of(timeout_ms);
    transport::SpinSlot slot;
    transport::PollWait wait;
    return int(transport::wait_on_bell(w, slot));
}

}  // namespace sd::fallback::detail
