#!/usr/bin/env python3
# A hostile peer of another uid (crossuser_hostile.sh): it connects to the
# victim with SDIRECT_CROSS_USER=1, exchanges a few messages so that the
# connection goes direct, then writes --seed random bytes over every shm
# region of another process it has mapped (the victim's, opened to its uid
# for the connection) and goes on sending. Prints "wrote N" (regions
# written) or "no region" when it found none (the connection not direct).
import argparse
import mmap
import os
import random
import socket
import time

p = argparse.ArgumentParser()
p.add_argument("--port", type=int, required=True)
p.add_argument("--seed", type=int, default=1)
a = p.parse_args()

c = socket.create_connection(("127.0.0.1", a.port), timeout=10)
for _ in range(40):
    c.sendall(b"x" * 1000)
    c.recv(100000)
time.sleep(0.3)
me = "/dev/shm/sd" + str(os.getpid()) + "-"
targets = set()
with open("/proc/self/maps") as f:
    for line in f:
        parts = line.split(None, 5)
        if len(parts) == 6:
            path = parts[5].strip()
            if path.startswith("/dev/shm/sd") and not path.startswith(me) and \
                    "/sdirect-" not in path and "(deleted)" not in path:
                targets.add(path)
if not targets:
    print("no region", flush=True)
    raise SystemExit(0)
rnd = random.Random(a.seed)
for path in sorted(targets):
    fd = os.open(path, os.O_RDWR)
    size = os.fstat(fd).st_size
    with mmap.mmap(fd, size) as m:
        m[:] = rnd.randbytes(size)
    os.close(fd)
print("wrote", len(targets), flush=True)
try:
    for _ in range(10):
        c.sendall(b"y" * 5000)
        c.recv(100000)
except OSError as e:
    print("hostile: its own connection broke:", e, flush=True)
c.close()
