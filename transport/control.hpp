// The control channel's messages: one SEQPACKET datagram each, on a Unix
// socket per process (<registry>/ctl-<pid>), with the fds it passes.
// Shared by the control thread (control.cpp), the upgrade handshake
// (handshake.cpp) and the leave requests of a socket's other holders
// (handoff.cpp).
#pragma once
#include "conn_impl.hpp"

#include <cstddef>
#include <cstdint>
#include <sys/socket.h>
#include <sys/types.h>

namespace sd::transport {

inline constexpr std::uint32_t kCtlMagic = 0x54434453;  // "SDCT"
// 2: a request with a queue carries the link's bell as a fourth fd.
// 3: the queue's header has the bell's latch (xqueue.hpp), which a peer
// of version 2 would never clear. 4: the queue has its wakers' words
// (36 KiB before its data), and a link bell may carry a thread's bell.
inline constexpr std::uint16_t kCtlVersion = 4;

// request/reply: an upgrade (handshake.cpp). leave: another process that
// holds one of our connections' sockets asks us to move it back to the
// kernel (request_leave); one fd (the socket, as proof);
// the reply's status says whether we did. kick: a peer waits for our
// answer on the fabric (a cancelled advertisement, a leave) while none of
// our threads may be in the library: the control thread progresses once;
// no fd, no reply. commit: the initiator's last word after an accepting
// reply (see try_initiate); no fd, no reply.
enum class CtlType : std::uint16_t { request = 1, reply = 2, leave = 3, kick = 4, commit = 5 };
// A leave's answer that is no Reason: the connection is settling (an
// upgrade under way, or a call of its process holds it); ask again.
inline constexpr std::uint32_t kLeaveAgain = 0xffff;

// Control message, one SEQPACKET datagram. A request carries two fds (the
// initiator's TCP socket as proof, its doorbell); an accepting reply one
// (the receiver's doorbell), unless the request said that the initiator
// holds it already (kHaveBell: the peer is attached, cached or in use).
// Through queues (across users, SDIRECT_QUEUES) a request carries two
// more, the initiator's queue for our messages and its link's bell, and
// the reply three: the bell to ring, the responder's own socket as its
// proof and its queue (xqlink.cpp). A restricted pair (another uid, or
// one end not dumpable) rings the link's bell, a datagram socket of that
// pair alone; any other the doorbell.
struct CtlMsg {
    std::uint32_t magic;
    std::uint16_t version;
    std::uint16_t type;
    std::int32_t pid;
    std::uint32_t conn_id;
    std::uint32_t gen;
    std::uint32_t window;
    std::uint32_t status;    // Reason; none = accepted; kConflict = retry elsewhere
    std::uint32_t dumpable;
    Tuple tuple;             // the sender's view of the connection
    char addr[96];
    std::uint64_t ring_addr; // the sender's receive ring, for RMA writes
    std::uint64_t ring_key;
};
static_assert(sizeof(CtlMsg) == 184);

inline constexpr std::uint32_t kConflict = 0xffff;
inline constexpr std::uint32_t kHaveBell = 1;  // a request's status: no doorbell in the reply

// The control socket of process `pid`; `dir`: the peer's registry if it is
// of another uid.
void ctl_path(char *out, std::size_t n, pid_t pid, const char *dir = nullptr) noexcept;

// A message of `type` from `self`, every other field zero.
CtlMsg reply_to(pid_t self, CtlType type) noexcept;

// One datagram of `len` bytes with up to 4 fds (SCM_RIGHTS), MSG_NOSIGNAL
// and `flags`: sendmsg's result (-1 and errno; EINVAL beyond 4 fds).
ssize_t send_with_fds(int fd, const void *buf, std::size_t len, const int *fds, int nfds,
                      int flags) noexcept;
// The fds a received message carries (SCM_RIGHTS): the first `want` land
// in fds[], every other one is closed. How many landed.
int take_fds(const msghdr &mh, int *fds, int want) noexcept;

// The control thread sends with MSG_DONTWAIT: its answer goes into a
// fresh connection's empty queue, and a blocked send would stall every
// other request.
ssize_t send_ctl(int fd, const CtlMsg &m, const int *fds, int nfds, int flags = 0) noexcept;

// Receives one control message; passed fds land in fds[] (-1 if absent).
// A message that is short, of another version or carries extra fds is
// rejected and its fds are closed.
int recv_ctl(int fd, CtlMsg &m, int *fds, int want, int flags = 0) noexcept;

// Waits for one control message until the deadline. Signals do not end the
// wait (the upgrade runs in whatever thread made the connection's first
// call, and its handlers are the application's); -ETIMEDOUT at the
// deadline, -EPIPE when the other side closed.
int recv_ctl_until(int fd, CtlMsg &m, int *fds, int want, std::uint64_t deadline_ns) noexcept;

// The process at the other end of a control socket is `expect_pid` (0:
// any) and of our uid; with `uid`, of any uid when SDIRECT_CROSS_USER is
// on, which `*uid` then says.
bool peer_cred_ok(int fd, pid_t expect_pid, unsigned *uid = nullptr) noexcept;

}  // namespace sd::transport
