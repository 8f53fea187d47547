// The message queue between two processes (made for pairs of two
// different uids; by default, SDIRECT_QUEUES=all, every pair's): one per pair
// of processes and per direction, a single-producer single-consumer ring
// of messages in a sealed memfd that the RECEIVING process creates and
// passes to the sender with SCM_RIGHTS (handshake.cpp). The provider's shm
// region is never shared across users (it trusts what peers write there);
// this queue trusts nothing it reads: the reader keeps its own head, checks
// the writer's tail and every length against it, and copies each message
// into private memory before anyone looks at it; the writer keeps its own
// tail and checks the reader's head. A peer that writes anything anywhere
// in the queue can only break its own connections (xqlink.cpp).
//
// Layout (kXqSize bytes, fixed; the creator seals its size):
//
//     0  u32 magic 'SDXQ'   4  u16 version   6  u16 zero   8  u64 capacity
//    64  u64 head   bytes the reader consumed (its own cache line)
//   128  u64 tail   bytes the writer published (its own cache line)
//   192  u32 sleepers  the reader's threads asleep (its process page's
//        count, mirrored here by the reader: the writer rings its
//        bell when not 0, and never maps the reader's page)
//   196  u32 rung  the bell's latch: set by the writer that rings, cleared
//        by the reader when it drains the bell (one ring per drain, not
//        one per message; either side may write it, and a wrong value
//        costs only that pair's wake-ups or an extra ring)
//  4096  u64 wakers[kXqWakers]  direct wake-ups, by the reader's
//        connection id: a thread of the reader that sleeps on that
//        connection puts the token of its bell for this link there
//        (bits 0-31; the bell, one end of a datagram socket pair, went to
//        the writer over the link's bell beforehand; bits 32-62 say what
//        the sleep polls, wait.hpp's CrossWake), and the writer that
//        posts to the connection sets bit 63 (kXWakeRung) and sends a
//        byte on that bell instead of the link's (Engine::ring)
// 36864  data[kXqCap]   records at position % kXqCap, 8-byte aligned:
//        u32 len, u32 zero, then len bytes of message (which may wrap
//        past the end of data to its start), padded to 8 bytes. Version 2
//        (the reader's, in the header: a writer skips only into such a
//        queue): u32 0, u32 kXqSkip is a skip, the next record is at the
//        next multiple of kXqCap. The writer skips when it finds the queue
//        empty at least kXqSkipFrom into the data area, so that a
//        conversation of small messages keeps writing the same few lines
//        and pages instead of walking through all of the 1 MiB.
//
// head and tail only grow (u64, never wrapping in practice); the writer
// publishes a record whole with a release store of tail, the reader frees
// it with a release store of head.
#pragma once

#include "lock_order.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <sys/types.h>
#include <sys/uio.h>

namespace sd::transport {

inline constexpr std::uint32_t kXqMagic = 0x51584453;  // "SDXQ"
inline constexpr std::uint16_t kXqVersion = 2;
inline constexpr std::uint32_t kXqSkip = 0x50494B53;  // "SKIP"
inline constexpr std::size_t kXqSkipFrom = 4096;
inline constexpr std::size_t kXqCap = std::size_t(1) << 20;
inline constexpr std::size_t kXqWakersAt = 4096;
inline constexpr std::size_t kXqWakers = 4096;  // = kSlots, the connection ids
inline constexpr std::uint64_t kXWakeRung = std::uint64_t(1) << 63;
inline constexpr std::size_t kXqData = kXqWakersAt + kXqWakers * 8;
inline constexpr std::size_t kXqSize = kXqData + kXqCap;
inline constexpr std::size_t kXqRecHead = 8;  // u32 len, u32 zero

struct XqHeader {
    std::uint32_t magic;
    std::uint16_t version;
    std::uint16_t zero;
    std::uint64_t capacity;
    alignas(64) std::atomic<std::uint64_t> head;
    alignas(64) std::atomic<std::uint64_t> tail;
    alignas(64) std::atomic<std::uint32_t> sleepers;
    std::atomic<std::uint32_t> rung;
};
static_assert(offsetof(XqHeader, capacity) == 8);
static_assert(offsetof(XqHeader, sleepers) == 192);
static_assert(offsetof(XqHeader, rung) == 196);
static_assert(offsetof(XqHeader, head) == 64);
static_assert(offsetof(XqHeader, tail) == 128);
static_assert(sizeof(XqHeader) <= kXqWakersAt);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(kXqCap % 8 == 0 && kXqRecHead % 8 == 0);

// The wakers area of a mapped queue.
inline std::atomic<std::uint64_t> *xq_wakers(char *base) noexcept {
    return reinterpret_cast<std::atomic<std::uint64_t> *>(base + kXqWakersAt);
}

// Bytes a message of `len` takes in the queue.
constexpr std::uint64_t xq_record(std::uint64_t len) noexcept {
    return (kXqRecHead + len + 7) & ~std::uint64_t(7);
}

// A new queue: a memfd of kXqSize bytes, header written, sealed against
// shrinking, growing and further sealing. The fd (close-on-exec) or -errno.
int xq_create() noexcept;

// `fd` is a queue we may map: a memfd sealed against shrinking and growing
// (so that its owner can never take pages from under our map: SIGBUS) and
// of exactly kXqSize bytes. 0 or -errno (-EPERM: not so). `*dev`/`*ino`
// name it (a peer passes the same queue again while it keeps it).
int xq_check(int fd, dev_t *dev, ino_t *ino) noexcept;

// Maps a queue (read and write, not inherited by fork children:
// MADV_DONTFORK). nullptr on failure.
char *xq_map(int fd) noexcept;
void xq_unmap(char *base) noexcept;

// The sending side of one queue, under its producer lock (a leaf: nothing
// is taken under it; lock_order.hpp). `tail` is ours alone: what the
// shared tail says is never read back but once, when the queue is mapped
// (a writer of an earlier attachment may have left records).
struct XqWriter {
    // A few looks before a futex sleep (lock_order.hpp): a process's
    // threads post to one peer at once.
    FutexMutex lock;
    char *base = nullptr;
    std::uint64_t tail = 0;
    dev_t dev = 0;
    ino_t ino = 0;
    bool skips = false;  // the reader reads skips (its queue's version, 2 on)
};

// Appends one message (the iovecs, `len` bytes in all) whole, or nothing:
// 0, -EAGAIN (no room now), -EPIPE (no queue, or the reader's head makes
// no sense: the reader broke it), -EFAULT (a source buffer faulted: the
// copy is guarded). Writer's lock held.
int xq_put(XqWriter &w, const iovec *iov, int iovcnt, std::uint32_t len) noexcept;

// The receiving side: the queue and our own head (the authority; the
// shared one only tells the writer where room is).
struct XqReader {
    char *base = nullptr;
    std::uint64_t head = 0;
};

// Takes the next message into `out` (`max` bytes), past a skip before it:
// its length, 0 when the queue is empty, -EPROTO when the queue is
// poisoned (a tail before our head or more than the capacity past it, a
// length below `min` or above `max`, a record or a skip past the tail, a
// length of 0 that is no skip). Nothing is read outside the data area.
long xq_take(XqReader &r, char *out, std::size_t min, std::size_t max) noexcept;

}  // namespace sd::transport
