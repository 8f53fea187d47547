#!/usr/bin/env python3
"""HTTP client for tests/integration/nginx.sh.

Fetches every file of ROOT from 127.0.0.1:PORT and compares each body's
sha256 with the file's on disk:
  * one keep-alive connection (http.client): every file twice, a HEAD, a
    Range request in the middle of the largest file, and a 404;
  * 4 threads, each its own keep-alive connection, the largest file twice
    each (the connections spread over the workers);
  * one raw socket, HTTP/1.0 (the server closes after the body), the
    largest file, read until EOF.
Prints one line per part; exit status 1 at the first difference.
Usage: http_fetch.py PORT ROOT FILE...
"""
import hashlib
import http.client
import os
import socket
import sys
import threading

TIMEOUT = 15


def sha(data):
    return hashlib.sha256(data).hexdigest()


def fail(text):
    print(f"http_fetch: {text}")
    sys.exit(1)


def get(conn, method, path, headers=None):
    conn.request(method, path, headers=headers or {})
    resp = conn.getresponse()
    body = resp.read()
    return resp, body


def check_body(what, resp, body, want, status=200):
    if resp.status != status:
        raise AssertionError(f"{what}: status {resp.status}, want {status}")
    length = resp.getheader("Content-Length")
    if length is not None and int(length) != len(body):
        raise AssertionError(f"{what}: Content-Length {length}, body {len(body)} B")
    if len(body) != len(want) or sha(body) != sha(want):
        raise AssertionError(f"{what}: {len(body)} B sha256 {sha(body)[:16]}, "
                             f"want {len(want)} B sha256 {sha(want)[:16]}")


def keepalive(port, files):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    for round_ in range(2):
        for name, data in files.items():
            resp, body = get(conn, "GET", "/" + name)
            check_body(f"GET /{name} (round {round_ + 1})", resp, body, data)
    largest = max(files, key=lambda n: len(files[n]))
    data = files[largest]
    resp, body = get(conn, "HEAD", "/" + largest)
    if resp.status != 200 or body or int(resp.getheader("Content-Length")) != len(data):
        raise AssertionError(f"HEAD /{largest}: status {resp.status}, "
                             f"Content-Length {resp.getheader('Content-Length')}")
    first, last = len(data) // 5, len(data) // 5 * 3 + 12345
    resp, body = get(conn, "GET", "/" + largest, {"Range": f"bytes={first}-{last}"})
    check_body(f"GET /{largest} Range bytes={first}-{last}", resp, body,
               data[first:last + 1], status=206)
    resp, body = get(conn, "GET", "/no-such-file")
    if resp.status != 404:
        raise AssertionError(f"GET /no-such-file: status {resp.status}, want 404")
    conn.close()
    total = 2 * sum(len(d) for d in files.values()) + last + 1 - first
    return f"keep-alive: {2 * len(files)} GETs, HEAD, Range, 404; {total} B intact"


def parallel(port, name, data, threads=4):
    errors = []

    def worker(i):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
            for round_ in range(2):
                resp, body = get(conn, "GET", "/" + name)
                check_body(f"thread {i}: GET /{name} (round {round_ + 1})", resp, body, data)
            conn.close()
        except Exception as e:  # reported by the main thread
            errors.append(f"{type(e).__name__}: {e}")

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(TIMEOUT * 2)
    if any(t.is_alive() for t in pool):
        raise AssertionError("parallel: a thread did not finish")
    if errors:
        raise AssertionError("parallel: " + errors[0])
    return f"{threads} parallel connections: {2 * threads} GETs of /{name}, intact"


def until_eof(port, name, data):
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    sock.sendall(f"GET /{name} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
    chunks = []
    while True:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    sock.close()
    reply = b"".join(chunks)
    head, sep, body = reply.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"HTTP/1.1 200"):
        raise AssertionError(f"HTTP/1.0 GET /{name}: bad reply {head[:60]!r}")
    if sha(body) != sha(data):
        raise AssertionError(f"HTTP/1.0 GET /{name}: {len(body)} B to EOF, want {len(data)} B")
    return f"HTTP/1.0 to EOF: /{name} intact"


def main():
    port, root, names = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    files = {}
    for name in names:
        with open(os.path.join(root, name), "rb") as f:
            files[name] = f.read()
    largest = max(files, key=lambda n: len(files[n]))
    print(keepalive(port, files))
    print(parallel(port, largest, files[largest]))
    print(until_eof(port, largest, files[largest]))


if __name__ == "__main__":
    try:
        main()
    except (AssertionError, OSError, http.client.HTTPException) as e:
        fail(f"{type(e).__name__}: {e}")
