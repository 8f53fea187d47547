// Readiness marks (conn.hpp): a bit per epoll entry, in its set's group,
// that every change of the entry's connection sets; the first setting
// since the set last took its marks wakes the group's pollers (the sleeps
// on the set). The groups live in one table that is mapped at the first
// set and never unmapped: a change that reads a connection's mark just
// before its entry or set goes sets a bit nobody owns, or one a newer
// entry owns (a look too many, never one too few), and no sleep is left
// with a mask that went away.
#include "conn_impl.hpp"
#include "lock_order.hpp"
#include "renew.hpp"
#include "sys.hpp"
#include "wait.hpp"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <sys/mman.h>

namespace sd::transport {

namespace {

struct Bits {
    // Bit k: words[k] may have bits set.
    std::atomic<std::uint64_t> summary;
    std::atomic<std::uint64_t> words[kMarkSlots / 64];

    // Sets `slot`: true if it was not set.
    bool set(std::uint32_t slot) noexcept {
        const std::uint64_t bit = std::uint64_t(1) << (slot % 64);
        if (words[slot / 64].fetch_or(bit, std::memory_order_acq_rel) & bit) return false;
        summary.fetch_or(std::uint64_t(1) << (slot / 64), std::memory_order_acq_rel);
        return true;
    }
    void take(void (*fn)(void *ctx, std::uint32_t slot), void *ctx) noexcept {
        if (!summary.load(std::memory_order_acquire)) return;
        for (std::uint64_t s = summary.exchange(0, std::memory_order_acq_rel); s; s &= s - 1) {
            const unsigned k = unsigned(__builtin_ctzll(s));
            for (std::uint64_t w = words[k].exchange(0, std::memory_order_acq_rel); w; w &= w - 1)
                fn(ctx, k * 64 + unsigned(__builtin_ctzll(w)));
        }
    }
    void clear() noexcept {
        summary.store(0, std::memory_order_relaxed);
        for (auto &w : words) w.store(0, std::memory_order_relaxed);
    }
};

// `woken`: the marks whose first setting wakes the pollers; `quiet`: those
// set by changes that wake nobody (mark_touched).
struct Group {
    Bits woken, quiet;
    PollerMask pollers;
};

// Groups from 1; group 0 stands for "none left": its sets' entries have
// no marks, and its sleeps share one mask.
constexpr std::uint32_t kGroups = 2048;

struct MarkTable {
    Group groups[kGroups];
    // The freed groups, each naming the one freed before it (0: the end).
    std::uint32_t next_free[kGroups];
};

std::atomic<MarkTable *> table{nullptr};
// A leaf: taken under an epoll set's lock, around nothing but the list.
RankedMutex<Rank::leaf> groups_lock;
std::uint32_t next_group = 1;  // never given yet from here
std::uint32_t freed_group = 0;  // the last freed (reused first)

// The table, mapped at the first call (groups_lock held); null if it
// cannot be.
MarkTable *table_locked() noexcept {
    if (MarkTable *t = table.load(std::memory_order_relaxed)) return t;
    void *mem = mmap(nullptr, sizeof(MarkTable), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) return nullptr;
    auto *t = static_cast<MarkTable *>(mem);  // zeros: every atomic as new
    table.store(t, std::memory_order_release);
    return t;
}

constexpr std::uint32_t group_of(std::uint32_t m) noexcept { return (m - 1) / kMarkSlots; }
constexpr std::uint32_t slot_of(std::uint32_t m) noexcept { return (m - 1) % kMarkSlots; }

}  // namespace

std::uint32_t group_alloc() noexcept {
    std::lock_guard lock(groups_lock);
    MarkTable *t = table_locked();
    if (!t) return 0;
    std::uint32_t g = freed_group;
    if (g) freed_group = t->next_free[g];
    else if (next_group < kGroups) g = next_group++;
    else return 0;
    // What an earlier set's connections set last: nothing of this one's.
    t->groups[g].woken.clear();
    t->groups[g].quiet.clear();
    return g;
}

void group_free(std::uint32_t g) noexcept {
    if (!g) return;
    std::lock_guard lock(groups_lock);
    MarkTable *t = table.load(std::memory_order_relaxed);
    t->next_free[g] = freed_group;
    freed_group = g;
}

PollerMask &group_pollers(std::uint32_t g) noexcept {
    static PollerMask none;  // no table: the sets' sleeps share this mask
    MarkTable *t = table.load(std::memory_order_acquire);
    return t ? t->groups[g].pollers : none;
}

std::uint32_t mark_of(std::uint32_t g, std::uint32_t slot) noexcept {
    return g && slot < kMarkSlots ? g * kMarkSlots + slot + 1 : 0;
}

bool mark_link(Conn *c, std::uint32_t m) noexcept {
    // Linked since an earlier look: every change since sets it.
    std::uint32_t cur = c->ready_mark.load(std::memory_order_relaxed);
    if (cur == m) return true;
    if (cur || !c->ready_mark.compare_exchange_strong(cur, m, std::memory_order_seq_cst))
        return false;
    // Linked before the caller reads the connection's state: a change
    // after this sets the mark (mark_changed reads the link after its
    // change), one before it is in what the caller reads.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return true;
}

void mark_unlink(Conn *c, std::uint32_t m) noexcept {
    c->ready_mark.compare_exchange_strong(m, 0, std::memory_order_acq_rel);
}

void marks_take(std::uint32_t g, void (*fn)(void *ctx, std::uint32_t slot), void *ctx) noexcept {
    MarkTable *t = table.load(std::memory_order_acquire);
    if (!g || !t) return;
    t->groups[g].woken.take(fn, ctx);
    t->groups[g].quiet.take(fn, ctx);
}

// The group of the mark linked to `c`, and its slot; null if none.
Group *marked(Conn *c, std::uint32_t &slot) noexcept {
    // No epoll set was ever made in this process, so nothing is linked:
    // a blocking socket's calls and deliveries pay no fence for marks.
    // (The table is mapped when the first set is made, long before an
    // entry of it links a mark.)
    if (!table.load(std::memory_order_relaxed)) return nullptr;
    // The change the caller made, before the link is read (mark_link).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const std::uint32_t m = c->ready_mark.load(std::memory_order_relaxed);
    if (!m) return nullptr;
    slot = slot_of(m);
    return &table.load(std::memory_order_acquire)->groups[group_of(m)];
}

void mark_changed(Conn *c, std::uint64_t skip) noexcept {
    std::uint32_t slot;
    Group *g = marked(c, slot);
    // Set already: its setter wakes the sleeps once the summary says so,
    // and no look has taken it since, so none of them went back to sleep
    // without it.
    if (g && g->woken.set(slot)) wake_pollers(g->pollers, skip);
}

void mark_touched(Conn *c) noexcept {
    std::uint32_t slot;
    if (Group *g = marked(c, slot)) g->quiet.set(slot);
}

SD_CHILD_PATH void marks_after_fork_child() noexcept { renew(groups_lock); }

}  // namespace sd::transport
