// Starting a program in a child: posix_spawn, posix_spawnp, system, popen
// (fork_protocol/spawn.hpp: the sockets the child will hold go back to the
// kernel for good first). glibc's system and popen start their shell
// through internal calls no interposer sees (no public posix_spawn, vfork
// or clone): each public entry point is caught, and so are the calls that
// build the opaque file actions, whose fd effects are recorded.
#include "shim.hpp"
#include "fork_protocol/spawn.hpp"

#include <spawn.h>

using sd::fallback::SpawnAction;
using sd::forking::spawn_actions_add;
using sd::forking::spawn_actions_forget;
using sd::transport::sys;
using Actions = posix_spawn_file_actions_t;

SD_EXPORT int posix_spawn_file_actions_init(Actions *list) {
    spawn_actions_forget(list);  // a list made anew where an undestroyed one was
    return sys.spawn_actions_init(list);
}

SD_EXPORT int posix_spawn_file_actions_destroy(Actions *list) {
    spawn_actions_forget(list);
    return sys.spawn_actions_destroy(list);
}

SD_EXPORT int posix_spawn_file_actions_addclose(Actions *list, int fd) {
    return spawn_actions_add(list, sys.spawn_addclose(list, fd),
                             {SpawnAction::Kind::close, fd, -1});
}

SD_EXPORT int posix_spawn_file_actions_adddup2(Actions *list, int fd, int newfd) {
    return spawn_actions_add(list, sys.spawn_adddup2(list, fd, newfd),
                             {SpawnAction::Kind::dup2, fd, newfd});
}

SD_EXPORT int posix_spawn_file_actions_addopen(Actions *list, int fd, const char *path, int oflag,
                                               mode_t mode) {
    return spawn_actions_add(list, sys.spawn_addopen(list, fd, path, oflag, mode),
                             {SpawnAction::Kind::replace, fd, -1});
}

SD_EXPORT int posix_spawn_file_actions_addclosefrom_np(Actions *list, int from) {
    return spawn_actions_add(list, sys.spawn_addclosefrom(list, from),
                             {SpawnAction::Kind::close_from, from, -1});
}

SD_EXPORT int posix_spawn_file_actions_addchdir_np(Actions *list, const char *path) {
    return spawn_actions_add(list, sys.spawn_addchdir(list, path),
                             {SpawnAction::Kind::none, -1, -1});
}

SD_EXPORT int posix_spawn_file_actions_addfchdir_np(Actions *list, int fd) {
    return spawn_actions_add(list, sys.spawn_addfchdir(list, fd),
                             {SpawnAction::Kind::none, -1, -1});
}

SD_EXPORT int posix_spawn_file_actions_addtcsetpgrp_np(Actions *list, int fd) {
    return spawn_actions_add(list, sys.spawn_addtcsetpgrp(list, fd),
                             {SpawnAction::Kind::none, -1, -1});
}

SD_EXPORT int posix_spawn(pid_t *pid, const char *path, const Actions *list,
                          const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    sd::forking::before_spawn(list);
    return sys.posix_spawn(pid, path, list, attr, argv, envp);
}

SD_EXPORT int posix_spawnp(pid_t *pid, const char *file, const Actions *list,
                           const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    sd::forking::before_spawn(list);
    return sys.posix_spawnp(pid, file, list, attr, argv, envp);
}

// The shell inherits every fd without FD_CLOEXEC.
SD_EXPORT int system(const char *command) {
    // system(NULL) only asks whether a shell exists.
    if (command) sd::forking::before_system();
    return sys.system(command);
}

// The shell inherits every fd without FD_CLOEXEC, but its stdout (mode
// "r") or stdin ("w") is the pipe.
SD_EXPORT FILE *popen(const char *command, const char *type) {
    sd::forking::before_popen(type);
    return sys.popen(command, type);
}
