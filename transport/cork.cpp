// Bytes held back by MSG_MORE or TCP_CORK go out within kCorkHoldNs even
// if the application writes nothing more (TCP sends a corked partial
// segment after 200 ms). The deadline is the flush pass's: any progress()
// after it sends the stage; the control thread sleeps until the earliest
// deadline, so that an application that only waits (outside the library,
// or in a read on another connection) is covered too. Nothing runs while
// no stage is held.
#include "engine.hpp"
#include "sys.hpp"
#include "wait.hpp"

#include <cstdint>

namespace sd::transport {

void Engine::hold_corked(Conn *c) noexcept {
    const std::uint64_t due = monotonic_ns() + kCorkHoldNs;
    c->cork_since.store(due - kCorkHoldNs, std::memory_order_release);
    want_flush(c);
    // An earlier deadline than the control thread sleeps for: wake it.
    std::uint64_t cur = cork_due_.load(std::memory_order_acquire);
    while ((cur == 0 || due < cur) &&
           !cork_due_.compare_exchange_weak(cur, due, std::memory_order_acq_rel)) {
    }
    if ((cur == 0 || due < cur) && cork_bell_ >= 0) {
        const std::uint64_t one = 1;
        (void)sys.write(cork_bell_, &one, sizeof one);
    }
}

int Engine::cork_tick() noexcept {
    std::uint64_t due = cork_due_.load(std::memory_order_acquire);
    if (!due) return -1;
    std::uint64_t now = monotonic_ns();
    if (now < due) return int((due - now + 999999) / 1000000);
    // Due: one flush pass, then the next deadline among the stages still
    // held (a stage whose lock was busy is looked at again soon).
    cork_due_.store(0, std::memory_order_release);
    flush_due_stages();
    std::uint64_t next = 0;
    for (std::uint32_t id = 0; id < kSlots; ++id) {
        Conn *c = conns_[id].load(std::memory_order_acquire);
        if (!c || !c->flush_due.load(std::memory_order_acquire)) continue;
        const std::uint64_t since = c->cork_since.load(std::memory_order_acquire);
        // Short of credits: their arrival sends it, not a timer.
        if (!since || c->credits.load(std::memory_order_acquire) < std::int64_t(c->staged))
            continue;
        const std::uint64_t at = since + kCorkHoldNs;
        if (!next || at < next) next = at;
    }
    if (!next) return -1;
    now = monotonic_ns();
    if (next <= now) next = now + 10'000'000;  // busy: again in 10 ms
    std::uint64_t cur = 0;
    if (!cork_due_.compare_exchange_strong(cur, next, std::memory_order_acq_rel) && cur < next)
        next = cur;  // a newer, earlier one
    return int((next - now + 999999) / 1000000);
}

}  // namespace sd::transport
