// The memory hooks of the registration cache (transport/regcache.hpp):
// free, realloc, munmap, mremap, madvise, mmap over a mapped range, brk,
// sbrk and shmdt drop the registrations of the memory they release or
// replace before it goes. Each forwards to the next definition (the
// application's allocator, or libc). With the cache empty (always, on one
// host: process_vm_readv needs no registration) a hook costs one load.
//
// They work only if they are the process's: a program that defines free
// itself, or a sanitizer preloaded first, comes before us, and then the
// cache stays off (sdirect_memhooks_check).
#undef _FILE_OFFSET_BITS
#include "transport/regcache.hpp"

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <dlfcn.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <unistd.h>

using sd::transport::regcache;

namespace {

// dlsym may allocate and free; a free reached while we resolve free itself
// cannot be forwarded yet and is dropped (a few bytes, once).
__attribute__((tls_model("initial-exec"))) thread_local bool resolving = false;

template <typename F>
F next(std::atomic<F> &slot, const char *name) noexcept {
    F f = slot.load(std::memory_order_acquire);
    if (f || resolving) return f;
    resolving = true;
    f = reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
    resolving = false;
    slot.store(f, std::memory_order_release);
    return f;
}

std::atomic<void (*)(void *)> next_free{nullptr};
std::atomic<void *(*)(void *, size_t)> next_realloc{nullptr};
std::atomic<void *(*)(void *, size_t, int, int, int, off_t)> next_mmap{nullptr};
std::atomic<int (*)(void *, size_t)> next_munmap{nullptr};
std::atomic<void *(*)(void *, size_t, size_t, int, ...)> next_mremap{nullptr};
std::atomic<int (*)(void *, size_t, int)> next_madvise{nullptr};
std::atomic<int (*)(void *)> next_brk{nullptr};
std::atomic<void *(*)(intptr_t)> next_sbrk{nullptr};
std::atomic<int (*)(const void *)> next_shmdt{nullptr};

inline void drop(const void *addr, size_t len) noexcept {
    auto &cache = regcache();
    if (cache.on()) cache.invalidate(addr, len);
}

// A heap chunk about to be freed or moved.
inline void drop_chunk(void *p) noexcept {
    auto &cache = regcache();
    if (!p || !cache.on()) return;
    if (!cache.may_hold(reinterpret_cast<uintptr_t>(p), UINTPTR_MAX)) return;
    cache.invalidate(p, malloc_usable_size(p));
}

}  // namespace

extern "C" {

void sd_free(void *p) noexcept {
    drop_chunk(p);
    if (auto f = next(next_free, "free")) f(p);
}

void *sd_realloc(void *p, size_t n) noexcept {
    drop_chunk(p);
    auto f = next(next_realloc, "realloc");
    return f ? f(p, n) : nullptr;
}

void *sd_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) noexcept {
    if (flags & MAP_FIXED) drop(addr, len);
    if (auto f = next(next_mmap, "mmap")) return f(addr, len, prot, flags, fd, off);
    return reinterpret_cast<void *>(syscall(SYS_mmap, addr, len, prot, flags, fd, off));
}

int sd_munmap(void *addr, size_t len) noexcept {
    drop(addr, len);
    if (auto f = next(next_munmap, "munmap")) return f(addr, len);
    return int(syscall(SYS_munmap, addr, len));
}

void *sd_mremap(void *old, size_t old_len, size_t new_len, int flags, ...) noexcept {
    void *to = nullptr;
    if (flags & MREMAP_FIXED) {
        va_list ap;
        va_start(ap, flags);
        to = va_arg(ap, void *);
        va_end(ap);
        drop(to, new_len);
    }
    drop(old, old_len);
    if (auto f = next(next_mremap, "mremap")) return f(old, old_len, new_len, flags, to);
    return reinterpret_cast<void *>(syscall(SYS_mremap, old, old_len, new_len, flags, to));
}

int sd_madvise(void *addr, size_t len, int advice) noexcept {
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
    if (auto f = next(next_madvise, "madvise")) return f(addr, len, advice);
    return int(syscall(SYS_madvise, addr, len, advice));
}

void *sd_sbrk(intptr_t incr) noexcept {
    auto f = next(next_sbrk, "sbrk");
    if (!f) return reinterpret_cast<void *>(-1);
    if (incr < 0) {
        char *end = static_cast<char *>(f(0));
        drop(end + incr, size_t(-incr));
    }
    return f(incr);
}

int sd_brk(void *addr) noexcept {
    if (auto s = next(next_sbrk, "sbrk")) {
        char *end = static_cast<char *>(s(0));
        if (static_cast<char *>(addr) < end) drop(addr, size_t(end - static_cast<char *>(addr)));
    }
    auto f = next(next_brk, "brk");
    return f ? f(addr) : -1;
}

int sd_shmdt(const void *addr) noexcept {
    // Its size is the kernel's to know: everything from addr on goes.
    drop(addr, UINTPTR_MAX - reinterpret_cast<uintptr_t>(addr));
    auto f = next(next_shmdt, "shmdt");
    return f ? f(addr) : int(syscall(SYS_shmdt, addr));
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
                    ours("mremap", reinterpret_cast<void *>(&sd_mremap));
    // Resolved now, before any other thread exists, rather than at a first
    // call that could come from anywhere.
    (void)next(next_free, "free");
    (void)next(next_realloc, "realloc");
    (void)next(next_munmap, "munmap");
    (void)next(next_mmap, "mmap");
    (void)next(next_mremap, "mremap");
    (void)next(next_madvise, "madvise");
    (void)next(next_brk, "brk");
    (void)next(next_sbrk, "sbrk");
    (void)next(next_shmdt, "shmdt");
    sd::transport::set_memhooks_active(on);
}

}  // namespace sd::intercept
