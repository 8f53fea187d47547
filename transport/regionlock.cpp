#include "regionlock.hpp"
#include "clock.hpp"
#include "wait.hpp"

#include "fabric.hpp"
#include "log.hpp"
#include "sys.hpp"
#include "renew.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace sd::transport {
namespace {

ProviderGate gate;
// Entries of this thread not yet left: a call made inside a provider
// section (a delivery's answer posts; a completion reposts a buffer)
// passes even when the gate closed meanwhile. Refused, it would wait out
// the closer's bound while the outer section still counts as inside,
// and the outer section would go on into the provider after the exit's
// wait gave up on it.
thread_local int depth = 0;

// The head of a libfabric 1.17 shm region (include/ofi_shm.h there):
//   0 version (u8, 4)   1 resv   2 flags (u16)   4 pid (int)
//   8 cma_cap_peer, cma_cap_self (u8 each)   12 max_sar_buf_per_peer (u32)
//  16 base_addr (pointer)   24 lock (pthread_spinlock_t)   28 signal ...
// glibc's x86-64 spinlock is 1 when free; a holder makes it 0 and each
// waiter's failed attempt takes one more off, so held is <= 0.
constexpr std::uint8_t kRegionVersion = 4;
constexpr std::size_t kPidAt = 4;
constexpr std::size_t kLockAt = 24;
constexpr std::size_t kMapBytes = 4096;

pid_t thread_id() noexcept { return pid_t(syscall(SYS_gettid)); }

bool layout_known() noexcept {
#if defined(__x86_64__)
    static const bool known = fabric_version() == FI_VERSION(1, 17);
    return known;
#else
    return false;  // another spinlock encoding
#endif
}

}  // namespace

SD_CHILD_PATH ProviderGate &provider_gate() noexcept { return gate; }

bool ProviderGate::enter() noexcept {
    if (depth > 0) {
        inside_.fetch_add(1, std::memory_order_relaxed);
        ++depth;
        return true;
    }
    // Closed: the process is about to end (or exec). Wait for that rather
    // than fail the application's call (a send failing with EPIPE raises
    // SIGPIPE, and the process would end by it instead of its exit
    // status). Bounded: the exiting thread may need a lock this thread
    // holds. Reopened (a failed exec): enter after all.
    const Waited w = wait_until({.nap_ns = 1000000, .max_naps = 1000}, 0, [this] {
        inside_.fetch_add(1, std::memory_order_seq_cst);
        // Pairs with close(): either it sees us inside and waits, or we see
        // it closed and stay out.
        if (!closed_.load(std::memory_order_seq_cst) ||
            closer_.load(std::memory_order_relaxed) == thread_id())
            return true;
        inside_.fetch_sub(1, std::memory_order_release);
        return false;
    });
    if (w != Waited::ready) return false;
    ++depth;
    return true;
}

void ProviderGate::leave() noexcept {
    --depth;
    inside_.fetch_sub(1, std::memory_order_release);
}

void ProviderGate::open() noexcept {
    closer_.store(0, std::memory_order_relaxed);
    closed_.store(false, std::memory_order_seq_cst);
}

void ProviderGate::close(int ms) noexcept {
    closer_.store(thread_id(), std::memory_order_relaxed);
    closed_.store(true, std::memory_order_seq_cst);
    (void)wait_until({.nap_ns = 200000}, monotonic_ns() + std::uint64_t(ms) * 1000000ull,
                     [this] { return inside_.load(std::memory_order_acquire) <= 0; });
    if (int left = inside_.load(std::memory_order_acquire))
        SD_LOG(info, "exit or exec: %d thread(s) still inside the provider after %d ms", left, ms);
}

SD_CHILD_PATH void ProviderGate::reset() noexcept {
    renew(depth, 0);
    renew(inside_, 0);
    renew(closed_, false);
    renew(closer_, 0);
}

void RegionLock::watch(const char *name, pid_t pid) noexcept {
    unwatch();
    if (!layout_known() || std::strncmp(name, "fi_shm://", 9) != 0) return;
    char path[160];
    std::snprintf(path, sizeof path, "/dev/shm/%s", name + 9);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return;
    void *m = mmap(nullptr, kMapBytes, PROT_READ, MAP_SHARED, fd, 0);
    sys.close(fd);
    if (m == MAP_FAILED) return;
    const auto *head = static_cast<const unsigned char *>(m);
    int owner;
    std::memcpy(&owner, head + kPidAt, sizeof owner);
    if (head[0] != kRegionVersion || owner != pid) {
        munmap(m, kMapBytes);
        return;
    }
    map_ = m;
    owner_ = pid;
    lock_ = reinterpret_cast<const std::atomic<std::int32_t> *>(head + kLockAt);
    wedged_ = 0;
}

void RegionLock::unwatch() noexcept {
    if (map_) munmap(map_, kMapBytes);
    map_ = nullptr;
    lock_ = nullptr;
    owner_ = 0;
    wedged_ = 0;
}

void RegionLock::forget() noexcept {
    if (!map_) return;
    void *z = mmap(map_, kMapBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                   -1, 0);
    if (z == MAP_FAILED) return;
    auto *word = static_cast<unsigned char *>(z) + kLockAt;
    const std::int32_t free_word = 1;  // glibc's spinlock: 1 is free
    std::memcpy(word, &free_word, sizeof free_word);
}

bool RegionLock::wait_free(std::uint64_t bound_ns) noexcept {
    if (!lock_ || lock_->load(std::memory_order_relaxed) > 0) {
        if (lock_ && std::atomic_ref(wedged_).load(std::memory_order_relaxed))
            std::atomic_ref(wedged_).store(0, std::memory_order_relaxed);
        return true;
    }
    // Already waited out once: the holder is gone; one look only.
    if (std::atomic_ref(wedged_).load(std::memory_order_relaxed)) return false;
    const std::uint64_t start = monotonic_ns();
    for (unsigned spins = 0; lock_->load(std::memory_order_relaxed) <= 0; ++spins) {
        if (spins < 64) {
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
            continue;
        }
        const std::uint64_t t = monotonic_ns();
        // The region's owner gone: nobody will progress it, whoever holds
        // the lock; no need to wait out the bound.
        const bool owner_gone = t - start > 1000000 && (spins & 63) == 0 && owner_ > 0 &&
                                kill(owner_, 0) != 0 && errno == ESRCH;
        if (owner_gone || t - start >= bound_ns) {
            std::atomic_ref(wedged_).store(t, std::memory_order_relaxed);
            if (owner_gone)
                SD_LOG(info, "the shm region of pid %d is locked and its owner gone", int(owner_));
            else
                SD_LOG(error, "the shm region lock of pid %d stayed held for %llu ms: its "
                              "holder is gone", int(owner_), (unsigned long long)((t - start) / 1000000));
            return false;
        }
        if (t - start < 100000) {
            sched_yield();
        } else {
            timespec nap{0, 100000};
            nanosleep(&nap, nullptr);
        }
    }
    return true;
}

}  // namespace sd::transport
