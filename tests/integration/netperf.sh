#!/usr/bin/env bash
# netperf against netserver in its default forking mode: netserver accepts
# each netperf control connection and forks a child that serves the test
# (its data connection is made in the child). TCP_RR, TCP_STREAM and
# TCP_MAERTS for three seconds each; each must exit 0 with a positive result.
# Then, with the library, each test's data connection must have run
# direct (the client's counters: one direct connection per test with bytes
# on the fabric). It runs the library's default upgrade policy: the data
# connections earn their upgrade as they go on (they start on TCP, and
# both processes build their engines only then: up to a second on a
# loaded host, so each test runs three seconds).
export SDIRECT_UPGRADE_AFTER_MS="${SDIRECT_UPGRADE_AFTER_MS-}"
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_need netperf:netperf netserver:netperf
it_preflight

port="$(it_free_port)"
it_start server 60 netserver -D -4 -L 127.0.0.1 -p "$port"
srv=$it_pid
if ! it_wait_listen "$port" "$srv"; then
    it_bad "netserver did not listen on 127.0.0.1:$port"
    it_finish
fi

for test in TCP_RR TCP_STREAM TCP_MAERTS; do
    it_run "client-$test" 30 netperf -4 -H 127.0.0.1 -p "$port" -t "$test" -l 3 -P 0 \
        >"$it_tmp/client-$test.out" 2>"$it_tmp/client-$test.err"
    rc=$?
    # -P 0: one line, the result last (transactions/s or 10^6 bits/s).
    result="$(awk 'NF >= 5 { r = $NF } END { print r + 0 }' "$it_tmp/client-$test.out")"
    if ((rc == 0)) && awk -v r="$result" 'BEGIN { exit !(r > 0) }'; then
        it_ok "netperf -t $test: $result $([[ $test == TCP_RR ]] && echo transactions/s || echo 10^6 bit/s)"
    else
        it_bad "netperf -t $test: $(it_status "$rc"), result '$result'; $(tail -n 1 "$it_tmp/client-$test.err")"
    fi
    if ((!it_kernel)); then
        # The data connection goes to a port netserver's child picked.
        read -r direct moved < <(awk -v port="$port" '
            { pp = ""; mode = ""; f = 0
              for (i = 1; i <= NF; i++) {
                  if ($i ~ /^peer=/) { pp = $i; sub(/.*:/, "", pp) }
                  else if ($i ~ /^mode=/) mode = substr($i, 6)
                  else if ($i ~ /^(tx|rx)_fabric=/) { v = $i; sub(/.*=/, "", v); f += v }
              }
              if (pp != port && mode == "direct") { d++; m += f } }
            END { printf "%d %.0f\n", d + 0, m + 0 }' "$it_tmp/client-$test.stats" 2>/dev/null || echo "0 0")
        if ((direct == 1 && moved > 0)); then
            it_ok "netperf -t $test: its data connection ran direct ($moved B on the fabric)"
        else
            it_bad "netperf -t $test: $direct direct data connection(s), $moved B on the fabric; expected 1 with bytes"
        fi
    fi
done

it_stop "$srv" TERM
it_finish
