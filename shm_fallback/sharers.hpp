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
// In the child: take the place the parent (pid `parent`) reserved.
void sharers_born(Sharers *sh, int parent) noexcept;
// This process holds it no more (its last fd closed). The slot is free
// once nobody holds it.
void sharers_leave(Sharers *sh) noexcept;

// Nobody but this process holds it: every other holder left or is dead
// (checked at most once per `recheck_ns` window through *next_check, since
// looking costs syscalls). A place reserved for a child never born (a
// failed fork) counts as a holder: the socket stays on TCP.
bool sharers_alone(Sharers *sh, std::uint64_t *next_check) noexcept;

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
// offsets to the counts and marks them (transport::Conn::holder_counts
// takes these four consecutive counters: sent, received, left, blind).
// From then on the holders count as for a socket shared before its
// upgrade. `blind` set: a holder cannot read what the owner would spill
// into the fork tree's memory (sharers_blind), so the owner spills
// nothing.
std::atomic<std::uint64_t> *sharers_counts(Sharers *sh) noexcept;
bool sharers_left(const Sharers *sh) noexcept;

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
