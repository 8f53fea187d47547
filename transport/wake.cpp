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

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <mutex>
#include <new>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace sd::transport {

// One peer's eventfds we hold a copy of, by the word that announced them
// (ConnStat::waker without kWakeRung): a few threads of it at a time,
// replaced in turn. `lock` is held from the look-up to the write, so that
// no copy is closed while another thread writes it; nothing is taken
// under it.
struct WakeCache {
    static constexpr int kEntries = 32;
    std::mutex lock;
    bool denied = false;  // pidfd_getfd refused: the doorbell only, from now on
    unsigned next = 0;    // the entry replaced next
    // Writes through a copy we held, and copies made in place of another:
    // a peer with more sleeping threads than entries would otherwise pay
    // a copy (four system calls) for most wake-ups.
    std::uint64_t hits = 0, replaced = 0;
    std::uint64_t word[kEntries] = {};
    int fd[kEntries];
    WakeCache() noexcept {
        for (int &f : fd) f = -1;
    }
};

namespace {

// The copies this process holds, of all its peers, and their bound: a
// sixteenth of the fd limit (16 to 256), so that they never take the
// application's fds.
std::atomic<int> copies_held{0};

int copies_budget() noexcept {
    static const int budget = [] {
        rlimit rl{};
        getrlimit(RLIMIT_NOFILE, &rl);
        const rlim_t lim = rl.rlim_cur == RLIM_INFINITY ? 4096 : rl.rlim_cur;
        return int(std::clamp<rlim_t>(lim / 16, 16, 256));
    }();
    return budget;
}

}  // namespace

WakeCache *wake_cache_new() noexcept { return new (std::nothrow) WakeCache; }

void wake_cache_free(WakeCache *w) noexcept {
    for (int f : w->fd)
        if (f >= 0) {
            sys.close(f);
            copies_held.fetch_sub(1, std::memory_order_relaxed);
        }
    delete w;
}

namespace {

// Our copy of the eventfd that `word` announces in `slot` (w->lock held),
// made if need be; -1 if none can be had.
int copy_of(WakeCache *w, const Peer *p, const std::atomic<std::uint64_t> &slot,
            std::uint64_t word) noexcept {
    for (int i = 0; i < WakeCache::kEntries; ++i)
        if (w->word[i] == word) {
            ++w->hits;
            return w->fd[i];
        }
    if (w->denied) return -1;
    // The entry it would take: a free one while the budget allows, else
    // the next in turn, as long as copies stay rare beside hits.
    const unsigned i = w->next % WakeCache::kEntries;
    if (w->fd[i] < 0 ? copies_held.load(std::memory_order_relaxed) >= copies_budget()
                     : w->replaced * 4 > w->hits)
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
    ++w->next;
    if (w->fd[i] >= 0) {
        sys.close(w->fd[i]);
        ++w->replaced;
    } else {
        copies_held.fetch_add(1, std::memory_order_relaxed);
    }
    w->word[i] = word;
    w->fd[i] = fd;
    return fd;
}

}  // namespace

void Engine::ring(const Conn *c) noexcept {
    const Peer *p = c->peer;
    WakeCache *w = p->wake;
    if (!w) return ring(p);
    std::atomic<std::uint64_t> &slot = p->page->slots[c->peer_id].waker;
    // Pairs with the sleeper's announce-then-recheck (wait.cpp): either it
    // sees our message on its recheck, or we see its word here.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    std::uint64_t v = slot.load(std::memory_order_relaxed);
    for (int tries = 0; v && tries < 4; ++tries) {
        // Written already and not withdrawn yet: its sleeper takes our
        // message in when it withdraws the word.
        if (v & kWakeRung) return;
        std::lock_guard lock(w->lock);
        const int fd = copy_of(w, p, slot, v);
        if (fd < 0) break;
        // The latch first, on the very word our copy is of: set, the
        // sleeper will take in what is queued; a word that changed meanwhile
        // (the sleep ended, another began) is looked at again.
        if (slot.compare_exchange_strong(v, v | kWakeRung, std::memory_order_seq_cst)) {
            std::uint64_t one = 1;
            (void)sys.write(fd, &one, sizeof one);
            return;
        }
    }
    ring(p);
}

}  // namespace sd::transport
