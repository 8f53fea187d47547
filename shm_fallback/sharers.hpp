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
// takes these three consecutive counters: sent, received, left). From
// then on the holders count as for a socket shared before its upgrade.
std::atomic<std::uint64_t> *sharers_counts(Sharers *sh) noexcept;
bool sharers_left(const Sharers *sh) noexcept;

}  // namespace sd::fallback
