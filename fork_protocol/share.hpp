// Sockets shared through fork (share.cpp): what a fork does to each
// stream in the parent and in the child, and how the holder left alone
// takes the socket back. shm_fallback/ reaches these through its
// fork_hooks table (installed by install(), fork.cpp).
#pragma once
#include "shm_fallback/stream.hpp"

namespace sd::forking {

// In the parent before the fork (no upgrade of a shared socket), and in
// the child after it (the parent's connection state is not ours). `mark`:
// the fork pass, so that a stream mapped at several fds is done once.
void fork_prepare(fallback::Stream &s, unsigned mark) noexcept;
void fork_child(fallback::Stream &s, unsigned mark, int parent) noexcept;
// The only holder left (pend_lock held): takes the shared counts as its
// own and attaches at the next call. False while others hold it.
bool adopt_share(fallback::Stream &s, fallback::Sharers *sh) noexcept;
// Gives the return to direct mode up: the socket stays on TCP.
void drop_share(fallback::Stream &s) noexcept;
// Our connection left the fabric because a process we forked uses the
// socket (final, reason shared): its holders count together, as for a
// socket shared before its upgrade. The holders, or nullptr.
fallback::Sharers *left_holders(const fallback::Stream &s, transport::Conn *c) noexcept;
// This process holds it alone now (pend_lock and tx_lock held): the
// connection waits in kernel mode for the peer again, from the holders'
// counts. True when it is no longer counted for the holders.
bool rejoin_locked(fallback::Stream &s, transport::Conn *c, fallback::Sharers *h) noexcept;

}  // namespace sd::forking
