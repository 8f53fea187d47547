#!/usr/bin/env python3
"""TCP echo with the selectors module, both ends non-blocking, for
tests/integration/python_asyncio.sh.

server: serves --clients connections at once from one selector (the
  listener included), echoes every byte, keeps at most 4 MiB unsent per
  connection (stops reading until it drains), closes a connection once
  the client's EOF came and all was echoed, and exits 0 after the last.
client: opens one connection per --sizes entry at once and streams that
  many pseudo-random bytes on it in random-sized writes while reading the
  echo, then shuts down its write side, reads to EOF and compares the
  echo with what it sent (size 0: only the half-close and the EOF).

--selector epoll|poll|select picks selectors.EpollSelector, PollSelector
or SelectSelector, on either end. Any wait longer than --idle seconds
without an event is a failure (exit 1).
"""
import argparse
import random
import selectors
import signal
import socket
import sys

SELECTORS = {
    "epoll": selectors.EpollSelector,
    "poll": selectors.PollSelector,
    "select": selectors.SelectSelector,
}
READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
HIGH_WATER = 4 << 20


class Echo:
    def __init__(self):
        self.pending = bytearray()
        self.eof = False
        self.echoed = 0


def serve(args):
    # Stopped early (the client failed): end through exit(), so a preloaded
    # library still writes its counters.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("server: SIGTERM before all clients were served"))
    sel = SELECTORS[args.selector]()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.port))
    listener.listen(64)
    listener.setblocking(False)
    sel.register(listener, READ, None)
    accepted = done = echoed = 0
    while done < args.clients:
        events = sel.select(timeout=args.idle)
        if not events:
            sys.exit(f"server: nothing happened for {args.idle} s "
                     f"({accepted} accepted, {done} done)")
        for key, mask in events:
            if key.data is None:
                try:
                    conn, _ = listener.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(False)
                sel.register(conn, READ, Echo())
                accepted += 1
                if accepted == args.clients:
                    sel.unregister(listener)
                    listener.close()
                continue
            conn, st = key.fileobj, key.data
            if mask & READ:
                try:
                    data = conn.recv(65536)
                except BlockingIOError:
                    data = None
                if data == b"":
                    st.eof = True
                elif data:
                    st.pending += data
            if st.pending and mask & WRITE:
                try:
                    n = conn.send(st.pending)
                    del st.pending[:n]
                    st.echoed += n
                except BlockingIOError:
                    pass
            if st.eof and not st.pending:
                sel.unregister(conn)
                conn.close()
                done += 1
                echoed += st.echoed
                continue
            want = (0 if st.eof or len(st.pending) >= HIGH_WATER else READ) | (WRITE if st.pending else 0)
            if want != key.events:
                sel.modify(conn, want, st)
    print(f"server ({args.selector}): {done} connections, {echoed} B echoed")


class Stream:
    def __init__(self, payload):
        self.payload = payload
        self.sent = 0
        self.received = bytearray()
        self.shut = False


def client(args):
    rng = random.Random(args.seed)
    sel = SELECTORS[args.selector]()
    streams = []
    for size in args.sizes:
        sock = socket.create_connection(("127.0.0.1", args.port), timeout=args.idle)
        sock.setblocking(False)
        st = Stream(rng.randbytes(size))
        streams.append(st)
        sel.register(sock, READ | WRITE, st)
    left = len(streams)
    while left:
        events = sel.select(timeout=args.idle)
        if not events:
            sys.exit(f"client: nothing happened for {args.idle} s; " + ", ".join(
                f"{s.sent}/{len(s.payload)} sent, {len(s.received)} echoed" for s in streams))
        for key, mask in events:
            sock, st = key.fileobj, key.data
            if mask & WRITE and not st.shut:
                if st.sent < len(st.payload):
                    end = st.sent + rng.randint(1, 256 << 10)
                    try:
                        st.sent += sock.send(st.payload[st.sent:end])
                    except BlockingIOError:
                        pass
                if st.sent == len(st.payload):
                    sock.shutdown(socket.SHUT_WR)
                    st.shut = True
                    sel.modify(sock, READ, st)
            if mask & READ:
                try:
                    data = sock.recv(rng.randint(1, 256 << 10))
                except BlockingIOError:
                    continue
                if data:
                    st.received += data
                    if len(st.received) > len(st.payload):
                        sys.exit(f"client: {len(st.received)} B echoed, only {len(st.payload)} B sent")
                    continue
                sel.unregister(sock)
                sock.close()
                left -= 1
                if not st.shut:
                    sys.exit(f"client: EOF after {st.sent} of {len(st.payload)} B sent")
                if st.received != st.payload:
                    at = next((i for i, (a, b) in enumerate(zip(st.received, st.payload)) if a != b),
                              min(len(st.received), len(st.payload)))
                    sys.exit(f"client: {len(st.payload)} B sent, {len(st.received)} B echoed, "
                             f"first difference at byte {at}")
    print(f"client ({args.selector}): {len(streams)} connections, "
          f"{sum(len(s.payload) for s in streams)} B echoed intact")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["server", "client"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--selector", choices=sorted(SELECTORS), default="epoll")
    p.add_argument("--clients", type=int, default=1, help="server: connections to serve")
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                   default=[0, 1, 100000, 3 << 20], help="client: bytes per connection")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--idle", type=float, default=15.0)
    args = p.parse_args()
    serve(args) if args.role == "server" else client(args)


if __name__ == "__main__":
    main()
