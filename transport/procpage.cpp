#include "procpage.hpp"

#include "sys.hpp"

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
    }
    return "?";
}

const char *reason_name(Reason r) noexcept {
    static constexpr const char *names[] = {
        "none",        "no_peer",      "peer_refused", "other_user",
        "not_dumpable", "proof_failed", "av_full",     "no_fabric",
        "timeout",     "same_process", "inherited",    "fabric_error", "shared",
        "exec",        "passed",      "privilege",   "oob",
        "other_registry", "peer_kernel", "fd_limit", "other_host",
        "ended_early", "disconnect", "rule", "peer_wait"};
    static_assert(sizeof(names) / sizeof(names[0]) == std::size_t(Reason::count_));
    auto i = std::size_t(r);
    return i < std::size_t(Reason::count_) ? names[i] : "?";
}

namespace {

int scan_dir(const char *dir, bool exited, bool with_closed, PageVisitor fn, void *ctx) noexcept {
    DIR *d = opendir(dir);
    if (!d) return -errno;
    int pages = 0;
    while (dirent *e = readdir(d)) {
        if (e->d_name[0] != 'p') continue;
        char *end = nullptr;
        long pid = std::strtol(e->d_name + 1, &end, 10);
        if (*end != '\0' || pid <= 0) continue;
        // A live page of a dead process: SIGKILL or a crash, nothing to show.
        if (!exited && kill(pid_t(pid), 0) != 0 && errno == ESRCH) continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) continue;
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < off_t(sizeof(ProcPage))) {
            sys.close(fd);  // short or foreign file: mapping it would fault
            continue;
        }
        void *map = mmap(nullptr, sizeof(ProcPage), PROT_READ, MAP_SHARED, fd, 0);
        sys.close(fd);
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
                    fn(ctx, int(pid), comm, page->slots[i], exited);
            }
        }
        munmap(map, sizeof(ProcPage));
    }
    closedir(d);
    return pages;
}

}  // namespace

int scan_pages(const char *dir, bool with_closed, PageVisitor fn, void *ctx) noexcept {
    return scan_dir(dir, false, with_closed, fn, ctx);
}

int scan_exited(const char *dir, PageVisitor fn, void *ctx) noexcept {
    char sub[300];
    std::snprintf(sub, sizeof sub, "%s/exited", dir);
    return scan_dir(sub, true, true, fn, ctx);
}

}  // namespace sd::transport
