// The socket table: fd number -> Stream, an array of atomic pointers
// indexed by fd (no lock on lookup). Streams come from a pool and are never
// returned to the allocator, so a lookup racing with close() touches a
// Stream object at worst, never freed memory; the reference count, taken
// only while it is non-zero and rechecked against the table, tells.
#pragma once
#include "stream.hpp"

namespace sd::fallback {

// The table, sized by RLIMIT_NOFILE's hard limit. `sockets` false
// (SDIRECT_ENABLE=0): no table at all, so that no fd is ever found ours
// and every call goes to libc as it came.
void table_init(bool sockets = true) noexcept;

// One past the largest fd number the table can hold.
int table_size() noexcept;

// The stream at fd with a reference held, or nullptr. A socket an exec
// in place handed over to this image is tracked at its first lookup
// (fork_hooks' adopt_inherited: fork_protocol/handover.cpp).
Stream *acquire(int fd) noexcept;
void release(Stream *s) noexcept;

// A new stream for the fresh socket `fd` (nullptr if fd is out of range).
Stream *create(int fd, int domain, bool nonblock) noexcept;
// `fd` now also refers to `s` (dup); the table takes a reference.
void map_dup(int fd, Stream *s) noexcept;
// Removes fd from the table; returns its stream (with the table's
// reference, now the caller's) or nullptr.
Stream *unmap(int fd) noexcept;
// Unmaps fd and, if it was the last fd of its stream, tells the peer; the
// caller then closes the kernel fd and releases the stream.
Stream *close_prepare(int fd) noexcept;
// Streams whose last fd went (close_prepare), ever: an epoll set drops
// its entries of closed sockets only when this has moved.
std::uint64_t last_closes() noexcept;

// fork: before it, mark every connected socket shared (the fork
// protocol's fork_prepare, through fork_hooks) and take the pool lock;
// after it, in the parent, drop the lock; in the child, leave every
// inherited stream to the kernel (fork_child, through fork_hooks) and
// reset the lock.
void table_fork_prepare() noexcept;
void table_unlock_after_fork() noexcept;
void table_after_fork_child() noexcept;

// exec: every socket the new program inherits goes back to the kernel
// first (the fork protocol's before_exec, through fork_hooks). Called in a vfork child too (recognised by
// its pid), where only owners' control threads act.
void table_before_exec() noexcept;
// A posix_spawn file action, as far as it decides which fds the new
// program holds: `close` fd; `dup2` fd onto newfd (even an FD_CLOEXEC fd
// becomes the new program's; onto itself, it clears FD_CLOEXEC there);
// `replace`: fd becomes another file (an open action, popen's pipe);
// `close_from`: fd and every fd above it; `none`: no fd changes (chdir).
struct SpawnAction {
    enum class Kind : std::uint8_t { close, dup2, replace, close_from, none };
    Kind kind;
    int fd;
    int newfd;
};
// posix_spawn, system, popen: a child starts with this process's fds
// without FD_CLOEXEC, then applies `actions` in order; the sockets it
// holds after them go back to the kernel (before_exec, as above), the
// others stay as they are (direct ones stay direct). `nactions` < 0: the
// actions are not known, so every socket counts as the child's.
void table_before_spawn(const SpawnAction *actions, int nactions) noexcept;
// exec in place (not in a vfork child): the new image will not hold the
// sockets it does not inherit (FD_CLOEXEC), so this process's holder
// entries for those shared through fork go now, and their other holders
// may upgrade them once alone. table_exec_failed() takes them back.
void table_exec_drop_uninherited() noexcept;
void table_exec_failed() noexcept;

// The sockets a new program would inherit: their inode numbers and fd
// numbers (fds without FD_CLOEXEC), those at fds above `after`, in fd
// order, at most `max`; the count.
int inherited_sockets(ino_t *out, int *out_fd, int max, int after = -1) noexcept;
// Some stream is mapped at `fd` (no reference taken, no adoption).
bool slot_taken(int fd) noexcept;

// A vfork child: its memory (this table, every stream) is its parent's,
// so it must change none of it; or a child made without the fork
// handlers, whose state is its parent's. One getpid() call, made only
// while a fork is under way or once such a child may have been made.
bool foreign_process() noexcept;
// A child is about to be made without the fork handlers (vfork, _Fork,
// clone, or their system calls through syscall(): shim_child.cpp): from
// now on foreign_process() asks the kernel, and every socket's inode is
// looked up while this process's fds are the table's.
void note_unhandled_child() noexcept;
// The process whose fds the table maps (a vfork child's parent, there).
int table_pid() noexcept;
// This process's id: without a system call unless foreign_process() would
// make one (its answer may then differ from table_pid()).
int own_pid() noexcept;
// The monotonic clock when the last fork's prepare step ran: a child's
// time of birth without a clock read of its own (the child would fault
// in the clock's code pages for it).
std::uint64_t table_fork_ns() noexcept;

}  // namespace sd::fallback
