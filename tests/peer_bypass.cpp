// Paths around the socket calls: sendfile and splice on a full
// non-blocking socket, close_range and closefrom, sendmmsg and recvmmsg,
// stdio on a socket, a socket passed to another process, privilege
// changes and a sandboxed child. Scenario "bypass", the case chosen by --part.
#include "peer_ready.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <grp.h>
#include <linux/audit.h>
#include <linux/close_range.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

extern char **environ;

namespace peer {

namespace {


void set_nonblocking(int fd, bool on) {
    const int fl = fcntl(fd, F_GETFL);
    if (fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK) != 0)
        fail("fcntl(F_SETFL): %s", errno_name(errno));
}

void wait_writable(int fd, const char *what) {
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, 5000) != 1) fail("%s: not writable within 5 s", what);
}

int queued_in(int pipe_rd) {
    int n = -1;
    if (ioctl(pipe_rd, FIONREAD, &n) != 0) fail("FIONREAD on a pipe: %s", errno_name(errno));
    return n;
}

// sendfile into a full non-blocking socket, without an offset (the file's
// own position moves) and with one (the position stays): every call moves
// the offset by exactly what it returned, EAGAIN by nothing, so the
// receiver sees the file once, byte for byte.
void nonblocking_sendfile(int s, const Options &opt) {
    const std::uint64_t size = opt.num("size", 8u << 20);
    const std::uint64_t seed = seed_of(opt, 11);
    int f = pattern_file(seed, size);
    start_fill(s, size, seed, 400000);
    set_nonblocking(s, true);
    std::uint64_t sent = 0;
    int eagains = 0, partial = 0;
    const std::uint64_t start = now_ns();
    for (int call = 0; sent < size; ++call) {
        if (seconds_since(start) > 20) fail("non-blocking sendfile: not done within 20 s");
        // Two calls of each kind in turn: the second one finds the
        // socket full that the first one filled.
        const bool own_position = (call / 2) % 2 == 0;
        const std::size_t want = std::size_t(size - sent);
        off_t off = off_t(sent);
        ssize_t n = own_position ? sendfile(s, f, nullptr, want) : sendfile(s, f, &off, want);
        const int err = errno;
        if (own_position && file_position(f) != off_t(sent) + (n > 0 ? n : 0))
            fail("sendfile(NULL, %zu) at %llu returned %zd (%s) but left the file position at "
                 "%lld", want, (unsigned long long)sent, n, n < 0 ? errno_name(err) : "-",
                 (long long)file_position(f));
        if (!own_position && (off != off_t(sent) + (n > 0 ? n : 0) || file_position(f) != off_t(sent)))
            fail("sendfile(&offset, %zu) at %llu returned %zd (%s): offset %lld, position %lld",
                 want, (unsigned long long)sent, n, n < 0 ? errno_name(err) : "-", (long long)off,
                 (long long)file_position(f));
        if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK)) {
            ++eagains;
            wait_writable(s, "non-blocking sendfile");
            continue;
        }
        if (n < 0 && err == EINTR) continue;
        if (n <= 0) fail("non-blocking sendfile: %zd (%s)", n, n < 0 ? errno_name(err) : "0");
        if (std::size_t(n) < want) ++partial;
        sent += std::uint64_t(n);
        count_tx(s, std::uint64_t(n));
        // Keep the file position where the next call starts.
        if (!own_position) lseek(f, off_t(sent), SEEK_SET);
    }
    if (!eagains || !partial) fail("non-blocking sendfile: %d EAGAIN, %d short counts", eagains, partial);
    set_nonblocking(s, false);
    expect_ack(s, "the receiver's ack after non-blocking sendfile");
    note("bypass sendfile eagains=%d partial=%d", eagains, partial);
    close(f);
}

// splice from a pipe into a full non-blocking socket: the pipe loses
// exactly what the call returned, and nothing on EAGAIN.
void nonblocking_splice(int s, const Options &opt) {
    const std::uint64_t size = opt.num("size", 8u << 20);
    const std::uint64_t seed = seed_of(opt, 12);
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) fail("pipe2: %s", errno_name(errno));
    set_nonblocking(p[1], true);
    start_fill(s, size, seed, 400000);
    set_nonblocking(s, true);
    std::vector<char> buf(65536);
    std::uint64_t piped = 0, sent = 0;
    int eagains = 0, partial = 0;
    const std::uint64_t start = now_ns();
    while (sent < size) {
        if (seconds_since(start) > 20) fail("non-blocking splice: not done within 20 s");
        // Keep the pipe full: the socket is what runs out of room.
        while (piped < size) {
            const std::size_t n = std::size_t(std::min<std::uint64_t>(4096, size - piped));
            pattern_fill(seed, piped, buf.data(), n);
            ssize_t w = write(p[1], buf.data(), n);
            if (w < 0 && errno == EAGAIN) break;
            if (w <= 0) fail("pipe write: %s", errno_name(errno));
            piped += std::uint64_t(w);
        }
        const int before = queued_in(p[0]);
        ssize_t n = splice(p[0], nullptr, s, nullptr, std::size_t(before), SPLICE_F_NONBLOCK);
        const int err = errno;
        const int after = queued_in(p[0]);
        if (after != before - (n > 0 ? int(n) : 0))
            fail("splice of %d bytes at %llu returned %zd (%s) but the pipe went from %d to %d "
                 "bytes", before, (unsigned long long)sent, n, n < 0 ? errno_name(err) : "-",
                 before, after);
        if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK)) {
            ++eagains;
            wait_writable(s, "non-blocking splice");
            continue;
        }
        if (n <= 0) fail("non-blocking splice: %zd (%s)", n, n < 0 ? errno_name(err) : "0");
        if (n < before) ++partial;
        sent += std::uint64_t(n);
        count_tx(s, std::uint64_t(n));
    }
    if (!eagains) fail("non-blocking splice: no EAGAIN (%d short counts)", partial);
    set_nonblocking(s, false);
    expect_ack(s, "the receiver's ack after non-blocking splice");
    note("bypass splice eagains=%d partial=%d", eagains, partial);
    close(p[0]);
    close(p[1]);
}

void expect_ebadf(int fd, const char *what) {
    const ssize_t n = write(fd, "x", 1);
    if (n != -1 || errno != EBADF)
        fail("%s: write to the closed fd %d gave %zd (%s), not -1 EBADF", what, fd, n,
             n < 0 ? errno_name(errno) : "-");
}

// A file opened at the number `want` (the lowest free one): open until it
// comes, a library thread may take a number meanwhile.
int open_file_at(int want) {
    int extra[32], n = 0;
    for (;;) {
        const char *dir = std::getenv("TMPDIR");
        std::string path = std::string(dir && *dir ? dir : "/tmp") + "/sdirect-bypass-XXXXXX";
        std::vector<char> name(path.begin(), path.end());
        name.push_back('\0');
        int f = mkostemp(name.data(), O_CLOEXEC);
        if (f < 0) fail("mkostemp: %s", errno_name(errno));
        unlink(name.data());
        if (f == want || n == 32) {
            for (int i = 0; i < n; ++i) close(extra[i]);
            if (f != want) fail("a new file never got the closed fd %d", want);
            return f;
        }
        extra[n++] = f;
    }
}

// close_range and closefrom over fds of a connection: the library must
// forget each one as close() makes it (the kernel's EBADF afterwards, a file
// that gets the number is a file), keep the connection on its other fds,
// and end it (the peer's EOF) when the last fd goes.
void close_ranges(int *fd, const Options &opt) {
    const int s = *fd;
    std::uint64_t seed = seed_of(opt, 20);
    int d = dup(s);
    if (d < 0) fail("dup: %s", errno_name(errno));
    if (close_range(unsigned(d), unsigned(d), 0) != 0) fail("close_range: %s", errno_name(errno));
    expect_ebadf(d, "close_range(d, d, 0)");
    echo_round(s, s, 70000, seed++);

    // The number comes back as a file: its bytes stay in the file.
    d = dup(s);
    if (close_range(unsigned(d), unsigned(d) + 2, 0) != 0) fail("close_range: %s", errno_name(errno));
    int f = open_file_at(d);
    if (write(f, "file bytes", 10) != 10) fail("write to a file at a closed socket's number: %s",
                                               errno_name(errno));
    char back[16] = {};
    if (pread(f, back, sizeof back, 0) != 10 || std::memcmp(back, "file bytes", 10) != 0)
        fail("the file at a closed socket's number reads back '%.16s'", back);
    close(f);
    echo_round(s, s, 70000, seed++);

    // CLOSE_RANGE_CLOEXEC closes nothing.
    d = dup(s);
    if (close_range(unsigned(d), unsigned(d), CLOSE_RANGE_CLOEXEC) != 0)
        fail("close_range(CLOSE_RANGE_CLOEXEC): %s", errno_name(errno));
    if (!(fcntl(d, F_GETFD) & FD_CLOEXEC)) fail("CLOSE_RANGE_CLOEXEC did not set FD_CLOEXEC");
    echo_round(d, d, 70000, seed++);
    close(d);

    // closefrom over a high number.
    if (dup2(s, 1000) != 1000) fail("dup2 onto 1000: %s", errno_name(errno));
    closefrom(1000);
    expect_ebadf(1000, "closefrom(1000)");
    echo_round(s, s, 70000, seed++);

    // The last fd: the peer reads everything, then EOF.
    Cmd cmd;
    cmd.op = Op::recv_eof;
    cmd.api = std::uint32_t(Rx::recv);
    cmd.size = 100000;
    cmd.seed = seed;
    cmd.size2 = 0;
    send_cmd(s, cmd);
    send_pattern(s, Tx::send, seed, cmd.size, 65536, 0);
    report_bytes(s);
    if (close_range(unsigned(s), unsigned(s), 0) != 0) fail("close_range: %s", errno_name(errno));
    *fd = -1;
}

// `n` messages of up to `each` bytes, the stream bytes of `seed` from
// `off` on (up to `end`), in `buf`.
struct Batch {
    std::vector<char> buf;
    std::vector<iovec> iov;
    std::vector<mmsghdr> msgs;
    Batch(std::uint64_t seed, std::uint64_t off, std::uint64_t end, std::size_t each, unsigned n)
        : buf(each * n), iov(n), msgs(n) {
        unsigned k = 0;
        for (; k < n && off < end; ++k) {
            const std::size_t len = std::size_t(std::min<std::uint64_t>(each, end - off));
            pattern_fill(seed, off, buf.data() + k * each, len);
            iov[k] = {buf.data() + k * each, len};
            msgs[k] = {};
            msgs[k].msg_hdr.msg_iov = &iov[k];
            msgs[k].msg_hdr.msg_iovlen = 1;
            off += len;
        }
        msgs.resize(k);
    }
};

// Receive buffers for recvmmsg, `len` bytes each.
struct Slots {
    std::vector<char> buf;
    std::vector<iovec> iov;
    std::vector<mmsghdr> msgs;
    Slots(unsigned n, std::size_t len) : buf(n * len), iov(n), msgs(n) {
        for (unsigned k = 0; k < n; ++k) {
            iov[k] = {buf.data() + k * len, len};
            msgs[k] = {};
            msgs[k].msg_hdr.msg_iov = &iov[k];
            msgs[k].msg_hdr.msg_iovlen = 1;
        }
    }
};

// Checks what recvmmsg returned: `rc` messages of lengths `want`, the
// stream bytes of `seed` from `*off` on.
void expect_received(Slots &sl, int rc, std::initializer_list<unsigned> want, std::uint64_t seed,
                     std::uint64_t *off, int fd, const char *what) {
    if (rc != int(want.size()))
        fail("%s: recvmmsg returned %d (%s), expected %zu", what, rc, rc < 0 ? errno_name(errno) : "-",
             want.size());
    unsigned k = 0;
    for (unsigned len : want) {
        if (sl.msgs[k].msg_len != len)
            fail("%s: message %u has %u bytes, expected %u", what, k, sl.msgs[k].msg_len, len);
        pattern_expect(seed, *off, sl.iov[k].iov_base, len, what);
        *off += len;
        count_rx(fd, len);
        ++k;
    }
}

// sendmmsg and recvmmsg on a connection: every message through the
// stream, counts and lengths as the kernel gives them for TCP.
void mmsgs(int s, const Options &opt) {
    // Three messages, all sent: the peer receives them as one stream.
    const std::uint64_t seed = seed_of(opt, 30);
    {
        Cmd cmd;
        cmd.op = Op::recv;
        cmd.api = std::uint32_t(Rx::recv);
        cmd.size = 1000 + 70000 + 5;
        cmd.seed = seed;
        send_cmd(s, cmd);
        Slots b(3, 70000);
        b.iov[0].iov_len = 1000;
        b.iov[1].iov_base = b.buf.data() + 1000;
        b.iov[2].iov_base = b.buf.data() + 71000;
        b.iov[2].iov_len = 5;
        pattern_fill(seed, 0, b.buf.data(), cmd.size);
        const int rc = sendmmsg(s, b.msgs.data(), 3, 0);
        if (rc != 3) fail("sendmmsg of 3 messages: %d (%s)", rc, rc < 0 ? errno_name(errno) : "-");
        for (unsigned k = 0; k < 3; ++k)
            if (b.msgs[k].msg_len != b.iov[k].iov_len)
                fail("sendmmsg: message %u sent %u of %zu bytes", k, b.msgs[k].msg_len, b.iov[k].iov_len);
        count_tx(s, cmd.size);
        expect_ack(s, "the receiver's ack after sendmmsg");
    }
    // A full non-blocking socket: the messages that fit, the last one
    // perhaps short; -1 EAGAIN only when not one byte went.
    {
        const std::uint64_t total = opt.num("size", 8u << 20), seed2 = seed_of(opt, 31);
        start_fill(s, total, seed2, 400000);
        set_nonblocking(s, true);
        std::uint64_t sent = 0;
        int eagains = 0, short_calls = 0;
        const std::uint64_t start = now_ns();
        while (sent < total) {
            if (seconds_since(start) > 20) fail("non-blocking sendmmsg: not done within 20 s");
            // Messages of a size the window is no multiple of, so that some
            // call ends in a message half taken.
            Batch b(seed2, sent, total, 65536 + 1000, 16);
            const int rc = sendmmsg(s, b.msgs.data(), unsigned(b.msgs.size()), 0);
            if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                ++eagains;
                wait_writable(s, "non-blocking sendmmsg");
                continue;
            }
            if (rc <= 0 || rc > int(b.msgs.size()))
                fail("non-blocking sendmmsg: %d (%s)", rc, rc < 0 ? errno_name(errno) : "-");
            for (int k = 0; k < rc; ++k) {
                const std::size_t len = b.msgs[k].msg_len;
                if (len > b.iov[k].iov_len || (k + 1 < rc && len != b.iov[k].iov_len) || (len == 0 && b.iov[k].iov_len))
                    fail("non-blocking sendmmsg returned %d: message %d has %zu of %zu bytes", rc, k,
                         len, b.iov[k].iov_len);
                sent += len;
                count_tx(s, len);
            }
            if (rc < int(b.msgs.size())) ++short_calls;
        }
        // The window filled at least once (the reader starts late): a call
        // that met it ended short or failed with EAGAIN; which one depends
        // on how the credits came back, as with the kernel's buffer.
        if (!eagains && !short_calls)
            fail("non-blocking sendmmsg: never short, never EAGAIN, although the reader started late");
        set_nonblocking(s, false);
        expect_ack(s, "the receiver's ack after non-blocking sendmmsg");
    }
    // recvmmsg: the bytes there fill messages in order.
    {
        const std::uint64_t seed3 = seed_of(opt, 32);
        std::uint64_t off = 0;
        order_send(s, 7500, seed3, 0, true);
        await_queued(s, 7500, "recvmmsg");
        Slots sl(4, 1000);
        int rc = recvmmsg(s, sl.msgs.data(), 3, MSG_WAITFORONE, nullptr);
        expect_received(sl, rc, {1000, 1000, 1000}, seed3, &off, s, "recvmmsg(MSG_WAITFORONE)");
        // Looked at after the first message: a zero timeout ends the call there.
        timespec zero{0, 0};
        rc = recvmmsg(s, sl.msgs.data(), 4, 0, &zero);
        expect_received(sl, rc, {1000}, seed3, &off, s, "recvmmsg with a zero timeout");
        if (zero.tv_sec || zero.tv_nsec) fail("recvmmsg left a zero timeout at %lld.%09ld",
                                              (long long)zero.tv_sec, zero.tv_nsec);
        timespec five{5, 0};
        rc = recvmmsg(s, sl.msgs.data(), 4, 0, &five);
        expect_received(sl, rc, {1000, 1000, 1000, 500}, seed3, &off, s, "recvmmsg with a timeout");
        if (five.tv_sec > 5 || five.tv_sec < 3) fail("recvmmsg wrote back %lld.%09ld of a 5 s timeout",
                                                     (long long)five.tv_sec, five.tv_nsec);
        // MSG_WAITFORONE: what is there after the first message, then no wait.
        order_send(s, 2500, seed3 + 1, 0, true);
        await_queued(s, 2500, "recvmmsg");
        off = 0;
        rc = recvmmsg(s, sl.msgs.data(), 4, MSG_WAITFORONE, nullptr);
        expect_received(sl, rc, {1000, 1000, 500}, seed3 + 1, &off, s,
                        "recvmmsg(MSG_WAITFORONE) of less than asked");
        rc = recvmmsg(s, sl.msgs.data(), 4, MSG_DONTWAIT, nullptr);
        if (rc != -1 || (errno != EAGAIN && errno != EWOULDBLOCK))
            fail("recvmmsg(MSG_DONTWAIT) on an empty connection: %d (%s), not -1 EAGAIN", rc,
                 rc < 0 ? errno_name(errno) : "-");
    }
}

constexpr uid_t kNobody = 65534;

// A seccomp filter that kills the process on the calls an upgrade makes
// (getsockname, getpeername, socket): a library that made one after the
// switch would end the process with SIGSYS.
void forbid_socket_calls() {
    sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_getsockname, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_getpeername, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_socket, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    };
    sock_fprog prog{std::uint16_t(sizeof code / sizeof code[0]), code};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail("PR_SET_NO_NEW_PRIVS: %s", errno_name(errno));
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0)
        fail("PR_SET_SECCOMP: %s", errno_name(errno));
}

// No map of another process's page or fabric region, nor of the
// registry's shared spin file, is left here.
void expect_no_peer_maps() {
    const char *registry = std::getenv("SDIRECT_REGISTRY");
    const std::string own_page = std::string("/p") + std::to_string(getpid());
    const std::string own_region = std::string("/sd") + std::to_string(getpid()) + "-";
    FILE *m = std::fopen("/proc/self/maps", "r");
    if (!m) fail("/proc/self/maps: %s", errno_name(errno));
    char line[1024];
    for (int i = 0; i < 100000 && std::fgets(line, sizeof line, m); ++i) {
        const std::string l = line;
        const auto page = registry && *registry ? l.find(std::string(registry) + "/p") : std::string::npos;
        if (page != std::string::npos && l.find(own_page, page) == std::string::npos)
            fail("after the privilege change a peer's process page is still mapped: %s", line);
        if (registry && *registry && l.find(std::string(registry) + "/spin") != std::string::npos)
            fail("after the privilege change the registry's spin file is still mapped: %s", line);
        const auto region = l.find("/sd");
        if (region != std::string::npos && l.find("/dev/shm/") != std::string::npos &&
            l.find(own_region) == std::string::npos && l.find("sdirect") == std::string::npos)
            fail("after the privilege change a peer's fabric region is still mapped: %s", line);
    }
    std::fclose(m);
}

// The statistics file the library writes at exit stays writable for a
// process that is no longer root.
void stats_for_nobody() {
    const char *path = std::getenv("SDIRECT_STATS_FILE");
    if (!path || !*path) return;
    int f = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (f < 0 || fchmod(f, 0666) != 0) fail("stats file %s: %s", path, errno_name(errno));
    close(f);
    // Its folder (the test's scratch folder) must be reachable too; the
    // folder above it (/tmp) is left as it is: 1777 already lets anyone
    // through, and a chmod there would take its sticky bit away.
    std::string dir = path;
    dir.resize(dir.rfind('/'));
    chmod(dir.c_str(), 0755);
}

// A privilege-separated child (sshd's pattern): it chroots into an empty
// directory, becomes nobody, enters a seccomp filter and then uses the
// socket it inherited; then the parent itself drops to nobody and goes on.
// Every byte must arrive, no call of the library may hit the filter, and
// no map of the peer may be left.
void privilege(int *fd, const Options &opt) {
    if (geteuid() != 0) skip("privilege changes need root");
    const int s = *fd;
    std::uint64_t seed = seed_of(opt, 40);
    echo_round(s, s, 200000, seed++);
    char root[] = "/tmp/sdirect-chroot-XXXXXX";
    if (!mkdtemp(root)) fail("mkdtemp: %s", errno_name(errno));
    std::fflush(stdout);
    const pid_t kid = fork();
    if (kid < 0) fail("fork: %s", errno_name(errno));
    if (kid == 0) {
        if (chroot(root) != 0 || chdir("/") != 0) fail("chroot: %s", errno_name(errno));
        if (setgroups(0, nullptr) != 0 || setgid(kNobody) != 0 || setuid(kNobody) != 0)
            fail("dropping to nobody: %s", errno_name(errno));
        forbid_socket_calls();
        for (int i = 0; i < 3; ++i) echo_round(s, s, 300000, seed + std::uint64_t(i));
        std::fflush(stdout);
        _exit(0);
    }
    int status = 0;
    if (waitpid(kid, &status, 0) != kid) fail("waitpid: %s", errno_name(errno));
    rmdir(root);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGSYS)
        fail("the child in its seccomp filter was killed: a forbidden call was made for it");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the privilege-separated child ended with status 0x%x", unsigned(status));
    seed += 3;
    echo_round(s, s, 200000, seed++);
    stats_for_nobody();
    if (setgroups(0, nullptr) != 0 || setgid(kNobody) != 0 || setuid(kNobody) != 0)
        fail("dropping to nobody: %s", errno_name(errno));
    expect_no_peer_maps();
    for (int i = 0; i < 3; ++i) echo_round(s, s, 1u << 20, seed++);
    send_exit(s);
    close(s);
    *fd = -1;
}

// An allow-list seccomp filter like a privilege-separated network child's
// (OpenSSH's pre-auth sandbox): read, write, poll and select, and what
// memory, time, futexes and exit need; any other call kills the process.
// A library that carried the child's write as sendmsg, or made a call of
// its own, would end it with SIGSYS.
void allow_only_plain_io() {
    static const int allowed[] = {
        __NR_read, __NR_write, __NR_poll, __NR_ppoll, __NR_select, __NR_pselect6,
        __NR_close, __NR_exit, __NR_exit_group, __NR_futex, __NR_brk, __NR_mmap,
        __NR_munmap, __NR_mremap, __NR_madvise, __NR_mprotect, __NR_clock_gettime,
        __NR_clock_nanosleep, __NR_nanosleep, __NR_gettimeofday, __NR_getpid,
        __NR_getrandom, __NR_rt_sigprocmask, __NR_rt_sigreturn, __NR_shutdown,
    };
    constexpr std::uint8_t n = sizeof allowed / sizeof allowed[0];
    std::vector<sock_filter> code = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
    };
    // Each match jumps past the rest and the kill, to the allow.
    for (std::uint8_t i = 0; i < n; ++i)
        code.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, std::uint32_t(allowed[i]),
                                std::uint8_t(n - i), 0));
    code.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));
    code.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    sock_fprog prog{std::uint16_t(code.size()), code.data()};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail("PR_SET_NO_NEW_PRIVS: %s", errno_name(errno));
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0)
        fail("PR_SET_SECCOMP: %s", errno_name(errno));
}

// write() until all of it went, as a program in that filter must.
void write_only_all(int fd, const void *buf, std::size_t len) {
    const auto *p = static_cast<const char *>(buf);
    for (std::size_t done = 0; done < len;) {
        ssize_t n = write(fd, p + done, len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fail("write of %zu bytes: %s", len, n < 0 ? errno_name(errno) : "0");
        done += std::size_t(n);
    }
}

// One echo round of `size` bytes with write, poll and read alone.
void plain_echo_round(int s, std::uint64_t size, std::uint64_t seed) {
    Cmd cmd;
    cmd.op = Op::echo;
    cmd.size = size;
    cmd.seed = seed;
    cmd.seed2 = seed + 1;
    cmd.chunk = 4096;
    pollfd p{s, POLLOUT, 0};
    if (poll(&p, 1, 5000) != 1 || !(p.revents & POLLOUT))
        fail("sandboxed: the connection is not writable (revents 0x%x)", unsigned(p.revents));
    write_only_all(s, &cmd, sizeof cmd);
    send_pattern(s, Tx::write, seed, size, 4096, 0);
    p = {s, POLLIN, 0};
    if (poll(&p, 1, 5000) != 1 || !(p.revents & POLLIN))
        fail("sandboxed: no echo within 5 s (revents 0x%x)", unsigned(p.revents));
    recv_pattern(s, Rx::read, seed + 1, size, 4096, "sandboxed echo");
}

// sshd's pre-auth child: chroot, nobody, then a filter that allows plain
// read, write and poll only. Every byte must arrive both ways, and the
// child must end by itself.
void sandbox(int *fd, const Options &opt) {
    if (geteuid() != 0) skip("privilege changes need root");
    const int s = *fd;
    std::uint64_t seed = seed_of(opt, 50);
    echo_round(s, s, 200000, seed++);
    char root[] = "/tmp/sdirect-chroot-XXXXXX";
    if (!mkdtemp(root)) fail("mkdtemp: %s", errno_name(errno));
    std::fflush(stdout);
    const pid_t kid = fork();
    if (kid < 0) fail("fork: %s", errno_name(errno));
    if (kid == 0) {
        if (chroot(root) != 0 || chdir("/") != 0) fail("chroot: %s", errno_name(errno));
        if (setgroups(0, nullptr) != 0 || setgid(kNobody) != 0 || setuid(kNobody) != 0)
            fail("dropping to nobody: %s", errno_name(errno));
        allow_only_plain_io();
        for (int i = 0; i < 3; ++i) plain_echo_round(s, 300000, seed + 2 * std::uint64_t(i));
        _exit(0);
    }
    int status = 0;
    if (waitpid(kid, &status, 0) != kid) fail("waitpid: %s", errno_name(errno));
    rmdir(root);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGSYS)
        fail("the child in its read/write/poll filter was killed (SIGSYS): a call it did not "
             "make was made for it");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the sandboxed child ended with status 0x%x", unsigned(status));
    seed += 6;
    for (int i = 0; i < 2; ++i) echo_round(s, s, 200000, seed++);
    send_exit(s);
    close(s);
    *fd = -1;
}

void send_fd(int u, int fd) {
    char tag = 'F';
    iovec v{&tag, 1};
    alignas(cmsghdr) char cb[CMSG_SPACE(sizeof(int))] = {};
    msghdr m{};
    m.msg_iov = &v;
    m.msg_iovlen = 1;
    m.msg_control = cb;
    m.msg_controllen = sizeof cb;
    cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(h), &fd, sizeof fd);
    if (sendmsg(u, &m, 0) != 1) fail("sendmsg(SCM_RIGHTS): %s", errno_name(errno));
}

int recv_fd(int u) {
    char tag = 0;
    iovec v{&tag, 1};
    alignas(cmsghdr) char cb[CMSG_SPACE(sizeof(int))] = {};
    msghdr m{};
    m.msg_iov = &v;
    m.msg_iovlen = 1;
    m.msg_control = cb;
    m.msg_controllen = sizeof cb;
    if (recvmsg(u, &m, 0) != 1) fail("recvmsg(SCM_RIGHTS): %s", errno_name(errno));
    cmsghdr *h = CMSG_FIRSTHDR(&m);
    if (!h || h->cmsg_type != SCM_RIGHTS) fail("recvmsg: no fd came");
    int fd;
    std::memcpy(&fd, CMSG_DATA(h), sizeof fd);
    return fd;
}

// A connection handed to another process (a program started with the
// same environment, so preloaded when we are): it takes the stream over
// where we left it and ends the session; we close our copy at once, as a
// hand-off does. Nothing may be lost either way, and our close must not
// end the stream.
void hand_off(int *fd, const Options &opt) {
    const int s = *fd;
    const std::uint64_t seed = seed_of(opt, 50);
    echo_round(s, s, 300000, seed);
    int u[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, u) != 0) fail("socketpair: %s", errno_name(errno));
    // Only the Unix socket goes to the helper; the connection comes through it.
    if (fcntl(s, F_SETFD, FD_CLOEXEC) != 0 || fcntl(u[1], F_SETFD, 0) != 0)
        fail("fcntl(F_SETFD): %s", errno_name(errno));
    const std::string unix_fd = std::to_string(u[1]), seed_text = std::to_string(seed + 1);
    char self[] = "/proc/self/exe";
    char *args[] = {self, const_cast<char *>("fd-helper"), const_cast<char *>("--unix"),
                    const_cast<char *>(unix_fd.c_str()), const_cast<char *>("--seed"),
                    const_cast<char *>(seed_text.c_str()), nullptr};
    std::fflush(stdout);
    pid_t kid = 0;
    if (posix_spawn(&kid, self, nullptr, nullptr, args, environ) != 0) fail("posix_spawn: %s", errno_name(errno));
    close(u[1]);
    send_fd(u[0], s);
    close(s);
    *fd = -1;
    int status = 0;
    if (waitpid(kid, &status, 0) != kid) fail("waitpid: %s", errno_name(errno));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the process the connection was handed to ended with status 0x%x", unsigned(status));
    close(u[0]);
}

// A stdio stream over (a dup of) the connection: its reads and writes are
// the library's (the connection stays direct); the socket's other fd goes
// on after fclose.
void stdio_stream(int s, const Options &opt) {
    std::uint64_t seed = seed_of(opt, 60);
    echo_round(s, s, 300000, seed++);
    const int d = dup(s);
    FILE *f = d < 0 ? nullptr : fdopen(d, "r+");
    if (!f) fail("fdopen: %s", errno_name(errno));
    Watch watch(20, "stdio on the connection");
    Cmd cmd;
    cmd.op = Op::recv;
    cmd.api = std::uint32_t(Rx::recv);
    cmd.size = 200000;
    cmd.seed = seed;
    send_cmd(s, cmd);
    std::vector<char> buf(cmd.size);
    pattern_fill(seed++, 0, buf.data(), buf.size());
    if (std::fwrite(buf.data(), 1, buf.size(), f) != buf.size() || std::fflush(f) != 0)
        fail("fwrite to the connection: %s", errno_name(errno));
    count_tx(s, cmd.size);
    if (std::fgetc(f) != 'A') fail("fgetc: no ack after fwrite");
    order_send(s, 150000, seed, 0, false);
    std::vector<char> in(150000);
    if (std::fread(in.data(), 1, in.size(), f) != in.size()) fail("fread from the connection: short");
    pattern_expect(seed++, 0, in.data(), in.size(), "fread from the connection");
    count_rx(s, in.size());
    std::fclose(f);
    echo_round(s, s, 300000, seed++);
}

// Raw syscalls on the connection, which no interposer sees: right only in
// a process that runs the library with SDIRECT_ENABLE=0 (or without it).
void raw_syscalls(int s, const Options &opt) {
    std::uint64_t seed = seed_of(opt, 70);
    Watch watch(20, "raw syscalls on the connection");
    Cmd cmd;
    cmd.op = Op::recv;
    cmd.api = std::uint32_t(Rx::recv);
    cmd.size = 100000;
    cmd.seed = seed;
    send_cmd(s, cmd);
    std::vector<char> buf(cmd.size);
    pattern_fill(seed++, 0, buf.data(), buf.size());
    for (std::size_t at = 0; at < buf.size();) {
        const long n = syscall(SYS_write, s, buf.data() + at, buf.size() - at);
        if (n <= 0) fail("SYS_write: %ld (%s)", n, errno_name(errno));
        at += std::size_t(n);
    }
    char ack = 0;
    if (syscall(SYS_read, s, &ack, 1) != 1 || ack != 'A') fail("SYS_read: no ack");
    order_send(s, 80000, seed, 0, false);
    for (std::size_t at = 0; at < 80000;) {
        const long n = syscall(SYS_read, s, buf.data() + at, 80000 - at);
        if (n <= 0) fail("SYS_read: %ld (%s)", n, errno_name(errno));
        at += std::size_t(n);
    }
    pattern_expect(seed++, 0, buf.data(), 80000, "SYS_read");
    echo_round(s, s, 100000, seed++);
}

}  // namespace

int run_fd_helper(const Options &opt) {
    const int u = int(opt.num("unix", 0));
    const std::uint64_t seed = opt.num("seed", 1);
    const int s = recv_fd(u);
    for (int i = 0; i < 3; ++i) echo_round(s, s, 300000, seed + 2 * std::uint64_t(i));
    send_exit(s);
    close(s);
    close(u);
    return 0;
}

void drive_bypass(int *fd, const Options &opt) {
    const std::string part = part_of_conn(opt);
    if (part == "sendfile-nonblock") nonblocking_sendfile(*fd, opt);
    else if (part == "splice-nonblock") nonblocking_splice(*fd, opt);
    else if (part == "close-range") close_ranges(fd, opt);
    else if (part == "mmsg") mmsgs(*fd, opt);
    else if (part == "privilege") privilege(fd, opt);
    else if (part == "sandbox") sandbox(fd, opt);
    else if (part == "hand-off") hand_off(fd, opt);
    else if (part == "stdio") stdio_stream(*fd, opt);
    else if (part == "raw-syscall") raw_syscalls(*fd, opt);
    else fail("bypass: unknown --part '%s'", part.c_str());
    if (*fd >= 0) send_exit(*fd);
}

}  // namespace peer
