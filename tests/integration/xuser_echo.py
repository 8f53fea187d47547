#!/usr/bin/env python3
# Echo between two processes meant to run as two different users
# (crossuser.sh). The client sends --bytes bytes in pieces of mixed sizes
# (1 B to 1 MiB: inline, ring and read zero-copy on a direct connection)
# while a thread reads the echo back; both ends print the count and
# SHA-256 of what they received, the client also of what it sent.
#
# --clients N (server): N connections at once, one thread each, each
# line "server conn I received N SHA" or "server conn I broke ...".
# --seconds S (client): sends for S seconds (at least --bytes).
# --pause S (client): connected, waits S seconds before its first byte.
# --drop-to UID (server): after --drop-after bytes, becomes UID; with
# --stat-tool (sdirect-stat), only once its stats list the connection
# direct with bytes sent on the fabric (at most 10 s later; it reads 4 KiB
# at a time meanwhile, each piece followed by a look).
#
# --check-acl UID (client): before its shutdown, the client's own shm
# region must not be opened to UID; prints "acl ok" or to whom it is.
#
# --probe UID: while the connection is up (the client before its
# shutdown, the server at EOF), every file of /dev/shm this process has
# mapped (shm regions, process pages: its own and its peer's) is opened
# (and every one it holds open: the peer's page) by a process of UID,
# which must get EACCES for each; with --peer-uid,
# a process of that uid must get EACCES on our region (never opened to
# it) and be able to open our page for reading only. The peer's region is
# not mapped at all, the two message queues are. Prints "probe ok N" or
# why not.
import argparse
import hashlib
import os
import random
import socket
import subprocess
import sys
import threading
import time

CHECK = r"""
import errno, os, sys
mode = os.O_RDWR if sys.argv[1] == "rw" else os.O_RDONLY
for p in sys.argv[2:]:
    try:
        os.close(os.open(p, mode))
        print(p, "opened")
    except OSError as e:
        print(p, errno.errorcode.get(e.errno, e.errno))
"""


def shm_maps():
    paths = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/dev/shm/") and "(deleted)" not in parts[5]:
                paths.add(parts[5].strip())
    return sorted(paths)


def as_user(uid, how, paths):
    # Without the library: the probe is a plain process of that uid.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    out = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                          sys.executable, "-c", CHECK, how] + paths,
                         env=env, capture_output=True, text=True, timeout=20)
    got = dict(line.rsplit(" ", 1) for line in out.stdout.splitlines())
    if out.returncode != 0 or len(got) != len(paths):
        # Said, not hidden: the probe itself failed (its status, its errors).
        got["(probe)"] = f"status {out.returncode}: {out.stderr.strip()[-300:]}"
    return got


def shm_fds():
    # /dev/shm files this process holds open (a peer's page of another uid
    # is read with pread, never mapped).
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if path.startswith("/dev/shm/") and "(deleted)" not in path:
            found.add(path)
    return found


def probe(third, peer):
    paths = sorted(set(shm_maps()) | shm_fds())
    regions = [p for p in paths if os.path.basename(p).startswith("sd") and "/sdirect-" not in p]
    pages = [p for p in paths if "/sdirect-" in p and os.path.basename(p).startswith("p")]
    mine = lambda ps: [p for p in ps if os.stat(p).st_uid == os.getuid()]
    # Our own region and page mapped, the peer's page open (not mapped);
    # never the peer's region (its messages come by a queue of ours, not
    # through the provider).
    mapped_pages = [p for p in shm_maps() if p in pages]
    if len(mine(regions)) != 1 or len(regions) != 1 or len(pages) < 2 or mine(mapped_pages) != mapped_pages:
        return f"probe: expected our own region and page mapped and the peer's page open, found {paths} (mapped {shm_maps()})"
    queues = memfd_maps()
    if len(queues) < 2:
        return f"probe: expected our queue and the peer's mapped, found {queues}"
    got = as_user(third, "ro", paths)
    bad = {p: r for p, r in got.items() if r != "EACCES"}
    if bad or len(got) != len(paths):
        return f"probe: uid {third} got {got}; expected EACCES for all of {paths}"
    n = len(paths)
    if peer is not None:
        # Our region not at all, our page read only.
        want = {p: "EACCES" for p in mine(regions) + mine(pages)}
        got = as_user(peer, "rw", mine(regions) + mine(pages))
        got_ro = as_user(peer, "ro", mine(regions) + mine(pages))
        want_ro = {p: "EACCES" for p in mine(regions)}
        want_ro.update({p: "opened" for p in mine(pages)})
        if len(want) < 2 or got != want or got_ro != want_ro:
            return (f"probe: the peer's uid {peer} got {got} read-write and {got_ro} read only; "
                    f"expected {want} and {want_ro}")
        n += len(want) + len(got_ro)
    return f"probe ok {n}"


def memfd_maps():
    # The message queues (sealed memfds) this process has mapped.
    found = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/memfd:sdirect-queue"):
                found.add(parts[0])
    return sorted(found)


def not_ours():
    # Mapped shm files that are not this process's own (their names carry
    # its pid; the registry's spin file is per user).
    me = str(os.getpid())
    return [p for p in shm_maps()
            if not (os.path.basename(p).startswith(("sd" + me + "-", "p" + me))
                    or os.path.basename(p) == "spin")]


def serve_many(s, n):
    # --clients N: N connections at once, a thread each; one that breaks
    # (a hostile peer's) ends alone, and each says what it received.
    def echo(c, i):
        h = hashlib.sha256()
        got = 0
        try:
            while True:
                b = c.recv(1 << 20)
                if not b:
                    break
                h.update(b)
                got += len(b)
                c.sendall(b)
            print(f"server conn {i} received", got, h.hexdigest(), flush=True)
        except OSError as e:
            print(f"server conn {i} broke after {got} bytes: {e}", flush=True)
        c.close()
    threads = []
    for i in range(n):
        c, _ = s.accept()
        t = threading.Thread(target=echo, args=(c, i))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()


def sent_direct(c, stat_tool, state={}):
    """Whether our end of c is direct and has sent bytes on the fabric,
    by --stat-tool on our registry; without the tool, or after 10 s of
    asking (a busy host upgrades late; the checks then say what
    happened), yes."""
    if not stat_tool:
        return True
    now = time.monotonic()
    state.setdefault("until", now + 10)
    if now >= state["until"]:
        return True
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    out = subprocess.run([stat_tool, "--dir", f"/dev/shm/sdirect-{os.getuid()}"], env=env,
                         capture_output=True, text=True).stdout
    mine = (f"pid={os.getpid()} ", f" fd={c.fileno()} ", " mode=direct ")
    for line in out.splitlines():
        if all(w in line for w in mine):
            sent = [w for w in line.split() if w.startswith("tx_fabric=")]
            if sent and int(sent[0].split("=", 1)[1]) > 0:
                return True
    return False


def server(a):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", a.port))
    s.listen(4)
    if a.clients > 1:
        serve_many(s, a.clients)
        print("server done", flush=True)
        return
    c, _ = s.accept()
    h = hashlib.sha256()
    n = 0
    dropped = False
    while True:
        # Past --drop-after and waiting for the fabric: small pieces, each
        # followed by a look at our stats, so that the rest of the stream
        # lasts until the upgrade has come (or 10 s).
        due = a.drop_to is not None and not dropped and n >= a.drop_after
        b = c.recv(4096 if due else 1 << 20)
        if not b:
            break
        h.update(b)
        n += len(b)
        c.sendall(b)
        if a.drop_to is not None and not dropped and n >= a.drop_after and \
                sent_direct(c, a.stat_tool):
            # Mid-stream, the connection direct: become another user.
            before = not_ours() + memfd_maps()
            os.setgroups([])
            os.setresgid(a.drop_to, a.drop_to, a.drop_to)
            os.setresuid(a.drop_to, a.drop_to, a.drop_to)
            dropped = True
    if dropped:
        # Nothing of the peer stays mapped: every shm file still mapped
        # is one of ours (its name carries our pid), and no queue.
        after = not_ours() + memfd_maps()
        ok = before and not after
        print("maps", "ok" if ok else f"of the peer before {before}, after {after}", flush=True)
    if a.probe is not None:
        print(probe(a.probe, a.peer_uid), flush=True)
    print("server received", n, h.hexdigest(), flush=True)
    c.close()


def acl_uids(path):
    # The uids a file is opened to by named-user ACL entries.
    try:
        raw = os.getxattr(path, "system.posix_acl_access")
    except OSError:
        return []
    ents = [raw[i:i + 8] for i in range(4, len(raw), 8)]
    return [int.from_bytes(e[4:8], "little") for e in ents if int.from_bytes(e[0:2], "little") == 2]


def client(a):
    rnd = random.Random(a.seed)
    pattern = rnd.randbytes(1 << 20)
    src = ("127.0.0.1", a.bind_port) if a.bind_port else None
    c = socket.create_connection(("127.0.0.1", a.port), timeout=30, source_address=src)
    # Blocking (the runner's timeout bounds it): read zero-copy is for
    # blocking sends only.
    c.settimeout(None)
    got = hashlib.sha256()
    total = [0]

    def reader():
        while True:
            b = c.recv(1 << 20)
            if not b:
                break
            got.update(b)
            total[0] += len(b)

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(a.pause)
    h = hashlib.sha256()
    sent = 0
    sizes = [1, 100, 4000, 5000, 65536, 200000, 1 << 20, 7]
    i = 0
    end = time.monotonic() + a.seconds
    while sent < a.bytes or time.monotonic() < end:
        k = sizes[i % len(sizes)] if a.seconds else min(sizes[i % len(sizes)], a.bytes - sent)
        at = rnd.randrange(0, len(pattern) - k + 1)
        piece = pattern[at:at + k]
        c.sendall(piece)
        h.update(piece)
        sent += k
        i += 1
    if a.probe is not None:
        print(probe(a.probe, a.peer_uid), flush=True)
    if a.check_acl is not None:
        # Our region (it exists: this end built its engine) is opened to
        # no uid that did not prove it holds the other end.
        mine = [p for p in shm_maps() if os.path.basename(p).startswith(f"sd{os.getpid()}-")]
        given = sorted({u for p in mine for u in acl_uids(p)})
        ok = mine and a.check_acl not in given
        print("acl", "ok" if ok else f"region {mine} opened to uids {given}", flush=True)
    c.shutdown(socket.SHUT_WR)
    t.join(30)
    print("client sent", sent, h.hexdigest(), flush=True)
    print("client received", total[0], got.hexdigest(), flush=True)
    c.close()


p = argparse.ArgumentParser()
p.add_argument("role", choices=["server", "client"])
p.add_argument("--port", type=int, required=True)
p.add_argument("--bytes", type=int, default=4_000_000)
p.add_argument("--seed", type=int, default=11)
p.add_argument("--probe", type=int)
p.add_argument("--peer-uid", type=int)
p.add_argument("--drop-to", type=int)
p.add_argument("--pause", type=float, default=0)
p.add_argument("--stat-tool", default="")
p.add_argument("--bind-port", type=int)
p.add_argument("--check-acl", type=int)
p.add_argument("--drop-after", type=int, default=1 << 20)
p.add_argument("--clients", type=int, default=1)
p.add_argument("--seconds", type=float, default=0)
a = p.parse_args()
server(a) if a.role == "server" else client(a)
