// Direct wake-ups, the sending side: after a post to a connection whose
// peer announced a sleeping thread's bell in the connection's slot of its
// process page (ConnStat::waker, wait.hpp), that bell is written instead
// of the peer's process doorbell, through our own copy of the eventfd
// (pidfd_getfd, which takes the rights to trace the peer: our uid, the
// peer dumpable). Where no copy can be had, or none is announced, the
// doorbell as before.
#include "conn_impl.hpp"
#include "engine.hpp"

#include "sys.hpp"
#include "wait.hpp"

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <mutex>
#include <new>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace sd::transport {

// One peer's eventfds we hold a copy of, by the word that announced them
// (ConnStat::waker without kWakeRung): a few threads of it at a time.
// A look-up and its write take no lock (the senders of a process's threads
// ring the same peer at once: a lock there put a futex wait and a context
// switch on many messages); they count themselves in `inflight` meanwhile.
// Making a copy, and replacing one, is done under `lock`; a copy replaced
// is closed only once no write is in flight, so no write goes to a number
// closed under it. Nothing is taken under `lock`.
struct WakeCache {
    static constexpr int kEntries = 32;
    std::mutex lock;
    std::atomic<int> inflight{0};
    bool denied = false;  // pidfd_getfd refused: the doorbell only, from now on
    unsigned next = 0;    // the entry replaced next (lock)
    // Writes through a copy we held, and copies made in place of another:
    // a peer with more sleeping threads than entries would otherwise pay
    // a copy (four system calls) for most wake-ups. `hits` is counted
    // without the lock (relaxed: a rough count is enough).
    std::atomic<std::uint64_t> hits{0};
    std::uint64_t replaced = 0;
    // An entry's fd is stored before its word (release); a word of 0 is a
    // free entry, or one being replaced.
    std::atomic<std::uint64_t> word[kEntries] = {};
    std::atomic<int> fd[kEntries];
    WakeCache() noexcept {
        for (auto &f : fd) f.store(-1, std::memory_order_relaxed);
    }
};

namespace {

// The copies this process holds, of all its peers, within fd_budget().
std::atomic<int> copies_held{0};

}  // namespace

WakeCache *wake_cache_new() noexcept { return new (std::nothrow) WakeCache; }

void wake_cache_free(WakeCache *w) noexcept {
    for (auto &f : w->fd)
        if (const int fd = f.load(std::memory_order_relaxed); fd >= 0) {
            sys.close(fd);
            copies_held.fetch_sub(1, std::memory_order_relaxed);
        }
    delete w;
}

namespace {

// Our copy of the eventfd `word` announces, if we hold one (no lock: the
// caller counts itself in `inflight`); -1 if not.
int held_copy(WakeCache *w, std::uint64_t word) noexcept {
    for (int i = 0; i < WakeCache::kEntries; ++i)
        // seq_cst: ordered after our count in `inflight`, as the
        // replacer's clearing of the word is before its look at it.
        if (w->word[i].load(std::memory_order_seq_cst) == word) {
            w->hits.store(w->hits.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
            return w->fd[i].load(std::memory_order_relaxed);
        }
    return -1;
}

// The same, made if need be (w->lock held: no copy is closed meanwhile but
// by us); -1 if none can be had.
int copy_of(WakeCache *w, const Peer *p, const std::atomic<std::uint64_t> &slot,
            std::uint64_t word) noexcept {
    for (int i = 0; i < WakeCache::kEntries; ++i)
        if (w->word[i].load(std::memory_order_relaxed) == word)
            return w->fd[i].load(std::memory_order_relaxed);
    if (w->denied) return -1;
    // The entry it would take: a free one while the budget allows, else
    // the next in turn, as long as copies stay rare beside hits.
    const unsigned i = w->next % WakeCache::kEntries;
    const int old = w->fd[i].load(std::memory_order_relaxed);
    if (old < 0 ? copies_held.load(std::memory_order_relaxed) >= fd_budget()
                : w->replaced * 4 > w->hits.load(std::memory_order_relaxed))
        return -1;
    int fd = int(syscall(SYS_pidfd_getfd, p->pidfd, int(std::uint32_t(word)), 0));
    if (fd < 0) {
        // No rights over the peer (not dumpable, another uid's rules), or
        // a kernel without the call: never asked again. EBADF: the fd was
        // closed meanwhile (the thread ended).
        if (errno == EPERM || errno == ENOSYS || errno == EACCES) w->denied = true;
        return -1;
    }
    // The number named the announced eventfd if the word still announces
    // it: the word is set only while its thread lives, which holds the
    // eventfd under that number all its life, and its mark is never used
    // again. Otherwise the copy may be of any file of the peer's: closed
    // unused.
    if ((slot.load(std::memory_order_seq_cst) & ~kWakeRung) != word) {
        sys.close(fd);
        return -1;
    }
    fd = out_of_the_way(fd);  // pidfd_getfd set close-on-exec
    if (fd < 0) return -1;
    if (old >= 0) {
        // Out of the look-ups first; closed once the writes that may have
        // found it are over (a write takes microseconds; a wait that does
        // not end keeps the old copy and gives up the new one).
        const std::uint64_t old_word = w->word[i].exchange(0, std::memory_order_seq_cst);
        int spins = 0;
        while (w->inflight.load(std::memory_order_seq_cst) != 0 && ++spins < 10000) sched_yield();
        if (spins == 10000) {
            w->word[i].store(old_word, std::memory_order_release);
            sys.close(fd);
            return -1;
        }
        sys.close(old);
        ++w->replaced;
    } else {
        copies_held.fetch_add(1, std::memory_order_relaxed);
    }
    ++w->next;
    w->fd[i].store(fd, std::memory_order_relaxed);
    w->word[i].store(word, std::memory_order_release);
    return fd;
}

}  // namespace

void Engine::ring(const Conn *c) noexcept {
    const Peer *p = c->peer;
    if (p->cross) {
        if (!ring_xwaker(c)) ring(p);
        return;
    }
    WakeCache *w = p->wake;
    if (!w) return ring(p);
    std::atomic<std::uint64_t> &slot = p->page->slots[c->peer_id].waker;
    // Pairs with the sleeper's announce-then-recheck (wait.cpp): either it
    // sees our message on its recheck, or we see its word here.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    std::uint64_t v = slot.load(std::memory_order_relaxed);
    const std::uint64_t one = 1;
    for (int tries = 0; v && tries < 4; ++tries) {
        // Written already and not withdrawn yet: its sleeper takes our
        // message in when it withdraws the word.
        if (v & kWakeRung) return;
        // The latch first, on the very word our copy is of: set, the
        // sleeper will take in what is queued; a word that changed
        // meanwhile (the sleep ended, another began) is looked at again.
        w->inflight.fetch_add(1, std::memory_order_seq_cst);
        if (const int fd = held_copy(w, v); fd >= 0) {
            const bool latched = slot.compare_exchange_strong(v, v | kWakeRung, std::memory_order_seq_cst);
            if (latched) (void)sys.write(fd, &one, sizeof one);
            w->inflight.fetch_sub(1, std::memory_order_release);
            if (latched) return make_way();
            continue;
        }
        w->inflight.fetch_sub(1, std::memory_order_release);
        std::lock_guard lock(w->lock);
        const int fd = copy_of(w, p, slot, v);
        if (fd < 0) break;
        if (slot.compare_exchange_strong(v, v | kWakeRung, std::memory_order_seq_cst)) {
            (void)sys.write(fd, &one, sizeof one);
            return make_way();
        }
    }
    ring(p);
}

}  // namespace sd::transport
