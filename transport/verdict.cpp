// Why a connection stayed on TCP when nothing failed: the peer never
// answered because it never published, or published where we cannot see
// it, or published that it stays on the kernel. Nothing tells us when to
// give up waiting for a peer, so the verdict comes at the first kernel
// I/O past the upgrade timeout, or at close, or at exit, whichever is
// first; it changes only the reason shown (a peer that publishes later
// still upgrades the connection), and logs it once.
#include "engine.hpp"
#include "log.hpp"
#include "registry.hpp"
#include "sys.hpp"
#include "wait.hpp"

#include <cerrno>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

// The other end's entry name, looked for in every directory beside our
// registry (other SDIRECT_REGISTRY values, other users' registries) and
// under /dev/shm. Another user's registry is mode 0700: only root can see
// into it; an unreadable one tells nothing, and nothing is ever opened
// there, only looked up (the registry's rules for our own stay as they are).
void look_elsewhere(const char *name, Found &f) noexcept {
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
        for (int n = 0; n < kSiblings; ++n) {
            dirent *e = readdir(d);
            if (!e) break;
            if (e->d_name[0] == '.') continue;
            struct stat st;
            if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) ||
                (st.st_dev == ours.st_dev && st.st_ino == ours.st_ino))
                continue;
            char path[600];
            std::snprintf(path, sizeof path, "%s/%s/%s", dir, e->d_name, name);
            struct stat entry;
            if (lstat(path, &entry) != 0) continue;
            f.why = st.st_uid == getuid() ? Reason::other_registry : Reason::other_user;
            f.uid = unsigned(st.st_uid);
            std::snprintf(f.where, sizeof f.where, "%s/%s", dir, e->d_name);
            closedir(d);
            return;
        }
        closedir(d);
        if (!std::strcmp(parent, "/dev/shm")) break;
    }
}

}  // namespace

void mark_unattached(int fd, Reason why) noexcept {
    Tuple t;
    if (tuple_of(fd, t) != 0) return;
    Entry e{};
    e.magic = kEntryMagic;
    e.version = 1;
    e.pid = getpid();
    e.conn_id = ~0u;  // no connection of ours: nobody unpublishes it but the sweep
    e.acceptor = 1;
    e.kernel_why = std::uint32_t(why);
    write_entry(t, e);
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
    if (c->state.load(std::memory_order_acquire) != ConnState::kernel) return;
    std::uint32_t expect = std::uint32_t(Reason::no_peer);
    if (c->held.load(std::memory_order_acquire)) {
        // Shared through fork before any upgrade: its last holder may
        // upgrade it, this connection never will.
        if (c->stat->reason.compare_exchange_strong(expect, std::uint32_t(Reason::shared)))
            SD_LOG_CONN(info, *c->stat, "stays on TCP: shared (held by several processes since a "
                                        "fork)");
        return;
    }
    char path[400];
    entry_path(path, sizeof path, reversed(c->tuple));
    Found f;
    Entry e{};
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd >= 0) {
        const bool ok = sys.read(fd, &e, sizeof e) == sizeof e && e.magic == kEntryMagic;
        sys.close(fd);
        if (!ok) return;
        if (!e.kernel_why || e.kernel_why >= std::uint32_t(Reason::count_)) return;  // it may still come
        f.why = Reason::peer_kernel;
    } else {
        const char *name = std::strrchr(path, '/');
        look_elsewhere(name ? name + 1 : path, f);
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

}  // namespace sd::transport
