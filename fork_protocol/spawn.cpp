#include "spawn.hpp"

#include "transport/lock_order.hpp"
#include "transport/renew.hpp"
#include "transport/sys.hpp"

#include <mutex>
#include <pthread.h>

namespace sd::forking {
namespace {

using fallback::SpawnAction;
using Actions = posix_spawn_file_actions_t;

// The actions added to each list, in order, in one table for all lists
// (programs build a few short lists). An action that finds the table full
// is not kept: its list then has fewer actions here than in glibc's count.
struct Recorded {
    const Actions *list;
    SpawnAction action;
};
constexpr int kRecorded = 512;
Recorded recorded[kRecorded];
int nrecorded = 0;
// The first of the lock order (transport/lock_order.hpp): held over the
// fork protocol's prepare step, which takes the locks after it.
transport::RankedMutex<transport::Rank::spawn> record_lock;

// A fork child must not find the table locked by a thread it lacks. A
// process of one thread has no other thread to keep out: the lock is not
// taken, and the handlers write nothing after the fork (each page written
// then is copied while parent and child both map it).
// Registered after the fork protocol's handlers (init.cpp's constructor,
// priority 101): this prepare handler runs before theirs, this child
// handler after theirs.
bool locked_for_fork = false;

void record_lock_prepare() {
    // Written only when it changes: the page stays as the last fork left
    // it.
    transport::renew(locked_for_fork, !transport::one_thread());
    if (locked_for_fork) record_lock.lock();
}

void record_lock_parent() {
    if (locked_for_fork) record_lock.unlock();
}

SD_CHILD_PATH void record_lock_child() {
    if (locked_for_fork) record_lock.unlock();
}

__attribute__((constructor(102))) void spawn_init() {
    pthread_atfork(record_lock_prepare, record_lock_parent, record_lock_child);
}

}  // namespace

void spawn_actions_forget(const Actions *list) noexcept {
    std::lock_guard lock(record_lock);
    int to = 0;
    for (int i = 0; i < nrecorded; ++i)
        if (recorded[i].list != list) recorded[to++] = recorded[i];
    nrecorded = to;
}

int spawn_actions_add(Actions *list, int rc, SpawnAction action) noexcept {
    if (rc != 0) return rc;
    std::lock_guard lock(record_lock);
    if (nrecorded < kRecorded) recorded[nrecorded++] = {list, action};
    return rc;
}

void before_spawn(const Actions *list) noexcept {
    if (transport::guarded()) return;
    SpawnAction actions[kRecorded];
    int n = 0;
    if (list) {
        std::lock_guard lock(record_lock);
        for (int i = 0; i < nrecorded; ++i)
            if (recorded[i].list == list) actions[n++] = recorded[i].action;
        if (n != list->__used) n = -1;  // one we did not see: not known
    }
    fallback::table_before_spawn(actions, n);
}

void before_system() noexcept {
    if (!transport::guarded()) fallback::table_before_spawn(nullptr, 0);
}

void before_popen(const char *type) noexcept {
    if (transport::guarded()) return;
    const bool known = type && (type[0] == 'r' || type[0] == 'w');
    const SpawnAction pipe{SpawnAction::Kind::replace, type && type[0] == 'r' ? 1 : 0, -1};
    fallback::table_before_spawn(&pipe, known ? 1 : 0);
}

}  // namespace sd::forking
