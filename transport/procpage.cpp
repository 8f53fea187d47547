#include "procpage.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sd::transport {

const char *mode_name(Mode m) noexcept {
    switch (m) {
    case Mode::kernel: return "kernel";
    case Mode::direct: return "direct";
    case Mode::shared: return "shared";
    }
    return "?";
}

const char *reason_name(Reason r) noexcept {
    static constexpr const char *names[] = {
        "none",        "no_peer",      "peer_refused", "other_user",
        "not_dumpable", "proof_failed", "av_full",     "no_fabric",
        "timeout",     "same_process", "inherited",    "fabric_error", "shared",
        "exec",        "stdio",        "passed",      "privilege",   "oob",
        "disconnect"};
    static_assert(sizeof(names) / sizeof(names[0]) == std::size_t(Reason::count_));
    auto i = std::size_t(r);
    return i < std::size_t(Reason::count_) ? names[i] : "?";
}

namespace {

std::string endpoint(std::uint16_t family, const std::uint8_t *addr, std::uint16_t port) {
    char text[INET6_ADDRSTRLEN] = "?";
    inet_ntop(family == AF_INET6 ? AF_INET6 : AF_INET, addr, text, sizeof text);
    char out[INET6_ADDRSTRLEN + 16];
    if (family == AF_INET6)
        std::snprintf(out, sizeof out, "[%s]:%u", text, unsigned(port));
    else
        std::snprintf(out, sizeof out, "%s:%u", text, unsigned(port));
    return out;
}

const char *state_name(std::uint32_t s) {
    return s == std::uint32_t(SlotState::live) ? "live" : "closed";
}

}  // namespace

std::string format_conn(int pid, const char *comm, const ConnStat &s) {
    char line[768];
    std::snprintf(
        line, sizeof line,
        "pid=%d comm=%s fd=%d state=%s mode=%s reason=%s local=%s peer=%s peer_pid=%d "
        "tx_kernel=%llu rx_kernel=%llu tx_fabric=%llu rx_fabric=%llu tx_msgs=%llu rx_msgs=%llu "
        "tx_window=%lld rx_queued=%u rx_owed=%u tx_inline=%llu tx_ring=%llu tx_zcopy=%llu "
        "rx_zcopy=%llu tx_sink=%llu rx_sink=%llu adverts=%u cancels=%u sinks=%u sink_cancels=%u "
        "upgrades=%u leaves=%u",
        pid, comm, s.fd, state_name(s.state.load(std::memory_order_acquire)),
        mode_name(Mode(s.mode.load(std::memory_order_relaxed))),
        reason_name(Reason(s.reason.load(std::memory_order_relaxed))),
        endpoint(s.family, s.local_addr, s.local_port).c_str(),
        endpoint(s.family, s.peer_addr, s.peer_port).c_str(), s.peer_pid,
        (unsigned long long)s.tx_kernel.load(std::memory_order_relaxed),
        (unsigned long long)s.rx_kernel.load(std::memory_order_relaxed),
        (unsigned long long)s.tx_fabric.load(std::memory_order_relaxed),
        (unsigned long long)s.rx_fabric.load(std::memory_order_relaxed),
        (unsigned long long)s.tx_msgs.load(std::memory_order_relaxed),
        (unsigned long long)s.rx_msgs.load(std::memory_order_relaxed),
        (long long)s.tx_window.load(std::memory_order_relaxed),
        unsigned(s.rx_queued.load(std::memory_order_relaxed)),
        unsigned(s.rx_owed.load(std::memory_order_relaxed)),
        (unsigned long long)s.tx_inline.load(std::memory_order_relaxed),
        (unsigned long long)s.tx_ring.load(std::memory_order_relaxed),
        (unsigned long long)s.tx_zcopy.load(std::memory_order_relaxed),
        (unsigned long long)s.rx_zcopy.load(std::memory_order_relaxed),
        (unsigned long long)s.tx_sink.load(std::memory_order_relaxed),
        (unsigned long long)s.rx_sink.load(std::memory_order_relaxed),
        unsigned(s.adverts.load(std::memory_order_relaxed)),
        unsigned(s.cancels.load(std::memory_order_relaxed)),
        unsigned(s.sinks.load(std::memory_order_relaxed)),
        unsigned(s.sink_cancels.load(std::memory_order_relaxed)),
        unsigned(s.upgrades.load(std::memory_order_relaxed)),
        unsigned(s.leaves.load(std::memory_order_relaxed)));
    return line;
}

std::string format_process(const ProcHeader &h) {
    char line[320];
    std::snprintf(line, sizeof line,
                  "process pid=%d comm=%s reg_cache=%s reg_budget=%llu reg_hits=%llu reg_misses=%llu "
                  "reg_invalidated=%llu reg_evicted=%llu reg_bytes=%llu",
                  int(h.pid), h.comm,
                  h.reg_cache_on.load(std::memory_order_relaxed) ? "on" : "off",
                  (unsigned long long)h.reg_budget,
                  (unsigned long long)h.reg_hits.load(std::memory_order_relaxed),
                  (unsigned long long)h.reg_misses.load(std::memory_order_relaxed),
                  (unsigned long long)h.reg_invalidated.load(std::memory_order_relaxed),
                  (unsigned long long)h.reg_evicted.load(std::memory_order_relaxed),
                  (unsigned long long)h.reg_bytes.load(std::memory_order_relaxed));
    return line;
}

int scan_pages(const char *dir, bool with_closed,
               void (*fn)(void *ctx, int pid, const char *comm, const ConnStat &s),
               void *ctx) noexcept {
    DIR *d = opendir(dir);
    if (!d) return -errno;
    int pages = 0;
    while (dirent *e = readdir(d)) {
        if (e->d_name[0] != 'p') continue;
        char *end = nullptr;
        long pid = std::strtol(e->d_name + 1, &end, 10);
        if (*end != '\0' || pid <= 0) continue;
        if (kill(pid_t(pid), 0) != 0 && errno == ESRCH) continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat st;
        if (fstat(fd, &st) != 0 || st.st_size < off_t(sizeof(ProcPage))) {
            close(fd);  // short or foreign file: mapping it would fault
            continue;
        }
        void *map = mmap(nullptr, sizeof(ProcPage), PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (map == MAP_FAILED) continue;
        const auto *page = static_cast<const ProcPage *>(map);
        if (page->header.magic == kPageMagic && page->header.version == kPageVersion &&
            page->header.pid == pid) {
            ++pages;
            char comm[sizeof page->header.comm + 1];
            std::memcpy(comm, page->header.comm, sizeof page->header.comm);
            comm[sizeof page->header.comm] = '\0';
            for (std::uint32_t i = 0; i < kSlots && i < page->header.nslots; ++i) {
                auto st = SlotState(page->slots[i].state.load(std::memory_order_acquire));
                if (st == SlotState::live || (with_closed && st == SlotState::closed))
                    fn(ctx, int(pid), comm, page->slots[i]);
            }
        }
        munmap(map, sizeof(ProcPage));
    }
    closedir(d);
    return pages;
}

}  // namespace sd::transport
