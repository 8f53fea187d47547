// Starting a program in a child: posix_spawn, posix_spawnp, system, popen.
// This process goes on with its sockets; the child holds those it
// inherits (no FD_CLOEXEC) as its file actions leave them, and may not
// run the library (or runs a fresh copy that knows nothing of them), so
// those go back to the kernel for good first. Every other socket stays as
// it is: a direct connection the child cannot receive stays direct.
//
// The file actions are opaque, so the calls that build them are recorded
// (their fd effects, per action list); a list with an action not recorded
// here (glibc's count of its actions, a public field, differs from ours: a
// copied list, one built before the library loaded) counts every socket
// as the child's.
#pragma once
#include "shm_fallback/table.hpp"

#include <spawn.h>

namespace sd::forking {

// A list made anew or destroyed: its recorded actions are forgotten.
void spawn_actions_forget(const posix_spawn_file_actions_t *list) noexcept;
// glibc added `action` to `list` (rc 0) or refused it: rc, as given.
int spawn_actions_add(posix_spawn_file_actions_t *list, int rc,
                      fallback::SpawnAction action) noexcept;
// Before posix_spawn(p) with `list` (null: no actions).
void before_spawn(const posix_spawn_file_actions_t *list) noexcept;
// Before system(command): the shell inherits every fd without FD_CLOEXEC.
void before_system() noexcept;
// Before popen(command, type): as system, but the shell's stdout (mode
// "r") or stdin ("w") is the pipe.
void before_popen(const char *type) noexcept;

}  // namespace sd::forking
