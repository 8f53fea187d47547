#!/usr/bin/env bash
# A client process that lives about 100 ms against a preloaded server,
# under the library's own upgrade policy: its connection earns its
# upgrade (16 calls that moved bytes and SDIRECT_UPGRADE_AFTER_MS) within
# that time, but its process has no engine, and the ask would start a
# build (~5 ms of CPU, and the engine's teardown at exit) that such a
# client does not earn back. So it does not ask before
# SDIRECT_BUILD_AFTER_MS (default 250):
#   ten such clients each echo 40 exchanges of 100 B exactly;
#   none of them starts an engine build (its debug log has no
#     "engine build started" line) and none of their connections asked to go
#     direct (no stats line: a connection that never asked has none);
#   with SDIRECT_BUILD_AFTER_MS=0 (the former policy), the same client
#     does start its build: its log says so (so the check above can fail).
# The server is preloaded and long-lived; it builds its engine when its
# first connection asks.
export SDIRECT_UPGRADE_AFTER_MS="${SDIRECT_UPGRADE_AFTER_MS-}"
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_preflight

port="$(it_free_port)"
cat >"$it_tmp/server.py" <<'PY'
import socket, sys, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
def echo(c):
    while True:
        d = c.recv(4096)
        if not d:
            break
        c.sendall(d)
    c.close()
for _ in range(11):
    c, _ = s.accept()
    threading.Thread(target=echo, args=(c,)).start()
PY
cat >"$it_tmp/client.py" <<'PY'
import socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
wrong = 0
for i in range(40):
    data = bytes([i]) * 100
    c.sendall(data)
    got = b""
    while len(got) < len(data):
        part = c.recv(100 - len(got))
        if not part:
            break
        got += part
    wrong += got != data
    time.sleep(0.002)
c.close()
print("echo", "exact" if wrong == 0 else "WRONG (%d)" % wrong, flush=True)
PY

it_start server 60 "$it_py" "$it_tmp/server.py" "$port"
srv=$it_pid
if ! it_wait_listen "$port" "$srv"; then
    it_bad "echo server did not listen on 127.0.0.1:$port"
    it_finish
fi

# client ROLE [ENV...]: one client process, its log in ROLE.sdlog.
client() {
    local role="$1" rc
    shift
    (export SDIRECT_LOG=debug SDIRECT_LOG_FILE="$it_tmp/$role.sdlog" "$@"
     it_run "$role" 20 "$it_py" "$it_tmp/client.py" "$port") </dev/null >"$it_tmp/$role.out" 2>&1
    rc=$?
    it_check "$rc" "$role: $(it_status "$rc"); $(tail -n 1 "$it_tmp/$role.out")"
    grep -qx "echo exact" "$it_tmp/$role.out" || it_bad "$role: $(tail -n 1 "$it_tmp/$role.out")"
}

builds=0 asked=0
for ((i = 0; i < 10; i++)); do
    client "short-$i"
    grep -q "engine build started" "$it_tmp/short-$i.sdlog" 2>/dev/null && builds=$((builds + 1))
    [[ -s "$it_tmp/short-$i.stats" ]] && asked=$((asked + 1))
done
if ((it_kernel)); then
    it_log "build checks skipped (SDIRECT_IT_KERNEL=1)"
else
    if ((builds == 0 && asked == 0)); then
        it_ok "10 short clients: no engine build, no connection asked to go direct"
    else
        it_bad "10 short clients: $builds started an engine build, $asked wrote connection stats; expected none"
    fi
    client former SDIRECT_BUILD_AFTER_MS=0
    if grep -q "engine build started" "$it_tmp/former.sdlog" 2>/dev/null; then
        it_ok "with SDIRECT_BUILD_AFTER_MS=0 the same client builds its engine"
    else
        it_bad "with SDIRECT_BUILD_AFTER_MS=0 the same client built no engine: $(tail -n 2 "$it_tmp/former.sdlog" 2>/dev/null)"
    fi
fi
((it_kernel)) && client former
if it_reap "$srv" 20; then
    it_check "$it_stop_rc" "server: $it_stop_text"
else
    it_bad "server still running 20 s after its last client"
fi
it_finish
