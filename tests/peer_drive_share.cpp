// Drivers for a connection shared with other processes: a forked child
// that writes or reads it at the same time as its parent, takes over the
// incoming stream while bytes are in flight both ways, dies blocked in a
// read, takes the connection over from a parent that keeps its copy idle;
// a program started on the socket (cat on stdin and stdout).
#include "peer_drivers.hpp"
#include "peer_pingpong.hpp"
#include "peer_records.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <string>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

extern char **environ;

namespace peer {

namespace {

struct Pipe {
    int r = -1, w = -1;
};

Pipe make_pipe() {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) fail("pipe2: %s", errno_name(errno));
    return {p[0], p[1]};
}

// Tokens between parent and child say whose turn it is; the socket itself
// carries nothing but the stream under test.
void token_put(int fd, std::uint32_t v) {
    for (int i = 0; i < 1000; ++i) {
        ssize_t n = write(fd, &v, sizeof v);
        if (n == ssize_t(sizeof v)) return;
        if (!(n < 0 && errno == EINTR)) break;
    }
    fail("token pipe write: %s", errno_name(errno));
}

std::uint32_t token_take(int fd, const char *what) {
    for (int i = 0; i < 1000; ++i) {
        pollfd p{fd, POLLIN, 0};
        int r = poll(&p, 1, 10000);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) fail("waiting for %s: no token within 10 s", what);
        std::uint32_t v = 0;
        ssize_t n = read(fd, &v, sizeof v);
        if (n < 0 && errno == EINTR) continue;
        if (n != ssize_t(sizeof v))
            fail("waiting for %s: token pipe read returned %zd (%s)", what, n,
                 n < 0 ? errno_name(errno) : "EOF: the other process ended");
        return v;
    }
    fail("waiting for %s: interrupted too often", what);
}

// A child working on its copy of the socket. It ends through exit(0), as
// a real program would (atexit handlers and the library's exit path run);
// a failed check ends it with exit 1.
template <typename Body>
pid_t fork_child(Body body) {
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) fail("fork: %s", errno_name(errno));
    if (pid == 0) {
        arm_watchdog(20);
        body();
        std::fflush(stdout);
        exit(0);
    }
    return pid;
}

// Tokens both ways between a parent and the child it forks with
// fork_turns: in each process `in` and `out` are its own ends (the
// others are closed there); the parent closes its ends with done().
struct Turns {
    Pipe to_child = make_pipe();
    Pipe to_parent = make_pipe();
    int in = -1, out = -1;
    void done() {
        close(in);
        close(out);
    }
};

template <typename Body>
pid_t fork_turns(Turns &t, Body body) {
    const pid_t pid = fork_child([&] {
        close(t.to_child.w);
        close(t.to_parent.r);
        t.in = t.to_child.r;
        t.out = t.to_parent.w;
        body();
    });
    close(t.to_child.r);
    close(t.to_parent.w);
    t.in = t.to_parent.r;
    t.out = t.to_child.w;
    return pid;
}

void send_stream_at(int fd, std::uint64_t seed, std::uint64_t off, std::uint64_t size) {
    std::vector<std::uint8_t> buf(65536);
    for (std::uint64_t done = 0; done < size;) {
        const std::size_t n = std::size_t(std::min<std::uint64_t>(buf.size(), size - done));
        pattern_fill(seed, off + done, buf.data(), n);
        write_all(fd, buf.data(), n);
        done += n;
    }
}

void recv_stream_at(int fd, std::uint64_t seed, std::uint64_t off, std::uint64_t size,
                    const char *what) {
    std::vector<std::uint8_t> buf(65536);
    int interrupted = 0;
    for (std::uint64_t done = 0; done < size;) {
        const std::size_t want = std::size_t(std::min<std::uint64_t>(buf.size(), size - done));
        ssize_t n = recv(fd, buf.data(), want, 0);
        if (n < 0 && errno == EINTR && ++interrupted < 1000) continue;
        if (n <= 0)
            fail("%s: recv returned %zd (%s) at stream offset %llu", what, n,
                 n < 0 ? errno_name(errno) : "EOF", (unsigned long long)(off + done));
        pattern_expect(seed, off + done, buf.data(), std::size_t(n), what);
        count_rx(fd, std::uint64_t(n));
        done += std::uint64_t(n);
    }
}

// Before the fork: traffic both ways, so that in the direct configuration
// the connection has switched and carried bytes on the fabric.
void rounds_before(int fd, const Options &opt) {
    for (std::uint64_t r = 0; r < 3; ++r) echo_round(fd, fd, 1000 + 3000 * r, seed_of(opt, r));
}

// 1 MiB each way, the responder's ack last.
void bulk_both_ways(int fd, const Options &opt, std::uint64_t first, const char *what) {
    Cmd down;
    down.op = Op::send;
    down.api = std::uint32_t(Tx::send);
    down.size = 1 << 20;
    down.seed = seed_of(opt, first);
    send_cmd(fd, down);
    recv_pattern(fd, Rx::recv, down.seed, down.size, 65536, what);
    Cmd up;
    up.op = Op::recv;
    up.api = std::uint32_t(Rx::recv);
    up.size = 1 << 20;
    up.seed = seed_of(opt, first + 1);
    send_cmd(fd, up);
    send_pattern(fd, Tx::send, up.seed, up.size, 65536, 0);
    expect_ack(fd, what);
}

// After every other holder is gone: this process alone, both ways. The
// "alone" line lets the harness tell these bytes from the earlier ones.
void finish_alone(int fd, const Options &opt) {
    note("alone pid=%d local=%s peer=%s tx=%llu rx=%llu", int(getpid()), local_text(fd).c_str(),
         peer_text(fd).c_str(), (unsigned long long)counted_tx(fd),
         (unsigned long long)counted_rx(fd));
    for (std::uint64_t r = 0; r < 4; ++r) echo_round(fd, fd, 65536 + r, seed_of(opt, 500 + r));
    bulk_both_ways(fd, opt, 510, "bulk after the sharing ended");
    send_exit(fd);
}

// Each record in one blocking send: TCP takes it whole, so the reader
// sees it unbroken even with another process sending on the socket.
void write_records(int fd, const Cmd &cmd, std::uint32_t writer) {
    std::vector<std::uint8_t> rec;
    for (std::uint32_t seq = 0; seq < cmd.size2; ++seq) {
        record_build(cmd.seed, writer, seq, cmd.chunk, &rec);
        ssize_t n = send(fd, rec.data(), rec.size(), MSG_NOSIGNAL);
        if (n != ssize_t(rec.size()))
            fail("writer %u, record %u: send returned %zd (%s) for %zu bytes", writer, seq, n,
                 n < 0 ? errno_name(errno) : "short", rec.size());
        count_tx(fd, rec.size());
        // A short pause now and then spreads both writers over the same
        // stretch of time, so their records alternate in the stream.
        if (seq % 16 == 15) sleep_us(200);
    }
}

// One turn of a reader: exactly the turn's records (their sizes are
// known), through one MSG_WAITALL recv each or a loop of plain recvs, so
// nothing of the next turn's records is taken.
void read_turn(int fd, const Cmd &cmd, std::uint32_t turn, std::uint32_t per_turn,
               std::uint32_t reader) {
    Reply r;
    r.reader = reader;
    r.turn = turn;
    r.first = turn * per_turn;
    r.count = per_turn;
    r.sum = checksum(nullptr, 0);
    const bool waitall = (turn / 2) % 2 == 0;
    std::vector<std::uint8_t> rec;
    for (std::uint32_t seq = r.first; seq < r.first + per_turn; ++seq) {
        rec.resize(sizeof(RecordHead) + record_len(cmd.seed, 0, seq, cmd.chunk));
        if (waitall) {
            ssize_t n = -1;
            for (int i = 0; i < 1000; ++i) {
                n = recv(fd, rec.data(), rec.size(), MSG_WAITALL);
                if (!(n < 0 && errno == EINTR)) break;
            }
            if (n != ssize_t(rec.size()))
                fail("reader %u, record %u: recv(MSG_WAITALL) returned %zd (%s) for %zu bytes",
                     reader, seq, n, n < 0 ? errno_name(errno) : "short", rec.size());
            count_rx(fd, rec.size());
        } else {
            read_all(fd, rec.data(), rec.size(), "record");
        }
        record_expect(cmd.seed, 0, seq, cmd.chunk, rec.data(), rec.size(),
                      reader ? "record read by the child" : "record read by the parent");
        r.sum = checksum(rec.data() + sizeof(RecordHead), rec.size() - sizeof(RecordHead), r.sum);
    }
    write_all(fd, &r, sizeof r);
}

}  // namespace

void drive_fork_share_write(int *fd, const Options &opt) {
    const int s = *fd;
    rounds_before(s, opt);
    Cmd cmd;
    cmd.op = Op::records_in;
    cmd.size = 2;
    cmd.size2 = opt.num("records", 300);
    cmd.seed = seed_of(opt, 10);
    cmd.chunk = std::uint32_t(opt.num("max-len", 4096));
    send_cmd(s, cmd);
    Pipe go = make_pipe();
    const pid_t child = fork_child([&] {
        close(go.w);
        token_take(go.r, "the start");
        write_records(s, cmd, 1);
    });
    close(go.r);
    // Both writers start together.
    token_put(go.w, 0);
    write_records(s, cmd, 0);
    close(go.w);
    reap(child, "writing child");
    expect_ack(s, "records: responder's ack");
    finish_alone(s, opt);
}

void drive_fork_share_read(int *fd, const Options &opt) {
    const int s = *fd;
    const auto turns = std::uint32_t(opt.num("turns", 40));
    const auto per_turn = std::uint32_t(opt.num("per-turn", 25));
    if (turns == 0 || turns % 2) fail("--turns must be even and positive");
    rounds_before(s, opt);
    Cmd cmd;
    cmd.op = Op::records_out;
    cmd.size = std::uint64_t(turns) * per_turn;
    cmd.size2 = turns;
    cmd.seed = seed_of(opt, 11);
    cmd.chunk = std::uint32_t(opt.num("max-len", 4096));
    if (opt.num("passive-writer", 0)) cmd.flags |= kPassiveWriter;
    send_cmd(s, cmd);
    // The parent reads the even turns, the child the odd ones; the
    // reader of the last turn (the child) ends the exchange.
    Turns turn;
    const pid_t child = fork_turns(turn, [&] {
        for (std::uint32_t i = 0; i < turns / 2; ++i) {
            const std::uint32_t t = token_take(turn.in, "the parent's turn");
            if (t != 2 * i + 1) fail("child: token for turn %u, expected %u", t, 2 * i + 1);
            read_turn(s, cmd, t, per_turn, 1);
            token_put(turn.out, t + 1);
        }
    });
    for (std::uint32_t t = 0; t < turns; t += 2) {
        if (t) {
            const std::uint32_t got = token_take(turn.in, "the child's turn");
            if (got != t) fail("parent: token for turn %u, expected %u", got, t);
        }
        read_turn(s, cmd, t, per_turn, 0);
        token_put(turn.out, t + 1);
    }
    if (token_take(turn.in, "the child's last turn") != turns)
        fail("parent: the child's last token is not the end");
    turn.done();
    reap(child, "reading child");
    expect_ack(s, "records: responder's ack");
    finish_alone(s, opt);
}

// The peer is busy outside the library (a plain sleep, longer than the
// leave timeout) when a forked child first writes the socket: moving the
// connection to the kernel needs the peer's answer, which its control
// thread must give. The child's send must go through at once (the kernel
// buffers it), and the peer reads every byte once it wakes.
void drive_fork_peer_busy(int *fd, const Options &opt) {
    const int s = *fd;
    const std::uint64_t size = 100000;
    rounds_before(s, opt);
    Cmd cmd;
    cmd.op = Op::recv;
    cmd.api = std::uint32_t(Rx::recv);
    cmd.size = size;
    cmd.seed = seed_of(opt, 30);
    cmd.pre_delay_us = std::uint32_t(opt.num("busy-us", 4500000));
    send_cmd(s, cmd);
    const pid_t child = fork_child([&] {
        const std::uint64_t start = now_ns();
        send_stream_at(s, cmd.seed, 0, size);
        const double took = double(now_ns() - start) / 1e9;
        if (took > 1.0)
            fail("child: %llu bytes took %.3f s to send while the peer slept",
                 (unsigned long long)size, took);
        note("child sent %llu bytes in %.3f s while the peer slept", (unsigned long long)size,
             took);
    });
    reap(child, "writing child");
    expect_ack(s, "the child's bytes: responder's ack");
    finish_alone(s, opt);
}

void drive_fork_inflight(int *fd, const Options &opt) {
    const int s = *fd;
    const std::uint64_t in = opt.num("in-size", 4 << 20);
    const std::uint64_t out = opt.num("out-size", 4 << 20);
    const std::uint64_t reply = opt.num("reply-size", 100000);
    const std::uint64_t head = 100000;
    rounds_before(s, opt);
    // The responder sends `in` bytes while it reads ours (`out` from the
    // parent, then `reply` from the child), in small pieces, so both
    // directions are still moving at the fork.
    Cmd cmd;
    cmd.op = Op::duplex;
    cmd.size = out + reply;
    cmd.seed = seed_of(opt, 20);
    cmd.size2 = in;
    cmd.seed2 = seed_of(opt, 21);
    cmd.chunk = 4096;
    send_cmd(s, cmd);
    std::vector<std::uint8_t> big(out);
    pattern_fill(cmd.seed, 0, big.data(), big.size());
    std::atomic<bool> sent{false};
    ssize_t sent_n = 0;
    int sent_err = 0;
    // One large blocking send: past the read zero-copy threshold, so the
    // peer may be reading it from our memory when the fork comes.
    std::thread sender([&] {
        sent_n = send(s, big.data(), big.size(), MSG_NOSIGNAL);
        sent_err = errno;
        sent.store(true);
    });
    recv_stream_at(s, cmd.seed2, 0, head, "incoming before the fork");
    const bool pending = !sent.load();
    Pipe done = make_pipe();
    const pid_t child = fork_child([&] {
        close(done.w);
        recv_stream_at(s, cmd.seed2, head, in - head, "incoming, read by the child");
        token_take(done.r, "the end of the parent's send");
        send_stream_at(s, cmd.seed, out, reply);
        expect_ack(s, "duplex: responder's ack");
    });
    close(done.r);
    sender.join();
    if (sent_n != ssize_t(out))
        fail("the parent's send of %llu bytes returned %zd (%s)", (unsigned long long)out,
             sent_n, sent_n < 0 ? errno_name(sent_err) : "short");
    count_tx(s, out);
    note("fork-inflight send-pending-at-fork=%d", int(pending));
    token_put(done.w, 1);
    close(done.w);
    reap(child, "child that took the incoming stream");
    finish_alone(s, opt);
}

namespace {

// The child's state letter from /proc/<pid>/stat ('S': asleep in a call).
char proc_state(pid_t pid) {
    char path[64], text[512];
    std::snprintf(path, sizeof path, "/proc/%d/stat", int(pid));
    FILE *f = std::fopen(path, "r");
    if (!f) return '?';
    const std::size_t n = std::fread(text, 1, sizeof text - 1, f);
    std::fclose(f);
    text[n] = '\0';
    const char *close_paren = std::strrchr(text, ')');
    return close_paren && close_paren[1] == ' ' ? close_paren[2] : '?';
}

// An echo round whose outgoing bytes, the command first, go by sendfile
// from a file, in pieces of at most 64 KiB (the file's offset moves with
// them): an inherited socket's very first call.
void echo_round_sendfile(int s, std::uint64_t size, std::uint64_t seed) {
    const int f = memfd_create("peer-sendfile", MFD_CLOEXEC);
    if (f < 0) fail("memfd_create: %s", errno_name(errno));
    Cmd cmd;
    cmd.op = Op::echo;
    cmd.size = size;
    cmd.seed = seed;
    cmd.seed2 = seed + 1;
    cmd.chunk = 4096;
    std::vector<std::uint8_t> buf(sizeof cmd + static_cast<std::size_t>(size));
    std::memcpy(buf.data(), &cmd, sizeof cmd);
    pattern_fill(seed, 0, buf.data() + sizeof cmd, buf.size() - sizeof cmd);
    if (write(f, buf.data(), buf.size()) != ssize_t(buf.size())) fail("write to memfd: %s", errno_name(errno));
    if (lseek(f, 0, SEEK_SET) != 0) fail("lseek: %s", errno_name(errno));
    for (std::uint64_t done = 0; done < buf.size();) {
        const ssize_t n = sendfile(s, f, nullptr, std::min<std::size_t>(buf.size() - done, 65536));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fail("sendfile at %llu of %zu: returned %zd (%s)", (unsigned long long)done, buf.size(), n,
                         n < 0 ? errno_name(errno) : "nothing sent");
        done += std::uint64_t(n);
        count_tx(s, std::uint64_t(n));
    }
    close(f);
    recv_pattern(s, Rx::recv, seed + 1, size, 4096, "echo of the sendfile round");
}

}  // namespace

void drive_fork_sharer_killed(int *fd, const Options &opt) {
    const int s = *fd;
    rounds_before(s, opt);
    Pipe ready = make_pipe();
    const pid_t child = fork_child([&] {
        close(ready.r);
        echo_round(s, s, 10000, seed_of(opt, 30));
        token_put(ready.w, 1);
        // Nothing is sent until this process is dead: the read must block.
        char c;
        ssize_t n = recv(s, &c, 1, 0);
        fail("the child's recv, which nothing should satisfy, returned %zd (%s)", n,
             n < 0 ? errno_name(errno) : "data");
    });
    close(ready.w);
    token_take(ready.r, "the child's echo round");
    close(ready.r);
    char state = '?';
    for (int i = 0; i < 200 && (state = proc_state(child)) != 'S'; ++i) sleep_us(10000);
    if (state != 'S') fail("the child is not asleep in its recv (state '%c')", state);
    sleep_us(20000);
    if (kill(child, SIGKILL) != 0) fail("kill: %s", errno_name(errno));
    reap(child, "killed child", SIGKILL);
    finish_alone(s, opt);
}

// The peer forks and dies by SIGKILL at once, its child holding the
// socket (Op::fork_die); the command of an echo and its bytes follow at
// once. On TCP the child answers the echo, byte-exact. On a direct
// connection the bytes were in the dead owner's memory (its receive
// ring): the connection is reset for both ends, never EIO, never a wrong
// byte. Prints "echo exact" or "reset by the peer: ERRNO".
void drive_fork_owner_killed(int *fd, const Options &opt) {
    const int s = *fd;
    rounds_before(s, opt);
    Cmd die;
    die.op = Op::fork_die;
    die.size2 = opt.num("holder-us", 300000);
    send_cmd(s, die);
    const std::uint64_t size = 20000, seed = seed_of(opt, 40);
    Cmd echo;
    echo.op = Op::echo;
    echo.size = size;
    echo.seed = seed;
    echo.seed2 = seed + 1;
    echo.chunk = 4096;
    std::vector<char> out(sizeof echo + size);
    std::memcpy(out.data(), &echo, sizeof echo);
    pattern_fill(seed, 0, out.data() + sizeof echo, size);
    int err = 0;
    for (std::size_t done = 0; done < out.size() && !err;) {
        const ssize_t n = send(s, out.data() + done, out.size() - done, MSG_NOSIGNAL);
        if (n > 0) done += std::size_t(n);
        else if (n < 0 && errno != EINTR) err = errno;
        else if (n == 0) fail("send returned 0");
    }
    std::vector<char> in(size);
    std::size_t got = 0;
    while (!err && got < size) {
        const ssize_t n = recv(s, in.data() + got, size - got, 0);
        if (n > 0) {
            pattern_expect(seed + 1, got, in.data() + got, std::size_t(n), "echo from the holder");
            got += std::size_t(n);
        } else if (n == 0) {
            fail("echo from the holder: EOF after %zu of %llu bytes", got, (unsigned long long)size);
        } else if (errno != EINTR) {
            err = errno;
        }
    }
    if (err && err != ECONNRESET && err != EPIPE)
        fail("echo from the holder: %s after %zu bytes (a reset or the whole echo expected)",
             errno_name(err), got);
    if (err) note("reset by the peer: %s", errno_name(err));
    else note("echo exact");
    // The holder's own line comes within its pause.
    sleep_us(die.size2 + 500000);
    close(s);
    *fd = -1;
}

// Both ends hand the connection to a forked child, the peer first (a
// forking server on each end). This process forked while direct, so the
// peer's leave (its parent's close, its child holding on) reaches an end
// whose child may take over; our own close follows while the connection
// is off the fabric. The child goes on, forks and hands over in turn; the
// grandchild finishes. Every byte is checked on both ends.
void drive_fork_handoff_both(int *fd, const Options &opt) {
    const int s = *fd;
    rounds_before(s, opt);
    Pipe go = make_pipe();
    const pid_t child = fork_child([&] {
        close(go.w);
        token_take(go.r, "the parent's close");
        // Its first bytes by sendfile, if asked: they must be counted where
        // the connection's next upgrade starts.
        if (opt.num("child-sendfile", 0)) echo_round_sendfile(s, 300000, seed_of(opt, 59));
        for (std::uint64_t r = 0; r < 3; ++r)
            echo_round(s, s, 20000 + 777 * r, seed_of(opt, 60 + r));
        Pipe next = make_pipe();
        const pid_t grandchild = fork_child([&] {
            close(next.w);
            token_take(next.r, "the child's close");
            finish_alone(s, opt);
        });
        close(next.r);
        close(s);
        token_put(next.w, 1);
        close(next.w);
        reap(grandchild, "grandchild");
    });
    close(go.r);
    Cmd cmd;
    cmd.op = Op::handoff;
    cmd.size2 = opt.num("peer-pause-us", 600000);
    send_cmd(s, cmd);
    // The peer's parent closes at once and leaves the fabric meanwhile
    // (our control thread answers); its child waits longer than we do.
    sleep_us(opt.num("pause-us", 300000));
    close(s);
    *fd = -1;
    token_put(go.w, 1);
    close(go.w);
    reap(child, "child");
}

// The socket goes to a forked child before it earned its upgrade, and the
// parent closes its copy at once: the child, its last holder, goes on
// with paced ping-pongs for --child-ms and earns the upgrade from the
// counts the holders kept. Every byte is checked on both ends.
void drive_fork_then_earn(int *fd, const Options &opt) {
    const int s = *fd;
    const pid_t child = fork_child([&] {
        paced_pingpongs(s, opt, opt.num("child-ms", 3000), 70);
        send_exit(s);
        close(s);
    });
    close(s);
    *fd = -1;
    reap(child, "child");
}

// A stdio stream is opened on the socket before it earned its upgrade
// (so it stays on TCP for good), then a forked child gets it and the
// parent closes its copies. The child, the last holder, exchanges for
// --child-ms (long enough to earn an upgrade), then writes through the
// stdio stream it inherited, whose bytes reach the kernel by calls no
// library sees: they must arrive, so the socket must still be on TCP.
void drive_fork_stdio(int *fd, const Options &opt) {
    const int s = *fd;
    const int d = dup(s);
    FILE *f = d < 0 ? nullptr : fdopen(d, "r+");
    if (!f) fail("fdopen: %s", errno_name(errno));
    const pid_t child = fork_child([&] {
        paced_pingpongs(s, opt, opt.num("child-ms", 1500), 80);
        Cmd cmd;
        cmd.op = Op::recv;
        cmd.api = std::uint32_t(Rx::recv);
        cmd.size = 100000;
        cmd.seed = seed_of(opt, 79);
        send_cmd(s, cmd);
        std::vector<char> buf(cmd.size);
        pattern_fill(cmd.seed, 0, buf.data(), buf.size());
        if (std::fwrite(buf.data(), 1, buf.size(), f) != buf.size() || std::fflush(f) != 0)
            fail("fwrite to the inherited connection: %s", errno_name(errno));
        if (std::fgetc(f) != 'A') fail("fgetc: no ack after fwrite");
        send_exit(s);
        close(s);
    });
    std::fclose(f);
    close(s);
    *fd = -1;
    reap(child, "child");
}

// The peer leaves the fabric first (its hand-off) while 100 kB it sent
// are unread here; our control thread answers its leave, keeping them,
// and only then do we fork and hand the socket to the child, whose first
// read must get those bytes, then the rest of the stream. --parent close
// (a forking server): we close our copy first; keep: we hold it while
// the child reads. --fork before: the child is forked before the peer's
// leave instead (while direct).
void drive_fork_after_answer(int *fd, const Options &opt) {
    const int s = *fd;
    const std::string parent = opt.get("parent", "close");
    if (parent != "close" && parent != "keep") fail("--parent must be close or keep");
    rounds_before(s, opt);
    const bool early = opt.get("fork", "after") == "before";
    Pipe go = make_pipe();
    Cmd bulk0;
    bulk0.size = opt.num("size", 100000);
    bulk0.seed = seed_of(opt, 70);
    pid_t child = -1;
    auto body = [&] {
        close(go.w);
        token_take(go.r, "the parent's go");
        recv_stream_at(s, bulk0.seed, 0, bulk0.size, "bytes unread at the fork, read by the child");
        finish_alone(s, opt);
    };
    if (early) child = fork_child(body);
    Cmd bulk;
    bulk.op = Op::send;
    bulk.api = std::uint32_t(Tx::send);
    bulk.size = opt.num("size", 100000);
    bulk.seed = seed_of(opt, 70);
    send_cmd(s, bulk);
    Cmd cmd;
    cmd.op = Op::handoff;
    cmd.size2 = opt.num("peer-pause-us", 100000);
    send_cmd(s, cmd);
    // The peer's parent closes at once and leaves the fabric meanwhile; we
    // answer without reading (our control thread), the bytes in our ring.
    sleep_us(opt.num("pause-us", 400000));
    if (!early) child = fork_child(body);
    close(go.r);
    if (parent == "close") {
        close(s);
        *fd = -1;
    }
    token_put(go.w, 1);
    close(go.w);
    reap(child, "child");
}

namespace {

// What this process has sent and received on the socket, as one line.
void note_counts(const char *what, int fd) {
    note("%s pid=%d tx=%llu rx=%llu", what, int(getpid()), (unsigned long long)counted_tx(fd),
         (unsigned long long)counted_rx(fd));
}

// The child's side of the idle-parent scenarios: echo rounds (its first
// call makes the parent leave the fabric; a later one finds the parent a
// holder that never used the socket since, and takes it over), 10 ms
// apart, so that the engine its first call builds is ready well before
// the bulk. The child's counts are the whole stream's (the parent sends
// and receives nothing meanwhile): "child-start" gives the offsets at the
// fork, "child-took" and "child-bulk-done" those around the bulk.
void child_takes_over(int fd, const Options &opt) {
    note_counts("child-start", fd);
    for (std::uint64_t r = 0; r < 6; ++r) {
        echo_round(fd, fd, 20000 + 1111 * r, seed_of(opt, 90 + r));
        sleep_us(10000);
    }
    note_counts("child-took", fd);
    bulk_both_ways(fd, opt, 100, "the child's bulk");
    note_counts("child-bulk-done", fd);
}

}  // namespace

// The parent keeps its copy of the socket and never touches it while its
// child serves the connection (SDIRECT_TAKE_OVER=1, set by the test):
// it waits for the child's exit in waitpid only. The child takes the
// connection over and moves its bulk on the fabric, then closes and
// exits; the parent, alone, finishes. Every byte is checked on both ends.
void drive_fork_idle_parent(int *fd, const Options &opt) {
    const int s = *fd;
    rounds_before(s, opt);
    const pid_t child = fork_child([&] {
        child_takes_over(s, opt);
        note_counts("child-done", s);
        close(s);
    });
    reap(child, "child serving the connection");
    finish_alone(s, opt);
}

// As fork-idle-parent, but the child keeps the socket after its bulk and
// hands the turn to the parent (pipe tokens), whose echo round makes the
// child, the owner, move the connection back to the kernel first; the
// child's last echo round then goes on the kernel, counted for the
// holders, and the parent, alone once the child has exited, finishes.
void drive_fork_idle_parent_claims(int *fd, const Options &opt) {
    const int s = *fd;
    rounds_before(s, opt);
    Turns turn;
    const pid_t child = fork_turns(turn, [&] {
        child_takes_over(s, opt);
        token_put(turn.out, 1);
        token_take(turn.in, "the parent's echo round");
        echo_round(s, s, 30000, seed_of(opt, 120));
        note_counts("child-done", s);
    });
    token_take(turn.in, "the child's bulk");
    echo_round(s, s, 25000, seed_of(opt, 110));
    token_put(turn.out, 2);
    turn.done();
    reap(child, "child serving the connection");
    finish_alone(s, opt);
}

void drive_spawn_cat(int *fd, const Options &opt) {
    const char *cat = "/bin/cat";
    if (access(cat, X_OK) != 0) skip("%s is not installed", cat);
    const int s = *fd;
    rounds_before(s, opt);
    const std::string via = opt.get("via", "spawn");
    if (via != "spawn" && via != "popen") fail("--via must be spawn or popen");
    Cmd cmd;
    cmd.op = Op::echo_eof;
    cmd.size = opt.num("size", 1 << 20);
    cmd.seed = seed_of(opt, 40);
    cmd.chunk = 65536;
    // Sent before the program starts: the responder's stream may already
    // be on its way to this process when the socket changes hands.
    send_cmd(s, cmd);
    if (via == "spawn") {
        // The program runs without the library: it knows only the kernel socket.
        const pid_t pid = spawn_plain_cat(cat, s);
        // The responder sees EOF only once every copy of the socket is closed.
        close(s);
        *fd = -1;
        reap(pid, "cat");
        return;
    }
    // popen's shell takes the process's environment: the library's
    // variables go first. The socket must survive exec to be redirected.
    std::vector<std::string> names;
    for (char **e = environ; *e; ++e)
        if (std::strncmp(*e, "LD_PRELOAD=", 11) == 0 || std::strncmp(*e, "SDIRECT_", 8) == 0)
            names.emplace_back(*e, std::strchr(*e, '=') - *e);
    for (const std::string &n : names) unsetenv(n.c_str());
    if (fcntl(s, F_SETFD, 0) != 0) fail("fcntl(F_SETFD): %s", errno_name(errno));
    char command[128];
    std::snprintf(command, sizeof command, "exec %s <&%d >&%d", cat, s, s);
    FILE *p = popen(command, "r");
    if (!p) fail("popen: %s", errno_name(errno));
    close(s);
    *fd = -1;
    // Bounded by the process's watchdog: pclose has no timeout.
    char c;
    if (std::fread(&c, 1, 1, p) != 0) fail("popen: cat wrote to the pipe, not the socket");
    const int status = pclose(p);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("cat under popen ended with status 0x%x", unsigned(status));
}

}  // namespace peer
