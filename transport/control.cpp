// Rendezvous and upgrade. Each end of a new connection writes
// its half into the host registry, then looks for the other half; whoever
// finds it asks the owner's control thread to upgrade, proving ownership
// of the connection by passing its own socket with SCM_RIGHTS. Nothing is
// ever written into the TCP stream.
#include "crossuser.hpp"
#include "engine.hpp"
#include "log.hpp"
#include "registry.hpp"
#include "settings.hpp"
#include "sys.hpp"
#include "wait.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

namespace sd::transport {
namespace {

constexpr std::uint32_t kCtlMagic = 0x54434453;    // "SDCT"
constexpr std::uint16_t kCtlVersion = 1;

// request/reply: an upgrade (below). leave: a process that holds one of
// our direct sockets (a fork child, or a vfork child about to exec) asks
// us to move it back to the kernel; one fd (the socket, as proof); the
// reply's status says whether we did. kick: a peer waits for our answer
// on the fabric (a cancelled advertisement, a leave) while none of our
// threads may be in the library: the control thread progresses once; no
// fd, no reply. commit: the initiator's last word after an accepting reply
// (see try_initiate); no fd, no reply.
enum class CtlType : std::uint16_t { request = 1, reply = 2, leave = 3, kick = 4, commit = 5 };

// Control message, one SEQPACKET datagram. A request carries two fds (the
// initiator's TCP socket as proof, its doorbell); an accepting reply one
// (the receiver's doorbell), unless the request said that the initiator
// holds it already (kHaveBell: the peer is attached, cached or in use).
struct CtlMsg {
    std::uint32_t magic;
    std::uint16_t version;
    std::uint16_t type;
    std::int32_t pid;
    std::uint32_t conn_id;
    std::uint32_t gen;
    std::uint32_t window;
    std::uint32_t status;    // Reason; none = accepted; kConflict = retry elsewhere
    std::uint32_t dumpable;
    Tuple tuple;             // the sender's view of the connection
    char addr[96];
    std::uint64_t ring_addr; // the sender's receive ring, for RMA writes
    std::uint64_t ring_key;
};
static_assert(sizeof(CtlMsg) == 184);

constexpr std::uint32_t kConflict = 0xffff;
constexpr std::uint32_t kHaveBell = 1;  // a request's status: no doorbell in the reply

unsigned long netns_id() noexcept {
    static unsigned long id = [] {
        struct stat st;
        return stat("/proc/self/ns/net", &st) == 0 ? (unsigned long)st.st_ino : 0ul;
    }();
    return id;
}

// The peer, as the other end of an upgrade told us, under conn_lock.
// `cross`: a peer of another uid, to which neither side's ring is offered
// (every byte goes inline: crossuser.hpp).
void set_peer_locked(Conn *c, Peer *peer, const CtlMsg &m, bool cross) noexcept {
    // Under rx_lock, which every delivery takes: the peer's first fabric
    // message (a close, whose delivery reads the peer's page through
    // c->peer) may come right after our answer or commit, and only the
    // other process's reply orders these writes before it, which the
    // memory model does not see (TSan: peer_read() in a delivery against
    // this write on the control thread).
    std::lock_guard rx(c->rx_lock);
    c->peer = peer;
    c->peer_id = m.conn_id;
    c->peer_gen = m.gen;
    c->credits.store(m.window, std::memory_order_relaxed);
    c->peer_ring_addr = cross ? 0 : m.ring_addr;
    c->peer_ring_key = cross ? 0 : m.ring_key;
    c->peer_ring_cap = m.window;
}

}  // namespace

// Built three or four times per connection: the addresses are spelt by
// hand (32 snprintf calls a name showed in a connection set-up profile).
void entry_path(char *out, std::size_t n, const Tuple &t) noexcept {
    static constexpr char kHex[] = "0123456789abcdef";
    char l[33], p[33];
    for (int i = 0; i < 16; ++i) {
        l[2 * i] = kHex[t.local_addr[i] >> 4];
        l[2 * i + 1] = kHex[t.local_addr[i] & 15];
        p[2 * i] = kHex[t.peer_addr[i] >> 4];
        p[2 * i + 1] = kHex[t.peer_addr[i] & 15];
    }
    l[32] = p[32] = '\0';
    std::snprintf(out, n, "%s/c-%lx-%u-%s.%u-%s.%u", settings().registry, netns_id(),
                  unsigned(t.family), l, unsigned(t.local_port), p, unsigned(t.peer_port));
}

namespace {

// `dir`: the peer's registry if it is of another uid.
void ctl_path(char *out, std::size_t n, pid_t pid, const char *dir = nullptr) noexcept {
    std::snprintf(out, n, "%s/ctl-%d", dir ? dir : settings().registry, int(pid));
}

int dumpable() noexcept { return prctl(PR_GET_DUMPABLE) == 1; }

// The control thread sends with MSG_DONTWAIT: its answer goes into a
// fresh connection's empty queue, and a blocked send would stall every
// other request.
ssize_t send_ctl(int fd, const CtlMsg &m, const int *fds, int nfds, int flags = 0) noexcept {
    iovec iov{const_cast<CtlMsg *>(&m), sizeof m};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char cbuf[CMSG_SPACE(2 * sizeof(int))];
    if (nfds) {
        mh.msg_control = cbuf;
        mh.msg_controllen = CMSG_SPACE(std::size_t(nfds) * sizeof(int));
        cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(std::size_t(nfds) * sizeof(int));
        std::memcpy(CMSG_DATA(cm), fds, std::size_t(nfds) * sizeof(int));
    }
    return sys.sendmsg(fd, &mh, MSG_NOSIGNAL | flags);
}

// Receives one control message; passed fds land in fds[] (-1 if absent).
// A message that is short, of another version or carries extra fds is
// rejected and its fds are closed.
int recv_ctl(int fd, CtlMsg &m, int *fds, int want, int flags = 0) noexcept {
    for (int i = 0; i < want; ++i) fds[i] = -1;
    iovec iov{&m, sizeof m};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char cbuf[CMSG_SPACE(4 * sizeof(int))];
    mh.msg_control = cbuf;
    mh.msg_controllen = sizeof cbuf;
    ssize_t n = sys.recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | flags);
    if (n < 0) return -errno;
    if (n == 0) return -EPIPE;  // the other side closed
    int got = 0;
    for (cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        int cnt = int((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < cnt; ++i) {
            int f;
            std::memcpy(&f, CMSG_DATA(cm) + std::size_t(i) * sizeof(int), sizeof f);
            if (got < want) fds[got++] = f;
            else sys.close(f);
        }
    }
    bool ok = n == sizeof m && !(mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) &&
              m.magic == kCtlMagic && m.version == kCtlVersion;
    if (!ok) {
        for (int i = 0; i < want; ++i)
            if (fds[i] >= 0) sys.close(fds[i]), fds[i] = -1;
        return -EPROTO;
    }
    return 0;
}

// The process at the other end of a control socket is `expect_pid` (0:
// any) and of our uid; with `uid`, of any uid when SDIRECT_CROSS_USER is
// on, which `*uid` then says.
bool peer_cred_ok(int fd, pid_t expect_pid, unsigned *uid = nullptr) noexcept {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (sys.getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
    if (expect_pid != 0 && cred.pid != expect_pid) return false;
    if (uid) *uid = unsigned(cred.uid);
    return cred.uid == getuid() || (uid && cross_user_on());
}

void *control_thread(void *arg) noexcept {
    ++guard_depth;  // everything this thread does goes straight to libc
    static_cast<Engine *>(arg)->control_loop();
    return nullptr;
}

}  // namespace

int tuple_of(int fd, Tuple &t) noexcept {
    sockaddr_storage l{}, p{};
    socklen_t ll = sizeof l, pl = sizeof p;
    if (sys.getsockname(fd, reinterpret_cast<sockaddr *>(&l), &ll) != 0) return -errno;
    if (sys.getpeername(fd, reinterpret_cast<sockaddr *>(&p), &pl) != 0) return -errno;
    t = Tuple{};
    t.family = l.ss_family;
    if (l.ss_family == AF_INET && p.ss_family == AF_INET) {
        auto *a = reinterpret_cast<sockaddr_in *>(&l);
        auto *b = reinterpret_cast<sockaddr_in *>(&p);
        std::memcpy(t.local_addr, &a->sin_addr, 4);
        std::memcpy(t.peer_addr, &b->sin_addr, 4);
        t.local_port = ntohs(a->sin_port);
        t.peer_port = ntohs(b->sin_port);
    } else if (l.ss_family == AF_INET6 && p.ss_family == AF_INET6) {
        auto *a = reinterpret_cast<sockaddr_in6 *>(&l);
        auto *b = reinterpret_cast<sockaddr_in6 *>(&p);
        t.local_port = ntohs(a->sin6_port);
        t.peer_port = ntohs(b->sin6_port);
        if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) && IN6_IS_ADDR_V4MAPPED(&b->sin6_addr)) {
            // A dual-stack socket talking IPv4 (a server listening on ::,
            // the default of iperf3 and many others): its peer sees plain
            // IPv4, so both halves must name the connection that way.
            t.family = AF_INET;
            std::memcpy(t.local_addr, a->sin6_addr.s6_addr + 12, 4);
            std::memcpy(t.peer_addr, b->sin6_addr.s6_addr + 12, 4);
        } else {
            std::memcpy(t.local_addr, &a->sin6_addr, 16);
            std::memcpy(t.peer_addr, &b->sin6_addr, 16);
        }
    } else {
        return -EAFNOSUPPORT;
    }
    return 0;
}

Tuple reversed(const Tuple &t) noexcept {
    Tuple r = t;
    std::memcpy(r.local_addr, t.peer_addr, 16);
    std::memcpy(r.peer_addr, t.local_addr, 16);
    r.local_port = t.peer_port;
    r.peer_port = t.local_port;
    return r;
}

int Engine::start_control() noexcept {
    char path[300];
    ctl_path(path, sizeof path, pid_);
    (void)unlink(path);
    int fd = sys.socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    if (std::strlen(path) >= sizeof sa.sun_path) {
        sys.close(fd);
        return -ENAMETOOLONG;
    }
    std::strcpy(sa.sun_path, path);
    if (sys.bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0 ||
        sys.listen(fd, 128) != 0) {
        int err = errno;
        sys.close(fd);
        return -err;
    }
    ctl_fd_ = fd;
    open_registry(settings().registry, path);  // SDIRECT_CROSS_USER only
    // Without it, a peer attached while the control thread waits is
    // watched from its next wake-up on.
    watch_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    // The control thread must not take the application's signals.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    pthread_t tid;
    int rc = pthread_create(&tid, &attr, control_thread, this);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return -rc;
}

void Engine::control_loop() noexcept {
    // Our control socket, and the pidfds of the attached peers: an idle
    // cached peer whose process ended is dropped at once (peers.cpp).
    constexpr int kWatch = 2 + int(sizeof peers_ / sizeof peers_[0]);
    pollfd fds[kWatch];
    for (;;) {
        const int n = gather_watch(fds, kWatch);
        if (sys.poll(fds, nfds_t(n), -1) < 0) {
            if (errno != EINTR) usleep(1000);
            continue;
        }
        if (fds[1].revents & POLLIN) {
            std::uint64_t v;
            (void)sys.read(watch_fd_, &v, sizeof v);
        }
        bool ended = false;
        for (int i = 2; i < n; ++i) ended |= fds[i].revents != 0;
        if (ended) reap_ended_peers();
        if (!(fds[0].revents & POLLIN)) continue;
        int fd = sys.accept4(ctl_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE) {
                // Our peers' upgrade requests wait, and time out: say why once.
                static bool told = false;
                if (!std::exchange(told, true))
                    SD_LOG(info, "control channel: no fd to accept upgrade requests with "
                                 "(RLIMIT_NOFILE); peers asking now stay on TCP (timeout)");
                usleep(10000);
                continue;
            }
            SD_LOG(error, "control channel accept failed: %s", std::strerror(errno));
            return;
        }
        handle_request(fd);
        sys.close(fd);
    }
}

Conn *Engine::find_tuple(const Tuple &t) noexcept {
    for (std::uint32_t i = 0; i < kSlots; ++i) {
        Conn *c = conns_[i].load(std::memory_order_relaxed);
        if (c && c->tuple == t) return c;
    }
    return nullptr;
}

void Engine::publish(Conn *c, Reason kernel_why) noexcept {
    Entry e{};
    e.kernel_why = std::uint32_t(kernel_why);
    e.magic = kEntryMagic;
    e.version = kEntryVersion;
    e.pid = pid_;
    e.conn_id = c->id;
    e.gen = c->gen;
    e.acceptor = c->acceptor;
    // A name cut short would send the peer elsewhere: not published (we
    // may still find the peer's entry and initiate).
    if (std::strlen(ep_.name) >= sizeof e.addr) return;
    std::snprintf(e.addr, sizeof e.addr, "%s", ep_.name);
    std::uint64_t dev = 0, ino = 0;
    if (!write_entry(c->tuple, e, &dev, &ino)) return;
    c->entry_dev.store(dev, std::memory_order_relaxed);
    c->entry_ino.store(ino, std::memory_order_release);
    c->published_ns.store(monotonic_ns(), std::memory_order_release);
    // An answer to it may have ended the upgrade already (a request that
    // read the entry before we noted it, and failed or succeeded): its
    // unpublish found nothing noted, so a plain entry goes now. A marked
    // one (why this end stays on TCP) stays for the peer to read.
    const ConnState st_now = c->state.load(std::memory_order_acquire);
    if (kernel_why == Reason::none && (st_now == ConnState::final || st_now == ConnState::direct))
        unpublish(c);
}

bool write_entry(const Tuple &t, Entry &e, std::uint64_t *dev, std::uint64_t *ino) noexcept {
    e.written_ns = monotonic_ns();
    e.check = entry_check(e);
    char path[400], tmp[420];
    entry_path(path, sizeof path, t);
    // The name is new for nearly every connection: create it and write it
    // in one go. O_EXCL follows no symlink and takes no one's file.
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, entry_mode());
    const char *name = path;
    if (fd < 0 && errno == EEXIST) {
        // Left by an earlier connection of the same 4-tuple, or our own
        // entry marked anew: replaced atomically, so that a reader sees
        // the old entry or the new one.
        std::snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, int(e.pid));
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, entry_mode());
        name = tmp;
    }
    if (fd < 0) return false;
    if (cross_user_on()) (void)fchmod(fd, entry_mode());  // whatever the umask
    struct stat st;
    bool ok = sys.write(fd, &e, sizeof e) == sizeof e && fstat(fd, &st) == 0;
    sys.close(fd);
    if (ok && name == tmp) ok = rename(tmp, path) == 0;
    if (!ok) {
        unlink(name);
        return false;
    }
    if (dev) *dev = std::uint64_t(st.st_dev);
    if (ino) *ino = std::uint64_t(st.st_ino);
    return true;
}

void Engine::unpublish(Conn *c) noexcept {
    // Only our own entry: the name might already belong to a new connection
    // of another process that reuses the same 4-tuple. The file's identity
    // says so without opening it; once only.
    const std::uint64_t ino = c->entry_ino.exchange(0, std::memory_order_acq_rel);
    if (!ino) return;
    // Every entry is in the registry directory: a newer publish's device,
    // should one be read here, is the same.
    const std::uint64_t dev = c->entry_dev.load(std::memory_order_relaxed);
    char path[400];
    entry_path(path, sizeof path, c->tuple);
    struct stat st;
    if (stat(path, &st) == 0 && std::uint64_t(st.st_ino) == ino &&
        std::uint64_t(st.st_dev) == dev)
        unlink(path);
}

void Engine::set_final(Conn *c, Reason r) noexcept {
    c->state.store(ConnState::final, std::memory_order_release);
    c->stat->reason.store(std::uint32_t(r), std::memory_order_relaxed);
    c->verdict_due.store(false, std::memory_order_relaxed);
    SD_LOG_CONN(info, *c->stat, "stays on TCP: %s", reason_name(r));
    mark_kernel(c, r);
    std::lock_guard lock(c->rx_lock);
    c->wake_locked();
}

int Engine::make_ring(Conn *c) noexcept {
    // Under rx_lock, which every delivery takes: the first one (sent by a
    // peer that learnt of the ring through the control socket) then sees
    // the ring in the memory model too, not only in time.
    std::lock_guard rx(c->rx_lock);
    if (c->ring) return 0;
    c->ring = ring_alloc(c->window);
    c->stage = static_cast<char *>(std::malloc(chunk_));
    if (!c->ring || !c->stage) return -ENOMEM;
    c->ring_cap = c->window;
    Guard guard;
    InProvider in;
    int rc = !in.ok() ? -FI_ECANCELED
                      : fi_mr_reg(ep_.domain, c->ring, c->window, FI_REMOTE_WRITE, 0, next_key_++,
                                  0, &c->ring_mr, nullptr);
    if (rc) {
        SD_LOG(info, "ring registration failed: %s", fabric_strerror(rc));
        c->ring_mr = nullptr;  // the peer then sends everything inline
    }
    return 0;
}

void Engine::hold(Conn *c, Reason why) noexcept {
    for (int ms = 0; (c->state.load() == ConnState::initiating ||
                      c->state.load() == ConnState::committing) && ms < 200; ++ms) {
        timespec nap{0, 1000000};
        nanosleep(&nap, nullptr);
    }
    std::lock_guard lock(conn_lock_);
    ConnState st = c->state.load();
    if (st == ConnState::direct || st == ConnState::leaving) return;
    c->held_why.store(std::uint32_t(why), std::memory_order_relaxed);
    c->held.store(true, std::memory_order_release);
    // An upgrade still under way sees the mark where it ends (both under
    // conn_lock_): an initiator sends no commit, a responder whose commit
    // came leaves at once. Before, it went direct after the hold, and an
    // exec or a fork child then used the kernel socket while the peer
    // wrote into this process's ring (EFAULT after the exec: EIO).
    if (st == ConnState::initiating || st == ConnState::committing) return;
    if (st != ConnState::final) mark_kernel(c, why);
}

bool Engine::settle_upgrade(Conn *c) noexcept {
    // The initiator's wait for an answer and the responder's for the
    // commit end within the upgrade timeout.
    const std::uint64_t deadline =
        monotonic_ns() + (std::uint64_t(settings().upgrade_timeout_ms) + 500) * 1000000ull;
    for (;;) {
        const ConnState st = c->state.load(std::memory_order_acquire);
        if (st != ConnState::initiating && st != ConnState::committing)
            return st == ConnState::direct || st == ConnState::leaving;
        if (monotonic_ns() >= deadline) return false;
        timespec nap{0, 1000000};
        nanosleep(&nap, nullptr);
    }
}

namespace {

// Waits for one control message until the deadline. Signals do not end the
// wait (the upgrade runs in whatever thread made the connection's first
// call, and its handlers are the application's); -ETIMEDOUT at the
// deadline, -EPIPE when the other side closed.
int recv_ctl_until(int fd, CtlMsg &m, int *fds, int want, std::uint64_t deadline_ns) noexcept {
    for (;;) {
        const std::uint64_t now = monotonic_ns();
        if (now >= deadline_ns) return -ETIMEDOUT;
        pollfd p{fd, POLLIN, 0};
        const int ms = int((deadline_ns - now + 999999) / 1000000);
        int n = sys.poll(&p, 1, ms);
        if (n < 0 && errno != EINTR) return -errno;
        if (n <= 0) continue;
        int rc = recv_ctl(fd, m, fds, want);
        if (rc == -EINTR || rc == -EAGAIN) continue;
        return rc == -ECONNRESET ? -EPIPE : rc;
    }
}

// The initiator's last word: from this datagram on, both ends are direct.
// SEQPACKET delivery is atomic: once sendmsg returns, the message is in the
// responder's queue, and a responder that gave up first (shut its socket
// down) makes it fail with EPIPE.
bool send_commit(int fd, pid_t self) noexcept {
    CtlMsg m{};
    m.magic = kCtlMagic;
    m.version = kCtlVersion;
    m.type = std::uint16_t(CtlType::commit);
    m.pid = self;
    for (int tries = 0; tries < 100; ++tries) {
        ssize_t n = send_ctl(fd, m, nullptr, 0);
        if (n == sizeof m) return true;
        if (n >= 0 || (errno != EINTR && errno != EAGAIN)) return false;
    }
    return false;
}

}  // namespace

// Crossed requests cost a round trip for nothing (the accepting side's
// wins), and on a host with a free CPU both ends of a new connection
// publish and look at once. The connecting side, having found the
// acceptor's entry `e`, stays quiet when the acceptor's lookup, which
// always follows its own publish, is sure to find our entry whole:
//  * it began writing its entry after ours was whole (e.written_ns), or
//  * its process page (mapped already: the peer is attached, cached or in
//    use) shows it has not begun its lookup yet, or began it after ours
//    was whole. The acceptor stores its stamp, then fences, then looks;
//    we wrote our entry, then fence, then read the stamp: if we miss the
//    stamp, its lookup sees our entry (the two cannot both miss).
// Both ends read CLOCK_MONOTONIC; ends in different time namespaces could
// misjudge it, and the connection would then stay on TCP.
bool Engine::acceptor_will_ask(const Conn *c, const Entry &e) noexcept {
    const std::uint64_t ours = c->published_ns.load(std::memory_order_acquire);
    if (!ours) return false;
    if (e.written_ns > ours) return true;
    if (e.conn_id >= kSlots) return false;
    std::lock_guard lock(conn_lock_);
    for (std::uint32_t i = 0; i < npeers_; ++i) {
        const Peer &p = peers_[i];
        if (!p.page || p.pid != e.pid || p.ended || p.addr == FI_ADDR_UNSPEC ||
            std::strncmp(p.name, e.addr, sizeof p.name) != 0)
            continue;
        std::atomic_thread_fence(std::memory_order_seq_cst);
        const std::uint64_t stamp = p.page->slots[e.conn_id].lookup_ns.load(std::memory_order_relaxed);
        return stamp == 0 || stamp > ours;
    }
    return false;
}

// The upgrade is a commit protocol over the control socket, so that it is
// all or nothing: request (initiator) → accept (responder, which then waits)
// → commit (initiator). Neither side sends a byte on the fabric before the
// commit: the initiator turns direct once its commit is in the responder's
// queue, the responder once it reads it. Whatever fails before (a timeout,
// a process stopped at any step, an fd limit, a refusal) leaves both ends
// on TCP: the responder that sees the socket close, or its own deadline
// pass, shuts the socket down and then takes only a commit already queued.
void Engine::try_initiate(Conn *c) noexcept {
    if (c->held.load(std::memory_order_acquire)) return;
    if (c->acceptor) {
        // Before the lookup, and seen before it (see acceptor_will_ask).
        c->stat->lookup_ns.store(monotonic_ns(), std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_seq_cst);
    }
    char path[400];
    entry_path(path, sizeof path, reversed(c->tuple));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    // A peer of another uid publishes in its own registry (the connection
    // is then between users: far_dir says where its process lives).
    unsigned far_uid = unsigned(getuid());
    char far_dir[64] = {};
    if (fd < 0 && errno == ENOENT && cross_user_on()) {
        fd = open_foreign_entry(std::strrchr(path, '/') + 1, reversed(c->tuple), &far_uid, far_dir,
                                sizeof far_dir);
        if (fd < 0) errno = -fd;
    }
    const bool cross = far_dir[0] != '\0';
    if (fd < 0) {
        // No fd to look with (RLIMIT_NOFILE): whether the peer published
        // cannot be known now, and an upgrade would need more fds. Said
        // once; a later attempt may still go. Otherwise the peer has not
        // published (yet): it may find us.
        std::uint32_t expect = std::uint32_t(Reason::no_peer);
        if ((errno == EMFILE || errno == ENFILE) &&
            c->stat->reason.compare_exchange_strong(expect, std::uint32_t(Reason::fd_limit)))
            SD_LOG_CONN(info, *c->stat, "on TCP for now: fd_limit (no fd to look up the peer's "
                                        "registry entry with)");
        return;
    }
    Entry e{};
    bool ok = sys.read(fd, &e, sizeof e) == sizeof e && entry_valid(e);
    sys.close(fd);
    if (!ok || e.kernel_why) return;  // that end will not upgrade: judge() reports it
    e.addr[sizeof e.addr - 1] = '\0';
    if (!c->acceptor && e.acceptor && acceptor_will_ask(c, e)) return;
    if (e.pid != pid_ && kill(e.pid, 0) != 0 && errno == ESRCH) {
        if (!cross) unlink(path);  // stale: its process is gone
        return;
    }
    if (e.pid == pid_ && !settings().same_process) {
        std::lock_guard lock(conn_lock_);
        set_final(c, Reason::same_process);
        if (Conn *other = find_tuple(reversed(c->tuple))) set_final(other, Reason::same_process);
        return;
    }
    if (!fabric_usable()) {
        std::lock_guard lock(conn_lock_);
        set_final(c, Reason::fabric_error);
        return;
    }
    ConnState expect = ConnState::kernel;
    if (!c->state.compare_exchange_strong(expect, ConnState::initiating)) return;

    Reason why = Reason::none;
    Peer *peer = nullptr;
    // Whether we already hold the peer's doorbell: it is set under
    // conn_lock_ (by another connection's handshake too), so read there.
    bool have_bell = false;
    {
        std::lock_guard lock(conn_lock_);
        if (make_ring(c) != 0) why = Reason::fabric_error;
        else if (!cross) peer = attach_peer(e.pid, e.addr, -1, &why);
        // Across users the peer opens its region to us only once we
        // proved we hold the connection (the request): we attach after
        // its answer, and open ours to its uid now, for its attach. That
        // uid is the one the kernel says holds the other end (the entry
        // was looked for in its registry alone): an entry a third user
        // planted for someone else's connection is never even read.
        else if (open_to_uid(far_uid) != 0)
            why = Reason::other_user;
        have_bell = peer && peer->doorbell >= 0;
    }
    CtlMsg reply{};
    int their_doorbell = -1;
    int s = -1;
    int their_proof = -1;
    if (peer || (cross && why == Reason::none)) {
        char cpath[108];
        ctl_path(cpath, sizeof cpath, e.pid, cross ? far_dir : nullptr);
        s = sys.socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        const bool no_fd = s < 0 && (errno == EMFILE || errno == ENFILE);
        sockaddr_un sa{};
        sa.sun_family = AF_UNIX;
        std::memcpy(sa.sun_path, cpath, sizeof cpath);
        const std::uint32_t ms = settings().upgrade_timeout_ms;
        const std::uint64_t deadline = monotonic_ns() + std::uint64_t(ms) * 1000000;
        timeval tv{time_t(ms / 1000), suseconds_t((ms % 1000) * 1000)};
        why = no_fd ? Reason::fd_limit : Reason::timeout;
        if (s >= 0) sys.setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        int rc = -1;
        if (s >= 0)
            do rc = sys.connect(s, reinterpret_cast<sockaddr *>(&sa), sizeof sa);
            while (rc != 0 && errno == EINTR && monotonic_ns() < deadline);
        unsigned cred_uid = 0;
        if (rc == 0) {
            if (!peer_cred_ok(s, e.pid, &cred_uid) || cred_uid != far_uid) {
                why = Reason::other_user;
            } else {
                CtlMsg req{};
                req.magic = kCtlMagic;
                req.version = kCtlVersion;
                req.type = std::uint16_t(CtlType::request);
                req.pid = pid_;
                req.conn_id = c->id;
                req.gen = c->gen;
                req.window = c->window;
                req.dumpable = std::uint32_t(dumpable());
                req.status = have_bell ? kHaveBell : 0;
                req.tuple = c->tuple;
                std::snprintf(req.addr, sizeof req.addr, "%s", ep_.name);
                // Across users no ring is offered, nor used: crossuser.hpp.
                const bool ring = c->ring_mr && !cross;
                req.ring_addr = ring ? std::uint64_t(std::uintptr_t(c->ring)) : 0;
                req.ring_key = ring ? fi_mr_key(c->ring_mr) : 0;
                int app_fd = cross ? proof_dup(c->stat->fd, c->tuple) : c->stat->fd;
                int fds[2] = {app_fd, doorbell_};
                ssize_t sent = -1;
                if (app_fd >= 0) do sent = send_ctl(s, req, fds, 2);
                    while (sent < 0 && errno == EINTR && monotonic_ns() < deadline);
                if (cross && app_fd >= 0) sys.close(app_fd);
                if (sent == sizeof req) {
                    // Across users the answer also carries the peer's own
                    // socket: its proof that it holds the other end.
                    int got_fds[2] = {-1, -1};
                    int got = recv_ctl_until(s, reply, got_fds, cross ? 2 : 1, deadline);
                    their_doorbell = got_fds[0];
                    their_proof = got_fds[1];
                    if (got == 0 && reply.type == std::uint16_t(CtlType::reply) &&
                        reply.conn_id >= kSlots)
                        why = Reason::peer_refused;  // its slot indexes its page: out of it
                    else if (got == 0 && reply.type == std::uint16_t(CtlType::reply))
                        why = reply.status == kConflict ? Reason::count_ : Reason(reply.status);
                    else if (got == -EMFILE || got == -ENFILE || got == -EPROTO)
                        why = Reason::fd_limit;  // the answer's doorbell found no fd here
                }
            }
        }
    }
    if (cross && why == Reason::none && reply.pid == e.pid) {
        Tuple proven;
        if (their_proof < 0 || tuple_of(their_proof, proven) != 0 ||
            !(proven == reversed(c->tuple)) || their_doorbell < 0 || !is_eventfd(their_doorbell)) {
            SD_LOG(info, "upgrade answer from pid %d (uid %u) without valid proof", int(e.pid),
                   far_uid);
            why = Reason::proof_failed;
        } else {
            std::lock_guard lock(conn_lock_);
            peer = attach_peer(e.pid, e.addr, their_doorbell, &why, far_dir);
            their_doorbell = -1;  // kept by attach_peer, or closed
        }
    }
    if (their_proof >= 0) sys.close(their_proof);
    const bool accepted = why == Reason::none && reply.pid == e.pid &&
                          (their_doorbell >= 0 || have_bell || (cross && peer));

    std::lock_guard lock(conn_lock_);
    // The answer's doorbell is kept even when we yield (conflict): the
    // crossing request that wins may have found the peer already attached.
    if (peer && reply.pid == e.pid && their_doorbell >= 0 && peer->doorbell < 0) {
        peer->doorbell = their_doorbell;
        their_doorbell = -1;
    }
    if (their_doorbell >= 0) sys.close(their_doorbell);
    if (accepted) {
        // Everything the fabric needs is in place before the commit: the
        // responder may send the moment it reads it.
        release_peer(c->peer);  // the one before a leave (rearmed), if any
        set_peer_locked(c, peer, reply, cross);
        c->stat->peer_pid = e.pid;
        // Sent before anything here says direct: should it fail, the
        // responder has given up too, and nothing went on the fabric. A
        // process that changed its privileges meanwhile commits nothing:
        // its connections stay on the kernel (the responder, without our
        // commit, gives up).
        if (!retired() && !c->held.load(std::memory_order_acquire) && send_commit(s, pid_)) {
            sys.close(s);
            go_direct(c);
            SD_LOG_CONN(info, *c->stat, "upgraded to direct (initiator, peer pid %d)", e.pid);
            announce_switch(c);
            return;
        }
        {
            std::lock_guard rx(c->rx_lock);
            c->peer = nullptr;
        }
        why = retired()                                   ? Reason::privilege
              : c->held.load(std::memory_order_acquire) ? Reason(c->held_why.load())
                                                        : Reason::timeout;
    }
    if (s >= 0) sys.close(s);
    release_peer(peer);
    if (why == Reason::count_) {
        // Crossed requests: the accepting side's request wins; ours yields.
        // The state may already be the winner's (committing, direct).
        expect = ConnState::initiating;
        c->state.compare_exchange_strong(expect, ConnState::kernel);
        return;
    }
    if (why == Reason::none) why = Reason::peer_refused;
    // Only our own attempt ends here: a crossing request we answered owns
    // the state from committing on.
    expect = ConnState::initiating;
    if (!c->state.compare_exchange_strong(expect, ConnState::final)) return;
    set_final(c, why);  // logs it
}

void Engine::go_direct(Conn *c) noexcept {
    c->stat->reason.store(std::uint32_t(Reason::none), std::memory_order_relaxed);
    c->stat->mode.store(std::uint32_t(Mode::direct), std::memory_order_relaxed);
    c->stat->upgrades.fetch_add(1, std::memory_order_relaxed);
    c->state.store(ConnState::direct, std::memory_order_release);
    unpublish(c);
    std::lock_guard rx(c->rx_lock);
    c->wake_locked();
}

namespace {

CtlMsg reply_to(pid_t self, CtlType type) noexcept {
    CtlMsg m{};
    m.magic = kCtlMagic;
    m.version = kCtlVersion;
    m.type = std::uint16_t(type);
    m.pid = self;
    return m;
}

}  // namespace

int ask_owner_to_leave(pid_t owner, int fd, Reason why) noexcept {
    Guard guard;
    CtlMsg req = reply_to(getpid(), CtlType::leave);
    req.status = std::uint32_t(why);
    if (tuple_of(fd, req.tuple) != 0) return -ENOTCONN;
    // The owner's death ends the wait: a child of it holds its listening
    // control socket too (inherited), so a connect to a dead owner still
    // succeeds and nobody would ever answer. Its pidfd is readable once it
    // has exited, reaped or not.
    const int pfd = int(syscall(SYS_pidfd_open, owner, 0));
    if (pfd < 0 && errno == ESRCH) return -ESRCH;
    auto owner_dead = [pfd] {
        pollfd p{pfd, POLLIN, 0};
        return pfd >= 0 && sys.poll(&p, 1, 0) == 1;
    };
    if (owner_dead()) {
        sys.close(pfd);
        return -ESRCH;
    }
    char path[108];
    ctl_path(path, sizeof path, owner);
    int s = sys.socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0) {
        const int err = errno;
        if (pfd >= 0) sys.close(pfd);
        return -err;
    }
    // The owner waits up to the leave timeout for its peer.
    const std::uint32_t ms = settings().leave_timeout_ms + 2000;
    const std::uint64_t deadline = monotonic_ns() + std::uint64_t(ms) * 1000000ull;
    timeval tv{time_t(ms / 1000), suseconds_t((ms % 1000) * 1000)};
    sys.setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, path, sizeof path);
    int rc = -ESRCH;
    CtlMsg rep{};
    int none = -1;
    if (sys.connect(s, reinterpret_cast<sockaddr *>(&sa), sizeof sa) == 0) {
        rc = -EPERM;
        if (peer_cred_ok(s, owner)) {
            rc = -ETIMEDOUT;
            if (send_ctl(s, req, &fd, 1) == sizeof req) {
                // In slices: the owner may die while we wait.
                for (;;) {
                    const std::uint64_t slice = std::min<std::uint64_t>(deadline, monotonic_ns() + 50000000ull);
                    const int got = recv_ctl_until(s, rep, &none, 0, slice);
                    if (got == 0) {
                        if (rep.type == std::uint16_t(CtlType::reply) && rep.pid == owner)
                            rc = rep.status == std::uint32_t(Reason::none)         ? 0
                                 : rep.status == std::uint32_t(Reason::disconnect) ? -ECONNRESET
                                                                                  : -EIO;
                        break;
                    }
                    if (owner_dead()) {
                        rc = -ESRCH;
                        break;
                    }
                    if (got != -ETIMEDOUT || monotonic_ns() >= deadline) break;
                }
            }
        }
    } else if (!owner_dead()) {
        rc = errno == ENOENT || errno == ECONNREFUSED ? -ESRCH : -errno;
    }
    sys.close(s);
    if (pfd >= 0) sys.close(pfd);
    return rc;
}

void Engine::kick(const Peer *p) noexcept {
    if (!p || p->pid == pid_) {
        progress();
        return;
    }
    CtlMsg req = reply_to(pid_, CtlType::kick);
    char path[108];
    ctl_path(path, sizeof path, p->pid, p->cross ? p->dir : nullptr);
    // Non-blocking: a full backlog means its control thread is busy, and
    // the next kick tries again.
    int s = sys.socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0) return;
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, path, sizeof path);
    if (sys.connect(s, reinterpret_cast<sockaddr *>(&sa), sizeof sa) == 0)
        (void)send_ctl(s, req, nullptr, 0);
    sys.close(s);
}

std::uint64_t Engine::kick_overdue(const Peer *p, std::uint64_t asked_ns,
                                   std::uint64_t *kicked_ns) noexcept {
    const std::uint64_t now = monotonic_ns();
    std::uint64_t due = *kicked_ns ? *kicked_ns + kKickAgainNs : asked_ns + kKickAfterNs;
    if (now >= due) {
        kick(p);
        *kicked_ns = now;
        due = now + kKickAgainNs;
    }
    return due;
}

void Engine::handle_leave(int fd, pid_t pid, const Tuple &tuple, int proof, Reason why) noexcept {
    CtlMsg rep = reply_to(pid_, CtlType::reply);
    Tuple proven;
    if (!peer_cred_ok(fd, pid)) {
        rep.status = std::uint32_t(Reason::other_user);
    } else if (tuple_of(proof, proven) != 0 || !(proven == tuple)) {
        rep.status = std::uint32_t(Reason::proof_failed);
    } else {
        std::lock_guard lock(conn_lock_);
        Conn *c = find_tuple(tuple);
        // Not ours (any more): the kernel carries it all already.
        if (c) {
            if (const int rc = leave_locked(c, why); rc < 0) {
                SD_LOG(error, "fd %d: pid %d asked us to leave the fabric (%s) and we could not: "
                              "%s", c->stat->fd, int(pid), reason_name(why), std::strerror(-rc));
                // Bytes of the connection were lost here (its peer died
                // before they were read): a reset for the asking holder.
                rep.status = std::uint32_t(rc == -ECONNRESET ? Reason::disconnect : Reason::timeout);
            }
        }
    }
    if (proof >= 0) sys.close(proof);
    send_ctl(fd, rep, nullptr, 0, MSG_DONTWAIT);
}

void Engine::handle_request(int fd) noexcept {
    CtlMsg req{};
    int fds[2];
    // The request is nearly always queued by the time we accept; a
    // client that connected and sends nothing gets a second.
    int got = recv_ctl(fd, req, fds, 2, MSG_DONTWAIT);
    if (got == -EAGAIN) got = recv_ctl_until(fd, req, fds, 2, monotonic_ns() + 1000000000ull);
    if (got != 0) return;
    int proof = fds[0], bell = fds[1];
    if (req.type == std::uint16_t(CtlType::kick)) {
        for (int f : fds)
            if (f >= 0) sys.close(f);
        // Until the queue is empty (a sender may be waiting for room in
        // it), within a bound: new messages may keep coming.
        unsigned uid = 0;
        if (peer_cred_ok(fd, req.pid, &uid) && (uid == getuid() || is_peer(req.pid)))
            for (int pass = 0; pass < kKickPasses && progress(); ++pass) {
            }
        return;
    }
    if (req.type == std::uint16_t(CtlType::leave)) {
        if (bell >= 0) sys.close(bell);
        // A leave for good keeps its reason; any other is for sharing.
        const Reason why = req.status == std::uint32_t(Reason::exec) ||
                                   req.status == std::uint32_t(Reason::stdio) ||
                                   req.status == std::uint32_t(Reason::passed) ||
                                   req.status == std::uint32_t(Reason::privilege)
                               ? Reason(req.status)
                               : Reason::shared;
        return handle_leave(fd, req.pid, req.tuple, proof, why);
    }
    CtlMsg rep{};
    rep.magic = kCtlMagic;
    rep.version = kCtlVersion;
    rep.type = std::uint16_t(CtlType::reply);
    rep.pid = pid_;
    const bool we_dump = dumpable();
    rep.dumpable = std::uint32_t(we_dump);
    int my_proof = -1;  // across users: our own socket, proof for the initiator
    auto refuse = [&](std::uint32_t status) {
        rep.status = status;
        if (proof >= 0) sys.close(proof);
        if (bell >= 0) sys.close(bell);
        if (my_proof >= 0) sys.close(my_proof);
        send_ctl(fd, rep, nullptr, 0, MSG_DONTWAIT);
    };
    if (req.type != std::uint16_t(CtlType::request) || proof < 0 || bell < 0 || !fabric_usable() ||
        retired() || req.conn_id >= kSlots)
        return refuse(std::uint32_t(Reason::peer_refused));
    unsigned uid = 0;
    if (!peer_cred_ok(fd, req.pid, &uid)) return refuse(std::uint32_t(Reason::other_user));
    req.addr[sizeof req.addr - 1] = '\0';
    // Another uid (SDIRECT_CROSS_USER): its page and control socket are in
    // its own registry, and its doorbell must be what it claims.
    const bool cross = uid != unsigned(getuid());
    char far_dir[64] = {};
    if (cross && (registry_of_uid(uid, far_dir, sizeof far_dir) != 0 || !is_eventfd(bell)))
        return refuse(std::uint32_t(Reason::other_user));

    Conn *c = nullptr;
    std::uint32_t id = 0, gen = 0;
    {
        std::lock_guard lock(conn_lock_);
        c = find_tuple(reversed(req.tuple));
        if (!c) return refuse(std::uint32_t(Reason::no_peer));
        Tuple proven;
        if (tuple_of(proof, proven) != 0 || !(proven == req.tuple)) {
            SD_LOG(info, "upgrade request from pid %d without valid proof", int(req.pid));
            return refuse(std::uint32_t(Reason::proof_failed));
        }
        if (!we_dump || !req.dumpable) {
            set_final(c, Reason::not_dumpable);
            return refuse(std::uint32_t(Reason::not_dumpable));
        }
        if (req.pid == pid_ && !settings().same_process) {
            set_final(c, Reason::same_process);
            return refuse(std::uint32_t(Reason::same_process));
        }
        // Proven to hold the other end: only now is anything of ours opened
        // to its uid, and our answer proves the same to it.
        if (cross && (open_to_uid(uid) != 0 || (my_proof = proof_dup(c->stat->fd, c->tuple)) < 0))
            return refuse(std::uint32_t(Reason::other_user));
        ConnState st = c->state.load();
        if (c->held.load(std::memory_order_acquire) ||
            !(st == ConnState::kernel || (st == ConnState::initiating && !c->acceptor)))
            return refuse(kConflict);
        Reason why = Reason::none;
        Peer *peer = nullptr;
        if (make_ring(c) == 0)
            peer = attach_peer(req.pid, req.addr, bell, &why, cross ? far_dir : nullptr);
        else sys.close(bell);
        bell = -1;  // kept by attach_peer, or closed
        if (!peer) {
            if (why == Reason::none) why = Reason::fabric_error;
            set_final(c, why);
            return refuse(std::uint32_t(why));
        }
        // Our own request, if one is in flight, yields to this one (the
        // peer answers it with a conflict) and leaves the state alone.
        c->state.store(ConnState::committing, std::memory_order_release);
        // Everything the fabric needs is in place before we answer: the
        // initiator may send the moment it has committed, before we read
        // its commit, and our receives take what arrives.
        release_peer(c->peer);  // the one before a leave (rearmed), if any
        set_peer_locked(c, peer, req, cross);
        c->stat->peer_pid = req.pid;
        id = c->id;
        gen = c->gen;
        const bool ring = c->ring_mr && !cross;
        rep.ring_addr = ring ? std::uint64_t(std::uintptr_t(c->ring)) : 0;
        rep.ring_key = ring ? fi_mr_key(c->ring_mr) : 0;
        rep.conn_id = c->id;
        rep.gen = c->gen;
        rep.window = c->window;
    }
    rep.status = std::uint32_t(Reason::none);
    if (proof >= 0) sys.close(proof);
    bool committed = false;
    const int answer_fds[2] = {doorbell_, my_proof};
    const int nanswer = cross ? 2 : (req.status & kHaveBell) ? 0 : 1;
    const ssize_t answered = send_ctl(fd, rep, answer_fds, nanswer, MSG_DONTWAIT);
    if (my_proof >= 0) sys.close(my_proof);
    if (answered == sizeof rep) {
        const std::uint64_t deadline =
            monotonic_ns() + std::uint64_t(settings().upgrade_timeout_ms) * 1000000;
        CtlMsg word{};
        int none = -1;
        int rc = recv_ctl_until(fd, word, &none, 0, deadline);
        if (rc == -ETIMEDOUT) {
            // Give up, atomically against the initiator's commit: after the
            // shutdown its send fails, so a commit is either queued now or
            // never sent.
            sys.shutdown(fd, SHUT_RDWR);
            rc = recv_ctl(fd, word, &none, 0);
        }
        committed = rc == 0 && word.type == std::uint16_t(CtlType::commit) && word.pid == req.pid;
    }

    std::lock_guard lock(conn_lock_);
    // The connection may have been closed meanwhile (the slot then holds
    // another generation, or nothing), and its close dropped the peer.
    Conn *now = conns_[id].load(std::memory_order_acquire);
    if (now != c || c->gen != gen || c->state.load() != ConnState::committing) return;
    if (!committed) {
        release_peer(c->peer);
        {
            std::lock_guard rx(c->rx_lock);
            c->peer = nullptr;
        }
        SD_LOG(debug, "fd %d: peer pid %d did not commit its upgrade", c->stat->fd,
               int(req.pid));
        set_final(c, Reason::timeout);  // logs it
        return;
    }
    go_direct(c);
    SD_LOG_CONN(info, *c->stat, "upgraded to direct (responder, peer pid %d)", int(req.pid));
    if (retired() || c->held.load(std::memory_order_acquire)) {
        // This process changed its privileges, or execs, or forked, while
        // the commit was on its way (hold's wait for an upgrade under way
        // is bounded): the initiator is direct already, so the connection
        // leaves at once, for good, as it would have had it been direct.
        const Reason why = retired() ? Reason::privilege : Reason(c->held_why.load());
        if (const int rc = leave_locked(c, why); rc < 0)
            SD_LOG(error, "fd %d: upgraded after a change of privileges, and it could not leave "
                          "the fabric: %s", c->stat->fd, std::strerror(-rc));
        return;
    }
    announce_switch(c);
}

}  // namespace sd::transport
