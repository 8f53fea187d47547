// A socket's moves between phases (phase.hpp): the one place the phase
// changes, checked against the table in debug and sanitizer builds.
#include "stream.hpp"

#include <cstdio>
#include <cstdlib>

namespace sd::fallback {

const char *phase_name(Phase p) noexcept {
    switch (p) {
    case Phase::fresh: return "fresh";
    case Phase::connecting: return "connecting";
    case Phase::deferred: return "deferred";
    case Phase::attaching: return "attaching";
    case Phase::attached: return "attached";
    case Phase::listener: return "listener";
    }
    return "?";
}

namespace {

#ifdef SDIRECT_LOCK_CHECK
[[noreturn]] void violation(const char *from, Phase to) noexcept {
    std::fprintf(stderr, "sdirect: a socket's phase moved from %s to %s, which its table "
                         "does not allow\n", from, phase_name(to));
    std::abort();
}
#endif

}  // namespace

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
