// Why a connection stayed on TCP when nothing failed: the peer never
// answered because it never published, or published where we cannot see
// it, or published that it stays on the kernel. Nothing tells us when to
// give up waiting for a peer, so the verdict comes at the first kernel
// I/O past the upgrade timeout, or at close, or at exit, whichever is
// first; it changes only the reason shown (a peer that publishes later
// still upgrades the connection), and logs it once.
#include "conn_impl.hpp"
#include "engine.hpp"
#include "log.hpp"
#include "registry.hpp"
#include "sys.hpp"
#include "wait.hpp"

#include <cerrno>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <mutex>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>

namespace sd::transport {
namespace {

// Directories looked at beside our registry: a bound, so that a crowded
// /dev/shm costs little (the verdict comes once per connection).
constexpr int kSiblings = 256;

struct Found {
    Reason why = Reason::no_peer;
    unsigned uid = 0;
    char where[256] = "";
};

// The directories beside our registry (other SDIRECT_REGISTRY values,
// other users' registries) and under /dev/shm, listed at most every
// kRescanNs: a server whose clients mostly do not run the library judges
// every connection, and must not read the directories each time.
constexpr int kDirs = 32;
constexpr std::uint64_t kRescanNs = 2000000000ull;
std::mutex dirs_lock;
char dirs[kDirs][256];
unsigned dir_uid[kDirs];
int ndirs = 0;
std::uint64_t scanned_ns = 0;
bool scanned = false;

void list_dirs_locked() noexcept {
    ndirs = 0;
    const char *reg = settings().registry;
    char parent[256];
    std::snprintf(parent, sizeof parent, "%s", reg);
    char *slash = std::strrchr(parent, '/');
    if (!slash || slash == parent) return;
    *slash = '\0';
    struct stat ours{};
    if (stat(reg, &ours) != 0) return;
    for (const char *dir : {static_cast<const char *>(parent), "/dev/shm"}) {
        DIR *d = opendir(dir);
        if (!d) continue;
        for (int n = 0; n < kSiblings && ndirs < kDirs; ++n) {
            dirent *e = readdir(d);
            if (!e) break;
            if (e->d_name[0] == '.') continue;
            struct stat st;
            if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) ||
                (st.st_dev == ours.st_dev && st.st_ino == ours.st_ino))
                continue;
            // A path that does not fit names another directory: skipped.
            const int len = std::snprintf(dirs[ndirs], sizeof dirs[ndirs], "%s/%s", dir, e->d_name);
            if (len < 0 || std::size_t(len) >= sizeof dirs[ndirs]) continue;
            dir_uid[ndirs++] = unsigned(st.st_uid);
        }
        closedir(d);
        if (!std::strcmp(parent, "/dev/shm")) break;
    }
}

// The other end's entry name, looked up in those directories. Another
// user's registry is mode 0700: only root can see into it; an unreadable
// one tells nothing, and nothing is ever opened there, only looked up (the
// registry's rules for our own stay as they are).
void look_elsewhere(const char *name, Found &f) noexcept {
    // Bounded: a fork child may have inherited the lock held for ever.
    std::unique_lock lock(dirs_lock, std::defer_lock);
    if (wait_until({.nap_ns = 100000, .max_naps = 1000}, 0, [&] { return lock.try_lock(); }) !=
        Waited::ready)
        return;
    const std::uint64_t now = monotonic_ns();
    if (!scanned || now - scanned_ns > kRescanNs) {
        list_dirs_locked();
        scanned = true;
        scanned_ns = now;
    }
    for (int i = 0; i < ndirs; ++i) {
        char path[600];
        std::snprintf(path, sizeof path, "%s/%s", dirs[i], name);
        struct stat entry;
        if (lstat(path, &entry) != 0) continue;
        f.why = dir_uid[i] == getuid() ? Reason::other_registry : Reason::other_user;
        f.uid = dir_uid[i];
        std::snprintf(f.where, sizeof f.where, "%s", dirs[i]);
        return;
    }
}

// This host's addresses, listed at most every kRescanNs.
constexpr int kAddrs = 64;
std::mutex addrs_lock;
struct HostAddr {
    std::uint16_t family;
    std::uint8_t addr[16];
};
HostAddr addrs[kAddrs];
int naddrs = 0;
std::uint64_t addrs_ns = 0;
bool addrs_listed = false;

void list_addrs_locked() noexcept {
    naddrs = 0;
    ifaddrs *all = nullptr;
    if (getifaddrs(&all) != 0) return;
    for (ifaddrs *i = all; i && naddrs < kAddrs; i = i->ifa_next) {
        if (!i->ifa_addr) continue;
        HostAddr &h = addrs[naddrs];
        h = HostAddr{};
        if (i->ifa_addr->sa_family == AF_INET) {
            h.family = AF_INET;
            std::memcpy(h.addr, &reinterpret_cast<sockaddr_in *>(i->ifa_addr)->sin_addr, 4);
        } else if (i->ifa_addr->sa_family == AF_INET6) {
            h.family = AF_INET6;
            std::memcpy(h.addr, &reinterpret_cast<sockaddr_in6 *>(i->ifa_addr)->sin6_addr, 16);
        } else {
            continue;
        }
        ++naddrs;
    }
    freeifaddrs(all);
}

}  // namespace

bool address_is_local(std::uint16_t family, const std::uint8_t *addr) noexcept {
    static constexpr std::uint8_t v6_loopback[16] = {0, 0, 0, 0, 0, 0, 0, 0,
                                                     0, 0, 0, 0, 0, 0, 0, 1};
    if (family == AF_INET && addr[0] == 127) return true;
    if (family == AF_INET6 && !std::memcmp(addr, v6_loopback, 16)) return true;
    std::unique_lock lock(addrs_lock, std::defer_lock);
    if (wait_until({.nap_ns = 100000, .max_naps = 1000}, 0, [&] { return lock.try_lock(); }) !=
        Waited::ready)
        return true;  // cannot tell: say nothing new
    const std::uint64_t now = monotonic_ns();
    if (!addrs_listed || now - addrs_ns > kRescanNs) {
        list_addrs_locked();
        addrs_listed = true;
        addrs_ns = now;
    }
    if (!naddrs) return true;
    const std::size_t len = family == AF_INET ? 4 : 16;
    for (int i = 0; i < naddrs; ++i)
        if (addrs[i].family == family && !std::memcmp(addrs[i].addr, addr, len)) return true;
    return false;
}

void mark_unattached(int fd, Reason why, EntryMark *mark) noexcept {
    Tuple t;
    if (tuple_of(fd, t) != 0) return;
    Entry e{};
    e.magic = kEntryMagic;
    e.version = kEntryVersion;
    e.pid = getpid();
    e.conn_id = ~0u;  // no connection of ours: the mark's holder, or the sweep, removes it
    e.acceptor = 1;
    e.kernel_why = std::uint32_t(why);
    std::uint64_t dev = 0, ino = 0;
    if (write_entry(t, e, &dev, &ino) && mark) *mark = EntryMark{dev, ino};
}

SD_CHILD_PATH void unmark_unattached(int fd, EntryMark &mark) noexcept {
    if (!mark.ino) return;
    const EntryMark m = std::exchange(mark, EntryMark{});
    Tuple t;
    if (tuple_of(fd, t) != 0) return;
    // Only that file: the name may be a newer entry's (our own publish
    // replaces the mark, or another connection of the same 4-tuple).
    char path[400];
    entry_path(path, sizeof path, t);
    struct stat st;
    if (stat(path, &st) == 0 && std::uint64_t(st.st_ino) == m.ino &&
        std::uint64_t(st.st_dev) == m.dev)
        unlink(path);
}

void Engine::mark_kernel(Conn *c, Reason r) noexcept {
    // An entry of ours is there only while the registry is reachable; one
    // that never was published (no fabric) stays unpublished.
    if (!fabric_ok_) {
        unpublish(c);
        return;
    }
    publish(c, r);
}

void Engine::judge(Conn *c, bool at_end) noexcept {
    const std::uint64_t wait_ns = std::uint64_t(settings().upgrade_timeout_ms) * 1000000;
    if (!at_end && monotonic_ns() - c->born_ns < wait_ns) return;
    if (!c->verdict_due.exchange(false, std::memory_order_acq_rel)) return;
    std::uint32_t expect = std::uint32_t(Reason::no_peer);
    const ConnState st = c->state.load(std::memory_order_acquire);
    if (st == ConnState::initiating || st == ConnState::committing) {
        // An upgrade under way: it ends direct or on TCP with a reason of
        // its own, unless the process ends first (exit: nothing waits).
        if (!at_end) {
            c->verdict_due.store(true, std::memory_order_relaxed);
            return;
        }
        if (c->stat->reason.compare_exchange_strong(expect, std::uint32_t(Reason::ended_early)))
            SD_LOG_CONN(info, *c->stat, "stays on TCP: ended_early (the process ended during its "
                                        "upgrade, after %u ms)",
                        unsigned((monotonic_ns() - c->born_ns) / 1000000));
        return;
    }
    if (st != ConnState::kernel) return;
    char path[400];
    entry_path(path, sizeof path, reversed(c->tuple));
    Found f;
    Entry e{};
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd >= 0) {
        const bool ok = sys.read(fd, &e, sizeof e) == sizeof e && entry_valid(e);
        sys.close(fd);
        if (!ok) return;
        if (!e.kernel_why || e.kernel_why >= std::uint32_t(Reason::count_)) {
            // The peer runs the library and waits. Upgrades barred (the
            // socket shared through fork, handed over an exec) before any
            // upgrade, this connection never will; otherwise the upgrade may still come. Where no
            // peer ever showed up, that stays the reason (below).
            if (!c->upgrades_barred.load(std::memory_order_acquire)) {
                // Closed (or its process ended) before the upgrade that
                // was coming: a one-shot client, typically.
                if (at_end && c->stat->reason.compare_exchange_strong(
                                  expect, std::uint32_t(Reason::ended_early)))
                    SD_LOG_CONN(info, *c->stat, "stays on TCP: ended_early (the peer, pid %d, runs "
                                                "the library; the connection ended after %u ms, "
                                                "before its upgrade)",
                                int(e.pid), unsigned((monotonic_ns() - c->born_ns) / 1000000));
                return;
            }
            const std::uint32_t why = c->barred_why.load(std::memory_order_relaxed);
            if (c->stat->reason.compare_exchange_strong(expect, why))
                SD_LOG_CONN(info, *c->stat, "stays on TCP: %s (%s)", reason_name(Reason(why)),
                            why == std::uint32_t(Reason::shared)
                                ? "held by several processes since a fork"
                                : "held on the kernel before its upgrade");
            return;
        }
        f.why = Reason::peer_kernel;
    } else {
        const char *name = std::strrchr(path, '/');
        look_elsewhere(name ? name + 1 : path, f);
        // Nobody here could have published: the peer is on another host.
        if (f.why == Reason::no_peer && !address_is_local(c->tuple.family, c->tuple.peer_addr))
            f.why = Reason::other_host;
    }
    if (f.why == Reason::peer_kernel)
        c->stat->peer_reason = std::uint16_t(e.kernel_why);
    if (f.why != Reason::no_peer &&
        !c->stat->reason.compare_exchange_strong(expect, std::uint32_t(f.why)))
        return;
    const unsigned ms = unsigned((monotonic_ns() - c->born_ns) / 1000000);
    switch (f.why) {
    case Reason::peer_kernel:
        SD_LOG_CONN(info, *c->stat, "stays on TCP: peer_kernel (peer pid %d keeps its end on the "
                                    "kernel: %s)",
                    int(e.pid), reason_name(Reason(e.kernel_why)));
        break;
    case Reason::other_registry:
        SD_LOG_CONN(info, *c->stat, "stays on TCP: other_registry (the peer published in %s, "
                                    "we in %s: give both ends one SDIRECT_REGISTRY)",
                    f.where, settings().registry);
        break;
    case Reason::other_host:
        SD_LOG_CONN(info, *c->stat, "stays on TCP: other_host (the peer's address is not one of "
                                    "this host's; the fabric here reaches this host only)");
        break;
    case Reason::other_user:
        SD_LOG_CONN(info, *c->stat, "stays on TCP: other_user (the peer published in %s, of "
                                    "uid %u)", f.where, f.uid);
        break;
    default:
        SD_LOG_CONN(info, *c->stat, "stays on TCP: no_peer (no registry entry for the other "
                                    "end in %u ms: it does not run the library, or runs with "
                                    "SDIRECT_ENABLE=0, or is on another host)", ms);
        break;
    }
}

void Engine::peer_wait_due(Conn *c, bool rx) noexcept {
    if (c->state.load(std::memory_order_acquire) != ConnState::kernel ||
        c->upgrades_barred.load(std::memory_order_acquire)) {
        // Upgraded, or on its way to TCP for another reason: nothing to
        // give up (a rearm after a leave does not wait under this bound).
        c->awaiting_peer.store(false, std::memory_order_relaxed);
        return;
    }
    // (Reads and writes may count at once, under their own locks: a turn
    // seen twice or missed only moves the end by one.)
    if (c->wait_last_rx.exchange(rx, std::memory_order_relaxed) != rx)
        c->wait_turns.fetch_add(1, std::memory_order_relaxed);
    if (c->wait_turns.load(std::memory_order_relaxed) < Conn::kPeerWaitTurns) return;
    const std::uint64_t since = c->published_ns.load(std::memory_order_acquire);
    if (!since || monotonic_ns() - since < std::uint64_t(settings().peer_wait_ms) * 1000000)
        return;
    c->awaiting_peer.store(false, std::memory_order_relaxed);
    c->give_up_due.store(true, std::memory_order_release);
}

void Engine::give_up_waiting(Conn *c) noexcept {
    if (!c->give_up_due.exchange(false, std::memory_order_acq_rel)) return;
    // Under conn_lock_, as the answer to a peer's request: a request that
    // came first has moved the state on (it goes direct), one that comes
    // after finds the connection final and is refused.
    std::lock_guard lock(conn_lock_);
    if (c->state.load(std::memory_order_acquire) != ConnState::kernel ||
        c->upgrades_barred.load(std::memory_order_acquire))
        return;
    const std::uint64_t since = c->published_ns.load(std::memory_order_relaxed);
    c->move_to(ConnState::final);
    c->verdict_due.store(false, std::memory_order_relaxed);
    // The verdict's reason stays (no_peer, other_user ...): it says why
    // the peer never asked; our entry says why we no longer wait.
    mark_kernel(c, Reason::peer_wait);
    SD_LOG_CONN(info, *c->stat, "stays on TCP for good: its peer did not ask for the upgrade in "
                                "%u ms (%s; SDIRECT_PEER_WAIT_MS)",
                unsigned((monotonic_ns() - since) / 1000000),
                reason_name(Reason(c->stat->reason.load(std::memory_order_relaxed))));
    std::lock_guard rx(c->rx_lock);
    c->wake_locked();
}

}  // namespace sd::transport
