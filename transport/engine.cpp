// The engine's hot path: progress (the completion queue), the flush of
// staged bytes, posting messages, RMA and process_vm copies, zero-copy
// advertisements, doorbells and credits. Building the engine is
// engine_setup.cpp; what a received message does is deliver.cpp.
#include "conn_impl.hpp"
#include "engine.hpp"
#include "clock.hpp"
#include "memguard.hpp"
#include "sink.hpp"
#include "wait.hpp"

#include "log.hpp"
#include "settings.hpp"
#include "sys.hpp"

#include <cerrno>
#include <cstring>
#include <new>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/uio.h>

namespace sd::transport {
namespace {

// Completions one progress pass takes at most (8 reads of an eighth).
constexpr std::size_t kPassEntries = 256;

}  // namespace

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

std::size_t Engine::progress() noexcept {
    // A delivery's own answer may post and so come back here.
    if (!fabric_ok_ || progress_lock_.held() || !progress_lock_.try_lock()) return 0;
    return progress_pass();
}

std::size_t Engine::progress_for(const Conn *c) noexcept {
    // `peer` and its link are published by the release store of state ==
    // direct, and stay while the connection is direct.
    const Peer *p = c->is_direct() ? c->peer : nullptr;
    const int xl = p && p->queued ? p->xl : -1;
    if (xl < 0 || xl >= int(kMaxLinks)) return progress();
    if (!fabric_ok_ || progress_lock_.held() || !progress_lock_.try_lock()) return 0;
    return progress_pass(xl);
}

void Engine::progress_before_sleep() noexcept {
    if (!fabric_ok_ || progress_lock_.held()) return;
    // A full pass may have left messages behind; bounded.
    for (int pass = 0; pass < 16; ++pass) {
        pass_owed_.store(true, std::memory_order_relaxed);
        // Pairs with the fence in unlock_progress: either the holder sees
        // the pass owed after its release, or our try-lock sees the lock
        // free.
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (!progress_lock_.try_lock()) return;  // the holder passes for us
        pass_owed_.store(false, std::memory_order_relaxed);
        if (progress_pass() < kPassEntries) return;
    }
}

void Engine::unlock_progress() noexcept {
    // Each round serves every request made before its pass began; a
    // sleeper asks once per sleep, so rounds end unless others keep
    // coming to sleep meanwhile.
    for (int round = 0;; ++round) {
        progress_lock_.unlock();
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (!pass_owed_.load(std::memory_order_relaxed)) return;
        if (round == 8) {
            // Enough of others' passes for this caller: a sleeper of ours
            // drains the doorbell and passes (rung as a peer rings it).
            ring_doorbell(page_->header.sleepers, doorbell_);
            return;
        }
        if (!progress_lock_.try_lock()) return;  // its holder serves it
        pass_owed_.store(false, std::memory_order_relaxed);
        (void)pass_locked();
    }
}

void Engine::take_ring() noexcept {
    // In this order: a sender that sees the latch before it is cleared
    // posted before the pass below looks.
    std::uint64_t v;
    (void)sys.read(doorbell_, &v, sizeof v);
    page_->header.sleepers.fetch_and(~kRung, std::memory_order_seq_cst);
    provider_due_.store(true, std::memory_order_release);  // a peer may wait for our progress
    progress_before_sleep();
}

std::size_t Engine::progress_pass(int link) noexcept {
    bool flush = true;
    const std::size_t taken = pass_locked(&flush, link);
    unlock_progress();
    if (flush) flush_due_stages();
    return taken;
}

std::size_t Engine::pass_locked(bool *flush, int link) noexcept {
    std::size_t taken = 0;
    // Peers of other uids write into queues of ours, not the provider's
    // region (xqlink.cpp); without any, this one relaxed load is all.
    if (links_used_.load(std::memory_order_relaxed)) {
        Guard guard;
        taken = link < 0 ? read_links() : read_link(links_[link]);
    }
    // Every peer's messages through our queues, no RMA of ours in flight
    // and no ring: nothing is due from the provider (its gate, lock and
    // empty queue were a third of a 64-byte ping-pong's progress pass).
    if (!provider_msgs_.load(std::memory_order_acquire) &&
        !rma_pending_.load(std::memory_order_acquire) &&
        !provider_due_.load(std::memory_order_acquire) && ++quiet_passes_ % kQuietPasses)
        return taken;
    if (provider_due_.load(std::memory_order_relaxed))
        provider_due_.store(false, std::memory_order_relaxed);
    // The provider takes our region's lock and would spin on it for ever
    // if a peer died holding it: then nothing comes in any more (and no
    // new connection upgrades: fabric_usable()), but no thread is stuck.
    if (!own_region_.wait_free(kRegionLockBoundNs)) {
        if (flush) *flush = false;
        return taken;
    }
    InProvider in;  // after the wait: an exit does not wait for a wait
    if (!in.ok()) {
        if (flush) *flush = false;
        return taken;
    }
    Guard guard;
    fi_cq_data_entry entries[kPassEntries / 8];
    for (int round = 0; round < 8; ++round) {
        ssize_t n = fi_cq_read(ep_.cq, entries, kPassEntries / 8);
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
        if (n < ssize_t(kPassEntries / 8)) break;
    }
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
        const bool left = c->leave_due() ||
                          c->tx_owed.load(std::memory_order_acquire) ||
                          c->rearm_due() ||
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
        // Rearmed: the peer's side may have published again already.
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
    ring(c);
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
    { ProgressHeld wait_turn(*this); }
    progress();
}

void Engine::finish_advert_locked(Conn *c, std::uint64_t *off, std::uint32_t *done) noexcept {
    *off = c->zc.off;
    *done = c->zc.done;
    c->zc_total += c->zc.done;
    c->zc = SrcAvail{};
}

void Engine::answer_advert(Conn *c, std::uint64_t off, std::uint32_t done) noexcept {
    if (post(c, MsgType::src_done, nullptr, 0, 0, off, 0, done) == 0) ring(c);
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
    ring(c);
    return 0;
}

void Engine::need_key(Conn *c) noexcept {
    if (post(c, MsgType::src_need_key, nullptr, 0, 0, c->zc.off, 0) == 0) ring(c);
}

int Engine::cancel_advert(Conn *c, std::uint64_t off) noexcept {
    int rc = post(c, MsgType::src_cancel, nullptr, 0, 0, off, 0);
    if (rc == 0) c->stat->cancels.fetch_add(1, std::memory_order_relaxed);
    if (rc == 0) ring(c);
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
    rma_pending_.fetch_sub(1, std::memory_order_release);
    if (op->state.exchange(state, std::memory_order_acq_rel) == kOpAbandoned) delete op;
}

int Engine::rma(Conn *c, const iovec *iov, int iovcnt, const fi_rma_iov *remote, int nremote,
                bool write, std::uint64_t flags) noexcept {
    // A peer of another uid is in no address vector: nothing of the
    // provider ever names it (deliver() refuses what would lead here).
    if (c->peer->cross) return -EIO;
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
        // Counted before it is posted: its completion may be read at once,
        // by another thread's pass (complete_write).
        rma_pending_.fetch_add(1, std::memory_order_acq_rel);
        for (unsigned tries = 0;; ++tries) {
            // The provider spins on the peer's region lock: a lock left
            // held by a dead process must not hold us too.
            if (!c->peer->region.wait_free(kRegionLockBoundNs)) {
                rma_pending_.fetch_sub(1, std::memory_order_release);
                return -EPIPE;
            }
            InProvider in;
            if (!in.ok()) {
                rma_pending_.fetch_sub(1, std::memory_order_release);
                return -EPIPE;
            }
            ssize_t rc = write ? fi_writemsg(ep_.ep, &msg, FI_COMPLETION | flags)
                               : fi_readmsg(ep_.ep, &msg, FI_COMPLETION | flags);
            if (rc == 0) break;
            if (rc != -FI_EAGAIN) {
                rma_pending_.fetch_sub(1, std::memory_order_release);
                SD_LOG(error, "conn %u: fabric %s failed: %s", c->id, write ? "write" : "read",
                       fabric_strerror(int(rc)));
                return -EIO;
            }
            ring(c->peer);
            progress();
            if ((tries & 63) == 63 && !peer_alive(c->peer)) {
                rma_pending_.fetch_sub(1, std::memory_order_release);
                return -EPIPE;
            }
        }
    }
    // The completion says the copy is over. Where the provider cannot copy
    // by itself (a wrapped or large transfer goes through the peer's
    // queue), the peer must progress: wake it now and then; at once for a
    // write that must be delivered (the peer's progress places it).
    if (flags & FI_DELIVERY_COMPLETE) ring(c->peer);
    // Spins (a progress pass per look) for 200 us, then naps 50 us every
    // 1024 looks.
    unsigned spins = 0;
    const Waited w = wait_until(
        {.nap_ns = 0, .every = 1024, .late_nap_ns = 50000, .late_ns = 200000}, 0,
        [&] {
            if (op->state.load(std::memory_order_acquire) != 0) return true;
            progress();
            if ((spins++ & 255) == 255) ring(c->peer);
            return false;
        },
        // A peer whose region lock a dead process left held never
        // progresses again: as good as dead for this operation.
        [&](std::uint64_t, std::uint64_t) {
            return peer_alive(c->peer) && c->peer->region.wait_free(kRegionLockBoundNs);
        });
    if (w != Waited::ready) {
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
        bool ok = fault_guarded([&] {
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
    // A queued peer: its queue (xqlink.cpp), never the provider's send.
    const int xl = c->peer->xl;
    if (c->peer->queued && xl < 0) {  // forgotten (retire.cpp)
        c->unreturned.fetch_add(h.credits, std::memory_order_relaxed);
        return -EPIPE;
    }
    XLink *link = c->peer->queued ? &links_[xl] : nullptr;
    // The provider copies without our guard: a bad buffer of the caller's
    // is found first (EFAULT, nothing sent). A copy into a queue of ours is
    // guarded, and fails whole with EFAULT (nothing published); several
    // pieces were gathered above under the guard.
    if (!link && pieces == 1 && !readable(v[1].iov_base, v[1].iov_len)) {
        c->unreturned.fetch_add(h.credits, std::memory_order_relaxed);
        return -EFAULT;
    }
    const std::uint32_t whole = std::uint32_t(sizeof h + (n == 2 ? v[1].iov_len : 0));
    Guard guard;
    // One try: 0, -FI_EAGAIN (no room now), or the error post returns.
    auto put = [&]() noexcept -> ssize_t {
        if (link) {
            // The producer lock is a leaf: nothing is taken under it.
            std::lock_guard out(link->out.lock);
            const int rc = xq_put(link->out, v, n, whole);
            if (rc == -EAGAIN) return -FI_EAGAIN;
            return rc < 0 && rc != -EFAULT ? -EPIPE : rc;
        }
        // As in rma(): the peer's region lock, watched with a bound.
        // (Waited for outside the gate: an exit does not wait for a wait.)
        bool free = c->peer->region.wait_free(kRegionLockBoundNs);
        InProvider in;
        if (!free || !in.ok()) return -EPIPE;
        const ssize_t rc = fi_sendmsg(ep_.ep, &msg, FI_INJECT);
        if (rc != 0 && rc != -FI_EAGAIN) {
            SD_LOG(error, "conn %u: fabric send failed: %s", c->id, fabric_strerror(int(rc)));
            return -EIO;
        }
        return rc;
    };
    ssize_t rc = 0;
    std::uint64_t kicked = 0;
    // After every 64 failed tries, a nap, not a yield: beside a busy
    // thread on our CPU a yield hands it a whole time slice (milliseconds),
    // while a sleeper is back on the CPU as soon as its timer fires. 10 us
    // naps, 50 us after 200 us.
    const Waited w = wait_until(
        {.nap_ns = 10000, .every = 64, .late_nap_ns = 50000, .late_ns = 200000}, deadline_ns,
        [&] {
            if ((rc = put()) != -FI_EAGAIN) return true;
            // The peer's queue is full or it has not yet processed our
            // connection request: it must progress. Wake it and help
            // ourselves.
            ring(c->peer);
            progress();
            return false;
        },
        [&](std::uint64_t start, std::uint64_t) {
            // A peer whose threads are all outside the library (asleep,
            // computing) drains its queue only when it calls in again:
            // its control thread does it for us. The queue holds a fixed
            // number of messages, whatever their size, so small sends fill
            // it long before the window (1024 sends of 1000 bytes are half
            // of 2 MiB), and without this a send waited, even a
            // non-blocking one, until the peer's application called in.
            (void)kick_overdue(c->peer, start, &kicked);
            return peer_alive(c->peer);
        });
    if (w != Waited::ready || rc != 0) {
        c->unreturned.fetch_add(h.credits, std::memory_order_relaxed);
        return w == Waited::stopped ? -EPIPE : w == Waited::timed_out ? -EAGAIN : int(rc);
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
            rc = post(c, MsgType::written, nullptr, 0, 0, c->tx_off, deadline_ns, len);
            if (rc == 0) bump(c->stat->tx_ring, len);
            return rc;
        }
        if (rc != -ENOSYS) return rc == -EPIPE || !peer_alive(c->peer) ? -EPIPE : -EIO;
    }
    // The bytes must be in place before the peer hears of them.
    int rc = rma(c, iov, iovcnt, dst, first == len ? 1 : 2, true);
    if (rc == -EIO && !peer_alive(c->peer)) rc = -EPIPE;
    if (rc) return rc;
    rc = post(c, MsgType::written, nullptr, 0, 0, c->tx_off, deadline_ns, len);
    if (rc == 0) bump(c->stat->tx_ring, len);
    return rc;
}

void Engine::ring_doorbell(std::atomic<std::uint32_t> &word, int doorbell) noexcept {
    const std::uint32_t v = word.load(std::memory_order_relaxed);
    // Rung already and not drained yet: its drainer takes our message in
    // after its drain (Engine::take_ring).
    if ((v & ~kRung) == 0 || (v & kRung) || doorbell < 0) return;
    if (word.fetch_or(kRung, std::memory_order_seq_cst) & kRung) return;
    const std::uint64_t one = 1;
    (void)sys.write(doorbell, &one, sizeof one);
    make_way();
}

void Engine::ring(const Peer *p) noexcept {
    // Pairs with the sleeper's increment-then-recheck (wait.cpp): either it
    // sees our message on its recheck, or we see it counted here.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!p->cross) return ring_doorbell(p->page->header.sleepers, p->doorbell);
    const int xl = p->xl;
    if (xl < 0 || p->doorbell < 0) return;
    {
        // Its count, as it copies it into the queue we write (we never map
        // its page: announce_sleep), and the bell's latch there: rung
        // already and not drained yet, its drainer takes our message in
        // after its drain (drain_xbells_locked).
        std::lock_guard out(links_[xl].out.lock);
        char *q = links_[xl].out.base;
        if (!q) return;
        auto *h = reinterpret_cast<XqHeader *>(q);
        if (h->sleepers.load(std::memory_order_relaxed) == 0 || h->rung.load(std::memory_order_relaxed) ||
            h->rung.exchange(1, std::memory_order_seq_cst))
            return;
    }
    // Its bell is a datagram socket of its own (XLink::bell_tx): a full
    // queue means rung already, and no flag it sets makes us wait.
    const char one = 1;
    (void)sys.send(p->doorbell, &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    make_way();
}

void Engine::maybe_return_credits(Conn *c) noexcept {
    // Delayed acknowledgement: credits ride on reverse data; an explicit
    // credit message goes out only once a quarter window has piled up. It
    // needs no send lock: it carries no stream bytes, so its order among
    // data messages does not matter, and whoever posts takes every credit
    // owed at that moment (a racing second message carries none).
    if (c->unreturned.load(std::memory_order_relaxed) < c->ring_cap / 4 || !c->is_direct()) return;
    if (post(c, MsgType::credit, nullptr, 0, 0, 0, 0) == 0) ring(c);
    c->show_flow(false);
}

std::uint64_t Engine::peer_read(const Conn *c) const noexcept {
    ConnStat buf;
    const ConnStat *s = peer_slot(c->peer, c->peer_id, &buf);
    if (!s) return kNoOffset;
    return s->rx_fabric.load(std::memory_order_acquire) - s->rx_queued.load(std::memory_order_acquire);
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
        c->reset_comes();
        return;
    }
    // Its counters outlive it in its process page: bytes we sent that it
    // never read make the kernel's close a reset.
    const std::uint64_t read = peer_read(c);
    if (read == kNoOffset) return;
    if (c->stat->tx_fabric.load(std::memory_order_relaxed) - c->tx_fabric_base > read)
        c->reset_comes();
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
    const std::uint64_t skip = wake_waiters_locked();
    wake_pollers(pollers, skip);
    mark_changed(this, skip);
}

std::uint64_t Conn::wake_waiters_locked(RungWaker cross) noexcept {
    show_flow(true);
    rx_seq.fetch_add(1, std::memory_order_release);
    std::uint64_t one = 1;
    // Once per sleep; never the delivering thread's own (it looks again
    // after its progress pass, before and after its sleep: sleep_once).
    const int own = own_bell();
    // Nor a sleeper woken already (latch_waker): it looks anyway.
    const RungWaker rung = latch_waker(stat->waker, false);
    for (Waiter &w : waiters) {
        if (w.rung || w.efd == own || w.efd == rung.bell || w.efd == cross.bell) continue;
        w.rung = true;
        (void)sys.write(w.efd, &one, sizeof one);
        make_way();
    }
    return rung.slot_bit | cross.slot_bit;
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
    if (c->tx_fabric || c->fin_sent(std::memory_order_seq_cst) || !c->is_direct()) return;
    if (post(c, MsgType::data, nullptr, 0, 0, c->tx_off, monotonic_ns() + 100000000ull) == 0) {
        c->tx_fabric = true;
        ring(c);
    }
}

void Conn::add_waiter(Waiter *w) noexcept { waiters.push_front(*w); }

void Conn::remove_waiter(Waiter *w) noexcept { unlink_waiter(waiters, *w); }

}  // namespace sd::transport
