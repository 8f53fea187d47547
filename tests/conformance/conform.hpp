// The differential conformance suite: a catalogue of socket calls whose
// every observable result (return value, errno, bytes received, poll and
// epoll revents, option values, signals) is printed, one line per case.
// Run once plainly and once with both ends preloaded: the two outputs must
// be identical (run.sh compares them, with known_differences.txt).
//
// Every case makes its own connections; under the library each connection
// is waited on until its process page slot says direct, and the mode each
// case ran in goes to a separate file (--modes), never to the compared
// output.
#pragma once
#include <cstddef>
#include <string>
#include <sys/types.h>
#include <vector>

namespace conform {

// One case's output, built up as the case runs and printed as one line.
class Out {
public:
    // "label=ret" or "label=-1/ENAME"; reads errno first, before anything
    // else can touch it (the call is the argument, evaluated before).
    long r(const char *label, long ret);
    void s(const char *label, const std::string &value);
    void n(const char *label, long value);
    // Received bytes: printable text as is, others as \xNN; long runs as
    // their length and a checksum.
    void bytes(const char *label, const void *data, std::size_t len);
    void revents(const char *label, int events);   // poll bits by name
    void epevents(const char *label, unsigned events);
    const std::string &text() const { return text_; }

private:
    void sep();
    std::string text_;
};

// Both ends of a TCP connection over 127.0.0.1, in this process.
struct Pair {
    int a = -1;  // the connecting end
    int b = -1;  // the accepted end
    void close_both();
};

// Makes a connected pair, exchanges one byte each way (not printed), and
// under the library waits until both ends are direct. Records the pair's
// mode for the case. a_flags / b_flags: SOCK_NONBLOCK applied after setup.
Pair make_pair();
// A listener on 127.0.0.1, port chosen by the kernel; its port in *port.
int make_listener(unsigned short *port, int backlog = 8);
// Connects a fresh socket to 127.0.0.1:port (blocking).
int connect_to(unsigned short port);
// One byte each way between the two ends of a connection (in this process),
// the wait for direct mode under the library, and one byte each way again.
void handshake(int x, int y);
// Waits (bounded) until fd is direct, under the library; records the mode.
void note_mode(int fd);
// A port on which nothing listens.
unsigned short dead_port();

// Helpers.
void set_nonblock(int fd, bool on);
// Sends until EAGAIN (non-blocking, bounded at 256 MiB); the byte count.
long fill(int fd);
// Reads until EOF, EAGAIN-after-timeout or error (poll 2 s per wait);
// appends to *into. Returns the last recv result (0 EOF, -errno).
long drain(int fd, std::string *into, int timeout_ms = 2000);
int poll1(int fd, short events, int timeout_ms);
// A temporary regular file filled with n bytes of a known pattern.
int temp_file(std::size_t n);
std::string pattern(std::size_t n, unsigned seed = 0);
// SIGPIPE deliveries since the last call.
int sigpipes_taken();
void msleep(int ms);
// Runs fn in a forked child (alarm'd); returns its exit status code, or
// 128+signal. The child ends with _exit(fn()).
int in_child(int (*fn)(void *), void *arg);

using CaseFn = void (*)(Out &);
struct Case {
    const char *name;
    CaseFn fn;
};
void add(std::vector<Case> &all, const char *name, CaseFn fn);

// Catalogue parts.
void add_fd_cases(std::vector<Case> &all);
void add_flag_cases(std::vector<Case> &all);
void add_iov_cases(std::vector<Case> &all);
void add_end_cases(std::vector<Case> &all);
void add_ready_cases(std::vector<Case> &all);
void add_opt_cases(std::vector<Case> &all);
void add_file_cases(std::vector<Case> &all);
void add_child_cases(std::vector<Case> &all);
void add_stdio_cases(std::vector<Case> &all);
void add_call_cases(std::vector<Case> &all);

}  // namespace conform
