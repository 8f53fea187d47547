#!/usr/bin/env python3
"""memcached text-protocol client for tests/integration/memcached.sh.

Stores values of 0 B to 512 KiB (random bytes, CR LF inside included) with
their flags, reads each back with get, all at once with a multi-get and
from a second connection, checks gets/cas, append/prepend, incr/decr,
delete and misses, then pipelines 300 sets and 300 gets in single writes.
Every reply is compared exactly; the first difference ends the run with
exit status 1. Usage: memcache_client.py PORT
"""
import random
import socket
import sys

step = "none"  # the last check that passed, for the error message


class Conn:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.buf = bytearray()

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError("memcached closed the connection")
        self.buf += chunk

    def line(self):
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                out = bytes(self.buf[:end])
                del self.buf[:end + 2]
                return out
            self._fill()

    def exactly(self, n):
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def command(self, text, data=None):
        self.send(text.encode() + b"\r\n" + (data + b"\r\n" if data is not None else b""))
        return self.line()

    def get(self, *keys, cas=False):
        """{key: (flags, value[, cas])} from one get/gets."""
        self.send((("gets " if cas else "get ") + " ".join(keys)).encode() + b"\r\n")
        found = {}
        while True:
            head = self.line().split()
            if head == [b"END"]:
                return found
            if head[0] != b"VALUE":
                raise AssertionError(f"get: unexpected {head!r}")
            key, flags, size = head[1].decode(), int(head[2]), int(head[3])
            value = self.exactly(size)
            if self.exactly(2) != b"\r\n":
                raise AssertionError(f"get {key}: value not followed by CR LF")
            found[key] = (flags, value, int(head[4])) if cas else (flags, value)

    def close(self):
        self.send(b"quit\r\n")
        self.sock.close()


def expect(what, got, want):
    global step
    if got != want:
        show = lambda v: repr(v) if len(repr(v)) < 120 else repr(v)[:120] + "..."
        raise AssertionError(f"{what}: got {show(got)}, want {show(want)}")
    step = what


def main():
    port = int(sys.argv[1])
    rng = random.Random(11)
    a, b = Conn(port), Conn(port)

    values = {}
    for i, size in enumerate([0, 1, 2, 100, 1000, 4096, 65536, 100000, 524288]):
        value = bytearray(rng.randbytes(size))
        if size >= 4:
            value[size // 2:size // 2 + 2] = b"\r\n"  # framing is by length only
        values[f"it:{i}"] = (i * 7, bytes(value))
    for key, (flags, value) in values.items():
        expect(f"set {key}", a.command(f"set {key} {flags} 0 {len(value)}", value), b"STORED")
    for key, (flags, value) in values.items():
        expect(f"get {key}", a.get(key), {key: (flags, value)})
    expect("multi-get", a.get(*values), values)
    expect("multi-get from a second connection", b.get(*values), values)
    expect("get of a missing key", a.get("it:missing"), {})

    got = a.get("it:3", cas=True)["it:3"]
    expect("cas with the current token", a.command(f"cas it:3 5 0 3 {got[2]}", b"new"), b"STORED")
    expect("cas with a stale token", a.command(f"cas it:3 5 0 3 {got[2]}", b"old"), b"EXISTS")
    expect("get after cas", b.get("it:3"), {"it:3": (5, b"new")})
    expect("append", a.command("append it:3 0 0 4", b"-end"), b"STORED")
    expect("prepend", a.command("prepend it:3 0 0 6", b"begin-"), b"STORED")
    expect("get after append/prepend", b.get("it:3"), {"it:3": (5, b"begin-new-end")})
    expect("add of an existing key", a.command("add it:3 0 0 1", b"x"), b"NOT_STORED")
    expect("set counter", a.command("set it:n 0 0 2", b"10"), b"STORED")
    expect("incr", a.command("incr it:n 32"), b"42")
    expect("decr", b.command("decr it:n 2"), b"40")
    expect("delete", a.command("delete it:n"), b"DELETED")
    expect("delete again", b.command("delete it:n"), b"NOT_FOUND")
    expect("get after delete", b.get("it:n"), {})

    # Pipelining: all commands in one write, then all replies.
    batch = {f"it:p{i}": (i, rng.randbytes(rng.randrange(0, 3000))) for i in range(300)}
    b.send(b"".join(f"set {k} {f} 0 {len(v)}\r\n".encode() + v + b"\r\n"
                    for k, (f, v) in batch.items()))
    for key in batch:
        expect(f"pipelined set {key}", b.line(), b"STORED")
    a.send(b"".join(f"get {k}\r\n".encode() for k in batch))
    for key, item in batch.items():
        head = a.line().split()
        expect(f"pipelined get {key} header", head[:3], [b"VALUE", key.encode(), str(item[0]).encode()])
        expect(f"pipelined get {key} value", a.exactly(int(head[3]) + 2), item[1] + b"\r\n")
        expect(f"pipelined get {key} end", a.line(), b"END")

    a.close()
    b.close()
    total = sum(len(v) for _, v in values.values()) + sum(len(v) for _, v in batch.values())
    print(f"{len(values)} values of 0..524288 B, cas/append/incr/delete, "
          f"300 pipelined sets and gets, {total} B stored, all replies exact")


if __name__ == "__main__":
    try:
        main()
    except (AssertionError, EOFError, OSError) as e:
        print(f"memcache_client: {e} (last check passed: {step})")
        sys.exit(1)
