// fdopen: a stdio stream over a socket reads and writes through glibc's
// internal calls, which no interposer sees. The socket goes back to the
// kernel for good before the stream exists (reason stdio), so its bytes and
// ours travel the same way. A dup of it is the same socket, and follows.
#include "shim.hpp"

#include <cstdio>

using namespace sd::intercept;

namespace {

FILE *open_stream(int fd, const char *mode) noexcept {
    if (!table_frozen()) {
        Held s(fd);
        if (s) s->to_kernel_for_good(sd::transport::Reason::stdio);
    }
    return sys.fdopen(fd, mode);
}

}  // namespace

SD_EXPORT FILE *fdopen(int fd, const char *mode) noexcept { return open_stream(fd, mode); }

SD_EXPORT FILE *_IO_fdopen(int fd, const char *mode) noexcept { return open_stream(fd, mode); }
