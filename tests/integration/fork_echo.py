#!/usr/bin/env python3
"""TCP echo with socketserver.ForkingTCPServer, for
tests/integration/python_forking.sh.

server: a ForkingTCPServer on 127.0.0.1:--port: the parent accepts, forks,
  closes its copy of the connection (after --close-delay seconds) and goes
  back to accept; the child
  echoes every byte until the client's EOF and ends (os._exit, as
  socketserver does). The parent serves --clients connections, then waits
  for its children, fails unless every one exited 0, and exits 0.
client: --conns connections one after another; on each
  1. ping-pong: --rounds messages of 1 to 64 B, one at a time, every echo
     compared;
  2. bulk: the next --sizes entry (cycling) of pseudo-random bytes, written
     in random-sized pieces (--pace seconds apart) while a thread reads the
     echo, then a
     half-close, the echo read to EOF and compared byte for byte.
keeper: the same service in the accepting process itself, while a forked
  child holds a copy of the connection until it is SIGKILLed.
handoff, exec, spawn, posix_spawn, system: the accepting process echoes the first
  --handoff-after messages itself (the connection is direct by then), then
  hands the connection over and closes its copy (after --close-delay s):
  handoff: to a forked child that echoes the rest (it inherited a direct
    socket: its first use moves the connection back to the kernel);
  exec: to a forked child that puts the socket on its stdin and stdout and
    execs cat without the library;
  spawn: to cat without the library, started by subprocess (vfork + exec);
  posix_spawn: to cat without the library, started by os.posix_spawn with
    dup2 file actions (the socket itself keeps FD_CLOEXEC);
  system: to cat without the library, started by os.system (the server
    waits for it there);
  exec_self: to a forked child that puts the socket on its stdin and
    stdout and execs this program as stdio_echo, with the environment as
    it is (the library too, when preloaded), which echoes the rest.
Any wait longer than --idle seconds is a failure (exit 1).
"""
import argparse
import os
import random
import signal
import socket
import socketserver
import sys
import threading
import time


class EchoHandler(socketserver.BaseRequestHandler):
    def handle(self):
        sock = self.request
        sock.settimeout(self.server.idle)
        while True:
            data = sock.recv(65536)
            if not data:
                return
            sock.sendall(data)


class Server(socketserver.ForkingTCPServer):
    allow_reuse_address = True
    block_on_close = True

    def __init__(self, args):
        self.idle = args.idle
        self.timeout = args.idle  # bounds each handle_request()
        self.started = 0
        self.parent_pid = os.getpid()
        self.close_delay = args.close_delay
        super().__init__(("127.0.0.1", args.port), EchoHandler)

    def process_request(self, request, client_address):
        # Counted here, not per handle_request(), which also returns after
        # a failed accept.
        self.started += 1
        super().process_request(request, client_address)

    def close_request(self, request):
        # The parent's copy; --close-delay keeps it open while the child
        # already serves, so that the child is its only holder mid-stream.
        if os.getpid() == self.parent_pid and self.close_delay:
            time.sleep(self.close_delay)
        super().close_request(request)

    def handle_timeout(self):
        sys.exit(f"server: no connection for {self.idle} s ({self.started} served)")


def serve(args):
    # Stopped early (the client failed): end through exit(), so a preloaded
    # library still writes its counters. Children inherit the handler and
    # still end through socketserver's os._exit.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("server: SIGTERM before all clients were served"))
    server = Server(args)
    while server.started < args.clients:
        server.handle_request()
    # Reaped here rather than by server_close()'s collect_children, which
    # waits without a bound and drops the exit statuses. A child's waits
    # are bounded by --idle each, so twice that is plenty for the last one.
    children = set(server.active_children or ())
    failed = []
    limit = 2 * args.idle
    deadline = time.monotonic() + limit
    while children:
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                code = os.waitstatus_to_exitcode(status)
                if code:
                    failed.append(f"child {pid}: " + (f"exit {code}" if code > 0 else f"signal {-code}"))
        if children and time.monotonic() > deadline:
            sys.exit(f"server: {len(children)} children still running {limit} s after the last accept")
        time.sleep(0.02)
    server.active_children = None
    server.server_close()
    if failed:
        sys.exit(f"server: {len(failed)} of {server.started} children failed: " + ", ".join(failed))
    print(f"server: {server.started} connections, each served by a forked child that exited 0")


def accepted(args, role):
    """Listens on 127.0.0.1:--port and yields --clients accepted
    connections, one after another. SIGTERM before the last one, or no
    connection for --idle seconds, ends the process with a failure."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"{role}: SIGTERM before all clients were served"))
    lsock = socket.create_server(("127.0.0.1", args.port), reuse_port=False)
    lsock.settimeout(args.idle)
    for served in range(args.clients):
        try:
            conn, _ = lsock.accept()
        except TimeoutError:
            sys.exit(f"{role}: no connection for {args.idle} s ({served} served)")
        yield conn


def keeper(args):
    """Serves --clients connections one after another in this process;
    for each it first forks a child that keeps its inherited copy of the
    connection without touching it, and SIGKILLs that child after
    --kill-after seconds, reaping it only at the end (a zombie holds
    nothing)."""
    children = []
    for conn in accepted(args, "keeper"):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)  # holds the socket, never uses it
            os._exit(0)
        children.append(pid)
        timer = threading.Timer(args.kill_after, os.kill, (pid, signal.SIGKILL))
        timer.start()
        conn.settimeout(args.idle)
        with conn:
            while True:
                data = conn.recv(65536)
                if not data:
                    break
                conn.sendall(data)
        timer.join()
    for pid in children:
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != -signal.SIGKILL:
            sys.exit(f"keeper: child {pid} ended with status {status}, not by SIGKILL")
    print(f"keeper: {len(children)} connections served while a killed child held a copy")


def clean_env():
    """The environment without the library: the program started never
    runs it, so it reads and writes the kernel socket alone."""
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("SDIRECT_")}


def handoff(args):
    """Serves --clients connections one after another: the first
    --handoff-after messages here, the rest by whoever --role says."""
    children = []
    for conn in accepted(args, args.role):
        conn.settimeout(args.idle)
        for k in range(args.handoff_after):
            data = conn.recv(65536)
            if not data:
                sys.exit(f"{args.role}: EOF after {k} of {args.handoff_after} messages")
            conn.sendall(data)
        if args.role != "handoff":
            conn.setblocking(True)  # cat reads and writes a blocking fd
        if args.role == "handoff":
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    while True:
                        data = conn.recv(65536)
                        if not data:
                            break
                        conn.sendall(data)
                except OSError as e:
                    print(f"handoff child: {e!r}", file=sys.stderr)
                    code = 1
                os._exit(code)
            children.append(pid)
        elif args.role == "exec":
            pid = os.fork()
            if pid == 0:
                try:
                    os.dup2(conn.fileno(), 0)
                    os.dup2(conn.fileno(), 1)
                    os.execve("/bin/cat", ["cat"], clean_env())
                finally:
                    os._exit(127)
            children.append(pid)
        elif args.role == "exec_self":
            pid = os.fork()
            if pid == 0:
                try:
                    os.dup2(conn.fileno(), 0)
                    os.dup2(conn.fileno(), 1)
                    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), "stdio_echo",
                                               "--port", str(args.port), "--idle", str(args.idle)],
                              os.environ)
                finally:
                    os._exit(127)
            children.append(pid)
        elif args.role == "spawn":
            import subprocess
            proc = subprocess.Popen(["cat"], stdin=conn.fileno(), stdout=conn.fileno(), env=clean_env())
            children.append(proc)
        elif args.role == "posix_spawn":
            fd = conn.fileno()
            pid = os.posix_spawn("/bin/cat", ["cat"], clean_env(),
                                 file_actions=[(os.POSIX_SPAWN_DUP2, fd, 0), (os.POSIX_SPAWN_DUP2, fd, 1)])
            children.append(pid)
        elif args.role == "system":
            fd = conn.fileno()
            os.set_inheritable(fd, True)
            env_keep = os.environ.copy()
            os.environ.clear()
            os.environ.update(clean_env())
            status = os.system(f"exec cat <&{fd} >&{fd}")
            os.environ.clear()
            os.environ.update(env_keep)
            if status:
                sys.exit(f"system: cat ended with status {status}")
        if args.close_delay:
            time.sleep(args.close_delay)
        conn.close()
    failed = []
    for child in children:
        if isinstance(child, int):
            _, status = os.waitpid(child, 0)
            code = os.waitstatus_to_exitcode(status)
        else:
            code = child.wait(args.idle * 2)
        if code:
            failed.append(f"{child if isinstance(child, int) else child.pid}: {code}")
    if failed:
        sys.exit(f"{args.role}: {len(failed)} of {len(children)} servers failed: " + ", ".join(failed))
    print(f"{args.role}: {args.clients} connections, each handed over after {args.handoff_after} messages")


def stdio_echo(args):
    """The handler exec_self starts: echoes its stdin socket (stdout is
    the same socket) until EOF, then exits 0 through exit(), so a
    preloaded library writes its counters."""
    sock = socket.socket(fileno=0)
    sock.settimeout(args.idle)
    while True:
        data = sock.recv(65536)
        if not data:
            break
        sock.sendall(data)
    sock.close()
    os.close(1)


def recv_exactly(sock, n, what):
    got = bytearray()
    while len(got) < n:
        data = sock.recv(n - len(got))
        if not data:
            sys.exit(f"client: {what}: EOF after {len(got)} of {n} B echoed")
        got += data
    return got


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def one_connection(index, size, rng, args):
    name = f"connection {index + 1} of {args.conns}"
    try:
        sock = socket.create_connection(("127.0.0.1", args.port), timeout=args.idle)
    except OSError as e:
        sys.exit(f"client: {name}: connect: {e!r}")
    try:
        # Small round trips first, so the upgrade has happened (or not)
        # before the bulk part.
        for k in range(args.rounds):
            msg = rng.randbytes(rng.randint(1, 64))
            sock.sendall(msg)
            echo = recv_exactly(sock, len(msg), f"{name}, round trip {k + 1}")
            if echo != msg:
                sys.exit(f"client: {name}, round trip {k + 1}: {len(msg)} B sent, echo differs "
                         f"at byte {first_difference(echo, msg)}")
        payload = rng.randbytes(size)
        received = bytearray()
        errors = []
        reader_rng = random.Random(rng.random())  # the reader's own, not shared across threads

        def reader():
            try:
                while True:
                    data = sock.recv(reader_rng.randint(1, 256 << 10))
                    if not data:
                        return
                    received.extend(data)
            except OSError as e:
                errors.append(e)

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        sent = 0
        view = memoryview(payload)
        try:
            while sent < size:
                end = min(size, sent + rng.randint(1, 256 << 10))
                sock.sendall(view[sent:end])
                sent = end
                if args.pace:
                    time.sleep(args.pace)
            sock.shutdown(socket.SHUT_WR)
        except OSError as e:
            thread.join(1)
            sys.exit(f"client: {name}: sending {size} B: {e!r} after {sent} B sent, "
                     f"{len(received)} B echoed")
        thread.join(args.idle + 5)
        if thread.is_alive():
            sys.exit(f"client: {name}: no EOF {args.idle + 5} s after the half-close; "
                     f"{size} B sent, {len(received)} B echoed")
        if errors:
            sys.exit(f"client: {name}: reading the echo of {size} B: {errors[0]!r} "
                     f"after {len(received)} B")
        if received != payload:
            sys.exit(f"client: {name}: {size} B sent, {len(received)} B echoed, "
                     f"first difference at byte {first_difference(received, payload)}")
    except OSError as e:
        sys.exit(f"client: {name}: {e!r}")
    finally:
        sock.close()
    return size


def client(args):
    rng = random.Random(args.seed)
    total = 0
    for i in range(args.conns):
        total += one_connection(i, args.sizes[i % len(args.sizes)], rng, args)
    print(f"client: {args.conns} connections one after another, {args.rounds} round trips each, "
          f"{total} B bulk echoed intact")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["server", "keeper", "client", "handoff", "exec", "spawn",
                                    "posix_spawn", "system", "exec_self", "stdio_echo"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--clients", type=int, default=1, help="server: connections to serve")
    p.add_argument("--conns", type=int, default=6, help="client: connections, one after another")
    p.add_argument("--rounds", type=int, default=200, help="client: ping-pong round trips per connection")
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 1000, 100000, 3 << 20], help="client: bulk bytes per connection, cycled")
    p.add_argument("--close-delay", type=float, default=0.0,
                   help="server: seconds the parent keeps its copy of each connection")
    p.add_argument("--kill-after", type=float, default=0.1,
                   help="keeper: seconds before the holding child is SIGKILLed")
    p.add_argument("--pace", type=float, default=0.0,
                   help="client: seconds between the bulk part's pieces")
    p.add_argument("--handoff-after", type=int, default=50,
                   help="handoff and the roles that start cat: messages echoed before the handover")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--idle", type=float, default=15.0)
    args = p.parse_args()
    roles = {"server": serve, "keeper": keeper, "client": client, "stdio_echo": stdio_echo}
    roles.update(dict.fromkeys(["handoff", "exec", "spawn", "posix_spawn", "system", "exec_self"],
                               handoff))
    roles[args.role](args)


if __name__ == "__main__":
    main()
