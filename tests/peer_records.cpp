#include "peer_records.hpp"

#include <cerrno>
#include <cstring>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

namespace peer {

namespace {

std::uint64_t record_seed(std::uint64_t seed, std::uint32_t writer, std::uint32_t seq) {
    return mix(seed, (std::uint64_t(writer) << 32) | seq);
}

// Sends all of `len` bytes with MSG_DONTWAIT, sleeping 1 ms whenever the
// socket takes nothing (up to a minute without progress).
void send_all_passive(int fd, const std::uint8_t *buf, std::size_t len) {
    int idle = 0;
    for (std::size_t done = 0; done < len;) {
        ssize_t n = send(fd, buf + done, len - done, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            done += std::size_t(n);
            count_tx(fd, std::uint64_t(n));
            idle = 0;
            continue;
        }
        const bool later = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
        if (!later || ++idle > 60000)
            fail("records_out: send of %zu bytes (MSG_DONTWAIT): %s", len - done,
                 n < 0 ? errno_name(errno) : "0");
        sleep_us(1000);
    }
}

}  // namespace

std::uint64_t checksum(const void *buf, std::size_t len, std::uint64_t sum) {
    // FNV-1a: order-sensitive, so a payload whose pieces were swapped or
    // shifted does not keep its sum.
    const auto *p = static_cast<const std::uint8_t *>(buf);
    for (std::size_t i = 0; i < len; ++i) sum = (sum ^ p[i]) * 0x100000001b3ull;
    return sum;
}

std::uint32_t record_len(std::uint64_t seed, std::uint32_t writer, std::uint32_t seq,
                         std::uint32_t max_len) {
    return 1 + std::uint32_t(mix(seed ^ 0x1e4, (std::uint64_t(writer) << 32) | seq) % max_len);
}

void record_build(std::uint64_t seed, std::uint32_t writer, std::uint32_t seq,
                  std::uint32_t max_len, std::vector<std::uint8_t> *out) {
    RecordHead h;
    h.writer = writer;
    h.seq = seq;
    h.len = record_len(seed, writer, seq, max_len);
    out->resize(sizeof h + h.len);
    pattern_fill(record_seed(seed, writer, seq), 0, out->data() + sizeof h, h.len);
    h.sum = checksum(out->data() + sizeof h, h.len);
    std::memcpy(out->data(), &h, sizeof h);
}

void record_expect(std::uint64_t seed, std::uint32_t writer, std::uint32_t seq,
                   std::uint32_t max_len, const std::uint8_t *rec, std::size_t len,
                   const char *what) {
    RecordHead h;
    if (len < sizeof h) fail("%s: a record of %zu bytes has no room for its head", what, len);
    std::memcpy(&h, rec, sizeof h);
    const std::uint32_t want = record_len(seed, writer, seq, max_len);
    if (h.magic != kRecordMagic || h.writer != writer || h.seq != seq || h.len != want)
        fail("%s: expected record %u of writer %u (%u bytes), found magic 0x%08x writer %u "
             "seq %u len %u",
             what, seq, writer, want, unsigned(h.magic), h.writer, h.seq, h.len);
    if (len != sizeof h + h.len)
        fail("%s: record %u of writer %u: %zu bytes read, it has %zu", what, seq, writer, len,
             sizeof h + h.len);
    if (checksum(rec + sizeof h, h.len) != h.sum)
        fail("%s: record %u of writer %u: payload checksum differs from its head's", what, seq,
             writer);
    pattern_expect(record_seed(seed, writer, seq), 0, rec + sizeof h, h.len, what);
}

void receive_records(int fd, const Cmd &cmd) {
    const auto writers = std::uint32_t(cmd.size);
    const auto each = std::uint32_t(cmd.size2);
    if (writers == 0 || writers > 64 || each == 0 || cmd.chunk == 0)
        fail("records_in: %u writers of %u records up to %u bytes", writers, each, cmd.chunk);
    std::vector<std::uint32_t> next(writers, 0);
    std::vector<std::uint8_t> rec;
    std::uint64_t offset = 0;
    std::uint32_t switches = 0, last = writers;
    for (std::uint64_t i = 0; i < std::uint64_t(writers) * each; ++i) {
        RecordHead h;
        read_all(fd, &h, sizeof h, "record head");
        if (h.magic != kRecordMagic || h.writer >= writers || h.len == 0 || h.len > cmd.chunk)
            fail("record %llu at stream offset %llu: magic 0x%08x writer %u len %u: a record "
                 "was split by another writer's bytes or lost",
                 (unsigned long long)i, (unsigned long long)offset, unsigned(h.magic), h.writer,
                 h.len);
        const std::uint32_t w = h.writer;
        if (h.seq != next[w])
            fail("record %llu at stream offset %llu: writer %u's record %u where %u was next",
                 (unsigned long long)i, (unsigned long long)offset, w, h.seq, next[w]);
        if (next[w] == each)
            fail("writer %u sent more than its %u records", w, each);
        rec.resize(sizeof h + h.len);
        std::memcpy(rec.data(), &h, sizeof h);
        read_all(fd, rec.data() + sizeof h, h.len, "record payload");
        record_expect(cmd.seed, w, h.seq, cmd.chunk, rec.data(), rec.size(), "record received");
        ++next[w];
        offset += rec.size();
        if (w != last && last != writers) ++switches;
        last = w;
    }
    // How often the writers took turns in the stream (for the log: it
    // depends on scheduling, so it is no verdict).
    note("records received=%llu bytes=%llu writer-switches=%u",
         (unsigned long long)writers * each, (unsigned long long)offset, switches);
    write_all(fd, "A", 1);
}

void stream_records(int fd, const Cmd &cmd) {
    const auto total = std::uint32_t(cmd.size);
    const auto turns = std::uint32_t(cmd.size2);
    if (turns == 0 || total == 0 || total % turns != 0 || cmd.chunk == 0)
        fail("records_out: %u records in %u turns, up to %u bytes", total, turns, cmd.chunk);
    const std::uint32_t per_turn = total / turns;
    const bool passive = cmd.flags & kPassiveWriter;
    std::thread sender([&] {
        std::vector<std::uint8_t> rec;
        for (std::uint32_t seq = 0; seq < total; ++seq) {
            record_build(cmd.seed, 0, seq, cmd.chunk, &rec);
            if (passive) send_all_passive(fd, rec.data(), rec.size());
            else write_all(fd, rec.data(), rec.size());
        }
    });
    std::vector<std::uint8_t> rec;
    for (std::uint32_t t = 0; t < turns; ++t) {
        Reply r;
        read_all(fd, &r, sizeof r, "reply");
        std::uint64_t sum = checksum(nullptr, 0);
        for (std::uint32_t seq = t * per_turn; seq < (t + 1) * per_turn; ++seq) {
            record_build(cmd.seed, 0, seq, cmd.chunk, &rec);
            sum = checksum(rec.data() + sizeof(RecordHead), rec.size() - sizeof(RecordHead), sum);
        }
        if (r.magic != kReplyMagic || r.reader != t % 2 || r.turn != t ||
            r.first != t * per_turn || r.count != per_turn || r.sum != sum)
            fail("reply of turn %u: magic 0x%08x reader %u turn %u records %u+%u sum %s; "
                 "expected reader %u, records %u+%u",
                 t, unsigned(r.magic), r.reader, r.turn, r.first, r.count,
                 r.sum == sum ? "right" : "wrong", t % 2, t * per_turn, per_turn);
    }
    sender.join();
    write_all(fd, "A", 1);
}

}  // namespace peer
