// Write zero-copy's rules that need no fabric (sink.cpp uses them; the
// unit tests check them).
#pragma once
#include "conn_impl.hpp"

#include <algorithm>
#include <cstdint>
#include <rdma/fabric.h>

namespace sd::transport {

// A registered sink at stream offset `sink_off` may be written only when
// it is the sender's next byte (`tx_off`), nothing is staged, and no
// stream message of the sender went out at or past it (`mark`, the offset
// of its last one, kNoOffset if none): the receiver reads such a message,
// arriving after its advertisement, as the sink's end, without asking.
constexpr bool rma_sink_takeable(std::uint64_t sink_off, std::uint64_t tx_off, bool staged,
                                 std::uint64_t mark) noexcept {
    return sink_off == tx_off && !staged && (mark == kNoOffset || mark < sink_off);
}

// Bytes of a `want`-byte sink that may be registered while `held` bytes
// are registered for sinks: half the soft RLIMIT_MEMLOCK (`limit`,
// kNoOffset when unlimited) is theirs, the registration cache has the
// other half. 0: no sink.
constexpr std::uint64_t sink_budget_fit(std::uint64_t want, std::uint64_t held,
                                        std::uint64_t limit) noexcept {
    if (limit == kNoOffset) return want;
    const std::uint64_t budget = limit / 2;
    return held >= budget ? 0 : std::min(want, budget - held);
}

// The flags of an RMA write into a sink whose completion, once read, lets
// sink_done follow: none where the endpoint orders sends after writes
// (FI_ORDER_SAW, both directions: the receiver processes our sink_done
// after the write), FI_DELIVERY_COMPLETE otherwise (fi_cq(3): its
// completion means the write's data is available at the target).
std::uint64_t sink_write_flags(const fi_info *info) noexcept;

}  // namespace sd::transport
