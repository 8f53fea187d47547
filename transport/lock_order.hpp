// The engine's lock order, written once and checked.
//
// A thread blocks on a lock only while every lock it holds ranks lower:
//
//   flush     Engine::flush_lock_   the pass that sends due stages and
//                                   starts due upgrades (taken by try_lock)
//   table     Engine::conn_lock_    the connection table, peers, upgrades
//   tx        Conn::tx_lock         one connection's send side
//   progress  Engine::progress_lock_ the completion queue (try_lock, except
//                                   progress_blocking)
//   rx        Conn::rx_lock         one connection's receive side
//
// try_lock may be taken in any order (it cannot wait), but never on a lock
// the thread holds already: that is undefined for std::mutex. Code that may
// run under a lock of its caller asks `held()` instead of trying.
//
// Outside the order, plain std::mutex: each guards one table and takes no
// other lock of the library under it, so a thread may take one whatever it
// holds. Under them, as under any lock, a free or munmap may run the
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
//                                     copy into it, a swap for a new one
//   mirror_lock_    xqlink.cpp        our sleepers count copied into our queues;
//                                     taken under the table and progress locks
//   dirs_lock       verdict.cpp       the other registries found beside ours
//   addrs_lock      verdict.cpp       this host's addresses
//
// Every thread keeps the locks it holds in a small thread-local list (the
// deepest nesting is four). Builds with SDIRECT_LOCK_CHECK (debug and
// sanitizer builds) abort with a message on a blocking acquisition out of
// order and on a try_lock of a held lock; release builds only keep the list.
#pragma once

#include <cstdint>
#include <mutex>

namespace sd::transport {

enum class Rank : std::uint8_t { flush = 1, table, tx, progress, rx };

namespace lock_order {

// Checked before an acquisition (blocking or not), recorded after it.
void check(const void *m, Rank r, bool blocking) noexcept;
void acquired(const void *m, Rank r) noexcept;
void released(const void *m) noexcept;
// Whether this thread holds `m`, or any lock of rank `r`.
bool holds(const void *m) noexcept;
bool holds_rank(Rank r) noexcept;
// Whether this build aborts on a violation (SDIRECT_LOCK_CHECK).
bool checked() noexcept;

}  // namespace lock_order

// A std::mutex that takes part in the order above.
template <Rank R>
class RankedMutex {
public:
    void lock() noexcept {
        lock_order::check(this, R, true);
        m_.lock();
        lock_order::acquired(this, R);
    }
    bool try_lock() noexcept {
        lock_order::check(this, R, false);
        if (!m_.try_lock()) return false;
        lock_order::acquired(this, R);
        return true;
    }
    void unlock() noexcept {
        lock_order::released(this);
        m_.unlock();
    }
    bool held() const noexcept { return lock_order::holds(this); }

private:
    std::mutex m_;
};

}  // namespace sd::transport
