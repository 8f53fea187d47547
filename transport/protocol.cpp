#include "protocol.hpp"

#include "log.hpp"
#include "settings.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sstream>
#include <unistd.h>

namespace sd::transport {
namespace {

Selection how = Selection::thresholds;
Protocol forced = Protocol::buffered;
TuneTable table;

// Smallest piece that is not a single inline message.
std::size_t beyond_inline() noexcept { return std::size_t(settings().chunk) + 1; }

}  // namespace

const char *protocol_name(Protocol p) noexcept {
    switch (p) {
    case Protocol::buffered: return "buffered";
    case Protocol::ring: return "ring";
    case Protocol::zcopy: return "zcopy";
    }
    return "?";
}

bool parse_protocol(const char *name, Protocol *out) noexcept {
    for (Protocol p : {Protocol::buffered, Protocol::ring, Protocol::zcopy})
        if (!std::strcmp(name, protocol_name(p))) {
            *out = p;
            return true;
        }
    return false;
}

int parse_tune(const std::string &text, TuneTable *out, std::string *error) {
    TuneTable t;
    std::istringstream in(text);
    int lineno = 0;
    for (std::string line; std::getline(in, line);) {
        ++lineno;
        if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
        std::istringstream words(line);
        std::string first;
        if (!(words >> first)) continue;
        char *end = nullptr;
        unsigned long long size = std::strtoull(first.c_str(), &end, 10);
        Protocol best{};
        bool have_best = false;
        for (std::string w; words >> w;)
            if (w.rfind("best=", 0) == 0) have_best = parse_protocol(w.c_str() + 5, &best);
        const bool ascending = t.n == 0 || size > t.size[t.n - 1];
        if (*end || !size || !have_best || !ascending || t.n == TuneTable::kMax) {
            if (error) *error = "line " + std::to_string(lineno) + ": '" + line + "'";
            return -1;
        }
        t.size[t.n] = size;
        t.best[t.n] = best;
        ++t.n;
    }
    *out = t;
    return t.n;
}

Protocol tune_lookup(const TuneTable &t, std::size_t len) noexcept {
    Protocol p = Protocol::buffered;
    for (int i = 0; i < t.n && t.size[i] <= len; ++i) p = t.best[i];
    return p;
}

void load_protocols() noexcept {
    const char *mode = settings().protocols;
    how = Selection::thresholds;
    if (!std::strcmp(mode, "thresholds")) return;
    if (parse_protocol(mode, &forced)) {
        how = Selection::forced;
        return;
    }
    if (std::strcmp(mode, "auto") != 0) {
        std::fprintf(stderr, "sdirect: SDIRECT_PROTOCOLS=%s is not thresholds, auto, buffered, "
                             "ring or zcopy; using thresholds\n", mode);
        return;
    }
    const char *path = settings().tune_file;
    std::string text;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char buf[4096];
        for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) text.append(buf, std::size_t(n));
        close(fd);
    }
    std::string error;
    if (fd < 0) {
        SD_LOG(info, "SDIRECT_PROTOCOLS=auto: no table at %s (run sdirect-tune); using the "
                     "thresholds", path);
    } else if (parse_tune(text, &table, &error) <= 0) {
        SD_LOG(error, "SDIRECT_PROTOCOLS=auto: %s: %s; using the thresholds", path,
               error.empty() ? "no sizes" : error.c_str());
    } else {
        how = Selection::table;
    }
}

Selection selection() noexcept { return how; }

bool use_zcopy(std::size_t len) noexcept {
    if (len < beyond_inline()) return false;
    switch (how) {
    case Selection::forced: return forced == Protocol::zcopy;
    case Selection::table: return tune_lookup(table, len) == Protocol::zcopy;
    case Selection::thresholds: break;
    }
    const std::uint32_t min = settings().zcopy_min;
    return min && len >= min;
}

bool use_ring(std::size_t len, std::int64_t credit) noexcept {
    const std::size_t n = credit > 0 ? std::min<std::size_t>(len, std::size_t(credit)) : 0;
    if (n < beyond_inline()) return false;
    switch (how) {
    case Selection::forced: return forced != Protocol::buffered;
    case Selection::table: return tune_lookup(table, n) != Protocol::buffered;
    case Selection::thresholds: break;
    }
    return len >= settings().rma_min && n >= settings().rma_min;
}

}  // namespace sd::transport
