// The table-wide forms of the kernel for good: sockets passed to another
// process (SCM_RIGHTS), every socket of a process that changes its
// privileges. One socket's way there: shm_fallback/for_good.cpp.
#include "for_good.hpp"

#include "shm_fallback/table.hpp"
#include "transport/engine.hpp"
#include "transport/wait.hpp"

#include <unistd.h>

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

namespace {

// A socket of the table that is or was connected: its connection may be
// attached, published or direct, or one a parent's fork left (orphan),
// shared with other processes (share, holders), or waiting to earn its
// upgrade. Served after the change, it would be another uid's than the
// one the kernel names as its owner (the uid that made it), where a peer
// of another user looks for it; so only a process whose sockets are all
// listening or unconnected (a pre-fork server's worker: the listener it
// inherited) goes on afresh.
bool table_holds_fabric() noexcept {
    const int end = fallback::table_size();
    bool holds = false;
    for (int fd = 0; fd < end && !holds; ++fd) {
        Stream *s = acquire(fd);
        if (!s) continue;
        constexpr auto acq = std::memory_order_acquire;
        const fallback::Phase p = s->phase.load(acq);
        holds = (p != fallback::Phase::listener && p != fallback::Phase::fresh) ||
                s->conn.load(acq) || s->orphan.load(acq) || s->holders.load(acq) ||
                s->share.load(acq) || s->prefix.load(acq);
        release(s);
    }
    return holds;
}

}  // namespace

bool ids_change_afresh() noexcept {
    if (fallback::foreign_process() || transport::retired()) return false;
    // The sockets first: an engine is given up only for a process that
    // goes on afresh (a retiring one marks its unattached connections in
    // the registry through it).
    if (table_holds_fabric() || !transport::begin_afresh()) return false;
    transport::drop_old_ids();
    return true;
}

void ids_changed() noexcept {
    uid_t ru, eu, su;
    gid_t rg, eg, sg;
    const bool settled = getresuid(&ru, &eu, &su) == 0 && getresgid(&rg, &eg, &sg) == 0 &&
                         ru == eu && eu == su && rg == eg && eg == sg;
    transport::end_afresh(settled);
    // Ids mixed (a temporary seteuid): which uid's registry would be ours
    // is not clear, so the process uses none, as before this rule.
    if (!settled) table_retire();
}

}  // namespace sd::forking
