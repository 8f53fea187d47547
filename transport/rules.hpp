// Which connections to accelerate: the rules file named by SDIRECT_RULES.
//
// One rule per line, the first that matches a connection decides; a
// connection no rule matches may go direct. '#' starts a comment.
//
//   ACTION [program=NAME] [user=UID|NAME] [role=client|server]
//          [local=ADDR:PORT] [remote=ADDR:PORT]
//
// ACTION is `direct` (may upgrade) or `kernel` (stays on TCP, reason
// `rule`). program is the process's short name (comm, as ps shows it);
// user its real uid; role says whether the process connected (client) or
// accepted (server). ADDR is `*`, an IPv4 address or [IPv6 address], with
// an optional /PREFIX; PORT is `*`, a number or a range LOW-HIGH. A field
// left out matches everything.
//
// A file that cannot be read or parsed keeps every connection on TCP
// (the user asked for rules and did not get them), with one error line
// naming the file, the line and what is wrong.
#pragma once
#include <cstddef>
#include <cstdint>
#include <sys/socket.h>

namespace sd::transport {

struct RulePeer {
    bool any = true;
    int family = 0;                  // AF_INET or AF_INET6 (any: 0)
    std::uint8_t addr[16] = {};
    int prefix = 0;                  // bits of addr that must match
    std::uint16_t port_lo = 0, port_hi = 65535;
};

struct Rule {
    bool kernel = false;
    char program[16] = {};           // empty: any
    bool any_user = true;
    std::uint32_t uid = 0;
    int role = 0;                    // 0 any, 1 client, 2 server
    RulePeer local, remote;
    int line = 0;
};

inline constexpr std::size_t kMaxRules = 64;

struct RuleSet {
    Rule rules[kMaxRules];
    std::size_t count = 0;
    // Set when the file could not be read or parsed: every connection
    // stays on TCP. Holds the one-line complaint.
    char error[200] = {};
};

// Parses `text` (the file's contents; `name` for messages) into `out`.
// True when every line was understood; else out.error says why.
bool parse_rules(const char *text, const char *name, RuleSet &out) noexcept;

// Reads SDIRECT_RULES once (the library's constructor); logs the error,
// if any, on stderr.
void load_rules() noexcept;
// True when rules are in force (a file was named).
bool rules_active() noexcept;
const RuleSet &rules() noexcept;

// The verdict for a connection of this process: true keeps it on TCP.
bool rules_keep_on_kernel(const RuleSet &set, const char *program, std::uint32_t uid, bool acceptor,
                          const sockaddr *local, const sockaddr *remote) noexcept;
// The same for the socket `fd`, from the loaded rules (its addresses
// from the kernel). False when no rules are in force.
bool rules_keep_fd_on_kernel(int fd, bool acceptor) noexcept;

// One rule as text, for sdirect-info.
void format_rule(const Rule &r, char *buf, std::size_t len) noexcept;

}  // namespace sd::transport
