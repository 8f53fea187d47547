// Cases: stdio on a connection (fdopen(3), fprintf, fgets, fread, getline,
// ftell, fileno, fclose, setvbuf) and dprintf(3): what each call returns,
// the stream's error and end flags, errno, the bytes the peer gets, and
// SIGPIPE, as glibc's own streams over the kernel socket give them.
#include "conform.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace conform {
namespace {

// What arrives on `fd` until `want` bytes came or 2 s pass without any.
std::string recv_until(int fd, std::size_t want) {
    std::string got;
    while (got.size() < want && poll1(fd, POLLIN, 2000) > 0) {
        char buf[65536];
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        got.append(buf, std::size_t(n));
    }
    return got;
}

// Lines and bytes both ways through a stream over a dup of one end; the
// end's own fd goes on after fclose.
void stream_both_ways(Out &o) {
    Pair p = make_pair();
    const int d = ::dup(p.a);
    FILE *f = ::fdopen(d, "r+");
    o.n("stream", f != nullptr);
    if (!f) {
        p.close_both();
        return;
    }
    o.n("fileno_is_dup", ::fileno(f) == d);
    const long head = o.r("fprintf", std::fprintf(f, "line %d of %s\n", 1, "stdio"));
    o.r("fputs", std::fputs("second line\n", f));
    const std::string big = pattern(100000, 7);
    o.r("fwrite", long(std::fwrite(big.data(), 1, big.size(), f)));
    o.r("fflush", std::fflush(f));
    const std::size_t want = std::size_t(head > 0 ? head : 0) + 12 + big.size();
    const std::string got = recv_until(p.b, want);
    o.bytes("peer_got", got.data(), got.size());
    const char lines[] = "alpha\nbeta\ngamma without end";
    o.r("peer_send", ::send(p.b, lines, sizeof lines - 1, MSG_NOSIGNAL));
    o.r("peer_shutdown", ::shutdown(p.b, SHUT_WR));
    char line[64];
    if (std::fgets(line, sizeof line, f)) o.bytes("fgets1", line, std::strlen(line));
    else o.s("fgets1", "NULL");
    char *dyn = nullptr;
    size_t cap = 0;
    o.r("getline", long(::getline(&dyn, &cap, f)));
    if (dyn) o.bytes("getline_text", dyn, std::strlen(dyn));
    char rest[64] = {};
    o.r("fread", long(std::fread(rest, 1, sizeof rest - 1, f)));
    o.bytes("fread_text", rest, std::strlen(rest));
    o.n("feof", std::feof(f) != 0);
    o.n("ferror", std::ferror(f) != 0);
    errno = 0;  // at the end, getline sets no errno of its own
    o.r("getline_at_end", long(::getline(&dyn, &cap, f)));
    std::free(dyn);
    o.r("ftell", std::ftell(f));
    o.r("fclose", std::fclose(f));
    // The stream's close closed the dup only.
    o.r("send_after_fclose", ::send(p.a, "z", 1, MSG_NOSIGNAL));
    char z = 0;
    o.r("peer_recv", ::recv(p.b, &z, 1, 0));
    o.r("fcntl_dup_closed", ::fcntl(d, F_GETFD));
    p.close_both();
}

// An unbuffered stream and a line-buffered one: each call's bytes reach
// the peer at once (no fflush).
void buffering_modes(Out &o) {
    Pair p = make_pair();
    FILE *f = ::fdopen(::dup(p.a), "w");
    o.r("setvbuf_unbuffered", std::setvbuf(f, nullptr, _IONBF, 0));
    o.r("fputs", std::fputs("now", f));
    char buf[16] = {};
    o.r("peer_recv", ::recv(p.b, buf, sizeof buf - 1, 0));
    o.s("peer_text", buf);
    FILE *g = ::fdopen(::dup(p.a), "w");
    o.r("setvbuf_line", std::setvbuf(g, nullptr, _IOLBF, 256));
    o.r("fputs_partial", std::fputs("held", g));
    o.r("peer_poll_nothing", poll1(p.b, POLLIN, 100));
    o.r("fputs_newline", std::fputs(" then\n", g));
    std::memset(buf, 0, sizeof buf);
    o.r("peer_recv_line", ::recv(p.b, buf, sizeof buf - 1, 0));
    o.bytes("peer_line", buf, std::strlen(buf));
    o.r("fclose_f", std::fclose(f));
    o.r("fclose_g", std::fclose(g));
    p.close_both();
}

// Writing a stream to a peer that closed: the first flush goes out (TCP
// takes it), a later one fails with EPIPE and SIGPIPE, the stream's error
// flag set; fclose then reports the failed flush of what is left.
void write_to_closed_peer(Out &o) {
    Pair p = make_pair();
    FILE *f = ::fdopen(::dup(p.a), "w");
    ::close(p.b);
    p.b = -1;
    msleep(50);
    sigpipes_taken();
    o.r("fputs1", std::fputs("first", f));
    o.r("fflush1", std::fflush(f));
    msleep(50);
    o.r("fputs2", std::fputs("second", f));
    o.r("fflush2", std::fflush(f));
    o.n("ferror", std::ferror(f) != 0);
    o.n("sigpipes", sigpipes_taken());
    std::clearerr(f);
    o.r("fputs3", std::fputs("third", f));
    o.r("fclose", std::fclose(f));
    o.n("sigpipes_at_close", sigpipes_taken());
    p.close_both();
}

// dprintf and vdprintf's checked form (this build may use either): the
// count, and the bytes.
void dprintf_to_socket(Out &o) {
    Pair p = make_pair();
    const long small = o.r("dprintf", ::dprintf(p.a, "%s=%d;%05.1f|%c", "key", 42, 3.14159, 'x'));
    std::string big;
    for (int i = 0; big.size() < 20000; ++i) big += "record " + std::to_string(i) + ";";
    o.r("dprintf_big", ::dprintf(p.a, "%s", big.c_str()));
    const std::size_t want = std::size_t(small > 0 ? small : 0) + big.size();
    const std::string got = recv_until(p.b, want);
    o.bytes("peer_got", got.data(), got.size());
    ::close(p.b);
    p.b = -1;
    msleep(50);
    sigpipes_taken();
    o.r("dprintf_closed1", ::dprintf(p.a, "one"));
    msleep(50);
    o.r("dprintf_closed2", ::dprintf(p.a, "two"));
    o.n("sigpipes", sigpipes_taken());
    p.close_both();
}

// fdopen's own checks: a bad mode, a closed fd; "a" on a socket.
void fdopen_arguments(Out &o) {
    Pair p = make_pair();
    FILE *bad = ::fdopen(p.a, "z");
    o.r("bad_mode", bad ? 0 : -1);
    FILE *closed = ::fdopen(987, "r");
    o.r("closed_fd", closed ? 0 : -1);
    FILE *app = ::fdopen(::dup(p.a), "a");
    o.n("append_stream", app != nullptr);
    if (app) {
        o.r("fputs", std::fputs("appended", app));
        o.r("fclose", std::fclose(app));
        char buf[16] = {};
        o.r("peer_recv", ::recv(p.b, buf, sizeof buf - 1, 0));
        o.s("peer_text", buf);
    }
    p.close_both();
}

}  // namespace

void add_stdio_cases(std::vector<Case> &all) {
    add(all, "stdio-both-ways", stream_both_ways);
    add(all, "stdio-buffering", buffering_modes);
    add(all, "stdio-closed-peer", write_to_closed_peer);
    add(all, "stdio-dprintf", dprintf_to_socket);
    add(all, "stdio-fdopen-arguments", fdopen_arguments);
}

}  // namespace conform
