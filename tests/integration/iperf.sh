#!/usr/bin/env bash
# iperf 2 (a thread per connection, blocking calls) on both ends: one
# server, two clients with CSV reports (-y C): 2 parallel streams
# client -> server, then one stream server -> client (-R, reverse on the
# same connection). Each must exit 0 and report bytes moved on every
# stream; then with 128 KiB and 1 MiB writes (-l). Every connection must
# have run direct, the 1 MiB writes by read zero-copy.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_need iperf:iperf
it_preflight

port="$(it_free_port)"
it_start server 60 iperf -s -B 127.0.0.1 -p "$port"
srv=$it_pid
if ! it_wait_listen "$port" "$srv"; then
    it_bad "iperf -s did not listen on 127.0.0.1:$port"
    it_finish
fi

# check_csv FILE STREAMS: STREAMS report lines (CSV: ...,id,interval,bytes,bps),
# each with bytes > 0.
check_csv() {
    awk -F, -v want="$2" '
        NF >= 9 && $8 ~ /^[0-9]+$/ {
            n++; bytes += $8
            if ($8 + 0 <= 0) bad++
        }
        END {
            if (n != want) { printf "%d report lines, expected %d\n", n, want; exit 1 }
            if (bad) { printf "%d streams moved no bytes\n", bad; exit 1 }
            printf "%d stream(s), %.0f B\n", n, bytes
        }' "$1"
}

# run_client NAME STREAMS ARGS...
run_client() {
    local name="$1" streams="$2" rc verdict
    shift 2
    it_run "client-$name" 20 iperf -c 127.0.0.1 -p "$port" -t 2 -y C "$@" \
        >"$it_tmp/client-$name.csv" 2>"$it_tmp/client-$name.err"
    rc=$?
    if verdict="$(check_csv "$it_tmp/client-$name.csv" "$streams")" && ((rc == 0)); then
        it_ok "iperf -c $* ($name): $verdict"
    else
        it_bad "iperf -c $* ($name): $(it_status "$rc"); $verdict"
    fi
}

run_client forward 2 -P 2
# Large writes: 128 KiB (read zero-copy's threshold) and 1 MiB a call.
run_client len128k 1 -l 128K
run_client len1m 1 -l 1M
# Last: iperf 2.1.8's server crashes (SIGSEGV, with plain TCP too) when a
# client that follows a reverse test sends its first bytes some 0.3 s after
# connecting, and a fresh process's connect under the library waits that
# long for its fabric engine (SDIRECT_ENGINE_WAIT_MS).
run_client reverse 1 -R

# iperf's SIGTERM handler waits for its threads and exits 0.
it_stop "$srv" TERM
it_check "$it_stop_rc" "iperf -s ended on SIGTERM: $it_stop_text"

it_expect_direct "$port" 3 server
it_expect_direct "$port" 2 client-forward
it_expect_direct "$port" 1 client-reverse
it_expect_direct "$port" 1 client-len128k client-len1m
# 1 MiB blocking writes (iperf sets SO_SNDTIMEO) go by read zero-copy.
it_expect_counter "$port" client-len1m tx_zcopy
it_finish
