#!/usr/bin/env python3
# Echo server that changes its ids (privdrop.sh), for a client of
# xuser_echo.py. Prints the count and SHA-256 of what it received.
#
# --before-listen UID: becomes UID (groups, gid, uid: setgroups,
# setresgid, setresuid) before it listens: it holds nothing of the
# fabric then.
# --fork UID: listens as it is (a server builds its fabric engine at
# listen), waits --settle seconds, forks; the child becomes UID and
# serves, as a pre-fork server's worker does. Before it accepts, the
# child prints "inherited ok" when it maps no file of the old registry
# (--old-registry) nor the parent's fabric region and holds no control
# socket bound in the old registry, else what it keeps.
# --after-listen UID: listens as it is (its fabric engine is built
# there), waits --settle seconds, then becomes UID itself and serves, as a
# daemon that binds its port as root does. Before it accepts it prints
# "inherited ok" when it maps no file of the old registry nor its old
# fabric region, holds no control socket bound in the old registry, and
# the old registry and /dev/shm hold no file of its old engine.
# --accept-fork UID: accepts the connection as it is, then forks (its copy
# unused); the child becomes UID, echoes the first --half bytes (after
# its first byte it waits until --stat-tool lists the connection direct,
# at most 10 s, or 0.3 s without it: its engine's build finishes, and it
# takes the connection over from the idle parent) and stays, holding the
# socket; the parent then echoes the rest itself, and tells the child to
# exit once the client has closed. The child's bytes reach the parent
# through a pipe for the count and hash. The child prints "inherited ok"
# as --fork's does, after its half.
# --monitor UID: the shape of sshd's login as another user: accepts and
# echoes the first --piece bytes itself; forks a child that echoes the
# next --piece bytes (the connection is shared from then on); while that
# child lives, seteuid(UID) and back (the parent retires: it holds a
# connection of its own); then, the first child gone, forks a second
# child that becomes UID and echoes the rest while the parent keeps its
# copy idle (after its first byte it waits as --accept-fork's child
# does). The second child prints "inherited ok" as --fork's does.
# --seteuid UID: only the effective uid changes (the ids are mixed
# afterwards), before it listens.
# After a change of uid the kernel makes a process not dumpable; like
# nginx's workers, the server makes itself dumpable again
# (prctl(PR_SET_DUMPABLE, 1)) unless --not-dumpable.
import argparse
import ctypes
import hashlib
import os
import socket
import subprocess
import sys
import time


def inherited(old_registry, parent, files=False):
    kept = []
    if files:
        for name in (f"p{parent}", f"ctl-{parent}"):
            if os.path.exists(os.path.join(old_registry, name)):
                kept.append(f"file {old_registry}/{name}")
        for name in os.listdir("/dev/shm"):
            st = os.stat(os.path.join("/dev/shm", name))
            if name.startswith(f"sd{parent}-") and st.st_uid != os.getuid():
                kept.append(f"region /dev/shm/{name} of uid {st.st_uid}")
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            path = parts[5].strip() if len(parts) == 6 else ""
            if path.startswith(old_registry + "/") or path.startswith(f"/dev/shm/sd{parent}-"):
                kept.append(path)
    inodes = set()
    with open("/proc/net/unix") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 8 and parts[7].startswith(old_registry + "/ctl-"):
                inodes.add(parts[6])
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            kept.append(f"fd {fd}: control socket {target}")
    return "inherited ok" if not kept else f"inherited kept {kept}"


DUMPABLE = True


def drop(uid, gid):
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if DUMPABLE:
        PR_SET_DUMPABLE = 4
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")


def serve(s):
    c, _ = s.accept()
    h = hashlib.sha256()
    n = echo(c, None, h.update)
    say("server received", n, h.hexdigest())
    c.close()


def write_all(fd, b):
    while b:
        b = b[os.write(fd, b):]


def serve_split(s, uid, gid, half, old_registry, stat_tool):
    c, _ = s.accept()
    data_r, data_w = os.pipe()  # the child's bytes, for the count and hash
    go_r, go_w = os.pipe()  # the parent tells the child it may exit
    sys.stdout.flush()
    kid = os.fork()
    if kid == 0:
        os.close(data_r)
        os.close(go_w)
        drop(uid, gid)
        n = 0
        while n < half:
            b = c.recv(min(1 << 20, half - n))
            if not b:
                break
            n += len(b)
            c.sendall(b)
            write_all(data_w, b)
            if n == len(b):
                settle(c, stat_tool)
        os.close(data_w)
        say(inherited(old_registry, os.getppid()))
        os.read(go_r, 1)
        os._exit(0)
    os.close(data_w)
    os.close(go_r)
    h = hashlib.sha256()
    n = drain(data_r, h.update)
    n += echo(c, None, h.update)
    say("server received", n, h.hexdigest())
    c.close()
    os.write(go_w, b"x")
    _, status = os.waitpid(kid, 0)
    return os.waitstatus_to_exitcode(status)


def settle(c, stat_tool):
    """After the child's first byte: its engine's build finishes, it takes
    the connection over from the idle parent and upgrades it. With
    sdirect-stat (on the registry of our new uid, where the library went
    on), until it lists the connection direct (at most 10 s: a busy host
    builds engines slowly); else a fixed 0.3 s."""
    if not stat_tool:
        time.sleep(0.3)
        return
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    mine = (f"pid={os.getpid()} ", f" fd={c.fileno()} ", " mode=direct ")
    end = time.monotonic() + 10
    while time.monotonic() < end:
        # A call on the socket (the take-over comes at one, not while we
        # only wait); it takes nothing.
        try:
            c.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            pass
        time.sleep(0.02)
        out = subprocess.run([stat_tool, "--dir", f"/dev/shm/sdirect-{os.getuid()}"], env=env,
                             capture_output=True, text=True).stdout
        if any(all(w in line for w in mine) for line in out.splitlines()):
            return


def say(*parts):
    """One line on stdout in one write: a forked child and its parent print
    to one file, and a line written in pieces (an unbuffered stdout) could
    interleave with the other's."""
    os.write(1, (" ".join(str(p) for p in parts) + "\n").encode())


def echo(c, limit, sink):
    """Echoes up to `limit` bytes (None: until EOF), each to `sink` too."""
    n = 0
    while limit is None or n < limit:
        b = c.recv(1 << 20 if limit is None else min(1 << 20, limit - n))
        if not b:
            break
        n += len(b)
        c.sendall(b)
        sink(b)
    return n


def drain(fd, sink):
    """Reads `fd` to its end, each piece to `sink`; the count."""
    n = 0
    while True:
        b = os.read(fd, 1 << 16)
        if not b:
            return n
        n += len(b)
        sink(b)


def serve_monitor(s, uid, gid, piece, old_registry, stat_tool):
    c, _ = s.accept()
    h = hashlib.sha256()
    n = 0

    def mine(b):
        nonlocal n
        h.update(b)
        n += len(b)

    echo(c, piece, mine)
    data_r, data_w = os.pipe()
    go_r, go_w = os.pipe()
    sys.stdout.flush()
    pre = os.fork()
    if pre == 0:
        os.close(data_r)
        os.close(go_w)
        echo(c, piece, lambda b: write_all(data_w, b))
        os.close(data_w)
        os.read(go_r, 1)
        os._exit(0)
    os.close(data_w)
    os.close(go_r)
    drain(data_r, mine)
    os.close(data_r)
    os.seteuid(uid)
    os.seteuid(0)
    os.write(go_w, b"x")
    os.waitpid(pre, 0)
    data_r, data_w = os.pipe()
    sys.stdout.flush()
    kid = os.fork()
    if kid == 0:
        os.close(data_r)
        drop(uid, gid)
        # Its first byte starts its engine's build; its take-over comes at
        # a call after that (holders are looked at every 20 ms).
        echo(c, 1, lambda b: write_all(data_w, b))
        settle(c, stat_tool)
        echo(c, None, lambda b: write_all(data_w, b))
        os.close(data_w)
        say(inherited(old_registry, os.getppid()))
        os._exit(0)
    os.close(data_w)
    drain(data_r, mine)
    os.close(data_r)
    say("server received", n, h.hexdigest())
    _, status = os.waitpid(kid, 0)
    return os.waitstatus_to_exitcode(status)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--before-listen", type=int)
    p.add_argument("--fork", type=int)
    p.add_argument("--after-listen", type=int)
    p.add_argument("--seteuid", type=int)
    p.add_argument("--accept-fork", type=int)
    p.add_argument("--half", type=int, default=1500000)
    p.add_argument("--stat-tool", default="")
    p.add_argument("--monitor", type=int)
    p.add_argument("--piece", type=int, default=100000)
    p.add_argument("--gid", type=int, default=65534)
    p.add_argument("--settle", type=float, default=1.0)
    p.add_argument("--old-registry", default="/dev/shm/sdirect-0")
    p.add_argument("--not-dumpable", action="store_true")
    a = p.parse_args()
    global DUMPABLE
    DUMPABLE = not a.not_dumpable
    if a.before_listen is not None:
        drop(a.before_listen, a.gid)
    if a.seteuid is not None:
        os.seteuid(a.seteuid)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", a.port))
    s.listen(4)
    if a.after_listen is not None:
        time.sleep(a.settle)
        drop(a.after_listen, a.gid)
        say(inherited(a.old_registry, os.getpid(), files=True))
    if a.monitor is not None:
        return serve_monitor(s, a.monitor, a.gid, a.piece, a.old_registry, a.stat_tool)
    if a.accept_fork is not None:
        return serve_split(s, a.accept_fork, a.gid, a.half, a.old_registry, a.stat_tool)
    if a.fork is None:
        serve(s)
        return 0
    time.sleep(a.settle)
    sys.stdout.flush()
    kid = os.fork()
    if kid == 0:
        try:
            drop(a.fork, a.gid)
            say(inherited(a.old_registry, os.getppid()))
            serve(s)
        finally:
            sys.stdout.flush()
        sys.exit(0)
    s.close()
    _, status = os.waitpid(kid, 0)
    return os.waitstatus_to_exitcode(status)


sys.exit(main())
