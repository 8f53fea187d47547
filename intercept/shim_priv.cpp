// Privilege changes and sandboxes: set*id, chroot, unshare, setns,
// prctl(PR_SET_SECCOMP). A process that changes its uid or gid while it
// holds nothing of the fabric (no engine, or one that never held a
// connection or a peer, which is given up; a fork child of a server that
// listens as root, before it accepts) goes on as a fresh process of its
// new ids: what a fork left of the old ids is dropped before the call,
// the registry is derived again after it (transport/afresh.cpp); so does
// one that retired at an earlier change of ids, never one in a sandbox.
// Otherwise, and for every sandbox, before the change takes effect every
// connection goes back to the kernel for good and the process stops
// using the fabric: another uid cannot reach its peers' memory (nor
// should it keep maps of their pages), another root or namespace cannot
// reach the registry, and a seccomp filter may forbid the calls an
// upgrade makes. A call that changes nothing (the ids it sets are the
// ones in force) is passed on alone. Supplementary groups (setgroups, and
// initgroups, which calls it inside libc) are not watched: what the
// fabric needs is the same uid and gid on both sides (process_vm_*
// checks those, the registry is per uid). glibc's setuid in a threaded
// process changes every thread through its own signal; the public entry
// is the one seen here. glibc has no seccomp() wrapper; the raw syscall
// is beyond any interposer.
#include "shim.hpp"
#include "fork_protocol/for_good.hpp"

#include <cstdarg>
#include <linux/prctl.h>
#include <linux/sched.h>
#include <sys/syscall.h>
#include <unistd.h>

using namespace sd::intercept;

namespace {

// `sandbox`: for the rest of the process's life; else until a later
// change of ids goes on afresh.
void retire(bool sandbox) noexcept {
    if (!table_frozen()) sd::forking::table_retire(sandbox);
}

// A call that changes ids (`changes`): afresh when the process holds
// nothing of the fabric, else retired first.
template <typename Call>
int change_ids(bool changes, Call call) noexcept {
    if (!changes || table_frozen()) return call();
    if (!sd::forking::ids_change_afresh()) {
        retire(false);
        return call();
    }
    const int rc = call();
    const int err = errno;
    sd::forking::ids_changed();
    errno = err;
    return rc;
}

// -1 ("leave it") or the id in force changes nothing.
bool same(unsigned want, unsigned now) noexcept { return want == unsigned(-1) || want == now; }

bool uids_change(uid_t r, uid_t e, uid_t s) noexcept {
    uid_t nr, ne, ns;
    if (getresuid(&nr, &ne, &ns) != 0) return true;
    return !(same(r, nr) && same(e, ne) && same(s, ns));
}

bool gids_change(gid_t r, gid_t e, gid_t s) noexcept {
    gid_t nr, ne, ns;
    if (getresgid(&nr, &ne, &ns) != 0) return true;
    return !(same(r, nr) && same(e, ne) && same(s, ns));
}

}  // namespace

SD_EXPORT int setuid(uid_t uid) noexcept {
    // As root it sets all three ids, else the effective one.
    return change_ids(uids_change(uid, uid, uid), [&]() noexcept { return sys.setuid(uid); });
}

SD_EXPORT int setgid(gid_t gid) noexcept {
    return change_ids(gids_change(gid, gid, gid), [&]() noexcept { return sys.setgid(gid); });
}

SD_EXPORT int seteuid(uid_t uid) noexcept {
    return change_ids(uids_change(uid_t(-1), uid, uid_t(-1)),
                      [&]() noexcept { return sys.seteuid(uid); });
}

SD_EXPORT int setegid(gid_t gid) noexcept {
    return change_ids(gids_change(gid_t(-1), gid, gid_t(-1)),
                      [&]() noexcept { return sys.setegid(gid); });
}

SD_EXPORT int setreuid(uid_t r, uid_t e) noexcept {
    return change_ids(uids_change(r, e, uid_t(-1)),
                      [&]() noexcept { return sys.setreuid(r, e); });
}

SD_EXPORT int setregid(gid_t r, gid_t e) noexcept {
    return change_ids(gids_change(r, e, gid_t(-1)),
                      [&]() noexcept { return sys.setregid(r, e); });
}

SD_EXPORT int setresuid(uid_t r, uid_t e, uid_t s) noexcept {
    return change_ids(uids_change(r, e, s), [&]() noexcept { return sys.setresuid(r, e, s); });
}

SD_EXPORT int setresgid(gid_t r, gid_t e, gid_t s) noexcept {
    return change_ids(gids_change(r, e, s), [&]() noexcept { return sys.setresgid(r, e, s); });
}

SD_EXPORT int chroot(const char *path) noexcept {
    retire(true);
    return sys.chroot(path);
}

SD_EXPORT int unshare(int flags) noexcept {
    // A table of fds, a cwd, semaphore undo lists of one's own change
    // nothing for us; a namespace does.
    if (flags & ~(CLONE_FILES | CLONE_FS | CLONE_SYSVSEM)) retire(true);
    return sys.unshare(flags);
}

SD_EXPORT int setns(int fd, int nstype) noexcept {
    retire(true);
    return sys.setns(fd, nstype);
}

SD_EXPORT int prctl(int option, ...) noexcept {
    va_list ap;
    va_start(ap, option);
    unsigned long a2 = va_arg(ap, unsigned long), a3 = va_arg(ap, unsigned long),
                  a4 = va_arg(ap, unsigned long), a5 = va_arg(ap, unsigned long);
    va_end(ap);
    if (option == PR_SET_SECCOMP) retire(true);
    return sys.prctl(option, a2, a3, a4, a5);
}
