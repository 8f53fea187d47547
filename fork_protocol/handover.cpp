// Handing connections over to the new image of an exec in place
// (handover.hpp). The exec'ing image: each inherited socket that no other
// process holds moves back to its kernel socket, the peer told that it may
// upgrade again (a leave for the reason `inherited`, which rearms it), and
// its stream offsets go into SDIRECT_INHERIT. The new image, at the first
// use of such an fd, checks that it is the same connected TCP socket and
// that nobody read or wrote its kernel socket since (the kernel's own
// counts), then tracks it from those offsets like a fresh connection.
#include "handover.hpp"

#include "claim.hpp"

#include "shm_fallback/table.hpp"

#include "transport/log.hpp"
#include "transport/settings.hpp"
#include "transport/sys.hpp"
#include "transport/wait.hpp"

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sd::forking {

// The layer below's vocabulary: the Stream, the socket table, the sharers
// arena and prefixes.
using namespace fallback;

const char kInheritVar[] = "SDIRECT_INHERIT";

namespace {

using transport::sys;

// A process that forked before the exec may still hold the socket for a
// moment (a server that forks and then closes its copy): the exec waits
// this long for it to let go, then leaves the socket on TCP.
constexpr int kShareWaitMs = 100;
constexpr int kMaxEntries = 64;

struct Entry {
    int fd;
    std::uint64_t ino, tx, rx, ktx, krx;
    bool acceptor;
    int share;  // slot of the sharers arena, or -1: offsets tx/rx
    // Direct in process `owner` (we were forked from it), never used here:
    // held as a fork child holds it (share: the holders' slot, or -1).
    int owner;
    std::atomic<int> state;  // 0 waiting, 1 being adopted, 2 done (adopted or dropped)
};
Entry entries[kMaxEntries];
int nentries = 0;
std::atomic<int> waiting{0};

// The hand-over under way (table_hand_over_for_exec): an orphan handed to
// the new image as an orphan carries its number (Stream::exec_pass), and
// the exec's table_before_exec leaves it alone. A failed exec ends it.
unsigned handing_pass = 0;
bool handing = false;

// This library's file name (without its folder), for LD_PRELOAD.
const char *own_name() noexcept {
    static const char *name = [] {
        Dl_info info{};
        if (!dladdr(reinterpret_cast<void *>(&env_preloads_library), &info) || !info.dli_fname)
            return static_cast<const char *>(nullptr);
        const char *slash = std::strrchr(info.dli_fname, '/');
        return slash ? slash + 1 : info.dli_fname;
    }();
    return name;
}

}  // namespace

bool env_preloads_library(char *const envp[]) noexcept {
    const char *name = own_name();
    if (!envp || !name || !*name) return false;
    const std::size_t nlen = std::strlen(name);
    for (char *const *e = envp; *e; ++e) {
        if (std::strncmp(*e, "LD_PRELOAD=", 11) != 0) continue;
        // Entries separated by spaces or colons; each a path or a name.
        for (const char *p = *e + 11; *p;) {
            const char *end = p + std::strcspn(p, " :");
            const char *base = p;
            for (const char *q = p; q < end; ++q)
                if (*q == '/') base = q + 1;
            if (std::size_t(end - base) == nlen && std::strncmp(base, name, nlen) == 0) return true;
            p = *end ? end + 1 : end;
        }
    }
    return false;
}

bool kernel_position(int fd, std::uint64_t &written, std::uint64_t &read) noexcept {
    for (int tries = 0; tries < 16; ++tries) {
        tcp_info a{}, b{};
        socklen_t la = sizeof a, lb = sizeof b;
        int inq = 0, outq = 0;
        if (sys.getsockopt(fd, IPPROTO_TCP, TCP_INFO, &a, &la) != 0 ||
            la < offsetof(tcp_info, tcpi_bytes_received) + sizeof a.tcpi_bytes_received ||
            sys.ioctl(fd, SIOCINQ, &inq) != 0 || sys.ioctl(fd, SIOCOUTQ, &outq) != 0 ||
            sys.getsockopt(fd, IPPROTO_TCP, TCP_INFO, &b, &lb) != 0)
            return false;
        // An ack or an arrival between the reads moves both of a pair:
        // the pair is consistent when nothing moved meanwhile.
        if (a.tcpi_bytes_acked != b.tcpi_bytes_acked ||
            a.tcpi_bytes_received != b.tcpi_bytes_received)
            continue;
        written = a.tcpi_bytes_acked + std::uint64_t(outq);
        read = a.tcpi_bytes_received - std::uint64_t(inq);
        return true;
    }
    return false;
}

namespace {

// An exec in place whose new image runs the library: the socket goes back
// to the kernel for this image, and `tx`/`rx` are the offsets the new image
// goes on from; or, for a socket shared through fork, `slot` is its place
// in the sharers arena, which the new image maps again (-1 otherwise).
// False when it cannot be handed over (shared and the arena cannot be
// passed, unless the others let go within 100 ms; half-closed; the peer's
// bytes in a prefix); before_exec then applies.
bool hand_over_for_exec(Stream &s, std::uint64_t &tx, std::uint64_t &rx, int &slot,
                        int &owner) noexcept {
    slot = -1;
    owner = 0;
    Phase p = s.phase.load(std::memory_order_acquire);
    if (p == Phase::fresh || p == Phase::listener) return false;
    // Direct in the process we were forked from, and not used here since:
    // the new image holds it as we do, and only its first use asks that
    // owner to move it to the kernel (git clone's child execs index-pack
    // with the socket, which it never uses: the clone stays direct). It
    // keeps our place among the holders (the arena passed on), marked
    // blind: the owner never spills unread bytes into memory of the fork
    // tree that the new image does not map. Bytes spilled already, or no
    // arena to pass: claimed now, as below.
    if (s.orphan.load(std::memory_order_acquire)) {
        std::lock_guard lock(s.pend_lock);
        Sharers *h = s.holders.load(std::memory_order_acquire);
        Prefix *pf = s.prefix.load(std::memory_order_acquire);
        int afd = -1;
        std::uint32_t index = 0;
        if (s.orphan.load(std::memory_order_relaxed) &&
            s.orphan_lost.load(std::memory_order_relaxed) == Stream::kNotLost && h &&
            !sharers_left(h) && sharers_handle(h, &afd, &index) && (!pf || !prefix_left(pf)) &&
            !s.rd_shut.load(std::memory_order_acquire) &&
            !s.kernel_wr_shut.load(std::memory_order_acquire)) {
            sharers_blind(h);
            slot = int(index);
            owner = s.owner;
            tx = rx = 0;
            return true;
        }
    }
    // Direct in the process we were forked from (a server that forks a
    // handler on a connection it has served): that owner leaves the
    // fabric for sharing, its offsets added to the holders' counts, and
    // its peer waits rearmed; from then on it is a socket shared through
    // fork, which is ours alone once the owner closed its copy.
    if (s.orphan.load(std::memory_order_acquire) &&
        !claim_inherited(s, -1, transport::Reason::shared))
        return false;
    // One whose forked holders may live on (we forked while direct, or
    // while its connection was not direct yet: upgrades barred, nobody
    // counting the holders' bytes), a half-closed one: the kernel keeps
    // them.
    if (s.orphan.load(std::memory_order_acquire) || s.holders.load(std::memory_order_acquire) ||
        (s.forked && !s.share.load(std::memory_order_acquire)) ||
        s.rd_shut.load(std::memory_order_acquire) ||
        s.kernel_wr_shut.load(std::memory_order_acquire))
        return false;
    if (Sharers *sh = s.share.load(std::memory_order_acquire)) {
        if (sharers_stuck(sh)) return false;
        // Shared through fork, no connection: the new image holds it in
        // the same slot (the pid is the holder), counting as we do, and
        // upgrades it once it is the last holder. Nothing changes here
        // (should the exec fail, this image goes on as before).
        int fd;
        std::uint32_t index;
        if (!s.conn.load(std::memory_order_acquire) && sharers_handle(sh, &fd, &index)) {
            std::lock_guard lock(s.pend_lock);
            if (Prefix *pf = s.prefix.load(std::memory_order_acquire); pf && prefix_left(pf))
                return false;
            slot = int(index);
            tx = rx = 0;
            return true;
        }
        // Anonymous arena: the other holders get a moment to let go.
        if (transport::wait_until({.nap_ns = 1000000, .max_naps = kShareWaitMs + 1}, 0, [sh] {
                std::uint64_t next = 0;  // look now, not at the next 20 ms mark
                return sharers_alone(sh, &next);
            }) != transport::Waited::ready)
            return false;
    }
    (void)transport::wait_until({.nap_ns = 100000, .max_naps = 10000}, 0, [&s] {
        return s.phase.load(std::memory_order_acquire) != Phase::attaching;
    });
    {
        std::lock_guard lock(s.pend_lock);
        // Bytes of the peer's that every holder reads before the kernel
        // socket (prefix.cpp) would be lost to the new image: kept here.
        // An empty reserve (a fork while direct) is no matter: alone now,
        // nobody fills it.
        if (Prefix *pf = s.prefix.load(std::memory_order_acquire); pf && prefix_left(pf))
            return false;
        if (Sharers *sh = s.share.exchange(nullptr, std::memory_order_acq_rel)) {
            s.pre_tx = sharers_sent(sh);
            s.pre_rx = sharers_received(sh);
            sharers_leave(sh);
            s.forked = false;
        }
        if (!s.conn.load(std::memory_order_acquire)) {
            // Counted on the kernel so far (pending, earning, or never
            // used): those counts are the offsets. Nothing attaches it in
            // this image any more, should the exec fail.
            s.pending.store(false, std::memory_order_release);
            s.earn_ns = 0;
            s.move_to(Phase::attached);
            tx = s.pre_tx;
            rx = s.pre_rx;
            return true;
        }
    }
    transport::Conn *c = s.conn.load(std::memory_order_acquire);
    return s.engine && s.engine->hand_on(c, tx, rx) == 0;
}

// SDIRECT_EXEC_STDIO as the new image will read it (from `envp`; on
// unless set to 0).
bool stdio_allowed(char *const envp[]) noexcept {
    for (char *const *e = envp; e && *e; ++e)
        if (std::strncmp(*e, "SDIRECT_EXEC_STDIO=", 19) == 0) return std::strcmp(*e + 19, "0") != 0;
    return true;
}

}  // namespace

std::size_t table_hand_over_for_exec(char *const envp[], char *out, std::size_t cap) noexcept {
    if (foreign_process() || cap < 64) return 0;
    ++handing_pass;
    handing = true;
    ino_t kept[256];
    int kept_fd[256];
    const int n = inherited_sockets(kept, kept_fd, 256);
    const bool stdio = stdio_allowed(envp);
    struct Done {
        Stream *s;
        bool ok;
        int slot, owner;
        std::uint64_t tx, rx, ktx, krx;
    };
    Done done[kMaxEntries];
    int ndone = 0;
    char body[7168];
    body[0] = '\0';
    int len = 0;
    int written = 0;
    bool shares = false;
    for (int i = 0; i < n; ++i) {
        Stream *s = acquire(kept_fd[i]);
        if (!s) continue;  // untracked here: plain TCP, in the new image too
        Done *d = nullptr;
        for (int k = 0; k < ndone; ++k)
            if (done[k].s == s) d = &done[k];
        if (!d && ndone < kMaxEntries) {
            d = &done[ndone++];
            *d = {s, false, -1, 0, 0, 0, 0, 0};
            // On a standard fd in the new program: stdio may bypass us.
            bool std_fd = false;
            for (int k = 0; k < n; ++k) std_fd |= kept[k] == kept[i] && kept_fd[k] <= 2;
            d->ok = (stdio || !std_fd) &&
                    hand_over_for_exec(*s, d->tx, d->rx, d->slot, d->owner) &&
                    (d->slot >= 0 || kernel_position(kept_fd[i], d->ktx, d->krx));
            shares |= d->ok && d->slot >= 0;
            if (!d->ok)
                SD_LOG(debug, "fd %d: not handed over to the new program (shared, half-closed, "
                              "or its connection could not settle on the kernel): on TCP there",
                       kept_fd[i]);
            if (d->ok && d->owner)
                SD_LOG(info, "fd %d: handed over to the new program, direct in pid %d: its "
                             "first use there asks that process to move it to the kernel",
                       kept_fd[i], d->owner);
            else if (d->ok && d->slot >= 0)
                SD_LOG(info, "fd %d: handed over to the new program, shared through fork: it "
                             "holds it in the same place", kept_fd[i]);
            else if (d->ok)
                SD_LOG(info, "fd %d: handed over to the new program at offsets %" PRIu64
                             " sent, %" PRIu64 " received",
                       kept_fd[i], d->tx, d->rx);
        }
        if (d && d->ok) {
            int w = std::snprintf(body + len, sizeof body - std::size_t(len),
                                  ";%d,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64
                                  ",%d,%d,%d",
                                  kept_fd[i], std::uint64_t(kept[i]), d->tx, d->rx, d->ktx, d->krx,
                                  s->acceptor ? 1 : 0, d->slot, d->owner);
            if (w > 0 && std::size_t(len + w) < sizeof body) {
                len += w;
                ++written;
                if (d->owner) s->exec_pass = handing_pass;
            }
        }
        release(s);
    }
    // Everything not handed over: back to the kernel for good, as for a
    // program without the library (a no-op for those handed over).
    table_before_exec();
    if (!written) {
        handing = false;
        return 0;
    }
    int fd = -1;
    std::uint32_t index = 0;
    if (shares) {
        for (int k = 0; k < ndone && fd < 0; ++k)
            if (done[k].ok && done[k].slot >= 0) {
                Sharers *sh = done[k].s->share.load(std::memory_order_acquire);
                if (!sh) sh = done[k].s->holders.load(std::memory_order_acquire);
                if (sh) (void)sharers_handle(sh, &fd, &index);
            }
        sharers_pass_on_exec(true);
    }
    const int total = std::snprintf(out, cap, "%s=2:%d:%d%s", kInheritVar, int(getpid()), fd, body);
    return total > 0 && std::size_t(total) < cap ? std::size_t(total) : 0;
}

void hand_over_failed() noexcept {
    handing = false;
    sharers_pass_on_exec(false);
}

bool handed_as_orphan(const Stream &s) noexcept {
    return handing && s.exec_pass == handing_pass && s.orphan.load(std::memory_order_acquire);
}

void inherit_init() noexcept {
    const char *v = getenv(kInheritVar);
    if (!v) return;
    char copy[8192];
    std::snprintf(copy, sizeof copy, "%s", v);
    // Never passed on: a program this one starts gets it only from our own
    // exec, rewritten.
    unsetenv(kInheritVar);
    int version = 0, pid = 0, arena_fd = -1, at = 0;
    if (std::sscanf(copy, "%d:%d:%d%n", &version, &pid, &arena_fd, &at) != 3 || version != 2 ||
        pid != int(getpid()))
        return;  // written for another process (or another format)
    const bool arena = arena_fd >= 0 && sharers_map_inherited(arena_fd);
    const char *p = copy + at;
    while (*p == ';' && nentries < kMaxEntries) {
        Entry &e = entries[nentries];
        int acc = 0, used = 0;
        if (std::sscanf(p, ";%d,%" SCNu64 ",%" SCNu64 ",%" SCNu64 ",%" SCNu64 ",%" SCNu64
                           ",%d,%d,%d%n",
                        &e.fd, &e.ino, &e.tx, &e.rx, &e.ktx, &e.krx, &acc, &e.share, &e.owner,
                        &used) != 9)
            break;
        p += used;
        e.acceptor = acc != 0;
        // Shared, and the arena could not be mapped: it stays on TCP here.
        // An orphan is still one (its owner is asked at the first use),
        // only outside the holders' slot.
        if (e.share >= 0 && !arena) {
            if (e.owner <= 0) continue;
            e.share = -1;
        }
        e.state.store(0, std::memory_order_relaxed);
        ++nentries;
    }
    waiting.store(nentries, std::memory_order_release);
}

SD_CHILD_PATH bool inherit_waiting() noexcept { return waiting.load(std::memory_order_acquire) > 0; }

namespace {

// The fd is still the connected TCP socket handed over, and its kernel
// socket was neither read nor written since.
bool still_handed(const Entry &e, int *domain) noexcept {
    struct stat st;
    int type = 0, proto = 0;
    socklen_t l1 = sizeof type, l2 = sizeof proto, l3 = sizeof *domain;
    sockaddr_storage peer{};
    socklen_t pl = sizeof peer;
    std::uint64_t w = 0, r = 0;
    return fstat(e.fd, &st) == 0 && S_ISSOCK(st.st_mode) && std::uint64_t(st.st_ino) == e.ino &&
           sys.getsockopt(e.fd, SOL_SOCKET, SO_TYPE, &type, &l1) == 0 && type == SOCK_STREAM &&
           sys.getsockopt(e.fd, SOL_SOCKET, SO_PROTOCOL, &proto, &l2) == 0 &&
           proto == IPPROTO_TCP &&
           sys.getsockopt(e.fd, SOL_SOCKET, SO_DOMAIN, domain, &l3) == 0 &&
           (*domain == AF_INET || *domain == AF_INET6) &&
           getpeername(e.fd, reinterpret_cast<sockaddr *>(&peer), &pl) == 0 &&
           // Shared: every holder's bytes are counted in the slot instead;
           // an orphan's are its owner's to say.
           (e.share >= 0 || e.owner > 0 ||
            (kernel_position(e.fd, w, r) && w == e.ktx && r == e.krx));
}

void finish(Entry &e) noexcept {
    e.state.store(2, std::memory_order_release);
    waiting.fetch_sub(1, std::memory_order_acq_rel);
}

}  // namespace

Stream *adopt_inherited(int fd) noexcept {
    Entry *e = nullptr;
    for (int i = 0; i < nentries && !e; ++i)
        if (entries[i].fd == fd && entries[i].state.load(std::memory_order_acquire) != 2)
            e = &entries[i];
    if (!e || foreign_process()) return nullptr;
    // On fd 0, 1 or 2 (any fd of it): the exec'ing image only hands such
    // a socket over when SDIRECT_EXEC_STDIO allows it; checked here too.
    bool std_fd = false;
    for (int i = 0; i < nentries; ++i) std_fd |= entries[i].ino == e->ino && entries[i].fd <= 2;
    if (std_fd && !transport::settings().exec_stdio) return nullptr;
    int expect = 0;
    if (!e->state.compare_exchange_strong(expect, 1, std::memory_order_acq_rel)) {
        // Another thread adopts it: its stream, once there.
        (void)transport::wait_until({.nap_ns = 10000, .max_naps = 100000}, 0,
                                    [e] { return e->state.load(std::memory_order_acquire) != 1; });
        return e->state.load(std::memory_order_acquire) == 2 ? acquire(fd) : nullptr;
    }
    int domain = 0;
    Stream *s = nullptr;
    if (still_handed(*e, &domain)) {
        const int fl = sys.fcntl(fd, F_GETFL);
        s = create(fd, domain, fl >= 0 && (fl & O_NONBLOCK));
    }
    Sharers *sh = nullptr;
    if (s && e->share >= 0) {
        sh = sharers_at(std::uint32_t(e->share));
        if (!sh || !sharers_hold(sh) || (e->owner <= 0 && sharers_stuck(sh))) {
            sh = nullptr;
            // Not ours in that slot: untracked, plain TCP; an orphan is
            // one still, outside the slot (its owner is asked first).
            if (e->owner <= 0) {
                release(unmap(fd));
                s = nullptr;
            }
        }
    }
    if (s) {
        s->pre_tx = e->tx;
        s->pre_rx = e->rx;
        // Its other fds (dups made before the exec, e.g. stdin and stdout).
        for (int i = 0; i < nentries; ++i) {
            Entry &o = entries[i];
            int z = 0;
            if (&o == e || o.ino != e->ino || !o.state.compare_exchange_strong(z, 1)) continue;
            int d = 0;
            if (still_handed(o, &d) && !slot_taken(o.fd)) map_dup(o.fd, s);
            finish(o);
        }
        s->refs.fetch_add(1, std::memory_order_relaxed);  // the caller's
        if (e->owner > 0) {
            // As a fork child holds a socket direct in its parent: the
            // first I/O here asks that owner to leave the fabric
            // (claim_inherited), and its holders count from there.
            SD_LOG(info, "fd %d: inherited through exec, direct in pid %d: its first use here "
                         "asks that process to move it to the kernel", fd, e->owner);
            s->acceptor = e->acceptor;
            s->forked = true;
            s->owner = e->owner;
            s->holders.store(sh, std::memory_order_release);
            s->orphan.store(true, std::memory_order_release);
            s->move_to(Phase::deferred);
        } else if (sh) {
            // As a fork child holds it: counted, upgraded by the last
            // holder left (adopt_share, share.cpp).
            SD_LOG(info, "fd %d: inherited through exec, shared through fork: upgraded once "
                         "its other holders let go", fd);
            s->acceptor = e->acceptor;
            s->forked = true;
            s->share.store(sh, std::memory_order_release);
            s->move_to(Phase::deferred);
        } else {
            SD_LOG(info, "fd %d: inherited through exec at offsets %" PRIu64 " sent, %" PRIu64
                         " received; it may be upgraded again", fd, e->tx, e->rx);
            s->connected(e->acceptor);
        }
    }
    finish(*e);
    return s;
}

}  // namespace sd::forking
