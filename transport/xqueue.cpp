#include "xqueue.hpp"

#include "memguard.hpp"
#include "sys.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <new>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sd::transport {
namespace {

constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW;

XqHeader *header(char *base) noexcept { return reinterpret_cast<XqHeader *>(base); }
char *data(char *base) noexcept { return base + kXqData; }

// Copies between the ring at position `pos` and flat memory, in two pieces
// where it wraps.
void ring_out(char *base, std::uint64_t pos, char *dst, std::size_t len) noexcept {
    const std::size_t at = std::size_t(pos % kXqCap);
    const std::size_t first = len < kXqCap - at ? len : kXqCap - at;
    std::memcpy(dst, data(base) + at, first);
    std::memcpy(dst + first, data(base), len - first);
}

void ring_in(char *base, std::uint64_t pos, const char *src, std::size_t len) noexcept {
    const std::size_t at = std::size_t(pos % kXqCap);
    const std::size_t first = len < kXqCap - at ? len : kXqCap - at;
    std::memcpy(data(base) + at, src, first);
    std::memcpy(data(base), src + first, len - first);
}

}  // namespace

int xq_create() noexcept {
    int fd = int(memfd_create("sdirect-queue", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (fd < 0) return -errno;
    XqHeader h{};
    h.magic = kXqMagic;
    h.version = kXqVersion;
    h.capacity = kXqCap;
    // Sealed before it leaves: the writer checks the seals, and ours
    // (F_SEAL_SEAL) keep anyone from adding F_SEAL_WRITE later.
    if (ftruncate(fd, off_t(kXqSize)) != 0 || pwrite(fd, &h, sizeof h, 0) != ssize_t(sizeof h) ||
        sys.fcntl(fd, F_ADD_SEALS, kSeals | F_SEAL_SEAL) != 0) {
        const int err = errno ? errno : EIO;
        sys.close(fd);
        return -err;
    }
    return fd;
}

int xq_check(int fd, dev_t *dev, ino_t *ino) noexcept {
    const int seals = sys.fcntl(fd, F_GET_SEALS);
    if (seals < 0) return -EPERM;  // not a memfd (EINVAL): a file its owner could truncate
    if ((unsigned(seals) & kSeals) != kSeals || (unsigned(seals) & F_SEAL_WRITE)) return -EPERM;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != off_t(kXqSize)) return -EPERM;
    *dev = st.st_dev;
    *ino = st.st_ino;
    return 0;
}

char *xq_map(int fd) noexcept {
    void *m = mmap(nullptr, kXqSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return nullptr;
    // A fork child builds its own engine: it must never write into, or
    // read from, its parent's queues.
    (void)madvise(m, kXqSize, MADV_DONTFORK);
    return static_cast<char *>(m);
}

void xq_unmap(char *base) noexcept {
    if (base) munmap(base, kXqSize);
}

int xq_put(XqWriter &w, const iovec *iov, int iovcnt, std::uint32_t len) noexcept {
    if (!w.base) return -EPIPE;
    // The reader's head, written by the other process: anything may be
    // there. It only ever tells us how much room there is, within our tail.
    const std::uint64_t head = header(w.base)->head.load(std::memory_order_acquire);
    std::uint64_t used = w.tail - head;
    if (used > kXqCap || (head & 7)) return -EPIPE;
    const std::uint64_t rec = xq_record(len);
    const std::size_t in = std::size_t(w.tail % kXqCap);
    if (w.skips && used == 0 && in >= kXqSkipFrom && rec <= in) {
        // Read to the end: the record goes to the start of the data area,
        // where the last ones went (hot in both caches, its pages mapped).
        // The skipped part counts as used until the reader passes the
        // skip, so the record must fit in what is left: `in`.
        const std::uint32_t skip[2] = {0, kXqSkip};
        std::memcpy(data(w.base) + in, skip, sizeof skip);  // 8-aligned: never wraps
        w.tail += kXqCap - in;
        used = kXqCap - in;
    }
    if (rec > kXqCap - used) return -EAGAIN;
    const std::uint32_t words[2] = {len, 0};
    std::memcpy(data(w.base) + w.tail % kXqCap, words, sizeof words);  // never wraps: 8-aligned
    std::uint64_t at = w.tail + kXqRecHead;
    const bool ok = fault_guarded([&] {
        for (int i = 0; i < iovcnt; ++i) {
            ring_in(w.base, at, static_cast<const char *>(iov[i].iov_base), iov[i].iov_len);
            at += iov[i].iov_len;
        }
    });
    if (!ok) return -EFAULT;
    if (at != w.tail + kXqRecHead + len) return -EINVAL;
    w.tail += rec;
    // The record's bytes before the tail that publishes them.
    header(w.base)->tail.store(w.tail, std::memory_order_release);
    return 0;
}

long xq_take(XqReader &r, char *out, std::size_t min, std::size_t max) noexcept {
    XqHeader *h = header(r.base);
    // Pairs with the writer's release store: the record's bytes are there
    // (if the writer is honest; if not, whatever we copy is validated).
    const std::uint64_t tail = h->tail.load(std::memory_order_acquire);
    std::uint64_t avail = tail - r.head;  // our head: never what the shared word says
    if (avail == 0) return 0;
    if (avail > kXqCap || (tail & 7) || avail < kXqRecHead) return -EPROTO;
    // Read once: the writer may change the shared words under us.
    const auto *word = reinterpret_cast<const std::uint32_t *>(data(r.base) + r.head % kXqCap);
    std::uint32_t len = __atomic_load_n(word, __ATOMIC_RELAXED);
    if (len == 0) {
        // A skip (no message is empty): the next record is at the start
        // of the data area, within the tail.
        const std::uint64_t next = (r.head / kXqCap + 1) * kXqCap;
        if (__atomic_load_n(word + 1, __ATOMIC_RELAXED) != kXqSkip || next - r.head > avail)
            return -EPROTO;
        r.head = next;
        h->head.store(r.head, std::memory_order_release);
        avail = tail - r.head;
        if (avail == 0) return 0;
        if (avail < kXqRecHead) return -EPROTO;
        len = __atomic_load_n(reinterpret_cast<const std::uint32_t *>(data(r.base)), __ATOMIC_RELAXED);
    }
    if (len < min || len > max || xq_record(len) > avail) return -EPROTO;
    ring_out(r.base, r.head + kXqRecHead, out, len);
    r.head += xq_record(len);
    // The room goes back to the writer once the message is ours.
    h->head.store(r.head, std::memory_order_release);
    return long(len);
}

}  // namespace sd::transport
