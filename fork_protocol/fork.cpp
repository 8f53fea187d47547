#include "fork.hpp"

#include "claim.hpp"
#include "handover.hpp"
#include "share.hpp"

#include "shm_fallback/fork_hooks.hpp"
#include "shm_fallback/readiness.hpp"
#include "shm_fallback/table.hpp"
#include "transport/engine.hpp"
#include "transport/renew.hpp"
#include "transport/sys.hpp"

#include <pthread.h>

namespace sd::forking {
namespace {

// What the engine's builder thread answered before this fork.
bool settled = true;

void prepare() noexcept {
    transport::renew(settled, transport::Engine::settle_before_fork());
    transport::Engine::park_for_fork();
    fallback::table_fork_prepare();
}
void in_parent() noexcept {
    fallback::table_unlock_after_fork();
    transport::Engine::resume_after_fork();
}

SD_CHILD_PATH void in_child() noexcept {
    fallback::table_after_fork_child();
    fallback::epoll_after_fork_child();
    transport::Engine::forget_after_fork(settled);
}

}  // namespace

void install() noexcept {
    // Before the first socket: shm_fallback calls the fork protocol only
    // through this table.
    fallback::set_fork_hooks({
        .claim_inherited = claim_inherited,
        .orphan_error = orphan_error,
        .adopt_share = adopt_share,
        .drop_share = drop_share,
        .left_holders = left_holders,
        .rejoin_locked = rejoin_locked,
        .fork_prepare = fork_prepare,
        .fork_child = fork_child,
        .before_exec = before_exec,
        .inherit_waiting = inherit_waiting,
        .adopt_inherited = adopt_inherited,
    });
    pthread_atfork(prepare, in_parent, in_child);
}

}  // namespace sd::forking
