#include "engine.hpp"
#include "exitstats.hpp"
#include "memguard.hpp"
#include "registry.hpp"
#include "sink.hpp"
#include "wait.hpp"

#include "log.hpp"
#include "settings.hpp"
#include "sys.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <dirent.h>
#include <fcntl.h>
#include <new>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace sd::transport {
namespace {

std::atomic<Engine *> the_engine{nullptr};
std::mutex create_lock;
bool unusable = false;  // registry cannot be used: pure pass-through

std::uint64_t now_ns() noexcept {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return std::uint64_t(ts.tv_sec) * 1000000000ull + std::uint64_t(ts.tv_nsec);
}

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

void *build_engine(void *) noexcept {
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
    for (int i = 0; i < 5000; ++i) {
        {
            std::lock_guard lock(create_lock);
            if (!building) break;
        }
        if (fabric_builder_parked()) break;
        timespec nap{0, 1000000};
        nanosleep(&nap, nullptr);
    }
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
    if (e || unusable || !settings().enable || retired()) return e;
    std::lock_guard lock(create_lock);
    if ((e = the_engine.load(std::memory_order_acquire)) || unusable || starting || retired())
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
    starting = building = pthread_create(&tid, &attr, build_engine, nullptr) == 0;
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (!starting) unusable = true;
    return nullptr;
}

Engine *Engine::wait_ready(std::uint32_t ms) noexcept {
    Engine *e = ready();
    for (std::uint64_t end = now_ns() + std::uint64_t(ms) * 1000000; !e && now_ns() < end;) {
        {
            std::lock_guard lock(create_lock);
            if (!starting) return the_engine.load(std::memory_order_acquire);
        }
        timespec nap{0, 1000000};
        nanosleep(&nap, nullptr);
        e = current();
    }
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

int Engine::init_for_thread() noexcept { return init(); }

bool Engine::settle_before_fork() noexcept {
    // A build takes well under a second; ten is a generous bound.
    for (int i = 0; i < 10000; ++i) {
        {
            std::lock_guard lock(create_lock);
            if (!building) return true;
        }
        timespec nap{0, 1000000};
        nanosleep(&nap, nullptr);
    }
    SD_LOG(info, "fork during an engine build that did not finish; the child stays on TCP");
    return false;
}

bool Engine::close_provider_for_exec() noexcept {
    // No engine, or a vfork child's exec (it shares its parent's memory,
    // and with it the parent's gate): nothing to close.
    Engine *e = current();
    if (!e || e->pid_ != getpid()) return false;
    provider_gate().close(200);
    return true;
}

void Engine::reopen_provider() noexcept { provider_gate().open(); }

void Engine::forget_after_fork(bool settled) noexcept {
    // The parent's engine, its endpoint and its threads belong to the
    // parent: closing the endpoint here would unlink the parent's region.
    // Leave every object as it is and start afresh when needed.
    the_engine.store(nullptr, std::memory_order_relaxed);
    regcache().forget();  // the parent's registrations, in the parent's domain
    provider_gate().reset();
    new (&create_lock) std::mutex();
    unusable = !settled;
    starting = building = false;  // the builder thread, if any, stayed in the parent
    npending = 0;
}

int Engine::init() noexcept {
    pid_ = getpid();
    if (getrandom(&nonce_, sizeof nonce_, GRND_NONBLOCK) != sizeof nonce_)
        nonce_ = now_ns() ^ std::uint64_t(pid_);
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
    return start_control();
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

void Engine::post_rx(RxBuffer *b) noexcept {
    iovec iov{b->mem, b->size};
    fi_msg msg{};
    msg.msg_iov = &iov;
    msg.iov_count = 1;
    msg.addr = FI_ADDR_UNSPEC;
    msg.context = &b->ctx;
    Guard guard;
    InProvider in;  // inside progress() already, but for the first posts
    if (!in.ok()) return;
    ssize_t rc;
    while ((rc = fi_recvmsg(ep_.ep, &msg, FI_MULTI_RECV | FI_COMPLETION)) == -FI_EAGAIN) sched_yield();
    if (rc) SD_LOG(error, "posting a receive buffer failed: %s", fabric_strerror(int(rc)));
}

Conn *Engine::lookup(std::uint32_t id, std::uint32_t gen) noexcept {
    if (id >= kSlots) return nullptr;
    Conn *c = conns_[id].load(std::memory_order_acquire);
    return c && c->gen == gen ? c : nullptr;
}

std::size_t Engine::progress() noexcept {
    // A delivery's own answer may post and so come back here.
    if (!fabric_ok_ || progress_lock_.held() || !progress_lock_.try_lock()) return 0;
    // The provider takes our region's lock and would spin on it for ever
    // if a peer died holding it: then nothing comes in any more (and no
    // new connection upgrades: fabric_usable()), but no thread is stuck.
    if (!own_region_.wait_free(kRegionLockBoundNs)) {
        progress_lock_.unlock();
        return 0;
    }
    InProvider in;  // after the wait: an exit does not wait for a wait
    if (!in.ok()) {
        progress_lock_.unlock();
        return 0;
    }
    Guard guard;
    std::size_t taken = 0;
    fi_cq_data_entry entries[32];
    for (int round = 0; round < 8; ++round) {
        ssize_t n = fi_cq_read(ep_.cq, entries, 32);
        if (n == -FI_EAGAIN) break;
        if (n < 0) {
            fi_cq_err_entry err{};
            if (fi_cq_readerr(ep_.cq, &err, 0) > 0 && err.op_context) {
                // Only receive buffers and writes carry a context; the
                // flags of an error entry are not to be trusted.
                auto *ctx = static_cast<char *>(err.op_context);
                auto *first = reinterpret_cast<char *>(rx_);
                bool is_rx = ctx >= first && ctx < first + settings().rx_buffers * sizeof(RxBuffer);
                SD_LOG(info, "fabric %s failed: %s", is_rx ? "receive" : "write",
                       fabric_strerror(err.err));
                if (is_rx) post_rx(reinterpret_cast<RxBuffer *>(err.op_context));
                else complete_write(static_cast<WriteOp *>(err.op_context), -1);
            }
            continue;
        }
        for (ssize_t i = 0; i < n; ++i) {
            const fi_cq_data_entry &e = entries[i];
            if (e.flags & (FI_WRITE | FI_READ)) {
                complete_write(static_cast<WriteOp *>(e.op_context), 1);
                continue;
            }
            if ((e.flags & FI_RECV) && e.len) deliver(static_cast<const char *>(e.buf), e.len);
            // Every message of the buffer was handled above (in CQ order):
            // it can take new messages at once.
            if (e.flags & FI_MULTI_RECV) post_rx(reinterpret_cast<RxBuffer *>(e.op_context));
        }
        taken += std::size_t(n);
        if (n < 32) break;
    }
    progress_lock_.unlock();
    flush_due_stages();
    return taken;
}

// Runs wherever progress() runs, so possibly under a lock of its caller
// (a send's tx_lock, the table lock of the control thread or of a leave):
// it skips what it would have to take again, and leaves it due.
void Engine::flush_due_stages() noexcept {
    if (flush_due_count_.load(std::memory_order_acquire) == 0 || flush_lock_.held()) return;
    if (!flush_lock_.try_lock()) return;  // another thread does it
    const bool may_initiate = !conn_lock_.held();
    bool retry = false;
    for (std::uint32_t id = 0; id < kSlots; ++id) {
        Conn *c = conns_[id].load(std::memory_order_acquire);
        if (!c || !c->flush_due.load(std::memory_order_acquire)) continue;
        // Leaving the fabric: our leave, then bytes owed to the kernel.
        const bool left = c->leave_due.load(std::memory_order_acquire) ||
                          c->tx_owed.load(std::memory_order_acquire) ||
                          c->rearm_due.load(std::memory_order_acquire) ||
                          c->initiate_due.load(std::memory_order_acquire);
        // Short of credits: their arrival brings us back here.
        if (!left && c->credits.load(std::memory_order_acquire) < std::int64_t(c->staged) &&
            !c->gone() && c->is_direct())
            continue;
        if (c->tx_lock.held() || !c->tx_lock.try_lock()) {
            retry = true;
            continue;
        }
        if (left) {
            const bool again = c->leave_under_way() && leave_work_locked(c) == -EAGAIN;
            retry |= again;
            if (!again && c->flush_due.exchange(false))
                flush_due_count_.fetch_sub(1, std::memory_order_relaxed);
        } else if (!c->staged || c->gone() || !c->is_direct()) {
            if (c->flush_due.exchange(false)) flush_due_count_.fetch_sub(1, std::memory_order_relaxed);
        } else if (c->credits.load(std::memory_order_acquire) >= std::int64_t(c->staged)) {
            retry |= post_stage_locked(c, monotonic_ns() + 1000000) != 0;
        }
        c->tx_lock.unlock();
        // Rearmed: the peer's last holder may have published already.
        if (!may_initiate) {
            if (c->initiate_due.load(std::memory_order_acquire)) {
                want_flush(c);  // the next pass, from a thread without the table lock
                retry = true;
            }
        } else if (c->initiate_due.exchange(false, std::memory_order_acq_rel)) {
            try_initiate(c);
        }
    }
    flush_retry_.store(retry, std::memory_order_relaxed);
    flush_lock_.unlock();
}

void Engine::want_flush(Conn *c) noexcept {
    if (!c->flush_due.exchange(true)) flush_due_count_.fetch_add(1, std::memory_order_release);
}

int Engine::post_stage_locked(Conn *c, std::uint64_t deadline_ns) noexcept {
    if (!c->staged) return 0;
    if (c->credits.load(std::memory_order_acquire) < std::int64_t(c->staged)) return -EAGAIN;
    iovec v{c->stage, c->staged};
    int rc = post(c, MsgType::data, &v, 1, c->staged, c->tx_off, deadline_ns);
    if (rc) return rc;
    sent_into_ring(c, c->staged);
    c->staged = 0;
    if (c->flush_due.exchange(false)) flush_due_count_.fetch_sub(1, std::memory_order_relaxed);
    ring(c->peer);
    return 0;
}

void Engine::sent_into_ring(Conn *c, std::uint32_t len) noexcept {
    c->tx_ring += len;
    c->tx_off += len;
    c->credits.fetch_sub(len, std::memory_order_acq_rel);
    bump(c->stat->tx_fabric, len);
    c->show_flow(false);
}

void Engine::progress_blocking() noexcept {
    if (!fabric_ok_) return;
    { std::lock_guard wait_turn(progress_lock_); }
    progress();
}

void Engine::deliver(const char *buf, std::size_t len) noexcept {
    MsgHeader h;
    if (len < sizeof h) return;
    std::memcpy(&h, buf, sizeof h);
    if (h.magic != kWireMagic || h.version != kWireVersion || h.len != len - sizeof h) {
        SD_LOG(error,
               "dropping malformed fabric message (%zu bytes: magic %04x version %u type %u "
               "conn %u len %u offset %llu)",
               len, unsigned(h.magic), unsigned(h.version), unsigned(h.type), h.dst_conn, h.len,
               (unsigned long long)h.offset);
        return;
    }
    Conn *c = lookup(h.dst_conn, h.dst_gen);
    if (!c) return;  // connection already closed here: nobody reads it
    if (h.credits) {
        c->credits.fetch_add(h.credits, std::memory_order_acq_rel);
        c->tx_seq.fetch_add(1, std::memory_order_release);
    }
    bump(c->stat->rx_msgs, 1);
    std::unique_lock lock(c->rx_lock);
    std::uint64_t answer_off = kNoOffset;  // a cancelled advert to answer
    std::uint32_t answer_len = 0;
    bool answer_sink = false;              // a sink_cancel to answer
    bool answer_rst = false;               // bytes came to an end shut both ways
    if (is_stream_msg(MsgType(h.type))) sink_passed_locked(c);
    switch (MsgType(h.type)) {
    case MsgType::data: {
        if (c->switch_off == kNoOffset) c->switch_off = h.offset;
        if (refuse_at_shut_end_locked(c, h.len, &answer_rst)) break;
        std::uint64_t expect = c->rx_expect();
        if (!c->ring || h.offset != expect || c->ring_bytes() + h.len > c->ring_cap ||
            c->fin_off != kNoOffset || c->zc.active ||
            (c->peer_end != kNoOffset && expect + h.len > c->peer_end)) {
            SD_LOG(error, "conn %u: data at offset %llu, expected %llu: connection broken",
                   c->id, (unsigned long long)h.offset, (unsigned long long)expect);
            c->broken = true;
            break;
        }
        const char *src = buf + sizeof h;
        std::uint32_t at = std::uint32_t(c->ring_tail % c->ring_cap);
        std::uint32_t first = std::min(h.len, c->ring_cap - at);
        std::memcpy(c->ring + at, src, first);
        std::memcpy(c->ring, src + first, h.len - first);
        c->ring_tail += h.len;
        bump(c->stat->rx_fabric, h.len);
        break;
    }
    case MsgType::ring: {
        // The bytes are in the ring already (the peer wrote them): accept
        // them only where they continue the stream and fit.
        if (c->switch_off == kNoOffset) c->switch_off = h.offset;
        if (refuse_at_shut_end_locked(c, h.flags, &answer_rst)) break;
        std::uint64_t expect = c->rx_expect();
        if (!c->ring_mr || h.offset != expect || c->ring_bytes() + h.flags > c->ring_cap ||
            c->fin_off != kNoOffset || c->zc.active ||
            (c->peer_end != kNoOffset && expect + h.flags > c->peer_end)) {
            SD_LOG(error, "conn %u: ring data at offset %llu, expected %llu: connection broken",
                   c->id, (unsigned long long)h.offset, (unsigned long long)expect);
            c->broken = true;
            break;
        }
        c->ring_tail += h.flags;
        bump(c->stat->rx_fabric, h.flags);
        break;
    }
    case MsgType::credit:
        break;
    case MsgType::leave:
        on_leave(c, h);
        break;
    case MsgType::give_back:
        on_give_back(c, h, buf + sizeof h);
        break;
    case MsgType::src_avail: {
        if (c->switch_off == kNoOffset) c->switch_off = h.offset;
        if (refuse_at_shut_end_locked(c, h.flags, &answer_rst)) break;
        SrcAvailBody body;
        if (h.len != sizeof body || h.offset != c->rx_expect() || c->zc.active || !h.flags ||
            c->fin_off != kNoOffset) {
            SD_LOG(error, "conn %u: advertisement at offset %llu, expected %llu: connection broken",
                   c->id, (unsigned long long)h.offset, (unsigned long long)c->rx_expect());
            c->broken = true;
            break;
        }
        std::memcpy(&body, buf + sizeof h, sizeof body);
        c->zc = SrcAvail{};
        c->zc.active = true;
        c->zc.off = h.offset;
        c->zc.len = h.flags;
        c->zc.addr = body.addr;
        c->zc.key = body.key;
        break;
    }
    case MsgType::src_done:
        // Our advertisement is over (send side): the bytes read, then the
        // offset that the waiting sender matches.
        c->zc_answer_len.store(h.flags, std::memory_order_relaxed);
        c->zc_answer_off.store(h.offset, std::memory_order_release);
        break;
    case MsgType::src_need_key:
        c->zc_need_key.store(true, std::memory_order_relaxed);
        break;
    case MsgType::src_cancel:
        if (!c->zc.active || c->zc.off != h.offset) break;  // over already: answered
        if (c->zc.busy) c->zc.cancel = true;  // the reader answers when its read is done
        else finish_advert_locked(c, &answer_off, &answer_len);
        break;
    case MsgType::sink_avail:
        on_sink_avail(c, h, buf + sizeof h);
        break;
    case MsgType::sink_done:
        on_sink_done(c, h, buf + sizeof h);
        break;
    case MsgType::sink_cancel:
        answer_sink = on_sink_cancel(c, h, buf + sizeof h);
        break;
    case MsgType::fin:
    case MsgType::close:
        if (c->switch_off == kNoOffset) c->switch_off = h.offset;
        if (MsgType(h.type) == MsgType::close && (h.flags & kCloseReset)) {
            // After its FIN we were in CLOSE_WAIT: TCP says EPIPE then.
            if (c->fin_off != kNoOffset && !c->peer_reset.load(std::memory_order_relaxed))
                c->reset_after_fin.store(true, std::memory_order_release);
            c->note_reset();
        } else if (MsgType(h.type) == MsgType::close) {
            closed_before_ours_locked(c);
        }
        c->fin_off = h.offset;
        c->peer_fin.store(true, std::memory_order_release);
        if (MsgType(h.type) == MsgType::close) c->peer_closed = true;
        break;
    default:
        SD_LOG(error, "conn %u: unknown message type %u", c->id, unsigned(h.type));
        return;
    }
    c->wake_locked();
    lock.unlock();
    if (answer_off != kNoOffset) answer_advert(c, answer_off, answer_len);
    if (answer_rst) answer_reset(c);
    if (answer_sink) {
        std::uint64_t seq;
        std::memcpy(&seq, buf + sizeof h, sizeof seq);
        answer_sink_cancel(c, seq, h.offset);
    }
}

void Engine::finish_advert_locked(Conn *c, std::uint64_t *off, std::uint32_t *done) noexcept {
    *off = c->zc.off;
    *done = c->zc.done;
    c->zc_total += c->zc.done;
    c->zc = SrcAvail{};
}

void Engine::answer_advert(Conn *c, std::uint64_t off, std::uint32_t done) noexcept {
    if (post(c, MsgType::src_done, nullptr, 0, 0, off, 0, done) == 0) ring(c->peer);
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

void Engine::publish_regstats() noexcept {
    const RegCacheStats s = regcache().stats();
    ProcHeader &h = page_->header;
    h.reg_hits.store(s.hits, std::memory_order_relaxed);
    h.reg_misses.store(s.misses, std::memory_order_relaxed);
    h.reg_invalidated.store(s.invalidated, std::memory_order_relaxed);
    h.reg_evicted.store(s.evicted, std::memory_order_relaxed);
    h.reg_bytes.store(s.bytes, std::memory_order_relaxed);
}

int Engine::advertise(Conn *c, const char *buf, std::uint32_t len, RegCache::Ref *ref) noexcept {
    // On one host the reader copies with process_vm_readv: no registration
    // (unless it told us the kernel refuses it there).
    *ref = RegCache::Ref{};
    std::uint64_t key = kSrcNoKey;
    if (!cma_with(c) || c->zc_need_key.load(std::memory_order_relaxed)) {
        int rc = regcache().acquire(buf, len, ref);
        if (rc) {
            SD_LOG(debug, "conn %u: registering a send buffer failed: %s", c->id,
                   fabric_strerror(rc));
            return -EIO;
        }
        key = ref->key;
    }
    SrcAvailBody body{reinterpret_cast<std::uint64_t>(buf), key};
    iovec v{&body, sizeof body};
    c->zc_answer_off.store(kNoOffset, std::memory_order_relaxed);
    int rc = post(c, MsgType::src_avail, &v, 1, sizeof body, c->tx_off, 0, len);
    if (rc == 0) c->stat->adverts.fetch_add(1, std::memory_order_relaxed);
    if (rc) {
        release_advert(*ref);
        *ref = RegCache::Ref{};
        return rc;
    }
    ring(c->peer);
    return 0;
}

void Engine::need_key(Conn *c) noexcept {
    if (post(c, MsgType::src_need_key, nullptr, 0, 0, c->zc.off, 0) == 0) ring(c->peer);
}

int Engine::cancel_advert(Conn *c, std::uint64_t off) noexcept {
    int rc = post(c, MsgType::src_cancel, nullptr, 0, 0, off, 0);
    if (rc == 0) c->stat->cancels.fetch_add(1, std::memory_order_relaxed);
    if (rc == 0) ring(c->peer);
    return rc;
}

void Engine::release_advert(const RegCache::Ref &ref) noexcept {
    if (!ref.handle) return;
    regcache().release(ref);
    publish_regstats();
}

namespace {
// Moves `*v`/`*n` past `done` bytes.
void advance(iovec *v, int *n, std::size_t done) noexcept {
    int i = 0;
    while (i < *n && done >= v[i].iov_len) done -= v[i++].iov_len;
    std::copy(v + i, v + *n, v);
    *n -= i;
    if (*n) {
        v[0].iov_base = static_cast<char *>(v[0].iov_base) + done;
        v[0].iov_len -= done;
    }
}
}  // namespace

bool Engine::cma_with(const Conn *c) const noexcept {
    // Across users the kernel refuses it one way (ptrace rules); both ends
    // of such a pair copy through the provider instead, whatever their uids.
    return cma_ok_.load(std::memory_order_relaxed) && !(c->peer && c->peer->cross);
}

int Engine::cma_copy(pid_t pid, const iovec *local, int nlocal, const iovec *remote, int nremote,
                     bool write) noexcept {
    iovec l[kMaxRmaIov], r[4];
    if (nlocal > kMaxRmaIov || nremote > 4) return -ENOSYS;
    std::copy(local, local + nlocal, l);
    std::copy(remote, remote + nremote, r);
    std::size_t left = 0;
    for (int i = 0; i < nlocal; ++i) left += l[i].iov_len;
    bool first = true;
    while (left) {
        ssize_t n = write ? process_vm_writev(pid, l, unsigned(nlocal), r, unsigned(nremote), 0)
                          : process_vm_readv(pid, l, unsigned(nlocal), r, unsigned(nremote), 0);
        if (n > 0) {
            left -= std::size_t(n);
            advance(l, &nlocal, std::size_t(n));
            advance(r, &nremote, std::size_t(n));
            first = false;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EPERM || errno == ENOSYS) && first) {
            SD_LOG(info, "process_vm_%sv refused (%s): the provider's RMA from now on",
                   write ? "write" : "read", std::strerror(errno));
            cma_ok_.store(false, std::memory_order_relaxed);
            return -ENOSYS;
        }
        const int err = n < 0 ? errno : EIO;
        if (err != ESRCH)
            SD_LOG(error, "process_vm_%sv with pid %d failed: %s", write ? "write" : "read", int(pid),
                   std::strerror(err));
        return err == ESRCH ? -EPIPE : -EIO;
    }
    return 0;
}

int Engine::read_remote(Conn *c, const iovec *iov, int iovcnt, std::uint64_t addr,
                        std::uint64_t key, std::size_t len) noexcept {
    // On one host the read is one process_vm_readv (what shm's own RMA read
    // does, without its queues and completions). Only where the kernel
    // refuses it (ptrace rules), or across users, does the provider's read
    // take over.
    if (cma_with(c)) {
        iovec remote{reinterpret_cast<void *>(addr), len};
        int rc = cma_copy(c->peer->pid, iov, iovcnt, &remote, 1, false);
        if (rc != -ENOSYS) return rc;
    }
    if (key == kSrcNoKey) return -ENOKEY;  // unregistered: only process_vm_readv could
    fi_rma_iov src{addr, len, key};
    return rma(c, iov, iovcnt, &src, 1, false);
}

namespace {
// This thread's RMA operation (one at a time per thread), on the heap: an
// operation given up while pending (its peer died) is left to its
// completion, which may come later or never, and the thread takes a new
// one (complete_write deletes the old one if it ever completes).
struct RmaSlot {
    WriteOp *op = nullptr;
    ~RmaSlot() { delete op; }  // never pending outside rma()
};
thread_local RmaSlot rma_slot;
}  // namespace

void Engine::complete_write(WriteOp *op, int state) noexcept {
    if (op->state.exchange(state, std::memory_order_acq_rel) == kOpAbandoned) delete op;
}

int Engine::rma(Conn *c, const iovec *iov, int iovcnt, const fi_rma_iov *remote, int nremote,
                bool write, std::uint64_t flags) noexcept {
    if (!rma_slot.op) rma_slot.op = new (std::nothrow) WriteOp;
    WriteOp *op = rma_slot.op;
    if (!op) return -ENOMEM;
    op->state.store(0, std::memory_order_relaxed);
    fi_msg_rma msg{};
    msg.msg_iov = iov;
    msg.iov_count = std::size_t(iovcnt);
    msg.addr = c->peer->addr;
    msg.rma_iov = remote;
    msg.rma_iov_count = std::size_t(nremote);
    msg.context = &op->ctx;
    {
        Guard guard;
        for (unsigned tries = 0;; ++tries) {
            // The provider spins on the peer's region lock: a lock left
            // held by a dead process must not hold us too.
            if (!c->peer->region.wait_free(kRegionLockBoundNs)) return -EPIPE;
            InProvider in;
            if (!in.ok()) return -EPIPE;
            ssize_t rc = write ? fi_writemsg(ep_.ep, &msg, FI_COMPLETION | flags)
                               : fi_readmsg(ep_.ep, &msg, FI_COMPLETION | flags);
            if (rc == 0) break;
            if (rc != -FI_EAGAIN) {
                SD_LOG(error, "conn %u: fabric %s failed: %s", c->id, write ? "write" : "read",
                       fabric_strerror(int(rc)));
                return -EIO;
            }
            ring(c->peer);
            progress();
            if ((tries & 63) == 63 && !peer_alive(c->peer)) return -EPIPE;
        }
    }
    // The completion says the copy is over. Where the provider cannot copy
    // by itself (a wrapped or large transfer goes through the peer's
    // queue), the peer must progress: wake it now and then; at once for a
    // write that must be delivered (the peer's progress places it).
    if (flags & FI_DELIVERY_COMPLETE) ring(c->peer);
    const std::uint64_t start = now_ns();
    for (unsigned spins = 0; op->state.load(std::memory_order_acquire) == 0; ++spins) {
        progress();
        if ((spins & 255) == 255) ring(c->peer);
        if ((spins & 1023) != 1023) continue;
        // A peer whose region lock a dead process left held never
        // progresses again: as good as dead for this operation.
        if (peer_alive(c->peer) && c->peer->region.wait_free(kRegionLockBoundNs)) {
            if (now_ns() - start > 200000) {
                timespec nap{0, 50000};
                nanosleep(&nap, nullptr);
            }
            continue;
        }
        // The peer died with the operation pending (shm reports a failed
        // copy of its fast path on the receive CQ, without our context):
        // nothing of it counts; the slot goes with it.
        rma_slot.op = nullptr;
        const int was = op->state.exchange(kOpAbandoned, std::memory_order_acq_rel);
        if (was == 0) return write ? -EPIPE : -EIO;
        delete op;  // it completed meanwhile
        return was < 0 ? -EIO : 0;
    }
    return op->state.load(std::memory_order_relaxed) < 0 ? -EIO : 0;
}

int Engine::post(Conn *c, MsgType type, const iovec *iov, int iovcnt, std::uint32_t len,
                 std::uint64_t offset, std::uint64_t deadline_ns, std::uint32_t flags) noexcept {
    MsgHeader h{};
    h.magic = kWireMagic;
    h.version = kWireVersion;
    h.type = std::uint8_t(type);
    h.dst_conn = c->peer_id;
    h.dst_gen = c->peer_gen;
    h.len = len;
    h.offset = offset;
    h.credits = c->unreturned.exchange(0, std::memory_order_acq_rel);
    h.flags = flags;
    iovec v[2];
    v[0] = {&h, sizeof h};
    int n = 1;
    int pieces = 0;
    for (int i = 0; i < iovcnt; ++i)
        if (iov[i].iov_len) v[1] = iov[i], ++pieces;
    // One payload piece goes as it is. Several are gathered into one: the
    // shm provider loses a piece of some multi-piece injected messages.
    alignas(16) char flat[kMaxInline];
    if (pieces > 1) {
        if (len > sizeof flat) return -EINVAL;
        std::size_t at = 0;
        bool ok = guarded([&] {
            for (int i = 0; i < iovcnt; ++i) {
                std::memcpy(flat + at, iov[i].iov_base, iov[i].iov_len);
                at += iov[i].iov_len;
            }
        });
        if (!ok) return -EFAULT;
        v[1] = {flat, at};
    }
    if (pieces) n = 2;
    fi_msg msg{};
    msg.msg_iov = v;
    msg.iov_count = std::size_t(n);
    msg.addr = c->peer->addr;
    Guard guard;
    std::uint64_t start = 0, kicked = 0;
    for (unsigned tries = 0;; ++tries) {
        // As in rma(): the peer's region lock, watched with a bound.
        // (Waited for outside the gate: an exit does not wait for a wait.)
        bool free = c->peer->region.wait_free(kRegionLockBoundNs);
        InProvider in;
        if (!free || !in.ok()) {
            c->unreturned.fetch_add(h.credits, std::memory_order_relaxed);
            return -EPIPE;
        }
        ssize_t rc = fi_sendmsg(ep_.ep, &msg, FI_INJECT);
        if (rc == 0) break;
        if (rc != -FI_EAGAIN) {
            SD_LOG(error, "conn %u: fabric send failed: %s", c->id, fabric_strerror(int(rc)));
            c->unreturned.fetch_add(h.credits, std::memory_order_relaxed);
            return -EIO;
        }
        // The peer's queue is full or it has not yet processed our
        // connection request: it must progress. Wake it and help ourselves.
        ring(c->peer);
        progress();
        if (tries == 0) start = now_ns();
        if ((tries & 63) == 63) {
            std::uint64_t t = now_ns();
            // A peer whose threads are all outside the library (asleep,
            // computing) drains its queue only when it calls in again:
            // its control thread does it for us. The queue holds a fixed
            // number of messages, whatever their size, so small sends fill
            // it long before the window (1024 sends of 1000 bytes are half
            // of 2 MiB), and without this a send waited, even a
            // non-blocking one, until the peer's application called in.
            (void)kick_overdue(c->peer, start, &kicked);
            if (!peer_alive(c->peer)) {
                c->unreturned.fetch_add(h.credits, std::memory_order_relaxed);
                return -EPIPE;
            }
            if (deadline_ns && t >= deadline_ns) {
                c->unreturned.fetch_add(h.credits, std::memory_order_relaxed);
                return -EAGAIN;
            }
            if (t - start > 200000) {
                timespec nap{0, 50000};
                nanosleep(&nap, nullptr);
            } else {
                sched_yield();
            }
        }
    }
    // A stream message (posted under tx_lock) ends the peer's registered
    // sinks at or before its offset: take_sink reads this.
    if (is_stream_msg(type)) c->tx_mark.store(offset, std::memory_order_relaxed);
    // Senders and readers (credit messages) post concurrently.
    c->stat->tx_msgs.fetch_add(1, std::memory_order_relaxed);
    if (type == MsgType::data) bump(c->stat->tx_inline, len);  // under tx_lock
    return 0;
}

int Engine::post_ring(Conn *c, const iovec *iov, int iovcnt, std::uint32_t len,
                      std::uint64_t deadline_ns) noexcept {
    // Destination: the peer's ring from our running position, in at most
    // two pieces where it wraps. Credits guarantee that space is free.
    std::uint32_t at = std::uint32_t(c->tx_ring % c->peer_ring_cap);
    std::uint32_t first = std::min(len, c->peer_ring_cap - at);
    fi_rma_iov dst[2] = {{c->peer_ring_addr + at, first, c->peer_ring_key},
                         {c->peer_ring_addr, len - first, c->peer_ring_key}};
    // On one host: one process_vm_writev, done when it returns, needing
    // nothing of the peer (the provider's write may wait for its progress).
    if (cma_with(c)) {
        iovec remote[2] = {{reinterpret_cast<void *>(dst[0].addr), dst[0].len},
                           {reinterpret_cast<void *>(dst[1].addr), dst[1].len}};
        int rc = cma_copy(c->peer->pid, iov, iovcnt, remote, first == len ? 1 : 2, true);
        if (rc == 0) {
            rc = post(c, MsgType::ring, nullptr, 0, 0, c->tx_off, deadline_ns, len);
            if (rc == 0) bump(c->stat->tx_ring, len);
            return rc;
        }
        if (rc != -ENOSYS) return rc == -EPIPE || !peer_alive(c->peer) ? -EPIPE : -EIO;
    }
    // The bytes must be in place before the peer hears of them.
    int rc = rma(c, iov, iovcnt, dst, first == len ? 1 : 2, true);
    if (rc == -EIO && !peer_alive(c->peer)) rc = -EPIPE;
    if (rc) return rc;
    rc = post(c, MsgType::ring, nullptr, 0, 0, c->tx_off, deadline_ns, len);
    if (rc == 0) bump(c->stat->tx_ring, len);
    return rc;
}

void Engine::ring(const Peer *p) noexcept {
    // Pairs with the sleeper's increment-then-recheck (wait.cpp): either it
    // sees our message on its recheck, or we see it counted here.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (p->page->header.sleepers.load(std::memory_order_relaxed) == 0 || p->doorbell < 0) return;
    std::uint64_t one = 1;
    (void)sys.write(p->doorbell, &one, sizeof one);
}

void Engine::maybe_return_credits(Conn *c) noexcept {
    // Delayed acknowledgement: credits ride on reverse data; an explicit
    // credit message goes out only once a quarter window has piled up. It
    // needs no send lock: it carries no stream bytes, so its order among
    // data messages does not matter, and whoever posts takes every credit
    // owed at that moment (a racing second message carries none).
    if (c->unreturned.load(std::memory_order_relaxed) < c->ring_cap / 4 || !c->is_direct()) return;
    if (post(c, MsgType::credit, nullptr, 0, 0, 0, 0) == 0) ring(c->peer);
    c->show_flow(false);
}

std::uint64_t Engine::peer_read(const Conn *c) const noexcept {
    const ProcPage *pg = c->peer ? c->peer->page : nullptr;
    if (!pg || c->peer_id >= kSlots) return kNoOffset;
    const ConnStat &s = pg->slots[c->peer_id];
    return s.rx_fabric.load(std::memory_order_acquire) - s.rx_queued.load(std::memory_order_acquire);
}

void Engine::peer_died(Conn *c) noexcept {
    if (c->peer_closed.exchange(true)) return;
    // Bytes we sent through the kernel (before the upgrade) that it never
    // read: its exit closed its socket with them in the receive queue, and
    // the kernel reset the connection (our socket has the error pending;
    // the exit closed the files before its pidfd said so). TCP's answer is
    // the reset, whatever the fabric part says.
    pollfd k{c->app_fd(), 0, 0};
    if (sys.poll(&k, 1, 0) == 1 && (k.revents & POLLERR)) {
        c->note_reset();
        return;
    }
    // Its counters outlive it in its process page: bytes we sent that it
    // never read make the kernel's close a reset.
    const std::uint64_t read = peer_read(c);
    if (read == kNoOffset) return;
    if (c->stat->tx_fabric.load(std::memory_order_relaxed) - c->tx_fabric_base > read)
        c->note_reset();
}

bool Engine::peer_exit_wait(const Peer *p, int ms) const noexcept {
    if (p->pid == pid_) return false;
    if (p->pidfd < 0) return !peer_alive(p);
    pollfd pfd{p->pidfd, POLLIN, 0};
    return sys.poll(&pfd, 1, ms) == 1;
}

bool Engine::peer_alive(const Peer *p) const noexcept {
    if (p->pid == pid_) return true;
    // A pidfd is readable once its process has exited. Even a poll that
    // does not wait fails with EINTR when a signal is pending, which says
    // nothing about the peer: a "dead" answer then would end a read
    // zero-copy send while its reader still copies the buffer, or fail a
    // post with EPIPE. So ask again; a storm that outlasts the retries is
    // answered by kill(), which is not interrupted.
    for (int tries = 0; p->pidfd >= 0 && tries < 16; ++tries) {
        pollfd pfd{p->pidfd, POLLIN, 0};
        const int r = sys.poll(&pfd, 1, 0);
        if (r >= 0) return r == 0;
        if (errno != EINTR) break;
    }
    return kill(p->pid, 0) == 0 || errno != ESRCH;
}

void Conn::show_flow(bool rx_locked) noexcept {
    stat->tx_window.store(credits.load(std::memory_order_relaxed), std::memory_order_relaxed);
    // Exactly the ring's bytes: rx_fabric - rx_queued is what was read
    // (a survivor reads it when this process dies: peer_died()).
    if (rx_locked) stat->rx_queued.store(std::uint32_t(ring_bytes()), std::memory_order_relaxed);
    stat->rx_owed.store(unreturned.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

void Conn::wake_locked() noexcept {
    show_flow(true);
    rx_seq.fetch_add(1, std::memory_order_release);
    std::uint64_t one = 1;
    for (Waiter &w : waiters) (void)sys.write(w.efd, &one, sizeof one);
    wake_pollers();
}

void Engine::announce_switch(Conn *c) noexcept {
    // A zero-length data message at the current send offset: the peer
    // learns where our fabric stream starts before we have anything to
    // say, so its readiness checks stop asking the kernel. Skipped if a
    // send holds the lock: that send announces it when it ends.
    if (c->tx_lock.held()) return;
    std::unique_lock tx(c->tx_lock, std::try_to_lock);
    if (tx) announce_switch_locked(c);
}

void Engine::announce_switch_locked(Conn *c) noexcept {
    // Nothing goes after our close or shutdown: its FIN ended the stream.
    if (c->tx_fabric || c->tx_fin || !c->is_direct()) return;
    if (post(c, MsgType::data, nullptr, 0, 0, c->tx_off, monotonic_ns() + 100000000ull) == 0) {
        c->tx_fabric = true;
        ring(c->peer);
    }
}

void Conn::add_waiter(Waiter *w) noexcept { waiters.push_front(*w); }

void Conn::remove_waiter(Waiter *w) noexcept { waiters.remove_if([w](const Waiter &x) { return &x == w; }); }

}  // namespace sd::transport
