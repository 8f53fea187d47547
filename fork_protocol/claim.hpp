// A socket direct in another process and inherited through fork (an
// orphan), and a socket a program that may not run the library inherits
// (claim.cpp). shm_fallback/ reaches these through its fork_hooks table.
#pragma once
#include "shm_fallback/stream.hpp"

namespace sd::forking {

// This process uses a socket that was direct in another (inherited
// through fork): that owner moves it back to the kernel first. False if
// it could not: its I/O then fails with EIO, or as after a reset
// (orphan_error) where the owner died first or its peer died with bytes
// unread there. `proof`: an fd of the socket (-1: the stream's own).
bool claim_inherited(fallback::Stream &s, int proof, transport::Reason why) noexcept;
// What an I/O call on an orphan whose claim failed returns.
ssize_t orphan_error(fallback::Stream &s, bool out, int flags) noexcept;
// exec, posix_spawn, system, popen are about to start a program that may
// not run the library, and it will hold this socket (`kept`: an fd of it
// here): the socket goes back to the kernel for good. `vforked`: called
// in a vfork child, whose memory is its parent's (only the owner's
// control thread acts).
void before_exec(fallback::Stream &s, bool vforked, int kept) noexcept;

}  // namespace sd::forking
