# shellcheck shell=bash disable=SC2034,SC2154
# Common part of benchmarks/run.sh and benchmarks/apps.sh (sourced, not run):
# paths, the environment every preloaded process gets, the CPU placement
# policy, and small helpers (waiting for a listener, medians, ratios).
#
# The sourcing script sets `me` (its name, for messages) first.

bench_dir="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)"
bench_root="$(cd "$bench_dir/.." && pwd)"
build="${SDIRECT_BUILD_DIR:-build}"
[[ "$build" == /* ]] || build="$bench_root/$build"
run="$build/tools/sdirect-run"
results="$bench_dir/results"
repeats="${BENCH_REPEATS:-5}"

if ! [[ "$repeats" =~ ^[1-9][0-9]*$ ]] || ((repeats > 100)); then
    echo "$me: BENCH_REPEATS must be 1..100" >&2
    exit 1
fi

export IPATH_NO_BACKTRACE=1 HFI_NO_BACKTRACE=1 FI_MR_CACHE_MONITOR=disabled
# Measure direct mode from the first byte: connect/accept wait for the
# process's fabric engine (built once per process, ~0.35 s here) instead of
# starting on TCP and upgrading mid-run.
export SDIRECT_ENGINE_WAIT_MS="${SDIRECT_ENGINE_WAIT_MS:-5000}"

# CPU placement, the same for every column. On small VMs it decides the
# kernel's ping-pong latency: waking a process on another, idle vCPU can
# cost tens of microseconds more than a switch on the same CPU.
# BENCH_PIN: split (server on CPU 0, client on CPU 1; default), same (both
# on CPU 0), none (the scheduler decides). Sets pin, srv_pin, cli_pin.
pin="${BENCH_PIN:-split}"
srv_pin=()
cli_pin=()
if [[ "$pin" != none ]] && ! command -v taskset >/dev/null 2>&1; then
    echo "$me: taskset not found; BENCH_PIN=$pin ignored" >&2
    pin=none
fi
case "$pin" in
    split)
        if (($(nproc) >= 2)); then
            srv_pin=(taskset -c 0)
            cli_pin=(taskset -c 1)
        else
            pin="same (1 CPU)"
            srv_pin=(taskset -c 0)
            cli_pin=(taskset -c 0)
        fi ;;
    same) srv_pin=(taskset -c 0); cli_pin=(taskset -c 0) ;;
    none) ;;
    *) echo "$me: BENCH_PIN must be split, same or none" >&2; exit 1 ;;
esac

# bench_have_sdirect: the library can be preloaded (else its column is n/a).
bench_have_sdirect() {
    [[ -x "$run" ]] && timeout 20 "$run" true 2>/dev/null
}

# bench_tmp NAME: a fresh temporary directory in `tmp`, removed at exit,
# when the background server whose pid is in `srv_pid` (if any) is ended.
bench_tmp() {
    tmp="$(mktemp -d "/tmp/sdirect-$1.XXXXXX")"
    srv_pid=""
    trap bench_cleanup EXIT
}
bench_cleanup() {
    if [[ -n "$srv_pid" ]] && kill -0 "$srv_pid" 2>/dev/null; then
        kill "$srv_pid" 2>/dev/null
        wait "$srv_pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}

# Waits (at most 5 s) until something listens on TCP port $1 while pid $2 lives.
wait_listen() {
    local i
    for ((i = 0; i < 100; i++)); do
        ss -Htln "sport = :$1" 2>/dev/null | grep -q . && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# Modes of the connections on port $1 in the stats files that follow.
modes_on_port() {
    local port="$1"
    shift
    cat "$@" 2>/dev/null | awk -v port="$port" '
        {
            lp = ""; pp = ""; mode = ""
            for (i = 1; i <= NF; i++) {
                if ($i ~ /^local=/) { lp = $i; sub(/.*:/, "", lp) }
                else if ($i ~ /^peer=/) { pp = $i; sub(/.*:/, "", pp) }
                else if ($i ~ /^mode=/) { mode = substr($i, 6) }
            }
            if ((lp == port || pp == port) && pp != "0" && mode != "") print mode
        }'
}

# Median of the numbers on stdin ("n/a" if none).
median() {
    sort -g | awk '{ v[NR] = $1 } END {
        if (NR == 0) { print "n/a"; exit }
        if (NR % 2) print v[(NR + 1) / 2]; else printf "%.6g\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

ratio() {  # a / b with 2 decimals, n/a if either is missing
    awk -v a="$1" -v b="$2" 'BEGIN {
        if (a == "n/a" || b == "n/a" || b + 0 == 0) print "n/a"; else printf "%.2f\n", a / b }'
}

# Load average now; warns on stderr when busy-polling columns will be noisy.
bench_load() {
    local load
    load="$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)"
    if awk -v l="$load" 'BEGIN { exit !(l > 0.5) }'; then
        echo "$me: load average $load at start; numbers will be noisy" >&2
    fi
    echo "$load"
}
