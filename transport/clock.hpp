// The library's one clock: CLOCK_MONOTONIC in nanoseconds (the vDSO's,
// no system call). Deadlines, spins, naps and the timing in the log all
// read it.
#pragma once
#include <cstdint>
#include <ctime>

namespace sd::transport {

inline std::uint64_t monotonic_ns() noexcept {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return std::uint64_t(ts.tv_sec) * 1000000000ull + std::uint64_t(ts.tv_nsec);
}

}  // namespace sd::transport
