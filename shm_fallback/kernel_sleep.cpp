#include "kernel_sleep.hpp"

#include "table.hpp"
#include "transport/lock_order.hpp"
#include "transport/renew.hpp"
#include "transport/sys.hpp"
#include "transport/wait.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <new>

namespace sd::fallback {

using transport::sys;

namespace {

// The waits asleep in the kernel. A leaf of the lock order
// (transport/lock_order.hpp): taken under a stream's pend_lock
// (kernel_waits_wake runs under it), nothing under it; a sleeper holds
// no other lock while it takes it.
transport::RankedMutex<transport::Rank::leaf> sleeps_lock;
boost::intrusive::list<KernelSleep, boost::intrusive::constant_time_size<false>> sleeps;
std::atomic<int> n_sleeps{0};

}  // namespace

void kernel_sleep_enter(KernelSleep &k) noexcept {
    std::lock_guard lock(sleeps_lock);
    sleeps.push_back(k);
    n_sleeps.fetch_add(1, std::memory_order_relaxed);
}

void kernel_sleep_leave(KernelSleep &k) noexcept {
    std::lock_guard lock(sleeps_lock);
    sleeps.erase(sleeps.iterator_to(k));
    n_sleeps.fetch_sub(1, std::memory_order_relaxed);
}

void kernel_sleep_signal(int efd, std::atomic<bool> *signalled) noexcept {
    if (efd < 0 || (signalled && signalled->exchange(true, std::memory_order_acq_rel))) return;
    const std::uint64_t one = 1;
    (void)sys.write(efd, &one, sizeof one);
}

void drain_fd(int fd) noexcept {
    std::uint64_t v;
    (void)sys.read(fd, &v, sizeof v);
}

void kernel_waits_wake() noexcept {
    // A sleeper entered the list before it held any ask back, and the
    // caller saw the hold under the stream's pend_lock: it sees the count.
    if (n_sleeps.load(std::memory_order_relaxed) == 0) return;
    std::lock_guard lock(sleeps_lock);
    for (KernelSleep &k : sleeps) kernel_sleep_signal(k.efd, k.signalled);
}

SD_CHILD_PATH void kernel_sleeps_after_fork_child() noexcept {
    // The list's records live on the stacks of the parent's threads.
    transport::renew(sleeps_lock);
    if (!sleeps.empty()) new (&sleeps) decltype(sleeps)();
    transport::renew(n_sleeps, 0);
}

bool kernel_may_answer(Stream *s, bool *held, bool alone) noexcept {
    *held = false;
    // The peer's bytes read before the kernel socket (prefix.cpp): ours
    // to report.
    if (Prefix *p = s->prefix.load(std::memory_order_acquire); p && prefix_left(p)) return false;
    if (!s->orphan.load(std::memory_order_acquire) && !s->may_go_direct()) {
        // A listener, TCP for good, or a connection that left the fabric
        // for good: the kernel has it from now on. (A socket not connected
        // yet is none of them: another thread may connect it meanwhile.)
        if (s->phase.load(std::memory_order_acquire) == Phase::listener ||
            s->for_good.load(std::memory_order_acquire) || s->conn.load(std::memory_order_acquire))
            return true;
    }
    if (alone) return s->may_wait_in_kernel();
    if (!s->hold_for_kernel_wait()) return false;
    s->refs.fetch_add(1, std::memory_order_relaxed);
    *held = true;
    return true;
}

void kernel_wait_done(Stream *s) noexcept {
    s->end_kernel_wait();
    release(s);
}

int poll_in_kernel(pollfd *fds, nfds_t n, Stream *const *ours, int timeout_ms,
                   const sigset_t *mask, bool *again) noexcept {
    *again = false;
    if (transport::Engine *e = transport::Engine::current(); e && e->flush_pending())
        return kNotHere;  // bytes owed by a leave wait for progress passes
    const bool alone = transport::one_thread();
    const int bell = alone ? -1 : transport::thread_bell();
    if (!alone && bell < 0) return kNotHere;
    constexpr nfds_t kInline = 32;
    pollfd inline_fds[kInline + 1];
    Stream *inline_held[kInline];
    pollfd *all = inline_fds;
    Stream **held = inline_held;
    if (n > kInline) {
        all = static_cast<pollfd *>(std::malloc((n + 1) * sizeof(pollfd)));
        held = static_cast<Stream **>(std::malloc(n * sizeof(Stream *)));
    }
    int r = kNotHere;
    if (all && held) {
        KernelSleep me;
        me.efd = bell;
        if (!alone) kernel_sleep_enter(me);
        nfds_t nheld = 0;
        bool ok = true;
        for (nfds_t i = 0; i < n && ok; ++i) {
            bool h = false;
            if (ours[i]) ok = kernel_may_answer(ours[i], &h, alone);
            if (h) held[nheld++] = ours[i];
        }
        if (ok) {
            // Alone: the bell's slot is left out of the call.
            const nfds_t total = alone ? n : n + 1;
            std::copy(fds, fds + n, all);
            all[n] = {bell, POLLIN, 0};
            if (mask) {
                timespec ts{timeout_ms / 1000, long(timeout_ms % 1000) * 1000000};
                r = sys.ppoll(all, total, timeout_ms < 0 ? nullptr : &ts, mask);
            } else {
                r = sys.poll(all, total, timeout_ms);
            }
            const int err = errno;
            if (r >= 0) {
                if (!alone && all[n].revents) {
                    drain_fd(bell);
                    --r;
                    *again = r == 0;
                }
                for (nfds_t i = 0; i < n; ++i) fds[i].revents = all[i].revents;
            } else {
                r = -err;
            }
        }
        if (!alone) kernel_sleep_leave(me);
        for (nfds_t i = 0; i < nheld; ++i) kernel_wait_done(held[i]);
    }
    if (all != inline_fds) std::free(all);
    if (held != inline_held) std::free(held);
    return r;
}

}  // namespace sd::fallback
