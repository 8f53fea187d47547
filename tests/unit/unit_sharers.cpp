// Sockets shared through fork (shm_fallback/sharers.hpp): who holds a
// slot, a place reserved for a child about to be born, holders that died,
// the bytes every holder counts, a slot freed by its last holder, and a
// holder's take-over from holders that never used the socket.
// Real children of this process, forked here; each ends with _exit.
#include <catch2/catch.hpp>

#include "shm_fallback/sharers.hpp"

#include <cstdint>
#include <csignal>
#include <sys/wait.h>
#include <unistd.h>

using namespace sd::fallback;

namespace {

// The child's exit status, or -1.
int reap(pid_t pid) {
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

bool alone_now(Sharers *sh) {
    std::uint64_t next = 0;  // look now
    return sharers_alone(sh, &next);
}

}  // namespace

TEST_CASE("a new slot is held by its opener alone, with the bytes so far", "[sharers]") {
    Sharers *sh = sharers_open(100, 200);
    REQUIRE(sh);
    CHECK(sharers_hold(sh));
    CHECK(alone_now(sh));
    CHECK(sharers_sent(sh) == 100);
    CHECK(sharers_received(sh) == 200);
    sharers_count(sh, true, 5);
    sharers_count(sh, false, 7);
    CHECK(sharers_sent(sh) == 105);
    CHECK(sharers_received(sh) == 207);
    // The connection's three counters: sent, received, left.
    std::atomic<std::uint64_t> *k = sharers_counts(sh);
    CHECK(k[0].load() == 105);
    CHECK(k[1].load() == 207);
    CHECK_FALSE(sharers_left(sh));
    k[2].store(1);
    CHECK(sharers_left(sh));
    CHECK_FALSE(sharers_stuck(sh));
    int fd = -1;
    std::uint32_t index = 0;
    REQUIRE(sharers_handle(sh, &fd, &index));  // the arena is a memfd
    CHECK(fd >= 0);
    CHECK(sharers_at(index) == sh);
    sharers_leave(sh);
    CHECK_FALSE(sharers_hold(sh));
    CHECK(sharers_at(index) == nullptr);  // nobody holds it: free
}

TEST_CASE("a place reserved for a child never born keeps the socket shared", "[sharers]") {
    Sharers *sh = sharers_open(0, 0);
    REQUIRE(sh);
    sharers_expect_child(sh);  // then the fork failed
    CHECK_FALSE(alone_now(sh));
    CHECK_FALSE(sharers_stuck(sh));
    int fd = -1;
    std::uint32_t index = 0;
    REQUIRE(sharers_handle(sh, &fd, &index));
    sharers_leave(sh);
    CHECK(sharers_at(index) == sh);  // the reserved place still holds it
    // This process holds it again (a failed exec takes its entry back).
    sharers_rejoin(sh);
    CHECK(sharers_hold(sh));
    sharers_leave(sh);
}

TEST_CASE("a child born into its place holds the socket and counts its bytes; once it is "
          "dead its parent is alone again, looked at no more than the recheck window allows",
          "[sharers]") {
    Sharers *sh = sharers_open(10, 20);
    REQUIRE(sh);
    int up[2], down[2];  // child to parent, parent to child
    REQUIRE(pipe(up) == 0);
    REQUIRE(pipe(down) == 0);
    const int parent = int(getpid());
    sharers_expect_child(sh);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        sharers_born(sh, parent);
        int bad = 0;
        if (!sharers_hold(sh)) bad |= 1;
        if (alone_now(sh)) bad |= 2;  // the parent holds it
        sharers_count(sh, true, 1000);
        sharers_count(sh, false, 3);
        char c;
        (void)!write(up[1], &bad, 1);
        (void)!read(down[0], &c, 1);  // never comes: killed
        _exit(bad);
    }
    char bad = 1;
    REQUIRE(read(up[0], &bad, 1) == 1);
    CHECK(bad == 0);
    CHECK(sharers_sent(sh) == 1010);
    CHECK(sharers_received(sh) == 23);
    std::uint64_t next = 0;
    CHECK_FALSE(sharers_alone(sh, &next));  // the child lives
    CHECK(next > 0);
    REQUIRE(kill(pid, SIGKILL) == 0);
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK(WIFSIGNALED(st));
    // Within the window: not looked at again, so still shared.
    next = ~std::uint64_t(0);
    CHECK_FALSE(sharers_alone(sh, &next));
    CHECK(alone_now(sh));
    for (int fd : {up[0], up[1], down[0], down[1]}) close(fd);
    sharers_leave(sh);
}

TEST_CASE("a child that left the socket (closed it) leaves its parent alone", "[sharers]") {
    Sharers *sh = sharers_open(0, 0);
    REQUIRE(sh);
    int up[2], down[2];
    REQUIRE(pipe(up) == 0);
    REQUIRE(pipe(down) == 0);
    const int parent = int(getpid());
    sharers_expect_child(sh);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        sharers_born(sh, parent);
        const bool held = sharers_hold(sh);
        sharers_leave(sh);
        (void)!write(up[1], "l", 1);
        char c;
        (void)!read(down[0], &c, 1);
        _exit(held && !sharers_hold(sh) ? 0 : 1);
    }
    char c = 0;
    REQUIRE(read(up[0], &c, 1) == 1);
    // The child lives, but holds it no more.
    std::uint64_t next = ~std::uint64_t(0);
    CHECK(sharers_alone(sh, &next));
    REQUIRE(write(down[1], "x", 1) == 1);
    CHECK(reap(pid) == 0);
    for (int fd : {up[0], up[1], down[0], down[1]}) close(fd);
    sharers_leave(sh);
}

TEST_CASE("more holders than entries: dead ones are purged for the newcomer, else the socket "
          "is shared for good",
          "[sharers]") {
    Sharers *sh = sharers_open(0, 0);
    REQUIRE(sh);
    // 25 children born and gone (_exit): every entry but ours is a dead
    // holder's (26 entries).
    const int parent = int(getpid());
    for (int i = 0; i < 25; ++i) {
        sharers_expect_child(sh);
        const pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            sharers_born(sh, parent);
            _exit(sharers_hold(sh) ? 0 : 1);
        }
        REQUIRE(reap(pid) == 0);
    }
    CHECK_FALSE(sharers_stuck(sh));
    sharers_expect_child(sh);  // no empty entry: the dead are purged
    CHECK_FALSE(sharers_stuck(sh));
    // Places reserved for children are never purged: 24 more fill it.
    for (int i = 0; i < 24; ++i) sharers_expect_child(sh);
    CHECK_FALSE(sharers_stuck(sh));
    sharers_expect_child(sh);
    CHECK(sharers_stuck(sh));
    CHECK_FALSE(alone_now(sh));
}

TEST_CASE("a socket half-closed while shared stays shared", "[sharers]") {
    Sharers *sh = sharers_open(0, 0);
    REQUIRE(sh);
    CHECK(alone_now(sh));
    sharers_stick(sh);
    CHECK(sharers_stuck(sh));
    CHECK_FALSE(alone_now(sh));
    sharers_leave(sh);
}

TEST_CASE("a child takes the socket over from a parent that never used it; the parent, using "
          "it afterwards, finds the child named as owner; the counts restart from zero",
          "[sharers]") {
    Sharers *sh = sharers_open(300, 400);
    REQUIRE(sh);
    int up[2], down[2];
    REQUIRE(pipe(up) == 0);
    REQUIRE(pipe(down) == 0);
    const int parent = int(getpid());
    sharers_expect_child(sh);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        sharers_born(sh, parent);
        sharers_use(sh);
        int bad = 0;
        std::uint64_t next = 0;
        if (sharers_may_take(sh, &next) != 2) bad |= 1;  // the parent lives, idle
        if (!sharers_take(sh)) bad |= 2;
        if (sharers_sent(sh) != 300 || sharers_received(sh) != 400) bad |= 4;
        sharers_reset_counts(sh);
        bool pending = false;
        if (sharers_owner(sh, &pending) != 0) bad |= 8;  // itself: nobody to ask
        sharers_took(sh);
        char b = char(bad), c;
        (void)!write(up[1], &b, 1);
        (void)!read(down[0], &c, 1);
        // Its connection left: the owner word no longer names it.
        sharers_disown(sh, int(getpid()));
        (void)!write(up[1], &b, 1);
        (void)!read(down[0], &c, 1);
        _exit(0);
    }
    char bad = 1;
    REQUIRE(read(up[0], &bad, 1) == 1);
    CHECK(int(bad) == 0);
    CHECK(sharers_sent(sh) == 0);
    CHECK(sharers_received(sh) == 0);
    CHECK_FALSE(sharers_left(sh));
    sharers_use(sh);
    bool pending = true;
    CHECK(sharers_owner(sh, &pending) == int(pid));
    CHECK_FALSE(pending);
    // Another holder owns it now: nobody else takes it meanwhile.
    std::uint64_t next = 0;
    CHECK(sharers_may_take(sh, &next) == 0);
    REQUIRE(write(down[1], "x", 1) == 1);
    REQUIRE(read(up[0], &bad, 1) == 1);
    CHECK(sharers_owner(sh, &pending) == 0);
    REQUIRE(write(down[1], "x", 1) == 1);
    CHECK(reap(pid) == 0);
    for (int fd : {up[0], up[1], down[0], down[1]}) close(fd);
    sharers_leave(sh);
}

TEST_CASE("a holder that used the socket keeps others from taking it over; one whose other "
          "holder died takes the counts as the last holder",
          "[sharers]") {
    Sharers *sh = sharers_open(0, 0);
    REQUIRE(sh);
    int up[2], down[2];
    REQUIRE(pipe(up) == 0);
    REQUIRE(pipe(down) == 0);
    const int parent = int(getpid());
    sharers_use(sh);  // the parent used it after the slot was made
    sharers_expect_child(sh);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        sharers_born(sh, parent);
        sharers_use(sh);
        std::uint64_t next = 0;
        const int may = sharers_may_take(sh, &next);
        char b = char(may);
        (void)!write(up[1], &b, 1);
        char c;
        (void)!read(down[0], &c, 1);  // never comes: killed
        _exit(0);
    }
    char may = -1;
    REQUIRE(read(up[0], &may, 1) == 1);
    CHECK(int(may) == 0);  // the parent used it: no take-over
    // The child lives and used it: neither alone nor free to take.
    std::uint64_t next = 0;
    CHECK(sharers_may_take(sh, &next) == 0);
    REQUIRE(kill(pid, SIGKILL) == 0);
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    next = 0;
    CHECK(sharers_may_take(sh, &next) == 1);  // dead: the parent is the last holder
    for (int fd : {up[0], up[1], down[0], down[1]}) close(fd);
    sharers_leave(sh);
}

TEST_CASE("a take-over gives up when another holder uses the socket before the check; a "
          "child born with an inherited epoll watch counts as a user",
          "[sharers]") {
    Sharers *sh = sharers_open(0, 0);
    REQUIRE(sh);
    int up[2], down[2];
    REQUIRE(pipe(up) == 0);
    REQUIRE(pipe(down) == 0);
    const int parent = int(getpid());
    sharers_expect_child(sh);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        sharers_born(sh, parent, true);  // watched by an epoll set it inherited
        char b = 0, c;
        (void)!write(up[1], &b, 1);
        (void)!read(down[0], &c, 1);
        _exit(0);
    }
    char c = 0;
    REQUIRE(read(up[0], &c, 1) == 1);
    std::uint64_t next = 0;
    CHECK(sharers_may_take(sh, &next) == 0);  // the child uses it
    // The word set and taken back: the child's mark was there first.
    CHECK_FALSE(sharers_take(sh));
    bool pending = true;
    CHECK(sharers_owner(sh, &pending) == 0);
    REQUIRE(write(down[1], "x", 1) == 1);
    CHECK(reap(pid) == 0);
    for (int fd : {up[0], up[1], down[0], down[1]}) close(fd);
    sharers_leave(sh);
}
