// A connection shut down before it upgrades (peer_shut_upgrade.cpp).
#pragma once
#include "peer_common.hpp"

#include <string>

namespace peer {

bool is_shut_upgrade_scenario(const std::string &scenario);
// Runs this end's part on a connected socket that nothing has touched
// yet: no hello, no settle (they would start the upgrade first). *fd is
// -1 once this end closed it.
void serve_shut_upgrade(int *fd, bool is_client, const Options &opt);

}  // namespace peer
