#include "table.hpp"

#include "transport/lock_order.hpp"
#include "transport/log.hpp"
#include "transport/clock.hpp"
#include "transport/renew.hpp"

#include "transport/sys.hpp"

#include <algorithm>
#include <cstdlib>
#include <dirent.h>
#include <fcntl.h>
#include <mutex>
#include <new>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <utility>
#include <vector>

namespace sd::fallback {
namespace {

// The slots of fds from kLowSlots on (mapped by table_init); those below
// are on the table's first page (FirstPage, below).
std::atomic<Stream *> *slots = nullptr;
int nslots = 0;
// One past the highest fd ever mapped: the passes over every stream
// (fork, exec, spawn) stop there instead of at RLIMIT_NOFILE's hard limit
// (a million slots under some service managers, at each fork in both
// processes). Raised before a slot is filled, never lowered.
std::atomic<int> slots_used{0};

void note_used(int fd) noexcept {
    int seen = slots_used.load(std::memory_order_relaxed);
    while (seen <= fd &&
           !slots_used.compare_exchange_weak(seen, fd + 1, std::memory_order_release)) {
    }
}

// Sockets handed over by an exec and not used yet have no slot, and the
// passes that look them up (acquire) adopt them: those passes go over
// every slot while any is waiting.
int scan_end() noexcept {
    return fork_hooks.inherit_waiting() ? nslots : slots_used.load(std::memory_order_acquire);
}
// What the fork handlers write of the table's own, kept together: a fork
// copies every page written after it, in the parent (whose handlers run
// while the child lives) as in the child. Two 64-byte lines: one page.
// The count of last closes lives here too: a forking server's parent and
// its child each close the connection's fd, and on a page of its own the
// count cost each of them one page fault more per connection.
struct alignas(128) ForkState {
    transport::RankedMutex<transport::Rank::leaf> pool_lock;  // the pool (pool_get, release)
    int self_pid = 0;      // this process's pid as of its start or last fork
    int forking_pid = 0;   // the parent's pid, as its child sees it
    unsigned pass = 0;     // passes over the streams, two per fork
    // Whether code of ours may run in a process other than self_pid's:
    // while a fork is under way (another library's child handler may call
    // in before ours has run), or once a child may have been made without
    // the fork handlers (note_unhandled_child). Until then
    // foreign_process() and own_pid() cost no system call.
    std::atomic<int> under_way{0};
    std::atomic<bool> unhandled{false};
    // The prepare step took pool_lock: not in a process of one thread,
    // whose handlers then write nothing of it after the fork.
    bool pool_locked = false;
    std::uint64_t at_ns = 0;  // the prepare step's clock (table_fork_ns)
    std::atomic<std::uint64_t> closes{0};  // last_closes()
};
static_assert(sizeof(ForkState) == 128);

// What a forking server's parent and child each write after every fork,
// on one page, which each of them then copies once: the fork state (the
// fork handlers), the pool's free list, the memory of the process's first
// two streams (a server's listener, whose count of calls accept and the
// child's close of it change, and its first connection, which the pool
// gives out again for each later one) and the slots of the lowest fds
// (the connection's fd, closed in both).
inline constexpr int kFirstStreams = 2;
struct FirstPageHead {
    ForkState forks;
    // The pool (forks.pool_lock): streams given back, and where the next
    // new one is cut (here, then pool_get's pages).
    Stream *free_list = nullptr;
    char *stream_next = nullptr;
    std::size_t streams_left = 0;
    alignas(Stream) unsigned char streams[kFirstStreams * sizeof(Stream)] = {};
};
inline constexpr int kLowSlots =
    int((4096 - sizeof(FirstPageHead)) / sizeof(std::atomic<Stream *>));
struct alignas(4096) FirstPage {
    FirstPageHead head;
    std::atomic<Stream *> low[kLowSlots] = {};
};
static_assert(sizeof(FirstPage) == 4096 && kLowSlots >= 64);
// Set before any constructor of ours runs: table_init (from the library's
// first constructor) writes it.
constinit FirstPage first_page;
ForkState &forks = first_page.head.forks;

inline std::atomic<Stream *> &slot(int fd) noexcept {
    return fd < kLowSlots ? first_page.low[fd] : slots[fd];
}

// Code of ours may run in a process other than self_pid's (ForkState's
// under_way, unhandled): only then do foreign_process() and own_pid() ask
// the kernel.
inline bool may_run_elsewhere() noexcept {
    return forks.unhandled.load(std::memory_order_relaxed) ||
           forks.under_way.load(std::memory_order_relaxed);
}

// New streams are cut in order, the first ones from the first page, the
// others from pages of their own: streams made one after the other (a
// listener and its connections) share a page.
inline constexpr std::size_t kStreamsPerPage = 4096 / sizeof(Stream);
static_assert(kStreamsPerPage >= 1);

Stream *pool_get() noexcept {
    FirstPageHead &p = first_page.head;
    for (;;) {
        void *mem = nullptr;
        {
            std::lock_guard lock(forks.pool_lock);
            if (!p.stream_next) {
                p.stream_next = reinterpret_cast<char *>(p.streams);
                p.streams_left = kFirstStreams;
            }
            if (Stream *s = p.free_list) {
                p.free_list = s->next_free;
                // A stream's memory is never anything else's (the pool
                // keeps it), and its first number came after every
                // earlier one: counting on from it keeps the pair
                // (stream, number) new, with no write to the process's
                // counter, which a forking server's accept would copy
                // from its child once more.
                ++s->serial;
                return s;
            }
            if (p.streams_left) {
                --p.streams_left;
                mem = std::exchange(p.stream_next, p.stream_next + sizeof(Stream));
            }
        }
        // Constructed, and a page allocated, with no lock of ours held
        // (the allocator may come back to us through the memory hooks).
        if (mem) return new (mem) Stream();
        void *page = std::aligned_alloc(4096, 4096);
        if (!page) return nullptr;
        bool spare = false;
        {
            std::lock_guard lock(forks.pool_lock);
            // Another thread's page came first: ours goes back.
            spare = p.streams_left != 0;
            if (!spare) {
                p.stream_next = static_cast<char *>(page);
                p.streams_left = kStreamsPerPage;
            }
        }
        if (spare) std::free(page);
    }
}

}  // namespace

void table_init(bool sockets) noexcept {
    forks.self_pid = int(getpid());
    if (!sockets) return;
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    rlim_t n = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > (1u << 20) ? (1u << 20) : rl.rlim_max;
    if (n < 1024) n = 1024;
    // Pages are touched only where fds are used.
    void *mem = mmap(nullptr, n * sizeof(std::atomic<Stream *>), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) return;
    slots = static_cast<std::atomic<Stream *> *>(mem);
    nslots = int(n);
}

int table_size() noexcept { return nslots; }

std::uint64_t last_closes() noexcept { return forks.closes.load(std::memory_order_acquire); }

SD_CHILD_PATH Stream *acquire(int fd) noexcept {
    if (fd < 0 || fd >= nslots) return nullptr;
    for (;;) {
        Stream *s = slot(fd).load(std::memory_order_acquire);
        // A socket handed over by the image before an exec: tracked from
        // its first use here.
        if (!s) return fork_hooks.inherit_waiting() ? fork_hooks.adopt_inherited(fd) : nullptr;
        int r = s->refs.load(std::memory_order_relaxed);
        while (r > 0 && !s->refs.compare_exchange_weak(r, r + 1, std::memory_order_acq_rel)) {
        }
        if (r <= 0) continue;  // being recycled: look again
        if (slot(fd).load(std::memory_order_acquire) == s) return s;
        release(s);
    }
}

SD_CHILD_PATH void release(Stream *s) noexcept {
    if (s->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    s->destroy();
    std::lock_guard lock(forks.pool_lock);
    s->next_free = first_page.head.free_list;
    first_page.head.free_list = s;
}

Stream *create(int fd, int domain, bool nonblock) noexcept {
    // A retired process tracks no new socket: libc has them all.
    if (fd < 0 || fd >= nslots || transport::retired()) return nullptr;
    Stream *s = pool_get();
    if (!s) return nullptr;
    s->reset(fd, domain, nonblock);
    note_used(fd);
    if (Stream *old = slot(fd).exchange(s, std::memory_order_acq_rel)) release(old);
    return s;
}

void map_dup(int fd, Stream *s) noexcept {
    if (fd < 0 || fd >= nslots) return;
    s->refs.fetch_add(1, std::memory_order_relaxed);
    s->fds.fetch_add(1, std::memory_order_relaxed);
    s->fd_added(fd);
    note_used(fd);
    if (Stream *old = slot(fd).exchange(s, std::memory_order_acq_rel)) release(old);
}

Stream *unmap(int fd) noexcept {
    if (fd < 0 || fd >= nslots) return nullptr;
    Stream *s = slot(fd).exchange(nullptr, std::memory_order_acq_rel);
    if (s) s->fd_removed(fd);
    return s;
}

SD_CHILD_PATH Stream *close_prepare(int fd) noexcept {
    Stream *s = unmap(fd);
    if (!s || s->fds.fetch_sub(1, std::memory_order_acq_rel) != 1) return s;
    forks.closes.fetch_add(1, std::memory_order_release);
    // An epoll entry that found it quiet looks again, and finds it closed.
    if (transport::Conn *c = s->conn.load(std::memory_order_acquire)) transport::mark_touched(c);
    if (s->calls.load(std::memory_order_acquire) == 0 || !s->hold_for_calls()) s->last_close();
    // The calls may all have ended meanwhile: then the close is ours.
    else if (s->calls.load(std::memory_order_acquire) == 0) s->close_held();
    return s;
}

namespace {
// Every stream once (dups map several fds to one), under no lock: the
// callers run where no other thread can change the table's layout.
template <typename Fn>
void each_stream(Fn fn) noexcept {
    for (int fd = 0, end = scan_end(); fd < end; ++fd)
        if (Stream *s = slot(fd).load(std::memory_order_acquire)) fn(s);
}

}  // namespace

void table_fork_prepare() noexcept {
    forks.forking_pid = own_pid();
    forks.pass += 2;
    forks.at_ns = transport::monotonic_ns();
    each_stream([](Stream *s) { fork_hooks.fork_prepare(*s, forks.pass); });
    transport::renew(forks.pool_locked, !transport::one_thread());
    if (forks.pool_locked) forks.pool_lock.lock();
    // Last, so that the pass above, in this process still, asks no pid of
    // the kernel; from here until the handlers after the fork, code of
    // ours may run in the child before its handler has.
    forks.under_way.fetch_add(1, std::memory_order_relaxed);
}

void table_unlock_after_fork() noexcept {
    if (forks.pool_locked) forks.pool_lock.unlock();
    forks.under_way.fetch_sub(1, std::memory_order_relaxed);
}

SD_CHILD_PATH void table_after_fork_child() noexcept {
    forks.self_pid = int(getpid());
    // One thread here, and no child yet: the parent's forks and children
    // are not ours (and own_pid() is self_pid from here on).
    forks.unhandled.store(false, std::memory_order_relaxed);
    forks.under_way.store(0, std::memory_order_relaxed);
    // Taken by this thread in the prepare step: held for good, and by no
    // thread here.
    if (forks.pool_locked) {
        forks.pool_lock.forget_held();
        new (&forks.pool_lock) transport::RankedMutex<transport::Rank::leaf>();
    }
    // Inherited connections: the parent's engine state is not ours.
    each_stream([](Stream *s) { fork_hooks.fork_child(*s, forks.pass + 1, forks.forking_pid); });
}

void note_unhandled_child() noexcept {
    forks.unhandled.store(true, std::memory_order_relaxed);
    // The child may exec with fds that differ from the table's (a vfork
    // child that moved or closed them): it finds the sockets by inode,
    // looked up here while our fds are the table's.
    if (slots && !foreign_process()) each_stream([](Stream *s) { (void)s->inode(); });
}

SD_CHILD_PATH bool foreign_process() noexcept {
    return may_run_elsewhere() && int(getpid()) != forks.self_pid;
}
int table_pid() noexcept { return forks.self_pid; }

SD_CHILD_PATH std::uint64_t table_fork_ns() noexcept { return forks.at_ns; }

SD_CHILD_PATH int own_pid() noexcept {
    return forks.self_pid && !may_run_elsewhere() ? forks.self_pid : int(getpid());
}

// Read with getdents64 into the stack (a vfork child must not allocate).
// The kernel lists the fds in increasing order: the first `max` found are
// the next ones after `after`.
int inherited_sockets(ino_t *out, int *out_fd, int max, int after) noexcept {
    int dir = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) return 0;
    int n = 0;
    alignas(8) char buf[4096];
    while (n < max) {
        ssize_t got = getdents64(dir, buf, sizeof buf);
        if (got <= 0) break;
        for (ssize_t at = 0; at < got && n < max;) {
            auto *d = reinterpret_cast<dirent64 *>(buf + at);
            at += d->d_reclen;
            char *end;
            long fd = std::strtol(d->d_name, &end, 10);
            if (*end || end == d->d_name || fd == dir || fd <= after) continue;
            int flags = transport::sys.fcntl(int(fd), F_GETFD);
            struct stat st;
            if (flags < 0 || (flags & FD_CLOEXEC) || fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode))
                continue;
            out_fd[n] = int(fd);
            out[n++] = st.st_ino;
        }
    }
    transport::sys.close(dir);
    return n;
}

SD_CHILD_PATH bool slot_taken(int fd) noexcept {
    return fd >= 0 && fd < nslots && slot(fd).load(std::memory_order_acquire);
}

namespace {

// Every stream whose socket inode is in `kept` (sorted; `kept_fd[i]` an fd
// of kept[i] in this process) goes back to the kernel before a new program
// that holds it starts.
void leave_for_exec(const ino_t *kept, const int *kept_fd, int nkept) noexcept {
    SD_LOG(debug, "exec: the new program holds %d socket(s)", nkept);
    if (!nkept) return;
    // vfork runs no fork handlers: a process not self_pid's is a vfork
    // child (foreign_process: no system call unless a child may exist).
    const bool vforked = foreign_process();
    for (int fd = 0, end = scan_end(); fd < end; ++fd) {
        Stream *s = acquire(fd);
        if (!s) continue;
        const ino_t ino = s->fd.load(std::memory_order_relaxed) == fd ? ino_t(s->inode()) : 0;
        const ino_t *at = std::lower_bound(kept, kept + nkept, ino);
        if (ino && at != kept + nkept && *at == ino)
            fork_hooks.before_exec(*s, vforked, kept_fd[at - kept]);
        release(s);
    }
}

// Sorts the pairs by inode, in place, without allocating (a vfork child).
void sort_kept(ino_t *kept, int *kept_fd, int n) noexcept {
    for (int i = 1; i < n; ++i)
        for (int j = i; j > 0 && kept[j - 1] > kept[j]; --j) {
            std::swap(kept[j - 1], kept[j]);
            std::swap(kept_fd[j - 1], kept_fd[j]);
        }
}

}  // namespace

void table_before_exec() noexcept {
    if (!slots) return;
    // 256 at a time, on the stack: a process may hold many more.
    constexpr int kBatch = 256;
    ino_t kept[kBatch];
    int kept_fd[kBatch];
    for (int after = -1;;) {
        const int nkept = inherited_sockets(kept, kept_fd, kBatch, after);
        if (nkept) after = kept_fd[nkept - 1];
        sort_kept(kept, kept_fd, nkept);
        leave_for_exec(kept, kept_fd, nkept);
        if (nkept < kBatch) return;
    }
}

void table_before_spawn(const SpawnAction *actions, int nactions) noexcept {
    if (!slots) return;
    // The child's fds that are our sockets, as its own fd table will be
    // after each action: fd there, socket inode, an fd of it here, and
    // whether it survives the exec.
    struct ChildFd {
        int fd;
        ino_t ino;
        int here;
        bool inherit;
    };
    // Actions not known, or posix_spawn called in a vfork child (whose
    // memory is its parent's: nothing allocated there): every socket.
    if (nactions < 0 || foreign_process()) {
        const bool vforked = foreign_process();
        for (int fd = 0, end = scan_end(); fd < end; ++fd) {
            Stream *s = acquire(fd);
            if (!s) continue;
            if (s->fd.load(std::memory_order_relaxed) == fd && s->inode())
                fork_hooks.before_exec(*s, vforked, fd);
            release(s);
        }
        return;
    }
    std::vector<ChildFd> held;
    for (int fd = 0, end = scan_end(); fd < end; ++fd) {
        Stream *s = acquire(fd);
        if (!s) continue;
        const ino_t ino = ino_t(s->inode());
        release(s);
        if (!ino) continue;
        const int flags = transport::sys.fcntl(fd, F_GETFD);
        if (flags >= 0) held.push_back({fd, ino, fd, !(flags & FD_CLOEXEC)});
    }
    const auto at = [&held](int fd) {
        return std::find_if(held.begin(), held.end(), [fd](const ChildFd &h) { return h.fd == fd; });
    };
    for (int i = 0; i < nactions; ++i) {
        const SpawnAction &a = actions[i];
        switch (a.kind) {
        case SpawnAction::Kind::close:
        case SpawnAction::Kind::replace:
            if (auto h = at(a.fd); h != held.end()) held.erase(h);
            break;
        case SpawnAction::Kind::close_from:
            std::erase_if(held, [&a](const ChildFd &h) { return h.fd >= a.fd; });
            break;
        case SpawnAction::Kind::none:
            break;
        case SpawnAction::Kind::dup2: {
            auto from = at(a.fd);
            if (a.fd == a.newfd) {
                if (from != held.end()) from->inherit = true;
                break;
            }
            const bool socket = from != held.end();
            const ChildFd copy = socket ? *from : ChildFd{};
            if (auto h = at(a.newfd); h != held.end()) held.erase(h);
            if (socket) held.push_back({a.newfd, copy.ino, copy.here, true});
            break;
        }
        }
    }
    std::vector<ino_t> kept;
    std::vector<int> kept_fd;
    std::sort(held.begin(), held.end(), [](const ChildFd &x, const ChildFd &y) { return x.ino < y.ino; });
    for (const ChildFd &h : held)
        if (h.inherit && (kept.empty() || kept.back() != h.ino)) {
            kept.push_back(h.ino);
            kept_fd.push_back(h.here);
        }
    leave_for_exec(kept.data(), kept_fd.data(), int(kept.size()));
}

namespace {
// Slots this process left before an exec in place, for a failed exec.
constexpr int kLeftMax = 64;
Sharers *left_on_exec[kLeftMax];
int nleft_on_exec = 0;
}  // namespace

void table_exec_drop_uninherited() noexcept {
    nleft_on_exec = 0;
    if (!slots || foreign_process()) return;
    // Every inherited socket, however many (not a vfork child: it may
    // allocate).
    std::vector<ino_t> kept;
    ino_t batch[256];
    int batch_fd[256];
    for (int after = -1;;) {
        const int n = inherited_sockets(batch, batch_fd, 256, after);
        kept.insert(kept.end(), batch, batch + n);
        if (n < 256) break;
        after = batch_fd[n - 1];
    }
    std::sort(kept.begin(), kept.end());
    for (int fd = 0, end = scan_end(); fd < end; ++fd) {
        Stream *s = acquire(fd);
        if (!s) continue;
        if (s->fd.load(std::memory_order_relaxed) == fd &&
            !std::binary_search(kept.begin(), kept.end(), ino_t(s->inode())))
            for (Sharers *sh : {s->share.load(std::memory_order_acquire),
                                s->holders.load(std::memory_order_acquire)})
                if (sh && sharers_hold(sh) && nleft_on_exec < kLeftMax) {
                    sharers_leave(sh);
                    left_on_exec[nleft_on_exec++] = sh;
                }
        release(s);
    }
}

void table_exec_failed() noexcept {
    for (int i = 0; i < nleft_on_exec; ++i) sharers_rejoin(left_on_exec[i]);
    nleft_on_exec = 0;
}

}  // namespace sd::fallback
