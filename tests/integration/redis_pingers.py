#!/usr/bin/env python3
# Clients of a Redis server, one process each (redis_user.sh): each
# connects, sends PING 40 times 5 ms apart (its connection earns its
# upgrade), then keeps the connection open and idle until the file
# --until exists (at most --hold seconds), and sends one last PING.
# Every reply must be exactly "+PONG\r\n". Prints one line
# "pingers N ok" or the first failure, and exits non-zero on any.
import argparse
import os
import socket
import sys
import time


def one(port, until, hold):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    for _ in range(40):
        s.sendall(b"PING\r\n")
        got = b""
        while len(got) < 7:
            part = s.recv(7 - len(got))
            if not part:
                return "connection closed"
            got += part
        if got != b"+PONG\r\n":
            return f"reply {got!r}"
        time.sleep(0.005)
    end = time.monotonic() + hold
    while not os.path.exists(until) and time.monotonic() < end:
        time.sleep(0.05)
    s.sendall(b"PING\r\n")
    got = s.recv(64)
    s.close()
    return None if got == b"+PONG\r\n" else f"last reply {got!r}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--count", type=int, default=6)
    ap.add_argument("--until", required=True)
    ap.add_argument("--hold", type=float, default=30)
    a = ap.parse_args()
    kids = []
    for i in range(a.count):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                why = one(a.port, a.until, a.hold)
            except OSError as e:
                why = str(e)
            os.write(w, (why or "").encode())
            # A normal exit: the library writes its statistics at exit.
            sys.exit(1 if why else 0)
        os.close(w)
        kids.append((pid, r))
    bad = []
    for i, (pid, r) in enumerate(kids):
        why = os.read(r, 200).decode()
        _, status = os.waitpid(pid, 0)
        if status != 0:
            bad.append(f"pinger {i}: {why or 'status %d' % status}")
    print(bad[0] if bad else f"pingers {a.count} ok")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
