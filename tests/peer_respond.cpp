// The responder: the passive end of every two-process scenario. It obeys
// the commands the driver puts in the stream and checks every byte it
// receives; a wrong byte ends the process with exit 1.
#include "peer_common.hpp"
#include "peer_pingpong.hpp"
#include "peer_records.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <csignal>
#include <cstring>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace peer {

namespace {

struct AddrPair {
    std::uint32_t local_len;
    std::uint32_t peer_len;
    sockaddr_storage local;
    sockaddr_storage peer;
};

void send_sockinfo(int fd) {
    AddrPair info{};
    socklen_t len = sizeof info.local;
    if (getsockname(fd, reinterpret_cast<sockaddr *>(&info.local), &len) != 0)
        fail("responder getsockname: %s", errno_name(errno));
    info.local_len = len;
    len = sizeof info.peer;
    if (getpeername(fd, reinterpret_cast<sockaddr *>(&info.peer), &len) != 0)
        fail("responder getpeername: %s", errno_name(errno));
    info.peer_len = len;
    write_all(fd, &info, sizeof info);
}

// What the driver's side sends back is our own stream, after our FIN:
// everything, then EOF (a program that copies its input to its output).
void echo_to_eof(int fd, const Cmd &cmd) {
    std::thread sender([&] {
        send_pattern(fd, Tx::send, cmd.seed, cmd.size, cmd.chunk, 0);
        if (shutdown(fd, SHUT_WR) != 0) fail("shutdown(SHUT_WR): %s", errno_name(errno));
    });
    recv_pattern(fd, Rx::recv, cmd.seed, cmd.size, cmd.chunk, "echo of our stream");
    sender.join();
    expect_eof(fd, "after the echo of our stream");
    expect_eof(fd, "second recv after the echo of our stream");
}

int term_exit_code = 0;
void on_term(int) { _exit(term_exit_code); }

[[noreturn]] void hang() {
    // The harness left SIGTERM at SIG_DFL: the program must see just that,
    // whatever the library put in its place.
    struct sigaction sa{};
    if (sigaction(SIGTERM, nullptr, &sa) != 0 || sa.sa_handler != SIG_DFL)
        fail("SIGTERM is not SIG_DFL as the program sees it");
    // PEER_TERM_EXIT=N: our own handler, installed now, ends with exit N.
    if (const char *code = std::getenv("PEER_TERM_EXIT"); code && *code) {
        term_exit_code = std::atoi(code);
        if (signal(SIGTERM, on_term) != SIG_DFL) fail("signal(SIGTERM) did not return SIG_DFL");
    }
    note("ready");
    // The harness kills this process; the bound only matters if it never does.
    for (int i = 0; i < 600; ++i) sleep_us(100000);
    fail("hang: nobody killed this process within 60 s");
}

// A server that forks per connection: the parent closes its copy and
// waits for the child, which goes on with the connection (after a pause,
// so that the parent's close has left the fabric by then).
void hand_off(int fd, const Cmd &cmd) {
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) fail("fork: %s", errno_name(errno));
    if (pid == 0) {
        arm_watchdog(20);
        sleep_us(cmd.size2);
        return;
    }
    close(fd);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    std::fflush(stdout);
    // exit, not _exit: this process's statistics are written too.
    std::exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

// The owner of the connection dies while a child it forked holds the
// socket: under TCP the child simply goes on with it.
void fork_die(int fd, const Cmd &cmd) {
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) fail("fork: %s", errno_name(errno));
    if (pid > 0) raise(SIGKILL);
    arm_watchdog(20);
    sleep_us(cmd.size2);
    char c;
    ssize_t n;
    do n = recv(fd, &c, 1, MSG_PEEK);
    while (n < 0 && errno == EINTR);
    if (n < 0 && errno == ECONNRESET) {
        note("holder: reset");
        std::fflush(stdout);
        _exit(0);
    }
    if (n != 1) fail("holder: recv(MSG_PEEK) returned %zd (%s)", n, n < 0 ? errno_name(errno) : "EOF");
    note("holder: goes on");
}

}  // namespace

void respond(int *fd) {
    for (int count = 0; count < 1000000; ++count) {
        Cmd cmd;
        if (!read_all_or_eof(*fd, &cmd, sizeof cmd, "command")) return;
        if (cmd.magic != kCmdMagic) fail("stream out of step: bad command magic 0x%08x",
                                         unsigned(cmd.magic));
        if (cmd.flags & kSmallRcvbuf) {
            int size = 65536;
            if (setsockopt(*fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size) != 0)
                fail("setsockopt(SO_RCVBUF): %s", errno_name(errno));
        }
        if (cmd.pre_delay_us) sleep_us(cmd.pre_delay_us);
        switch (cmd.op) {
        case Op::exit:
            return;
        case Op::send:
            if (cmd.flags & kWhole) send_whole(*fd, cmd.seed, cmd.size);
            else send_pattern(*fd, Tx(cmd.api), cmd.seed, cmd.size, cmd.chunk, cmd.gap_us);
            break;
        case Op::recv:
            recv_pattern(*fd, Rx(cmd.api), cmd.seed, cmd.size, cmd.chunk, "responder recv");
            if (!(cmd.flags & kNoAck)) write_all(*fd, "A", 1);
            break;
        case Op::echo:
            recv_pattern(*fd, Rx::read, cmd.seed, cmd.size, cmd.chunk, "responder echo");
            if (cmd.flags & kWhole) send_whole(*fd, cmd.seed2, cmd.size);
            else send_pattern(*fd, Tx::write, cmd.seed2, cmd.size, cmd.chunk, 0);
            break;
        case Op::duplex: {
            int out = *fd;
            std::thread sender([&] {
                send_pattern(out, Tx::send, cmd.seed2, cmd.size2, cmd.chunk, 0);
            });
            recv_pattern(*fd, Rx::recv, cmd.seed, cmd.size, cmd.chunk, "responder duplex");
            sender.join();
            write_all(*fd, "A", 1);
            break;
        }
        case Op::pingpong:
            pingpong(*fd, false, cmd.seed, cmd.size, cmd.chunk);
            break;
        case Op::recv_eof:
            recv_pattern(*fd, Rx(cmd.api), cmd.seed, cmd.size, cmd.chunk,
                         "data before shutdown");
            expect_eof(*fd, "recv after peer shutdown(SHUT_WR)");
            expect_eof(*fd, "second recv after peer shutdown(SHUT_WR)");
            send_pattern(*fd, Tx::send, cmd.seed2, cmd.size2, cmd.chunk, 0);
            report_bytes(*fd);
            close(*fd);
            *fd = -1;
            return;
        case Op::send_shut:
            send_pattern(*fd, Tx(cmd.api), cmd.seed, cmd.size, cmd.chunk, 0);
            if (shutdown(*fd, SHUT_WR) != 0) fail("shutdown(SHUT_WR): %s", errno_name(errno));
            break;
        case Op::send_close:
            send_pattern(*fd, Tx(cmd.api), cmd.seed, cmd.size, cmd.chunk, 0);
            report_bytes(*fd);
            close(*fd);
            *fd = -1;
            // Stay alive: the driver must see a closed socket, not a dead process.
            sleep_us(cmd.size2 * 1000);
            return;
        case Op::hang:
            hang();
        case Op::send_die: {
            // Dies in the middle of its sends (a zero-copy one may be
            // advertised or being written right then).
            int out = *fd;
            std::thread sender([&] {
                send_pattern(out, Tx(cmd.api), cmd.seed, cmd.size, cmd.chunk, 0);
            });
            sender.detach();
            sleep_us(cmd.size2);
            kill(getpid(), SIGKILL);
            for (;;) pause();
        }
        case Op::send_exit: {
            // exit() while another thread is in the middle of its sends
            // (inside the library, maybe inside the provider): the peer
            // must see the stream end, never hang.
            const int out = *fd;
            std::thread sender([out, cmd] {
                std::vector<char> buf(cmd.chunk);
                for (std::uint64_t off = 0; off < cmd.size;) {
                    const std::size_t n = std::size_t(std::min<std::uint64_t>(cmd.chunk, cmd.size - off));
                    pattern_fill(cmd.seed, off, buf.data(), n);
                    ssize_t sent = send(out, buf.data(), n, MSG_NOSIGNAL);
                    if (sent < 0 && errno == EINTR) continue;
                    if (sent <= 0) return;
                    off += std::uint64_t(sent);
                }
            });
            sender.detach();
            sleep_us(cmd.size2);
            std::fflush(stdout);
            std::exit(0);
        }
        case Op::recv_die:
            recv_pattern(*fd, Rx::recv, cmd.seed, cmd.size2, cmd.chunk, "before dying");
            kill(getpid(), SIGKILL);
            for (;;) pause();
        case Op::sockinfo:
            send_sockinfo(*fd);
            break;
        case Op::records_in:
            receive_records(*fd, cmd);
            break;
        case Op::records_out:
            stream_records(*fd, cmd);
            break;
        case Op::echo_eof:
            echo_to_eof(*fd, cmd);
            report_bytes(*fd);
            close(*fd);
            *fd = -1;
            return;
        case Op::urgent:
            respond_urgent(*fd, cmd);
            break;
        case Op::linger_close:
            respond_linger_close(fd, cmd);
            return;
        case Op::handoff:
            hand_off(*fd, cmd);
            break;
        case Op::fork_die:
            fork_die(*fd, cmd);
            break;
        case Op::unread_hang:
            // The rest of the stream stays unread in this end's receive
            // queue; the bytes sent meanwhile let a connection that started
            // on TCP earn its upgrade.
            recv_pattern(*fd, Rx::recv, cmd.seed, cmd.size2, 65536, "before leaving the rest");
            // Twice, 500 ms apart: the first round earns the upgrade (the
            // engine is built meanwhile), a call of the second makes it.
            for (int round = 0; round < 2; ++round) {
                if (round) sleep_us(500000);
                for (std::uint32_t i = 0; i < cmd.chunk; ++i) {
                    write_all(*fd, "x", 1);
                    sleep_us(2000);
                }
            }
            note("ready");
            std::fflush(stdout);
            for (;;) pause();
        case Op::await_reset: {
            char b;
            const ssize_t n = recv(*fd, &b, 1, 0);
            const int err = errno;
            if (n != -1 || err != ECONNRESET)
                fail("recv while the peer disconnected: %zd (%s), expected ECONNRESET", n,
                     n < 0 ? errno_name(err) : "-");
            close(*fd);
            *fd = -1;
            return;
        }
        case Op::shut_close:
            if (shutdown(*fd, SHUT_RDWR) != 0) fail("shutdown(SHUT_RDWR): %s", errno_name(errno));
            close(*fd);
            *fd = -1;
            sleep_us(cmd.size2 * 1000);
            return;
        case Op::shut_idle:
            // The process makes no socket call while the driver sends to
            // its end: whatever answers the driver's bytes, no thread of
            // its application does.
            if (shutdown(*fd, SHUT_RDWR) != 0) fail("shutdown(SHUT_RDWR): %s", errno_name(errno));
            sleep_us(cmd.size2 * 1000);
            close(*fd);
            *fd = -1;
            return;
        default:
            fail("unknown command %u", unsigned(cmd.op));
        }
    }
    fail("responder: command limit reached");
}

}  // namespace peer
