// sdirect-stat: every connection of this user that runs the library, read
// from the process pages in the host registry (like ss / smcss); with -a
// also those of processes that have exited (the pages they left in
// <registry>/exited), marked state=exited.
//
//   sdirect-stat [-a] [-t] [--dir D]
//
// The pages are mapped only during the scan, so each slot is copied into a
// Row before the callback returns.
#include "transport/procpage.hpp"
#include "transport/settings.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace tp = sd::transport;

struct Row {
    int pid;
    int fd;
    std::string comm;
    std::string line;  // format_conn's text, the one format every tool shares
    bool closed;
    bool exited;
    std::uint64_t tx_kernel, rx_kernel, tx_fabric, rx_fabric;
};

struct Options {
    bool all = false;
    bool table = false;
    const char *dir = nullptr;
};

void usage(std::FILE *out) {
    std::fputs("usage: sdirect-stat [-a] [-t] [--dir D]\n"
               "  -a, --all     include connections already closed, and those of\n"
               "                processes that have exited (state=exited)\n"
               "  -t, --table   aligned columns instead of key=value lines\n"
               "  --dir D       registry directory (default: SDIRECT_REGISTRY)\n",
               out);
}

// Returns 0 to go on, 1 to exit successfully (help), 2 on a usage error.
int parse(int argc, char **argv, Options &opt) {
    for (int i = 1; i < argc; ++i) {
        std::string_view a = argv[i];
        if (a == "-a" || a == "--all") {
            opt.all = true;
        } else if (a == "-t" || a == "--table") {
            opt.table = true;
        } else if (a == "-at" || a == "-ta") {
            opt.all = opt.table = true;
        } else if (a == "--dir" || a == "-d") {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "sdirect-stat: %s needs a directory\n", argv[i]);
                return 2;
            }
            opt.dir = argv[++i];
        } else if (a.starts_with("--dir=")) {
            opt.dir = argv[i] + 6;
        } else if (a == "-h" || a == "--help") {
            usage(stdout);
            return 1;
        } else {
            std::fprintf(stderr, "sdirect-stat: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    return 0;
}

void collect(void *ctx, int pid, const char *comm, const tp::ConnStat &s, bool exited) {
    auto *rows = static_cast<std::vector<Row> *>(ctx);
    std::string line = tp::format_conn(pid, comm, s);
    if (exited) {
        // Live or closed at the end, all of it is over now.
        for (const char *was : {" state=live ", " state=closed "})
            if (auto at = line.find(was); at != std::string::npos)
                line.replace(at, std::strlen(was), " state=exited ");
    }
    rows->push_back(Row{
        pid,
        s.fd,
        comm,
        std::move(line),
        s.state.load(std::memory_order_acquire) == std::uint32_t(tp::SlotState::closed),
        exited,
        s.tx_kernel.load(std::memory_order_relaxed),
        s.rx_kernel.load(std::memory_order_relaxed),
        s.tx_fabric.load(std::memory_order_relaxed),
        s.rx_fabric.load(std::memory_order_relaxed),
    });
}

// The value of " key=" in a format_conn line. The search starts after the
// comm field, which is the only one that may contain spaces.
std::string field(const std::string &line, std::string_view key) {
    std::size_t from = line.find(" fd=");
    if (from == std::string::npos) return "?";
    std::string needle(1, ' ');
    needle.append(key).push_back('=');
    std::size_t at = line.find(needle, from);
    if (at == std::string::npos) return "?";
    at += needle.size();
    std::size_t end = line.find(' ', at);
    return line.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

void print_table(const std::vector<Row> &rows, bool with_state) {
    std::vector<std::string> head = {"PID", "COMM", "FD"};
    if (with_state) head.push_back("STATE");
    for (const char *h : {"MODE", "REASON", "LOCAL", "PEER", "TX_KERNEL", "RX_KERNEL",
                          "TX_FABRIC", "RX_FABRIC"})
        head.push_back(h);

    std::vector<std::vector<std::string>> cells;
    cells.push_back(head);
    for (const Row &r : rows) {
        std::vector<std::string> c = {std::to_string(r.pid), r.comm, std::to_string(r.fd)};
        if (with_state) c.push_back(r.exited ? "exited" : r.closed ? "closed" : "live");
        c.push_back(field(r.line, "mode"));
        c.push_back(field(r.line, "reason"));
        c.push_back(field(r.line, "local"));
        c.push_back(field(r.line, "peer"));
        for (std::uint64_t v : {r.tx_kernel, r.rx_kernel, r.tx_fabric, r.rx_fabric})
            c.push_back(std::to_string(v));
        cells.push_back(std::move(c));
    }

    std::vector<std::size_t> width(head.size(), 0);
    for (const auto &c : cells)
        for (std::size_t i = 0; i < c.size(); ++i) width[i] = std::max(width[i], c[i].size());

    // Text columns (comm, mode, reason, addresses) align left, numbers right.
    auto numeric = [&](std::size_t i) {
        const std::string &h = head[i];
        return h == "PID" || h == "FD" || h.starts_with("TX_") || h.starts_with("RX_");
    };
    for (const auto &c : cells) {
        std::string out;
        for (std::size_t i = 0; i < c.size(); ++i) {
            std::string pad(width[i] - c[i].size(), ' ');
            out += numeric(i) ? pad + c[i] : c[i] + (i + 1 < c.size() ? pad : "");
            if (i + 1 < c.size()) out += "  ";
        }
        std::puts(out.c_str());
    }
}

}  // namespace

int main(int argc, char **argv) {
    Options opt;
    if (int rc = parse(argc, argv, opt); rc != 0) return rc == 1 ? 0 : 2;

    tp::load_settings();
    const char *dir = opt.dir ? opt.dir : tp::settings().registry;

    std::vector<Row> rows;
    int pages = tp::scan_pages(dir, opt.all, collect, &rows);
    if (opt.all && pages >= 0) (void)tp::scan_exited(dir, collect, &rows);
    // No registry yet is no connection yet; a directory named on the
    // command line must exist.
    if (pages == -ENOENT && !opt.dir) {
        std::puts("no connections");
        return 0;
    }
    if (pages < 0) {
        std::fprintf(stderr, "sdirect-stat: cannot read %s: %s\n", dir, std::strerror(-pages));
        return 1;
    }
    if (rows.empty()) {
        std::puts("no connections");
        return 0;
    }

    std::sort(rows.begin(), rows.end(), [](const Row &a, const Row &b) {
        return a.pid != b.pid ? a.pid < b.pid : a.fd < b.fd;
    });
    std::size_t closed = std::count_if(rows.begin(), rows.end(),
                                       [](const Row &r) { return r.closed && !r.exited; });
    std::size_t exited = std::count_if(rows.begin(), rows.end(), [](const Row &r) { return r.exited; });
    std::size_t procs = 0;
    for (std::size_t i = 0; i < rows.size(); ++i)
        if (i == 0 || rows[i].pid != rows[i - 1].pid) ++procs;
    std::printf("%zu connection%s in %zu process%s", rows.size(), rows.size() == 1 ? "" : "s",
                procs, procs == 1 ? "" : "es");
    if (opt.all) std::printf(" (%zu closed, %zu of exited processes)", closed, exited);
    std::printf(", registry %s\n", dir);

    if (opt.table) {
        print_table(rows, opt.all);
    } else {
        for (const Row &r : rows) std::puts(r.line.c_str());
    }
    return 0;
}
