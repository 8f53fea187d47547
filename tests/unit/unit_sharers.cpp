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

// A child born into the place its parent reserves for it in a slot
// (`used`: an epoll set it inherited watches the socket), which runs
// `body` and ends with _exit of what it returns. The two talk through
// pipes: the child's say() is the parent's hear(), the parent's go() the
// child's wait_go(). A child that waits for a go that never comes ends
// when the parent kills it.
struct Kid {
    int up[2] = {-1, -1}, down[2] = {-1, -1};
    pid_t pid = -1;

    template <typename Body>
    Kid(Sharers *sh, Body body, bool used = false) {
        REQUIRE(pipe(up) == 0);
        REQUIRE(pipe(down) == 0);
        const int parent = int(getpid());
        sharers_expect_child(sh);
        pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            sharers_born(sh, parent, used);
            _exit(body(*this));
        }
    }
    ~Kid() {
        for (int fd : {up[0], up[1], down[0], down[1]}) close(fd);
    }
    void say(char b) { (void)!write(up[1], &b, 1); }
    void wait_go() {
        char c;
        (void)!read(down[0], &c, 1);
    }
    char hear() {
        char b = -1;
        REQUIRE(read(up[0], &b, 1) == 1);
        return b;
    }
    void go() { REQUIRE(write(down[1], "g", 1) == 1); }
};

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
    // The connection's leave adds its offsets and marks them left.
    CHECK_FALSE(sharers_left(sh));
    sharers_hand_back(sh, 10, 20);
    CHECK(sharers_sent(sh) == 115);
    CHECK(sharers_received(sh) == 227);
    CHECK(sharers_left(sh));
    CHECK_FALSE(sharers_is_blind(sh));
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
    Kid kid(sh, [sh](Kid &k) {
        int bad = 0;
        if (!sharers_hold(sh)) bad |= 1;
        if (alone_now(sh)) bad |= 2;  // the parent holds it
        sharers_count(sh, true, 1000);
        sharers_count(sh, false, 3);
        k.say(char(bad));
        k.wait_go();  // never comes: killed
        return bad;
    });
    CHECK(int(kid.hear()) == 0);
    CHECK(sharers_sent(sh) == 1010);
    CHECK(sharers_received(sh) == 23);
    std::uint64_t next = 0;
    CHECK_FALSE(sharers_alone(sh, &next));  // the child lives
    CHECK(next > 0);
    REQUIRE(kill(kid.pid, SIGKILL) == 0);
    int st = 0;
    REQUIRE(waitpid(kid.pid, &st, 0) == kid.pid);
    CHECK(WIFSIGNALED(st));
    // Within the window: not looked at again, so still shared.
    next = ~std::uint64_t(0);
    CHECK_FALSE(sharers_alone(sh, &next));
    CHECK(alone_now(sh));
    sharers_leave(sh);
}

TEST_CASE("a child that left the socket (closed it) leaves its parent alone", "[sharers]") {
    Sharers *sh = sharers_open(0, 0);
    REQUIRE(sh);
    Kid kid(sh, [sh](Kid &k) {
        const bool held = sharers_hold(sh);
        sharers_leave(sh);
        k.say(0);
        k.wait_go();
        return held && !sharers_hold(sh) ? 0 : 1;
    });
    (void)kid.hear();
    // The child lives, but holds it no more.
    std::uint64_t next = ~std::uint64_t(0);
    CHECK(sharers_alone(sh, &next));
    kid.go();
    CHECK(reap(kid.pid) == 0);
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

TEST_CASE("a child takes the socket over from a parent that has not used it since the fork; "
          "the parent, using it afterwards, finds the child named as owner; the counts restart "
          "from zero",
          "[sharers]") {
    Sharers *sh = sharers_open(300, 400);
    REQUIRE(sh);
    Kid kid(sh, [sh](Kid &k) {
        sharers_use(sh);
        int bad = 0;
        std::uint64_t next = 0;
        if (sharers_may_take(sh, &next) != 2) bad |= 1;  // the parent lives, unmarked
        if (!sharers_take(sh)) bad |= 2;
        if (sharers_sent(sh) != 300 || sharers_received(sh) != 400) bad |= 4;
        sharers_reset_counts(sh);
        bool pending = false;
        if (sharers_owner(sh, &pending) != 0) bad |= 8;  // itself: nobody to ask
        sharers_took(sh);
        k.say(char(bad));
        k.wait_go();
        // Its connection left: the owner word no longer names it.
        sharers_disown(sh, int(getpid()));
        k.say(0);
        k.wait_go();
        return 0;
    });
    CHECK(int(kid.hear()) == 0);
    CHECK(sharers_sent(sh) == 0);
    CHECK(sharers_received(sh) == 0);
    CHECK_FALSE(sharers_left(sh));
    sharers_use(sh);
    bool pending = true;
    CHECK(sharers_owner(sh, &pending) == int(kid.pid));
    CHECK_FALSE(pending);
    // Another holder owns it now: nobody else takes it meanwhile.
    std::uint64_t next = 0;
    CHECK(sharers_may_take(sh, &next) == 0);
    kid.go();
    (void)kid.hear();
    CHECK(sharers_owner(sh, &pending) == 0);
    kid.go();
    CHECK(reap(kid.pid) == 0);
    sharers_leave(sh);
}

TEST_CASE("a holder that used the socket keeps others from taking it over; one whose other "
          "holder died takes the counts as the last holder; a fork starts the parent's mark "
          "again",
          "[sharers]") {
    Sharers *sh = sharers_open(0, 0);
    REQUIRE(sh);
    sharers_use(sh);  // the parent used it after the slot was made
    {
        Kid kid(sh, [sh](Kid &k) {
            sharers_use(sh);
            std::uint64_t next = 0;
            k.say(char(sharers_may_take(sh, &next)));
            k.wait_go();  // never comes: killed
            return 0;
        });
        CHECK(int(kid.hear()) == 0);  // the parent used it: no take-over
        // The child lives and used it: neither alone nor free to take.
        std::uint64_t next = 0;
        CHECK(sharers_may_take(sh, &next) == 0);
        REQUIRE(kill(kid.pid, SIGKILL) == 0);
        int st = 0;
        REQUIRE(waitpid(kid.pid, &st, 0) == kid.pid);
        next = 0;
        CHECK(sharers_may_take(sh, &next) == 1);  // dead: the parent is the last holder
    }
    // A fork of a parent with no call on the socket clears its mark.
    sharers_unuse(sh);
    Kid kid(sh, [sh](Kid &k) {
        sharers_use(sh);
        std::uint64_t next = 0;
        k.say(char(sharers_may_take(sh, &next)));
        return 0;
    });
    CHECK(int(kid.hear()) == 2);
    CHECK(reap(kid.pid) == 0);
    sharers_leave(sh);
}

TEST_CASE("a take-over gives up when another holder uses the socket before the check; a "
          "child born with an inherited epoll watch counts as a user",
          "[sharers]") {
    Sharers *sh = sharers_open(0, 0);
    REQUIRE(sh);
    // Watched by an epoll set it inherited.
    Kid kid(
        sh,
        [](Kid &k) {
            k.say(0);
            k.wait_go();
            return 0;
        },
        true);
    (void)kid.hear();
    std::uint64_t next = 0;
    CHECK(sharers_may_take(sh, &next) == 0);  // the child uses it
    // The word set and taken back: the child's mark was there first.
    CHECK_FALSE(sharers_take(sh));
    bool pending = true;
    CHECK(sharers_owner(sh, &pending) == 0);
    kid.go();
    CHECK(reap(kid.pid) == 0);
    sharers_leave(sh);
}
