#!/usr/bin/env bash
# iperf3 (select() loop, one control and N data connections per test) on
# both ends: one server, two clients with -J: 2 parallel streams
# client -> server, then one stream server -> client (-R). Each must exit 0,
# report no error, and move bytes (received > 0 and <= sent on every
# stream); then with 128 KiB and 1 MiB writes (-l). Then every connection
# must have run direct. The server listens
# as iperf3 does by default, on the dual-stack IPv6 socket: it sees its
# IPv4 clients as IPv4-mapped addresses, the clients see plain IPv4.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_need iperf3:iperf3
it_preflight

port="$(it_free_port)"
it_start server 60 iperf3 -s -p "$port"
srv=$it_pid
if ! it_wait_listen "$port" "$srv"; then
    it_bad "iperf3 -s did not listen on port $port"
    it_finish
fi

# check_json FILE STREAMS: iperf3's JSON has no error, STREAMS streams, and
# every stream received > 0 and at most what was sent.
check_json() {
    "$it_py" - "$1" "$2" <<'EOF'
import json, sys
path, want = sys.argv[1], int(sys.argv[2])
try:
    d = json.load(open(path))
except Exception as e:
    sys.exit(f"no JSON result ({e})")
if d.get("error"):
    sys.exit(f"iperf3 error: {d['error']}")
end = d.get("end", {})
streams = end.get("streams", [])
if len(streams) != want:
    sys.exit(f"{len(streams)} streams in the result, expected {want}")
for i, s in enumerate(streams):
    sent, rcvd = s["sender"]["bytes"], s["receiver"]["bytes"]
    if rcvd <= 0 or rcvd > sent:
        sys.exit(f"stream {i}: sent {sent} B, received {rcvd} B")
sent = end["sum_sent"]["bytes"]
rcvd = end["sum_received"]["bytes"]
print(f"{want} stream(s), sent {sent} B, received {rcvd} B, "
      f"{end['sum_received']['bits_per_second'] / 1e9:.2f} Gbit/s")
EOF
}

# run_client NAME STREAMS ARGS...
run_client() {
    local name="$1" streams="$2" rc verdict
    shift 2
    it_run "client-$name" 20 iperf3 -c 127.0.0.1 -p "$port" -t 2 -J "$@" \
        >"$it_tmp/client-$name.json" 2>"$it_tmp/client-$name.err"
    rc=$?
    if verdict="$(check_json "$it_tmp/client-$name.json" "$streams" 2>&1)" && ((rc == 0)); then
        it_ok "iperf3 -c $* ($name): $verdict"
    else
        it_bad "iperf3 -c $* ($name): $(it_status "$rc"); $verdict"
    fi
}

run_client forward 2 -P 2
run_client reverse 1 -R
# Large writes: 128 KiB (read zero-copy's threshold) and 1 MiB a call.
run_client len128k 1 -l 128K
run_client len1m 1 -l 1M

# iperf3 ends on SIGTERM through exit(1) ("interrupt - the server has
# terminated"), which writes the stats.
it_stop "$srv" TERM
it_check $((it_stop_rc != 0 && it_stop_rc != 1)) "iperf3 -s ended on SIGTERM: $it_stop_text"

# forward: control + 2 data; reverse: control + 1 data.
it_expect_direct "$port" 5 server
it_expect_direct "$port" 3 client-forward
it_expect_direct "$port" 2 client-reverse
it_expect_direct "$port" 2 client-len128k client-len1m
it_finish
