#include "rules.hpp"
#include "settings.hpp"
#include "sys.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <string>
#include <unistd.h>

namespace sd::transport {
namespace {

RuleSet loaded;
bool active = false;
char program_name[16];

bool fail(RuleSet &out, const char *name, int line, const char *what, const char *word) noexcept {
    std::snprintf(out.error, sizeof out.error, "%s line %d: %s '%.40s'", name, line, what, word);
    return false;
}

// A uid from a number, or from a name looked up in /etc/passwd (read
// directly: no NSS module runs inside the library's constructor).
bool parse_user(const char *text, std::uint32_t &uid) noexcept {
    char *end = nullptr;
    unsigned long v = std::strtoul(text, &end, 10);
    if (*text && *end == '\0') {
        uid = std::uint32_t(v);
        return v <= 0xffffffffu;
    }
    FILE *f = std::fopen("/etc/passwd", "re");
    if (!f) return false;
    char line[512];
    bool found = false;
    const std::size_t len = std::strlen(text);
    while (!found && std::fgets(line, sizeof line, f)) {
        // name:password:uid:...
        if (std::strncmp(line, text, len) != 0 || line[len] != ':') continue;
        const char *p = std::strchr(line + len + 1, ':');
        if (!p) continue;
        v = std::strtoul(p + 1, &end, 10);
        if (end != p + 1 && *end == ':') {
            uid = std::uint32_t(v);
            found = true;
        }
    }
    std::fclose(f);
    return found;
}

bool parse_ports(const char *text, RulePeer &p) noexcept {
    if (!std::strcmp(text, "*")) return true;
    char *end = nullptr;
    unsigned long lo = std::strtoul(text, &end, 10);
    unsigned long hi = lo;
    if (end == text) return false;
    if (*end == '-') {
        const char *h = end + 1;
        hi = std::strtoul(h, &end, 10);
        if (end == h) return false;
    }
    if (*end != '\0' || lo > hi || hi > 65535) return false;
    p.port_lo = std::uint16_t(lo);
    p.port_hi = std::uint16_t(hi);
    return true;
}

// ADDR:PORT, ADDR being *, a.b.c.d or [v6], each with an optional /PREFIX.
bool parse_peer(const char *text, RulePeer &p) noexcept {
    char buf[80];
    if (std::strlen(text) >= sizeof buf) return false;
    std::strcpy(buf, text);
    char *addr = buf;
    char *port;
    if (*addr == '[') {
        char *close = std::strchr(addr, ']');
        if (!close) return false;
        *close = '\0';
        ++addr;
        port = close + 1;
        char *slash = std::strchr(port, '/');
        char *colon = std::strrchr(port, ':');
        if (!colon) return false;
        *colon = '\0';
        p.prefix = 128;
        if (slash) {
            char *end = nullptr;
            long bits = std::strtol(slash + 1, &end, 10);
            if (end == slash + 1 || *end != '\0' || bits < 0 || bits > 128) return false;
            p.prefix = int(bits);
        }
        if (inet_pton(AF_INET6, addr, p.addr) != 1) return false;
        p.family = AF_INET6;
        p.any = false;
        return parse_ports(colon + 1, p);
    }
    char *colon = std::strrchr(addr, ':');
    if (!colon) return false;
    *colon = '\0';
    port = colon + 1;
    if (std::strcmp(addr, "*") != 0) {
        char *slash = std::strchr(addr, '/');
        p.prefix = 32;
        if (slash) {
            *slash = '\0';
            char *end = nullptr;
            long bits = std::strtol(slash + 1, &end, 10);
            if (end == slash + 1 || *end != '\0' || bits < 0 || bits > 32) return false;
            p.prefix = int(bits);
        }
        if (inet_pton(AF_INET, addr, p.addr) != 1) return false;
        p.family = AF_INET;
        p.any = false;
    }
    return parse_ports(port, p);
}

bool parse_line(char *line, const char *name, int number, RuleSet &out) noexcept {
    if (char *hash = std::strchr(line, '#')) *hash = '\0';
    char *save = nullptr;
    char *word = strtok_r(line, " \t\r\n", &save);
    if (!word) return true;  // blank or comment
    if (out.count == kMaxRules) return fail(out, name, number, "more rules than", "64");
    Rule r;
    r.line = number;
    if (!std::strcmp(word, "kernel")) r.kernel = true;
    else if (std::strcmp(word, "direct") != 0)
        return fail(out, name, number, "action is not direct or kernel:", word);
    while ((word = strtok_r(nullptr, " \t\r\n", &save))) {
        char *eq = std::strchr(word, '=');
        if (!eq) return fail(out, name, number, "expected KEY=VALUE, got", word);
        *eq = '\0';
        const char *value = eq + 1;
        bool ok = true;
        if (!std::strcmp(word, "program")) {
            ok = *value && std::strlen(value) < sizeof r.program;
            if (ok) std::strcpy(r.program, value);
        } else if (!std::strcmp(word, "user")) {
            r.any_user = false;
            ok = parse_user(value, r.uid);
        } else if (!std::strcmp(word, "role")) {
            r.role = !std::strcmp(value, "client") ? 1 : !std::strcmp(value, "server") ? 2 : 0;
            ok = r.role != 0;
        } else if (!std::strcmp(word, "local")) {
            ok = parse_peer(value, r.local);
        } else if (!std::strcmp(word, "remote")) {
            ok = parse_peer(value, r.remote);
        } else {
            return fail(out, name, number,
                        "key is not program, user, role, local or remote:", word);
        }
        if (!ok) {
            *eq = '=';
            return fail(out, name, number, "bad value in", word);
        }
    }
    out.rules[out.count++] = r;
    return true;
}

bool peer_matches(const RulePeer &p, const sockaddr *sa) noexcept {
    if (!sa) return p.any && p.port_lo == 0 && p.port_hi == 65535;
    std::uint16_t port;
    const std::uint8_t *bytes;
    std::uint8_t mapped[4];
    int family = sa->sa_family;
    if (family == AF_INET) {
        const auto *in = reinterpret_cast<const sockaddr_in *>(sa);
        port = ntohs(in->sin_port);
        bytes = reinterpret_cast<const std::uint8_t *>(&in->sin_addr);
    } else if (family == AF_INET6) {
        const auto *in6 = reinterpret_cast<const sockaddr_in6 *>(sa);
        port = ntohs(in6->sin6_port);
        bytes = in6->sin6_addr.s6_addr;
        // An IPv4 peer of a dual-stack socket matches IPv4 rules.
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && !p.any && p.family == AF_INET) {
            std::memcpy(mapped, bytes + 12, 4);
            bytes = mapped;
            family = AF_INET;
        }
    } else {
        return false;
    }
    if (port < p.port_lo || port > p.port_hi) return false;
    if (p.any) return true;
    if (family != p.family) return false;
    const int whole = p.prefix / 8, rest = p.prefix % 8;
    if (std::memcmp(bytes, p.addr, std::size_t(whole)) != 0) return false;
    if (!rest) return true;
    const std::uint8_t mask = std::uint8_t(0xff << (8 - rest));
    return (bytes[whole] & mask) == (p.addr[whole] & mask);
}

void format_peer(const RulePeer &p, char *buf, std::size_t len) noexcept {
    char addr[INET6_ADDRSTRLEN] = "*";
    char prefix[8] = "";
    if (!p.any) {
        inet_ntop(p.family, p.addr, addr, sizeof addr);
        if (p.prefix != (p.family == AF_INET ? 32 : 128)) std::snprintf(prefix, sizeof prefix, "/%d", p.prefix);
    }
    char port[16] = "*";
    if (p.port_lo != 0 || p.port_hi != 65535) {
        if (p.port_lo == p.port_hi) std::snprintf(port, sizeof port, "%u", unsigned(p.port_lo));
        else std::snprintf(port, sizeof port, "%u-%u", unsigned(p.port_lo), unsigned(p.port_hi));
    }
    const bool v6 = !p.any && p.family == AF_INET6;
    std::snprintf(buf, len, "%s%s%s%s:%s", v6 ? "[" : "", addr, v6 ? "]" : "", prefix, port);
}

}  // namespace

bool parse_rules(const char *text, const char *name, RuleSet &out) noexcept {
    out.count = 0;
    out.error[0] = '\0';
    int number = 0;
    while (*text) {
        ++number;
        const char *nl = std::strchr(text, '\n');
        const std::size_t len = nl ? std::size_t(nl - text) : std::strlen(text);
        char line[512];
        if (len >= sizeof line) return fail(out, name, number, "line longer than", "511 bytes");
        std::memcpy(line, text, len);
        line[len] = '\0';
        if (!parse_line(line, name, number, out)) return false;
        text += len + (nl ? 1 : 0);
    }
    return true;
}

void load_rules() noexcept {
    const char *path = settings().rules;
    if (!path || !*path) return;
    active = true;
    std::string text;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        std::snprintf(loaded.error, sizeof loaded.error, "%s: %s", path, std::strerror(errno));
    } else {
        char buf[4096];
        for (ssize_t n; (n = sys.read(fd, buf, sizeof buf)) > 0;) text.append(buf, std::size_t(n));
        sys.close(fd);
        parse_rules(text.c_str(), path, loaded);
    }
    if (loaded.error[0])
        std::fprintf(stderr, "sdirect: SDIRECT_RULES: %s; every connection stays on TCP\n",
                     loaded.error);
    // comm, as ps shows it (the name a rule's program= matches).
    fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = sys.read(fd, program_name, sizeof program_name - 1);
        sys.close(fd);
        if (n > 0 && program_name[n - 1] == '\n') --n;
        program_name[n > 0 ? n : 0] = '\0';
    }
}

bool rules_active() noexcept { return active; }

const RuleSet &rules() noexcept { return loaded; }

bool rules_keep_on_kernel(const RuleSet &set, const char *program, std::uint32_t uid, bool acceptor,
                          const sockaddr *local, const sockaddr *remote) noexcept {
    if (set.error[0]) return true;
    for (std::size_t i = 0; i < set.count; ++i) {
        const Rule &r = set.rules[i];
        if (r.program[0] && std::strcmp(r.program, program) != 0) continue;
        if (!r.any_user && r.uid != uid) continue;
        if (r.role && (r.role == 2) != acceptor) continue;
        if (!peer_matches(r.local, local) || !peer_matches(r.remote, remote)) continue;
        return r.kernel;
    }
    return false;
}

bool rules_keep_fd_on_kernel(int fd, bool acceptor) noexcept {
    if (!active) return false;
    sockaddr_storage local{}, remote{};
    socklen_t llen = sizeof local, rlen = sizeof remote;
    const bool have = getsockname(fd, reinterpret_cast<sockaddr *>(&local), &llen) == 0 &&
                      getpeername(fd, reinterpret_cast<sockaddr *>(&remote), &rlen) == 0;
    return rules_keep_on_kernel(loaded, program_name, std::uint32_t(getuid()), acceptor,
                                have ? reinterpret_cast<sockaddr *>(&local) : nullptr,
                                have ? reinterpret_cast<sockaddr *>(&remote) : nullptr);
}

void format_rule(const Rule &r, char *buf, std::size_t len) noexcept {
    char local[80], remote[80];
    format_peer(r.local, local, sizeof local);
    format_peer(r.remote, remote, sizeof remote);
    char user[16] = "*";
    if (!r.any_user) std::snprintf(user, sizeof user, "%u", r.uid);
    std::snprintf(buf, len, "line %d: %s program=%s user=%s role=%s local=%s remote=%s", r.line,
                  r.kernel ? "kernel" : "direct", r.program[0] ? r.program : "*", user,
                  r.role == 1 ? "client" : r.role == 2 ? "server" : "*", local, remote);
}

}  // namespace sd::transport
