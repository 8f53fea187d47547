// Addresses and 4-tuples: which addresses are this host's, a tuple seen
// from the peer, and the tuple read from a connected socket.
#include <catch2/catch.hpp>

#include "transport/conn_impl.hpp"
#include "transport/engine.hpp"
#include "transport/sys.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace sd::transport;

TEST_CASE("loopback and this host's interface addresses are local, a documentation address "
          "is not") {
    std::uint8_t a[16] = {};
    inet_pton(AF_INET, "127.0.0.1", a);
    CHECK(address_is_local(AF_INET, a));
    inet_pton(AF_INET, "127.9.8.7", a);
    CHECK(address_is_local(AF_INET, a));
    inet_pton(AF_INET6, "::1", a);
    CHECK(address_is_local(AF_INET6, a));
    inet_pton(AF_INET, "192.0.2.1", a);  // TEST-NET-1: never assigned
    CHECK(!address_is_local(AF_INET, a));
    inet_pton(AF_INET6, "2001:db8::1", a);
    CHECK(!address_is_local(AF_INET6, a));
    ifaddrs *all = nullptr;
    REQUIRE(getifaddrs(&all) == 0);
    for (ifaddrs *i = all; i; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET) {
            const auto *in = reinterpret_cast<const sockaddr_in *>(i->ifa_addr);
            CHECK(address_is_local(AF_INET, reinterpret_cast<const std::uint8_t *>(&in->sin_addr)));
        }
    freeifaddrs(all);
}

TEST_CASE("a reversed tuple is the peer's view and reverses back") {
    Tuple t{};
    t.family = AF_INET;
    t.local_port = 1;
    t.peer_port = 2;
    t.local_addr[0] = 10;
    t.peer_addr[0] = 20;
    Tuple r = reversed(t);
    CHECK(r.local_port == 2);
    CHECK(r.peer_port == 1);
    CHECK(r.local_addr[0] == 20);
    CHECK(r.peer_addr[0] == 10);
    CHECK(reversed(r) == t);
    CHECK_FALSE(r == t);
}

TEST_CASE("tuple_of reads a connected socket and refuses others") {
    resolve_sys();
    int l = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(l, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0);
    REQUIRE(::listen(l, 1) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(l, reinterpret_cast<sockaddr *>(&a), &len) == 0);
    int c = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(::connect(c, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0);
    int s = ::accept(l, nullptr, nullptr);
    REQUIRE(s >= 0);
    Tuple tc{}, ts{};
    REQUIRE(tuple_of(c, tc) == 0);
    REQUIRE(tuple_of(s, ts) == 0);
    CHECK(reversed(tc) == ts);
    CHECK(ts.local_port == ntohs(a.sin_port));
    Tuple tl{};
    CHECK(tuple_of(l, tl) == -ENOTCONN);
    ::close(c);
    ::close(s);
    ::close(l);
}
