// The upgrade handshake over the control channel: the initiator
// (try_initiate), which found the peer's registry entry, and the
// responder (answer_upgrade), the peer's control thread. The initiator
// proves it owns the connection by passing its own socket with
// SCM_RIGHTS; across users the responder proves it the same way, and each
// passes the queue it reads the other's messages from (xqlink.cpp): with
// every handshake, not only to a new peer, since each end's peer cache
// drops peers on its own (a queue other than the one written replaces it).
#include "conn_impl.hpp"
#include "control.hpp"
#include "crossuser.hpp"
#include "engine.hpp"
#include "log.hpp"
#include "registry.hpp"
#include "settings.hpp"
#include "sys.hpp"
#include "wait.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <utility>

namespace sd::transport {
namespace {

// The peer, as the other end of an upgrade told us, under conn_lock.
// `cross`: a peer of another uid, to which neither side's ring is offered
// (every byte goes inline, through the link's queues: crossuser.hpp).
void set_peer_locked(Conn *c, Peer *peer, const CtlMsg &m, bool cross) noexcept {
    // Under rx_lock, which every delivery takes: the peer's first fabric
    // message (a close, whose delivery reads the peer's page through
    // c->peer) may come right after our answer or commit, and only the
    // other process's reply orders these writes before it, which the
    // memory model does not see (TSan: peer_read() in a delivery against
    // this write on the control thread).
    std::lock_guard rx(c->rx_lock);
    c->peer = peer;
    c->peer_id = m.conn_id;
    c->peer_gen = m.gen;
    c->credits.store(m.window, std::memory_order_relaxed);
    c->peer_ring_addr = cross ? 0 : m.ring_addr;
    c->peer_ring_key = cross ? 0 : m.ring_key;
    c->peer_ring_cap = m.window;
}

// The initiator's last word: from this datagram on, both ends are direct.
// SEQPACKET delivery is atomic: once sendmsg returns, the message is in the
// responder's queue, and a responder that gave up first (shut its socket
// down) makes it fail with EPIPE.
bool send_commit(int fd, pid_t self) noexcept {
    CtlMsg m{};
    m.magic = kCtlMagic;
    m.version = kCtlVersion;
    m.type = std::uint16_t(CtlType::commit);
    m.pid = self;
    for (int tries = 0; tries < 100; ++tries) {
        ssize_t n = send_ctl(fd, m, nullptr, 0);
        if (n == sizeof m) return true;
        if (n >= 0 || (errno != EINTR && errno != EAGAIN)) return false;
    }
    return false;
}

}  // namespace

void Engine::set_final(Conn *c, Reason r) noexcept {
    c->move_to(ConnState::final);
    c->stat->reason.store(std::uint32_t(r), std::memory_order_relaxed);
    c->verdict_due.store(false, std::memory_order_relaxed);
    SD_LOG_CONN(info, *c->stat, "stays on TCP: %s", reason_name(r));
    mark_kernel(c, r);
    std::lock_guard lock(c->rx_lock);
    c->wake_locked();
}

int Engine::make_ring(Conn *c, bool offer) noexcept {
    // Under rx_lock, which every delivery takes: the first one (sent by a
    // peer that learnt of the ring through the control socket) then sees
    // the ring in the memory model too, not only in time.
    std::lock_guard rx(c->rx_lock);
    if (c->ring) return 0;
    c->ring = ring_alloc(c->window);
    c->stage = static_cast<char *>(std::malloc(chunk_));
    if (!c->ring || !c->stage) return -ENOMEM;
    c->ring_cap = c->window;
    // A ring never offered (a peer through the queues) is not registered
    // either: nothing of it is named to the provider, whose region other
    // processes of our uid may write to.
    if (!offer) return 0;
    Guard guard;
    InProvider in;
    int rc = !in.ok() ? -FI_ECANCELED
                      : fi_mr_reg(ep_.domain, c->ring, c->window, FI_REMOTE_WRITE, 0, next_key_++,
                                  0, &c->ring_mr, nullptr);
    if (rc) {
        SD_LOG(info, "ring registration failed: %s", fabric_strerror(rc));
        c->ring_mr = nullptr;  // the peer then sends everything inline
    }
    return 0;
}

// Crossed requests cost a round trip for nothing (the accepting side's
// wins), and on a host with a free CPU both ends of a new connection
// publish and look at once. The connecting side, having found the
// acceptor's entry `e`, stays quiet when the acceptor's lookup, which
// always follows its own publish, is sure to find our entry whole:
//  * it began writing its entry after ours was whole (e.written_ns), or
//  * its process page (mapped already: the peer is attached, cached or in
//    use) shows it has not begun its lookup yet, or began it after ours
//    was whole. The acceptor stores its stamp, then fences, then looks;
//    we wrote our entry, then fence, then read the stamp: if we miss the
//    stamp, its lookup sees our entry (the two cannot both miss).
// Both ends read CLOCK_MONOTONIC; ends in different time namespaces could
// misjudge it, and the connection would then stay on TCP.
void Engine::ask_later(Conn *c) noexcept {
    // 1, 2, 4 ... ms, at most kAskStepMaxMs apart: a peer that publishes
    // soon after us (its engine still building) is found within a few
    // ms of it, one that never does costs a look a second at most.
    const std::uint32_t step = std::clamp<std::uint32_t>(
        c->ask_step_ms.load(std::memory_order_relaxed) * 2, 1, kAskStepMaxMs);
    c->ask_step_ms.store(step, std::memory_order_relaxed);
    c->ask_again_ns.store(monotonic_ns() + std::uint64_t(step) * 1000000,
                          std::memory_order_release);
}

void Engine::ask_again(Conn *c) noexcept {
    if (!c->ask_again_ns.exchange(0, std::memory_order_acq_rel)) return;  // another call's
    // Upgraded meanwhile (the peer found us after all), on TCP for good,
    // or its wait for the peer over: nothing more to ask.
    if (c->state.load(std::memory_order_acquire) != ConnState::kernel ||
        c->upgrades_barred.load(std::memory_order_acquire) ||
        (settings().peer_wait_ms && !c->awaiting_peer.load(std::memory_order_relaxed)))
        return;
    try_initiate(c);
}

bool Engine::acceptor_will_ask(const Conn *c, const Entry &e) noexcept {
    const std::uint64_t ours = c->published_ns.load(std::memory_order_acquire);
    if (!ours) return false;
    if (e.written_ns > ours) return true;
    if (e.conn_id >= kSlots) return false;
    std::lock_guard lock(conn_lock_);
    for (std::uint32_t i = 0; i < npeers_; ++i) {
        const Peer &p = peers_[i];
        if (!p.page || p.pid != e.pid || p.ended || p.addr == FI_ADDR_UNSPEC ||
            std::strncmp(p.name, e.addr, sizeof p.name) != 0)
            continue;
        std::atomic_thread_fence(std::memory_order_seq_cst);
        ConnStat buf;
        const ConnStat *s = peer_slot(&p, e.conn_id, &buf);
        if (!s) return false;
        const std::uint64_t stamp = s->lookup_ns.load(std::memory_order_relaxed);
        return stamp == 0 || stamp > ours;
    }
    return false;
}

// The upgrade is a commit protocol over the control socket, so that it is
// all or nothing: request (initiator) → accept (responder, which then waits)
// → commit (initiator). Neither side sends a byte on the fabric before the
// commit: the initiator turns direct once its commit is in the responder's
// queue, the responder once it reads it. Whatever fails before (a timeout,
// a process stopped at any step, an fd limit, a refusal) leaves both ends
// on TCP: the responder that sees the socket close, or its own deadline
// pass, shuts the socket down and then takes only a commit already queued.
void Engine::try_initiate(Conn *c) noexcept {
    if (c->upgrades_barred.load(std::memory_order_acquire)) return;
    if (c->acceptor) {
        // Before the lookup, and seen before it (see acceptor_will_ask).
        c->stat->lookup_ns.store(monotonic_ns(), std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_seq_cst);
    }
    char path[400];
    entry_path(path, sizeof path, reversed(c->tuple));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    // A peer of another uid publishes in its own registry (the connection
    // is then between users: far_dir says where its process lives).
    unsigned far_uid = unsigned(getuid());
    char far_dir[64] = {};
    if (fd < 0 && errno == ENOENT && cross_user_on()) {
        fd = open_foreign_entry(std::strrchr(path, '/') + 1, reversed(c->tuple), &far_uid, far_dir,
                                sizeof far_dir);
        if (fd < 0) errno = -fd;
    }
    if (fd < 0) {
        // No fd to look with (RLIMIT_NOFILE): whether the peer published
        // cannot be known now, and an upgrade would need more fds. Said
        // once; a later attempt may still go. Otherwise the peer has not
        // published (yet): it may find us, unless we changed ids afresh
        // (the kernel may name our socket's old uid, in whose registry
        // the peer looks for us in vain): then we look again later.
        std::uint32_t expect = std::uint32_t(Reason::no_peer);
        if ((errno == EMFILE || errno == ENFILE) &&
            c->stat->reason.compare_exchange_strong(expect, std::uint32_t(Reason::fd_limit)))
            SD_LOG_CONN(info, *c->stat, "on TCP for now: fd_limit (no fd to look up the peer's "
                                        "registry entry with)");
        else if (errno == ENOENT && ids_renewed())
            ask_later(c);
        return;
    }
    Entry e{};
    bool ok = sys.read(fd, &e, sizeof e) == sizeof e && entry_valid(e);
    sys.close(fd);
    if (!ok || e.kernel_why) return;  // that end will not upgrade: judge() reports it
    e.addr[sizeof e.addr - 1] = '\0';
    // A pair of one uid where either end is not dumpable goes through the
    // queues as a pair of two uids does, under the same restrictions: the
    // one that is not must expose nothing of its memory to other processes
    // of its uid (no shm region, no ring, no process_vm_*). Our own
    // registry then serves as `far_dir`.
    const bool foreign = far_dir[0] != '\0';
    if (!foreign && (!dumpable() || e.queues))
        std::snprintf(far_dir, sizeof far_dir, "%s", settings().registry);
    // `cross` (untrusted: restricted as across users) may still turn true
    // below, when the answer says the responder is not dumpable; `queued`
    // says whether our queue goes with the request, which decides the path
    // for both ends. SDIRECT_QUEUES=all queues trusted pairs too.
    bool cross = far_dir[0] != '\0';
    const bool queued = cross || settings().queues_all;
    // A process that changed its ids afresh may hold sockets its old uid
    // made: the kernel names that uid as their owner, where the acceptor
    // looks for our entry in vain, so we ask ourselves.
    if (!c->acceptor && e.acceptor && !ids_renewed() && acceptor_will_ask(c, e)) return;
    if (e.pid != pid_ && kill(e.pid, 0) != 0 && errno == ESRCH) {
        if (!foreign) unlink(path);  // stale: its process is gone
        return;
    }
    if (e.pid == pid_ && !settings().same_process) {
        std::lock_guard lock(conn_lock_);
        set_final(c, Reason::same_process);
        if (Conn *other = find_tuple(reversed(c->tuple))) set_final(other, Reason::same_process);
        return;
    }
    if (!fabric_usable()) {
        std::lock_guard lock(conn_lock_);
        set_final(c, Reason::fabric_error);
        return;
    }
    if (!c->move(ConnState::kernel, ConnState::initiating)) return;

    Reason why = Reason::none;
    Peer *peer = nullptr;
    // Whether we already hold the peer's doorbell: it is set under
    // conn_lock_ (by another connection's handshake too), so read there.
    bool have_bell = false;
    // Across users: the link whose queue we read (xqlink.cpp), passed
    // with the request; a reference of ours until the peer holds it.
    int xl = -1;
    {
        std::lock_guard lock(conn_lock_);
        if (make_ring(c, !cross) != 0) why = Reason::fabric_error;
        else if (!queued) peer = attach_peer(e.pid, e.addr, -1, &why);
        // Across users the peer opens its page to us only once we proved
        // we hold the connection (the request): we attach after its
        // answer, and open ours to its uid now, for its attach. That uid
        // is the one the kernel says holds the other end (the entry was
        // looked for in its registry alone): an entry a third user
        // planted for someone else's connection is never even read.
        else if (open_to_uid(far_uid) != 0)
            why = Reason::other_user;
        else if ((xl = link_for(e.pid, e.addr)) < 0)
            why = xl == -EPROTO ? Reason::proof_failed : Reason::fabric_error;
        have_bell = peer && peer->doorbell >= 0;
    }
    CtlMsg reply{};
    int their_doorbell = -1;
    int s = -1;
    int their_proof = -1;
    int their_queue = -1;
    if (peer || (queued && why == Reason::none)) {
        char cpath[108];
        ctl_path(cpath, sizeof cpath, e.pid, far_dir[0] ? far_dir : nullptr);
        s = sys.socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        const bool no_fd = s < 0 && (errno == EMFILE || errno == ENFILE);
        sockaddr_un sa{};
        sa.sun_family = AF_UNIX;
        std::memcpy(sa.sun_path, cpath, sizeof cpath);
        const std::uint32_t ms = settings().upgrade_timeout_ms;
        const std::uint64_t deadline = monotonic_ns() + std::uint64_t(ms) * 1000000;
        timeval tv{time_t(ms / 1000), suseconds_t((ms % 1000) * 1000)};
        why = no_fd ? Reason::fd_limit : Reason::timeout;
        if (s >= 0) sys.setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        int rc = -1;
        if (s >= 0)
            do rc = sys.connect(s, reinterpret_cast<sockaddr *>(&sa), sizeof sa);
            while (rc != 0 && errno == EINTR && monotonic_ns() < deadline);
        unsigned cred_uid = 0;
        if (rc == 0) {
            if (!peer_cred_ok(s, e.pid, &cred_uid) || cred_uid != far_uid) {
                why = Reason::other_user;
            } else {
                CtlMsg req{};
                req.magic = kCtlMagic;
                req.version = kCtlVersion;
                req.type = std::uint16_t(CtlType::request);
                req.pid = pid_;
                req.conn_id = c->id;
                req.gen = c->gen;
                req.window = c->window;
                req.dumpable = std::uint32_t(dumpable());
                req.status = have_bell ? kHaveBell : 0;
                req.tuple = c->tuple;
                std::snprintf(req.addr, sizeof req.addr, "%s", ep_.name);
                // Across users no ring is offered, nor used: crossuser.hpp.
                const bool ring = c->ring_mr && !cross;
                req.ring_addr = ring ? std::uint64_t(std::uintptr_t(c->ring)) : 0;
                req.ring_key = ring ? fi_mr_key(c->ring_mr) : 0;
                int app_fd = queued ? proof_dup(c->stat->fd, c->tuple) : c->stat->fd;
                // With a queue, the link's bell too: the peer rings that one
                // instead of the doorbell if the pair is restricted.
                int fds[4] = {app_fd, doorbell_, queued ? links_[xl].in_fd : -1,
                              queued ? links_[xl].bell_tx : -1};
                ssize_t sent = -1;
                if (app_fd >= 0) do sent = send_ctl(s, req, fds, queued ? 4 : 2);
                    while (sent < 0 && errno == EINTR && monotonic_ns() < deadline);
                if (queued && app_fd >= 0) sys.close(app_fd);
                if (sent == sizeof req) {
                    // Across users the answer also carries the peer's own
                    // socket (its proof that it holds the other end) and
                    // its queue for our messages.
                    int got_fds[3] = {-1, -1, -1};
                    int got = recv_ctl_until(s, reply, got_fds, queued ? 3 : 1, deadline);
                    their_doorbell = got_fds[0];
                    their_proof = got_fds[1];
                    their_queue = got_fds[2];
                    if (got == 0 && reply.type == std::uint16_t(CtlType::reply) &&
                        reply.conn_id >= kSlots)
                        why = Reason::peer_refused;  // its slot indexes its page: out of it
                    else if (got == 0 && reply.type == std::uint16_t(CtlType::reply))
                        why = reply.status == kConflict ? Reason::count_ : Reason(reply.status);
                    else if (got == -EMFILE || got == -ENFILE || got == -EPROTO)
                        why = Reason::fd_limit;  // the answer's doorbell found no fd here
                }
            }
        }
    }
    // The responder not dumpable: it restricts the pair as across users
    // (answer_upgrade), and so do we.
    if (queued && why == Reason::none && reply.pid == e.pid && !reply.dumpable) cross = true;
    if (queued && why == Reason::none && reply.pid == e.pid) {
        Tuple proven;
        if (their_proof < 0 || tuple_of(their_proof, proven) != 0 ||
            !(proven == reversed(c->tuple)) || their_doorbell < 0 ||
            !(cross ? is_bell_socket(their_doorbell) : is_eventfd(their_doorbell))) {
            SD_LOG(info, "upgrade answer from pid %d (uid %u) without valid proof", int(e.pid),
                   far_uid);
            why = Reason::proof_failed;
        } else {
            std::lock_guard lock(conn_lock_);
            if (link_set_out(xl, std::exchange(their_queue, -1)) != 0) {
                SD_LOG(info, "upgrade answer from pid %d (uid %u): its queue is not a sealed "
                             "memfd of the expected size", int(e.pid), far_uid);
                why = Reason::proof_failed;
            } else {
                peer = attach_peer(e.pid, e.addr, their_doorbell, &why,
                                   cross ? (far_dir[0] ? far_dir : settings().registry) : nullptr,
                                   xl);
                their_doorbell = -1;  // kept by attach_peer, or closed
                xl = -1;              // the peer's now, or dropped
            }
        }
    }
    if (their_queue >= 0) sys.close(their_queue);
    if (their_proof >= 0) sys.close(their_proof);
    const bool accepted = why == Reason::none && reply.pid == e.pid &&
                          (their_doorbell >= 0 || have_bell || (queued && peer));

    std::lock_guard lock(conn_lock_);
    link_put(xl);  // the request's, if no peer took it
    // The answer's doorbell is kept even when we yield (conflict): the
    // crossing request that wins may have found the peer already attached.
    if (peer && reply.pid == e.pid && their_doorbell >= 0 && peer->doorbell < 0) {
        peer->doorbell = their_doorbell;
        their_doorbell = -1;
    }
    if (their_doorbell >= 0) sys.close(their_doorbell);
    if (accepted) {
        // Everything the fabric needs is in place before the commit: the
        // responder may send the moment it reads it.
        release_peer(c->peer);  // the one before a leave (rearmed), if any
        set_peer_locked(c, peer, reply, cross);
        c->stat->peer_pid = e.pid;
        // Sent before anything here says direct: should it fail, the
        // responder has given up too, and nothing went on the fabric. A
        // process that changed its privileges meanwhile commits nothing:
        // its connections stay on the kernel (the responder, without our
        // commit, gives up); nor does a connection that a refusal for good
        // made final meanwhile (a request of the peer's that we answered,
        // under this lock): no move from final to direct.
        if (!retired() && !c->upgrades_barred.load(std::memory_order_acquire) &&
            c->state.load(std::memory_order_acquire) == ConnState::initiating &&
            send_commit(s, pid_)) {
            sys.close(s);
            go_direct(c);
            SD_LOG_CONN(info, *c->stat, "upgraded to direct (initiator, peer pid %d)", e.pid);
            announce_switch(c);
            return;
        }
        {
            std::lock_guard rx(c->rx_lock);
            c->peer = nullptr;
        }
        why = retired() ? Reason::privilege
              : c->upgrades_barred.load(std::memory_order_acquire) ? Reason(c->barred_why.load())
                                                                   : Reason::timeout;
    }
    if (s >= 0) sys.close(s);
    release_peer(peer);
    if (why == Reason::count_) {
        // Crossed requests: the accepting side's request wins; ours yields.
        // The state may already be the winner's (committing, direct).
        c->move(ConnState::initiating, ConnState::kernel);
        return;
    }
    if (why == Reason::none) why = Reason::peer_refused;
    // Only our own attempt ends here: a crossing request we answered owns
    // the state from committing on.
    if (!c->move(ConnState::initiating, ConnState::final)) return;
    set_final(c, why);  // logs it
}

void Engine::go_direct(Conn *c) noexcept {
    {
        // Direct: no reason to be elsewhere, unless the peer's leave came
        // already (its reason is the connection's then). Cleared before
        // the state says direct: a leave delivered after that move finds
        // none there and puts its own (on_leave); one delivered before it
        // finds us committing and puts its own too.
        std::lock_guard rx(c->rx_lock);
        if (c->peer_end == kNoOffset)
            c->stat->reason.store(std::uint32_t(Reason::none), std::memory_order_relaxed);
    }
    c->stat->mode.store(std::uint32_t(Mode::direct), std::memory_order_relaxed);
    c->stat->upgrades.fetch_add(1, std::memory_order_relaxed);
    c->awaiting_peer.store(false, std::memory_order_relaxed);  // nor after a rearm
    c->move_to(ConnState::direct);
    unpublish(c);
    std::lock_guard rx(c->rx_lock);
    // The peer's leave came before we went direct: the initiator may send
    // the moment it has committed, before the responder reads the commit,
    // and a leave too (a fork child that claims the socket right after the
    // upgrade: sshd's pre-auth child; a server that hands the socket to an
    // exec'd program). on_leave did all but the move to leaving, which it
    // cannot make from committing; made here, as it would have been, so
    // that our answer goes before any byte of ours.
    if (c->peer_end != kNoOffset && c->move(ConnState::direct, ConnState::leaving)) {
        SD_LOG(debug, "fd %d: the peer's leave came before its commit was read: leaving at once",
               c->stat->fd);
        want_flush(c);
        c->settle_left_locked();
    }
    c->wake_locked();
}

// The responder, on the control thread: the other half of the commit
// protocol above try_initiate.
void Engine::answer_upgrade(int fd, CtlMsg &req, int proof, int bell, int queue,
                            int xbell) noexcept {
    CtlMsg rep{};
    rep.magic = kCtlMagic;
    rep.version = kCtlVersion;
    rep.type = std::uint16_t(CtlType::reply);
    rep.pid = pid_;
    const bool we_dump = dumpable();
    rep.dumpable = std::uint32_t(we_dump);
    int my_proof = -1;  // across users: our own socket, proof for the initiator
    int my_queue = -1;  // across users: ours, for the initiator's messages
    int my_bell = -1;   // a restricted pair: our link's bell, rung instead of the doorbell
    auto refuse = [&](std::uint32_t status) {
        rep.status = status;
        if (proof >= 0) sys.close(proof);
        if (bell >= 0) sys.close(bell);
        if (queue >= 0) sys.close(queue);
        if (xbell >= 0) sys.close(xbell);
        if (my_proof >= 0) sys.close(my_proof);
        if (my_queue >= 0) sys.close(my_queue);
        if (my_bell >= 0) sys.close(my_bell);
        send_ctl(fd, rep, nullptr, 0, MSG_DONTWAIT);
    };
    if (req.type != std::uint16_t(CtlType::request) || proof < 0 || bell < 0 || !fabric_usable() ||
        retired() || req.conn_id >= kSlots)
        return refuse(std::uint32_t(Reason::peer_refused));
    unsigned uid = 0;
    if (!peer_cred_ok(fd, req.pid, &uid)) return refuse(std::uint32_t(Reason::other_user));
    req.addr[sizeof req.addr - 1] = '\0';
    // Another uid (SDIRECT_CROSS_USER): its page and control socket are in
    // its own registry, and its doorbell must be what it claims. A request
    // of our uid that carries a queue comes from a pair where one end is
    // not dumpable: the same path, our registry.
    const bool foreign = uid != unsigned(getuid());
    const bool queued = foreign || queue >= 0;
    const bool cross = foreign || (queued && (!we_dump || !req.dumpable));
    char far_dir[64] = {};
    if (foreign && registry_of_uid(uid, far_dir, sizeof far_dir) != 0)
        return refuse(std::uint32_t(Reason::other_user));
    if (!foreign) std::snprintf(far_dir, sizeof far_dir, "%s", settings().registry);
    // A restricted pair rings by the link's bell (a socket of the pair's
    // own), any other by the doorbell (an eventfd).
    if (queued && cross) {
        if (bell >= 0) sys.close(bell);
        bell = std::exchange(xbell, -1);
    } else if (xbell >= 0) {
        sys.close(std::exchange(xbell, -1));
    }
    if (queued && !(cross ? is_bell_socket(bell) : is_eventfd(bell)))
        return refuse(std::uint32_t(Reason::other_user));

    Conn *c = nullptr;
    std::uint32_t id = 0, gen = 0;
    {
        std::lock_guard lock(conn_lock_);
        c = find_tuple(reversed(req.tuple));
        if (!c) return refuse(std::uint32_t(Reason::no_peer));
        Tuple proven;
        if (tuple_of(proof, proven) != 0 || !(proven == req.tuple)) {
            SD_LOG(info, "upgrade request from pid %d without valid proof", int(req.pid));
            return refuse(std::uint32_t(Reason::proof_failed));
        }
        // Either end not dumpable and no queue offered: the initiator read
        // an entry of ours written while we were dumpable (a change since,
        // prctl or set*id), or was itself dumpable then. The next
        // connection goes through the queues; this one stays on TCP.
        // These two refusals are for good: the connection stays on TCP,
        // unless it is direct already (a stale request), or past that.
        const bool waiting = c->upgrading();
        if (!queued && (!we_dump || !req.dumpable)) {
            if (waiting) set_final(c, Reason::not_dumpable);
            return refuse(std::uint32_t(Reason::not_dumpable));
        }
        if (req.pid == pid_ && !settings().same_process) {
            if (waiting) set_final(c, Reason::same_process);
            return refuse(std::uint32_t(Reason::same_process));
        }
        // Proven to hold the other end: only now is anything of ours opened
        // to its uid, and our answer proves the same to it.
        if (queued && (open_to_uid(uid) != 0 || (my_proof = proof_dup(c->stat->fd, c->tuple)) < 0))
            return refuse(std::uint32_t(Reason::other_user));
        ConnState st = c->state.load();
        if (c->upgrades_barred.load(std::memory_order_acquire) ||
            !(st == ConnState::kernel || (st == ConnState::initiating && !c->acceptor)))
            return refuse(kConflict);
        // Across users: the link to the initiator, its queue checked
        // before anything of it is mapped (it must not be able to shrink
        // it under us), ours passed back.
        int xl = -1;
        if (queued) {
            xl = link_for(req.pid, req.addr);
            if (xl < 0)
                return refuse(std::uint32_t(xl == -EPROTO ? Reason::proof_failed
                                                          : Reason::fabric_error));
            if (link_set_out(xl, std::exchange(queue, -1)) != 0 ||
                (my_queue = sys.fcntl(links_[xl].in_fd, F_DUPFD_CLOEXEC, 0)) < 0 ||
                (cross && (my_bell = sys.fcntl(links_[xl].bell_tx, F_DUPFD_CLOEXEC, 0)) < 0)) {
                SD_LOG(info, "upgrade request from pid %d (uid %u): its queue is not a sealed "
                             "memfd of the expected size", int(req.pid), uid);
                link_put(xl);
                return refuse(std::uint32_t(Reason::proof_failed));
            }
        }
        Reason why = Reason::none;
        Peer *peer = nullptr;
        if (make_ring(c, !cross) == 0)
            peer = attach_peer(req.pid, req.addr, bell, &why, cross ? far_dir : nullptr, xl);
        else sys.close(bell), link_put(xl);
        bell = -1;  // kept by attach_peer, or closed
        if (!peer) {
            if (why == Reason::none) why = Reason::fabric_error;
            set_final(c, why);
            return refuse(std::uint32_t(why));
        }
        // Our own request, if one is in flight, yields to this one (the
        // peer answers it with a conflict) and leaves the state alone.
        c->move_to(ConnState::committing);
        // Everything the fabric needs is in place before we answer: the
        // initiator may send the moment it has committed, before we read
        // its commit, and our receives take what arrives.
        release_peer(c->peer);  // the one before a leave (rearmed), if any
        set_peer_locked(c, peer, req, cross);
        c->stat->peer_pid = req.pid;
        id = c->id;
        gen = c->gen;
        const bool ring = c->ring_mr && !cross;
        rep.ring_addr = ring ? std::uint64_t(std::uintptr_t(c->ring)) : 0;
        rep.ring_key = ring ? fi_mr_key(c->ring_mr) : 0;
        rep.conn_id = c->id;
        rep.gen = c->gen;
        rep.window = c->window;
    }
    rep.status = std::uint32_t(Reason::none);
    if (proof >= 0) sys.close(proof);
    bool committed = false;
    if (queue >= 0) sys.close(queue);  // not taken: refused before the link
    const int answer_fds[3] = {my_bell >= 0 ? my_bell : doorbell_, my_proof, my_queue};
    const int nanswer = queued ? 3 : (req.status & kHaveBell) ? 0 : 1;
    const ssize_t answered = send_ctl(fd, rep, answer_fds, nanswer, MSG_DONTWAIT);
    if (my_proof >= 0) sys.close(my_proof);
    if (my_queue >= 0) sys.close(my_queue);
    if (my_bell >= 0) sys.close(my_bell);
    if (answered == sizeof rep) {
        if (const std::uint32_t us = settings().commit_pause_us) pause_us(us);
        const std::uint64_t deadline =
            monotonic_ns() + std::uint64_t(settings().upgrade_timeout_ms) * 1000000;
        CtlMsg word{};
        int none = -1;
        int rc = recv_ctl_until(fd, word, &none, 0, deadline);
        if (rc == -ETIMEDOUT) {
            // Give up, atomically against the initiator's commit: after the
            // shutdown its send fails, so a commit is either queued now or
            // never sent.
            sys.shutdown(fd, SHUT_RDWR);
            rc = recv_ctl(fd, word, &none, 0);
        }
        committed = rc == 0 && word.type == std::uint16_t(CtlType::commit) && word.pid == req.pid;
    }

    std::lock_guard lock(conn_lock_);
    // The connection may have been closed meanwhile (the slot then holds
    // another generation, or nothing), and its close dropped the peer.
    Conn *now = conns_[id].load(std::memory_order_acquire);
    if (now != c || c->gen != gen || c->state.load() != ConnState::committing) return;
    if (!committed) {
        release_peer(c->peer);
        {
            std::lock_guard rx(c->rx_lock);
            c->peer = nullptr;
        }
        SD_LOG(debug, "fd %d: peer pid %d did not commit its upgrade", c->stat->fd,
               int(req.pid));
        set_final(c, Reason::timeout);  // logs it
        return;
    }
    go_direct(c);
    SD_LOG_CONN(info, *c->stat, "upgraded to direct (responder, peer pid %d)", int(req.pid));
    if (retired() || c->upgrades_barred.load(std::memory_order_acquire)) {
        // This process changed its privileges, or execs, or forked, while
        // the commit was on its way (bar_upgrades' wait for an upgrade
        // under way is bounded): the initiator is direct already, so the connection
        // leaves at once, for good, as it would have had it been direct.
        const Reason why = retired() ? Reason::privilege : Reason(c->barred_why.load());
        if (const int rc = leave_locked(c, why); rc < 0)
            SD_LOG(error, "fd %d: upgraded after a change of privileges, and it could not leave "
                          "the fabric: %s", c->stat->fd, std::strerror(-rc));
        return;
    }
    announce_switch(c);
}

}  // namespace sd::transport
