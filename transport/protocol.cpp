#include "protocol.hpp"

#include "log.hpp"
#include "settings.hpp"
#include "sys.hpp"

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

ProtocolPolicy policy() noexcept {
    ProtocolPolicy p;
    p.how = how;
    p.forced = forced;
    p.table = &table;
    p.chunk = std::size_t(settings().chunk);
    p.rma_min = settings().rma_min;
    p.zcopy_min = settings().zcopy_min;
    p.stream_ring = settings().stream_ring;
    return p;
}

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
        for (ssize_t n; (n = sys.read(fd, buf, sizeof buf)) > 0;) text.append(buf, std::size_t(n));
        sys.close(fd);
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

Protocol choose_protocol(const ProtocolPolicy &p, std::size_t len, std::int64_t credit,
                         bool zcopy_ok) noexcept {
    if (zcopy_ok && len > p.chunk) {
        bool zcopy = false;
        switch (p.how) {
        case Selection::forced: zcopy = p.forced == Protocol::zcopy; break;
        case Selection::table: zcopy = tune_lookup(*p.table, len) == Protocol::zcopy; break;
        case Selection::thresholds: zcopy = p.zcopy_min && len >= p.zcopy_min; break;
        }
        if (zcopy) return Protocol::zcopy;
    }
    const std::size_t n = credit > 0 ? std::min<std::size_t>(len, std::size_t(credit)) : 0;
    if (n <= p.chunk) return Protocol::buffered;
    bool ring = false;
    switch (p.how) {
    case Selection::forced: ring = p.forced != Protocol::buffered; break;
    case Selection::table: ring = tune_lookup(*p.table, n) != Protocol::buffered; break;
    case Selection::thresholds: ring = len >= p.rma_min && n >= p.rma_min; break;
    }
    return ring ? Protocol::ring : Protocol::buffered;
}

bool use_zcopy(std::size_t len) noexcept {
    return choose_protocol(policy(), len, 0, true) == Protocol::zcopy;
}

bool use_ring(std::size_t len, std::int64_t credit) noexcept {
    return choose_protocol(policy(), len, credit, false) == Protocol::ring;
}

bool stream_takes_ring(const ProtocolPolicy &p, std::size_t len, std::size_t ring_cap) noexcept {
    return p.how == Selection::thresholds && p.stream_ring && len <= ring_cap / 4;
}

bool stream_by_ring(std::size_t len, std::size_t ring_cap) noexcept {
    return stream_takes_ring(policy(), len, ring_cap);
}

std::string format_tune_line(std::uint64_t size, Protocol best, const double (&mbps)[3]) {
    std::string line = std::to_string(size) + " best=" + protocol_name(best);
    for (Protocol p : {Protocol::buffered, Protocol::ring, Protocol::zcopy}) {
        const double m = mbps[int(p)];
        if (m < 0) continue;
        char v[32];
        std::snprintf(v, sizeof v, "%.0f", m);
        line += std::string(" ") + protocol_name(p) + "=" + v;
    }
    return line;
}

}  // namespace sd::transport
