// The fork protocol's entries as they are before it installs its own:
// what the library does when no fork ever happened.
#include "fork_hooks.hpp"

#include <cerrno>

namespace sd::fallback {
namespace {

bool nothing_to_claim(Stream &, int, transport::Reason) noexcept { return true; }
ssize_t no_orphan(Stream &, bool, int) noexcept { return -EIO; }
bool no_share(Stream &, Sharers *) noexcept { return false; }
void no_share_to_drop(Stream &) noexcept {}
Sharers *no_holders(const Stream &, transport::Conn *) noexcept { return nullptr; }
bool no_rejoin(Stream &, transport::Conn *, Sharers *) noexcept { return false; }
void nothing_kept_at_fork(Stream &, unsigned) noexcept {}
void nothing_inherited(Stream &, unsigned, int) noexcept {}
void nothing_before_exec(Stream &, bool, int) noexcept {}
bool nothing_handed_over() noexcept { return false; }
Stream *nothing_to_adopt(int) noexcept { return nullptr; }

}  // namespace

constinit ForkHooks fork_hooks{
    .claim_inherited = nothing_to_claim,
    .orphan_error = no_orphan,
    .adopt_share = no_share,
    .drop_share = no_share_to_drop,
    .left_holders = no_holders,
    .rejoin_locked = no_rejoin,
    .fork_prepare = nothing_kept_at_fork,
    .fork_child = nothing_inherited,
    .before_exec = nothing_before_exec,
    .inherit_waiting = nothing_handed_over,
    .adopt_inherited = nothing_to_adopt,
};

void set_fork_hooks(const ForkHooks &h) noexcept { fork_hooks = h; }

}  // namespace sd::fallback
