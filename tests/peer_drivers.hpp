// Driver scenarios: the active end of a connection. Each one leads the
// responder through its commands and checks every result; all of them
// fail() on the first deviation. *fd may be set to -1 when the scenario
// closed the socket itself.
#pragma once
#include "peer_common.hpp"

namespace peer {

using Driver = void (*)(int *fd, const Options &opt);

// `peer upgrade`: the upgrade handshake stopped, interrupted, short of fds
// (peer_upgrade.cpp). A whole run, not a driver.
int run_upgrade(const Options &opt);

// Zero-copy protocols: buffers gone right after send, randomised mix
// (peer_drive_zcopy.cpp).
void drive_zc_buffers(int *fd, const Options &opt);
void drive_zc_torture(int *fd, const Options &opt);
void drive_zc_peer_dies(int *fd, const Options &opt);
void drive_zc_sndtimeo(int *fd, const Options &opt);
void drive_zc_eintr(int *fd, const Options &opt);
void drive_zc_sink_cancel(int *fd, const Options &opt);

// Stream content and receive flags (peer_drive_stream.cpp).
void drive_bulk(int *fd, const Options &opt);
void drive_duplex(int *fd, const Options &opt);
void drive_exchange(int *fd, const Options &opt);
void drive_pingpong(int *fd, const Options &opt);
void drive_peek(int *fd, const Options &opt);
void drive_waitall(int *fd, const Options &opt);
void drive_dontwait(int *fd, const Options &opt);
void drive_send_dontwait(int *fd, const Options &opt);
void drive_fionread(int *fd, const Options &opt);
void drive_nonblock(int *fd, const Options &opt);
void drive_rcvtimeo(int *fd, const Options &opt);
void drive_eintr(int *fd, const Options &opt);

// Connection life and descriptors (peer_drive_conn.cpp).
void drive_shutdown_wr(int *fd, const Options &opt);
void drive_peer_shutdown_wr(int *fd, const Options &opt);
void drive_close_epipe(int *fd, const Options &opt);
void drive_close_sigpipe(int *fd, const Options &opt);
void drive_peer_death(int *fd, const Options &opt);
void drive_killed_unread(int *fd, const Options &opt);
// Sends --size bytes to a peer that echoes them (cat), reads them back,
// then EOF after its own shutdown(SHUT_WR).
void drive_echo_plain(int *fd, const Options &opt);
void drive_exit_while_sending(int *fd, const Options &opt);
void drive_dup(int *fd, const Options &opt);
void drive_sockinfo(int *fd, const Options &opt);
void drive_fork(int *fd, const Options &opt);
void drive_fork_loop(int *fd, const Options &opt);

// A connection shared with forked children and started programs
// (peer_drive_share.cpp).
void drive_fork_share_write(int *fd, const Options &opt);
void drive_fork_share_read(int *fd, const Options &opt);
void drive_fork_peer_busy(int *fd, const Options &opt);
void drive_fork_inflight(int *fd, const Options &opt);
void drive_fork_sharer_killed(int *fd, const Options &opt);
void drive_fork_owner_killed(int *fd, const Options &opt);
void drive_fork_handoff_both(int *fd, const Options &opt);
void drive_fork_then_earn(int *fd, const Options &opt);
void drive_fork_stdio(int *fd, const Options &opt);
void drive_fork_after_answer(int *fd, const Options &opt);
void drive_fork_idle_parent(int *fd, const Options &opt);
void drive_fork_idle_parent_claims(int *fd, const Options &opt);
void drive_spawn_cat(int *fd, const Options &opt);

// Readiness through every waiting call (peer_ready_poll.cpp).
void drive_ready_data(int *fd, const Options &opt);
void drive_ready_window(int *fd, const Options &opt);
void drive_ready_rdhup(int *fd, const Options &opt);
void drive_ready_reset(int *fd, const Options &opt);
void drive_ready_death(int *fd, const Options &opt);
void drive_ready_eintr(int *fd, const Options &opt);
void drive_ready_sigmask(int *fd, const Options &opt);
void drive_ready_mixed(int *fd, const Options &opt);
void drive_ready_reused_fd(int *fd, const Options &opt);

// epoll's own behaviours (peer_ready_epoll.cpp).
void drive_epoll_modes(int *fd, const Options &opt);
void drive_epoll_errors(int *fd, const Options &opt);
void drive_epoll_nested(int *fd, const Options &opt);
void drive_epoll_thread_ctl(int *fd, const Options &opt);
void drive_epoll_close(int *fd, const Options &opt);
// epoll_wait asleep across an upgrade (peer_ready_earn.cpp).
void drive_epoll_earn_sleep(int *fd, const Options &opt);
void drive_epoll_add_direct(int *fd, const Options &opt);
void drive_alone_waits(int *fd, const Options &opt);

// Non-blocking sockets (peer_ready_nonblock.cpp), threads
// (peer_ready_threads.cpp), sendfile and splice (peer_sendfile.cpp).
void drive_nonblock_io(int *fd, const Options &opt);
void drive_thread_recv(int *fd, const Options &opt);
void drive_earn_blocked_reader(int *fd, const Options &opt);
void drive_thread_wake(int *fd, const Options &opt);
void drive_wakeup_loop(int *fd, const Options &opt);
void drive_thread_wake_loop(int *fd, const Options &opt);
void drive_sendfile(int *fd, const Options &opt);
void drive_splice(int *fd, const Options &opt);

// Paths around the socket calls, one per --part (peer_bypass.cpp).
void drive_bypass(int *fd, const Options &opt);
// The process a connection is handed to over a Unix socket (--unix FD):
// it takes the connection over from the driver (mode "fd-helper").
int run_fd_helper(const Options &opt);

// A program started in a child by posix_spawn, system or popen while the
// connection goes on (peer_spawn.cpp); run_spawn_child is that program.
void drive_spawn_child(int *fd, const Options &opt);
int run_spawn_child(const Options &opt);

// Invalid arguments, printed for differential comparison (peer_probe.cpp).
void drive_bad_input(int *fd, const Options &opt);

// TCP's corners (peer_semantics.cpp).
void drive_sem_zero_read(int *fd, const Options &opt);
void drive_sem_trunc(int *fd, const Options &opt);
void drive_sem_errqueue(int *fd, const Options &opt);
void drive_sem_rcvlowat(int *fd, const Options &opt);
void drive_sem_shut_rd(int *fd, const Options &opt);
void drive_sem_linger_reset(int *fd, const Options &opt);
void drive_sem_send_after_close(int *fd, const Options &opt);
void drive_sem_close_in_recv(int *fd, const Options &opt);
void drive_sem_shut_rdwr_reset(int *fd, const Options &opt);
void drive_sem_tcp_info_fin(int *fd, const Options &opt);
void drive_sem_send_to_shut_end(int *fd, const Options &opt);
void drive_sem_disconnect(int *fd, const Options &opt);
void drive_sem_send_after_shut_close(int *fd, const Options &opt);
void drive_sem_cork(int *fd, const Options &opt);
void drive_sem_urgent(int *fd, const Options &opt);

// Helpers shared by the driver files.
std::uint64_t seed_of(const Options &opt, std::uint64_t n);
void send_exit(int fd);
void echo_round(int tx_fd, int rx_fd, std::uint64_t size, std::uint64_t seed);
// Paced ping-pongs (20 rounds of up to 512 bytes, 1 ms apart) for `ms`:
// an exchange that goes on long enough to earn an upgrade. Stream seeds
// from seed_of(opt, first).
void paced_pingpongs(int fd, const Options &opt, std::uint64_t ms, std::uint64_t first);

}  // namespace peer
