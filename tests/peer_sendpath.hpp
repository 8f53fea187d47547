// Scenarios in which both ends play their own part (peer_sendpath.cpp):
// send()'s promises, checked by comparing what each end printed.
#pragma once
#include "peer_common.hpp"

#include <string>

namespace peer {

bool is_sendpath_scenario(const std::string &scenario);
// Runs this end's part on a connected, settled socket (*fd set to -1 if
// it closed it).
void serve_sendpath(int *fd, bool is_client, const Options &opt);

}  // namespace peer
