"""Holds N idle TCP connections between two processes, for benchmarks/apps.sh.

    idle_conns.py server PORT N     accepts N connections, answers one byte
                                    on each, then blocks in epoll_wait on
                                    all of them until every peer has closed
    idle_conns.py client PORT N     opens N connections to 127.0.0.1:PORT,
                                    one byte each way, then blocks in poll
                                    on all of them until SIGTERM or SIGINT,
                                    and closes them

Each side prints "ready PID" on stdout once its N connections have carried
their byte, and then makes no system call until an event arrives: the CPU
time either process uses from then on is what holding N idle connections
costs. The one byte each way makes every connection carry data, so the
library's statistics show which transport it used.

Both end through a normal exit (status 0), so a preloaded library writes
its SDIRECT_STATS_FILE. Status 1: a connection failed or saw data or EOF
while it should have been idle.
"""
import os
import select
import signal
import socket
import sys


def fail(text):
    print(f"idle_conns: {text}", file=sys.stderr, flush=True)
    sys.exit(1)


def serve(port, count):
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", port))
    lsock.listen(count)
    conns = {}
    while len(conns) < count:
        conn, _ = lsock.accept()
        conns[conn.fileno()] = conn
    lsock.close()
    for conn in conns.values():
        if conn.recv(1) != b"p":
            fail("server: no ping on a new connection")
        conn.sendall(b"q")
    ep = select.epoll(count)
    for fd in conns:
        ep.register(fd, select.EPOLLIN)
    print(f"ready {os.getpid()}", flush=True)
    while conns:
        for fd, _ in ep.poll():
            conn = conns.pop(fd)
            if conn.recv(1) != b"":
                fail("server: data on an idle connection")
            ep.unregister(fd)
            conn.close()
    ep.close()


class Stop(Exception):
    pass


def stop(signum, frame):
    # `timeout` sends its signal to the child and again to its process
    # group: a second one must not interrupt the closes below.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise Stop()


def client(port, count):
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    conns = []
    try:
        for _ in range(count):
            conns.append(socket.create_connection(("127.0.0.1", port)))
        for conn in conns:
            conn.sendall(b"p")
        for conn in conns:
            if conn.recv(1) != b"q":
                fail("client: no answer on a new connection")
        poller = select.poll()
        for conn in conns:
            poller.register(conn.fileno(), select.POLLIN)
        print(f"ready {os.getpid()}", flush=True)
        while True:
            if poller.poll():
                fail("client: an idle connection became readable")
    except Stop:
        pass
    finally:
        for conn in conns:
            conn.close()


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("server", "client"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    port, count = int(sys.argv[2]), int(sys.argv[3])
    (serve if sys.argv[1] == "server" else client)(port, count)


if __name__ == "__main__":
    main()
