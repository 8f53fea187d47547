// Which protocol a send's bytes go by, decided here and only
// here:
//   buffered  copied inline into messages (the receiver copies them out of
//             its receive buffer: two copies, no round trip)
//   ring      written straight into the peer's receive ring with one RMA
//             write, then announced (two copies, fewer messages)
//   zcopy     read zero-copy: the buffer is advertised and the receiver
//             reads it straight into its own (one copy; the send waits)
// (Write zero-copy is the receiver's choice: sink.cpp.)
//
// SDIRECT_PROTOCOLS says how:
//   thresholds  by size: SDIRECT_RMA_MIN and SDIRECT_ZCOPY_MIN (default);
//               and with SDIRECT_STREAM_RING, not read zero-copy for a
//               stream's sends that the peer's ring holds four of
//               (stream_takes_ring)
//   auto        per size class, the fastest protocol as measured on this
//               host by sdirect-tune (its table file, SDIRECT_TUNE_FILE);
//               the thresholds where no table was measured
//   buffered, ring, zcopy
//               that protocol wherever it can be used (measurements)
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace sd::transport {

enum class Protocol : std::uint8_t { buffered, ring, zcopy };
enum class Selection : std::uint8_t { thresholds, table, forced };

const char *protocol_name(Protocol p) noexcept;
// "buffered" -> Protocol::buffered; false if not a protocol name.
bool parse_protocol(const char *name, Protocol *out) noexcept;

// Builds the selection from the settings (after load_settings()); reads
// the tune file for `auto`. A missing or unreadable file is one log line
// (info) and the thresholds.
void load_protocols() noexcept;
Selection selection() noexcept;

// A piece of `len` contiguous bytes of a blocking send without timeout
// (the only sends that may wait for their reader): by read zero-copy?
bool use_zcopy(std::size_t len) noexcept;
// `len` bytes (as many as credits allow, `credit`) to go now: written into
// the peer's ring rather than inline?
bool use_ring(std::size_t len, std::int64_t credit) noexcept;
// A blocking send of `len` bytes that follows another large send with
// nothing taken in from the peer meanwhile (a stream), to a peer whose
// ring holds `ring_cap`: through the ring rather than by read zero-copy?
bool stream_by_ring(std::size_t len, std::size_t ring_cap) noexcept;

struct TuneTable;
// Everything the choice depends on: the selection and, from the settings,
// the largest inline message and the thresholds (0: that protocol off).
struct ProtocolPolicy {
    Selection how = Selection::thresholds;
    Protocol forced = Protocol::buffered;  // Selection::forced
    const TuneTable *table = nullptr;      // Selection::table
    std::size_t chunk = 0;                 // SDIRECT_CHUNK
    std::uint32_t rma_min = 0;             // SDIRECT_RMA_MIN
    std::uint32_t zcopy_min = 0;           // SDIRECT_ZCOPY_MIN
    bool stream_ring = false;              // SDIRECT_STREAM_RING
};
// The protocol for the next `len` bytes of a send, `credit` of which the
// window takes now; `zcopy_ok`: they are one contiguous piece of a send
// that may wait for its reader, so read zero-copy may be chosen (it needs
// no credit). Nothing larger than one inline message goes but buffered.
// use_zcopy and use_ring are this, with the policy load_protocols() set.
Protocol choose_protocol(const ProtocolPolicy &p, std::size_t len, std::int64_t credit,
                         bool zcopy_ok) noexcept;
// A stream's send of `len` bytes to a peer whose ring holds `ring_cap`
// goes through the ring (then zcopy_ok is false for it): with the
// thresholds and stream_ring, when the ring holds four such sends. Read
// zero-copy keeps the sender waiting on each piece until its reader has
// copied it; the ring's two copies overlap (ours of this send while the
// reader copies the last one out). A larger send fills the ring, and each
// copy waits for the other anyway. stream_by_ring is this, with the
// policy load_protocols() set.
bool stream_takes_ring(const ProtocolPolicy &p, std::size_t len, std::size_t ring_cap) noexcept;

// The tune file: one line per measured size, "SIZE best=PROTOCOL" followed
// by the measurements ("buffered=MBPS ring=MBPS zcopy=MBPS"); '#' starts
// a comment. A size's class reaches up to the next measured size.
struct TuneTable {
    static constexpr int kMax = 40;
    std::uint64_t size[kMax];
    Protocol best[kMax];
    int n = 0;
};
// Parses the text of a tune file: the number of sizes read, or -1 (with
// `*error` saying which line) if a line is malformed.
int parse_tune(const std::string &text, TuneTable *out, std::string *error);
// The line sdirect-tune writes for `size` (parse_tune reads it back):
// its best protocol, then each protocol's median MB/s, those with
// mbps[p] < 0 (not measured) left out.
std::string format_tune_line(std::uint64_t size, Protocol best, const double (&mbps)[3]);
// The comment line naming the columns, written at the top of the file.
inline constexpr const char *kTuneColumns = "# size best=protocol buffered=MBPS ring=MBPS zcopy=MBPS";
// The table's protocol for `len` bytes (the class of the largest measured
// size not above len; below the first: buffered).
Protocol tune_lookup(const TuneTable &t, std::size_t len) noexcept;

}  // namespace sd::transport
