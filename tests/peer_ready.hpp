// Readiness scenarios' shared pieces: one waiting interface over every
// readiness call (poll, ppoll, their FORTIFY variants, select, pselect,
// epoll_wait, epoll_pwait, epoll_pwait2), a deadline for calls that may
// block forever, signal helpers and the window filler.
//
// Expectations are written once, as the poll bits a socket has ("full"
// readiness: POLLIN, POLLOUT, POLLRDHUP, POLLHUP, POLLERR); each call's
// Waiter projects them onto what that call can report, the way the kernel
// does (select: HUP and ERR count as readable, ERR as writable).
#pragma once
#include "peer_drivers.hpp"

#include <condition_variable>
#include <csignal>
#include <ctime>
#include <mutex>
#include <poll.h>
#include <string>
#include <sys/time.h>
#include <thread>
#include <vector>

namespace peer {

enum class Api : std::uint32_t {
    poll,          // plain poll (the array's size is hidden from FORTIFY)
    poll_chk,      // poll on a known-size array: FORTIFY calls __poll_chk
    ppoll,
    ppoll_chk,     // __ppoll_chk
    select,
    pselect,
    epoll,         // epoll_wait on a set built once per Waiter
    epoll_pwait,
    epoll_pwait2,  // timespec timeout; a skip where libc or kernel lack it
    count
};

const char *api_name(Api api);
Api parse_api(const std::string &name);
// --apis a,b,c (default: poll).
std::vector<Api> apis_of(const Options &opt);
// The call for this connection: --apis rotated by --conn-index.
Api api_of_conn(const Options &opt);
// The part of a scenario this connection runs: --part, or the entry of
// the list --parts that --conn-index picks.
std::string part_of_conn(const Options &opt);
bool api_has_mask(Api api);
bool api_is_select(Api api);
bool api_is_epoll(Api api);
// Exits 77 when this libc or kernel lacks the call.
void require_api(Api api);

struct Want {
    int fd;
    short events;  // poll bits
};

struct Waited {
    int rc = 0;
    int err = 0;
    double took = 0;             // seconds
    std::vector<short> revents;  // per Want, in poll bits
};

class Waiter {
public:
    Waiter(Api api, std::vector<Want> wants);
    ~Waiter();
    Waiter(const Waiter &) = delete;
    Waiter &operator=(const Waiter &) = delete;

    // timeout_ms < 0 waits without a timeout; the caller bounds it (Watch).
    // mask: only for the calls that take one.
    Waited wait(int timeout_ms, const sigset_t *mask = nullptr);
    // What this call reports for wants[i] when the fd's readiness is `full`.
    short project(std::size_t i, short full) const;
    int expected_rc(const std::vector<short> &full) const;
    Api api() const { return api_; }
    // The timeout argument after the call (select writes the time left
    // into it; ppoll and pselect must leave theirs alone).
    timeval tv_after{};
    timespec ts_after{};

private:
    Api api_;
    std::vector<Want> wants_;
    int epfd_ = -1;
};

std::string events_text(short ev);

// One wait; fails unless rc and every fd's events are what `full` gives.
Waited expect_ready(Waiter &w, int timeout_ms, const std::vector<short> &full,
                    const char *what, const sigset_t *mask = nullptr);
// Waits until the answer is `full`; every answer before must be a subset
// of it (readiness only grows here). Bounded by `seconds`.
Waited expect_ready_within(Waiter &w, double seconds, const std::vector<short> &full,
                           const char *what);

// Fails the process when not cancelled (destroyed) within `seconds`: the
// bound on a call that has no timeout of its own. Armed on one watchdog
// thread per process, made at the first watch: a thread made per watch
// came between an event's scheduling and the wait's clock (under TSan,
// pthread_create waits for the new thread to start), and a wait measured
// as shorter than the delay of its event.
class Watch {
public:
    Watch(double seconds, std::string what);
    ~Watch();
    Watch(const Watch &) = delete;
    Watch &operator=(const Watch &) = delete;

private:
    std::uint64_t id_ = 0;
};

double seconds_since(std::uint64_t start_ns);

// `w` with its duration counted from `since_ns`, taken before the event it
// waited for was set going (data ordered from the peer, a timer, a
// signal), to now. A lower bound then holds whatever ran between the two
// (a thread's start-up, a loaded host: under TSan the wait's own clock
// started up to 30 ms after a helper thread's), and a wait that returned
// long before its event still fails it.
Waited since(Waited w, std::uint64_t since_ns);

// ---- signals -----------------------------------------------------------------

// SIGUSR1 counts into usr1_hits().
void install_usr1(int sa_flags);
void uninstall_usr1();
int usr1_hits();
// pthread_kill(target, SIGUSR1) after delay_us, from a helper thread.
std::thread usr1_later(pthread_t target, std::uint64_t delay_us);
bool usr1_blocked();   // in the calling thread's mask
bool usr1_pending();

// ---- commands and the window ---------------------------------------------------

// The responder sends size bytes of seed after pre_delay_us; whole: in one
// send call (one arrival), else in random pieces.
void order_send(int fd, std::uint64_t size, std::uint64_t seed, std::uint32_t pre_delay_us,
                bool whole);
// Waits (FIONREAD, bounded 5 s) until n bytes are queued for reading.
void await_queued(int fd, int n, const char *what);
// Receives exactly size bytes of seed starting at stream offset 0.
void take(int fd, std::uint64_t size, std::uint64_t seed, const char *what);

// A window fill: the responder is told to receive `total` bytes of `seed`
// but to start only after pause_us; the driver then sends without
// blocking until EAGAIN.
struct Fill {
    std::uint64_t seed = 0;
    std::uint64_t total = 0;
    std::uint64_t off = 0;        // bytes sent so far
    std::uint64_t first = 0;      // what the first (large) send returned
    int eagains = 0;
    // The first send's bytes were made before the peer's pause began
    // (start_fill): 16 MiB of pattern take long enough under a sanitizer
    // to use up the pause, and the peer would read before the window fills.
    bool first_ready = false;
};
Fill start_fill(int fd, std::uint64_t total, std::uint64_t seed, std::uint32_t pause_us);
// Sends with `flags` (MSG_DONTWAIT, or 0 on a non-blocking socket) through
// family `tx`, first one large call, then until -1 EAGAIN and no POLLOUT
// for 30 ms (the send queue may still move into the peer's buffer).
void fill_until_eagain(int fd, Fill &f, Tx tx, int flags, const char *what);
// Sends the rest (waiting for POLLOUT when the socket is non-blocking) and
// takes the responder's ack.
void finish_fill(int fd, Fill &f, const char *what);

// ---- non-blocking connect and accept (peer_ready_nonblock.cpp) ------------------

// --accept nonblock: EAGAIN checks on the listener before its port is
// published, then each connection after poll/epoll reports it.
void listener_nonblocking_prelude(int listener);
int accept_nonblocking(int listener, std::uint64_t index);
// --connect nonblock: refused connects to a closed port first, then each
// connection by EINPROGRESS, POLLOUT and SO_ERROR.
void refused_connects(int family);
int connect_nonblocking(int family, std::uint16_t port, std::uint64_t index);

}  // namespace peer
