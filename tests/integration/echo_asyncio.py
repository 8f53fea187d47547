#!/usr/bin/env python3
"""Framed echo over asyncio streams, for tests/integration/python_asyncio.sh.

Frames are a 4-byte big-endian length and that many bytes.
server: asyncio.start_server; each connection reads frames with
  readexactly and writes each back (write + drain) until the client's EOF,
  then closes; exits 0 after --clients connections.
client: --conns connections at once (asyncio.gather), each
  1. ping-pong: --rounds frames of random sizes (0 B to 1 MiB), one at a
     time, every echo compared;
  2. pipelined: 64 frames written by one task while another reads the
     echoes, so both directions fill up at once;
  3. write_eof(), then expects EOF after the last echo.
Any wait longer than --idle seconds is a failure (exit 1).
"""
import argparse
import asyncio
import random
import signal
import sys


def frame(payload):
    return len(payload).to_bytes(4, "big") + payload


async def read_frame(reader):
    size = int.from_bytes(await reader.readexactly(4), "big")
    return await reader.readexactly(size)


async def serve(args):
    # Stopped early (the client failed): end through exit(), so a preloaded
    # library still writes its counters.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("server: SIGTERM before all clients were served"))
    done = asyncio.Event()
    finished = 0
    echoed = 0

    async def handle(reader, writer):
        nonlocal finished, echoed
        try:
            while True:
                try:
                    payload = await read_frame(reader)
                except asyncio.IncompleteReadError as e:
                    if e.partial:
                        raise
                    break
                writer.write(frame(payload))
                await writer.drain()
                echoed += len(payload)
        finally:
            writer.close()
            await writer.wait_closed()
            finished += 1
            if finished == args.clients:
                done.set()

    server = await asyncio.start_server(handle, "127.0.0.1", args.port)
    async with server:
        await done.wait()
    print(f"server: {finished} connections, {echoed} B echoed")


def sizes(rng, n):
    # Mostly small, some around the usual buffer sizes, a few large.
    pick = [0, 1, 2, 63, 64, 4095, 4096, 65536, 65537, 1 << 20]
    return [rng.choice(pick) if rng.random() < 0.3 else rng.randint(0, 300000) for _ in range(n)]


async def one_client(args, i):
    rng = random.Random(args.seed * 100 + i)
    idle = args.idle
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", args.port), idle)
    total = 0
    for n, size in enumerate(sizes(rng, args.rounds)):
        payload = rng.randbytes(size)
        writer.write(frame(payload))
        await asyncio.wait_for(writer.drain(), idle)
        back = await asyncio.wait_for(read_frame(reader), idle)
        if back != payload:
            raise AssertionError(f"conn {i} round {n}: sent {size} B, got back {len(back)} B differing")
        total += size

    payloads = [rng.randbytes(s) for s in sizes(rng, 64)]

    async def send_all():
        for p in payloads:
            writer.write(frame(p))
            await asyncio.wait_for(writer.drain(), idle)

    sender = asyncio.create_task(send_all())
    for n, p in enumerate(payloads):
        back = await asyncio.wait_for(read_frame(reader), idle)
        if back != p:
            raise AssertionError(f"conn {i} pipelined frame {n}: sent {len(p)} B, got back {len(back)} B differing")
        total += len(p)
    await sender

    writer.write_eof()
    rest = await asyncio.wait_for(reader.read(), idle)
    if rest:
        raise AssertionError(f"conn {i}: {len(rest)} unexpected bytes before EOF")
    writer.close()
    await writer.wait_closed()
    return total


async def client(args):
    totals = await asyncio.gather(*(one_client(args, i) for i in range(args.conns)))
    print(f"client: {args.conns} connections, {args.rounds} ping-pong + 64 pipelined frames each, "
          f"{sum(totals)} B echoed intact")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["server", "client"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--clients", type=int, default=1, help="server: connections to serve")
    p.add_argument("--conns", type=int, default=4, help="client: connections at once")
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--idle", type=float, default=15.0)
    args = p.parse_args()
    try:
        asyncio.run(serve(args) if args.role == "server" else client(args))
    except (AssertionError, asyncio.TimeoutError, asyncio.IncompleteReadError, OSError) as e:
        sys.exit(f"{args.role}: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
