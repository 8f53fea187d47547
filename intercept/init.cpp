// Library start. The constructor resolves libc (the one table of real
// functions, transport/sys.hpp), checks the memory hooks, reads the
// settings, sets the provider libraries' variables and builds the socket
// table before main() runs; nothing else happens until the first TCP connection (the
// end is an atexit hook the engine build registers:
// transport/engine_setup.cpp).
#include <cerrno>

#include "fork_protocol/fork.hpp"
#include "fork_protocol/handover.hpp"
#include "shm_fallback/readiness.hpp"
#include "shm_fallback/table.hpp"
#include "transport/fabric.hpp"
#include "transport/protocol.hpp"
#include "transport/rules.hpp"
#include "transport/settings.hpp"
#include "transport/sys.hpp"

namespace sd::intercept {
void memhooks_check() noexcept;    // shim_mem.cpp
void std_streams_init() noexcept;  // shim_stdio.cpp
}

namespace {

// Priority 101: before every other constructor of the library
// (shim_spawn.cpp's, 102, and C++ static initialisers), so that the real libc
// functions are there before anything of ours may call them.
__attribute__((constructor(101))) void sdirect_start() {
    // The program's main starts with the errno it would have without us
    // (our probes of fds 0-2, settings files and so on leave theirs).
    const int saved_errno = errno;
    sd::transport::resolve_sys();
    sd::intercept::memhooks_check();
    sd::transport::load_settings();
    // Here, while the process has one thread: the engine is built on a
    // thread of its own, and a setenv() there raced the application's
    // threads reading the environment.
    if (sd::transport::settings().enable) sd::transport::fabric_pin_environment();
    sd::transport::load_protocols();
    sd::transport::load_rules();
    // SDIRECT_ENABLE=0: no socket table, so no fd is ever a stream of
    // ours (nor an epoll set: their table is sized by it) and every call
    // goes to libc as it came, at the cost of the look-up that finds
    // nothing.
    sd::fallback::table_init(sd::transport::settings().enable);
    sd::fallback::epoll_init();
    sd::forking::inherit_init();
    sd::forking::install();
    if (sd::transport::settings().enable) sd::intercept::std_streams_init();
    errno = saved_errno;
}

}  // namespace
