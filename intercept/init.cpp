// Library start. The constructor resolves libc, reads the settings and
// builds the socket table before main() runs; nothing else happens until
// the first TCP connection (the end is an atexit hook the engine build
// registers: transport/engine.cpp).
#include "fork_protocol/fork.hpp"
#include "shm_fallback/table.hpp"
#include "transport/protocol.hpp"
#include "transport/settings.hpp"
#include "transport/sys.hpp"

namespace sd::intercept {
void memhooks_check() noexcept;  // shim_mem.cpp
}

namespace {

__attribute__((constructor(101))) void sdirect_start() {
    sd::intercept::memhooks_check();
    sd::transport::resolve_sys();
    sd::transport::load_settings();
    sd::transport::load_protocols();
    sd::fallback::table_init();
    sd::forking::install();
}

}  // namespace
