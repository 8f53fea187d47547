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
// The process changes its privileges or enters a sandbox: every socket
// goes back to the kernel for good, and the process never upgrades again
// (transport::retired); the peers' pages and regions are unmapped.
void table_retire() noexcept;

}  // namespace sd::forking
