// Non-blocking sockets: the four ways to ask for it, EAGAIN on an empty
// and on a full connection, non-blocking connect (to a listener and to a
// closed port) and non-blocking accept.
#include "peer_ready.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

namespace peer {

namespace {

enum class How { fcntl_flag, fionbio, dontwait };

const char *how_name(How h) {
    switch (h) {
    case How::fcntl_flag: return "O_NONBLOCK";
    case How::fionbio: return "FIONBIO";
    case How::dontwait: return "MSG_DONTWAIT";
    }
    return "?";
}

void set_nonblocking(int fd, How how, bool on) {
    if (how == How::dontwait) return;
    if (how == How::fionbio) {
        int v = on;
        if (ioctl(fd, FIONBIO, &v) != 0) fail("ioctl(FIONBIO): %s", errno_name(errno));
    } else {
        const int fl = fcntl(fd, F_GETFL);
        if (fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK) != 0)
            fail("F_SETFL: %s", errno_name(errno));
    }
    if (bool(fcntl(fd, F_GETFL) & O_NONBLOCK) != on)
        fail("%s %d: F_GETFL disagrees", how_name(how), int(on));
}

bool is_eagain(ssize_t n, int err) { return n == -1 && (err == EAGAIN || err == EWOULDBLOCK); }

void expect_eagain(ssize_t n, int err, const char *what, const char *how) {
    if (!is_eagain(n, err))
        fail("%s with %s: returned %zd (%s), expected -1 EAGAIN", what, how, n,
             n < 0 ? errno_name(err) : n == 0 ? "EOF" : "data");
}

void expect_rc(const char *what, int rc, int err, int want_rc, int want_err) {
    if (rc == want_rc && (want_rc != -1 || err == want_err)) return;
    fail("%s: returned %d (%s), expected %d (%s)", what, rc, rc < 0 ? errno_name(err) : "-",
         want_rc, want_rc < 0 ? errno_name(want_err) : "-");
}

int so_error(int fd) {
    int v = -1;
    socklen_t len = sizeof v;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &v, &len) != 0)
        fail("getsockopt(SO_ERROR): %s", errno_name(errno));
    return v;
}

std::uint16_t port_of(int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len);
    return ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_port)
                                    : ntohs(reinterpret_cast<sockaddr_in *>(&ss)->sin_port);
}

int start_connect(int family, std::uint16_t port, const char *what) {
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) fail("socket: %s", errno_name(errno));
    sockaddr_storage ss;
    socklen_t len = loopback_addr(family, port, &ss);
    errno = 0;
    int rc = connect(fd, reinterpret_cast<sockaddr *>(&ss), len);
    expect_rc(what, rc, errno, -1, EINPROGRESS);
    return fd;
}

int connect_again(int fd, int family, std::uint16_t port) {
    sockaddr_storage ss;
    socklen_t len = loopback_addr(family, port, &ss);
    errno = 0;
    return connect(fd, reinterpret_cast<sockaddr *>(&ss), len);
}

}  // namespace

void drive_nonblock_io(int *fd, const Options &opt) {
    const int s = *fd;
    char buf[64];
    std::uint64_t k = 0;
    for (How how : {How::fcntl_flag, How::fionbio, How::dontwait}) {
        const char *hn = how_name(how);
        const int flags = how == How::dontwait ? MSG_DONTWAIT : 0;
        set_nonblocking(s, how, true);
        for (Rx rx : {Rx::read, Rx::recv, Rx::readv, Rx::recvmsg, Rx::recvfrom}) {
            if (how == How::dontwait && (rx == Rx::read || rx == Rx::readv)) continue;
            ssize_t n = rx_once(s, rx, buf, sizeof buf, flags);
            expect_eagain(n, errno, rx_name(rx), hn);
        }
        Fill f = start_fill(s, opt.num("size", 16u << 20), seed_of(opt, ++k), 400000);
        fill_until_eagain(s, f, how == How::dontwait ? Tx::send : Tx::write, flags, hn);
        // Every send family gets EAGAIN too. The kernel may still take a
        // few bytes here and there (its receive window keeps growing while
        // data arrives), so each family sends until EAGAIN, within bounds.
        std::vector<char> piece(65536);
        for (Tx tx : {Tx::write, Tx::send, Tx::writev, Tx::sendmsg, Tx::sendto}) {
            if (how == How::dontwait && (tx == Tx::write || tx == Tx::writev)) continue;
            ssize_t n = 0;
            int err = 0;
            for (int i = 0; i < 64; ++i) {
                pattern_fill(f.seed, f.off, piece.data(), piece.size());
                n = tx_once(s, tx, piece.data(), piece.size(), flags | MSG_NOSIGNAL);
                err = errno;
                if (n <= 0) break;
                count_tx(s, std::uint64_t(n));
                f.off += std::uint64_t(n);
            }
            char what[64];
            std::snprintf(what, sizeof what, "%s on a full connection", tx_name(tx));
            expect_eagain(n, err, what, hn);
        }
        pollfd p{s, POLLOUT, 0};
        if (poll(&p, 1, 0) != 0) fail("%s: full connection reported writable (0x%x)", hn,
                                      unsigned(p.revents));
        note("nonblock %s first=%llu eagain_at=%llu", hn, (unsigned long long)f.first,
             (unsigned long long)f.off);
        finish_fill(s, f, hn);
        set_nonblocking(s, how, false);
    }

    // The flag belongs to the open file: a duplicate shares it.
    set_nonblocking(s, How::fcntl_flag, true);
    const int d = dup(s);
    if (!(fcntl(d, F_GETFL) & O_NONBLOCK)) fail("dup does not share O_NONBLOCK");
    ssize_t n = recv(d, buf, sizeof buf, 0);
    expect_eagain(n, errno, "recv on a dup", "O_NONBLOCK set through the original");
    int off = 0;
    if (ioctl(d, FIONBIO, &off) != 0) fail("FIONBIO on the dup: %s", errno_name(errno));
    if (fcntl(s, F_GETFL) & O_NONBLOCK) fail("FIONBIO 0 on a dup left the original non-blocking");
    close(d);
    const int fl = fcntl(s, F_GETFL);
    n = recv(s, buf, sizeof buf, MSG_DONTWAIT);
    expect_eagain(n, errno, "recv", "MSG_DONTWAIT on a blocking socket");
    if (fcntl(s, F_GETFL) != fl) fail("MSG_DONTWAIT changed the file status flags");
    // Blocking again: a read waits for data sent 100 ms later.
    const std::uint64_t seed = seed_of(opt, 99);
    order_send(s, 100, seed, 100000, false);
    const std::uint64_t start = now_ns();
    take(s, 100, seed, "blocking read after non-blocking use");
    if (seconds_since(start) < 0.05) fail("the read did not block");
    send_exit(s);
}

// Checks before the port is published: nobody can have connected yet.
void listener_nonblocking_prelude(int listener) {
    const int fl = fcntl(listener, F_GETFL);
    if (fcntl(listener, F_SETFL, fl | O_NONBLOCK) != 0) fail("F_SETFL: %s", errno_name(errno));
    errno = 0;
    int rc = accept(listener, nullptr, nullptr);
    expect_rc("accept on a non-blocking listener with nothing pending", rc, errno, -1, EAGAIN);
    errno = 0;
    rc = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    expect_rc("accept4 on a non-blocking listener with nothing pending", rc, errno, -1, EAGAIN);
    Waiter w(Api::poll, {{listener, POLLIN | POLLOUT}});
    expect_ready(w, 0, {0}, "listener with nothing pending");
}

// Even connections: poll, then accept4(SOCK_NONBLOCK); odd: epoll, then
// accept, whose socket does not inherit the listener's O_NONBLOCK.
int accept_nonblocking(int listener, std::uint64_t index) {
    const Api api = index % 2 ? Api::epoll : Api::poll;
    Waiter w(api, {{listener, POLLIN}});
    expect_ready(w, 20000, {POLLIN}, "listener with a connection pending");
    int fd;
    if (index % 2 == 0) {
        fd = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) fail("accept4 after poll: %s", errno_name(errno));
        if (!(fcntl(fd, F_GETFL) & O_NONBLOCK)) fail("accept4(SOCK_NONBLOCK): not non-blocking");
        if (!(fcntl(fd, F_GETFD) & FD_CLOEXEC)) fail("accept4(SOCK_CLOEXEC): no FD_CLOEXEC");
        const int fl = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    } else {
        fd = accept(listener, nullptr, nullptr);
        if (fd < 0) fail("accept after epoll: %s", errno_name(errno));
        if (fcntl(fd, F_GETFL) & O_NONBLOCK)
            fail("accept from a non-blocking listener gave a non-blocking socket");
        if (fcntl(fd, F_GETFD) & FD_CLOEXEC) fail("accept gave FD_CLOEXEC");
    }
    errno = 0;
    int rc = accept(listener, nullptr, nullptr);
    expect_rc("accept once the pending connection was taken", rc, errno, -1, EAGAIN);
    expect_ready(w, 0, {0}, "listener after the accept");
    return fd;
}

// A port bound but not listening refuses: the error comes through SO_ERROR
// (once) or through a second connect.
void refused_connects(int family) {
    int bound = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_storage ss;
    socklen_t len = loopback_addr(family, 0, &ss);
    if (bind(bound, reinterpret_cast<sockaddr *>(&ss), len) != 0)
        fail("bind: %s", errno_name(errno));
    const std::uint16_t port = port_of(bound);
    const short refused = POLLIN | POLLOUT | POLLRDHUP | POLLERR | POLLHUP;

    int a = start_connect(family, port, "non-blocking connect to a closed port");
    Waiter wa(Api::poll, {{a, POLLOUT}});
    expect_ready(wa, -1, {refused}, "non-blocking connect refused");
    int err = so_error(a);
    if (err != ECONNREFUSED) fail("SO_ERROR after a refused connect: %s, expected ECONNREFUSED",
                                  err ? errno_name(err) : "0");
    err = so_error(a);
    if (err != 0) fail("second SO_ERROR after a refused connect: %s, expected 0", errno_name(err));
    close(a);

    int b = start_connect(family, port, "non-blocking connect to a closed port");
    Waiter wb(Api::epoll, {{b, POLLIN | POLLOUT}});
    expect_ready(wb, -1, {refused}, "non-blocking connect refused (epoll)");
    int rc = connect_again(b, family, port);
    expect_rc("connect again after a refused non-blocking connect", rc, errno, -1, ECONNREFUSED);
    close(b);
    close(bound);
}

// Even connections wait with poll, odd ones with epoll. Linux completes the
// connection state on the next connect(): it returns 0 once, then EISCONN.
int connect_nonblocking(int family, std::uint16_t port, std::uint64_t index) {
    int fd = start_connect(family, port, "non-blocking connect");
    const Api api = index % 2 ? Api::epoll : Api::poll;
    Waiter w(api, {{fd, POLLIN | POLLOUT}});
    expect_ready(w, -1, {POLLOUT}, "non-blocking connect completes");
    int err = so_error(fd);
    if (err != 0) fail("SO_ERROR after the connect completed: %s", errno_name(err));
    int rc = connect_again(fd, family, port);
    expect_rc("connect again after completion", rc, errno, 0, 0);
    rc = connect_again(fd, family, port);
    expect_rc("connect a third time", rc, errno, -1, EISCONN);
    char c;
    ssize_t n = recv(fd, &c, 1, 0);
    expect_eagain(n, errno, "recv before the server sent anything", "SOCK_NONBLOCK");
    if (!(fcntl(fd, F_GETFL) & O_NONBLOCK)) fail("socket(SOCK_NONBLOCK): not non-blocking");
    const int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

}  // namespace peer
