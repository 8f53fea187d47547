// The memory hooks of the registration cache (transport/regcache.hpp):
// free, realloc, munmap, mremap, madvise, mmap over a mapped range, brk,
// sbrk and shmdt drop the registrations of the memory they release or
// replace before it goes. Each forwards to the next definition (the
// application's allocator, or libc), as the real-libc table holds it
// (transport/sys.hpp). With the cache empty (always, on one host:
// process_vm_readv needs no registration) a hook costs one load.
//
// They work only if they are the process's: a program that defines free
// itself, or a sanitizer preloaded first, comes before us, and then the
// cache stays off (memhooks_check). ThreadSanitizer's runtime, preloaded
// after us (tests/meson.build), frees through our hooks where no
// instrumented code may run yet (while it starts, and in each new thread
// before the thread's state exists): the hooks are not instrumented, and
// in such a process they only forward (the cache stays off too).
#undef _FILE_OFFSET_BITS
#include "transport/regcache.hpp"
#include "transport/sys.hpp"

#include <cstdarg>
#include <cstdint>
#include <dlfcn.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <unistd.h>

using sd::transport::regcache;
using sd::transport::sys;

namespace {

// The hooks and what they touch before they look at the cache are not
// instrumented (SD_UNINSTRUMENTED): plain variables with __atomic
// builtins (std::atomic's members are functions of their own,
// instrumented).

// Set by our constructor when the hooks are the process's and no
// sanitizer runtime frees through them: the cache may be looked at.
bool armed = false;

SD_UNINSTRUMENTED inline bool is_armed() noexcept {
    return __atomic_load_n(&armed, __ATOMIC_RELAXED);
}

// The next definition (transport/sys.hpp: until the table is resolved, a
// slot that resolves it, or falls back on the resolving thread). Read
// whole: resolve_sys() may be setting it on another thread.
template <typename F>
SD_UNINSTRUMENTED inline F next(F &slot) noexcept {
    return __atomic_load_n(&slot, __ATOMIC_ACQUIRE);
}

SD_UNINSTRUMENTED inline void drop(const void *addr, size_t len) noexcept {
    if (!is_armed()) return;
    auto &cache = regcache();
    if (cache.on()) cache.invalidate(addr, len);
}

// A chunk within the cache's bounds (out of line: the hooks' usual path
// then saves no registers).
[[gnu::noinline]] SD_UNINSTRUMENTED void drop_chunk_within(void *p) noexcept {
    auto &cache = regcache();
    if (p && cache.on()) cache.invalidate(p, malloc_usable_size(p));
}

// A heap chunk about to be freed or moved. The bounds first: empty (the
// usual case) they fail every chunk, one load.
SD_UNINSTRUMENTED inline void drop_chunk(void *p) noexcept {
    if (is_armed() && regcache().may_hold(reinterpret_cast<uintptr_t>(p), UINTPTR_MAX))
        drop_chunk_within(p);
}

}  // namespace

extern "C" {

SD_UNINSTRUMENTED void sd_free(void *p) noexcept {
    drop_chunk(p);
    next(sys.free)(p);
}

SD_UNINSTRUMENTED void *sd_realloc(void *p, size_t n) noexcept {
    drop_chunk(p);
    return next(sys.realloc)(p, n);
}

SD_UNINSTRUMENTED void *sd_mmap(void *addr, size_t len, int prot, int flags, int fd,
                                off_t off) noexcept {
    if (flags & MAP_FIXED) drop(addr, len);
    return next(sys.mmap)(addr, len, prot, flags, fd, off);
}

SD_UNINSTRUMENTED int sd_munmap(void *addr, size_t len) noexcept {
    drop(addr, len);
    return next(sys.munmap)(addr, len);
}

SD_UNINSTRUMENTED void *sd_mremap(void *old, size_t old_len, size_t new_len, int flags,
                                  ...) noexcept {
    void *to = nullptr;
    if (flags & MREMAP_FIXED) {
        va_list ap;
        va_start(ap, flags);
        to = va_arg(ap, void *);
        va_end(ap);
        drop(to, new_len);
    }
    drop(old, old_len);
    return next(sys.mremap)(old, old_len, new_len, flags, to);
}

SD_UNINSTRUMENTED int sd_madvise(void *addr, size_t len, int advice) noexcept {
    // The advice that replaces pages (they read back as zeroes or anew).
    switch (advice) {
    case MADV_DONTNEED:
    case MADV_FREE:
    case MADV_REMOVE:
#ifdef MADV_DONTNEED_LOCKED
    case MADV_DONTNEED_LOCKED:
#endif
        drop(addr, len);
        break;
    default:
        break;
    }
    return next(sys.madvise)(addr, len, advice);
}

SD_UNINSTRUMENTED void *sd_sbrk(intptr_t incr) noexcept {
    auto f = next(sys.sbrk);
    if (incr < 0) {
        char *end = static_cast<char *>(f(0));
        if (end != reinterpret_cast<char *>(-1)) drop(end + incr, size_t(-incr));
    }
    return f(incr);
}

SD_UNINSTRUMENTED int sd_brk(void *addr) noexcept {
    char *end = static_cast<char *>(next(sys.sbrk)(0));
    if (end != reinterpret_cast<char *>(-1) && static_cast<char *>(addr) < end)
        drop(addr, size_t(end - static_cast<char *>(addr)));
    return next(sys.brk)(addr);
}

SD_UNINSTRUMENTED int sd_shmdt(const void *addr) noexcept {
    // Its size is the kernel's to know: everything from addr on goes.
    drop(addr, UINTPTR_MAX - reinterpret_cast<uintptr_t>(addr));
    return next(sys.shmdt)(addr);
}

void free(void *) noexcept __attribute__((visibility("default"), alias("sd_free")));
void *realloc(void *, size_t) noexcept __attribute__((visibility("default"), alias("sd_realloc")));
void *mmap(void *, size_t, int, int, int, off_t) noexcept __attribute__((visibility("default"), alias("sd_mmap")));
void *mmap64(void *, size_t, int, int, int, off_t) noexcept __attribute__((visibility("default"), alias("sd_mmap")));
int munmap(void *, size_t) noexcept __attribute__((visibility("default"), alias("sd_munmap")));
void *mremap(void *, size_t, size_t, int, ...) noexcept __attribute__((visibility("default"), alias("sd_mremap")));
int madvise(void *, size_t, int) noexcept __attribute__((visibility("default"), alias("sd_madvise")));
void *sbrk(intptr_t) noexcept __attribute__((visibility("default"), alias("sd_sbrk")));
int brk(void *) noexcept __attribute__((visibility("default"), alias("sd_brk")));
int shmdt(const void *) noexcept __attribute__((visibility("default"), alias("sd_shmdt")));

}  // extern "C"

namespace sd::intercept {

// The hooks are the process's own when the names resolve to them.
void memhooks_check() noexcept {
    auto ours = [](const char *name, void *fn) { return dlsym(RTLD_DEFAULT, name) == fn; };
    const bool on = ours("free", reinterpret_cast<void *>(&sd_free)) &&
                    ours("realloc", reinterpret_cast<void *>(&sd_realloc)) &&
                    ours("munmap", reinterpret_cast<void *>(&sd_munmap)) &&
                    ours("mmap", reinterpret_cast<void *>(&sd_mmap)) &&
                    ours("madvise", reinterpret_cast<void *>(&sd_madvise)) &&
                    ours("mremap", reinterpret_cast<void *>(&sd_mremap)) &&
                    !dlsym(RTLD_DEFAULT, "__tsan_init");
    __atomic_store_n(&armed, on, __ATOMIC_RELAXED);
    sd::transport::set_memhooks_active(on);
}

}  // namespace sd::intercept
