// What the provider libraries open inside the library's own calls into
// libfabric. libfabric's first fi_getinfo runs the set-up of every
// provider built into it, used or not, and the verbs provider's reads
// /proc/kallsyms twice, line by line, looking for the kernel's RDMA
// peer-memory and dma-buf symbols: about 120,000 lines each time, some
// 80 ms of every engine build on this kind of host (`SDIRECT_LOG=debug`
// prints the build's steps and their times). Those symbols matter only to
// register device (GPU) memory, which the library never registers, so
// within its own calls (transport::guarded(), the flag every call into
// libfabric and every engine build sets on its thread) that file reads as
// empty. Every other open, and every open the application makes, is
// libc's own.
//
// glibc's headers name fopen64 for fopen where _FILE_OFFSET_BITS is 64,
// so the two exported symbols are given their names with asm labels.
#include "shim.hpp"

#include <cstring>

using namespace sd::intercept;

namespace {

bool hidden_from_providers(const char *path) noexcept {
    return sd::transport::guarded() && path && std::strcmp(path, "/proc/kallsyms") == 0;
}

}  // namespace

extern "C" {

FILE *sd_fopen(const char *path, const char *mode) {
    return sys.fopen(hidden_from_providers(path) ? "/dev/null" : path, mode);
}

FILE *sd_fopen_symbol(const char *, const char *) __asm__("fopen")
    __attribute__((visibility("default"), alias("sd_fopen")));
FILE *sd_fopen64_symbol(const char *, const char *) __asm__("fopen64")
    __attribute__((visibility("default"), alias("sd_fopen")));

}  // extern "C"
