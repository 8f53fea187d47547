// epoll beyond what every waiting call shares: level and edge triggering,
// EPOLLONESHOT, EPOLLEXCLUSIVE, several sets, data returned verbatim,
// epoll_ctl's errors, nesting, epoll_ctl from another thread and the
// life of a registration across dup and close.
#include "peer_ready.hpp"

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <functional>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

namespace peer {

namespace {

struct Ev {
    std::uint64_t data;
    std::uint32_t events;
};

int ep_new() {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) fail("epoll_create1: %s", errno_name(errno));
    return ep;
}

void ep_ctl(int ep, int op, int fd, std::uint32_t events, std::uint64_t data, const char *what) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = data;
    if (epoll_ctl(ep, op, fd, &ev) != 0) fail("%s: epoll_ctl: %s", what, errno_name(errno));
}

std::string evs_text(const std::vector<Ev> &evs) {
    std::string out;
    for (const Ev &e : evs) {
        char item[96];
        std::snprintf(item, sizeof item, " {0x%llx %s}", (unsigned long long)e.data,
                      events_text(short(e.events)).c_str());
        out += item;
    }
    return out.empty() ? " none" : out;
}

// One epoll_wait; the events must be exactly `want` (in any order).
std::vector<Ev> expect_events(int ep, int timeout_ms, const std::vector<Ev> &want,
                              const char *what, double *took = nullptr) {
    epoll_event evs[8];
    const std::uint64_t start = now_ns();
    int rc;
    {
        Watch watch(timeout_ms < 0 ? 5 : timeout_ms / 1000.0 + 5, what);
        rc = epoll_wait(ep, evs, 8, timeout_ms);
    }
    const int err = errno;
    if (took) *took = seconds_since(start);
    if (rc < 0) fail("%s: epoll_wait: %s", what, errno_name(err));
    std::vector<Ev> got;
    for (int i = 0; i < rc; ++i) got.push_back({evs[i].data.u64, evs[i].events});
    bool same = got.size() == want.size();
    for (const Ev &w : want) {
        bool found = false;
        for (const Ev &g : got) found |= g.data == w.data && g.events == w.events;
        same &= found;
    }
    if (!same)
        fail("%s: epoll_wait (timeout %d ms) returned%s after %.3f s; expected%s", what,
             timeout_ms, evs_text(got).c_str(), seconds_since(start), evs_text(want).c_str());
    return got;
}

void take_part(int fd, std::uint64_t seed, std::uint64_t off, std::size_t len, const char *what) {
    std::vector<char> buf(len + 1);
    read_all(fd, buf.data(), len, what);
    pattern_expect(seed, off, buf.data(), len, what);
}

void expect_result(const char *what, int rc, int err, int want_rc, int want_err) {
    if (rc == want_rc && (want_rc != -1 || err == want_err)) return;
    fail("%s: returned %d (%s), expected %d (%s)", what, rc, rc < 0 ? errno_name(err) : "-",
         want_rc, want_rc < 0 ? errno_name(want_err) : "-");
}

#define EXPECT_CALL(what, call, want_rc, want_err)               \
    do {                                                         \
        errno = 0;                                               \
        const int rc_ = int(call);                               \
        expect_result(what, rc_, errno, want_rc, want_err);      \
    } while (0)

constexpr std::uint32_t IN = EPOLLIN;

}  // namespace

namespace {

// Level-triggered: reported on every call while data is unread.
void level_part(int s, const std::function<std::uint64_t()> &seed) {
    const std::uint64_t lt_data = 0x1122334455667788ull;
    int lt = ep_new();
    ep_ctl(lt, EPOLL_CTL_ADD, s, IN, lt_data, "LT add");
    expect_events(lt, 0, {}, "LT, nothing sent yet");
    std::uint64_t sd = seed();
    order_send(s, 100, sd, 50000, true);
    expect_events(lt, -1, {{lt_data, IN}}, "LT, data arrives");
    expect_events(lt, 0, {{lt_data, IN}}, "LT, reported again");
    expect_events(lt, 0, {{lt_data, IN}}, "LT, and again");
    take_part(s, sd, 0, 40, "LT, 40 of 100 bytes");
    expect_events(lt, 0, {{lt_data, IN}}, "LT, 60 bytes left");
    take_part(s, sd, 40, 60, "LT, the last 60 bytes");
    expect_events(lt, 0, {}, "LT, everything read");
    close(lt);
}

// Edge-triggered: once per arrival, whatever is left unread.
void edge_part(int s, const std::function<std::uint64_t()> &seed) {
    int et = ep_new();
    ep_ctl(et, EPOLL_CTL_ADD, s, IN | EPOLLET, 2, "ET add");
    expect_events(et, 0, {}, "ET, nothing sent yet");
    const std::uint64_t e1 = seed(), e2 = seed();
    order_send(s, 100, e1, 50000, true);
    expect_events(et, -1, {{2, IN}}, "ET, first arrival");
    double took = 0;
    expect_events(et, 100, {}, "ET, no new arrival", &took);
    if (took < 0.09) fail("ET: epoll_wait with nothing new returned after %.3f s", took);
    take_part(s, e1, 0, 50, "ET, half of the first arrival");
    expect_events(et, 0, {}, "ET, after a partial read");
    order_send(s, 100, e2, 50000, true);
    expect_events(et, -1, {{2, IN}}, "ET, second arrival");
    expect_events(et, 0, {}, "ET, second arrival reported once");
    take_part(s, e1, 50, 50, "ET, rest of the first arrival");
    take(s, 100, e2, "ET, second arrival");
    expect_events(et, 0, {}, "ET, everything read");
    close(et);
    // Added while data waits: reported once.
    const std::uint64_t e3 = seed();
    order_send(s, 100, e3, 0, true);
    await_queued(s, 100, "before an ET add");
    et = ep_new();
    ep_ctl(et, EPOLL_CTL_ADD, s, IN | EPOLLET, 3, "ET add with data waiting");
    expect_events(et, 0, {{3, IN}}, "ET added with data waiting");
    expect_events(et, 0, {}, "ET added with data waiting, second call");
    take(s, 100, e3, "ET, data that waited");
    close(et);
    et = ep_new();
    ep_ctl(et, EPOLL_CTL_ADD, s, EPOLLOUT | EPOLLET, 4, "ET add for EPOLLOUT");
    expect_events(et, 0, {{4, EPOLLOUT}}, "ET EPOLLOUT on a writable socket");
    expect_events(et, 0, {}, "ET EPOLLOUT, second call");
    close(et);
}

// EPOLLONESHOT: one report, then silence until EPOLL_CTL_MOD rearms it.
void oneshot_part(int s, const std::function<std::uint64_t()> &seed) {
    int os = ep_new();
    ep_ctl(os, EPOLL_CTL_ADD, s, IN | EPOLLONESHOT, 5, "ONESHOT add");
    const std::uint64_t o1 = seed(), o2 = seed(), o3 = seed();
    order_send(s, 100, o1, 50000, true);
    expect_events(os, -1, {{5, IN}}, "ONESHOT, first arrival");
    order_send(s, 100, o2, 0, true);
    await_queued(s, 200, "ONESHOT, second arrival");
    expect_events(os, 100, {}, "ONESHOT, disabled after one report");
    ep_ctl(os, EPOLL_CTL_MOD, s, IN | EPOLLONESHOT, 55, "ONESHOT rearm");
    expect_events(os, 0, {{55, IN}}, "ONESHOT rearmed with data waiting");
    expect_events(os, 0, {}, "ONESHOT, disabled again");
    take(s, 100, o1, "ONESHOT, first arrival");
    take(s, 100, o2, "ONESHOT, second arrival");
    ep_ctl(os, EPOLL_CTL_MOD, s, IN | EPOLLONESHOT, 56, "ONESHOT rearm with nothing waiting");
    expect_events(os, 0, {}, "ONESHOT rearmed, nothing waiting");
    order_send(s, 100, o3, 50000, true);
    expect_events(os, -1, {{56, IN}}, "ONESHOT rearmed, data arrives");
    take(s, 100, o3, "ONESHOT, third arrival");
    EXPECT_CALL("ONESHOT: DEL of a disabled registration", epoll_ctl(os, EPOLL_CTL_DEL, s, nullptr), 0, 0);
    close(os);
}

// EPOLLEXCLUSIVE: accepted by ADD only, and only with the allowed bits.
void exclusive_part(int s, const std::function<std::uint64_t()> &seed) {
    int ex = ep_new();
    epoll_event ev{};
    ev.events = IN | EPOLLEXCLUSIVE;
    ev.data.u64 = 6;
    EXPECT_CALL("ADD EPOLLIN|EPOLLEXCLUSIVE", epoll_ctl(ex, EPOLL_CTL_ADD, s, &ev), 0, 0);
    const std::uint64_t x1 = seed();
    order_send(s, 100, x1, 50000, true);
    expect_events(ex, -1, {{6, IN}}, "EXCLUSIVE, data arrives");
    expect_events(ex, 0, {{6, IN}}, "EXCLUSIVE is level-triggered");
    EXPECT_CALL("MOD with EPOLLEXCLUSIVE", epoll_ctl(ex, EPOLL_CTL_MOD, s, &ev), -1, EINVAL);
    ev.events = IN;
    EXPECT_CALL("MOD of an exclusive registration", epoll_ctl(ex, EPOLL_CTL_MOD, s, &ev), -1, EINVAL);
    int ex2 = ep_new();
    ev.events = IN | EPOLLEXCLUSIVE | EPOLLONESHOT;
    EXPECT_CALL("ADD EPOLLEXCLUSIVE|EPOLLONESHOT", epoll_ctl(ex2, EPOLL_CTL_ADD, s, &ev), -1, EINVAL);
    ev.events = IN | EPOLLRDHUP | EPOLLEXCLUSIVE;
    EXPECT_CALL("ADD EPOLLEXCLUSIVE|EPOLLRDHUP", epoll_ctl(ex2, EPOLL_CTL_ADD, s, &ev), -1, EINVAL);
    ev.events = IN | EPOLLEXCLUSIVE;
    EXPECT_CALL("ADD an epoll fd with EPOLLEXCLUSIVE", epoll_ctl(ex2, EPOLL_CTL_ADD, ex, &ev), -1, EINVAL);
    EXPECT_CALL("DEL of an exclusive registration", epoll_ctl(ex, EPOLL_CTL_DEL, s, nullptr), 0, 0);
    expect_events(ex, 0, {}, "EXCLUSIVE, after DEL");
    take(s, 100, x1, "EXCLUSIVE, data");
    close(ex2);
    close(ex);
}

// One socket in two sets: each keeps its own mode and registration.
void two_sets_part(int s, const std::function<std::uint64_t()> &seed) {
    int a = ep_new(), b = ep_new();
    ep_ctl(a, EPOLL_CTL_ADD, s, IN, 0xa, "set A add");
    ep_ctl(b, EPOLL_CTL_ADD, s, IN | EPOLLET, 0xb, "set B add");
    const std::uint64_t t1 = seed(), t2 = seed();
    order_send(s, 100, t1, 50000, true);
    expect_events(a, -1, {{0xa, IN}}, "two sets: A (level) sees the data");
    expect_events(b, 0, {{0xb, IN}}, "two sets: B (edge) sees the data");
    expect_events(a, 0, {{0xa, IN}}, "two sets: A reports again");
    expect_events(b, 0, {}, "two sets: B reported once");
    ep_ctl(a, EPOLL_CTL_DEL, s, 0, 0, "set A del");
    expect_events(a, 0, {}, "two sets: A after DEL");
    order_send(s, 100, t2, 50000, true);
    expect_events(b, -1, {{0xb, IN}}, "two sets: B sees a new arrival after A's DEL");
    expect_events(a, 100, {}, "two sets: A stays empty");
    take(s, 100, t1, "two sets, first");
    take(s, 100, t2, "two sets, second");
    close(a);
    close(b);
}

// data is returned bit for bit, whatever it holds; maxevents 1 with two
// ready fds: level-triggered entries take turns.
void data_part(int s, const std::function<std::uint64_t()> &seed) {
    int dv = ep_new();
    const std::uint64_t d1 = seed();
    order_send(s, 10, d1, 0, true);
    await_queued(s, 10, "data.u64 checks");
    const std::uint64_t values[] = {0, 1, ~0ull, 0x8000000000000001ull, 0xdeadbeefcafebabeull,
                                    std::uint64_t(s) | (1ull << 40)};
    ep_ctl(dv, EPOLL_CTL_ADD, s, IN, values[0], "data add");
    for (std::uint64_t v : values) {
        ep_ctl(dv, EPOLL_CTL_MOD, s, IN, v, "data mod");
        expect_events(dv, 0, {{v, IN}}, "data.u64 returned verbatim");
    }
    epoll_event ev{};
    ev.events = IN;
    ev.data.fd = s;
    ep_ctl(dv, EPOLL_CTL_DEL, s, 0, 0, "data del");
    if (epoll_ctl(dv, EPOLL_CTL_ADD, s, &ev) != 0) fail("data.fd add: %s", errno_name(errno));
    epoll_event got[2];
    if (epoll_wait(dv, got, 2, 0) != 1 || got[0].data.fd != s)
        fail("data.fd: epoll_wait did not return fd %d", s);
    // Each MOD registers afresh with the kernel too: still one event per
    // registration and call, whoever answers for the socket.
    for (std::uint64_t i = 0; i < 8; ++i) {
        ep_ctl(dv, EPOLL_CTL_MOD, s, IN | EPOLLOUT, 0x100 + i, "data mod IN|OUT");
        expect_events(dv, 0, {{0x100 + i, IN | EPOLLOUT}}, "one event after MOD to IN|OUT");
        expect_events(dv, 0, {{0x100 + i, IN | EPOLLOUT}}, "one event, second call");
    }
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) fail("pipe2: %s", errno_name(errno));
    if (write(p[1], "x", 1) != 1) fail("pipe write");
    ep_ctl(dv, EPOLL_CTL_MOD, s, IN, 1, "turns: socket");
    ep_ctl(dv, EPOLL_CTL_ADD, p[0], IN, 2, "turns: pipe");
    std::uint64_t order[4];
    for (auto &o : order) {
        if (epoll_wait(dv, got, 1, 0) != 1) fail("turns: epoll_wait(maxevents 1) returned no event");
        o = got[0].data.u64;
    }
    if (order[0] == order[1] || order[0] != order[2] || order[1] != order[3])
        fail("turns: maxevents 1 returned %llu %llu %llu %llu; ready entries must take turns",
             (unsigned long long)order[0], (unsigned long long)order[1],
             (unsigned long long)order[2], (unsigned long long)order[3]);
    take(s, 10, d1, "data.u64 checks");
    close(p[0]);
    close(p[1]);
    close(dv);
}

}  // namespace

// The part (part_of_conn): level, edge, oneshot, exclusive, two-sets or data.
void drive_epoll_modes(int *fd, const Options &opt) {
    static constexpr struct {
        const char *name;
        void (*fn)(int, const std::function<std::uint64_t()> &);
    } parts[] = {{"level", level_part},         {"edge", edge_part},
                 {"oneshot", oneshot_part},     {"exclusive", exclusive_part},
                 {"two-sets", two_sets_part},   {"data", data_part}};
    std::uint64_t k = 0;
    const std::function<std::uint64_t()> seed = [&] { return seed_of(opt, ++k); };
    const std::string part = part_of_conn(opt);
    bool found = false;
    for (const auto &p : parts)
        if (part == p.name) {
            p.fn(*fd, seed);
            found = true;
        }
    if (!found) fail("epoll-modes: unknown --part '%s'", part.c_str());
    send_exit(*fd);
}

void drive_epoll_errors(int *fd, const Options &) {
    const int s = *fd;
    epoll_event ev{};
    ev.events = IN;
    EXPECT_CALL("epoll_create(0)", epoll_create(0), -1, EINVAL);
    EXPECT_CALL("epoll_create(-1)", epoll_create(-1), -1, EINVAL);
    EXPECT_CALL("epoll_create1(bad flags)", epoll_create1(0x1234), -1, EINVAL);
    int ep = ep_new();
    EXPECT_CALL("ADD", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev), 0, 0);
    EXPECT_CALL("ADD twice", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev), -1, EEXIST);
    EXPECT_CALL("MOD", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev), 0, 0);
    EXPECT_CALL("DEL", epoll_ctl(ep, EPOLL_CTL_DEL, s, &ev), 0, 0);
    EXPECT_CALL("DEL again", epoll_ctl(ep, EPOLL_CTL_DEL, s, &ev), -1, ENOENT);
    EXPECT_CALL("MOD unregistered", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev), -1, ENOENT);
    EXPECT_CALL("ADD fd -1", epoll_ctl(ep, EPOLL_CTL_ADD, -1, &ev), -1, EBADF);
    int gone = dup(s);
    close(gone);
    EXPECT_CALL("ADD a closed fd", epoll_ctl(ep, EPOLL_CTL_ADD, gone, &ev), -1, EBADF);
    EXPECT_CALL("epfd -1", epoll_ctl(-1, EPOLL_CTL_ADD, s, &ev), -1, EBADF);
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) fail("pipe2: %s", errno_name(errno));
    EXPECT_CALL("epfd is the connection", epoll_ctl(s, EPOLL_CTL_ADD, p[0], &ev), -1, EINVAL);
    EXPECT_CALL("epfd is a pipe", epoll_ctl(p[0], EPOLL_CTL_ADD, s, &ev), -1, EINVAL);
    EXPECT_CALL("epfd == fd", epoll_ctl(ep, EPOLL_CTL_ADD, ep, &ev), -1, EINVAL);
    EXPECT_CALL("bad op", epoll_ctl(ep, 99, s, &ev), -1, EINVAL);
    EXPECT_CALL("ADD without an event", epoll_ctl(ep, EPOLL_CTL_ADD, s, nullptr), -1, EFAULT);
    char path[] = "/tmp/sdirect-epoll-XXXXXX";
    int file = mkstemp(path);
    if (file < 0) fail("mkstemp: %s", errno_name(errno));
    unlink(path);
    EXPECT_CALL("ADD a regular file", epoll_ctl(ep, EPOLL_CTL_ADD, file, &ev), -1, EPERM);
    close(file);
    // The key is (file, fd number): a duplicate is a second registration.
    EXPECT_CALL("ADD", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev), 0, 0);
    int d = dup(s);
    EXPECT_CALL("ADD a dup of a registered fd", epoll_ctl(ep, EPOLL_CTL_ADD, d, &ev), 0, 0);
    EXPECT_CALL("DEL the dup", epoll_ctl(ep, EPOLL_CTL_DEL, d, nullptr), 0, 0);
    close(d);
    EXPECT_CALL("DEL without an event", epoll_ctl(ep, EPOLL_CTL_DEL, s, nullptr), 0, 0);
    int ep2 = ep_new();
    EXPECT_CALL("ADD an epoll fd to another", epoll_ctl(ep, EPOLL_CTL_ADD, ep2, &ev), 0, 0);
    EXPECT_CALL("ADD a loop of epoll fds", epoll_ctl(ep2, EPOLL_CTL_ADD, ep, &ev), -1, ELOOP);
    epoll_event out[4];
    EXPECT_CALL("epoll_wait maxevents 0", epoll_wait(ep, out, 0, 0), -1, EINVAL);
    volatile int minus_one = -1;  // hidden from the compiler's bounds warnings
    EXPECT_CALL("epoll_wait maxevents -1", epoll_wait(ep, out, minus_one, 0), -1, EINVAL);
    EXPECT_CALL("epoll_wait on the connection", epoll_wait(s, out, 4, 0), -1, EINVAL);
    EXPECT_CALL("epoll_wait on fd -1", epoll_wait(-1, out, 4, 0), -1, EBADF);
    gone = dup(s);
    close(gone);
    EXPECT_CALL("epoll_wait on a closed fd", epoll_wait(gone, out, 4, 0), -1, EBADF);
    EXPECT_CALL("epoll_pwait maxevents 0", epoll_pwait(ep, out, 0, 0, nullptr), -1, EINVAL);
    close(ep2);
    close(ep);
    close(p[0]);
    close(p[1]);
    send_exit(s);
}

void drive_epoll_nested(int *fd, const Options &opt) {
    const int s = *fd;
    int inner = ep_new(), outer = ep_new();
    ep_ctl(inner, EPOLL_CTL_ADD, s, IN, 1, "inner add");
    ep_ctl(outer, EPOLL_CTL_ADD, inner, IN, 2, "outer add");
    Waiter in_poll(Api::poll, {{inner, POLLIN}});
    Waiter in_select(Api::select, {{inner, POLLIN}});
    expect_events(outer, 0, {}, "nested, nothing sent");
    expect_ready(in_poll, 0, {0}, "epoll fd in poll, nothing sent");
    expect_ready(in_select, 0, {0}, "epoll fd in select, nothing sent");

    const std::uint64_t s1 = seed_of(opt, 1), s2 = seed_of(opt, 2), s3 = seed_of(opt, 3);
    order_send(s, 10, s1, 100000, true);
    double took = 0;
    expect_events(outer, -1, {{2, IN}}, "nested: the outer set wakes", &took);
    if (took < 0.05) fail("nested: the outer set woke after %.3f s, before the data", took);
    expect_ready(in_poll, 0, {POLLIN}, "epoll fd in poll, data waiting");
    expect_ready(in_select, 0, {POLLIN}, "epoll fd in select, data waiting");
    expect_events(inner, 0, {{1, IN}}, "nested: the inner set");
    take(s, 10, s1, "nested");
    expect_events(outer, 0, {}, "nested, data read");
    expect_ready(in_poll, 0, {0}, "epoll fd in poll, data read");

    order_send(s, 10, s2, 100000, true);
    Waited w = expect_ready(in_poll, -1, {POLLIN}, "epoll fd in a blocking poll");
    if (w.took < 0.05) fail("epoll fd in poll: woke after %.3f s, before the data", w.took);
    take(s, 10, s2, "epoll fd in poll");
    order_send(s, 10, s3, 100000, true);
    expect_ready(in_select, -1, {POLLIN}, "epoll fd in a blocking select");
    take(s, 10, s3, "epoll fd in select");
    close(outer);
    close(inner);
    send_exit(s);
}

namespace {

struct Blocked {
    std::thread t;
    std::atomic<bool> done{false};
    int rc = 0;
    int err = 0;
    double took = 0;            // inside epoll_wait
    std::uint64_t woke_at = 0;  // now_ns() when it returned
    epoll_event ev[4]{};

    void start(int ep, int timeout_ms) {
        t = std::thread([this, ep, timeout_ms] {
            const std::uint64_t start = now_ns();
            Watch watch(timeout_ms < 0 ? 5 : timeout_ms / 1000.0 + 5, "blocked epoll_wait");
            rc = epoll_wait(ep, ev, 4, timeout_ms);
            err = errno;
            woke_at = now_ns();
            took = seconds_since(start);
            done = true;
        });
    }
    void join() { t.join(); }
};

}  // namespace

namespace {

// A socket already readable, added while another thread waits.
void ctl_add_ready(int s, int ep, std::uint64_t seed) {
    Blocked b;
    b.start(ep, 5000);
    order_send(s, 10, seed, 0, true);
    await_queued(s, 10, "before the ADD");
    sleep_us(50000);
    if (b.done) fail("epoll_wait on an empty set returned %d early", b.rc);
    const std::uint64_t at = now_ns();
    ep_ctl(ep, EPOLL_CTL_ADD, s, IN, 7, "ADD from another thread");
    b.join();
    if (b.rc != 1 || b.ev[0].data.u64 != 7 || b.ev[0].events != IN)
        fail("ADD of a readable socket from another thread: epoll_wait returned %d (%s) after "
             "%.3f s", b.rc, b.rc < 0 ? errno_name(b.err) : events_text(short(b.ev[0].events)).c_str(),
             b.took);
    if (seconds_since(at) > 2.5) fail("the waiter woke %.3f s after the ADD", seconds_since(at));
    take(s, 10, seed, "added while readable");
}

// Added while idle, then it becomes readable.
void ctl_add_then_ready(int s, int ep, std::uint64_t seed) {
    Blocked b;
    b.start(ep, 5000);
    sleep_us(50000);
    ep_ctl(ep, EPOLL_CTL_ADD, s, IN, 8, "ADD from another thread");
    const std::uint64_t ordered = now_ns();
    order_send(s, 10, seed, 100000, true);
    b.join();
    if (b.rc != 1 || b.ev[0].data.u64 != 8 || b.ev[0].events != IN)
        fail("socket added from another thread, then readable: epoll_wait returned %d (%s) "
             "after %.3f s", b.rc,
             b.rc < 0 ? errno_name(b.err) : events_text(short(b.ev[0].events)).c_str(), b.took);
    const double after = double(std::int64_t(b.woke_at - ordered)) / 1e9;
    if (after < 0.07) fail("the waiter woke %.3f s after the data was ordered (sent 0.1 s later)",
                           after);
    take(s, 10, seed, "added, then readable");
}

// MOD from another thread turns on EPOLLIN for data that waits.
void ctl_mod(int s, int ep, std::uint64_t seed) {
    ep_ctl(ep, EPOLL_CTL_ADD, s, 0, 9, "ADD with no events");
    order_send(s, 10, seed, 0, true);
    await_queued(s, 10, "before the MOD");
    Blocked b;
    b.start(ep, 5000);
    sleep_us(100000);
    if (b.done) fail("epoll_wait with no events asked returned %d early", b.rc);
    ep_ctl(ep, EPOLL_CTL_MOD, s, IN, 10, "MOD from another thread");
    b.join();
    if (b.rc != 1 || b.ev[0].data.u64 != 10 || b.ev[0].events != IN)
        fail("MOD from another thread: epoll_wait returned %d (%s) after %.3f s", b.rc,
             b.rc < 0 ? errno_name(b.err) : events_text(short(b.ev[0].events)).c_str(), b.took);
    take(s, 10, seed, "MOD from another thread");
}

// DEL from another thread: later data is not reported.
void ctl_del(int s, int ep, std::uint64_t seed) {
    ep_ctl(ep, EPOLL_CTL_ADD, s, IN, 11, "ADD");
    Blocked b;
    b.start(ep, 300);
    sleep_us(100000);
    ep_ctl(ep, EPOLL_CTL_DEL, s, 0, 0, "DEL from another thread");
    order_send(s, 10, seed, 0, true);
    b.join();
    if (b.rc != 0 || b.took < 0.25)
        fail("data after a DEL from another thread: epoll_wait returned %d after %.3f s, "
             "expected 0 after 0.3 s", b.rc, b.took);
    take(s, 10, seed, "after DEL");
}

}  // namespace

// The part (part_of_conn): add-ready, add-then-ready, mod or del.
void drive_epoll_thread_ctl(int *fd, const Options &opt) {
    static constexpr struct {
        const char *name;
        void (*fn)(int, int, std::uint64_t);
    } parts[] = {{"add-ready", ctl_add_ready}, {"add-then-ready", ctl_add_then_ready},
                 {"mod", ctl_mod},             {"del", ctl_del}};
    const std::string part = part_of_conn(opt);
    bool found = false;
    for (const auto &p : parts)
        if (part == p.name) {
            int ep = ep_new();
            p.fn(*fd, ep, seed_of(opt, 1));
            close(ep);
            found = true;
        }
    if (!found) fail("epoll-thread-ctl: unknown --part '%s'", part.c_str());
    send_exit(*fd);
}

// A registration belongs to the open file, not to the fd number: it lives
// while any duplicate is open, keeps its data, and cannot be removed
// through another number. Part dup: the registered number is a dup that
// gets closed; part original: the original is registered and closed.
// Closing the last reference removes it: the peer's close that follows
// reports nothing.
void drive_epoll_close(int *fd, const Options &opt) {
    const std::uint64_t seed = seed_of(opt, 1);
    const std::string part = part_of_conn(opt);
    int ep = ep_new();
    if (part == "dup") {
        int d1 = dup(*fd);
        ep_ctl(ep, EPOLL_CTL_ADD, d1, IN, 0xd1, "ADD a dup");
        if (close(d1) != 0) fail("close(dup): %s", errno_name(errno));
        order_send(*fd, 10, seed, 50000, true);
        expect_events(ep, -1, {{0xd1, IN}}, "registered dup closed, the file still open");
        EXPECT_CALL("DEL through the closed number", epoll_ctl(ep, EPOLL_CTL_DEL, d1, nullptr), -1, EBADF);
        EXPECT_CALL("DEL through another number", epoll_ctl(ep, EPOLL_CTL_DEL, *fd, nullptr), -1, ENOENT);
        take(*fd, 10, seed, "registered dup closed");
        expect_events(ep, 0, {}, "registered dup closed, data read");
    } else if (part == "original") {
        ep_ctl(ep, EPOLL_CTL_ADD, *fd, IN, 0xf0, "ADD the original");
        const int d2 = dup(*fd);
        if (close(*fd) != 0) fail("close(original): %s", errno_name(errno));
        *fd = d2;
        order_send(d2, 10, seed, 50000, true);
        expect_events(ep, -1, {{0xf0, IN}}, "original closed, a dup still open");
        EXPECT_CALL("DEL through the dup's number", epoll_ctl(ep, EPOLL_CTL_DEL, d2, nullptr), -1, ENOENT);
        take(d2, 10, seed, "original closed");
        expect_events(ep, 0, {}, "original closed, data read");
    } else {
        fail("epoll-close: unknown --part '%s'", part.c_str());
    }
    send_exit(*fd);
    if (close(*fd) != 0) fail("close(last reference): %s", errno_name(errno));
    *fd = -1;
    expect_events(ep, 150, {}, "last reference closed, then the peer closed");
    close(ep);
}

}  // namespace peer
