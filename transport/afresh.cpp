// A process that changes its ids before it holds anything of the fabric
// (no engine built or being built, so no connection attached or
// published and no peer attached; or an engine that never held either,
// built by a listen, which is given up) goes on as a fresh process of
// its new ids instead of retiring (intercept/shim_priv.cpp decides, and
// fork_protocol/for_good.cpp looks at the sockets): the registry is
// derived again for the uid now in force, and later connections upgrade
// as that uid's do. The pre-fork server's pattern: a master that listens
// as root (its engine is built there) forks workers that become www-data
// before they accept anything. Also a process that retired at an earlier
// change of ids (not in a sandbox) without an engine of its own, or that
// holds sockets shared through fork and nothing else of the fabric: a
// privilege-separated server's child that becomes the user it serves
// (sshd's session child) upgrades as that user.
//
// What such a process may still hold of its old ids is what a fork left
// it, or its own engine given up: the maps of that engine (the process
// page and the spin file in the old registry, its fabric region and its
// peers') and its control socket. A map is replaced by private zeros in place
// (the provider's inherited objects may still point there; nothing of the
// new process reads them), the control socket is closed: a process of the
// new uid would otherwise take the upgrade requests, and the sockets
// passed with them, meant for the old uid's process.
#include "control.hpp"
#include "engine.hpp"
#include "log.hpp"
#include "settings.hpp"
#include "sys.hpp"
#include "wait.hpp"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <utility>

namespace sd::transport {
namespace {

// Calls that change ids in progress: no engine is built meanwhile.
std::atomic<int> held_builds{0};
// Went on afresh after a retirement by ids, or holding shared sockets.
std::atomic<bool> renewed{false};

// `path` names a file inside directory `dir`.
bool inside(const char *path, const char *dir) noexcept {
    const std::size_t n = std::strlen(dir);
    return n && std::strncmp(path, dir, n) == 0 && path[n] == '/';
}

// A provider region of the shm provider under our names: /dev/shm/sd<pid>-...
bool region_file(const char *path) noexcept {
    if (std::strncmp(path, "/dev/shm/sd", 11) != 0) return false;
    const char *p = path + 11;
    if (*p < '0' || *p > '9') return false;
    while (*p >= '0' && *p <= '9') ++p;
    return *p == '-';
}

// Every shared map of a file in `dir` or of a provider region becomes
// private zeros in place, with its protection. Bounded: at most 4096 maps
// looked at, 256 replaced.
void zero_maps(const char *dir) noexcept {
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    constexpr std::size_t kMax = 1 << 20;
    char *text = static_cast<char *>(std::malloc(kMax));
    std::size_t len = 0;
    for (ssize_t n; text && len < kMax - 1 && (n = sys.read(fd, text + len, kMax - 1 - len)) > 0;)
        len += std::size_t(n);
    sys.close(fd);
    if (!text) return;
    text[len] = '\0';
    struct Range {
        unsigned long lo, hi;
        int prot;
    };
    Range found[256];
    int nfound = 0, lines = 0;
    for (char *line = text; line && *line && lines++ < 4096 && nfound < 256;) {
        char *end = std::strchr(line, '\n');
        if (end) *end = '\0';
        unsigned long lo = 0, hi = 0;
        char perms[8] = {};
        int path_at = 0;
        if (std::sscanf(line, "%lx-%lx %7s %*s %*s %*s %n", &lo, &hi, perms, &path_at) >= 3 &&
            path_at > 0 && perms[3] == 's' &&
            (inside(line + path_at, dir) || region_file(line + path_at))) {
            int prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0);
            found[nfound++] = {lo, hi, prot};
        }
        line = end ? end + 1 : nullptr;
    }
    std::free(text);
    for (int i = 0; i < nfound; ++i) {
        void *at = reinterpret_cast<void *>(found[i].lo);
        if (mmap(at, found[i].hi - found[i].lo, found[i].prot,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
            SD_LOG(error, "could not drop an inherited map at %p: %s", at, std::strerror(errno));
    }
}

// Control sockets bound in `dir` (ctl-<pid>: a parent's, inherited
// through fork) are closed. Only the library binds names there.
void close_control_sockets(const char *dir) noexcept {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return;
    int closing[64];
    int n = 0, names = 0;
    char prefix[300];
    std::snprintf(prefix, sizeof prefix, "%s/ctl-", dir);
    const std::size_t plen = std::strlen(prefix);
    while (names++ < 65536 && n < 64) {
        dirent *e = readdir(d);
        if (!e) break;
        char *stop = nullptr;
        long fd = std::strtol(e->d_name, &stop, 10);
        if (stop == e->d_name || *stop || fd == dirfd(d)) continue;
        sockaddr_un sa{};
        socklen_t sl = sizeof sa;
        if (sys.getsockname(int(fd), reinterpret_cast<sockaddr *>(&sa), &sl) != 0 ||
            sa.sun_family != AF_UNIX || sl <= offsetof(sockaddr_un, sun_path))
            continue;
        sa.sun_path[sizeof sa.sun_path - 1] = '\0';
        if (std::strncmp(sa.sun_path, prefix, plen) == 0) closing[n++] = int(fd);
    }
    closedir(d);
    for (int i = 0; i < n; ++i) sys.close(closing[i]);
}

}  // namespace

bool builds_held() noexcept { return held_builds.load(std::memory_order_acquire) != 0; }

bool ids_renewed() noexcept { return renewed.load(std::memory_order_relaxed); }
void note_ids_renewed() noexcept { renewed.store(true, std::memory_order_relaxed); }

bool Engine::forsake_if_unused() noexcept {
    std::lock_guard lock(conn_lock_);
    if (npeers_ || nretired_) return false;
    for (const auto &c : conns_)
        if (c.load(std::memory_order_acquire)) return false;
    given_up_.store(true, std::memory_order_release);
    return true;
}

void Engine::forsake_after() noexcept {
    // Nobody finds it any more; the old ids may still remove its files.
    char path[300];
    std::snprintf(path, sizeof path, "%s/p%d", settings().registry, int(pid_));
    (void)unlink(path);
    ctl_path(path, sizeof path, pid_);
    (void)unlink(path);
    if (!std::strncmp(ep_.name, "fi_shm://", 9)) {
        std::snprintf(path, sizeof path, "/dev/shm/%s", ep_.name + 9);
        (void)unlink(path);
    }
    // The control thread looks at given_up_ whenever it wakes; a request
    // it is answering meanwhile is refused within a second (no connection
    // matches). Its socket is closed once it is gone, never under its poll.
    const std::uint64_t one = 1;
    if (watch_fd_ >= 0) (void)sys.write(watch_fd_, &one, sizeof one);
    (void)wait_until({.nap_ns = 1000000, .max_naps = 3000}, 0,
                     [this] { return control_gone_.load(std::memory_order_acquire); });
    if (control_gone_.load(std::memory_order_acquire) && ctl_fd_ >= 0)
        sys.close(std::exchange(ctl_fd_, -1));
    else
        SD_LOG(error, "the control thread of a given-up engine did not end; its socket stays open");
    SD_LOG(info, "ids change: the engine built before (no connection, no peer) is given up");
}

bool begin_afresh() noexcept {
    if (sandboxed()) return false;
    held_builds.fetch_add(1, std::memory_order_acq_rel);
    if (Engine::idle_process() || Engine::give_up_unused()) return true;
    held_builds.fetch_sub(1, std::memory_order_acq_rel);
    return false;
}

void drop_old_ids() noexcept {
    const char *dir = settings().registry;
    zero_maps(dir);
    close_control_sockets(dir);
}

void end_afresh(bool settled_ids) noexcept {
    if (settled_ids) {
        const char *before = settings().registry;
        derive_registry();
        // Retired by an earlier change of ids (a fork child of a process
        // that retired: sshd's session child after its monitor's
        // seteuid): the maps it had of the fabric are gone now
        // (drop_old_ids, and the retirement's own), so it may build an
        // engine of its own as its new ids.
        if (end_retirement()) {
            note_ids_renewed();
            SD_LOG(info, "ids settled after a retirement by ids: going on afresh as uid %u, "
                         "registry %s", unsigned(getuid()), settings().registry);
        }
        spin_table_reattach();
        if (std::strcmp(before, settings().registry) != 0)
            SD_LOG(info, "ids changed before any use of the fabric: going on as uid %u, "
                         "registry %s", unsigned(getuid()), settings().registry);
    }
    held_builds.fetch_sub(1, std::memory_order_acq_rel);
}

}  // namespace sd::transport
