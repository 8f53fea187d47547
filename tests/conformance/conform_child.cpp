// Cases whose other end is a forked child process: what a process that
// buffers, exits or waits on another channel may rely on (send(2),
// close(2), _exit(2)).
#include "conform.hpp"

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <poll.h>
#include <string>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace conform {
namespace {

struct Child {
    pid_t pid = -1;
    int sock = -1;    // this process's end
    int to_child = -1;    // pipe: this process -> child
    int from_child = -1;  // pipe: child -> this process
};

using ChildFn = int (*)(int sock, int from_parent, int to_parent);

// Forks a child that connects to this process, exchanges one byte each
// way, then runs fn; here the accepted end is waited on until direct.
Child fork_peer(ChildFn fn) {
    unsigned short port;
    const int l = make_listener(&port);
    int down[2], up[2];
    if (::pipe(down) != 0 || ::pipe(up) != 0) std::abort();
    Child c;
    c.pid = ::fork();
    if (c.pid == 0) {
        ::alarm(8);
        ::close(down[1]);
        ::close(up[0]);
        ::close(l);
        const int s = connect_to(port);
        char h;
        ::send(s, "h", 1, 0);
        ::recv(s, &h, 1, MSG_WAITALL);
        ::_exit(fn(s, down[0], up[1]));
    }
    ::close(down[0]);
    ::close(up[1]);
    c.to_child = down[1];
    c.from_child = up[0];
    c.sock = ::accept(l, nullptr, nullptr);
    ::close(l);
    char h;
    ::recv(c.sock, &h, 1, MSG_WAITALL);
    ::send(c.sock, "h", 1, 0);
    note_mode(c.sock);
    return c;
}

// Waits for the child; its exit status as text.
std::string finish(Child &c) {
    int st = 0;
    while (::waitpid(c.pid, &st, 0) < 0 && errno == EINTR) {}
    ::close(c.to_child);
    ::close(c.from_child);
    return WIFEXITED(st) ? "exit " + std::to_string(WEXITSTATUS(st))
                         : std::string("signal ") + sigabbrev_np(WTERMSIG(st));
}

// ---- a blocking send whose reader starts only when told to -------------------------

constexpr std::size_t kBig = 128 * 1024;

int read_when_told(int sock, int from_parent, int) {
    char go;
    if (::read(from_parent, &go, 1) != 1) return 3;
    std::string got(kBig, '\0');
    if (::recv(sock, got.data(), kBig, MSG_WAITALL) != ssize_t(kBig)) return 4;
    return got == pattern(kBig, 11) ? 0 : 5;
}

void send_then_tell(Out &o) {
    Child c = fork_peer(read_when_told);
    const std::string data = pattern(kBig, 11);
    o.r("send", ::send(c.sock, data.data(), data.size(), 0));
    o.r("tell", ::write(c.to_child, "g", 1));
    o.s("child", finish(c));
    ::close(c.sock);
}

// ---- what a sender accepted is delivered after it exits ---------------------------

template <bool Close>
int fill_and_leave(int sock, int, int to_parent) {
    set_nonblock(sock, true);
    long total = fill(sock);
    // A few more once the buffer looked full: each accepted byte counts.
    for (int i = 0; i < 3; ++i) {
        msleep(20);
        const long more = fill(sock);
        if (more > 0) total += more;
    }
    ::write(to_parent, &total, sizeof total);
    if (Close) ::close(sock);
    return 0;
}

template <bool Close>
void sender_leaves(Out &o) {
    Child c = fork_peer(fill_and_leave<Close>);
    long total = -1;
    o.r("told", ::read(c.from_child, &total, sizeof total));
    o.s("child", finish(c));
    std::string got;
    o.r("drain", drain(c.sock, &got));
    o.s("all-delivered", long(got.size()) == total ? "yes" : "no");
    ::close(c.sock);
}

// ---- a non-blocking sender that waits by sleeping, never polling -------------------

int sleep_and_retry(int sock, int from_parent, int to_parent) {
    set_nonblock(sock, true);
    const long total = fill(sock);
    ::write(to_parent, &total, sizeof total);
    char drained;
    if (::read(from_parent, &drained, 1) != 1) return 3;
    for (int i = 0; i < 100; ++i) {
        if (::send(sock, "z", 1, MSG_NOSIGNAL) == 1) return 0;
        msleep(20);
    }
    return 1;  // never resumed
}

void sleeper_resumes(Out &o) {
    Child c = fork_peer(sleep_and_retry);
    long total = -1;
    o.r("told", ::read(c.from_child, &total, sizeof total));
    std::string got;
    drain(c.sock, &got, 500);
    o.s("drained", long(got.size()) == total ? "yes" : "no");
    o.r("tell", ::write(c.to_child, "d", 1));
    char z = 0;
    o.revents("poll", poll1(c.sock, POLLIN, 3000));
    o.r("recv", ::recv(c.sock, &z, 1, MSG_DONTWAIT));
    o.bytes("data", &z, 1);
    o.s("child", finish(c));
    ::close(c.sock);
}

}  // namespace

void add_child_cases(std::vector<Case> &all) {
    add(all, "child-send-128k-then-tell", send_then_tell);
    add(all, "child-fill-then-exit", sender_leaves<false>);
    add(all, "child-fill-then-close", sender_leaves<true>);
    add(all, "child-eagain-sleeper", sleeper_resumes);
}

}  // namespace conform
