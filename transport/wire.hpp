// Messages on the fabric. Every message starts with a MsgHeader; the
// receiver demultiplexes by dst_conn (FI_SOURCE is unreliable on shm).
//
//   0  u16 magic    'S''D'            2  u8 version   3  u8 type
//   4  u32 dst_conn (receiver's id)   8  u32 dst_gen (receiver's generation)
//   12 u32 len      (payload bytes that follow the header)
//   16 u64 offset   (stream offset of the first payload byte, or of EOF)
//   24 u32 credits  (bytes the sender consumed from the other direction)
//   28 u32 flags    (type ring: bytes already written into the receiver's ring)
#pragma once
#include <cstddef>
#include <cstdint>

namespace sd::transport {

inline constexpr std::uint16_t kWireMagic = 0x4453;  // "SD"
inline constexpr std::uint8_t kWireVersion = 1;

enum class MsgType : std::uint8_t {
    data = 1,    // payload bytes at `offset`
    credit = 2,  // credits only
    fin = 3,     // no more bytes after `offset` (shutdown SHUT_WR)
    close = 4,   // fin, and the sender no longer reads (close)
    written = 5,  // `flags` bytes at `offset` were RMA-written into the ring
    // Read zero-copy (SDP SrcAvail): the `flags` bytes at `offset` wait in
    // the sender's registered buffer (payload: SrcAvailBody); the receiver
    // reads them straight into its application's buffers.
    src_avail = 6,
    src_done = 7,    // receiver: `flags` bytes of the advert at `offset` were read; it is over
    src_cancel = 8,  // sender: end the advert at `offset` early (answered by src_done)
    // Leaving the fabric: the sender's fabric stream ends at
    // `offset`; its later bytes come through the kernel socket. The side
    // that starts it (flags kLeaveFirst) returns the bytes it received and
    // had not read yet once the answer came, so that the kernel socket,
    // read by every process that holds it, carries them. Bits 8 and up of
    // `flags`: why (a Reason), for the peer's counters.
    leave = 9,
    give_back = 10,  // the receiver's own bytes at `offset`, returned; kGiveBackLast ends them
    // Write zero-copy (SDP SinkAvail): the receiver's recv waits with an
    // empty queue on a buffer of `flags` bytes for the stream bytes from
    // `offset` (payload: SinkAvailBody). The sender writes into it and says
    // how much with sink_done (`flags` bytes at `offset`, payload: the
    // sink's seq), before any later message of its own. Two kinds (the
    // body's key): one host (kSrcNoKey) the sender claims the word in the
    // receiver's page (open to taken) and copies with process_vm_writev,
    // and the receiver cancels one-sidedly (open to cancelled); elsewhere
    // the buffer is registered and written with the provider's RMA, and
    // the receiver cancels with sink_cancel (below) unless a stream
    // message of the sender (is_stream_msg) came first.
    sink_avail = 11,
    sink_done = 12,
    // Read zero-copy: the receiver cannot read unregistered advertised
    // buffers (key kSrcNoKey: the kernel refused process_vm_readv); the
    // sender registers them from now on. Sent before the src_done that
    // ends the advertisement it could not read.
    src_need_key = 13,
    // Receiver: end the registered sink `seq` (payload) at `offset`. The
    // sender answers with sink_done: the bytes it wrote, or 0 for a sink
    // it never writes (the answer to a cancel; the receiver ignores a 0
    // for a sink already over).
    sink_cancel = 14,
};

// The sender's messages that carry its stream (bytes, an advertisement,
// its end): one of them that reaches the receiver after a registered
// sink of the receiver proves the sender will never write that sink (it
// takes a sink only when none of them was sent at or past its offset).
constexpr bool is_stream_msg(MsgType t) noexcept {
    return t == MsgType::data || t == MsgType::written || t == MsgType::src_avail ||
           t == MsgType::fin || t == MsgType::close || t == MsgType::leave;
}

// What a restricted peer (of another uid, or where either end is not
// dumpable: Peer::cross) may send: every byte goes inline, and no
// ring, advertisement or sink is ever offered either way (xqlink.cpp);
// any other type from it breaks its connection.
constexpr bool across_users(MsgType t) noexcept {
    return t == MsgType::data || t == MsgType::credit || t == MsgType::fin ||
           t == MsgType::close || t == MsgType::leave || t == MsgType::give_back;
}

inline constexpr std::uint32_t kLeaveFirst = 1;
inline constexpr std::uint32_t kGiveBackLast = 1;

// Flags of a close message: the closer had bytes of ours unread, which
// TCP answers with a reset (RST) instead of a FIN.
inline constexpr std::uint32_t kCloseReset = 1;

// The key of an advertised buffer that was not registered: on one host
// the receiver reads it with process_vm_readv, which needs none.
inline constexpr std::uint64_t kSrcNoKey = ~0ull;

struct SrcAvailBody {
    std::uint64_t addr;
    std::uint64_t key;
};

// Layout: addr, seq, key (3 x u64) = 24 bytes.
struct SinkAvailBody {
    std::uint64_t addr;  // in the receiver's address space
    std::uint64_t seq;   // its number (> every earlier sink's); the claim word holds it
    std::uint64_t key;   // the registration's key; kSrcNoKey: one host, the claim word
};
static_assert(sizeof(SinkAvailBody) == 24);
static_assert(offsetof(SinkAvailBody, key) == 16);

// Largest sink: what one recv advertises (larger buffers advertise a prefix).
inline constexpr std::uint32_t kMaxSink = 1u << 30;

// The claim word of a sink (ConnStat::sink_word): seq << 2 | state.
inline constexpr std::uint64_t kSinkOpen = 1;
inline constexpr std::uint64_t kSinkTaken = 2;
inline constexpr std::uint64_t kSinkCancelled = 3;

struct MsgHeader {
    std::uint16_t magic;
    std::uint8_t version;
    std::uint8_t type;
    std::uint32_t dst_conn;
    std::uint32_t dst_gen;
    std::uint32_t len;
    std::uint64_t offset;
    std::uint32_t credits;
    std::uint32_t flags;
};
static_assert(sizeof(MsgHeader) == 32);
static_assert(offsetof(MsgHeader, offset) == 16);
static_assert(offsetof(MsgHeader, credits) == 24);

}  // namespace sd::transport
