#!/usr/bin/env bash
# SDIRECT_QUEUES=cross (one uid's pairs through the provider) against all
# (through the library's own queues), the same build, interleaved run by
# run (the order alternates every run): sd_pingpong ping-pong (one-way
# latency) and stream at 64 B, 4 KiB, 64 KiB and 1 MiB, and sockperf
# ping-pong of 64 B (2 s, its median), both ends preloaded, every
# sd_pingpong line with the connection modes both ends' stats report.
#   benchmarks/queues_ab.sh OUT RUNS idle|stress [BUILD]
# stress: stress-ng --cpu 2 beside the runs, bounded with timeout and ended
# by its pid. Summary: benchmarks/queues_ab_summary.py OUT.
out="$1" runs="${2:-5}" load="${3:-idle}"
build="$(readlink -f "${4:-build}")"
lib="$build/intercept/libsdirect.so" pp="$build/benchmarks/sd_pingpong"
port=$((47000 + ($$ % 400) * 2))
tmp="$(mktemp -d)"
# A connection made before the engine is built stays on TCP: wait for it.
export SDIRECT_ENGINE_WAIT_MS=5000
# Both paths measured from the first exchange on, not the kernel before.
export SDIRECT_UPGRADE_AFTER_MS=0
hog=
if [[ "$load" == stress ]]; then
    timeout 1800 stress-ng --cpu 2 --quiet >/dev/null 2>&1 &
    hog=$!
    sleep 1
fi
next_port() { port=$((port + 1)); ((port > 47990)) && port=47000; }
# one QUEUES SIZE MODE ITERS
one() {
    local line mode sp
    next_port
    SDIRECT_QUEUES=$1 SDIRECT_STATS_FILE="$tmp/s" LD_PRELOAD="$lib" timeout 60 "$pp" server "$port" \
        --count 1 >/dev/null 2>&1 &
    sp=$!
    sleep 0.2
    line="$(SDIRECT_QUEUES=$1 SDIRECT_STATS_FILE="$tmp/c" LD_PRELOAD="$lib" timeout 60 "$pp" client \
        127.0.0.1 "$port" --size "$2" --iters "$4" --mode "$3" --warmup 5000 2>&1 | tail -n 1)"
    wait "$sp"
    # Both ends' stats (the client's last words may still be on their way).
    mode="$(cat "$tmp/c" "$tmp/s" 2>/dev/null | grep -o 'mode=[a-z]*' | sort -u | tr '\n' ',')"
    rm -f "$tmp/s" "$tmp/c"
    echo "$load q=$1 $line conn=$mode" >>"$out"
}
# sockperf QUEUES
sockperf_one() {
    local v sp
    next_port
    SDIRECT_QUEUES=$1 LD_PRELOAD="$lib" timeout 30 sockperf sr --tcp -i 127.0.0.1 -p "$port" \
        >/dev/null 2>&1 &
    sp=$!
    sleep 0.3
    v="$(SDIRECT_QUEUES=$1 LD_PRELOAD="$lib" timeout 20 sockperf pp --tcp -i 127.0.0.1 -p "$port" \
        -m 64 -t 2 2>&1 | grep -E 'percentile 50.000' | tr -s ' ')"
    kill "$sp" 2>/dev/null
    wait "$sp" 2>/dev/null
    echo "$load q=$1 sockperf64 $v" >>"$out"
}
for ((r = 0; r < runs; r++)); do
    order=(cross all)
    ((r % 2)) && order=(all cross)
    for q in "${order[@]}"; do
        one "$q" 64 pingpong 20000
        one "$q" 4096 pingpong 20000
        one "$q" 65536 pingpong 5000
        one "$q" 1048576 pingpong 500
        one "$q" 64 stream 200000
        one "$q" 4096 stream 100000
        one "$q" 65536 stream 20000
        one "$q" 1048576 stream 2000
        sockperf_one "$q"
    done
done
[[ -n "$hog" ]] && kill "$hog" 2>/dev/null && wait "$hog" 2>/dev/null
rm -rf "$tmp"
