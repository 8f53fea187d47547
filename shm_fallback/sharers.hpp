// Sockets shared through fork: which processes hold one, and how
// many stream bytes went each way through its kernel socket, counted by all
// of them. One slot per socket in an anonymous MAP_SHARED arena made at the
// first fork, so every process of the tree sees the same slots. Every field
// is an atomic and no lock spans processes: a holder may die at any
// instruction.
//
// When one holder is left (the others closed their copies, exited or were
// killed), it owns the counts, which are then the connection's stream
// offsets: it upgrades the connection from there like a fresh one.
#pragma once
#include <atomic>
#include <cstdint>

namespace sd::fallback {

struct Sharers;

// A slot for a socket about to be shared, held by this process; `sent` and
// `received` are the bytes that went through the kernel so far. nullptr
// when the arena cannot be made or is full (the socket then stays on TCP).
Sharers *sharers_open(std::uint64_t sent, std::uint64_t received) noexcept;

// fork, before it: a place for the child about to be born.
void sharers_expect_child(Sharers *sh) noexcept;
// In the child: take the place the parent (pid `parent`) reserved;
// `used`: the child uses the socket already (an epoll registration it
// inherited).
void sharers_born(Sharers *sh, int parent, bool used = false) noexcept;
// This process holds it no more (its last fd closed). The slot is free
// once nobody holds it.
void sharers_leave(Sharers *sh) noexcept;

// Nobody but this process holds it: every other holder left or is dead
// (checked at most once per `kRecheckNs` window through *next_check, since
// looking costs syscalls). A place reserved for a child never born (a
// failed fork) counts as a holder: the socket stays on TCP.
bool sharers_alone(Sharers *sh, std::uint64_t *next_check) noexcept;

// Taking over from holders that have not used the socket since their
// last fork (SDIRECT_TAKE_OVER=1). A holder that uses the socket (I/O, a
// readiness wait, an epoll registration) marks its entry first
// (sharers_use), then looks for an owner (sharers_owner): a process that
// took it over while this one was not using it, and which must move the
// connection back to the kernel before this one touches the kernel
// socket. A holder whose other holders are all gone or dead (1 from
// sharers_may_take) takes the counts as the last holder does; one whose
// others are alive but unmarked (2) may take it over: sharers_take sets
// the owner word (pending) and then checks that none of them marked its
// entry meanwhile (false: not taken); the taker then zeroes the counts
// (sharers_reset_counts: its connection's offsets are added again when it
// leaves), attaches and publishes itself (sharers_took). A server whose
// parent keeps an idle copy of each connection its child serves so has
// the connection direct in the child.
void sharers_use(Sharers *sh) noexcept;
// A fork starts the count again: the parent's entry says whether a call
// of its is under way on the socket (or an epoll set of its watches it),
// not what it did before (a server that talked on the connection itself
// forks the child that serves it once it has nothing more to say).
void sharers_unuse(Sharers *sh) noexcept;
int sharers_may_take(Sharers *sh, std::uint64_t *next_check) noexcept;
bool sharers_take(Sharers *sh) noexcept;
void sharers_took(Sharers *sh) noexcept;
void sharers_reset_counts(Sharers *sh) noexcept;
// The pid of another process that took the socket over (`pending`: it is
// still attaching), or 0.
int sharers_owner(Sharers *sh, bool *pending) noexcept;
bool sharers_owner_dead(int pid) noexcept;
// The owner word no longer names `pid` (its connection left, or it gave
// the take-over up).
void sharers_disown(Sharers *sh, int pid) noexcept;

// Half-closed while shared (shutdown): the switch would not know of the
// kernel's FIN, so no holder returns to direct mode any more.
void sharers_stick(Sharers *sh) noexcept;
bool sharers_stuck(const Sharers *sh) noexcept;

// Bytes through the kernel socket, by any holder.
void sharers_count(Sharers *sh, bool out, std::uint64_t n) noexcept;
std::uint64_t sharers_sent(const Sharers *sh) noexcept;
std::uint64_t sharers_received(const Sharers *sh) noexcept;

// A socket that was direct at the fork: its owner's connection, when it
// leaves the fabric because another holder uses it, adds its stream
// offsets to the counts and marks them left (sharers_hand_back: the
// connection's handoff, fork_protocol/share.cpp). From then on the
// holders count as for a socket shared before its upgrade.
void sharers_hand_back(Sharers *sh, std::uint64_t sent, std::uint64_t received) noexcept;
bool sharers_left(const Sharers *sh) noexcept;
// A holder cannot read what the owner would put into the fork tree's
// memory (sharers_blind, below), so the owner puts nothing there.
bool sharers_is_blind(const Sharers *sh) noexcept;

// exec of a holder whose new image runs the library
// (fork_protocol/handover.cpp): the arena is a memfd when it could be
// made, and the new image maps it again from the fd it inherits, so that
// it holds the socket in the same slot (the holder entry is the pid,
// which exec keeps).
// The arena's fd (checked to be ours still) and the slot's index; false
// when the arena is anonymous or its fd is gone.
bool sharers_handle(const Sharers *sh, int *fd, std::uint32_t *index) noexcept;
// The arena's fd stays open across the coming exec (`pass`), or no longer
// (the exec failed).
void sharers_pass_on_exec(bool pass) noexcept;
// In the new image: `fd` is the arena handed over; maps it (false if it is
// not one, or an arena is mapped already).
bool sharers_map_inherited(int fd) noexcept;
// Slot `index` of the mapped arena, if in use.
Sharers *sharers_at(std::uint32_t index) noexcept;
// This process has its holder entry in the slot.
bool sharers_hold(const Sharers *sh) noexcept;
// A holder of the slot will be an exec'd image, which maps the arena but
// not the fork tree's anonymous memory.
void sharers_blind(Sharers *sh) noexcept;
// Holds it again (an exec that would have dropped it failed): its entry
// back, or the slot stuck when there is no room.
void sharers_rejoin(Sharers *sh) noexcept;

}  // namespace sd::fallback
