// Readiness: poll, select and epoll over sockets whose bytes
// may travel on the fabric. A direct connection past its switch points
// answers from our own state (ring bytes, FIN, credits); every other fd,
// and a connection still reading bytes due on the kernel, answers from the
// kernel. Waiting spins for SDIRECT_SPIN_US, then sleeps in the kernel on
// the application's fds, the companions' death hints, the doorbell (one
// watcher per process) and a bell that rings only for the connections and
// epoll sets the wait holds (transport/wait.hpp). A wait none of whose sockets can need our state
// (each is on the kernel and its ask for its upgrade is held back while
// the wait sleeps, or it is on the kernel for good) is the kernel's own
// poll or epoll_wait, plus a wake-up fd (kernel_sleep.hpp).
//
// epoll: the application's epoll fd stays a real kernel epoll fd holding
// every registration. We shadow the registrations of our sockets (not of
// one that needs nothing of ours yet: epoll.cpp's plain ones); once a
// socket answers from our state its kernel registration is trimmed to
// EPOLLRDHUP|EPOLLET with a tagged data word (a hint that the peer's TCP
// socket closed, i.e. the peer may have died), and epoll_wait reports it
// from the shadow: level, EPOLLET (once per arrival), EPOLLONESHOT.
#pragma once
#include <csignal>
#include <ctime>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>

namespace sd::fallback {

// Each returns a count or -errno, like the kernel call (timeouts in ms,
// -1 = forever). `mask` as for ppoll/pselect/epoll_pwait (may be null).
int poll_fds(pollfd *fds, nfds_t n, int timeout_ms, const sigset_t *mask) noexcept;
int select_fds(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, int timeout_ms,
               const sigset_t *mask) noexcept;

// epoll sets, by epoll fd number; epoll_init once at start, after
// table_init.
void epoll_init() noexcept;
void epoll_created(int epfd) noexcept;
int epoll_control(int epfd, int op, int fd, epoll_event *ev) noexcept;
int epoll_wait_fds(int epfd, epoll_event *out, int max, int timeout_ms,
                   const sigset_t *mask) noexcept;
// A socket's plain registrations (Stream::plain) become shadows, and
// the sleeps on their sets are woken to look again; none may be held.
class Stream;
void epoll_unplain(Stream *s) noexcept;
// Its last fd closed: its plain registrations go (the kernel's go with
// the file).
void epoll_plain_closed(Stream *s) noexcept;
// close/dup of an epoll fd.
void epoll_fd_closed(int fd) noexcept;
// `fd` has an epoll set (no reference taken).
bool epoll_fd_known(int fd) noexcept;
void epoll_fd_dup(int fd, int nfd) noexcept;
// After fork, in the child: shadows refer to the parent's connections,
// and the waits asleep in the kernel are the parent's threads'.
void epoll_after_fork_child() noexcept;

// The timeout arguments as milliseconds (rounded up; -1 = forever).
int ms_of(const timespec *ts) noexcept;
int ms_of(const timeval *tv) noexcept;

}  // namespace sd::fallback
