// The lock order (transport/lock_order.hpp): what a thread holds is known,
// and a checked build stops a blocking acquisition out of order and a
// try_lock of a lock the thread holds.
#include <catch2/catch.hpp>

#include "unit_child.hpp"

#include "transport/lock_order.hpp"

#include <csignal>
#include <mutex>
#include <sys/wait.h>
#include <unistd.h>

using namespace sd::transport;

TEST_CASE("a thread knows which ranked locks it holds", "[lock-order]") {
    // The ranks whose holders the library asks about are recorded in every
    // build; the rest only where the order is checked.
    STATIC_REQUIRE((lock_order::recorded(Rank::flush) && lock_order::recorded(Rank::table) &&
                    lock_order::recorded(Rank::tx) && lock_order::recorded(Rank::progress) &&
                    lock_order::recorded(Rank::rx)));
    CHECK(lock_order::recorded(Rank::leaf) == lock_order::checked());
    RankedMutex<Rank::table> table;
    RankedMutex<Rank::tx> tx;
    CHECK_FALSE(table.held());
    {
        std::lock_guard a(table);
        std::lock_guard b(tx);
        CHECK(table.held());
        CHECK(tx.held());
        CHECK(lock_order::holds_rank(Rank::table));
        CHECK_FALSE(lock_order::holds_rank(Rank::rx));
    }
    CHECK_FALSE(table.held());
    CHECK_FALSE(lock_order::holds_rank(Rank::tx));
    // Released out of order, as a unique_lock may.
    std::unique_lock a(table);
    std::unique_lock b(tx);
    a.unlock();
    CHECK_FALSE(table.held());
    CHECK(tx.held());
}

TEST_CASE("the documented order passes; blocking against it or re-taking a held lock aborts "
          "a checked build",
          "[lock-order]") {
    const int in_order = in_child([] {
        RankedMutex<Rank::control> busy;
        RankedMutex<Rank::pend> pend;
        RankedMutex<Rank::flush> f;
        RankedMutex<Rank::table> t;
        RankedMutex<Rank::tx> x;
        RankedMutex<Rank::progress> p;
        RankedMutex<Rank::rx> r;
        std::lock_guard y(busy);
        std::lock_guard z(pend);
        std::lock_guard a(f);
        std::lock_guard b(t);
        std::lock_guard c(x);
        std::lock_guard d(p);
        std::lock_guard e(r);
        // try_lock may go against the order: it cannot wait.
        RankedMutex<Rank::table> other;
        if (other.try_lock()) other.unlock();
    });
    CHECK((WIFEXITED(in_order) && WEXITSTATUS(in_order) == 0));
    if (!lock_order::checked()) {
        WARN("SKIPPED: this build does not check the lock order (release)");
        return;
    }
    const int against = in_child([] {
        RankedMutex<Rank::table> t;
        RankedMutex<Rank::rx> r;
        std::lock_guard a(r);
        std::lock_guard b(t);
    });
    CHECK((WIFSIGNALED(against) && WTERMSIG(against) == SIGABRT));
    const int again = in_child([] {
        RankedMutex<Rank::tx> x;
        std::lock_guard a(x);
        (void)x.try_lock();
    });
    CHECK((WIFSIGNALED(again) && WTERMSIG(again) == SIGABRT));
}

TEST_CASE("a socket's pend_lock ranks below the engine's locks and above the control thread's "
          "turn: taken under a send lock, or the turn under it, aborts a checked build",
          "[lock-order]") {
    // A send that rejoins takes pend_lock first, then tx_lock; a fork's
    // prepare step marks the streams shared with the control thread parked.
    const int in_order = in_child([] {
        RankedMutex<Rank::control> busy;
        RankedMutex<Rank::pend> pend;
        RankedMutex<Rank::table> table;
        RankedMutex<Rank::tx> tx;
        std::lock_guard a(busy);
        std::lock_guard b(pend);
        // Recorded where the order is checked (a release build records
        // only the ranks code asks about).
        if (lock_order::recorded(Rank::control) &&
            (!lock_order::holds_rank(Rank::control) || !lock_order::holds_rank(Rank::pend)))
            _exit(1);
        std::lock_guard c(table);
        std::lock_guard d(tx);
    });
    CHECK((WIFEXITED(in_order) && WEXITSTATUS(in_order) == 0));
    // The parked turn that a fork child keeps taken for good is no longer
    // counted as held there.
    {
        RankedMutex<Rank::control> busy;
        busy.lock();
        busy.forget_held();
        CHECK_FALSE(lock_order::holds_rank(Rank::control));
        busy.unlock();  // not counted, so nothing to drop from the list
    }
    if (!lock_order::checked()) {
        WARN("SKIPPED: this build does not check the lock order (release)");
        return;
    }
    const int pend_under_tx = in_child([] {
        RankedMutex<Rank::pend> pend;
        RankedMutex<Rank::tx> tx;
        std::lock_guard a(tx);
        std::lock_guard b(pend);
    });
    CHECK((WIFSIGNALED(pend_under_tx) && WTERMSIG(pend_under_tx) == SIGABRT));
    const int pend_under_table = in_child([] {
        RankedMutex<Rank::pend> pend;
        RankedMutex<Rank::table> table;
        std::lock_guard a(table);
        std::lock_guard b(pend);
    });
    CHECK((WIFSIGNALED(pend_under_table) && WTERMSIG(pend_under_table) == SIGABRT));
    const int busy_under_pend = in_child([] {
        RankedMutex<Rank::control> busy;
        RankedMutex<Rank::pend> pend;
        std::lock_guard a(pend);
        std::lock_guard b(busy);
    });
    CHECK((WIFSIGNALED(busy_under_pend) && WTERMSIG(busy_under_pend) == SIGABRT));
}

TEST_CASE("shm_fallback's locks: the spawn record first, epoll sets nested under their "
          "containers, leaves innermost and alone",
          "[lock-order]") {
    // A fork with the spawn record held: the prepare step's locks under
    // it, the pool last. An epoll set's readiness under nested sets' locks.
    const int in_order = in_child([] {
        RankedMutex<Rank::spawn> record;
        RankedMutex<Rank::control> busy;
        RankedMutex<Rank::pend> pend;
        RankedMutex<Rank::leaf> pool;
        std::lock_guard a(record);
        if (busy.try_lock()) busy.unlock();
        std::lock_guard b(pend);
        std::lock_guard c(pool);
    });
    CHECK((WIFEXITED(in_order) && WEXITSTATUS(in_order) == 0));
    const int nested_sets = in_child([] {
        RankedMutex<Rank::epoll> outer, middle, inner;
        RankedMutex<Rank::pend> pend;
        RankedMutex<Rank::rx> rx;
        RankedMutex<Rank::leaf> pool;
        std::lock_guard a(outer);
        std::lock_guard b(middle);
        std::lock_guard c(inner);
        std::lock_guard d(pend);
        std::lock_guard e(rx);
        std::lock_guard f(pool);
    });
    CHECK((WIFEXITED(nested_sets) && WEXITSTATUS(nested_sets) == 0));
    if (!lock_order::checked()) {
        WARN("SKIPPED: this build does not check the lock order (release)");
        return;
    }
    const int leaf_under_leaf = in_child([] {
        RankedMutex<Rank::leaf> aliases, pool;
        std::lock_guard a(aliases);
        std::lock_guard b(pool);
    });
    CHECK((WIFSIGNALED(leaf_under_leaf) && WTERMSIG(leaf_under_leaf) == SIGABRT));
    const int ranked_under_leaf = in_child([] {
        RankedMutex<Rank::leaf> sleeps;
        RankedMutex<Rank::rx> rx;
        std::lock_guard a(sleeps);
        std::lock_guard b(rx);
    });
    CHECK((WIFSIGNALED(ranked_under_leaf) && WTERMSIG(ranked_under_leaf) == SIGABRT));
    const int set_under_pend = in_child([] {
        RankedMutex<Rank::epoll> set;
        RankedMutex<Rank::pend> pend;
        std::lock_guard a(pend);
        std::lock_guard b(set);
    });
    CHECK((WIFSIGNALED(set_under_pend) && WTERMSIG(set_under_pend) == SIGABRT));
    const int record_under_busy = in_child([] {
        RankedMutex<Rank::spawn> record;
        RankedMutex<Rank::control> busy;
        std::lock_guard a(busy);
        std::lock_guard b(record);
    });
    CHECK((WIFSIGNALED(record_under_busy) && WTERMSIG(record_under_busy) == SIGABRT));
}
