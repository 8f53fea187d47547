// Connections between processes of two different uids (SDIRECT_CROSS_USER,
// on by default).
//
// The connector looks for its peer's entry in the registry of the uid the
// kernel names as the owner of the other end's socket (the default
// /dev/shm/sdirect-UID, searchable by others but not listable while this
// is on). Both ends check each other with SO_PEERCRED and a proof socket
// each way, and each opens to the other's uid, by one POSIX ACL entry,
// its process page alone, read only (the peer reads it with pread, never
// a map). A third uid opens nothing (EACCES). The provider is not used
// between them: their messages go through two queues of our own, one per
// direction, sealed memfds passed in the handshake (xqueue.hpp,
// xqlink.cpp). Every byte across such a pair goes inline, in messages
// (no ring write, no zero-copy, no process_vm_*: the kernel refuses it one
// way, by ptrace rules). docs/ARCHITECTURE.md, "Between users", says what
// this guarantees and what it does not. A pair of one uid where either
// end is not dumpable goes the same way, under the same restrictions
// (docs/ARCHITECTURE.md, "Not dumpable").
#pragma once

#include <cstddef>
#include <sys/types.h>

namespace sd::transport {

struct Tuple;

// SDIRECT_CROSS_USER is set (and the registry is the default one).
bool cross_user_on() noexcept;

// This process is dumpable now (prctl). One that is not goes through the
// queues with every peer, as across users (handshake.cpp).
bool dumpable() noexcept;

// The registry directory the processes of `uid` use: the first of
// /dev/shm/sdirect-UID, -1, -2 ... that exists as a real directory owned by
// `uid` and writable by nobody else, passing over names another user took
// (as that uid's own processes do). 0 or -errno (-ENOENT: none).
int registry_of_uid(unsigned uid, char *out, std::size_t n) noexcept;

// Looks for the connection entry `name` in the registry of the uid that
// owns the other end of the connection (`other_end`: that end's local
// address first, as the kernel names it: tcp_socket_uid). On success
// returns an fd open on it (a regular file owned by that uid, in its
// registry) and sets `*uid` and `dir`; else -errno (-ENOENT: none, or the
// other end is ours).
int open_foreign_entry(const char *name, const Tuple &other_end, unsigned *uid, char *dir,
                       std::size_t n) noexcept;

// Gives `uid` access to the file: `perm` 4 read only, 6 read and write
// (one ACL entry beside the owner's, every user of the file getting the
// same; group and others keep none). Idempotent. 0 or -errno.
int grant_uid(const char *path, unsigned uid, unsigned perm) noexcept;

// Opens our registry for other uids: the directory becomes searchable
// (0711: entries can be opened by name, never listed), the control socket
// connectable. Called once the control socket exists.
void open_registry(const char *dir, const char *ctl_socket) noexcept;

// The uid that owns the TCP socket whose local end is `t`'s local end and
// whose peer is `t`'s peer (asked of the kernel by sock_diag, exactly that
// 4-tuple; the creator of the socket, or of the listener it was accepted
// from): whose registry holds our peer's entry. 0 or -errno (-ENOENT: no
// such socket).
int tcp_socket_uid(const Tuple &t, unsigned *uid) noexcept;

// A duplicate of the connection's own socket `fd`, to prove to a peer of
// another uid that we hold it; -1 if `fd` no longer is the socket of `t`
// (the application closed it and the number went to another file, which
// must never reach another user).
int proof_dup(int fd, const Tuple &t) noexcept;

// `fd` is an eventfd: the doorbell of a peer of our uid that uses a
// queue (SDIRECT_QUEUES), written as the provider's peers' are.
bool is_eventfd(int fd) noexcept;
// `fd` is a datagram socket of the local domain: the bell of a restricted
// peer (another uid, or one end not dumpable), which we ring with
// send(MSG_DONTWAIT). Never an eventfd there: the peer shares its open
// file with us, and could clear O_NONBLOCK and fill its count, and our
// next write would wait for ever; a send with MSG_DONTWAIT does not look
// at the file's flags.
bool is_bell_socket(int fd) noexcept;

// File mode of connection entries: readable by the peer's uid when on.
unsigned entry_mode() noexcept;

}  // namespace sd::transport
