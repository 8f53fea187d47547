// Records: self-checking pieces of a stream that several processes write
// or read at once. Each one carries who wrote it, its place in that
// writer's sequence, its length and a checksum of its payload, so a
// record split by another writer's bytes, lost, repeated or read twice
// shows at once, and says where.
#pragma once
#include "peer_common.hpp"

#include <cstdint>
#include <vector>

namespace peer {

inline constexpr std::uint32_t kRecordMagic = 0x53445245;  // "SDRE"
inline constexpr std::uint32_t kReplyMagic = 0x53445250;   // "SDRP"

// Layout: magic, writer, seq, len (4 x u32), sum (u64) = 24 bytes; then
// len bytes of payload (stream record_seed(seed, writer, seq) from 0).
struct RecordHead {
    std::uint32_t magic = kRecordMagic;
    std::uint32_t writer = 0;
    std::uint32_t seq = 0;
    std::uint32_t len = 0;
    std::uint64_t sum = 0;
};
static_assert(sizeof(RecordHead) == 24);

// A reader's account of one turn: which records it read and the combined
// checksum of their payloads. Layout: magic, reader, turn, first, count,
// pad (6 x u32), sum (u64) = 32 bytes.
struct Reply {
    std::uint32_t magic = kReplyMagic;
    std::uint32_t reader = 0;
    std::uint32_t turn = 0;
    std::uint32_t first = 0;
    std::uint32_t count = 0;
    std::uint32_t pad = 0;
    std::uint64_t sum = 0;
};
static_assert(sizeof(Reply) == 32);

std::uint64_t checksum(const void *buf, std::size_t len, std::uint64_t sum = 0xcbf29ce484222325ull);
// Payload length of record (writer, seq): 1 .. max_len, fixed by the seed.
std::uint32_t record_len(std::uint64_t seed, std::uint32_t writer, std::uint32_t seq,
                         std::uint32_t max_len);
// Head and payload of record (writer, seq) in `out`, ready for one send.
void record_build(std::uint64_t seed, std::uint32_t writer, std::uint32_t seq,
                  std::uint32_t max_len, std::vector<std::uint8_t> *out);
// Checks a received record against the one (writer, seq) must be.
void record_expect(std::uint64_t seed, std::uint32_t writer, std::uint32_t seq,
                   std::uint32_t max_len, const std::uint8_t *rec, std::size_t len,
                   const char *what);

// Responder side. Op::records_in: cmd.size writers each send cmd.size2
// records; checks each one, each writer's order and the total, then acks.
// Op::records_out: streams cmd.size records of writer 0 while it reads
// cmd.size2 replies, one per turn, readers alternating from 0; then acks
// (kPassiveWriter: its writer never waits inside the library).
void receive_records(int fd, const Cmd &cmd);
void stream_records(int fd, const Cmd &cmd);

}  // namespace peer
