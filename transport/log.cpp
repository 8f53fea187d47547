#include "log.hpp"

#include "sys.hpp"

#include <cstdarg>
#include <cstdio>
#include <fcntl.h>
#include <unistd.h>

namespace sd::transport {

namespace {

void emit(Level level, const char *head, const char *fmt, va_list ap) noexcept {
    static constexpr const char *names[] = {"", "error", "info", "debug"};
    char line[640];
    int n = std::snprintf(line, sizeof line, "sdirect[%d] %s: %s", int(getpid()),
                          names[int(level)], head);
    if (n > int(sizeof line) - 2) n = int(sizeof line) - 2;
    n += std::vsnprintf(line + n, sizeof line - std::size_t(n) - 1, fmt, ap);
    if (n > int(sizeof line) - 2) n = int(sizeof line) - 2;
    line[n++] = '\n';
    // Opened for each line: a descriptor kept open could be closed, or
    // taken over, by the application (close_range, dup2 onto it).
    const char *file = settings().log_file;
    int fd = file && *file ? open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600) : -1;
    // One write, so lines of concurrent processes do not interleave.
    (void)sys.write(fd >= 0 ? fd : 2, line, std::size_t(n));
    if (fd >= 0) sys.close(fd);
}

}  // namespace

void log_line(Level level, const char *fmt, ...) noexcept {
    va_list ap;
    va_start(ap, fmt);
    emit(level, "", fmt, ap);
    va_end(ap);
}

void log_conn(Level level, const ConnStat &s, const char *fmt, ...) noexcept {
    char head[160];
    int n = std::snprintf(head, sizeof head, "fd %d ", int(s.fd));
    if (n < 0 || n >= int(sizeof head)) n = 0;
    std::size_t k = std::size_t(n) + format_endpoints(head + n, sizeof head - std::size_t(n) - 2, s);
    head[k++] = ':';
    head[k++] = ' ';
    head[k] = '\0';
    va_list ap;
    va_start(ap, fmt);
    emit(level, head, fmt, ap);
    va_end(ap);
}

}  // namespace sd::transport
