#!/usr/bin/env python3
# A hostile peer of another uid (crossuser_hostile.sh): it connects to the
# victim, exchanges a few messages so that the connection goes direct, and
# then, by --seed, attacks everything of the pair it can reach:
#  * every bell it holds (eventfds, local datagram sockets): filled to
#    the top and made blocking, then a message that the victim answers
#    while it says it has sleepers (the victim must not wait on it);
#  * the queue it writes into (the victim's, a sealed memfd mapped here):
#    well-formed messages forged for every live connection of the victim
#    (ids from the victim's process page, generations guessed: data at
#    any offset, close, fin, leave, huge credits), records whose length
#    lies, tails that make no sense, then random bytes over all of it;
#  * its own queue (which the victim writes into: its head), its own page
#    (which the victim reads) and its own shm region: random bytes;
#  * a truncation of its own queue (the victim maps it): the seals must
#    refuse it; then of its own process page (the victim reads it).
# It then goes on sending on its own connection, which may break.
# Prints "queues N" (queues found mapped), "truncate refused" or
# "truncate allowed", "wrote N" (files written) or "no queue" when it
# found none (the connection not direct).
import argparse
import ctypes
import mmap
import os
import random
import signal
import socket
import struct
import time

CAP = 1 << 20
DATA = 4096
SLOT = 256          # ConnStat
PAGE_HEADER = 128   # ProcHeader

p = argparse.ArgumentParser()
p.add_argument("--port", type=int, required=True)
p.add_argument("--seed", type=int, default=1)
a = p.parse_args()
rnd = random.Random(a.seed)

c = socket.create_connection(("127.0.0.1", a.port), timeout=10)
for _ in range(40):
    c.sendall(b"x" * 1000)
    c.recv(100000)
time.sleep(0.3)


def maps():
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                yield lo, hi, int(parts[4]), parts[5].strip()


# Our own queue is the one whose memfd we still hold open (we pass it
# again with every handshake); the victim's, only mapped.
own_inodes = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:sdirect-queue"):
            own_inodes[os.fstat(int(fd)).st_ino] = int(fd)
    except OSError:
        pass
queues = [(lo, hi, ino) for lo, hi, ino, path in maps() if path.startswith("/memfd:sdirect-queue")]
theirs = [(lo, hi) for lo, hi, ino in queues if ino not in own_inodes]
ours = [(lo, hi) for lo, hi, ino in queues if ino in own_inodes]
print("queues", len(queues), flush=True)
if not theirs:
    print("no queue", flush=True)
    raise SystemExit(0)

# First, over every local datagram socket it holds (the victim's link
# bell, and the bells of the victim's threads it was offered), offers of
# a thread's bell that the victim must refuse and close: a pipe, three fds
# at once, an fd on a one-byte ring; and real ones, of which the victim
# keeps only a few a link. The victim's fd count must not grow with them.
offers = 0
pipe_r, pipe_w = os.pipe()
pair_a, pair_b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
for name in os.listdir("/proc/self/fd"):
    fd = int(name)
    try:
        if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
            continue
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        continue
    if s.family == socket.AF_UNIX and s.type == socket.SOCK_DGRAM and fd not in (pair_a.fileno(), pair_b.fileno()):
        rights = socket.SCM_RIGHTS
        try:
            for k in range(1000):
                offer = struct.pack("<II", 0x57584453, k + 1)
                s.sendmsg([offer], [(socket.SOL_SOCKET, rights, struct.pack("<i", pipe_r))], socket.MSG_DONTWAIT)
                s.sendmsg([offer], [(socket.SOL_SOCKET, rights, struct.pack("<3i", pair_a.fileno(), pair_b.fileno(), pipe_w))],
                          socket.MSG_DONTWAIT)
                s.sendmsg([b"z"], [(socket.SOL_SOCKET, rights, struct.pack("<i", pair_b.fileno()))], socket.MSG_DONTWAIT)
                s.sendmsg([offer], [(socket.SOL_SOCKET, rights, struct.pack("<i", pair_b.fileno()))], socket.MSG_DONTWAIT)
                offers += 4
        except OSError:
            pass
    s.close()
print("offers", offers, flush=True)
time.sleep(1.0)

# Then the bells, while its connection is direct: every eventfd it holds
# (its own, and any a peer passed it) drained, then filled to the top and
# made blocking (the flags are the open file's, shared by every process
# that holds it): a victim that rang one of them would wait in that write
# for ever. Every local datagram socket filled and made blocking too. Then
# it says it has sleepers (the count it mirrors into its own queue, which
# the victim reads) and sends: the victim's answer rings it. Its own
# library may now wait on the bells too: its calls are bounded by an
# alarm (a signal ends a blocked write).
bells = 0
for name in os.listdir("/proc/self/fd"):
    fd = int(name)
    try:
        what = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue
    try:
        if what == "anon_inode:[eventfd]":
            os.set_blocking(fd, False)
            try:
                os.read(fd, 8)
            except OSError:
                pass
            try:
                os.write(fd, struct.pack("<Q", 0xFFFFFFFFFFFFFFFE))
            except OSError:
                pass
            os.set_blocking(fd, True)
            bells += 1
        elif what.startswith("socket:"):
            s = socket.socket(fileno=os.dup(fd))
            if s.family == socket.AF_UNIX and s.type == socket.SOCK_DGRAM:
                try:
                    for _ in range(100000):
                        s.send(b"z", socket.MSG_DONTWAIT)
                except OSError:
                    pass
                os.set_blocking(fd, True)
                bells += 1
            os.close(s.detach())
    except OSError:
        pass
print("bells", bells, flush=True)
for lo, hi in ours:
    ctypes.c_uint32.from_address(lo + 192).value = 1
signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("alarm")))
signal.alarm(2)
try:
    c.sendall(b"r" * 1000)
    c.recv(100000)
    print("answered", flush=True)
except OSError as e:
    print("no answer:", e, flush=True)
signal.alarm(0)

# The victim's page (read only here): its live connections' slots.
victim_page = None
me = os.getpid()
for lo, hi, ino, path in maps():
    base = os.path.basename(path)
    if "/sdirect-" in path and base.startswith("p") and base != f"p{me}":
        victim_page = path
live = []
if victim_page:
    with open(victim_page, "rb") as f:
        page = f.read()
    for i in range((len(page) - PAGE_HEADER) // SLOT):
        if struct.unpack_from("<I", page, PAGE_HEADER + i * SLOT)[0] == 1:
            live.append(i)
live = live or list(range(8))


def u64(addr):
    return ctypes.c_uint64.from_address(addr)


def append(q, payload, length=None):
    # One record at the queue's tail, as an honest writer would put it
    # (length: what the record says, which may lie).
    lo, _ = q
    tail = u64(lo + 128).value
    head = u64(lo + 64).value
    rec = (8 + len(payload) + 7) & ~7
    if tail - head + rec > CAP or tail % 8:
        return False
    blob = struct.pack("<II", len(payload) if length is None else length, 0) + payload
    at = tail % CAP
    first = min(len(blob), CAP - at)
    ctypes.memmove(lo + DATA + at, blob[:first], first)
    if first < len(blob):
        ctypes.memmove(lo + DATA, blob[first:], len(blob) - first)
    u64(lo + 128).value = tail + rec
    return True


def header(kind, conn, gen, length, offset, credits=0, flags=0):
    return struct.pack("<HBBIIIQII", 0x4453, 1, kind, conn, gen, length, offset, credits, flags)


forged = 0
q = theirs[0]
# Messages that would take over, feed or end the victim's other
# connections, were they delivered.
for conn in live:
    for gen in range(8):
        for kind in (1, 3, 4, 9, 2, 6):
            body = rnd.randbytes(100) if kind == 1 else (rnd.randbytes(16) if kind == 6 else b"")
            h = header(kind, conn, gen, len(body), rnd.choice([0, 1, 1 << 20, rnd.getrandbits(63)]),
                       credits=rnd.choice([0, 1 << 31, 0xFFFFFFFF]), flags=len(body) or 1)
            if append(q, h + body):
                forged += 1
print("forged", forged, flush=True)
time.sleep(0.3)

# Records that lie, by seed: a length past the tail, below a header, far
# above any message; or a tail that makes no sense.
how = a.seed % 3
if how == 0:
    append(q, header(1, live[0], 0, 4, 0) + b"abcd", length=rnd.choice([3, 0xFFFFFFFF, 70000]))
elif how == 1:
    u64(q[0] + 128).value = u64(q[0] + 64).value + CAP + 8 * rnd.randrange(1, 1000)
else:
    u64(q[0] + 128).value = u64(q[0] + 64).value - 8
time.sleep(0.2)

# Then random bytes over everything it can write.
wrote = 0
for lo, hi in theirs + ours:
    ctypes.memmove(lo, rnd.randbytes(hi - lo), hi - lo)
    wrote += 1
for lo, hi, ino, path in maps():
    base = os.path.basename(path)
    if path.startswith("/dev/shm/") and (base == f"p{me}" or base.startswith(f"sd{me}-")):
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue
        size = os.fstat(fd).st_size
        with mmap.mmap(fd, size) as m:
            m[:] = rnd.randbytes(size)
        os.close(fd)
        wrote += 1
print("wrote", wrote, flush=True)

# The queue the victim maps: it must not be able to shrink under it.
refused = True
for fd in own_inodes.values():
    try:
        os.ftruncate(fd, 4096)
        refused = False
    except OSError:
        pass
print("truncate", "refused" if refused else "allowed", flush=True)

# Last, its own page, which the victim reads: shrunk to nothing (a victim
# that mapped it would die of SIGBUS at its next look; this process, which
# maps it, may).
for lo, hi, ino, path in maps():
    if path.startswith("/dev/shm/") and os.path.basename(path) == f"p{me}":
        print("page truncated", flush=True)
        os.truncate(path, 0)
        break

signal.alarm(3)
try:
    for _ in range(10):
        c.sendall(b"y" * 5000)
        c.recv(100000)
except OSError as e:
    print("hostile: its own connection broke:", e, flush=True)
# No goodbye: its own library may wait on what it filled.
os._exit(0)
