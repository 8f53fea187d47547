// A socket's moves between phases (phase.hpp): the one place the phase
// changes, checked against the table in debug and sanitizer builds.
#include "stream.hpp"

namespace sd::fallback {

#ifdef SDIRECT_LOCK_CHECK
namespace {

[[noreturn]] void violation(const char *from, Phase to) noexcept {
    transport::move_refused("a socket's phase", from, phase_name(to));
}

}  // namespace
#endif

bool Stream::move(Phase from, Phase to) noexcept {
#ifdef SDIRECT_LOCK_CHECK
    if (!phase_move_allowed(from, to)) violation(phase_name(from), to);
#endif
    return phase.compare_exchange_strong(from, to);
}

void Stream::move_to(Phase to) noexcept {
    Phase p = phase.load(std::memory_order_acquire);
    while (p != to && !move(p, to)) p = phase.load(std::memory_order_acquire);
}

void Stream::reset_to(Phase to) noexcept {
#ifdef SDIRECT_LOCK_CHECK
    if (!phase_reset_allowed(to)) violation("any phase", to);
#endif
    phase.store(to);
}

}  // namespace sd::fallback
