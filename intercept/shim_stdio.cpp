// fdopen: a stdio stream over a socket reads and writes through glibc's
// internal calls, which no interposer sees. The socket goes back to the
// kernel for good before the stream exists (reason stdio), so its bytes and
// ours travel the same way. A dup of it is the same socket, and follows.
#include "shim.hpp"

#include <cstdio>
#include <dlfcn.h>

using namespace sd::intercept;

namespace {

FILE *(*real_fdopen)(int, const char *) = nullptr;

__attribute__((constructor(102))) void resolve_stdio() {
    real_fdopen = reinterpret_cast<FILE *(*)(int, const char *)>(dlsym(RTLD_NEXT, "fdopen"));
}

FILE *open_stream(int fd, const char *mode) noexcept {
    if (!table_frozen()) {
        Held s(fd);
        if (s) s->to_kernel_for_good(sd::transport::Reason::stdio);
    }
    if (!real_fdopen) {
        errno = ENOSYS;
        return nullptr;
    }
    return real_fdopen(fd, mode);
}

}  // namespace

SD_EXPORT FILE *fdopen(int fd, const char *mode) noexcept { return open_stream(fd, mode); }

SD_EXPORT FILE *_IO_fdopen(int fd, const char *mode) noexcept { return open_stream(fd, mode); }
