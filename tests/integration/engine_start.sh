#!/usr/bin/env bash
# What an engine build opens: a python echo server and its client, both
# preloaded, the server under strace (every openat of the process and its
# threads, the builder's too), 500 round trips of 1 KiB. After its
# client's echo (its engine built
# and its connection direct), the server opens /proc/kallsyms itself and
# prints the first line it reads.
#   the echo is exact and the connection direct on both ends;
#   the application's own read of /proc/kallsyms is what the kernel gives
#     (a line "ADDRESS TYPE NAME"), so that file is hidden from nobody but
#     the provider libraries inside the library's calls;
#   /proc/kallsyms is opened exactly once in the server: its own open. The
#     verbs provider's set-up, run by libfabric's first fi_getinfo, used to
#     read the whole file twice (about 100 ms of every build).
# The client's connect waits for its engine, and the server accepts only
# once its own is built (its log says so; it builds under strace, slowly),
# so that the echo itself runs direct.
export SDIRECT_ENGINE_WAIT_MS="${SDIRECT_ENGINE_WAIT_MS:-30000}"
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_need strace:strace
it_preflight

port="$(it_free_port)"
cat >"$it_tmp/server.py" <<'PY'
import os, socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
log = os.environ.get("SDIRECT_LOG_FILE")
deadline = time.monotonic() + 20
while log and time.monotonic() < deadline:
    if os.path.exists(log) and "engine built" in open(log).read():
        break
    time.sleep(0.02)
c, _ = s.accept()
while True:
    part = c.recv(65536)
    if not part:
        break
    c.sendall(part)
c.close()
with open("/proc/kallsyms") as f:
    print("kallsyms:", f.readline().strip(), flush=True)
PY
cat >"$it_tmp/client.py" <<'PY'
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
wrong = 0
for i in range(500):
    data = bytes((i * 7 + j) % 251 for j in range(1024))
    c.sendall(data)
    got = b""
    while len(got) < len(data):
        part = c.recv(len(data) - len(got))
        if not part:
            break
        got += part
    wrong += got != data
c.shutdown(socket.SHUT_WR)
print("echo", "exact" if wrong == 0 and c.recv(1) == b"" else "WRONG (%d)" % wrong, flush=True)
PY

((it_kernel)) || export SDIRECT_LOG=debug SDIRECT_LOG_FILE="$it_tmp/server.sdlog"
it_start server 40 strace -f -e trace=openat,open -o "$it_tmp/server.trace" \
    "$it_py" "$it_tmp/server.py" "$port"
srv=$it_pid
unset SDIRECT_LOG SDIRECT_LOG_FILE
if ! it_wait_listen "$port" "$srv" 20; then
    it_bad "echo server did not listen on 127.0.0.1:$port; $(tail -n 2 "$it_tmp/server.log")"
    it_finish
fi
it_run client 30 "$it_py" "$it_tmp/client.py" "$port" </dev/null >"$it_tmp/client.out" 2>&1
rc=$?
it_check "$rc" "client: $(it_status "$rc"); $(tail -n 1 "$it_tmp/client.out")"
if grep -qx "echo exact" "$it_tmp/client.out"; then
    it_ok "500 echoes of 1 KiB exact"
else
    it_bad "echo: $(tail -n 1 "$it_tmp/client.out")"
fi
if it_reap "$srv" 20; then
    it_check "$it_stop_rc" "server: $it_stop_text"
else
    it_bad "server still running 20 s after its client ended"
fi

line="$(sed -n 's/^kallsyms: //p' "$it_tmp/server.log" | head -n 1)"
if [[ "$line" =~ ^[0-9a-f]+\ [A-Za-z]\ [^\ ]+ ]]; then
    it_ok "the server's own read of /proc/kallsyms: '$line'"
else
    it_bad "the server's own read of /proc/kallsyms gave '$line'; expected 'ADDRESS TYPE NAME'"
fi
opens="$(grep -c '"/proc/kallsyms"' "$it_tmp/server.trace")"
if [[ "$opens" == 1 ]]; then
    it_ok "/proc/kallsyms opened once in the server (its own open)"
else
    it_bad "/proc/kallsyms opened $opens times in the server; expected once (its own open): $(grep '"/proc/kallsyms"' "$it_tmp/server.trace" | head -n 3 | tr '\n' ';')"
fi
if ((!it_kernel)) && ! grep -q 'libfabric.so.1"' "$it_tmp/server.trace"; then
    it_bad "the server never opened libfabric: no engine was built"
fi
it_expect_direct "$port" 1 server client
it_finish
