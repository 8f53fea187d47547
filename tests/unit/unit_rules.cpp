// The rules file (SDIRECT_RULES): what parses, what is refused with which
// message, and which connection each rule matches, first match first.
#include <catch2/catch.hpp>

#include "transport/rules.hpp"

#include <arpa/inet.h>
#include <cstring>
#include <netinet/in.h>
#include <string>

using namespace sd::transport;

namespace {

sockaddr_in v4(const char *addr, unsigned port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(std::uint16_t(port));
    REQUIRE(inet_pton(AF_INET, addr, &a.sin_addr) == 1);
    return a;
}

sockaddr_in6 v6(const char *addr, unsigned port) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(std::uint16_t(port));
    REQUIRE(inet_pton(AF_INET6, addr, &a.sin6_addr) == 1);
    return a;
}

const sockaddr *sa(const sockaddr_in &a) { return reinterpret_cast<const sockaddr *>(&a); }
const sockaddr *sa(const sockaddr_in6 &a) { return reinterpret_cast<const sockaddr *>(&a); }

RuleSet parsed(const char *text) {
    RuleSet set;
    INFO(text);
    REQUIRE(parse_rules(text, "rules", set));
    CHECK(set.error[0] == '\0');
    return set;
}

std::string refused(const char *text) {
    RuleSet set;
    CHECK_FALSE(parse_rules(text, "rules", set));
    return set.error;
}

}  // namespace

TEST_CASE("rules: blank lines and comments make no rule, and no rule means direct", "[rules]") {
    RuleSet set = parsed("\n# nothing\n   \t\n");
    CHECK(set.count == 0);
    auto l = v4("127.0.0.1", 5000), r = v4("127.0.0.1", 6000);
    CHECK_FALSE(rules_keep_on_kernel(set, "redis-server", 0, true, sa(l), sa(r)));
}

TEST_CASE("rules: the first rule that matches decides", "[rules]") {
    RuleSet set = parsed("direct program=psql remote=*:5432\n"
                         "kernel remote=*:5432\n"
                         "kernel role=server local=127.0.0.0/8:6379\n"
                         "kernel user=1000\n");
    REQUIRE(set.count == 4);
    auto pg = v4("127.0.0.1", 5432), me = v4("127.0.0.1", 40000);
    CHECK_FALSE(rules_keep_on_kernel(set, "psql", 0, false, sa(me), sa(pg)));
    CHECK(rules_keep_on_kernel(set, "pgbench", 0, false, sa(me), sa(pg)));
    auto redis = v4("127.0.0.5", 6379), other = v4("10.1.2.3", 6379);
    CHECK(rules_keep_on_kernel(set, "redis-server", 0, true, sa(redis), sa(me)));
    CHECK_FALSE(rules_keep_on_kernel(set, "redis-server", 0, false, sa(redis), sa(me)));
    CHECK_FALSE(rules_keep_on_kernel(set, "redis-server", 0, true, sa(other), sa(me)));
    CHECK(rules_keep_on_kernel(set, "anything", 1000, true, sa(other), sa(me)));
    CHECK_FALSE(rules_keep_on_kernel(set, "anything", 1001, true, sa(other), sa(me)));
}

TEST_CASE("rules: port ranges, prefixes and IPv6, IPv4-mapped peers match IPv4 rules", "[rules]") {
    RuleSet set = parsed("kernel remote=[fd00::]/8:8000-8099\n"
                         "kernel remote=192.168.0.0/23:*\n");
    auto me = v6("::1", 1234);
    CHECK(rules_keep_on_kernel(set, "x", 0, false, sa(me), sa(v6("fd12::1", 8050))));
    CHECK_FALSE(rules_keep_on_kernel(set, "x", 0, false, sa(me), sa(v6("fd12::1", 8100))));
    CHECK_FALSE(rules_keep_on_kernel(set, "x", 0, false, sa(me), sa(v6("fe80::1", 8050))));
    CHECK(rules_keep_on_kernel(set, "x", 0, false, sa(me), sa(v6("::ffff:192.168.1.200", 9))));
    CHECK_FALSE(rules_keep_on_kernel(set, "x", 0, false, sa(me), sa(v6("::ffff:192.168.2.1", 9))));
    CHECK(rules_keep_on_kernel(set, "x", 0, false, sa(v4("127.0.0.1", 1)), sa(v4("192.168.1.1", 2))));
}

TEST_CASE("rules: user names are looked up in /etc/passwd", "[rules]") {
    RuleSet set = parsed("kernel user=root\n");
    REQUIRE(set.count == 1);
    CHECK(set.rules[0].uid == 0);
    CHECK(refused("kernel user=no-such-user-here\n") ==
          "rules line 1: bad value in 'user=no-such-user-here'");
}

TEST_CASE("rules: a line that cannot be understood is refused with its line and word",
          "[rules]") {
    CHECK(refused("direct\nallow program=x\n") ==
          "rules line 2: action is not direct or kernel: 'allow'");
    CHECK(refused("kernel port=80\n") ==
          "rules line 1: key is not program, user, role, local or remote: 'port'");
    CHECK(refused("kernel remote\n") == "rules line 1: expected KEY=VALUE, got 'remote'");
    CHECK(refused("kernel remote=*:70000\n") == "rules line 1: bad value in 'remote=*:70000'");
    CHECK(refused("kernel remote=*:9-8\n") == "rules line 1: bad value in 'remote=*:9-8'");
    CHECK(refused("kernel local=1.2.3.4/33:*\n") == "rules line 1: bad value in 'local=1.2.3.4/33:*'");
    CHECK(refused("kernel role=both\n") == "rules line 1: bad value in 'role=both'");
    CHECK(refused("kernel remote=[::1]/x:80\n") == "rules line 1: bad value in 'remote=[::1]/x:80'");
    CHECK(refused("kernel remote=[::1]/129:80\n") == "rules line 1: bad value in 'remote=[::1]/129:80'");
    CHECK(refused("kernel program=a-name-longer-than-comm\n") ==
          "rules line 1: bad value in 'program=a-name-longer-than-comm'");
}

TEST_CASE("rules: an unusable file keeps every connection on TCP", "[rules]") {
    RuleSet set;
    REQUIRE_FALSE(parse_rules("direct\nnonsense\n", "rules", set));
    auto l = v4("127.0.0.1", 5000), r = v4("127.0.0.1", 6000);
    CHECK(rules_keep_on_kernel(set, "x", 0, false, sa(l), sa(r)));
}

TEST_CASE("rules: each rule prints back as it was understood", "[rules]") {
    RuleSet set = parsed("kernel program=psql user=0 role=client local=10.0.0.0/8:* "
                         "remote=[::1]:5432\n");
    char line[256];
    format_rule(set.rules[0], line, sizeof line);
    CHECK(std::string(line) == "line 1: kernel program=psql user=0 role=client "
                               "local=10.0.0.0/8:* remote=[::1]:5432");
}
