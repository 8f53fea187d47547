// The engine's cold path: building it (on a thread of its own), opening
// its process page and fabric endpoint, the registration cache's provider
// side, and what fork and exit do to it. The hot path (progress, posts,
// RMA) is engine.cpp; the receive side's dispatch is deliver.cpp.
#include "engine.hpp"
#include "clock.hpp"
#include "exitstats.hpp"
#include "memguard.hpp"
#include "registry.hpp"
#include "sink.hpp"
#include "wait.hpp"

#include "log.hpp"
#include "settings.hpp"
#include "sys.hpp"
#include "renew.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <new>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <utility>

namespace sd::transport {
namespace {

std::atomic<Engine *> the_engine{nullptr};
std::mutex create_lock;
bool unusable = false;  // registry cannot be used: pure pass-through

}  // namespace

Engine *the_engine_for_exit() noexcept { return the_engine.load(std::memory_order_acquire); }

namespace {

// Building the engine loads libfabric, which takes a few hundred
// milliseconds here (provider probing). It happens on a thread of its own
// so that connect() and accept() never wait for it; connections made
// meanwhile run on TCP and are attached (and upgraded) once it is ready.
struct Pending {
    void (*fn)(void *);
    void *ctx;
};
constexpr std::size_t kMaxPending = 4096;
Pending pending[kMaxPending];
std::size_t npending = 0;
bool starting = false;  // a build is under way (queue callbacks)
bool building = false;  // ... or its callbacks are still running
// The last builder thread's kernel id, until a fork saw it gone: its
// build is over before the thread has ended, and a thread's end frees
// (its TLS, the sanitizers' per-thread caches) under the allocator's
// locks, which a child forked meanwhile would find taken for good.
std::atomic<pid_t> builder_tid{0};
// A build was ever started in this process (or the parent it forked from
// before): until then a fork has nothing to wait for, and writes nothing.
std::atomic<bool> ever_started{false};

void *build_engine(void *) noexcept {
    builder_tid.store(pid_t(syscall(SYS_gettid)), std::memory_order_release);
    ++guard_depth;
    void *mem = std::malloc(sizeof(Engine));
    Engine *e = mem ? new (mem) Engine() : nullptr;
    bool ok = e && e->init_for_thread() == 0;  // on failure the Engine leaks: half made
    std::size_t n;
    {
        std::lock_guard lock(create_lock);
        if (ok) the_engine.store(e, std::memory_order_release);
        else unusable = true;
        starting = false;
        n = npending;
        npending = 0;
    }
    --guard_depth;
    // Callbacks run without the lock: they attach connections, which may
    // talk to peers. Later arrivals see the engine (or `unusable`) and
    // never queue again. Once the process is exiting, none is started.
    for (std::size_t i = 0; i < n && !fabric_exiting(); ++i) pending[i].fn(pending[i].ctx);
    std::lock_guard lock(create_lock);
    building = false;
    return nullptr;
}

// At exit, libfabric's destructor must not run under a build still going on
// (it frees what fi_getinfo reads). Registered (after main() started, so
// it runs before the shared objects' destructors) only once a build was
// asked for: a process that never built costs its exit nothing. The
// builder parks before its next call into libfabric once exit began, so
// the wait is for the step in progress only: a dlopen (whose loader lock
// the exit's own unloading needs anyway) or one fi_getinfo.
void wait_for_build() noexcept {
    fabric_exit_began();
    (void)wait_until({.nap_ns = 1000000, .max_naps = 5000}, 0, [] {
        {
            std::lock_guard lock(create_lock);
            if (!building) return true;
        }
        return fabric_builder_parked();
    });
    // No other thread may be inside the provider when the process ends:
    // one killed there while holding a region's lock (a peer's, or ours
    // that peers take) would leave it held for ever, and libfabric's
    // destructor (run after this hook) frees what the provider's calls
    // use. Closed even with no engine yet: a build that outlived the wait
    // above makes its endpoint inside the gate.
    provider_gate().close(200);
    Engine::shutdown_at_exit();
}
bool exit_hook = false;

}  // namespace

Engine *Engine::current() noexcept { return the_engine.load(std::memory_order_acquire); }

Engine *Engine::ready() noexcept {
    Engine *e = the_engine.load(std::memory_order_acquire);
    if (e || unusable || !settings().enable || retired() || builds_held()) return e;
    std::lock_guard lock(create_lock);
    if ((e = the_engine.load(std::memory_order_acquire)) || unusable || starting || retired() ||
        builds_held())
        return e;
    if (!exit_hook) {
        exit_hook = atexit(wait_for_build) == 0;
        watch_exit_signals();
    }
    // Our thread must not take the application's signals.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t tid;
    ever_started.store(true, std::memory_order_release);
    starting = building = pthread_create(&tid, &attr, build_engine, nullptr) == 0;
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (!starting) unusable = true;
    return nullptr;
}

Engine *Engine::wait_ready(std::uint32_t ms) noexcept {
    Engine *e = ready();
    if (e) return e;
    (void)wait_until({.nap_ns = 1000000}, monotonic_ns() + std::uint64_t(ms) * 1000000, [&] {
        if ((e = current())) return true;
        std::lock_guard lock(create_lock);
        if (starting) return false;
        e = the_engine.load(std::memory_order_acquire);
        return true;
    });
    return e;
}

bool Engine::when_ready(void (*fn)(void *), void *ctx) noexcept {
    {
        std::lock_guard lock(create_lock);
        if (starting && npending < kMaxPending) {
            pending[npending++] = {fn, ctx};
            return true;
        }
    }
    return false;
}

namespace {
std::atomic<bool> server_process{false};
}

void Engine::note_server() noexcept { server_process.store(true, std::memory_order_relaxed); }
bool Engine::serving() noexcept { return server_process.load(std::memory_order_relaxed); }

bool Engine::idle_process() noexcept {
    std::lock_guard lock(create_lock);
    return !the_engine.load(std::memory_order_acquire) && !unusable && !starting && !building;
}

bool Engine::give_up_unused() noexcept {
    if (!settle_before_fork()) return false;  // a build under way: its end first
    Engine *e = nullptr;
    {
        std::lock_guard lock(create_lock);
        e = the_engine.load(std::memory_order_acquire);
        if (!e || unusable || starting || building || !e->forsake_if_unused()) return false;
        the_engine.store(nullptr, std::memory_order_release);
    }
    e->forsake_after();  // the object stays: threads may still look at it
    return true;
}

int Engine::init_for_thread() noexcept { return init(); }

bool Engine::settle_before_fork() noexcept {
    if (!ever_started.load(std::memory_order_acquire)) return true;
    // A build takes well under a second; ten is a generous bound.
    const Waited built = wait_until({.nap_ns = 1000000, .max_naps = 10000}, 0, [] {
        std::lock_guard lock(create_lock);
        return !building;
    });
    if (built == Waited::ready) {
        // The build is over: its thread's end follows at once (a second
        // at most; without /proc, as if it had ended).
        if (const pid_t tid = builder_tid.load(std::memory_order_acquire)) {
            char path[48];
            std::snprintf(path, sizeof path, "/proc/self/task/%d", int(tid));
            struct stat st;
            (void)wait_until({.nap_ns = 1000000, .max_naps = 1000}, 0,
                             [&] { return stat(path, &st) != 0; });
            builder_tid.store(0, std::memory_order_relaxed);
        }
        return true;
    }
    SD_LOG(info, "fork during an engine build that did not finish; the child stays on TCP");
    return false;
}

namespace {
// The engine whose control thread this thread's fork keeps parked (two
// threads may fork at once: each resumes only what it parked).
thread_local Engine *parked_for_fork = nullptr;
}

void Engine::park_for_fork() noexcept {
    // Requests take milliseconds; an answer waiting on its peer, at most
    // the upgrade timeout. Past the bound the fork goes on unparked.
    Engine *e = current();
    if (!e || e->pid_ != getpid() || e->control_gone_.load(std::memory_order_acquire)) return;
    // Polled with try_lock: a timed lock (pthread_mutex_clocklock) is one
    // ThreadSanitizer does not see taken.
    const unsigned bound_ms = settings().upgrade_timeout_ms + 500;
    if (wait_until({.nap_ns = 200000, .max_naps = bound_ms * 5}, 0,
                   [e] { return e->control_busy_.try_lock(); }) == Waited::ready) {
        parked_for_fork = e;
        return;
    }
    SD_LOG(info, "fork while the control thread answered a request for over %u ms", bound_ms);
}

void Engine::resume_after_fork() noexcept {
    if (parked_for_fork) std::exchange(parked_for_fork, nullptr)->control_busy_.unlock();
}

bool Engine::close_provider() noexcept {
    // No engine, or a vfork child's exec (it shares its parent's memory,
    // and with it the parent's gate): nothing to close.
    Engine *e = current();
    if (!e || e->pid_ != getpid()) return false;
    provider_gate().close(200);
    return true;
}

void Engine::reopen_provider() noexcept { provider_gate().open(); }

SD_CHILD_PATH void Engine::forget_after_fork(bool settled) noexcept {
    // The parent's engine, its endpoint and its threads belong to the
    // parent: closing the endpoint here would unlink the parent's region.
    // Leave every object as it is and start afresh when needed.
    // (renew.hpp: what is as new already is not written.)
    renew(the_engine, nullptr);
    // The parent's, locked for good here.
    if (parked_for_fork) std::exchange(parked_for_fork, nullptr)->control_busy_.forget_held();
    regcache().forget();  // the parent's registrations, in the parent's domain
    pollers_after_fork_child();
    marks_after_fork_child();
    provider_gate().reset();
    renew(create_lock);
    renew(unusable, !settled);
    // The builder thread, if any, stayed in the parent.
    renew(starting, false);
    renew(building, false);
    renew(builder_tid, 0);
    renew(npending, 0);
}

int Engine::init() noexcept {
    const std::uint64_t began = monotonic_ns();
    SD_LOG(debug, "engine build started");
    pid_ = getpid();
    if (getrandom(&nonce_, sizeof nonce_, GRND_NONBLOCK) != sizeof nonce_)
        nonce_ = monotonic_ns() ^ std::uint64_t(pid_);
    int rc = claim_registry(settings().registry);
    if (rc) {
        SD_LOG(error, "registry %s unusable (%s); staying on TCP", settings().registry,
               std::strerror(-rc));
        return rc;
    }
    report_registry_choice();
    sweep_registry(settings().registry);
    window_ = settings().window ? settings().window : 2097152;
    if ((rc = open_page())) return rc;
    doorbell_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (doorbell_ < 0) return -errno;
    rc = open_fabric();
    fabric_ok_ = rc == 0;
    if (fabric_ok_) {
        memguard_install();
        start_regcache();
    }
    if (!fabric_ok_)
        SD_LOG(info, "no fabric (%s); connections of this process stay on TCP",
               fabric_strerror(rc));
    // Last: the control thread reads what the lines above set.
    rc = start_control();
    if (rc == 0)
        SD_LOG(debug, "engine built in %.1f ms", double(monotonic_ns() - began) / 1e6);
    else
        SD_LOG(error, "control socket or thread not started (%s); staying on TCP",
               std::strerror(-rc));
    return rc;
}

int Engine::open_page() noexcept {
    char path[300];
    std::snprintf(path, sizeof path, "%s/p%d", settings().registry, int(pid_));
    (void)unlink(path);  // a stale page of an earlier process with our pid
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return -errno;
    int rc = ftruncate(fd, sizeof(ProcPage)) == 0 ? 0 : -errno;
    void *map = rc ? MAP_FAILED
                   : mmap(nullptr, sizeof(ProcPage), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    sys.close(fd);
    if (map == MAP_FAILED) return rc ? rc : -errno;
    page_ = static_cast<ProcPage *>(map);
    page_->header.version = kPageVersion;
    page_->header.pid = pid_;
    page_->header.nslots = kSlots;
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    page_->header.start_ns = std::uint64_t(ts.tv_sec) * 1000000000ull + std::uint64_t(ts.tv_nsec);
    char comm[32] = {};
    int cf = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    if (cf >= 0) {
        ssize_t n = sys.read(cf, comm, sizeof comm - 1);
        sys.close(cf);
        if (n > 0 && comm[n - 1] == '\n') comm[n - 1] = '\0';
    }
    std::memcpy(page_->header.comm, comm, sizeof comm);
    std::atomic_thread_fence(std::memory_order_release);
    page_->header.magic = kPageMagic;
    return 0;
}

int Engine::open_fabric() noexcept {
    char unique[64];
    // A fresh name per process incarnation: a fork child must never reuse
    // its parent's, and a recycled pid must not meet a stale region.
    std::snprintf(unique, sizeof unique, "fi_shm://sd%d-%llx", int(pid_),
                  (unsigned long long)(nonce_ & 0xffffffffffull));
    int rc = endpoint_open(ep_, settings().provider, unique);
    if (rc) return rc;
    own_region_.watch(ep_.name, pid_);
    chunk_ = settings().chunk;
    can_read_ = ep_.can_read;  // whether to: protocol.hpp
    rma_iov_limit_ = ep_.rma_iov_limit;
    cma_ok_ = settings().cma && !std::strcmp(settings().provider, "shm");
    if (cma_ok_) rma_iov_limit_ = kMaxRmaIov;
    sink_write_flags_ = sink_write_flags(ep_.info);
    if (ep_.inject_size < sizeof(MsgHeader) + 64) {
        SD_LOG(error, "provider inject size %zu too small", ep_.inject_size);
        return -ENOTSUP;
    }
    if (chunk_ + sizeof(MsgHeader) > ep_.inject_size)
        chunk_ = std::uint32_t(ep_.inject_size - sizeof(MsgHeader));
    if (chunk_ > kMaxInline) chunk_ = kMaxInline;
    std::size_t min_free = std::size_t(chunk_) + sizeof(MsgHeader);
    {
        Guard guard;
        InProvider in;
        if (!in.ok()) return -ECANCELED;  // exiting
        fi_setopt(&ep_.ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &min_free,
                  sizeof min_free);
    }
    std::uint32_t n = settings().rx_buffers;
    rx_ = static_cast<RxBuffer *>(std::calloc(n, sizeof(RxBuffer)));
    if (!rx_) return -ENOMEM;
    for (std::uint32_t i = 0; i < n; ++i) {
        rx_[i].size = settings().rx_buffer_size;
        rx_[i].mem = static_cast<char *>(std::malloc(rx_[i].size));
        if (!rx_[i].mem) return -ENOMEM;
        post_rx(&rx_[i]);
    }
    SD_LOG(debug, "endpoint %s open, inject %zu, chunk %u, sink writes %s", ep_.name,
           ep_.inject_size, chunk_,
           sink_write_flags_ ? "delivery-complete" : "ordered before sends");
    return 0;
}

namespace {
// The registration cache's provider side (regcache.hpp).
struct RegCtx {
    fid_domain *domain;
    std::atomic<std::uint64_t> *keys;
};
RegCtx reg_ctx;

int register_buffer(void *ctx, const void *buf, std::size_t len, void **handle,
                    std::uint64_t *key) {
    auto *r = static_cast<RegCtx *>(ctx);
    Guard guard;
    InProvider in;
    if (!in.ok()) return -FI_ECANCELED;
    fid_mr *mr = nullptr;
    int rc = fi_mr_reg(r->domain, buf, len, FI_REMOTE_READ, 0,
                       r->keys->fetch_add(1, std::memory_order_relaxed), 0, &mr, nullptr);
    if (rc) return rc;
    *handle = mr;
    *key = fi_mr_key(mr);
    return 0;
}

void release_buffer(void *, void *handle) {
    Guard guard;
    InProvider in;
    if (in.ok()) fi_close(&static_cast<fid_mr *>(handle)->fid);
}
}  // namespace

void Engine::start_regcache() noexcept {
    reg_ctx = RegCtx{ep_.domain, &zc_keys_};
    const std::size_t budget =
        memhooks_active() ? regcache_budget(std::size_t(settings().reg_cache_mb) << 20) : 0;
    regcache().configure(register_buffer, release_buffer, &reg_ctx, budget,
                         RegCache::kMaxEntries);
    page_->header.reg_budget = budget;
    page_->header.reg_cache_on.store(budget != 0, std::memory_order_relaxed);
    if (!memhooks_active() && settings().reg_cache_mb)
        SD_LOG(info, "registration cache off: this process's free/munmap are not ours "
                     "(defined before the library, or ThreadSanitizer's), so freed memory "
                     "could not be noticed");
}

}  // namespace sd::transport
