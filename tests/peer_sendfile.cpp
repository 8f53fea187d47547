// sendfile, sendfile64 and splice on a connection: the receiver checks
// every byte against the stream pattern, the sender every count and
// offset the calls return.
#include "peer_ready.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

// With a 64-bit off_t the header sends sendfile to sendfile64; programs
// built without it call the sendfile symbol itself, so both are used here.
extern "C" ssize_t sendfile_symbol(int out, int in, long *offset, std::size_t count) noexcept
    __asm__("sendfile");

namespace peer {

namespace {


void expect_count(const char *what, ssize_t n, ssize_t want) {
    if (n != want)
        fail("%s: returned %zd (%s), expected %zd", what, n, n < 0 ? errno_name(errno) : "-", want);
}

void ack_within(int fd, const char *what) {
    Watch watch(10, what);
    expect_ack(fd, what);
}

}  // namespace

void drive_sendfile(int *fd, const Options &opt) {
    const int s = *fd;
    const std::uint64_t size = opt.num("size", (1u << 20) + 7);
    const std::uint64_t seed = seed_of(opt, 1);
    int f = pattern_file(seed, size);
    Cmd cmd;
    cmd.op = Op::recv;
    cmd.api = std::uint32_t(Rx::recv);
    cmd.size = size;
    cmd.seed = seed;
    send_cmd(s, cmd);
    // Every call below sends the bytes that follow the previous call's, so
    // the receiver sees the file once, in order.
    long off = 0;
    expect_count("sendfile(&off 0, 1000)", sendfile_symbol(s, f, &off, 1000), 1000);
    if (off != 1000 || file_position(f) != 0)
        fail("sendfile with an offset: offset %lld, file position %lld; expected 1000 and 0",
             (long long)off, (long long)file_position(f));
    lseek(f, 1000, SEEK_SET);
    expect_count("sendfile(NULL, 5000)", sendfile_symbol(s, f, nullptr, 5000), 5000);
    if (file_position(f) != 6000) fail("sendfile without an offset left the position at %lld, not 6000",
                                  (long long)file_position(f));
    off64_t off64 = 6000;
    expect_count("sendfile64(&off 6000, 100000)", sendfile64(s, f, &off64, 100000), 100000);
    if (off64 != 106000 || file_position(f) != 6000)
        fail("sendfile64: offset %lld, position %lld; expected 106000 and 6000",
             (long long)off64, (long long)file_position(f));
    off = 106000;
    expect_count("sendfile of 0 bytes", sendfile_symbol(s, f, &off, 0), 0);
    lseek(f, 106000, SEEK_SET);
    // Asking for more than is left gives what is left.
    expect_count("sendfile64(NULL, more than is left)", sendfile64(s, f, nullptr, size),
                 ssize_t(size - 106000));
    if (file_position(f) != off_t(size)) fail("position %lld after sending to the end", (long long)file_position(f));
    expect_count("sendfile at the end of the file", sendfile_symbol(s, f, nullptr, 100), 0);
    off = long(size) + 10;
    expect_count("sendfile past the end of the file", sendfile_symbol(s, f, &off, 100), 0);
    ack_within(s, "the receiver's ack after sendfile");
    count_tx(s, size);
    close(f);

    // Non-blocking: a full window cuts a sendfile short, then EAGAIN.
    const std::uint64_t big = opt.num("window-size", 16u << 20);
    const std::uint64_t seed2 = seed_of(opt, 2);
    int g = pattern_file(seed2, big);
    start_fill(s, big, seed2, 400000);
    const int fl = fcntl(s, F_GETFL);
    fcntl(s, F_SETFL, fl | O_NONBLOCK);
    off_t noff = 0;
    int eagains = 0;
    std::uint64_t first = 0;
    const std::uint64_t start = now_ns();
    while (std::uint64_t(noff) < big) {
        if (seconds_since(start) > 20) fail("non-blocking sendfile: not done within 20 s");
        const off_t before = noff;
        const std::size_t want = std::size_t(big - std::uint64_t(noff));
        const std::uint64_t call_t0 = now_ns();
        ssize_t n = sendfile(s, g, &noff, want);
        const int err = errno;
        // The peer reads nothing for 400 ms: a call that lasts that long waited.
        if (seconds_since(call_t0) > 0.25)
            fail("a non-blocking sendfile of %zu bytes at offset %lld blocked for %.3f s "
                 "(returned %zd)", want, (long long)before, seconds_since(call_t0), n);
        errno = err;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (noff != before) fail("sendfile failed with EAGAIN but moved the offset");
            if (eagains++ == 0 && first == 0) fail("non-blocking sendfile: EAGAIN on an empty connection");
            pollfd p{s, POLLOUT, 0};
            if (poll(&p, 1, 5000) != 1) fail("non-blocking sendfile: not writable within 5 s");
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fail("non-blocking sendfile: %zd (%s)", n, n < 0 ? errno_name(errno) : "0");
        if (noff != before + n) fail("sendfile returned %zd but moved the offset by %lld", n,
                                     (long long)(noff - before));
        if (first == 0) {
            first = std::uint64_t(n);
            if (std::size_t(n) >= want)
                fail("non-blocking sendfile of %zu bytes to a peer that does not read sent "
                     "everything", want);
        }
        count_tx(s, std::uint64_t(n));
    }
    if (eagains == 0) fail("non-blocking sendfile never returned EAGAIN");
    note("sendfile nonblocking first=%llu eagains=%d", (unsigned long long)first, eagains);
    fcntl(s, F_SETFL, fl);
    ack_within(s, "the receiver's ack after non-blocking sendfile");
    close(g);
    send_exit(s);
}

namespace {

void splice_in(int s, int p[2], std::uint64_t size, std::uint64_t seed) {
    std::vector<char> buf(65536);
    Cmd cmd;
    cmd.op = Op::recv;
    cmd.api = std::uint32_t(Rx::recv);
    cmd.size = size;
    cmd.seed = seed;
    send_cmd(s, cmd);
    for (std::uint64_t off = 0; off < size;) {
        const std::size_t chunk = std::size_t(std::min<std::uint64_t>(1 + mix(seed, off) % 60000,
                                                                      size - off));
        pattern_fill(seed, off, buf.data(), chunk);
        if (write(p[1], buf.data(), chunk) != ssize_t(chunk)) fail("pipe write: %s", errno_name(errno));
        for (std::size_t moved = 0; moved < chunk;) {
            ssize_t n = splice(p[0], nullptr, s, nullptr, chunk - moved, SPLICE_F_MOVE);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) fail("splice pipe -> socket: %zd (%s)", n, n < 0 ? errno_name(errno) : "0");
            moved += std::size_t(n);
            count_tx(s, std::uint64_t(n));
        }
        off += chunk;
    }
    ack_within(s, "the receiver's ack after splice into the socket");
}

void splice_out(int s, int p[2], std::uint64_t size, std::uint64_t seed) {
    std::vector<char> buf(65536);
    Cmd cmd;
    cmd.op = Op::send;
    cmd.api = std::uint32_t(Tx::send);
    cmd.size = size;
    cmd.seed = seed;
    send_cmd(s, cmd);
    Watch watch(10, "splice socket -> pipe");
    for (std::uint64_t off = 0; off < size;) {
        const std::size_t want = std::size_t(std::min<std::uint64_t>(65536, size - off));
        ssize_t n = splice(s, nullptr, p[1], nullptr, want, SPLICE_F_MOVE);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            fail("splice socket -> pipe at %llu of %llu: %zd (%s)", (unsigned long long)off,
                 (unsigned long long)size, n, n < 0 ? errno_name(errno) : "EOF");
        for (ssize_t got = 0; got < n;) {
            ssize_t r = read(p[0], buf.data() + got, std::size_t(n - got));
            if (r <= 0) fail("pipe read: %s", errno_name(errno));
            got += r;
        }
        pattern_expect(seed, off, buf.data(), std::size_t(n), "splice socket -> pipe");
        count_rx(s, std::uint64_t(n));
        off += std::uint64_t(n);
    }
}

}  // namespace

// Part in: from a pipe into the connection; part out: from the
// connection into a pipe.
void drive_splice(int *fd, const Options &opt) {
    const std::uint64_t size = opt.num("size", (1u << 20) + 3);
    const std::string part = part_of_conn(opt);
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) fail("pipe2: %s", errno_name(errno));
    if (part == "in") splice_in(*fd, p, size, seed_of(opt, 1));
    else if (part == "out") splice_out(*fd, p, size, seed_of(opt, 2));
    else fail("splice: unknown --part '%s'", part.c_str());
    close(p[0]);
    close(p[1]);
    send_exit(*fd);
}

}  // namespace peer
