// A process's counters outlive it: appended to SDIRECT_STATS_FILE and kept
// as its page in <registry>/exited/ at a normal exit, and also when it
// dies of SIGTERM, SIGINT or SIGHUP with their default disposition. The
// signal path runs in a handler, so it allocates nothing, takes no lock
// and calls only async-signal-safe functions; the lines are formatted by
// statline.cpp for that reason.
#include "exitstats.hpp"

#include "engine.hpp"
#include "settings.hpp"
#include "sys.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

namespace sd::transport {
namespace {

constexpr int kWatched[] = {SIGHUP, SIGINT, SIGTERM};
bool watched(int sig) noexcept {
    return std::find(std::begin(kWatched), std::end(kWatched), sig) != std::end(kWatched);
}
// Our handler is the disposition of the signal (it stands for SIG_DFL).
std::atomic<bool> ours[NSIG];
std::atomic<bool> watching{false};
std::atomic<bool> written{false};

// path = a + b + c, cut to fit; no stdio (signal handlers call it).
void join(char *out, std::size_t n, const char *a, const char *b, const char *c = "") noexcept {
    std::size_t k = 0;
    for (const char *s : {a, b, c})
        for (; *s && k + 1 < n; ++s) out[k++] = *s;
    out[k] = '\0';
}

void decimal(char *out, long v) noexcept {
    char d[24];
    int n = 0;
    do d[n++] = char('0' + v % 10);
    while ((v /= 10) != 0);
    while (n) *out++ = d[--n];
    *out = '\0';
}

void on_exit_signal(int sig) noexcept;

int install(int sig) noexcept {
    struct sigaction sa{};
    sa.sa_handler = on_exit_signal;
    sigemptyset(&sa.sa_mask);
    for (int s : kWatched) sigaddset(&sa.sa_mask, s);
    sa.sa_flags = SA_RESTART;
    if (sys.sigaction(sig, &sa, nullptr) != 0) return -errno;
    ours[sig].store(true, std::memory_order_release);
    return 0;
}

int restore_default(int sig) noexcept {
    struct sigaction dfl{};
    dfl.sa_handler = SIG_DFL;
    ours[sig].store(false, std::memory_order_release);
    return sys.sigaction(sig, &dfl, nullptr) == 0 ? 0 : -errno;
}

void on_exit_signal(int sig) noexcept {
    const int saved = errno;
    Engine *e = the_engine_for_exit();
    // A fork child runs its parent's handler: the counters are not its own.
    if (e && e->pid() == getpid()) e->write_final_stats(true);
    (void)restore_default(sig);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    // Delivered as soon as it is unblocked: the process dies of it here.
    raise(sig);
    sigprocmask(SIG_UNBLOCK, &one, nullptr);
    errno = saved;
}

}  // namespace

void watch_exit_signals() noexcept {
    if (watching.exchange(true)) return;
    for (int sig : kWatched) {
        struct sigaction now{};
        if (sys.sigaction(sig, nullptr, &now) != 0) continue;
        if (!(now.sa_flags & SA_SIGINFO) && now.sa_handler == SIG_DFL) (void)install(sig);
    }
}

namespace {

// The dispositions the application set, and how many times, per signal:
// the engine's builder saves the dispositions around the provider's
// endpoint open (which installs handlers of its own) and must not put a
// stale one back over what the application set meanwhile on its own
// thread (apache2 sets its handlers while the build that its listen
// started runs). Written by the application's calls, which it orders
// itself; the count is published after the disposition.
struct sigaction app_last[NSIG];
std::atomic<std::uint32_t> app_sets[NSIG];

int set_and_note(int sig, const struct sigaction *act, struct sigaction *old) noexcept;

}  // namespace

std::uint32_t app_disposition_sets(int sig) noexcept {
    return sig > 0 && sig < NSIG ? app_sets[sig].load(std::memory_order_acquire) : 0;
}

void put_back_app_disposition(int sig) noexcept {
    if (sig <= 0 || sig >= NSIG || !app_sets[sig].load(std::memory_order_acquire)) return;
    const struct sigaction last = app_last[sig];
    // What the application's own call made of it: SIG_DFL of a watched
    // signal is our handler again once we watch.
    if (watched(sig) && watching.load(std::memory_order_acquire) &&
        !(last.sa_flags & SA_SIGINFO) && last.sa_handler == SIG_DFL) {
        (void)install(sig);
        return;
    }
    ours[sig].store(false, std::memory_order_release);
    (void)sys.sigaction(sig, &last, nullptr);
}

int app_sigaction(int sig, const struct sigaction *act, struct sigaction *old) noexcept {
    // Our dependencies (the shm provider installs handlers that clean up
    // its regions) see the real disposition, ours included, and chain to
    // it; restoring it later puts ours back.
    if (guarded()) return sys.sigaction(sig, act, old) == 0 ? 0 : -errno;
    const int rc = set_and_note(sig, act, old);
    if (rc == 0 && act && sig > 0 && sig < NSIG &&
        !(act->sa_handler == on_exit_signal && !(act->sa_flags & SA_SIGINFO))) {
        app_last[sig] = *act;
        app_sets[sig].fetch_add(1, std::memory_order_release);
    }
    return rc;
}

namespace {

int set_and_note(int sig, const struct sigaction *act, struct sigaction *old) noexcept {
    if (act && !(act->sa_flags & SA_SIGINFO) && act->sa_handler == on_exit_signal && watched(sig)) {
        // Ours, put back by whoever had saved it.
        if (sys.sigaction(sig, act, old) != 0) return -errno;
        ours[sig].store(true, std::memory_order_release);
        return 0;
    }
    if (sig <= 0 || sig >= NSIG || !watched(sig) || !ours[sig].load(std::memory_order_acquire))
        return sys.sigaction(sig, act, old) == 0 ? 0 : -errno;
    if (!act) {
        // Asked, not set: what the application left, SIG_DFL.
        if (old) {
            *old = {};
            old->sa_handler = SIG_DFL;
        }
        return 0;
    }
    // Make way first, so that the call itself reports SIG_DFL as before.
    (void)restore_default(sig);
    if (sys.sigaction(sig, act, old) != 0) {
        const int err = errno;
        (void)install(sig);
        return -err;
    }
    if (!(act->sa_flags & SA_SIGINFO) && act->sa_handler == SIG_DFL) (void)install(sig);
    return 0;
}

}  // namespace

int app_signal(int sig, sighandler_t handler, int flags, sighandler_t *old) noexcept {
    struct sigaction act{}, before{};
    act.sa_handler = handler;
    sigemptyset(&act.sa_mask);
    if (sig > 0 && sig < NSIG && !(flags & SA_NODEFER)) sigaddset(&act.sa_mask, sig);
    act.sa_flags = flags;
    if (sig <= 0 || sig >= NSIG || handler == SIG_ERR) return -EINVAL;
    const int rc = app_sigaction(sig, &act, &before);
    if (rc == 0 && old) *old = before.sa_handler;
    return rc;
}

void drop_exit_handler(int sig) noexcept {
    if (sig > 0 && sig < NSIG && ours[sig].load(std::memory_order_acquire))
        (void)restore_default(sig);
}

void keep_exited_page(int pid, bool trim) noexcept {
    const char *reg = settings().registry;
    char dir[300], from[320], to[340], num[24];
    join(dir, sizeof dir, reg, "/exited");
    decimal(num, pid);
    join(from, sizeof from, reg, "/p", num);
    join(to, sizeof to, dir, "/p", num);
    // The registry is ours alone (0700), and so is this folder in it.
    if ((mkdir(dir, 0700) != 0 && errno != EEXIST) || rename(from, to) != 0) {
        unlink(from);
        return;
    }
    utimensat(AT_FDCWD, to, nullptr, 0);  // its time is the exit's
    if (!trim) return;
    DIR *d = opendir(dir);
    if (!d) return;
    struct Kept {
        char name[24];
        time_t when;
    };
    static Kept kept[1024];  // at exit only: one thread
    int n = 0;
    const time_t now = time(nullptr);
    for (int looked = 0; looked < 4096; ++looked) {
        dirent *ent = readdir(d);
        if (!ent) break;
        struct stat st;
        if (ent->d_name[0] != 'p' || std::strlen(ent->d_name) >= sizeof kept[0].name ||
            fstatat(dirfd(d), ent->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (now - st.st_mtime > kExitedMaxAgeS) {
            unlinkat(dirfd(d), ent->d_name, 0);
        } else if (n < 1024) {
            std::strcpy(kept[n].name, ent->d_name);
            kept[n++].when = st.st_mtime;
        }
    }
    if (n > kExitedMax) {
        std::sort(kept, kept + n, [](const Kept &a, const Kept &b) { return a.when > b.when; });
        for (int i = kExitedMax; i < n; ++i) unlinkat(dirfd(d), kept[i].name, 0);
    }
    closedir(d);
}

void Engine::write_final_stats(bool from_signal) noexcept {
    if (written.exchange(true, std::memory_order_acq_rel)) return;
    const char *file = settings().stats_file;
    if (file && *file) {
        int fd = open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
        if (fd >= 0) {
            char comm[sizeof page_->header.comm + 1];
            std::memcpy(comm, page_->header.comm, sizeof page_->header.comm);
            comm[sizeof page_->header.comm] = '\0';
            char line[kStatLineMax + 1];
            for (std::uint32_t i = 0; i < kSlots; ++i) {
                const ConnStat &s = page_->slots[i];
                if (s.state.load(std::memory_order_acquire) == std::uint32_t(SlotState::free))
                    continue;
                std::size_t n = format_conn_into(line, kStatLineMax, pid_, comm, s);
                line[n++] = '\n';
                (void)sys.write(fd, line, n);
            }
            // The registration cache's lock may be held by the thread the
            // signal interrupted: its counters as last published then.
            if (!from_signal) publish_regstats();
            std::size_t n = format_process_into(line, kStatLineMax, page_->header);
            line[n++] = '\n';
            (void)sys.write(fd, line, n);
            sys.close(fd);
        }
    }
    keep_exited_page(int(pid_), !from_signal);
}

}  // namespace sd::transport
