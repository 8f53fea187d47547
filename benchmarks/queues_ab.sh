#!/usr/bin/env bash
# The two message paths of one uid's pairs against each other and against
# the kernel, in one run: kernel TCP, SDIRECT_QUEUES=cross (the provider's
# shm queues) and SDIRECT_QUEUES=all (the library's own queues, the
# default), the three interleaved row by row, the order rotating every
# run. Rows: sd_pingpong ping-pong (one-way latency, the mean of a run) at
# 1 B, 64 B, 4 KiB, 64 KiB and 1 MiB, and stream (MB/s) at 64 B, 4 KiB,
# 64 KiB and 1 MiB; upgraded from the first exchange on
# (SDIRECT_UPGRADE_AFTER_MS=0). A run of the library counts only when both
# ends' stats say direct.
#
#   benchmarks/queues_ab.sh OUT RUNS split|unpinned|hog|split-hog [BUILD]
#
# split: server on CPU 0, client on CPU 1; unpinned: the scheduler decides;
# hog: unpinned beside `stress-ng --cpu 2` (bounded with timeout, ended by
# its pid); split-hog: split beside it (each end shares its CPU with a
# hog). OUT (a new folder) gets raw.txt, one line per run; the summary
# (medians, ranges, runs counted) is printed and written to summary.txt by
# benchmarks/queues_ab_summary.py.
set -uo pipefail
if (($# < 3)) || ! [[ "$2" =~ ^[1-9][0-9]*$ ]] || [[ ! "$3" =~ ^(split|unpinned|hog|split-hog)$ ]]; then
    echo "usage: benchmarks/queues_ab.sh OUT RUNS split|unpinned|hog|split-hog [BUILD]" >&2
    exit 2
fi
out="$1" runs="$2" placement="$3"
here="$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")"
build="$(readlink -f "${4:-$here/../build}")"
lib="$build/intercept/libsdirect.so" pp="$build/benchmarks/sd_pingpong"
for f in "$lib" "$pp"; do
    [[ -e "$f" ]] || { echo "queues_ab.sh: $f is missing (build first: scripts/build.sh)" >&2; exit 1; }
done
if [[ -e "$out" ]]; then
    echo "queues_ab.sh: $out exists; give a new folder" >&2
    exit 1
fi
mkdir -p "$out" || exit 1
raw="$out/raw.txt"
: >"$raw"
tmp="$(mktemp -d)"
srv_pin=() cli_pin=()
if [[ "$placement" == split* ]]; then
    srv_pin=(taskset -c 0)
    cli_pin=(taskset -c 1)
fi
hog=
cleanup() {
    [[ -n "$hog" ]] && kill "$hog" 2>/dev/null && wait "$hog" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
if [[ "$placement" == *hog ]]; then
    command -v stress-ng >/dev/null || { echo "queues_ab.sh: stress-ng is missing" >&2; exit 1; }
    timeout 3600 stress-ng --cpu 2 --quiet >/dev/null 2>&1 &
    hog=$!
    sleep 1
fi
# A connection made before the engine is built stays on TCP: wait for it.
export SDIRECT_ENGINE_WAIT_MS=5000
export SDIRECT_UPGRADE_AFTER_MS=0
port=$((47000 + ($$ % 400) * 2))
next_port() { port=$((port + 1)); ((port > 47990)) && port=47000; }

# one VARIANT SIZE MODE ITERS: one sd_pingpong run, a line in raw.txt.
one() {
    local variant="$1" size="$2" mode="$3" iters="$4" pre=() line sp modes=kernel value
    next_port
    [[ "$variant" != kernel ]] && pre=(env "SDIRECT_QUEUES=$variant" "LD_PRELOAD=$lib")
    rm -f "$tmp/s" "$tmp/c"
    SDIRECT_STATS_FILE="$tmp/s" timeout 60 "${srv_pin[@]}" "${pre[@]}" "$pp" server "$port" \
        >/dev/null 2>&1 &
    sp=$!
    for _ in $(seq 100); do
        ss -ltn 2>/dev/null | grep -q ":$port " && break
        sleep 0.02
    done
    line="$(SDIRECT_STATS_FILE="$tmp/c" timeout 60 "${cli_pin[@]}" "${pre[@]}" "$pp" client \
        127.0.0.1 "$port" --size "$size" --iters "$iters" --mode "$mode" 2>/dev/null | tail -n 1)"
    wait "$sp"
    if [[ "$mode" == pingpong ]]; then
        value="$(tr ' ' '\n' <<<"$line" | awk -F= '$1 == "lat_us_mean" { print $2 }')"
    else
        value="$(tr ' ' '\n' <<<"$line" | awk -F= '$1 == "mbps" { print $2 }')"
    fi
    # Both ends' connection lines (the client's closes last).
    if [[ "$variant" != kernel ]]; then
        modes="$(cat "$tmp/c" "$tmp/s" 2>/dev/null | grep -o ' mode=[a-z]*' | sort -u | tr -d ' ' |
            tr '\n' ',')"
        modes="${modes%,}"
    fi
    echo "$placement $variant $size $mode ${value:-failed} ${modes:-none}" >>"$raw"
}

rows=("1 pingpong 20000" "64 pingpong 20000" "4096 pingpong 20000" "65536 pingpong 5000"
    "1048576 pingpong 1000" "64 stream 200000" "4096 stream 100000" "65536 stream 20000"
    "1048576 stream 2000")
variants=(kernel cross all)
for ((r = 0; r < runs; r++)); do
    echo "queues_ab.sh: $placement, run $((r + 1)) of $runs" >&2
    for row in "${rows[@]}"; do
        read -r size mode iters <<<"$row"
        for ((v = 0; v < 3; v++)); do
            one "${variants[$(((v + r) % 3))]}" "$size" "$mode" "$iters"
        done
    done
done
python3 "$here/queues_ab_summary.py" "$raw" | tee "$out/summary.txt"
