// The socket table (shm_fallback/table.hpp): fd -> stream, the table's
// and callers' references, dup aliases, the last close, streams reused
// from the pool, and the sockets a new program would inherit. Real
// sockets of this process; no fabric (the streams stay fresh).
#include <catch2/catch.hpp>

#include "shm_fallback/table.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace sd::fallback;

namespace {

struct Table {
    Table() {
        static const bool once = (table_init(), true);
        (void)once;
    }
};

}  // namespace

TEST_CASE("the table holds every fd number up to RLIMIT_NOFILE, at least 1024", "[table]") {
    Table t;
    CHECK(table_size() >= 1024);
    CHECK(acquire(-1) == nullptr);
    CHECK(acquire(table_size()) == nullptr);
    CHECK(create(table_size(), AF_INET, false) == nullptr);
    CHECK(create(-1, AF_INET, false) == nullptr);
    CHECK(unmap(table_size()) == nullptr);
    CHECK_FALSE(slot_taken(table_size()));
}

TEST_CASE("every fd number keeps its own stream, on both sides of the table's first page "
          "(the lowest fds) and the mapped slots after it; streams made one after the other "
          "are distinct and each found at its fd",
          "[table]") {
    Table t;
    // The first page holds the slots of the lowest few hundred fds; the
    // rest are mapped. Numbers need not be open fds for the table.
    const int fds[] = {0, 1, 200, 379, 380, 381, 382, 383, 511, 512, 1000, table_size() - 1};
    Stream *made[sizeof fds / sizeof fds[0]] = {};
    for (std::size_t i = 0; i < sizeof fds / sizeof fds[0]; ++i) {
        INFO("fd " << fds[i]);
        REQUIRE_FALSE(slot_taken(fds[i]));
        made[i] = create(fds[i], AF_INET, false);
        REQUIRE(made[i]);
        for (std::size_t j = 0; j < i; ++j) CHECK(made[j] != made[i]);
    }
    for (std::size_t i = 0; i < sizeof fds / sizeof fds[0]; ++i) {
        INFO("fd " << fds[i]);
        CHECK(slot_taken(fds[i]));
        Stream *a = acquire(fds[i]);
        CHECK(a == made[i]);
        CHECK(a->fd.load() == fds[i]);
        release(a);
    }
    for (std::size_t i = 0; i < sizeof fds / sizeof fds[0]; ++i) {
        Stream *gone = unmap(fds[i]);
        CHECK(gone == made[i]);
        CHECK_FALSE(slot_taken(fds[i]));
        release(gone);
    }
}

TEST_CASE("a created stream is found at its fd with a reference each caller releases",
          "[table]") {
    Table t;
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    CHECK(acquire(fd) == nullptr);
    CHECK_FALSE(slot_taken(fd));
    Stream *s = create(fd, AF_INET, true);
    REQUIRE(s);
    CHECK(slot_taken(fd));
    CHECK(s->refs.load() == 1);  // the table's
    CHECK(s->fds.load() == 1);
    CHECK(s->fd.load() == fd);
    CHECK(s->domain == AF_INET);
    CHECK(s->nonblock.load());
    struct stat st;
    REQUIRE(fstat(fd, &st) == 0);
    CHECK(s->ino.load() == 0);  // looked up at its first need, not at creation
    CHECK(s->inode() == std::uint64_t(st.st_ino));
    CHECK(s->ino.load() == std::uint64_t(st.st_ino));
    Stream *a = acquire(fd);
    CHECK(a == s);
    CHECK(s->refs.load() == 2);
    release(a);
    CHECK(s->refs.load() == 1);
    Stream *gone = unmap(fd);
    CHECK(gone == s);
    CHECK_FALSE(slot_taken(fd));
    CHECK(acquire(fd) == nullptr);
    release(gone);  // the table's reference, now ours: back to the pool
    // The pool gives the same stream back for the next socket.
    Stream *again = create(fd, AF_INET6, false);
    CHECK(again == s);
    CHECK(again->refs.load() == 1);
    CHECK(again->domain == AF_INET6);
    CHECK_FALSE(again->nonblock.load());
    release(unmap(fd));
    ::close(fd);
}

TEST_CASE("dup'ed fds share one stream; closing the first moves it to the alias, closing "
          "the last leaves it to the caller",
          "[table]") {
    Table t;
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    const int fd2 = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    REQUIRE(fd2 >= 0);
    Stream *s = create(fd, AF_INET, false);
    REQUIRE(s);
    map_dup(fd2, s);
    CHECK(acquire(fd2) == s);
    release(s);
    CHECK(s->refs.load() == 2);
    CHECK(s->fds.load() == 2);
    Stream *first = close_prepare(fd);
    CHECK(first == s);
    CHECK(s->fds.load() == 1);
    CHECK(s->fd.load() == fd2);  // the alias is its fd now
    release(first);
    ::close(fd);
    CHECK(acquire(fd) == nullptr);
    CHECK(acquire(fd2) == s);
    release(s);
    Stream *last = close_prepare(fd2);
    CHECK(last == s);
    CHECK(s->fds.load() == 0);
    CHECK(s->refs.load() == 1);
    release(last);
    CHECK(s->refs.load() == 0);
    ::close(fd2);
}

TEST_CASE("a stream created over a mapped fd replaces it", "[table]") {
    Table t;
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    Stream *old = create(fd, AF_INET, false);
    REQUIRE(old);
    Stream *held = acquire(fd);  // a call in progress keeps the old one
    REQUIRE(held == old);
    Stream *s = create(fd, AF_INET, false);
    REQUIRE(s);
    CHECK(s != old);
    CHECK(acquire(fd) == s);
    release(s);
    CHECK(old->refs.load() == 1);  // the table's reference is gone
    release(held);
    release(unmap(fd));
    ::close(fd);
}

TEST_CASE("the sockets a new program would inherit: without FD_CLOEXEC, in fd order, after a "
          "given fd",
          "[table]") {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    const int kept = ::socket(AF_INET, SOCK_STREAM, 0);
    const int closing = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int file = ::open("/dev/null", O_RDONLY);  // not a socket
    REQUIRE(kept >= 0);
    REQUIRE(closing >= 0);
    REQUIRE(file >= 0);
    ino_t ino[64];
    int fds[64];
    const int n = inherited_sockets(ino, fds, 64);
    REQUIRE(n < 64);
    auto listed = [&](int fd) {
        for (int i = 0; i < n; ++i)
            if (fds[i] == fd) {
                struct stat st;
                REQUIRE(fstat(fd, &st) == 0);
                CHECK(ino[i] == st.st_ino);
                return true;
            }
        return false;
    };
    CHECK(listed(sv[0]));
    CHECK(listed(sv[1]));
    CHECK(listed(kept));
    CHECK_FALSE(listed(closing));
    CHECK_FALSE(listed(file));
    for (int i = 1; i < n; ++i) CHECK(fds[i - 1] < fds[i]);
    // From after sv[0] on, at most 2.
    int two[2];
    ino_t two_ino[2];
    REQUIRE(inherited_sockets(two_ino, two, 2, sv[0]) == 2);
    CHECK(two[0] > sv[0]);
    CHECK(two[0] < two[1]);
    for (int fd : {sv[0], sv[1], kept, closing, file}) ::close(fd);
}
