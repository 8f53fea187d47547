// The lock order of the engine and of the sockets over it, written once
// and checked.
//
// A thread blocks on a lock only while every lock it holds ranks lower:
//
//   spawn     record_lock           the spawn actions recorded for
//             (intercept/shim_spawn) posix_spawn; its fork handler holds it
//                                   from before the fork protocol's
//                                   prepare step (which takes the locks
//                                   below) to after the child's and
//                                   parent's steps; else nothing under it
//   control   Engine::control_busy_ the control thread's turn, from its
//                                   wake-up to its next sleep; a fork's
//                                   prepare step holds it (try_lock) while
//                                   it marks every stream shared
//   epoll     EpollSet::lock        one epoll set's entries
//             (shm_fallback/epoll)  (shm_fallback/epoll.cpp); under it: the
//                                   sockets' readiness (rx_lock), a hold of
//                                   a socket's ask for a kernel sleep
//                                   (pend_lock), the last reference of a
//                                   socket dropped (its detach: table, tx,
//                                   rx; the pool). The one rank a thread may
//                                   hold twice: a set's lock is taken under
//                                   the sets that contain it (an epoll fd
//                                   in an epoll set), and the kernel refuses
//                                   containment loops, so the nesting
//                                   follows one order too
//   pend      Stream::pend_lock     one socket's pending path: its kernel
//                                   I/O counted before an attach, its ask
//                                   and attach (the table lock under it),
//                                   a fork's share; a take-back
//                                   (take_back_locked) takes the
//                                   connection's tx_lock under it, so a
//                                   send that takes back lets its tx_lock
//                                   go and takes both in this order
//   flush     Engine::flush_lock_   the pass that sends due stages and
//                                   starts due upgrades (taken by try_lock)
//   table     Engine::conn_lock_    the connection table, peers, upgrades
//   tx        Conn::tx_lock         one connection's send side
//   progress  Engine::progress_lock_ the completion queue (try_lock, except
//                                   progress_blocking)
//   rx        Conn::rx_lock         one connection's receive side
//   leaf      shm_fallback's tables, each its own lock: a leaf, taken under
//             any of the above and never with another leaf, nothing ranked
//             taken under it (a checked build asserts all three):
//               Stream::alias_lock  a socket's other fds (stream.cpp)
//               pool_lock           the free streams (table.cpp); a fork's
//                                   prepare step takes it last and holds
//                                   it over the fork
//               sets_lock           the epoll fd -> set table (epoll.cpp);
//                                   a replaced set is released after it
//               sleeps_lock         the waits asleep in the kernel
//                                   (kernel_sleep.cpp), woken under pend
//
// try_lock may be taken in any order (it cannot wait), but never on a lock
// the thread holds already: it would fail, as for std::mutex (where it is
// undefined). Code that may
// run under a lock of its caller asks `held()` instead of trying.
//
// Outside the order, plain std::mutex (XqWriter::lock a FutexMutex): each
// guards one table and takes no other lock of the library under it but
// as listed, so a thread may take one whatever it holds. Under them, as under any lock, a free or munmap may run the
// registration cache's hooks, which take the cache's lock: the innermost
// of all, under which nothing is taken (its provider calls are made
// outside it).
//
//   create_lock     engine_setup.cpp  the engine build: started, pending callbacks
//   pollers_lock    wait.cpp          poll sleeps without a slot; rung under rx
//   watch_lock      wait.cpp          the doorbell's watch and the sleeps
//                                     standing by; a ring under it
//   RegCache::lock_ regcache.cpp      the registration cache (hooks: anywhere)
//   grant_lock      crossuser.cpp     a file's ACL, read, extended, written back
//   XqWriter::lock  xqueue.hpp        a peer of another uid's queue: one post's
//                                     copy into it, a swap for a new one, the
//                                     peer's threads' bells (a FutexMutex)
//   mirror_lock_    xqlink.cpp        our sleepers count copied into our queues,
//                                     a sleeper's word in one; taken under the
//                                     table and progress locks; bells_lock_ and
//                                     XqWriter::lock under it (reap_links_locked)
//   bells_lock_     xqlink.cpp        the links' bells drained, one closed;
//                                     XqWriter::lock under it (a bell kept)
//   dirs_lock       verdict.cpp       the other registries found beside ours
//   addrs_lock      verdict.cpp       this host's addresses
//
// The ranks whose holders code asks about (held(), holds_rank()): flush,
// table, tx, progress and rx. A lock of those ranks keeps its holder's
// token (a number per thread) beside its futex word, and every thread
// counts the locks it holds of each rank: held() and holds_rank() are one
// load and a compare, on a line the lock's holder touches anyway. Builds
// with SDIRECT_LOCK_CHECK (debug and sanitizer builds) also keep the locks
// a thread holds, of every rank, in a small thread-local list (the deepest
// nesting is five: control_busy_ or pend_lock over four of the engine's, or
// a chain of nested epoll sets over rx_lock, at most the kernel's five
// levels deep), and abort with a message on a blocking acquisition out of
// order and on a try_lock of a held lock. Other ranks cost their mutex
// alone in a release build (a socket's calls on the kernel take a few of
// them each).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

namespace sd::transport {

enum class Rank : std::uint8_t {
    spawn = 1,
    control,
    epoll,
    pend,
    flush,
    table,
    tx,
    progress,
    rx,
    leaf,
};

namespace lock_order {

// Whether this rank's locks know their holder (every build), or whether
// the thread's list records them (SDIRECT_LOCK_CHECK).
constexpr bool recorded(Rank r) noexcept {
#ifdef SDIRECT_LOCK_CHECK
    (void)r;
    return true;
#else
    return r == Rank::flush || r == Rank::table || r == Rank::tx || r == Rank::progress ||
           r == Rank::rx;
#endif
}

// Checked before an acquisition (blocking or not), recorded after it.
#ifdef SDIRECT_LOCK_CHECK
void check(const void *m, Rank r, bool blocking) noexcept;
#else
inline void check(const void *, Rank, bool) noexcept {}
#endif
#ifdef SDIRECT_LOCK_CHECK
void acquired(const void *m, Rank r) noexcept;
void released(const void *m) noexcept;
#else
inline void acquired(const void *, Rank) noexcept {}
inline void released(const void *) noexcept {}
#endif

// This thread's token (never 0, never another live thread's: a fork child's
// thread keeps the forking thread's, as it keeps what that thread held),
// and its count of held locks of each rank that knows its holder.
constinit inline thread_local std::uint32_t self_token = 0;
constinit inline thread_local std::uint8_t held_of_rank[16] = {};
std::uint32_t new_token() noexcept;
inline std::uint32_t self() noexcept {
    const std::uint32_t t = self_token;
    return t ? t : new_token();
}
// Whether this thread holds a lock of rank `r` (a rank that knows its
// holders, or any rank where the order is checked).
inline bool holds_rank(Rank r) noexcept {
    return recorded(r) && held_of_rank[unsigned(r)] != 0;
}
// Whether this build aborts on a violation (SDIRECT_LOCK_CHECK).
bool checked() noexcept;

}  // namespace lock_order

// The mutex under every lock of the order: a futex word (0 free, 1 taken,
// 2 taken with a sleeper), its uncontended lock and unlock one atomic
// operation each, inline. Private to the process, as a default std::mutex
// is; reset in place (placement new) where a fork child renews one.
// std::mutex costs a call into libc and back each way, and a connection
// on the kernel takes some fifteen of them.
class FutexMutex {
public:
    void lock() noexcept {
        std::uint32_t c = 0;
        if (!w_.compare_exchange_strong(c, 1, std::memory_order_acquire,
                                        std::memory_order_relaxed))
            lock_contended(c);
    }
    bool try_lock() noexcept {
        std::uint32_t c = 0;
        return w_.compare_exchange_strong(c, 1, std::memory_order_acquire,
                                          std::memory_order_relaxed);
    }
    void unlock() noexcept {
        if (w_.exchange(0, std::memory_order_release) == 2) wake_one();
    }

private:
    // Looks at a taken word before sleeping on it (about a microsecond).
    static constexpr int kSpins = 64;
    static void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        asm volatile("yield");
#endif
    }
    void lock_contended(std::uint32_t c) noexcept;
    void wake_one() noexcept;
    std::atomic<std::uint32_t> w_{0};
};

// A mutex that takes part in the order above.
template <Rank R>
class RankedMutex {
    static constexpr bool kRecorded = lock_order::recorded(R);

public:
    void lock() noexcept {
        lock_order::check(this, R, true);
        m_.lock();
        if constexpr (kRecorded) taken();
    }
    bool try_lock() noexcept {
        lock_order::check(this, R, false);
        if (!m_.try_lock()) return false;
        if constexpr (kRecorded) taken();
        return true;
    }
    void unlock() noexcept {
        if constexpr (kRecorded) dropped();
        m_.unlock();
    }
    bool held() const noexcept {
        static_assert(kRecorded, "held() of a rank that does not know its holder");
        return owner_.load(std::memory_order_relaxed) == lock_order::self();
    }
    // In a fork child: the lock stays taken for good (the parent's thread
    // took it), and this thread no longer counts it among those it holds.
    void forget_held() noexcept {
        if constexpr (kRecorded) dropped();
    }

private:
    void taken() noexcept {
        lock_order::acquired(this, R);
        owner_.store(lock_order::self(), std::memory_order_relaxed);
        ++lock_order::held_of_rank[unsigned(R)];
    }
    // This thread holds it no longer (nothing to drop if it never did).
    void dropped() noexcept {
        lock_order::released(this);
        if (owner_.load(std::memory_order_relaxed) != lock_order::self()) return;
        owner_.store(0, std::memory_order_relaxed);
        --lock_order::held_of_rank[unsigned(R)];
    }
    FutexMutex m_;
    // The holder's token, or 0 (a rank that knows its holder): written only
    // by the holder, under the lock, so that only the holder ever reads its
    // own token here.
    std::atomic<std::uint32_t> owner_{0};
};

}  // namespace sd::transport
