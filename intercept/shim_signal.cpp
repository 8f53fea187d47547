// Signal dispositions: the library's handler for SIGTERM, SIGINT and SIGHUP
// (where the application left SIG_DFL) writes the counters before the
// process dies; the application sees SIG_DFL there, and any disposition it
// sets replaces ours (transport/exitstats.cpp).
#include "shim.hpp"

#include "transport/exitstats.hpp"

using namespace sd::intercept;
namespace tp = sd::transport;

namespace {
sighandler_t set_handler(int sig, sighandler_t h, int flags) noexcept {
    sighandler_t old = SIG_ERR;
    const int rc = tp::app_signal(sig, h, flags, &old);
    if (rc < 0) {
        errno = -rc;
        return SIG_ERR;
    }
    return old;
}
}  // namespace

SD_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old) noexcept {
    return ret(tp::app_sigaction(sig, act, old));
}
SD_EXPORT sighandler_t signal(int sig, sighandler_t h) noexcept {
    return set_handler(sig, h, SA_RESTART);
}
SD_EXPORT sighandler_t bsd_signal(int sig, sighandler_t h) noexcept {
    return set_handler(sig, h, SA_RESTART);
}
SD_EXPORT sighandler_t sysv_signal(int sig, sighandler_t h) noexcept {
    return set_handler(sig, h, SA_RESETHAND | SA_NODEFER);
}
SD_EXPORT sighandler_t sigset(int sig, sighandler_t h) noexcept {
    tp::drop_exit_handler(sig);
    return sys.sigset(sig, h);
}
