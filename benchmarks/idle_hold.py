"""Holds N idle connections to a server, for benchmarks/idle_load.sh.

    idle_hold.py redis PORT N   N connections to redis-server on
                                127.0.0.1:PORT, a PING on each every 10
                                ms, 12 times and for 1 s at least (the
                                calls and the time to earn an upgrade, in
                                a process that may build its engine only
                                from 250 ms of life on), then idle
    idle_hold.py nginx PORT N   N keep-alive connections to nginx on
                                127.0.0.1:PORT, one GET /f4k each (4096
                                bytes), then idle

Prints "ready N" once every connection is idle, then sleeps until SIGTERM
or SIGINT, closes them all and exits 0 (a preloaded library then writes
its SDIRECT_STATS_FILE). Exits 1 when a connection fails or answers
wrongly.
"""
import signal
import socket
import sys
import time


def fail(text):
    print(f"idle_hold: {text}", file=sys.stderr, flush=True)
    sys.exit(1)


def read_until(s, end, limit):
    got = b""
    while not got.endswith(end):
        part = s.recv(65536)
        if not part:
            fail("the server closed a connection")
        got += part
        if len(got) > limit:
            fail(f"answer too long: {got[:80]!r}")
    return got


def redis(socks):
    start = time.monotonic()
    rounds = 0
    while rounds < 12 or time.monotonic() - start < 1.0:
        rounds += 1
        for s in socks:
            s.sendall(b"PING\r\n")
        for s in socks:
            got = read_until(s, b"\r\n", 64)
            if got != b"+PONG\r\n":
                fail(f"PING answered {got!r}")
        time.sleep(0.01)


def nginx(socks):
    for s in socks:
        s.sendall(b"GET /f4k HTTP/1.1\r\nHost: idle\r\n\r\n")
    for s in socks:
        got = b""
        while b"\r\n\r\n" not in got:
            part = s.recv(65536)
            if not part:
                fail("the server closed a connection")
            got += part
        head, body = got.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 200"):
            fail(f"GET answered {head[:80]!r}")
        while len(body) < 4096:
            part = s.recv(65536)
            if not part:
                fail("the server closed a connection")
            body += part
        if len(body) != 4096:
            fail(f"GET gave {len(body)} bytes, not 4096")


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("redis", "nginx"):
        fail("usage: idle_hold.py redis|nginx PORT N")
    kind, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    try:
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
        (redis if kind == "redis" else nginx)(socks)
    except OSError as e:
        fail(str(e))
    print(f"ready {n}", flush=True)
    while not stop:
        signal.pause()
    for s in socks:
        s.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
