// The library's one clock: CLOCK_MONOTONIC in nanoseconds (the vDSO's,
// no system call). Deadlines, spins, naps and the timing in the log all
// read it.
#pragma once
#include <cerrno>
#include <cstdint>
#include <ctime>

namespace sd::transport {

inline std::uint64_t monotonic_ns() noexcept {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return std::uint64_t(ts.tv_sec) * 1000000000ull + std::uint64_t(ts.tv_nsec);
}

// The tests' pauses (SDIRECT_*_PAUSE_US): the whole pause, signals or not.
inline void pause_us(std::uint32_t us) noexcept {
    timespec ts{time_t(us / 1000000), long(us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

}  // namespace sd::transport
