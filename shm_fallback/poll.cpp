// poll, ppoll, select and pselect over sockets whose bytes may travel on
// the fabric (readiness.hpp); select is poll's answer in select's sets.
#include "readiness.hpp"
#include "readiness_impl.hpp"

#include "kernel_sleep.hpp"
#include "table.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <sys/socket.h>
#include <vector>

namespace sd::fallback {

using namespace detail;

namespace {

// The companion's answers that mean its TCP peer went away.
constexpr short kKernelEnd = POLLIN | POLLRDHUP | POLLHUP | POLLERR;

// Stack storage for small sets, heap for large ones.
template <typename T, std::size_t N>
class Scratch {
  public:
    explicit Scratch(std::size_t n) noexcept
        : p_(n <= N ? inline_ : static_cast<T *>(std::malloc(n * sizeof(T)))) {}
    ~Scratch() {
        if (p_ != inline_) std::free(p_);
    }
    Scratch(const Scratch &) = delete;
    Scratch &operator=(const Scratch &) = delete;
    T *get() const noexcept { return p_; }
    T &operator[](std::size_t i) noexcept { return p_[i]; }

  private:
    T inline_[N];
    T *p_;
};

struct PollCtx {
    pollfd *fds;     // the application's
    pollfd *k;       // what the kernel is asked
    Stream **ours;   // our sockets (reference held) or null
    EpollSet **eps;  // epoll sets of ours or null
    bool *user;      // readiness from our state this round
    short *bits;
    nfds_t n;
    // All the kernel would be asked this round is direct connections'
    // companions for their peers' death (POLLRDHUP): no fd of the
    // application's own is the kernel's to answer.
    bool hints_only = false;
    // Some socket's readiness came from our state this round (on the
    // fabric, or an epoll set of ours among the fds): the wait may spin.
    bool fabric = false;
};

// Builds the kernel's view for this round; true if our state alone
// already has something to report.
bool poll_prepare(PollCtx &p) noexcept {
    bool any = false;
    p.fabric = false;
    for (nfds_t i = 0; i < p.n; ++i) {
        p.k[i] = p.fds[i];
        p.k[i].revents = 0;
        p.user[i] = false;
        p.bits[i] = 0;
        short ask = 0;
        if (p.ours[i] && has_prefix(p.ours[i])) {
            p.bits[i] = kReadBits;  // before the kernel socket: see prefix.cpp
            if (p.fds[i].events & kReadBits) any = true;
        }
        short mine = 0;
        if (p.ours[i] && user_view(p.ours[i], mine, ask)) {
            p.bits[i] |= mine;
            p.user[i] = true;
            p.fabric = true;
            p.k[i].events = ask;
            if (!ask) p.k[i].fd = -1;  // nothing to ask: the kernel skips it
            if (p.bits[i] & (p.fds[i].events | POLLERR | POLLHUP)) any = true;
        } else if (p.eps[i] && (p.fds[i].events & POLLIN) && inner_ready(p.eps[i], 0)) {
            p.bits[i] = POLLIN;
            any = true;
        }
        if (p.eps[i]) p.fabric = true;
    }
    p.hints_only = true;
    for (nfds_t i = 0; i < p.n && p.hints_only; ++i)
        if (p.k[i].fd >= 0 && !(p.user[i] && (p.k[i].events & ~POLLRDHUP) == 0)) p.hints_only = false;
    return any;
}

// POLLRDHUP if the kernel socket `fd` is at its peer's FIN. The kernel's
// poll reads the socket without its lock: a FIN being queued counts as a
// readable byte a moment before the read side is shut, and a poll that
// falls in that moment (ours spins) says POLLIN alone. A peek takes the
// lock and sees the FIN whole.
short kernel_rdhup(int fd) noexcept {
    char c;
    return sys.recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0 ? POLLRDHUP : 0;
}

int poll_finish(PollCtx &p) noexcept {
    int count = 0;
    for (nfds_t i = 0; i < p.n; ++i) {
        short rev;
        if (p.user[i]) {
            if (p.k[i].revents & kKernelEnd) {
                kernel_hint(p.ours[i]);
                // Seen again with the hint (a reset adds POLLERR|POLLHUP).
                short b = 0, ask = 0;
                if (user_view(p.ours[i], b, ask)) p.bits[i] = b;
                p.bits[i] |= kReadBits | POLLRDHUP | kWriteBits;
            }
            rev = short(p.bits[i] & (p.fds[i].events | POLLERR | POLLHUP));
        } else {
            rev = short(p.k[i].revents | (p.bits[i] & p.fds[i].events));
            if (p.ours[i] && (rev & POLLIN) && !(rev & POLLRDHUP) && (p.fds[i].events & POLLRDHUP))
                rev |= kernel_rdhup(p.k[i].fd);
        }
        p.fds[i].revents = rev;
        if (rev) ++count;
    }
    return count;
}

bool poll_peek(void *ctx) noexcept {
    auto &p = *static_cast<PollCtx *>(ctx);
    for (nfds_t i = 0; i < p.n; ++i) {
        short bits = 0, ask = 0;
        if (p.ours[i] && user_view(p.ours[i], bits, ask) &&
            (bits & (p.fds[i].events | POLLERR | POLLHUP)))
            return true;
        if (p.eps[i] && inner_ready(p.eps[i], 0)) return true;
    }
    return false;
}

// A socket of ours is known to the sleep set by its stream (the kernel
// fd asked about is the application's number of it).
const void *poll_owner(void *ctx, std::size_t i, std::uint64_t *serial) noexcept {
    auto &p = *static_cast<PollCtx *>(ctx);
    if (i >= p.n || !p.ours[i]) return nullptr;
    *serial = p.ours[i]->serial;
    return p.ours[i];
}

void poll_enlist(void *ctx, transport::Watch &w) noexcept {
    auto &p = *static_cast<PollCtx *>(ctx);
    for (nfds_t i = 0; i < p.n; ++i) {
        if (p.ours[i]) enlist_stream(p.ours[i], w, nullptr, nullptr);
        else if (p.eps[i]) enlist_set(p.eps[i], w);
    }
}

}  // namespace

int poll_fds(pollfd *fds, nfds_t n, int timeout_ms, const sigset_t *mask) noexcept {
    // Which fds are ours? With none, the kernel answers everything.
    Scratch<Stream *, 64> ours(n);
    Scratch<EpollSet *, 64> eps(n);
    if (!ours.get() || !eps.get()) return -ENOMEM;
    bool any = false;
    for (nfds_t i = 0; i < n; ++i) {
        ours[i] = nullptr;
        eps[i] = nullptr;
        Stream *s = acquire(fds[i].fd);
        if (s) s->claim_inherited();
        if (s && s->may_go_direct()) {
            ours[i] = s;
            any = true;
        } else if (s) {
            release(s);
        } else if ((eps[i] = set_acquire(fds[i].fd))) {
            any = true;
        }
    }
    int r;
    if (!any) {
        if (mask || timeout_ms > 0x7fffffff) {
            timespec ts{timeout_ms / 1000, long(timeout_ms % 1000) * 1000000};
            r = sys.ppoll(fds, n, timeout_ms < 0 ? nullptr : &ts, mask);
        } else {
            r = sys.poll(fds, n, timeout_ms);
        }
        return r < 0 ? -errno : r;
    }
    // None of ours needs our state (and no epoll set of ours is among
    // them): the kernel's own poll, as often as a wake-up for us ends it.
    bool inner = false;
    for (nfds_t i = 0; i < n && !inner; ++i) inner = eps[i] != nullptr;
    const std::uint64_t deadline = deadline_of(timeout_ms);
    for (int left = timeout_ms, last = 1; !inner;) {
        bool again = false;
        r = poll_in_kernel(fds, n, ours.get(), left, mask, &again);
        if (r == kNotHere) {
            timeout_ms = left;  // the rest is our wait's
            break;
        }
        if (!again || (left == 0 && last == 0)) {
            for (nfds_t i = 0; i < n; ++i)
                if (ours[i]) release(ours[i]);
            return again ? 0 : r;
        }
        last = left;
        left = ms_left(deadline, timeout_ms);
    }
    Scratch<pollfd, 64> k(n);
    Scratch<bool, 64> user(n);
    Scratch<short, 64> bits(n);
    if (!k.get() || !user.get() || !bits.get()) {
        r = -ENOMEM;
    } else {
        PollCtx p{fds, k.get(), ours.get(), eps.get(), user.get(), bits.get(), n};
        // The first look of a wait that may sleep leaves out the kernel
        // when all it would ask is death hints and our state has nothing
        // to report: a spin asks them within kAskKernelEveryNs, and a
        // sleep's own poll has them. (With something to report, the hints
        // go with it, as the kernel's poll reports a dead peer's end
        // beside POLLOUT.) One system call less on every poll() of a
        // server that polls its direct connection before each read and
        // finds nothing yet (mariadbd's threads).
        bool first = timeout_ms != 0;
        r = wait_loop(
            [&](bool ask_kernel) {
                poll_prepare(p);
                if (ask_kernel && first && p.hints_only) {
                    first = false;
                    if (const int n = poll_finish(p); n != 0) {
                        // The round as prepared (poll_finish left it as it
                        // was, the kernel's answers being none yet), now
                        // with the hints.
                        if (sys.poll(p.k, p.n, 0) < 0) return -errno;
                        return poll_finish(p);
                    }
                    return 0;
                }
                first = false;
                if (ask_kernel && sys.poll(p.k, p.n, 0) < 0) return -errno;
                return poll_finish(p);
            },
            k.get(), n, timeout_ms, mask, {poll_peek, poll_enlist, &p, poll_owner}, &p.fabric);
        if (r == 0) {
            // Timed out: every revents reads 0, as the kernel leaves them.
            for (nfds_t i = 0; i < n; ++i) fds[i].revents = 0;
        }
    }
    for (nfds_t i = 0; i < n; ++i) {
        if (ours[i]) release(ours[i]);
        if (eps[i]) set_release(eps[i]);
    }
    return r;
}

int select_fds(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, int timeout_ms,
               const sigset_t *mask) noexcept {
    // As the kernel maps poll bits to select sets.
    constexpr short kInSet = POLLIN | POLLRDNORM | POLLRDBAND | POLLHUP | POLLERR;
    constexpr short kOutSet = POLLOUT | POLLWRNORM | POLLWRBAND | POLLERR;
    constexpr short kExSet = POLLPRI;
    std::vector<pollfd> p;
    for (int fd = 0; fd < nfds; ++fd) {
        short ev = 0;
        if (rd && FD_ISSET(fd, rd)) ev |= POLLIN | POLLRDNORM | POLLRDBAND;
        if (wr && FD_ISSET(fd, wr)) ev |= POLLOUT | POLLWRNORM | POLLWRBAND;
        if (ex && FD_ISSET(fd, ex)) ev |= POLLPRI;
        if (ev) p.push_back({fd, ev, 0});
    }
    int r = poll_fds(p.data(), p.size(), timeout_ms, mask);
    if (r < 0) return r;
    for (const pollfd &f : p)
        if (f.revents & POLLNVAL) return -EBADF;
    if (rd) FD_ZERO(rd);
    if (wr) FD_ZERO(wr);
    if (ex) FD_ZERO(ex);
    int count = 0;
    for (const pollfd &f : p) {
        if (rd && (f.events & POLLIN) && (f.revents & kInSet)) FD_SET(f.fd, rd), ++count;
        if (wr && (f.events & POLLOUT) && (f.revents & kOutSet)) FD_SET(f.fd, wr), ++count;
        if (ex && (f.events & POLLPRI) && (f.revents & kExSet)) FD_SET(f.fd, ex), ++count;
    }
    return count;
}

}  // namespace sd::fallback
