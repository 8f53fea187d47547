// Rendezvous. Each end of a new connection writes its half into the host
// registry, then looks for the other half; whoever finds it asks the
// owner's control thread to upgrade (handshake.cpp). Nothing is ever
// written into the TCP stream. Here: the entry's name (from the
// connection's 4-tuple), writing it whole and removing our own.
#include "conn_impl.hpp"
#include "crossuser.hpp"
#include "engine.hpp"
#include "registry.hpp"
#include "settings.hpp"
#include "sys.hpp"
#include "wait.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sd::transport {
namespace {

unsigned long netns_id() noexcept {
    static unsigned long id = [] {
        struct stat st;
        return stat("/proc/self/ns/net", &st) == 0 ? (unsigned long)st.st_ino : 0ul;
    }();
    return id;
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
    e.queues = std::uint32_t(!dumpable());
    // A name cut short would send the peer elsewhere: not published (we
    // may still find the peer's entry and initiate).
    const std::size_t name_len = std::strlen(ep_.name);
    if (name_len >= sizeof e.addr) return;
    std::memcpy(e.addr, ep_.name, name_len + 1);
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

}  // namespace sd::transport
