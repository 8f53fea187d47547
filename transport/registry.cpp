#include "registry.hpp"

#include "log.hpp"
#include "sys.hpp"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sd::transport {
namespace {

// Bounds of one sweep: a directory of a million names must not make a
// process's start slow, and later starts carry on where this one stopped
// being useful (each removes what it reads first).
constexpr int kSweepNames = 4096;    // directory entries looked at
constexpr int kSweepEntries = 256;   // connection entries opened and read

// What choose_registry() passed over, for report_registry_choice().
char passed_over[256];
unsigned passed_owner = 0;
std::atomic<bool> reported{false};

enum class Fit { absent, ours, foreign };

Fit fit_of(const char *dir, unsigned *owner = nullptr) noexcept {
    struct stat st;
    if (lstat(dir, &st) != 0) return errno == ENOENT ? Fit::absent : Fit::foreign;
    if (owner) *owner = unsigned(st.st_uid);
    // Searchable by others (0711, SDIRECT_CROSS_USER) is still ours alone:
    // they may open a name they know, never list, create or remove one.
    if (S_ISDIR(st.st_mode) && st.st_uid == getuid() && (st.st_mode & 066) == 0) return Fit::ours;
    return Fit::foreign;
}

bool dead(long pid) noexcept { return pid > 0 && kill(pid_t(pid), 0) != 0 && errno == ESRCH; }

// The pid spelt by `digits` (up to `end`, or the string's end) is gone.
bool dead_digits(const char *digits, const char *end = nullptr) noexcept {
    char *stop = nullptr;
    long pid = std::strtol(digits, &stop, 10);
    if (stop == digits || (end ? stop != end : *stop != '\0')) return false;
    return dead(pid);
}

// A connection entry's temporary file, c-....<pid>.tmp, of a writer that
// died between creating and renaming it.
bool dead_writer(const char *name) noexcept {
    std::size_t n = std::strlen(name);
    if (n < 6 || std::strcmp(name + n - 4, ".tmp") != 0) return false;
    const char *end = name + n - 4;
    const char *dot = end;
    while (dot > name && dot[-1] != '.') --dot;
    return dot > name && dead_digits(dot, end);
}

// A connection entry whose process is gone. Removed only if the name still
// holds the file read: a new connection of a live process may have renamed
// its own entry over it meanwhile (the 4-tuple reused).
void sweep_entry(int dirfd, const char *name) noexcept {
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return;
    Entry e{};
    struct stat held, now;
    bool stale = sys.read(fd, &e, sizeof e) == sizeof e && e.magic == kEntryMagic &&
                 dead(e.pid) && fstat(fd, &held) == 0;
    sys.close(fd);
    if (stale && fstatat(dirfd, name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
        now.st_ino == held.st_ino && now.st_dev == held.st_dev)
        unlinkat(dirfd, name, 0);
}

}  // namespace

void choose_registry(const char *base, char *out, std::size_t n) noexcept {
    std::snprintf(out, n, "%s", base);
    passed_over[0] = '\0';
    if (fit_of(base, &passed_owner) != Fit::foreign) return;
    char name[256];
    for (int i = 1; i < kRegistryTries; ++i) {
        std::snprintf(name, sizeof name, "%s-%d", base, i);
        if (fit_of(name) == Fit::foreign) continue;
        std::snprintf(passed_over, sizeof passed_over, "%s", base);
        std::snprintf(out, n, "%s", name);
        return;
    }
}

int claim_registry(const char *dir) noexcept {
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) return -errno;
    if (fit_of(dir) != Fit::ours) return -EPERM;
    return 0;
}

void report_registry_choice() noexcept {
    if (!passed_over[0] || reported.exchange(true)) return;
    SD_LOG(error, "registry %s belongs to uid %u, not to us: using %s", passed_over,
           passed_owner, settings().registry);
}

void sweep_registry(const char *dir) noexcept {
    int names = 0, entries = 0;
    if (DIR *d = opendir(dir)) {
        while (names++ < kSweepNames) {
            dirent *e = readdir(d);
            if (!e) break;
            const char *n = e->d_name;
            if (!std::strncmp(n, "c-", 2)) {
                if (dead_writer(n)) unlinkat(dirfd(d), n, 0);
                else if (entries++ < kSweepEntries) sweep_entry(dirfd(d), n);
            } else if ((n[0] == 'p' && dead_digits(n + 1)) ||
                       (!std::strncmp(n, "ctl-", 4) && dead_digits(n + 4))) {
                unlinkat(dirfd(d), n, 0);
            }
        }
        closedir(d);
    }
    // The provider's regions, sd<pid>-<nonce>, of our uid only.
    names = 0;
    if (DIR *d = opendir("/dev/shm")) {
        while (names++ < kSweepNames) {
            dirent *e = readdir(d);
            if (!e) break;
            const char *n = e->d_name;
            struct stat st;
            char *stop = nullptr;
            if (std::strncmp(n, "sd", 2) != 0 || n[2] < '0' || n[2] > '9') continue;
            long pid = std::strtol(n + 2, &stop, 10);
            if (*stop == '-' && dead(pid) &&
                fstatat(dirfd(d), n, &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_uid == getuid())
                unlinkat(dirfd(d), n, 0);
        }
        closedir(d);
    }
}

}  // namespace sd::transport
