// What the fork protocol (fork_protocol/, the layer above) does for a
// socket that went through fork or exec, reached from this layer through a
// table of function pointers, so that calls point down as includes do:
// fork_protocol fills the table at the library's start
// (forking::install(), from intercept/init.cpp's constructor), and this
// layer calls through it. Until then (or in a program that links this
// layer alone) each entry does what the library does when no fork ever
// happened: nothing is inherited, shared or held by other processes.
//
// Cost: the state a fork leaves on a Stream (orphan, holders, share) is
// checked inline first (stream.hpp), so a socket that never went through
// fork makes no call through the table on its I/O; the table's lookup of
// an fd with no stream makes one (inherit_waiting), where it made a direct
// call before.
#pragma once
#include "transport/procpage.hpp"

#include <sys/types.h>

namespace sd::transport {
struct Conn;
}

namespace sd::fallback {

class Stream;
struct Sharers;

struct ForkHooks {
    // A socket direct in another process, inherited through fork, or one
    // shared through fork that another holder took over: that owner moves
    // it back to the kernel first (`proof`: an fd of the socket, -1 for
    // the stream's own). False if it could not.
    bool (*claim_inherited)(Stream &s, int proof, transport::Reason why) noexcept;
    // What an I/O call on an orphan whose claim failed returns.
    ssize_t (*orphan_error)(Stream &s, bool out, int flags) noexcept;
    // The only holder left of a socket shared through fork (pend_lock
    // held): it takes the shared counts as its own. False while others
    // hold it.
    bool (*adopt_share)(Stream &s, Sharers *sh) noexcept;
    // Gives the return to direct mode of a shared socket up.
    void (*drop_share)(Stream &s) noexcept;
    // Our connection left the fabric because a process we forked uses the
    // socket: its holders (who count together), or nullptr.
    Sharers *(*left_holders)(const Stream &s, transport::Conn *c) noexcept;
    // Alone again with a connection that left for sharing (pend_lock and
    // tx_lock held): kernel mode, awaiting the peer's upgrade. True
    // when it is no longer counted for the holders.
    bool (*rejoin_locked)(Stream &s, transport::Conn *c, Sharers *h) noexcept;
    // The table's fork passes, per stream: in the parent before the fork,
    // in the child after it.
    void (*fork_prepare)(Stream &s, unsigned mark) noexcept;
    void (*fork_child)(Stream &s, unsigned mark, int parent) noexcept;
    // A new program that may not run the library will hold the socket
    // (`kept`: an fd of it here).
    void (*before_exec)(Stream &s, bool vforked, int kept) noexcept;
    // The exec hand-over's new image: sockets handed over wait to be
    // tracked at their first use (the table found no stream at `fd`).
    bool (*inherit_waiting)() noexcept;
    Stream *(*adopt_inherited)(int fd) noexcept;
};

// Read on every call that goes through it; written once, by set_fork_hooks.
extern ForkHooks fork_hooks;

// The library's start, while it has one thread: every entry of `h` is set.
void set_fork_hooks(const ForkHooks &h) noexcept;

}  // namespace sd::fallback
