// One side of a soak session: sends its direction's stream and checks the
// peer's, in rounds; between rounds it may fork, exec, drop its uid or
// start a signal storm, as the session's actions allow.
#include "soak.hpp"

#include <cerrno>
#include <cstdarg>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <pthread.h>
#include <sstream>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace soak {

std::uint64_t splitmix(std::uint64_t &state) noexcept {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

namespace {

std::uint64_t word(std::uint64_t seed, std::uint64_t index) noexcept {
    std::uint64_t s = seed ^ (index * 0xd1b54a32d192ed03ull);
    return splitmix(s);
}

}  // namespace

std::uint8_t stream_byte(std::uint64_t seed, std::uint64_t offset) noexcept {
    return std::uint8_t(word(seed, offset >> 3) >> ((offset & 7) * 8));
}

void stream_fill(std::uint64_t seed, std::uint64_t offset, unsigned char *out, std::size_t n) noexcept {
    std::size_t i = 0;
    while (i < n) {
        const std::uint64_t off = offset + i;
        const std::uint64_t w = word(seed, off >> 3);
        for (unsigned b = unsigned(off & 7); b < 8 && i < n; ++b, ++i) out[i] = std::uint8_t(w >> (b * 8));
    }
}

std::size_t stream_check(std::uint64_t seed, std::uint64_t offset, const unsigned char *data,
                         std::size_t n) noexcept {
    std::size_t i = 0;
    while (i < n) {
        const std::uint64_t off = offset + i;
        const std::uint64_t w = word(seed, off >> 3);
        for (unsigned b = unsigned(off & 7); b < 8 && i < n; ++b, ++i)
            if (data[i] != std::uint8_t(w >> (b * 8))) return i;
    }
    return n;
}

namespace {

// The stream each direction carries: side 0 sends dir_seed(seed, 0).
std::uint64_t dir_seed(std::uint64_t seed, int sender) { return seed * 2 + std::uint64_t(sender) + 1; }

// Round r ends at the same offset in both directions, so that neither side
// can wait at a round's end for bytes its peer sends only in a later round.
std::uint64_t round_end(const Side &s, unsigned round) {
    std::uint64_t end = 0;
    for (unsigned r = 0; r <= round && end < s.total; ++r) {
        std::uint64_t st = s.seed ^ (0x5151ull * (r + 1));
        end += (64u << 10) + splitmix(st) % (2u << 20);
    }
    return std::min(end, s.total);
}

Shared *shared = nullptr;

void fail(const Side &s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void fail(const Side &s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(shared->error[s.side], sizeof shared->error[s.side], fmt, ap);
    va_end(ap);
    shared->outcome[s.side] = o_error;
    std::exit(3);  // exit, not _exit: the library writes its statistics at exit
}

void peer_gone(const Side &s, const char *how) {
    std::snprintf(shared->error[s.side], sizeof shared->error[s.side], "side %d: %s at received %llu, sent %llu",
                  s.side, how, (unsigned long long)s.received, (unsigned long long)s.sent);
    shared->outcome[s.side] = o_peer_gone;
    std::exit(2);
}

bool gone_errno(int e) { return e == EPIPE || e == ECONNRESET; }

struct Job {
    Side *s;
    std::uint64_t until;
    std::uint64_t rng;
    bool gone = false;
    int err = 0;
    const char *what = "";
    std::uint64_t bad_at = ~0ull;
};

// Sends [s.sent, until) of this side's stream.
void *sender(void *arg) {
    auto *j = static_cast<Job *>(arg);
    Side &s = *j->s;
    static thread_local std::vector<unsigned char> buf(1u << 20);
    const std::uint64_t seed = dir_seed(s.seed, s.side);
    while (s.sent < j->until) {
        const std::uint64_t r = splitmix(j->rng);
        const std::size_t max = std::size_t(1) << (r % 21);
        std::size_t n = std::size_t(1 + (r >> 8) % max);
        n = std::size_t(std::min<std::uint64_t>(n, j->until - s.sent));
        stream_fill(seed, s.sent, buf.data(), n);
        unsigned family = (s.actions & a_families) ? unsigned((r >> 40) % 5) : 0;
        if (family == 4 && !(s.actions & a_sendfile)) family = 0;
        ssize_t got;
        const std::size_t cut = n / 2, cut2 = cut + (n - cut) / 2;
        iovec iov[3] = {{buf.data(), cut}, {buf.data() + cut, cut2 - cut}, {buf.data() + cut2, n - cut2}};
        msghdr mh{};
        mh.msg_iov = iov;
        mh.msg_iovlen = 3;
        switch (family) {
            case 0: got = ::send(s.fd, buf.data(), n, MSG_NOSIGNAL); break;
            case 1: got = ::write(s.fd, buf.data(), n); break;
            case 2: got = ::writev(s.fd, iov, 3); break;
            case 3: got = ::sendmsg(s.fd, &mh, MSG_NOSIGNAL); break;
            default: {
                // A file of its own per call: sendfile passes the file's
                // pages on by reference, so rewriting one file in place
                // would change bytes still queued.
                const int f = ::memfd_create("soak-sendfile", MFD_CLOEXEC);
                if (f < 0 || ::write(f, buf.data(), n) != ssize_t(n)) {
                    j->err = errno;
                    j->what = "memfd for sendfile";
                    return nullptr;
                }
                if (r & (1ull << 50)) {
                    off_t off = 0;
                    got = ::sendfile(s.fd, f, &off, n);
                } else {
                    ::lseek(f, 0, SEEK_SET);
                    got = ::sendfile(s.fd, f, nullptr, n);
                }
                const int e = errno;
                ::close(f);
                errno = e;
            }
        }
        if (got < 0) {
            if (errno == EINTR) {
                shared->eintr++;
                continue;
            }
            if (gone_errno(errno)) {
                j->gone = true;
                j->what = errno == EPIPE ? "send: EPIPE" : "send: ECONNRESET";
            } else {
                j->err = errno;
                j->what = "send";
            }
            ::shutdown(s.fd, SHUT_RDWR);  // wake the receiver
            return nullptr;
        }
        s.sent += std::uint64_t(got);
        shared->sent[s.side] = s.sent;
    }
    if (s.sent == s.total) ::shutdown(s.fd, SHUT_WR);
    return nullptr;
}

// Receives and checks up to `until` of the peer's stream (at the end: until
// EOF, which must come exactly at the total).
void *receiver(void *arg) {
    auto *j = static_cast<Job *>(arg);
    Side &s = *j->s;
    static thread_local std::vector<unsigned char> buf(1u << 20);
    const std::uint64_t seed = dir_seed(s.seed, 1 - s.side);
    const bool to_eof = j->until == s.total;
    while (s.received < j->until || to_eof) {
        const std::uint64_t r = splitmix(j->rng);
        const std::size_t max = std::size_t(1) << (r % 21);
        const std::size_t n = std::size_t(1 + (r >> 8) % max);
        const unsigned family = (s.actions & a_families) ? unsigned((r >> 40) % 4) : 0;
        const std::size_t cut = n / 3;
        iovec iov[3] = {{buf.data(), cut}, {buf.data() + cut, 0}, {buf.data() + cut, n - cut}};
        msghdr mh{};
        mh.msg_iov = iov;
        mh.msg_iovlen = 3;
        ssize_t got;
        switch (family) {
            case 0: got = ::recv(s.fd, buf.data(), n, 0); break;
            case 1: got = ::read(s.fd, buf.data(), n); break;
            case 2: got = ::readv(s.fd, iov, 3); break;
            default: got = ::recvmsg(s.fd, &mh, 0); break;
        }
        if (got < 0) {
            if (errno == EINTR) {
                shared->eintr++;
                continue;
            }
            if (gone_errno(errno)) {
                j->gone = true;
                j->what = errno == EPIPE ? "recv: EPIPE" : "recv: ECONNRESET";
            } else {
                j->err = errno;
                j->what = "recv";
            }
            return nullptr;
        }
        if (got == 0) {
            if (s.received < s.total) {
                j->gone = true;
                j->what = "EOF";
            }
            return nullptr;
        }
        if (s.received + std::uint64_t(got) > s.total) {
            j->bad_at = s.total;
            j->what = "bytes past the end of the stream";
            return nullptr;
        }
        const std::size_t ok = stream_check(seed, s.received, buf.data(), std::size_t(got));
        if (ok != std::size_t(got)) {
            j->bad_at = s.received + ok;
            j->what = "wrong byte";
            return nullptr;
        }
        s.received += std::uint64_t(got);
        shared->verified[s.side] = s.received;
    }
    return nullptr;
}

void on_timer(int) {}

void timer_storm(Side &s, bool on) {
    itimerval it{};
    if (on) {
        struct sigaction sa{};
        sa.sa_handler = on_timer;
        sa.sa_flags = (splitmix(s.rng) & 1) ? SA_RESTART : 0;
        sigaction(SIGALRM, &sa, nullptr);
        const long us = 100 + long(splitmix(s.rng) % 400);
        it.it_interval = {0, us};
        it.it_value = {0, us};
    }
    setitimer(ITIMER_REAL, &it, nullptr);
}

// The child of an idle fork: it never uses the socket; with close_range it
// closes every inherited descriptor and checks that files opened on the
// freed numbers are files.
[[noreturn]] void idle_child(Side &s, bool close_all) {
    if (close_all) {
        shared->close_ranges++;
        // glibc's close_range, as programs call it (a raw syscall() is the
        // one path no preloaded library sees, as README.md says).
        ::close_range(3u, ~0u, 0);
        for (int i = 0; i < 4; ++i) {
            char path[] = "/tmp/soak-cr-XXXXXX";
            const int f = ::mkstemp(path);
            if (f < 0) _exit(0);
            ::unlink(path);
            char out[64], in[64] = {};
            std::snprintf(out, sizeof out, "file %d of %d", f, int(getpid()));
            if (::write(f, out, sizeof out) != ssize_t(sizeof out) || ::pread(f, in, sizeof in, 0) != ssize_t(sizeof in) ||
                std::memcmp(in, out, sizeof out) != 0) {
                std::snprintf(shared->error[s.side], sizeof shared->error[s.side],
                              "close_range child: file I/O on fd %d went elsewhere", f);
                shared->outcome[s.side] = o_error;
                _exit(3);
            }
        }
    } else {
        ::usleep(useconds_t(splitmix(s.rng) % 20000));
    }
    _exit(0);
}

std::vector<pid_t> idle_children;

void reap_idle(bool wait_all) {
    for (auto it = idle_children.begin(); it != idle_children.end();) {
        int st;
        if (::waitpid(*it, &st, wait_all ? 0 : WNOHANG) == *it) it = idle_children.erase(it);
        else ++it;
    }
}

bool dropped_uid = false;

void between_rounds(Side &s) {
    reap_idle(false);
    const std::uint64_t r = splitmix(s.rng);
    const unsigned pick = unsigned(r % 10);
    if ((s.actions & a_timer) && pick < 2) timer_storm(s, pick == 0);
    if ((s.actions & a_fork_idle) && pick == 3) {
        const bool cr = (s.actions & a_close_range) && (r >> 20) % 2;
        const pid_t pid = ::fork();
        if (pid == 0) idle_child(s, cr);
        if (pid > 0) {
            shared->forks++;
            idle_children.push_back(pid);
        }
    }
    if ((s.actions & a_fork_handoff) && pick == 4) {
        reap_idle(true);
        timer_storm(s, false);
        const pid_t pid = ::fork();
        if (pid > 0) {
            // The parent leaves the connection to its child, as a server
            // that forks per connection does.
            shared->forks++;
            ::close(s.fd);
            int st = 0;
            while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
            _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 4);
        }
        if (pid == 0) shared->pid[s.side] = getpid();
    }
    if ((s.actions & a_exec) && pick == 5 && !dropped_uid) {
        reap_idle(true);
        timer_storm(s, false);
        shared->execs++;
        ::fcntl(s.fd, F_SETFD, 0);
        ::fcntl(s.shm_fd, F_SETFD, 0);
        const std::string state = encode(s);
        ::execl("/proc/self/exe", "soak-worker", "resume", state.c_str(), (char *)nullptr);
        fail(s, "exec: %s", std::strerror(errno));
    }
    if ((s.actions & a_setuid) && pick == 6 && !dropped_uid && geteuid() == 0) {
        reap_idle(true);
        if (::setgid(65534) == 0 && ::setuid(65534) == 0) {
            dropped_uid = true;
            shared->uid_drops++;
        }
    }
}

}  // namespace

void run_side(Side s) {
    void *m = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED, s.shm_fd, 0);
    if (m == MAP_FAILED) _exit(5);
    shared = static_cast<Shared *>(m);
    shared->pid[s.side] = getpid();
    ::signal(SIGPIPE, SIG_IGN);
    ::fcntl(s.fd, F_SETFD, FD_CLOEXEC);
    ::fcntl(s.shm_fd, F_SETFD, FD_CLOEXEC);
    while (s.sent < s.total || s.received < s.total) {
        const std::uint64_t end = round_end(s, s.round);
        Job tx{&s, end, splitmix(s.rng)};
        Job rx{&s, end, splitmix(s.rng)};
        pthread_t t;
        const bool send_more = s.sent < end;
        if (send_more) pthread_create(&t, nullptr, sender, &tx);
        receiver(&rx);
        if (send_more) pthread_join(t, nullptr);
        if (rx.bad_at != ~0ull) fail(s, "side %d: %s at offset %llu", s.side, rx.what, (unsigned long long)rx.bad_at);
        if (rx.err) fail(s, "side %d: %s: %s", s.side, rx.what, std::strerror(rx.err));
        if (tx.err) fail(s, "side %d: %s: %s", s.side, tx.what, std::strerror(tx.err));
        if (rx.gone) peer_gone(s, rx.what);
        if (tx.gone) peer_gone(s, tx.what);
        ++s.round;
        if (s.sent < s.total || s.received < s.total) between_rounds(s);
    }
    timer_storm(s, false);
    reap_idle(true);
    shared->outcome[s.side] = o_done;
    std::exit(0);
}

std::string encode(const Side &s) {
    std::ostringstream o;
    o << s.fd << ' ' << s.side << ' ' << s.shm_fd << ' ' << s.seed << ' ' << s.total << ' ' << s.sent << ' '
      << s.received << ' ' << s.rng << ' ' << s.actions << ' ' << s.round;
    return o.str();
}

bool decode(const std::string &text, Side *s) {
    std::istringstream in(text);
    in >> s->fd >> s->side >> s->shm_fd >> s->seed >> s->total >> s->sent >> s->received >> s->rng >>
        s->actions >> s->round;
    return bool(in);
}

unsigned parse_actions(const std::string &list) {
    static const std::pair<const char *, unsigned> names[] = {
        {"fork", a_fork_handoff}, {"fork-idle", a_fork_idle}, {"close-range", a_close_range},
        {"exec", a_exec},         {"stop", a_stop},           {"kill", a_kill},
        {"setuid", a_setuid},     {"timer", a_timer},         {"families", a_families},
        {"sendfile", a_sendfile}};
    unsigned out = 0;
    std::stringstream in(list);
    for (std::string item; std::getline(in, item, ',');) {
        if (item == "all") out = ~0u;
        for (auto [name, bit] : names)
            if (item == name) out |= bit;
    }
    return out;
}

std::string action_names(unsigned actions) {
    static const char *const names[] = {"fork",  "fork-idle", "close-range", "exec",     "stop",
                                        "kill",  "setuid",    "timer",       "families", "sendfile"};
    std::string out;
    for (unsigned i = 0; i < 10; ++i)
        if (actions & (1u << i)) out += std::string(out.empty() ? "" : ",") + names[i];
    return out;
}

}  // namespace soak
