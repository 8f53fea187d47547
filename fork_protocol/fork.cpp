#include "fork.hpp"

#include "shm_fallback/readiness.hpp"
#include "shm_fallback/table.hpp"
#include "transport/engine.hpp"

#include <pthread.h>

namespace sd::forking {
namespace {

// What the engine's builder thread answered before this fork.
bool settled = true;

void prepare() noexcept {
    settled = transport::Engine::settle_before_fork();
    fallback::table_fork_prepare();
}
void in_parent() noexcept { fallback::table_unlock_after_fork(); }

void in_child() noexcept {
    fallback::table_after_fork_child();
    fallback::epoll_after_fork_child();
    transport::Engine::forget_after_fork(settled);
}

}  // namespace

void install() noexcept { pthread_atfork(prepare, in_parent, in_child); }

}  // namespace sd::forking
