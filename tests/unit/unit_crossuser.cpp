// The pieces of SDIRECT_CROSS_USER that need no second process: the ACL
// a file is opened to peer uids with, and which directory is a uid's
// registry (squatted names passed over).
#include <catch2/catch.hpp>

#include "transport/conn_impl.hpp"
#include "transport/crossuser.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <vector>

using namespace sd::transport;

namespace {

struct Ace {
    std::uint16_t tag, perm;
    std::uint32_t id;
};

std::vector<Ace> acl_of(const std::string &path) {
    char buf[512];
    ssize_t n = getxattr(path.c_str(), "system.posix_acl_access", buf, sizeof buf);
    std::vector<Ace> out;
    for (ssize_t at = 4; n > 0 && at + 8 <= n; at += 8) {
        Ace a;
        std::memcpy(&a, buf + at, sizeof a);
        out.push_back(a);
    }
    return out;
}

// A file of ours in /dev/shm (tmpfs: POSIX ACLs), removed at the end.
struct ShmFile {
    std::string path = "/dev/shm/sdirect-unit-acl-" + std::to_string(getpid());
    ShmFile() { close(open(path.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600)); }
    ~ShmFile() { unlink(path.c_str()); }
};

}  // namespace

TEST_CASE("a file is opened to each peer uid by one ACL entry; group and others get nothing",
          "[crossuser]") {
    ShmFile f;
    // Cross-user connections need ACLs on /dev/shm (tmpfs has them).
    REQUIRE(grant_uid(f.path.c_str(), 54321, 6) == 0);
    REQUIRE(grant_uid(f.path.c_str(), 12345, 6) == 0);
    REQUIRE(grant_uid(f.path.c_str(), 54321, 6) == 0);  // again: nothing added
    const std::vector<Ace> acl = acl_of(f.path);
    // The kernel's order: owner, named users by id, group, mask, others.
    REQUIRE(acl.size() == 6);
    CHECK((acl[0].tag == 1 && acl[0].perm == 6));
    CHECK((acl[1].tag == 2 && acl[1].id == 12345 && acl[1].perm == 6));
    CHECK((acl[2].tag == 2 && acl[2].id == 54321 && acl[2].perm == 6));
    CHECK((acl[3].tag == 4 && acl[3].perm == 0));
    CHECK((acl[4].tag == 0x10 && acl[4].perm == 6));
    CHECK((acl[5].tag == 0x20 && acl[5].perm == 0));
}

TEST_CASE("a page is opened read only", "[crossuser]") {
    ShmFile f;
    REQUIRE(grant_uid(f.path.c_str(), 54321, 4) == 0);
    const std::vector<Ace> acl = acl_of(f.path);
    REQUIRE(acl.size() == 5);
    CHECK((acl[1].tag == 2 && acl[1].id == 54321 && acl[1].perm == 4));
    CHECK((acl[3].tag == 0x10 && acl[3].perm == 4));
}

TEST_CASE("only a regular file of ours is ever opened to another uid", "[crossuser]") {
    std::string link = "/dev/shm/sdirect-unit-link-" + std::to_string(getpid());
    REQUIRE(symlink("/etc/passwd", link.c_str()) == 0);
    CHECK(grant_uid(link.c_str(), 54321, 6) == -ELOOP);  // O_NOFOLLOW
    unlink(link.c_str());
    CHECK(grant_uid("/dev/shm", 54321, 6) == -EPERM);  // not ours (root's as root: not a file)
}

TEST_CASE("a uid's registry is the first of its names that it owns alone", "[crossuser]") {
    if (geteuid() != 0) {
        WARN("SKIPPED: needs root (directories owned by other uids)");
        return;
    }
    const unsigned uid = 4000000000u + unsigned(getpid() % 1000000);
    const std::string base = "/dev/shm/sdirect-" + std::to_string(uid);
    char out[80];
    CHECK(registry_of_uid(uid, out, sizeof out) == -ENOENT);  // none yet
    // Squatted by another user: passed over, as that uid's processes do.
    REQUIRE(mkdir(base.c_str(), 0700) == 0);  // root's, not the uid's
    const std::string second = base + "-1";
    REQUIRE(mkdir(second.c_str(), 0711) == 0);
    REQUIRE(chown(second.c_str(), uid, 0) == 0);
    CHECK(registry_of_uid(uid, out, sizeof out) == 0);
    CHECK(std::string(out) == second);
    // Readable or writable by others: not that uid's alone.
    REQUIRE(chmod(second.c_str(), 0777) == 0);
    CHECK(registry_of_uid(uid, out, sizeof out) == -ENOENT);
    rmdir(second.c_str());
    rmdir(base.c_str());
}

namespace {
// A loopback connection: listener on `family` (AF_INET6: dual-stack ::),
// client to 127.0.0.1. Sets the client's and the accepted socket's fds.
bool connect_pair(int family, int *client, int *server) {
    int l = socket(family, SOCK_STREAM, 0);
    sockaddr_storage ss{};
    socklen_t len;
    if (family == AF_INET) {
        auto *a = reinterpret_cast<sockaddr_in *>(&ss);
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        len = sizeof *a;
    } else {
        auto *a = reinterpret_cast<sockaddr_in6 *>(&ss);
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_any;
        len = sizeof *a;
    }
    if (l < 0 || bind(l, reinterpret_cast<sockaddr *>(&ss), len) != 0 || listen(l, 1) != 0 ||
        getsockname(l, reinterpret_cast<sockaddr *>(&ss), &len) != 0)
        return false;
    const std::uint16_t port = family == AF_INET ? reinterpret_cast<sockaddr_in *>(&ss)->sin_port
                                                 : reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_port;
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = port;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    *client = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(*client, reinterpret_cast<sockaddr *>(&to), sizeof to) != 0) return false;
    *server = accept(l, nullptr, nullptr);
    close(l);
    return *server >= 0;
}
}  // namespace

TEST_CASE("the kernel names the uid holding a connection's other end, by its 4-tuple",
          "[crossuser]") {
    for (int family : {AF_INET, AF_INET6}) {
        INFO("listener family " << family);
        int c = -1, s = -1;
        REQUIRE(connect_pair(family, &c, &s));
        Tuple ct, st;
        REQUIRE(tuple_of(c, ct) == 0);
        REQUIRE(tuple_of(s, st) == 0);
        unsigned uid = ~0u;
        // The client looks up the server's end (reversed), and the other way.
        CHECK(tcp_socket_uid(reversed(ct), &uid) == 0);
        CHECK(uid == getuid());
        uid = ~0u;
        CHECK(tcp_socket_uid(reversed(st), &uid) == 0);
        CHECK(uid == getuid());
        Tuple none = ct;
        none.peer_port = std::uint16_t(ct.peer_port ^ 1);  // no such connection
        CHECK(tcp_socket_uid(none, &uid) == -ENOENT);
        close(c);
        close(s);
    }
}
