#include "sharers.hpp"
#include "table.hpp"

#include "transport/sys.hpp"
#include "transport/wait.hpp"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sd::fallback {

using transport::sys;

// An entry is 0 (empty), a holder (kHolder | pid) or a place reserved by
// a forking parent for its child (kReserved | parent's pid). A holder's
// entry gains kUsed at its first use of the socket since it became a
// holder or last forked (an I/O call, a readiness wait or an epoll
// registration, or one of those under way at the fork): only a holder
// without it may lose the socket to another holder's take-over.
inline constexpr std::uint64_t kHolder = 1ull << 32;
inline constexpr std::uint64_t kReserved = 2ull << 32;
inline constexpr std::uint64_t kUsed = 4ull << 32;
inline constexpr std::uint64_t kKind = kHolder | kReserved;
inline constexpr int kEntries = 26;

// The owner word: 0, or the pid of the holder that took the socket over
// (kOwnerPending while it checks that the others still have not used it
// and attaches; kOwnerSet once its connection exists, and others must ask
// it to leave before they use the kernel socket).
inline constexpr std::uint64_t kOwnerPending = 1ull << 32;
inline constexpr std::uint64_t kOwnerSet = 2ull << 32;

struct Sharers {
    std::atomic<std::uint32_t> used;
    std::atomic<std::uint32_t> stuck;  // more holders than entries: shared for good
    std::atomic<std::uint64_t> sent;
    std::atomic<std::uint64_t> received;
    std::atomic<std::uint64_t> left;  // its connection left the fabric, counts set
    // A holder cannot read a prefix (an exec'd image: what the owner would
    // put there goes to memory only the fork tree maps).
    std::atomic<std::uint64_t> blind;
    std::atomic<std::uint64_t> owner;  // kOwnerPending or kOwnerSet | pid, or 0
    std::atomic<std::uint64_t> entry[kEntries];
};
static_assert(sizeof(Sharers) == 256);

namespace {

inline constexpr std::size_t kSlots = 4096;  // 1 MiB, touched only where used
inline constexpr std::uint64_t kRecheckNs = 20'000'000;

Sharers *arena = nullptr;  // inherited by every child: the same pages
// The arena is a memfd, so that an exec'd image of a holder can map it
// again (fork_protocol/handover.cpp); -1 when it is anonymous memory. Its
// identity is kept: the application may close or reuse the number.
int arena_fd = -1;
dev_t arena_dev = 0;
ino_t arena_ino = 0;
constexpr std::size_t kArenaBytes = kSlots * sizeof(Sharers);

bool arena_fd_ok() noexcept {
    struct stat st;
    return arena_fd >= 0 && fstat(arena_fd, &st) == 0 && st.st_dev == arena_dev &&
           st.st_ino == arena_ino;
}

SD_CHILD_PATH std::uint64_t me() noexcept { return kHolder | std::uint32_t(own_pid()); }

// A process that can no longer use its copy: gone, or a zombie. Its
// pidfd says so (readable once it has exited, whether reaped or not);
// kernels without pidfd_open fall back to /proc.
bool dead(pid_t pid) noexcept {
    int pfd = int(syscall(SYS_pidfd_open, pid, 0));
    if (pfd >= 0) {
        pollfd p{pfd, POLLIN, 0};
        int n = sys.poll(&p, 1, 0);
        sys.close(pfd);
        return n == 1;
    }
    if (errno == ESRCH) return true;
    if (errno != ENOSYS) return false;  // no fd to spare: look again later
    if (kill(pid, 0) != 0) return errno == ESRCH;
    char path[40], buf[256];
    std::snprintf(path, sizeof path, "/proc/%d/stat", int(pid));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT;
    ssize_t n = sys.read(fd, buf, sizeof buf - 1);
    sys.close(fd);
    if (n <= 0) return false;
    buf[n] = '\0';
    const char *paren = std::strrchr(buf, ')');  // the name may hold anything
    return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

// An entry without its use mark: the kind and the pid.
std::uint64_t who(std::uint64_t v) noexcept { return v & ~kUsed; }

bool put(Sharers *sh, std::uint64_t value) noexcept {
    for (auto &e : sh->entry) {
        std::uint64_t empty = 0;
        if (e.compare_exchange_strong(empty, value, std::memory_order_acq_rel)) return true;
    }
    return false;
}

// Replaces the entry that is `value` (used or not) by `with`.
SD_CHILD_PATH bool take(Sharers *sh, std::uint64_t value, std::uint64_t with) noexcept {
    for (auto &e : sh->entry) {
        std::uint64_t v = e.load(std::memory_order_acquire);
        while (v && who(v) == value)
            if (e.compare_exchange_weak(v, with, std::memory_order_acq_rel)) return true;
    }
    return false;
}

}  // namespace

Sharers *sharers_open(std::uint64_t sent, std::uint64_t received) noexcept {
    if (!arena) {
        int fd = int(syscall(SYS_memfd_create, "sdirect-sharers", MFD_CLOEXEC));
        struct stat st;
        if (fd >= 0 && (ftruncate(fd, off_t(kArenaBytes)) != 0 || fstat(fd, &st) != 0)) {
            sys.close(fd);
            fd = -1;
        }
        void *mem = mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_NORESERVE | (fd < 0 ? MAP_ANONYMOUS : 0), fd, 0);
        if (mem == MAP_FAILED) {
            if (fd >= 0) sys.close(fd);
            return nullptr;
        }
        arena = static_cast<Sharers *>(mem);
        if (fd >= 0) {
            arena_fd = fd;
            arena_dev = st.st_dev;
            arena_ino = st.st_ino;
        }
    }
    // Start where this process's pid points, so that processes of one tree
    // rarely race for the same slot.
    std::size_t first = std::size_t(own_pid()) * 7 % kSlots;
    for (std::size_t i = 0; i < kSlots; ++i) {
        Sharers *sh = &arena[(first + i) % kSlots];
        std::uint32_t free = 0;
        if (!sh->used.compare_exchange_strong(free, 1, std::memory_order_acq_rel)) continue;
        sh->stuck.store(0, std::memory_order_relaxed);
        sh->sent.store(sent, std::memory_order_relaxed);
        sh->received.store(received, std::memory_order_relaxed);
        sh->left.store(0, std::memory_order_relaxed);
        sh->blind.store(0, std::memory_order_relaxed);
        sh->owner.store(0, std::memory_order_relaxed);
        for (auto &e : sh->entry) e.store(0, std::memory_order_relaxed);
        sh->entry[0].store(me(), std::memory_order_release);
        return sh;
    }
    return nullptr;
}

namespace {

// Frees the entries of holders that died (a server forking many children
// that end with _exit would fill the slot otherwise). Costs a look at each.
void purge_dead(Sharers *sh) noexcept {
    const std::uint64_t self = me();
    for (auto &e : sh->entry) {
        std::uint64_t v = e.load(std::memory_order_acquire);
        if ((v & kKind) == kHolder && who(v) != self && dead(pid_t(std::uint32_t(v))))
            e.compare_exchange_strong(v, 0, std::memory_order_acq_rel);
    }
}

// What the other entries of the slot say, looked at no more than once per
// recheck window (through *next_check: looking costs syscalls), the dead
// holders' entries freed on the way. The values are sharers_may_take's.
enum Others : int {
    kOthersBusy,  // a child on its way, a holder alive (that used it, or
                  // any with `idle_ok` false), or not looked at now
    kOthersGone,  // every other holder closed it or is dead
    kOthersIdle,  // the others alive have not used it since their last fork
};
SD_CHILD_PATH Others others(Sharers *sh, std::uint64_t *next_check, bool idle_ok) noexcept {
    const std::uint64_t self = me();
    bool look = false, idle = false;
    for (auto &e : sh->entry) {
        std::uint64_t v = e.load(std::memory_order_acquire);
        if (v == 0 || who(v) == self) continue;
        if ((v & kKind) != kHolder) return kOthersBusy;  // a child on its way
        if (!look) {
            std::uint64_t now = transport::monotonic_ns();
            if (now < *next_check) return kOthersBusy;
            *next_check = now + kRecheckNs;
            look = true;
        }
        if (dead(pid_t(std::uint32_t(v)))) {
            e.compare_exchange_strong(v, 0, std::memory_order_acq_rel);
            continue;
        }
        if (!idle_ok || (v & kUsed)) return kOthersBusy;
        idle = true;  // alive, and not using it: may lose it to us
    }
    return idle ? kOthersIdle : kOthersGone;
}

// Sets or clears this process's use mark. seq_cst: a taker that checks
// the entries after setting the owner word sees a mark set here, or this
// holder sees that word next (sharers_owner), never neither.
void mark_used(Sharers *sh, bool used) noexcept {
    const std::uint64_t self = me();
    for (auto &e : sh->entry) {
        const std::uint64_t v = e.load(std::memory_order_seq_cst);
        if (who(v) != self) continue;
        if (used && !(v & kUsed)) e.fetch_or(kUsed, std::memory_order_seq_cst);
        if (!used && (v & kUsed)) e.fetch_and(~kUsed, std::memory_order_seq_cst);
        return;
    }
}

}  // namespace

void sharers_expect_child(Sharers *sh) noexcept {
    const std::uint64_t place = kReserved | std::uint32_t(own_pid());
    if (put(sh, place)) return;
    purge_dead(sh);
    if (!put(sh, place)) sh->stuck.store(1, std::memory_order_release);  // the child cannot be counted
}

SD_CHILD_PATH void sharers_born(Sharers *sh, int parent, bool used) noexcept {
    take(sh, kReserved | std::uint32_t(parent), me() | (used ? kUsed : 0));
}

SD_CHILD_PATH void sharers_leave(Sharers *sh) noexcept {
    if (!take(sh, me(), 0)) return;
    for (auto &e : sh->entry)
        if (e.load(std::memory_order_acquire) != 0) return;
    std::uint32_t used = 1;
    sh->used.compare_exchange_strong(used, 0, std::memory_order_acq_rel);
}

bool sharers_alone(Sharers *sh, std::uint64_t *next_check) noexcept {
    return !sh->stuck.load(std::memory_order_acquire) &&
           others(sh, next_check, false) == kOthersGone;
}

void sharers_stick(Sharers *sh) noexcept { sh->stuck.store(1, std::memory_order_release); }

bool sharers_stuck(const Sharers *sh) noexcept {
    return sh->stuck.load(std::memory_order_acquire) != 0;
}

void sharers_count(Sharers *sh, bool out, std::uint64_t n) noexcept {
    (out ? sh->sent : sh->received).fetch_add(n, std::memory_order_acq_rel);
}

SD_CHILD_PATH std::uint64_t sharers_sent(const Sharers *sh) noexcept {
    return sh->sent.load(std::memory_order_acquire);
}

void sharers_hand_back(Sharers *sh, std::uint64_t sent, std::uint64_t received) noexcept {
    sh->sent.fetch_add(sent, std::memory_order_acq_rel);
    sh->received.fetch_add(received, std::memory_order_acq_rel);
    sh->left.store(1, std::memory_order_release);
}

bool sharers_left(const Sharers *sh) noexcept {
    return sh->left.load(std::memory_order_acquire) != 0;
}

SD_CHILD_PATH std::uint64_t sharers_received(const Sharers *sh) noexcept {
    return sh->received.load(std::memory_order_acquire);
}

bool sharers_handle(const Sharers *sh, int *fd, std::uint32_t *index) noexcept {
    if (!arena || sh < arena || sh >= arena + kSlots || !arena_fd_ok()) return false;
    *fd = arena_fd;
    *index = std::uint32_t(sh - arena);
    return true;
}

void sharers_pass_on_exec(bool pass) noexcept {
    if (!arena_fd_ok()) return;
    const int fl = sys.fcntl(arena_fd, F_GETFD);
    if (fl >= 0) sys.fcntl(arena_fd, F_SETFD, pass ? fl & ~FD_CLOEXEC : fl | FD_CLOEXEC);
}

bool sharers_map_inherited(int fd) noexcept {
    struct stat st;
    char link[64], target[64];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, target, sizeof target - 1);
    if (arena || n <= 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        std::uint64_t(st.st_size) != kArenaBytes)
        return false;
    target[n] = '\0';
    if (std::strncmp(target, "/memfd:sdirect-sharers", 22) != 0) return false;
    void *mem = mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (mem == MAP_FAILED) return false;
    // Not passed on to further programs but through a hand-over.
    const int fl = sys.fcntl(fd, F_GETFD);
    if (fl >= 0) sys.fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
    arena = static_cast<Sharers *>(mem);
    arena_fd = fd;
    arena_dev = st.st_dev;
    arena_ino = st.st_ino;
    return true;
}

Sharers *sharers_at(std::uint32_t index) noexcept {
    return arena && index < kSlots && arena[index].used.load(std::memory_order_acquire) ? &arena[index]
                                                                                          : nullptr;
}

bool sharers_hold(const Sharers *sh) noexcept {
    const std::uint64_t self = me();
    for (const auto &e : sh->entry)
        if (who(e.load(std::memory_order_acquire)) == self) return true;
    return false;
}

SD_CHILD_PATH void sharers_use(Sharers *sh) noexcept { mark_used(sh, true); }

void sharers_unuse(Sharers *sh) noexcept { mark_used(sh, false); }

SD_CHILD_PATH int sharers_may_take(Sharers *sh, std::uint64_t *next_check) noexcept {
    if (sh->stuck.load(std::memory_order_acquire) || sh->owner.load(std::memory_order_acquire))
        return 0;
    return int(others(sh, next_check, true));
}

bool sharers_take(Sharers *sh) noexcept {
    const std::uint64_t self = me(), pending = kOwnerPending | std::uint32_t(own_pid());
    std::uint64_t none = 0;
    if (!sh->owner.compare_exchange_strong(none, pending, std::memory_order_seq_cst)) return false;
    // Every other holder still has not used it, now that the word is set
    // (seq_cst, with sharers_use's mark): one that uses it from here on
    // asks us to leave first.
    for (auto &e : sh->entry) {
        const std::uint64_t v = e.load(std::memory_order_seq_cst);
        if (v == 0 || who(v) == self) continue;
        if ((v & kKind) != kHolder || (v & kUsed)) {
            sh->owner.store(0, std::memory_order_seq_cst);
            return false;
        }
    }
    return true;
}

void sharers_took(Sharers *sh) noexcept {
    sh->owner.store(kOwnerSet | std::uint32_t(own_pid()), std::memory_order_seq_cst);
}

void sharers_reset_counts(Sharers *sh) noexcept {
    sh->sent.store(0, std::memory_order_relaxed);
    sh->received.store(0, std::memory_order_relaxed);
    sh->left.store(0, std::memory_order_release);
}

SD_CHILD_PATH int sharers_owner(Sharers *sh, bool *pending) noexcept {
    const std::uint64_t v = sh->owner.load(std::memory_order_seq_cst);
    const int pid = int(std::uint32_t(v));
    *pending = (v & kOwnerPending) != 0;
    return v && pid != own_pid() ? pid : 0;
}

bool sharers_owner_dead(int pid) noexcept { return dead(pid_t(pid)); }

void sharers_disown(Sharers *sh, int pid) noexcept {
    for (std::uint64_t v : {kOwnerPending | std::uint32_t(pid), kOwnerSet | std::uint32_t(pid)}) {
        std::uint64_t expect = v;
        if (sh->owner.compare_exchange_strong(expect, 0, std::memory_order_seq_cst)) return;
    }
}

void sharers_blind(Sharers *sh) noexcept { sh->blind.store(1, std::memory_order_release); }

bool sharers_is_blind(const Sharers *sh) noexcept {
    return sh->blind.load(std::memory_order_acquire) != 0;
}

void sharers_rejoin(Sharers *sh) noexcept {
    if (sh->used.load(std::memory_order_acquire) && !sharers_hold(sh) && !put(sh, me()))
        sh->stuck.store(1, std::memory_order_release);
}

}  // namespace sd::fallback
