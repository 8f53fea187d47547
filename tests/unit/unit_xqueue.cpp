// The message queue between processes of two uids (transport/xqueue.hpp),
// its reader against a hostile writer and its writer against a hostile
// reader: whatever the other side writes into the shared memory, nothing
// is read or written outside the queue (it is mapped between inaccessible
// pages here: a stray access kills the test) and the answer is a message
// within bounds, "empty", or "poisoned". And the seals that keep its
// creator from shrinking it under the other side.
#include <catch2/catch.hpp>

#include "transport/xqueue.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <random>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace sd::transport;

namespace {

constexpr std::size_t kMin = 32;           // a message header
constexpr std::size_t kMax = 16384;        // header and the largest payload

// The queue `fd` mapped with an inaccessible page on each side.
struct Fenced {
    char *all = nullptr;
    char *base = nullptr;
    explicit Fenced(int fd) {
        const std::size_t page = std::size_t(sysconf(_SC_PAGESIZE));
        void *m = mmap(nullptr, kXqSize + 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(m != MAP_FAILED);
        all = static_cast<char *>(m);
        void *q = mmap(all + page, kXqSize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
        REQUIRE(q != MAP_FAILED);
        base = static_cast<char *>(q);
    }
    ~Fenced() { munmap(all, kXqSize + 2 * std::size_t(sysconf(_SC_PAGESIZE))); }
    XqHeader &h() const { return *reinterpret_cast<XqHeader *>(base); }
    char *data() const { return base + kXqData; }
};

struct Queue {
    int fd = xq_create();
    Queue() { REQUIRE(fd >= 0); }
    ~Queue() { close(fd); }
};

}  // namespace

TEST_CASE("queue messages arrive whole and in order, across the end of the data area") {
    Queue q;
    Fenced w_map(q.fd), r_map(q.fd);
    XqWriter w;
    w.base = w_map.base;
    XqReader r{r_map.base, 0};
    std::vector<char> out(kMax);
    std::mt19937_64 rnd(7);
    std::uint64_t written = 0, read = 0;
    std::vector<char> msg(kMax);
    for (int i = 0; i < 5000; ++i) {
        const std::uint32_t len = std::uint32_t(kMin + rnd() % (kMax - kMin + 1));
        for (std::uint32_t k = 0; k < len; ++k) msg[k] = char(written + k);
        iovec v[2] = {{msg.data(), 10}, {msg.data() + 10, len - 10u}};
        int rc = xq_put(w, v, 2, len);
        if (rc == -EAGAIN) {
            // Full: the reader takes one, then there is room.
            const long got = xq_take(r, out.data(), kMin, kMax);
            REQUIRE(got >= long(kMin));
            for (long k = 0; k < got; ++k) REQUIRE(out[std::size_t(k)] == char(read + std::uint64_t(k)));
            read += xq_record(std::uint64_t(got));
            --i;
            continue;
        }
        REQUIRE(rc == 0);
        written += xq_record(len);
    }
    CHECK(w.tail > kXqCap);  // it went round more than once
    while (long got = xq_take(r, out.data(), kMin, kMax)) {
        REQUIRE(got >= long(kMin));
        for (long k = 0; k < got; ++k) REQUIRE(out[std::size_t(k)] == char(read + std::uint64_t(k)));
        read += xq_record(std::uint64_t(got));
    }
    CHECK(read == written);
    CHECK(r.head == w.tail);
}

TEST_CASE("a writer that finds the queue read to the end goes on at its start, and the reader follows") {
    Queue q;
    Fenced w_map(q.fd), r_map(q.fd);
    XqWriter w;
    w.base = w_map.base;
    w.skips = true;
    XqReader r{r_map.base, 0};
    std::vector<char> msg(kMax), out(kMax);
    std::mt19937 rnd(11);
    std::uint64_t deepest = 0;
    int restarts = 0;
    for (int i = 0; i < 20000; ++i) {
        // A conversation: each message read before the next is written
        // (every few, two in a row, so that the queue is not always empty).
        const int burst = i % 7 == 0 ? 2 : 1;
        std::vector<int> sent;
        for (int b = 0; b < burst; ++b, ++i) {
            const std::uint32_t len = std::uint32_t(kMin + rnd() % 600);
            std::memcpy(msg.data(), &i, sizeof i);
            for (std::uint32_t k = sizeof i; k < len; ++k) msg[k] = char(i * 7 + int(k));
            iovec v{msg.data(), len};
            const std::uint64_t before = w.tail;
            REQUIRE(xq_put(w, &v, 1, len) == 0);
            if ((w.tail - xq_record(len)) % kXqCap == 0 && before % kXqCap != 0) ++restarts;
            deepest = std::max<std::uint64_t>(deepest, w.tail % kXqCap == 0 ? kXqCap : w.tail % kXqCap);
            sent.push_back(i);
        }
        --i;
        for (int seq : sent) {
            const long got = xq_take(r, out.data(), kMin, kMax);
            REQUIRE(got >= long(kMin));
            int at;
            std::memcpy(&at, out.data(), sizeof at);
            REQUIRE(at == seq);
            for (long k = sizeof at; k < got; ++k) REQUIRE(out[std::size_t(k)] == char(seq * 7 + int(k)));
        }
    }
    CHECK(xq_take(r, out.data(), kMin, kMax) == 0);
    CHECK(r.head == w.tail);
    CHECK(restarts > 100);
    // Never far past the point where it starts over: the same few pages.
    CHECK(deepest < kXqSkipFrom + 2 * 1024);
}

TEST_CASE("a skip the reader cannot follow poisons the queue") {
    Queue q;
    Fenced shared(q.fd);
    XqReader r{shared.base, 0};
    std::vector<char> out(kMax);
    auto *word = reinterpret_cast<std::uint32_t *>(shared.data());
    SECTION("a length of 0 that is no skip") {
        word[0] = 0;
        word[1] = 0;
        shared.h().tail.store(64, std::memory_order_release);
        CHECK(xq_take(r, out.data(), kMin, kMax) == -EPROTO);
    }
    SECTION("a skip past the tail") {
        word[0] = 0;
        word[1] = kXqSkip;
        shared.h().tail.store(64, std::memory_order_release);
        CHECK(xq_take(r, out.data(), kMin, kMax) == -EPROTO);
    }
    SECTION("a skip to the tail, then nothing: empty") {
        word[0] = 0;
        word[1] = kXqSkip;
        shared.h().tail.store(kXqCap, std::memory_order_release);
        CHECK(xq_take(r, out.data(), kMin, kMax) == 0);
        CHECK(r.head == kXqCap);
        CHECK(shared.h().head.load() == kXqCap);
    }
}

TEST_CASE("a writer and a reader running at once over one queue see every message whole, in order") {
    Queue q;
    Fenced w_map(q.fd), r_map(q.fd);
    constexpr int kMessages = 200000;
    std::thread writer([&] {
        XqWriter w;
        w.base = w_map.base;
        std::mt19937 rnd(3);
        std::vector<char> msg(kMax);
        for (int i = 0; i < kMessages; ++i) {
            const std::uint32_t len = std::uint32_t(kMin + rnd() % 4096);
            std::memcpy(msg.data(), &i, sizeof i);
            for (std::uint32_t k = sizeof i; k < len; ++k) msg[k] = char(i + int(k));
            iovec v{msg.data(), len};
            while (xq_put(w, &v, 1, len) == -EAGAIN) std::this_thread::yield();
        }
    });
    XqReader r{r_map.base, 0};
    std::vector<char> out(kMax);
    int next = 0;
    bool whole = true;
    while (next < kMessages && whole) {
        const long got = xq_take(r, out.data(), kMin, kMax);
        REQUIRE(got >= 0);
        if (got == 0) {
            std::this_thread::yield();
            continue;
        }
        int seq;
        std::memcpy(&seq, out.data(), sizeof seq);
        whole = seq == next;
        for (long k = sizeof seq; whole && k < got; ++k) whole = out[std::size_t(k)] == char(seq + int(k));
        ++next;
    }
    writer.join();
    CHECK(whole);
    CHECK(next == kMessages);
}

TEST_CASE("the queue reader never reads outside the queue, whatever the writer wrote") {
    Queue q;
    Fenced shared(q.fd), mine(q.fd);
    std::mt19937_64 rnd(GENERATE(1, 2, 3, 4));
    std::vector<char> out(kMax);
    int poisoned = 0, messages = 0;
    for (int i = 0; i < 20000; ++i) {
        // Our own head: always a record's start (8-aligned), never the shared word.
        XqReader r{mine.base, (rnd() % (1ull << 40)) & ~7ull};
        // The writer's side: a tail near our head or anywhere, lengths and
        // bytes anywhere, the shared head too (ours is what counts).
        const std::uint64_t t = rnd() % 3 == 0 ? rnd() : r.head + (rnd() % (2 * kXqCap));
        shared.h().tail.store(rnd() % 5 == 0 ? t : t & ~7ull);
        shared.h().head.store(rnd());
        const std::uint32_t word = rnd() % 2 ? std::uint32_t(rnd()) : std::uint32_t(rnd() % (2 * kMax));
        std::memcpy(shared.data() + (r.head % kXqCap & ~std::uint64_t(7)), &word, 4);
        if (rnd() % 8 == 0) {
            std::uint64_t junk = rnd();
            std::memcpy(shared.data() + (rnd() % (kXqCap / 8)) * 8, &junk, 8);
        }
        const std::uint64_t head = r.head;
        const long got = xq_take(r, out.data(), kMin, kMax);
        if (got < 0) {
            REQUIRE(got == -EPROTO);
            REQUIRE(r.head == head);  // a poisoned queue moves nothing
            ++poisoned;
        } else if (got == 0) {
            REQUIRE(r.head == head);
        } else {
            REQUIRE(std::size_t(got) >= kMin);
            REQUIRE(std::size_t(got) <= kMax);
            REQUIRE(r.head - head == xq_record(std::uint64_t(got)));
            REQUIRE(r.head - head <= shared.h().tail.load() - head);
            ++messages;
        }
    }
    CHECK(poisoned > 0);
    CHECK(messages > 0);
}

TEST_CASE("the queue writer never writes outside the queue, whatever the reader wrote") {
    Queue q;
    Fenced shared(q.fd), mine(q.fd);
    XqWriter w;
    w.base = mine.base;
    std::mt19937_64 rnd(GENERATE(5, 6));
    std::vector<char> msg(kMax, 'x');
    int refused = 0, full = 0, put = 0;
    for (int i = 0; i < 20000; ++i) {
        w.tail = rnd() % 4 ? (rnd() % (1ull << 40)) & ~7ull : w.tail;
        const std::uint64_t h = rnd() % 3 == 0 ? rnd() : w.tail - (rnd() % (2 * kXqCap));
        shared.h().head.store(rnd() % 5 == 0 ? h : h & ~7ull);
        const std::uint32_t len = std::uint32_t(kMin + rnd() % (kMax - kMin + 1));
        iovec v{msg.data(), len};
        const std::uint64_t tail = w.tail;
        const int rc = xq_put(w, &v, 1, len);
        if (rc == -EPIPE) ++refused;
        else if (rc == -EAGAIN) ++full;
        else {
            REQUIRE(rc == 0);
            REQUIRE(w.tail - tail == xq_record(len));
            REQUIRE(shared.h().tail.load() == w.tail);
            ++put;
        }
    }
    CHECK(refused > 0);
    CHECK(full > 0);
    CHECK(put > 0);
}

TEST_CASE("a queue is sealed: its creator can neither shrink nor grow it, and only such is taken") {
    Queue q;
    dev_t dev;
    ino_t ino;
    CHECK(xq_check(q.fd, &dev, &ino) == 0);
    CHECK(ftruncate(q.fd, 4096) == -1);
    CHECK(errno == EPERM);
    CHECK(ftruncate(q.fd, off_t(2 * kXqSize)) == -1);
    CHECK(fcntl(q.fd, F_ADD_SEALS, F_SEAL_WRITE) == -1);  // F_SEAL_SEAL: no more seals
    CHECK(xq_check(q.fd, &dev, &ino) == 0);

    // Not sealed, sealed against shrinking alone, of another size, not a memfd.
    int plain = int(memfd_create("x", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    REQUIRE(plain >= 0);
    REQUIRE(ftruncate(plain, off_t(kXqSize)) == 0);
    CHECK(xq_check(plain, &dev, &ino) == -EPERM);
    REQUIRE(fcntl(plain, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
    CHECK(xq_check(plain, &dev, &ino) == -EPERM);
    close(plain);
    int small = int(memfd_create("x", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    REQUIRE(small >= 0);
    REQUIRE(ftruncate(small, off_t(kXqSize / 2)) == 0);
    REQUIRE(fcntl(small, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
    CHECK(xq_check(small, &dev, &ino) == -EPERM);
    close(small);
    char path[] = "/tmp/sdirect-xq-XXXXXX";
    int file = mkstemp(path);
    REQUIRE(file >= 0);
    unlink(path);
    REQUIRE(ftruncate(file, off_t(kXqSize)) == 0);
    CHECK(xq_check(file, &dev, &ino) == -EPERM);
    close(file);
}
