// One line per significant event, level from SDIRECT_LOG, on stderr or
// appended to SDIRECT_LOG_FILE.
#pragma once
#include "procpage.hpp"
#include "settings.hpp"

namespace sd::transport {

enum class Level : int { error = 1, info = 2, debug = 3 };

void log_line(Level level, const char *fmt, ...) noexcept
    __attribute__((format(printf, 2, 3)));
// The same, about one connection: "fd 5 127.0.0.1:40112 > 127.0.0.1:5201: "
// (ours > the peer's) comes first, so every line about it can be found.
void log_conn(Level level, const ConnStat &s, const char *fmt, ...) noexcept
    __attribute__((format(printf, 3, 4)));

}  // namespace sd::transport

#define SD_LOG(level, ...)                                                        \
    do {                                                                          \
        if (::sd::transport::settings().log >= int(::sd::transport::Level::level)) \
            ::sd::transport::log_line(::sd::transport::Level::level, __VA_ARGS__); \
    } while (0)

#define SD_LOG_CONN(level, stat, ...)                                                  \
    do {                                                                               \
        if (::sd::transport::settings().log >= int(::sd::transport::Level::level))      \
            ::sd::transport::log_conn(::sd::transport::Level::level, stat, __VA_ARGS__); \
    } while (0)
