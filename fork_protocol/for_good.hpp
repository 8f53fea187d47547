// Every socket of a set, or of the table, goes back to the kernel for good
// (Stream::to_kernel_for_good, shm_fallback/for_good.cpp): sockets passed
// to another process, or every socket of a process that changes its
// privileges.
#pragma once
#include "transport/procpage.hpp"

namespace sd::forking {

// The sockets at `fds` (or every socket, nfds < 0) go back to the kernel
// for good. Not in a vfork child.
void table_to_kernel_for_good(const int *fds, int nfds, transport::Reason why) noexcept;
// The process changes its privileges (`sandbox` false) or enters a
// sandbox: every socket goes back to the kernel for good, except one
// shared through fork, which it counts for the other holders, and the
// process never upgrades again (transport::retired), unless a later change
// of ids goes on afresh (not after a sandbox); the peers' pages and regions
// are unmapped.
void table_retire(bool sandbox) noexcept;
// Before a call that changes the process's uid or gid: true when the
// process holds nothing of the fabric (no socket that is or was
// connected, only listening or unconnected ones, shared through fork
// without a connection of its own, or on the kernel for good; no engine,
// or an unused one, given up; not in a sandbox), so that it goes on
// afresh as its new ids, a retirement by ids included; what a fork left
// of the old ids' maps and control sockets is dropped first. The caller
// then makes the call and calls ids_changed(). False: the caller retires
// (table_retire) as for any privilege change.
bool ids_change_afresh() noexcept;
// After that call: with one uid and one gid in force (real, effective and
// saved), the registry is that uid's from now on; with mixed ids, the
// process retires.
void ids_changed() noexcept;

}  // namespace sd::forking
