#include "crossuser.hpp"

#include "conn.hpp"
#include "engine.hpp"
#include "log.hpp"
#include "settings.hpp"
#include "sys.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <mutex>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/xattr.h>
#include <unistd.h>

namespace sd::transport {
namespace {

constexpr char kShm[] = "/dev/shm";
constexpr char kPrefix[] = "sdirect-";
constexpr int kMaxAclUsers = 32;  // uids one file is opened to

// The kernel's xattr form of a POSIX ACL (linux/posix_acl_xattr.h).
constexpr char kAclName[] = "system.posix_acl_access";
constexpr std::uint32_t kAclVersion = 2;
enum : std::uint16_t { kUserObj = 1, kUser = 2, kGroupObj = 4, kMask = 0x10, kOther = 0x20 };
constexpr std::uint32_t kNoId = ~0u;
struct AclEntry {
    std::uint16_t tag;
    std::uint16_t perm;
    std::uint32_t id;
};

std::mutex grant_lock;  // a grant reads, extends and writes the ACL back

// A registry of `uid` only: a real directory, owned by it, that no one
// else may read or write (so that nothing in it was planted by a third user).
bool trusted_dir(const char *path, unsigned uid) noexcept {
    struct stat st;
    return lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && unsigned(st.st_uid) == uid &&
           (st.st_mode & 066) == 0;
}

}  // namespace

bool cross_user_on() noexcept { return settings().cross_user; }

bool dumpable() noexcept { return prctl(PR_GET_DUMPABLE) == 1; }

int tcp_socket_uid(const Tuple &t, unsigned *uid) noexcept {
    struct {
        nlmsghdr nh;
        inet_diag_req_v2 req;
    } q{};
    q.nh.nlmsg_len = sizeof q;
    q.nh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    q.nh.nlmsg_flags = NLM_F_REQUEST;  // one socket, found by its 4-tuple
    q.req.sdiag_family = std::uint8_t(t.family);
    q.req.sdiag_protocol = IPPROTO_TCP;
    q.req.idiag_states = ~0u;
    q.req.id.idiag_sport = htons(t.local_port);
    q.req.id.idiag_dport = htons(t.peer_port);
    const std::size_t alen = t.family == AF_INET ? 4 : 16;
    std::memcpy(q.req.id.idiag_src, t.local_addr, alen);
    std::memcpy(q.req.id.idiag_dst, t.peer_addr, alen);
    q.req.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
    q.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    int s = sys.socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (s < 0) return -errno;
    timeval tv{1, 0};
    sys.setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_nl kernel{};
    kernel.nl_family = AF_NETLINK;
    int rc = -EIO;
    if (sys.sendto(s, &q, sizeof q, 0, reinterpret_cast<sockaddr *>(&kernel), sizeof kernel) ==
        ssize_t(sizeof q)) {
        alignas(nlmsghdr) char buf[4096];
        ssize_t n = sys.recv(s, buf, sizeof buf, 0);
        rc = n < 0 ? -errno : -EIO;
        const auto *h = reinterpret_cast<const nlmsghdr *>(buf);
        if (n >= ssize_t(sizeof(nlmsghdr)) && NLMSG_OK(h, std::size_t(n))) {
            if (h->nlmsg_type == NLMSG_ERROR) {
                const auto *e = static_cast<const nlmsgerr *>(NLMSG_DATA(h));
                rc = h->nlmsg_len >= NLMSG_LENGTH(sizeof *e) && e->error ? e->error : -EIO;
            } else if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY &&
                       h->nlmsg_len >= NLMSG_LENGTH(sizeof(inet_diag_msg))) {
                const auto *m = static_cast<const inet_diag_msg *>(NLMSG_DATA(h));
                *uid = m->idiag_uid;
                rc = 0;
            }
        }
    }
    sys.close(s);
    return rc;
}

int proof_dup(int fd, const Tuple &t) noexcept {
    // libc's own: our fcntl would track the copy as a second fd of the
    // application's socket, and the application's close of it would then
    // never be its last.
    int d = sys.fcntl(fd, F_DUPFD_CLOEXEC, 0);
    Tuple now;
    if (d >= 0 && (tuple_of(d, now) != 0 || !(now == t))) {
        sys.close(d);
        d = -1;
    }
    return d;
}

bool is_eventfd(int fd) noexcept {
    char link[64], want[] = "anon_inode:[eventfd]";
    char path[40];
    std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof link);
    return n == ssize_t(sizeof want - 1) && !std::memcmp(link, want, sizeof want - 1);
}

bool is_bell_socket(int fd) noexcept {
    int domain = 0, type = 0;
    socklen_t n = sizeof domain, m = sizeof type;
    return sys.getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &n) == 0 && domain == AF_UNIX &&
           sys.getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &m) == 0 && type == SOCK_DGRAM;
}

unsigned entry_mode() noexcept { return cross_user_on() ? 0644 : 0600; }

int registry_of_uid(unsigned uid, char *out, std::size_t n) noexcept {
    char base[64];
    std::snprintf(base, sizeof base, "%s/%s%u", kShm, kPrefix, uid);
    for (int i = 0; i < 64; ++i) {
        char name[80];
        if (i) std::snprintf(name, sizeof name, "%s-%d", base, i);
        else std::snprintf(name, sizeof name, "%s", base);
        struct stat st;
        if (lstat(name, &st) != 0) return -ENOENT;  // that uid would take this name: none yet
        // Someone else's, or not that uid's alone: its processes pass over
        // such a name too.
        if (!S_ISDIR(st.st_mode) || unsigned(st.st_uid) != uid || (st.st_mode & 066) != 0)
            continue;
        if (std::snprintf(out, n, "%s", name) >= int(n)) return -ENAMETOOLONG;
        return 0;
    }
    return -ENOENT;
}

int open_foreign_entry(const char *name, const Tuple &other_end, unsigned *uid, char *dir,
                       std::size_t n) noexcept {
    // Whose registry: the kernel names the owner of the other end's socket
    // (no directory listing, nothing cached that a new user's registry
    // could be missing from).
    unsigned owner = 0;
    int rc = tcp_socket_uid(other_end, &owner);
    if (rc) return rc;
    if (owner == unsigned(getuid())) return -ENOENT;  // ours: looked at already
    char where[64];
    if ((rc = registry_of_uid(owner, where, sizeof where))) return rc;
    char path[400];
    std::snprintf(path, sizeof path, "%s/%s", where, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return -errno;
    struct stat st;
    // Written by that uid itself: the directory is its alone, and the
    // file must be too (not a hard link to someone else's).
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || unsigned(st.st_uid) != owner ||
        !trusted_dir(where, owner)) {
        sys.close(fd);
        return -ENOENT;
    }
    *uid = owner;
    std::snprintf(dir, n, "%s", where);
    return fd;
}

int grant_uid(const char *path, unsigned uid, unsigned perm) noexcept {
    std::lock_guard lock(grant_lock);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_uid != getuid() || !S_ISREG(st.st_mode)) {
        sys.close(fd);
        return -EPERM;  // only a file of ours is ever opened to anyone
    }
    // The uids already there (named user entries), kept in order.
    unsigned users[kMaxAclUsers];
    int nusers = 0;
    char buf[8 + (kMaxAclUsers + 8) * sizeof(AclEntry)];
    ssize_t got = fgetxattr(fd, kAclName, buf, sizeof buf);
    if (got >= 4) {
        std::uint32_t version;
        std::memcpy(&version, buf, 4);
        for (ssize_t at = 4; version == kAclVersion && at + ssize_t(sizeof(AclEntry)) <= got;
             at += sizeof(AclEntry)) {
            AclEntry e;
            std::memcpy(&e, buf + at, sizeof e);
            if (e.tag == kUser && nusers < kMaxAclUsers) users[nusers++] = e.id;
        }
    }
    int at = 0;
    while (at < nusers && users[at] < uid) ++at;
    if (at < nusers && users[at] == uid) {
        sys.close(fd);
        return 0;
    }
    if (nusers == kMaxAclUsers) {
        sys.close(fd);
        return -ENOSPC;
    }
    std::memmove(users + at + 1, users + at, sizeof(unsigned) * std::size_t(nusers - at));
    users[at] = uid;
    ++nusers;
    // Entries in the kernel's order: owner, named users by id, group, mask,
    // others. The group and others get nothing.
    std::size_t len = 4;
    auto put = [&](std::uint16_t tag, std::uint16_t perm, std::uint32_t id) {
        AclEntry e{tag, perm, id};
        std::memcpy(buf + len, &e, sizeof e);
        len += sizeof e;
    };
    std::memcpy(buf, &kAclVersion, 4);
    put(kUserObj, 6, kNoId);
    for (int i = 0; i < nusers; ++i) put(kUser, std::uint16_t(perm), users[i]);
    put(kGroupObj, 0, kNoId);
    put(kMask, std::uint16_t(perm), kNoId);
    put(kOther, 0, kNoId);
    int rc = fsetxattr(fd, kAclName, buf, len, 0) == 0 ? 0 : -errno;
    sys.close(fd);
    if (rc) SD_LOG(info, "cannot open %s to uid %u: %s", path, uid, std::strerror(-rc));
    return rc;
}

void open_registry(const char *dir, const char *ctl_socket) noexcept {
    if (!cross_user_on()) return;
    // Searchable, not listable: a peer of another uid opens an entry whose
    // name it knows (the connection's 4-tuple) and our control socket.
    if (chmod(dir, 0711) != 0 || chmod(ctl_socket, 0666) != 0)
        SD_LOG(info, "cannot open the registry %s to other users: %s", dir, std::strerror(errno));
}

int Engine::open_to_uid(unsigned uid) noexcept {
    // Our page alone, read only: messages go by the link's queues, and our
    // shm region is never opened to another uid (the provider trusts it).
    if (!fabric_ok_) return -ENOTSUP;
    if (uid == unsigned(getuid())) return 0;  // a pair of one uid that is not dumpable
    char page[300];
    std::snprintf(page, sizeof page, "%s/p%d", settings().registry, int(pid_));
    return grant_uid(page, uid, 4);
}

}  // namespace sd::transport
