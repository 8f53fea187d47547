// The waiting interface of the readiness scenarios (see peer_ready.hpp).
#include "peer_ready.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <unistd.h>

namespace peer {

namespace {

constexpr const char *api_names[] = {"poll",   "poll_chk", "ppoll",       "ppoll_chk",   "select",
                                     "pselect", "epoll",   "epoll_pwait", "epoll_pwait2"};
static_assert(sizeof(api_names) / sizeof(api_names[0]) == std::size_t(Api::count));

constexpr std::size_t kMaxWants = 16;

// The FORTIFY wrappers call the checking variant only when the array's size
// is known and the count is not a constant: a stack array and a volatile
// count. The plain variants get a pointer the compiler cannot see through.
template <typename T> T *opaque(T *p) {
    asm volatile("" : "+r"(p));
    return p;
}

__attribute__((noinline)) int poll_known_size(const std::vector<Want> &w, int timeout,
                                              short *out) {
    pollfd fds[kMaxWants];
    volatile nfds_t n = w.size();
    for (std::size_t i = 0; i < w.size(); ++i) fds[i] = {w[i].fd, w[i].events, 0};
    int rc = poll(fds, n, timeout);
    for (std::size_t i = 0; i < w.size(); ++i) out[i] = fds[i].revents;
    return rc;
}

__attribute__((noinline)) int ppoll_known_size(const std::vector<Want> &w, const timespec *ts,
                                               const sigset_t *mask, short *out) {
    pollfd fds[kMaxWants];
    volatile nfds_t n = w.size();
    for (std::size_t i = 0; i < w.size(); ++i) fds[i] = {w[i].fd, w[i].events, 0};
    int rc = ppoll(fds, n, ts, mask);
    for (std::size_t i = 0; i < w.size(); ++i) out[i] = fds[i].revents;
    return rc;
}

short expand(short full) {
    if (full & POLLIN) full |= POLLRDNORM;
    if (full & POLLOUT) full |= POLLWRNORM;
    return full;
}

bool subset(short a, short b) { return (a & ~b) == 0; }

std::atomic<int> hits{0};

void on_usr1(int) { hits.fetch_add(1); }

}  // namespace

const char *api_name(Api api) { return api_names[std::size_t(api) % std::size_t(Api::count)]; }

Api parse_api(const std::string &name) {
    for (std::size_t i = 0; i < std::size_t(Api::count); ++i)
        if (name == api_names[i]) return Api(i);
    fail("unknown readiness call '%s'", name.c_str());
}

std::vector<Api> apis_of(const Options &opt) {
    const std::string list = opt.get("apis", "poll");
    std::vector<Api> out;
    for (std::size_t pos = 0; pos <= list.size();) {
        std::size_t end = list.find(',', pos);
        if (end == std::string::npos) end = list.size();
        if (end > pos) out.push_back(parse_api(list.substr(pos, end - pos)));
        pos = end + 1;
    }
    if (out.empty()) fail("--apis is empty");
    return out;
}

Api api_of_conn(const Options &opt) {
    const auto apis = apis_of(opt);
    return apis[opt.num("conn-index", 0) % apis.size()];
}

std::string part_of_conn(const Options &opt) {
    if (!opt.has("parts")) return opt.get("part");
    const std::string list = opt.get("parts");
    std::vector<std::string> parts;
    for (std::size_t pos = 0; pos <= list.size();) {
        std::size_t end = list.find(',', pos);
        if (end == std::string::npos) end = list.size();
        if (end > pos) parts.push_back(list.substr(pos, end - pos));
        pos = end + 1;
    }
    if (parts.empty()) fail("--parts is empty");
    return parts[opt.num("conn-index", 0) % parts.size()];
}

bool api_has_mask(Api api) {
    return api == Api::ppoll || api == Api::ppoll_chk || api == Api::pselect ||
           api == Api::epoll_pwait || api == Api::epoll_pwait2;
}

bool api_is_select(Api api) { return api == Api::select || api == Api::pselect; }

bool api_is_epoll(Api api) {
    return api == Api::epoll || api == Api::epoll_pwait || api == Api::epoll_pwait2;
}

void require_api(Api api) {
    if (api != Api::epoll_pwait2) return;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) fail("epoll_create1: %s", errno_name(errno));
    epoll_event ev{};
    timespec zero{0, 0};
    int rc = epoll_pwait2(ep, &ev, 1, &zero, nullptr);
    int err = errno;
    close(ep);
    if (rc < 0 && err == ENOSYS) skip("the kernel has no epoll_pwait2");
    if (rc != 0) fail("epoll_pwait2 on an empty set: %d (%s)", rc, errno_name(err));
#else
    skip("this libc has no epoll_pwait2");
#endif
}

// ---- Waiter ----------------------------------------------------------------------

Waiter::Waiter(Api api, std::vector<Want> wants) : api_(api), wants_(std::move(wants)) {
    if (wants_.size() > kMaxWants) fail("too many fds for one wait");
    require_api(api_);
    if (!api_is_epoll(api_)) return;
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) fail("epoll_create1: %s", errno_name(errno));
    for (std::size_t i = 0; i < wants_.size(); ++i) {
        epoll_event ev{};
        ev.events = std::uint32_t(std::uint16_t(wants_[i].events));
        ev.data.u64 = i;
        if (epoll_ctl(epfd_, EPOLL_CTL_ADD, wants_[i].fd, &ev) != 0)
            fail("epoll_ctl(ADD, fd %d, %s): %s", wants_[i].fd,
                 events_text(wants_[i].events).c_str(), errno_name(errno));
    }
}

Waiter::~Waiter() {
    if (epfd_ >= 0) close(epfd_);
}

Waited Waiter::wait(int timeout_ms, const sigset_t *mask) {
    if (mask && !api_has_mask(api_)) fail("%s takes no signal mask", api_name(api_));
    Waited out;
    out.revents.assign(wants_.size(), 0);
    timespec ts{timeout_ms / 1000, long(timeout_ms % 1000) * 1000000L};
    timespec *tsp = timeout_ms < 0 ? nullptr : &ts;
    const std::uint64_t start = now_ns();
    switch (api_) {
    case Api::poll:
    case Api::ppoll: {
        std::vector<pollfd> fds;
        for (const Want &w : wants_) fds.push_back({w.fd, w.events, 0});
        pollfd *p = opaque(fds.data());
        out.rc = api_ == Api::poll ? poll(p, fds.size(), timeout_ms)
                                   : ppoll(p, fds.size(), tsp, mask);
        out.err = errno;
        for (std::size_t i = 0; i < fds.size(); ++i) out.revents[i] = fds[i].revents;
        break;
    }
    case Api::poll_chk:
        out.rc = poll_known_size(wants_, timeout_ms, out.revents.data());
        out.err = errno;
        break;
    case Api::ppoll_chk:
        out.rc = ppoll_known_size(wants_, tsp, mask, out.revents.data());
        out.err = errno;
        break;
    case Api::select:
    case Api::pselect: {
        fd_set rd, wr, ex;
        FD_ZERO(&rd);
        FD_ZERO(&wr);
        FD_ZERO(&ex);
        int nfds = 0;
        for (const Want &w : wants_) {
            if (w.events & POLLIN) FD_SET(w.fd, &rd);
            if (w.events & POLLOUT) FD_SET(w.fd, &wr);
            if (w.events & POLLPRI) FD_SET(w.fd, &ex);
            nfds = std::max(nfds, w.fd + 1);
        }
        if (api_ == Api::select) {
            timeval tv{timeout_ms / 1000, long(timeout_ms % 1000) * 1000L};
            out.rc = select(nfds, &rd, &wr, &ex, timeout_ms < 0 ? nullptr : &tv);
            out.err = errno;
            tv_after = tv;
        } else {
            out.rc = pselect(nfds, &rd, &wr, &ex, tsp, mask);
            out.err = errno;
            ts_after = ts;
        }
        if (out.rc >= 0)
            for (std::size_t i = 0; i < wants_.size(); ++i) {
                const int fd = wants_[i].fd;
                out.revents[i] = short((FD_ISSET(fd, &rd) ? POLLIN : 0) |
                                       (FD_ISSET(fd, &wr) ? POLLOUT : 0) |
                                       (FD_ISSET(fd, &ex) ? POLLPRI : 0));
            }
        break;
    }
    case Api::epoll:
    case Api::epoll_pwait:
    case Api::epoll_pwait2: {
        epoll_event evs[kMaxWants + 1];
        const int max = int(wants_.size()) + 1;
        if (api_ == Api::epoll) {
            out.rc = epoll_wait(epfd_, evs, max, timeout_ms);
        } else if (api_ == Api::epoll_pwait) {
            out.rc = epoll_pwait(epfd_, evs, max, timeout_ms, mask);
        } else {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
            out.rc = epoll_pwait2(epfd_, evs, max, tsp, mask);
#else
            out.rc = -1;
            errno = ENOSYS;
#endif
        }
        out.err = errno;
        for (int i = 0; i < out.rc; ++i) {
            const std::uint64_t idx = evs[i].data.u64;
            if (idx >= wants_.size())
                fail("%s returned data.u64 %llu, registered 0..%zu", api_name(api_),
                     (unsigned long long)idx, wants_.size() - 1);
            if (out.revents[idx] != 0)
                fail("%s reported fd %d twice in one call", api_name(api_), wants_[idx].fd);
            out.revents[idx] = short(evs[i].events);
            if (evs[i].events & ~0xffffu)
                fail("%s reported events 0x%x outside the poll bits", api_name(api_),
                     unsigned(evs[i].events));
        }
        break;
    }
    case Api::count: fail("bad api");
    }
    out.took = seconds_since(start);
    if (out.rc >= 0) out.err = 0;
    return out;
}

short Waiter::project(std::size_t i, short full) const {
    full = expand(full);
    const short ev = wants_[i].events;
    if (api_is_select(api_)) {
        const bool r = (ev & POLLIN) && (full & (POLLIN | POLLHUP | POLLERR));
        const bool w = (ev & POLLOUT) && (full & (POLLOUT | POLLERR));
        const bool x = (ev & POLLPRI) && (full & POLLPRI);
        return short((r ? POLLIN : 0) | (w ? POLLOUT : 0) | (x ? POLLPRI : 0));
    }
    return short(full & (ev | POLLHUP | POLLERR));
}

int Waiter::expected_rc(const std::vector<short> &full) const {
    int rc = 0;
    for (std::size_t i = 0; i < wants_.size(); ++i) {
        const short p = project(i, full[i]);
        if (api_is_select(api_))
            rc += !!(p & POLLIN) + !!(p & POLLOUT) + !!(p & POLLPRI);
        else
            rc += p != 0;
    }
    return rc;
}

std::string events_text(short ev) {
    static constexpr struct {
        short bit;
        const char *name;
    } names[] = {{POLLIN, "IN"},         {POLLPRI, "PRI"},        {POLLOUT, "OUT"},
                 {POLLERR, "ERR"},       {POLLHUP, "HUP"},        {POLLNVAL, "NVAL"},
                 {POLLRDNORM, "RDNORM"}, {POLLRDBAND, "RDBAND"},  {POLLWRNORM, "WRNORM"},
                 {POLLWRBAND, "WRBAND"}, {short(POLLRDHUP), "RDHUP"}};
    std::string out;
    short rest = ev;
    for (const auto &n : names)
        if (ev & n.bit) {
            out += (out.empty() ? "" : "|") + std::string(n.name);
            rest = short(rest & ~n.bit);
        }
    if (rest) out += (out.empty() ? "" : "|") + std::to_string(rest);
    return out.empty() ? "0" : out;
}

namespace {

std::string mismatch(const Waiter &w, const Waited &got, const std::vector<short> &full) {
    std::string text;
    for (std::size_t i = 0; i < full.size(); ++i) {
        const short want = w.project(i, full[i]);
        text += " [" + std::to_string(i) + "] got " + events_text(got.revents[i]) +
                (got.revents[i] == want ? "" : " expected " + events_text(want)) + ";";
    }
    return text;
}

bool matches(const Waiter &w, const Waited &got, const std::vector<short> &full) {
    if (got.rc != w.expected_rc(full)) return false;
    for (std::size_t i = 0; i < full.size(); ++i)
        if (got.revents[i] != w.project(i, full[i])) return false;
    return true;
}

}  // namespace

Waited expect_ready(Waiter &w, int timeout_ms, const std::vector<short> &full,
                    const char *what, const sigset_t *mask) {
    Waited got;
    {
        Watch watch(timeout_ms < 0 ? 5 : timeout_ms / 1000.0 + 5, what);
        got = w.wait(timeout_ms, mask);
    }
    if (got.rc < 0 || !matches(w, got, full))
        fail("%s [%s, timeout %d ms]: returned %d (%s) after %.3f s, expected %d;%s", what,
             api_name(w.api()), timeout_ms, got.rc, got.rc < 0 ? errno_name(got.err) : "-",
             got.took, w.expected_rc(full), mismatch(w, got, full).c_str());
    return got;
}

Waited expect_ready_within(Waiter &w, double seconds, const std::vector<short> &full,
                           const char *what) {
    const std::uint64_t start = now_ns();
    Waited got;
    for (int i = 0; i < 100000; ++i) {
        const double left = seconds - seconds_since(start);
        got = w.wait(left <= 0 ? 0 : int(left * 1000) + 1);
        if (got.rc < 0 && got.err == EINTR) continue;
        if (got.rc < 0)
            fail("%s [%s]: returned -1 (%s)", what, api_name(w.api()), errno_name(got.err));
        if (matches(w, got, full)) {
            got.took = seconds_since(start);
            return got;
        }
        for (std::size_t k = 0; k < full.size(); ++k)
            if (!subset(got.revents[k], w.project(k, full[k])))
                fail("%s [%s]: on the way, returned %d with%s", what, api_name(w.api()), got.rc,
                     mismatch(w, got, full).c_str());
        if (left <= 0) break;
        // Some readiness is already there: do not spin at full speed.
        if (got.rc > 0) sleep_us(1000);
    }
    fail("%s [%s]: not reached within %.1f s; last answer %d with%s", what, api_name(w.api()),
         seconds, got.rc, mismatch(w, got, full).c_str());
}

// ---- Watch -----------------------------------------------------------------------

namespace {

struct Watchdog {
    struct Armed {
        std::chrono::steady_clock::time_point due;
        double seconds;
        std::string what;
    };
    std::mutex m;
    std::condition_variable cv;
    std::map<std::uint64_t, Armed> armed;
    std::uint64_t next = 0;

    void run() {
        std::unique_lock<std::mutex> lock(m);
        for (int i = 0; i < 100000000; ++i) {
            if (armed.empty()) {
                cv.wait(lock);
                continue;
            }
            auto first = armed.begin();
            for (auto it = armed.begin(); it != armed.end(); ++it)
                if (it->second.due < first->second.due) first = it;
            if (std::chrono::steady_clock::now() >= first->second.due)
                fail("%s: still blocked after %.1f s", first->second.what.c_str(),
                     first->second.seconds);
            // A copy: the entry goes while we wait (its Watch ended).
            const auto due = first->second.due;
            cv.wait_until(lock, due);
        }
    }
};

std::mutex made_lock;

// One per process: a forked child has none of its parent's threads (and
// its copy of the lock may have been held by one). Never freed: its
// detached thread lives as long as the process.
Watchdog &watchdog() {
    static Watchdog *dog = nullptr;
    static pid_t owner = 0;
    static std::once_flag once;
    std::call_once(once, [] {
        pthread_atfork(nullptr, nullptr, [] { new (&made_lock) std::mutex(); });
    });
    std::lock_guard<std::mutex> lock(made_lock);
    if (!dog || owner != getpid()) {
        dog = new Watchdog;
        owner = getpid();
        // The scenarios' signals are for the threads they target.
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        std::thread([d = dog] { d->run(); }).detach();
        pthread_sigmask(SIG_SETMASK, &old, nullptr);
    }
    return *dog;
}

}  // namespace

Watch::Watch(double seconds, std::string what) {
    Watchdog &dog = watchdog();
    std::lock_guard<std::mutex> lock(dog.m);
    id_ = ++dog.next;
    const auto due = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(seconds));
    dog.armed.emplace(id_, Watchdog::Armed{due, seconds, std::move(what)});
    dog.cv.notify_all();
}

Watch::~Watch() {
    Watchdog &dog = watchdog();
    std::lock_guard<std::mutex> lock(dog.m);
    dog.armed.erase(id_);
    dog.cv.notify_all();
}

double seconds_since(std::uint64_t start_ns) { return double(now_ns() - start_ns) / 1e9; }

Waited since(Waited w, std::uint64_t since_ns) {
    w.took = seconds_since(since_ns);
    return w;
}

// ---- signals ---------------------------------------------------------------------

void install_usr1(int sa_flags) {
    struct sigaction sa{};
    sa.sa_handler = on_usr1;
    sa.sa_flags = sa_flags;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, nullptr) != 0) fail("sigaction: %s", errno_name(errno));
}

void uninstall_usr1() { signal(SIGUSR1, SIG_DFL); }

int usr1_hits() { return hits.load(); }

std::thread usr1_later(pthread_t target, std::uint64_t delay_us) {
    return std::thread([target, delay_us] {
        sleep_us(delay_us);
        pthread_kill(target, SIGUSR1);
    });
}

bool usr1_blocked() {
    sigset_t cur;
    pthread_sigmask(SIG_SETMASK, nullptr, &cur);
    return sigismember(&cur, SIGUSR1) == 1;
}

bool usr1_pending() {
    sigset_t p;
    sigpending(&p);
    return sigismember(&p, SIGUSR1) == 1;
}

// ---- commands and the window ---------------------------------------------------------

void order_send(int fd, std::uint64_t size, std::uint64_t seed, std::uint32_t pre_delay_us,
                bool whole) {
    Cmd cmd;
    cmd.op = Op::send;
    cmd.api = std::uint32_t(Tx::send);
    cmd.size = size;
    cmd.seed = seed;
    cmd.chunk = std::uint32_t(size < 65536 ? size : 65536);
    cmd.pre_delay_us = pre_delay_us;
    cmd.flags = whole ? kWhole : 0;
    send_cmd(fd, cmd);
}

void await_queued(int fd, int n, const char *what) {
    int avail = -1;
    const std::uint64_t start = now_ns();
    for (int i = 0; i < 100000; ++i) {
        if (ioctl(fd, FIONREAD, &avail) != 0) fail("%s: FIONREAD: %s", what, errno_name(errno));
        if (avail >= n) break;
        if (seconds_since(start) > 5) break;
        sleep_us(200);
    }
    if (avail != n) fail("%s: %d bytes queued, expected %d", what, avail, n);
}

void take(int fd, std::uint64_t size, std::uint64_t seed, const char *what) {
    recv_pattern(fd, Rx::recv, seed, size, std::uint32_t(size < 65536 ? size : 65536), what);
}

namespace {

std::vector<char> &fill_buffer() {
    static thread_local std::vector<char> buf;
    return buf;
}

constexpr std::size_t kFirstSend = 16u << 20;  // more than any send buffer holds

}  // namespace

Fill start_fill(int fd, std::uint64_t total, std::uint64_t seed, std::uint32_t pause_us) {
    Fill f;
    f.seed = seed;
    f.total = total;
    std::vector<char> &buf = fill_buffer();
    if (buf.size() < kFirstSend) buf.resize(kFirstSend);
    pattern_fill(seed, 0, buf.data(), std::size_t(std::min<std::uint64_t>(kFirstSend, total)));
    f.first_ready = true;
    Cmd cmd;
    cmd.op = Op::recv;
    cmd.api = std::uint32_t(Rx::recv);
    cmd.size = total;
    cmd.seed = seed;
    cmd.pre_delay_us = pause_us;
    send_cmd(fd, cmd);
    return f;
}

void fill_until_eagain(int fd, Fill &f, Tx tx, int flags, const char *what) {
    std::vector<char> &buf = fill_buffer();
    if (buf.size() < kFirstSend) buf.resize(kFirstSend);
    for (int i = 0; i < 100000; ++i) {
        // The first call asks for more than any send buffer holds.
        const std::size_t want = std::size_t(std::min<std::uint64_t>(i == 0 ? kFirstSend : 65536,
                                                                     f.total - f.off));
        if (want == 0) fail("%s: %llu bytes sent without EAGAIN", what,
                            (unsigned long long)f.total);
        if (!(i == 0 && f.off == 0 && f.first_ready)) pattern_fill(f.seed, f.off, buf.data(), want);
        const std::uint64_t call_t0 = now_ns();
        ssize_t n = tx_once(fd, tx, buf.data(), want, flags | MSG_NOSIGNAL);
        const int err = errno;
        // The peer reads nothing for a few hundred ms: a call that lasts
        // that long waited for it.
        if (seconds_since(call_t0) > 0.25)
            fail("%s: a %zu-byte non-blocking %s at stream offset %llu blocked for %.3f s "
                 "(returned %zd %s)", what, want, tx_name(tx), (unsigned long long)f.off,
                 seconds_since(call_t0), n, n < 0 ? errno_name(err) : "");
        errno = err;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (i == 0) fail("%s: %s on an empty connection: EAGAIN", what, tx_name(tx));
            ++f.eagains;
            // The send queue may still be draining into the peer's receive
            // buffer: full means no room comes back for a while.
            pollfd p{fd, POLLOUT, 0};
            const int r = poll(&p, 1, 30);
            if (r == 0) return;
            if (r < 0 && errno != EINTR) fail("%s: poll: %s", what, errno_name(errno));
            continue;
        }
        if (n <= 0) fail("%s: %s: %zd (%s)", what, tx_name(tx), n, n < 0 ? errno_name(errno) : "0");
        if (i == 0) {
            f.first = std::uint64_t(n);
            if (std::size_t(n) >= want)
                fail("%s: a %zu-byte non-blocking %s to a peer that does not read returned "
                     "%zd, expected a partial count", what, want, tx_name(tx), n);
        }
        count_tx(fd, std::uint64_t(n));
        f.off += std::uint64_t(n);
    }
    fail("%s: no EAGAIN after 100000 sends", what);
}

void finish_fill(int fd, Fill &f, const char *what) {
    std::vector<char> &buf = fill_buffer();
    if (buf.size() < 65536) buf.resize(65536);
    const bool nonblocking = fcntl(fd, F_GETFL) & O_NONBLOCK;
    const std::uint64_t start = now_ns();
    while (f.off < f.total) {
        if (seconds_since(start) > 20) fail("%s: the rest was not sent within 20 s", what);
        const std::size_t want = std::size_t(std::min<std::uint64_t>(65536, f.total - f.off));
        pattern_fill(f.seed, f.off, buf.data(), want);
        ssize_t n = send(fd, buf.data(), want, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && nonblocking && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            pollfd p{fd, POLLOUT, 0};
            if (poll(&p, 1, 5000) != 1) fail("%s: not writable again within 5 s", what);
            continue;
        }
        if (n <= 0) fail("%s: send: %zd (%s)", what, n, n < 0 ? errno_name(errno) : "0");
        count_tx(fd, std::uint64_t(n));
        f.off += std::uint64_t(n);
    }
    if (nonblocking) {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 20000) != 1) fail("%s: no ack within 20 s", what);
    }
    expect_ack(fd, what);
}

}  // namespace peer
