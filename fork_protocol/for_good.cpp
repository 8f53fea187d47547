// The table-wide forms of the kernel for good: sockets passed to another
// process (SCM_RIGHTS), every socket of a process that changes its
// privileges. One socket's way there: shm_fallback/for_good.cpp.
#include "for_good.hpp"

#include "shm_fallback/table.hpp"
#include "transport/engine.hpp"
#include "transport/log.hpp"
#include "transport/wait.hpp"

#include <atomic>
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

void table_retire(bool sandbox) noexcept {
    if (fallback::foreign_process()) return;
    // First: no upgrade starts while the sockets leave. Once is enough.
    if (!transport::set_retired(sandbox)) return;
    table_to_kernel_for_good(nullptr, -1, Reason::privilege);
    if (transport::Engine *e = transport::Engine::current()) e->forget_peers();
    transport::spin_table_detach();
}

namespace {

// Whether a process changes its ids afresh, from its sockets: true when
// one is or was connected and holds something of the fabric: its
// connection may be attached, published or direct, or one a parent's
// fork left (orphan, holders), or it waits to earn its upgrade. Served
// after the change, it would be another uid's than the one the kernel
// names as its owner (the uid that made it), where a peer of another user
// looks for it. A socket shared through fork (a share: counts in the
// sharers arena, and maybe the peer's bytes a leave left unread, in the
// fork tree's memory: nothing of the fabric) does not count, and sets
// *shares: its holder may upgrade it later as its new uid, and then asks
// the peer itself (ids_renewed). Nor does one on the kernel for good. So
// a pre-fork server's worker (the listener it inherited) and a
// privilege-separated server's child (the connection shared with the
// process that forked it, which retired or holds it idle) go on afresh.
bool table_holds_fabric(bool *shares) noexcept {
    const int end = fallback::table_size();
    bool holds = false;
    for (int fd = 0; fd < end && !holds; ++fd) {
        Stream *s = acquire(fd);
        if (!s) continue;
        constexpr auto acq = std::memory_order_acquire;
        const fallback::Phase p = s->phase.load(acq);
        const bool shared = s->share.load(acq) != nullptr;
        holds = s->conn.load(acq) || s->orphan.load(acq) || s->holders.load(acq) ||
                (!shared && !s->for_good.load(acq) && p != fallback::Phase::listener &&
                 p != fallback::Phase::fresh);
        if (shared) *shares = true;
        if (holds)
            SD_LOG(debug, "fd %d: a connection of this process (%s) keeps it from going on "
                          "afresh at its change of ids", fd,
                   s->conn.load(acq)       ? "attached"
                   : s->orphan.load(acq)   ? "direct in another process"
                   : s->holders.load(acq)  ? "direct at a fork"
                                           : "not attached yet");
        release(s);
    }
    return holds;
}

// The last change afresh was made holding shared sockets.
std::atomic<bool> changed_with_shares{false};

}  // namespace

bool ids_change_afresh() noexcept {
    // In a sandbox for good; a retirement by ids may end here (afresh.cpp).
    if (fallback::foreign_process() || transport::sandboxed()) return false;
    // The sockets first: an engine is given up only for a process that
    // goes on afresh (a retiring one marks its unattached connections in
    // the registry through it).
    bool shares = false;
    if (table_holds_fabric(&shares) || !transport::begin_afresh()) return false;
    changed_with_shares.store(shares, std::memory_order_relaxed);
    transport::drop_old_ids();
    return true;
}

void ids_changed() noexcept {
    uid_t ru, eu, su;
    gid_t rg, eg, sg;
    const bool settled = getresuid(&ru, &eu, &su) == 0 && getresgid(&rg, &eg, &sg) == 0 &&
                         ru == eu && eu == su && rg == eg && eg == sg;
    if (settled && changed_with_shares.load(std::memory_order_relaxed))
        transport::note_ids_renewed();
    transport::end_afresh(settled);
    // Ids mixed (a temporary seteuid): which uid's registry would be ours
    // is not clear, so the process uses none, as before this rule.
    if (!settled) table_retire(false);
}

}  // namespace sd::forking
