#include "log.hpp"

#include "sys.hpp"

#include <cstdarg>
#include <cstdio>
#include <unistd.h>

namespace sd::transport {

void log_line(Level level, const char *fmt, ...) noexcept {
    static constexpr const char *names[] = {"", "error", "info", "debug"};
    char line[512];
    int n = std::snprintf(line, sizeof line, "sdirect[%d] %s: ", int(getpid()),
                          names[int(level)]);
    va_list ap;
    va_start(ap, fmt);
    n += std::vsnprintf(line + n, sizeof line - std::size_t(n) - 1, fmt, ap);
    va_end(ap);
    if (n > int(sizeof line) - 2) n = int(sizeof line) - 2;
    line[n++] = '\n';
    // One write, so lines of concurrent processes do not interleave.
    (void)sys.write(2, line, std::size_t(n));
}

}  // namespace sd::transport
