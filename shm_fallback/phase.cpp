// A socket's moves between phases (phase.hpp): the one place the phase
// changes, checked against the table in debug and sanitizer builds.
#include "stream.hpp"

#include "transport/sys.hpp"

namespace sd::fallback {

namespace {

constexpr const char *kWhat = "a socket's phase";

}  // namespace

SD_CHILD_PATH bool Stream::move(Phase from, Phase to) noexcept {
    return transport::move_word(phase, kPhaseMoves, kPhaseNames, kWhat, from, to);
}

SD_CHILD_PATH void Stream::move_to(Phase to) noexcept {
    transport::move_word_to(phase, to, [this](Phase from, Phase p) { return move(from, p); });
}

void Stream::reset_to(Phase to) noexcept {
#ifdef SDIRECT_LOCK_CHECK
    if (!phase_reset_allowed(to)) transport::move_refused(kWhat, "any phase", phase_name(to));
#endif
    phase.store(to);
}

}  // namespace sd::fallback
