// The table-wide forms of the kernel for good: sockets passed to another
// process (SCM_RIGHTS), every socket of a process that changes its
// privileges. One socket's way there: shm_fallback/for_good.cpp.
#include "for_good.hpp"

#include "shm_fallback/table.hpp"
#include "transport/engine.hpp"
#include "transport/wait.hpp"

namespace sd::forking {

using fallback::acquire;
using fallback::release;
using fallback::Stream;
using transport::Reason;

void table_to_kernel_for_good(const int *fds, int nfds, Reason why) noexcept {
    if (fallback::foreign_process()) return;  // a vfork child: its parent's table
    const int end = nfds < 0 ? fallback::table_size() : nfds;
    for (int i = 0; i < end; ++i) {
        const int fd = nfds < 0 ? i : fds[i];
        Stream *s = acquire(fd);
        if (!s) continue;
        // Every stream once (dups map several fds to it), unless named.
        if (nfds >= 0 || s->fd.load(std::memory_order_relaxed) == fd) s->to_kernel_for_good(why);
        release(s);
    }
}

void table_retire() noexcept {
    if (fallback::foreign_process()) return;
    // First: no upgrade starts while the sockets leave. Once is enough.
    if (!transport::set_retired()) return;
    table_to_kernel_for_good(nullptr, -1, Reason::privilege);
    if (transport::Engine *e = transport::Engine::current()) e->forget_peers();
    transport::spin_table_detach();
}

}  // namespace sd::forking
