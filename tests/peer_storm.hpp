// Scenarios in which both ends do the same under an interval-timer signal
// storm (peer_storm.cpp).
#pragma once
#include "peer_common.hpp"

#include <string>

namespace peer {

bool is_storm_scenario(const std::string &scenario);
// Runs this end's part on a connected, settled socket.
void serve_storm(int fd, bool is_client, const Options &opt);

}  // namespace peer
