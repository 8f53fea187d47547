// Starting a program in a child: posix_spawn, posix_spawnp, system, popen.
// This process goes on with its sockets; the child holds those it
// inherits (no FD_CLOEXEC) as its file actions leave them, and may not
// run the library (or runs a fresh copy that knows nothing of them), so
// those go back to the kernel for good first. Every other socket stays as
// it is: a direct connection the child cannot receive stays direct.
// glibc's system and popen start their shell through internal calls no
// interposer sees (no public posix_spawn, vfork or clone): each public
// entry point is caught.
// The file actions are opaque, so the calls that build them are caught
// too and their fd effects remembered per action list; a list with an
// action we did not see (glibc's count of its actions, a public field,
// differs from ours: a copied list, one built before the library loaded)
// counts every socket as the child's.
#include "shim.hpp"
#include "transport/engine.hpp"
#include "transport/lock_order.hpp"
#include "transport/renew.hpp"

#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <pthread.h>
#include <spawn.h>

namespace {

using sd::fallback::SpawnAction;
using sd::transport::sys;
using Actions = posix_spawn_file_actions_t;

// The actions added to each list, in order, in one table for all lists
// (programs build a few short lists). An action that finds the table full
// is not kept: its list then has fewer actions here than in glibc's count.
struct Recorded {
    const Actions *list;
    SpawnAction action;
};
constexpr int kRecorded = 512;
Recorded recorded[kRecorded];
int nrecorded = 0;
// The first of the lock order (transport/lock_order.hpp): held over the
// fork protocol's prepare step, which takes the locks after it.
sd::transport::RankedMutex<sd::transport::Rank::spawn> record_lock;

// A fork child must not find the table locked by a thread it lacks. A
// process of one thread has no other thread to keep out: the lock is not
// taken, and the handlers write nothing after the fork (each page written
// then is copied while parent and child both map it).
// Registered after the fork protocol's handlers (init.cpp's constructor,
// priority 101): this prepare handler runs before theirs, this child
// handler after theirs.
bool locked_for_fork = false;
__attribute__((constructor(102))) void spawn_init() {
    pthread_atfork(
        [] {
            // Written only when it changes: the page stays as the last
            // fork left it.
            sd::transport::renew(locked_for_fork, !sd::transport::one_thread());
            if (locked_for_fork) record_lock.lock();
        },
        [] {
            if (locked_for_fork) record_lock.unlock();
        },
        [] {
            if (locked_for_fork) record_lock.unlock();
        });
}

void forget(const Actions *list) noexcept {
    std::lock_guard lock(record_lock);
    int to = 0;
    for (int i = 0; i < nrecorded; ++i)
        if (recorded[i].list != list) recorded[to++] = recorded[i];
    nrecorded = to;
}

void remember(const Actions *list, SpawnAction action) noexcept {
    std::lock_guard lock(record_lock);
    if (nrecorded < kRecorded) recorded[nrecorded++] = {list, action};
}

// Before a spawn with `list` (null: no actions): the sockets the child
// will hold leave; the rest stay.
void prepare_spawn(const Actions *list) noexcept {
    if (sd::transport::guarded()) return;
    SpawnAction actions[kRecorded];
    int n = 0;
    if (list) {
        std::lock_guard lock(record_lock);
        for (int i = 0; i < nrecorded; ++i)
            if (recorded[i].list == list) actions[n++] = recorded[i].action;
        if (n != list->__used) n = -1;  // one we did not see: not known
    }
    sd::fallback::table_before_spawn(actions, n);
}

int add(Actions *list, int rc, SpawnAction action) noexcept {
    if (rc == 0) remember(list, action);
    return rc;
}

}  // namespace

SD_EXPORT int posix_spawn_file_actions_init(Actions *list) {
    forget(list);  // a list made anew where an undestroyed one was
    return sys.spawn_actions_init(list);
}

SD_EXPORT int posix_spawn_file_actions_destroy(Actions *list) {
    forget(list);
    return sys.spawn_actions_destroy(list);
}

SD_EXPORT int posix_spawn_file_actions_addclose(Actions *list, int fd) {
    return add(list, sys.spawn_addclose(list, fd), {SpawnAction::Kind::close, fd, -1});
}

SD_EXPORT int posix_spawn_file_actions_adddup2(Actions *list, int fd, int newfd) {
    return add(list, sys.spawn_adddup2(list, fd, newfd), {SpawnAction::Kind::dup2, fd, newfd});
}

SD_EXPORT int posix_spawn_file_actions_addopen(Actions *list, int fd, const char *path, int oflag,
                                               mode_t mode) {
    return add(list, sys.spawn_addopen(list, fd, path, oflag, mode),
               {SpawnAction::Kind::replace, fd, -1});
}

SD_EXPORT int posix_spawn_file_actions_addclosefrom_np(Actions *list, int from) {
    return add(list, sys.spawn_addclosefrom(list, from), {SpawnAction::Kind::close_from, from, -1});
}

SD_EXPORT int posix_spawn_file_actions_addchdir_np(Actions *list, const char *path) {
    return add(list, sys.spawn_addchdir(list, path), {SpawnAction::Kind::none, -1, -1});
}

SD_EXPORT int posix_spawn_file_actions_addfchdir_np(Actions *list, int fd) {
    return add(list, sys.spawn_addfchdir(list, fd), {SpawnAction::Kind::none, -1, -1});
}

SD_EXPORT int posix_spawn_file_actions_addtcsetpgrp_np(Actions *list, int fd) {
    return add(list, sys.spawn_addtcsetpgrp(list, fd), {SpawnAction::Kind::none, -1, -1});
}

SD_EXPORT int posix_spawn(pid_t *pid, const char *path, const Actions *list,
                          const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    prepare_spawn(list);
    return sys.posix_spawn(pid, path, list, attr, argv, envp);
}

SD_EXPORT int posix_spawnp(pid_t *pid, const char *file, const Actions *list,
                           const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    prepare_spawn(list);
    return sys.posix_spawnp(pid, file, list, attr, argv, envp);
}

// The shell inherits every fd without FD_CLOEXEC.
SD_EXPORT int system(const char *command) {
    // system(NULL) only asks whether a shell exists.
    if (command && !sd::transport::guarded()) sd::fallback::table_before_spawn(nullptr, 0);
    return sys.system(command);
}

// The shell inherits every fd without FD_CLOEXEC, but its stdout (mode
// "r") or stdin ("w") is the pipe.
SD_EXPORT FILE *popen(const char *command, const char *type) {
    if (!sd::transport::guarded()) {
        const bool known = type && (type[0] == 'r' || type[0] == 'w');
        const SpawnAction pipe{SpawnAction::Kind::replace, type && type[0] == 'r' ? 1 : 0, -1};
        sd::fallback::table_before_spawn(&pipe, known ? 1 : 0);
    }
    return sys.popen(command, type);
}
