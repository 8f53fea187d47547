// One line per significant event on stderr, level from SDIRECT_LOG.
#pragma once
#include "settings.hpp"

namespace sd::transport {

enum class Level : int { error = 1, info = 2, debug = 3 };

void log_line(Level level, const char *fmt, ...) noexcept
    __attribute__((format(printf, 2, 3)));

}  // namespace sd::transport

#define SD_LOG(level, ...)                                                        \
    do {                                                                          \
        if (::sd::transport::settings().log >= int(::sd::transport::Level::level)) \
            ::sd::transport::log_line(::sd::transport::Level::level, __VA_ARGS__); \
    } while (0)
