// Small-message ping-pong shared by driver and responder. Messages go
// through fixed-size stack buffers, so a -D_FORTIFY_SOURCE build calls the
// __read_chk / __recv_chk / __recvfrom_chk variants of the receive calls.
#pragma once
#include <cstdint>

namespace peer {

inline constexpr std::uint32_t kPingMax = 4096;

// Round k: the driver sends 1 + mix(seed, k) % max_msg bytes of stream
// `seed`, the responder answers the same length of stream `seed + 1`.
void pingpong(int fd, bool driver, std::uint64_t seed, std::uint64_t rounds,
              std::uint32_t max_msg);

}  // namespace peer
