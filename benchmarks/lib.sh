# shellcheck shell=bash disable=SC2034,SC2154
# Common part of benchmarks/run.sh, netpipe.sh and apps.sh (sourced, not
# run): paths, the environment every preloaded process gets, the
# placements (CPU pinning, the hog), the results folder of a run, and small
# helpers (waiting for a listener, medians, ratios).
#
# The sourcing script sets `me` (its name, for messages) first.

bench_dir="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)"
bench_root="$(cd "$bench_dir/.." && pwd)"
build="${SDIRECT_BUILD_DIR:-build}"
[[ "$build" == /* ]] || build="$bench_root/$build"
run="$build/tools/sdirect-run"
results="$bench_dir/results"  # the committed figures; runs go below it
sd_lib="$build/intercept/libsdirect.so"  # preloaded directly where sdirect-run's own start would be measured

# Quick mode (BENCH_QUICK=1, what scripts/demo.sh runs): one repeat and
# shorter runs; each script lists what it shortens. qdef FULL QUICK prints
# the default that applies.
quick=0
[[ "${BENCH_QUICK:-0}" == 1 ]] && quick=1
qdef() { if ((quick)); then echo "$2"; else echo "$1"; fi; }
repeats="${BENCH_REPEATS:-$(qdef 5 1)}"

if ! [[ "$repeats" =~ ^[1-9][0-9]*$ ]] || ((repeats > 100)); then
    echo "$me: BENCH_REPEATS must be 1..100" >&2
    exit 1
fi

# Whether the user set SDIRECT_ENGINE_WAIT_MS or SDIRECT_UPGRADE_AFTER_MS:
# the rows that start a process or a connection per transaction run with
# the library's own defaults of those the user left alone (see
# bench_defaults).
# Told by the outermost script: run.sh exports the values below to the
# scripts it runs (apps.sh), which must not take them for the user's.
if [[ -z "${BENCH_USER_SETTINGS:-}" ]]; then
    export BENCH_USER_SETTINGS="engine_wait=${SDIRECT_ENGINE_WAIT_MS:+1} upgrade_after=${SDIRECT_UPGRADE_AFTER_MS+1}"
fi
engine_wait_user="${BENCH_USER_SETTINGS#engine_wait=}"
engine_wait_user="${engine_wait_user%% *}"
upgrade_after_user="${BENCH_USER_SETTINGS##*upgrade_after=}"
export IPATH_NO_BACKTRACE=1 HFI_NO_BACKTRACE=1 FI_MR_CACHE_MONITOR=disabled
# Measure direct mode from the first byte: connections upgrade at once
# (SDIRECT_UPGRADE_AFTER_MS=0) and connect/accept wait for the process's
# fabric engine (built once per process, ~6 ms here) instead of
# starting on TCP and upgrading mid-run. With the library's own policy a
# connection asks only once it earned its upgrade, and in a process with
# no engine yet only from 250 ms of life on (SDIRECT_BUILD_AFTER_MS):
# a short run would measure TCP for most of its time.
export SDIRECT_ENGINE_WAIT_MS="${SDIRECT_ENGINE_WAIT_MS:-5000}"
export SDIRECT_UPGRADE_AFTER_MS="${SDIRECT_UPGRADE_AFTER_MS-0}"
# bench_defaults: a command prefix that gives a program the library's own
# defaults of those two back (unless the user chose them), for rows that
# measure programs as they start.
bench_defaults=(env)
[[ -z "$engine_wait_user" ]] && bench_defaults+=(-u SDIRECT_ENGINE_WAIT_MS)
[[ -z "$upgrade_after_user" ]] && bench_defaults+=(-u SDIRECT_UPGRADE_AFTER_MS)

# Placements: how the benchmark's processes share the CPUs. Every script
# measures each placement of BENCH_PLACEMENTS in turn (default all three):
#   split     server on CPU 0, client on CPU 1 (taskset); on small VMs it
#             decides the kernel's ping-pong latency: waking a process on
#             another, idle vCPU can cost tens of microseconds more than a
#             switch on the same CPU
#   unpinned  the scheduler decides, as programs usually run
#   hog       unpinned, with `stress-ng --cpu BENCH_HOG_WORKERS` (2)
#             running beside the runs: a busy machine
#   same      both on CPU 0 (not in the default list)
# BENCH_PIN (split, same, none), the older single setting, still selects
# one placement when BENCH_PLACEMENTS is not set.
if [[ -z "${BENCH_PLACEMENTS:-}" && -n "${BENCH_PIN:-}" ]]; then
    case "$BENCH_PIN" in
        none) BENCH_PLACEMENTS=unpinned ;;
        *) BENCH_PLACEMENTS="$BENCH_PIN" ;;
    esac
fi
read -r -a placements <<<"${BENCH_PLACEMENTS:-split unpinned hog}"
export BENCH_PLACEMENTS="${placements[*]}"
hog_workers="${BENCH_HOG_WORKERS:-2}"
if ! [[ "$hog_workers" =~ ^[1-9][0-9]?$ ]]; then
    echo "$me: BENCH_HOG_WORKERS must be 1..99" >&2
    exit 1
fi
declare -A seen_placement=()
for p in "${placements[@]}"; do
    case "$p" in
        split | unpinned | hog | same) ;;
        *) echo "$me: BENCH_PLACEMENTS: '$p' is not split, unpinned, hog or same" >&2; exit 1 ;;
    esac
    if [[ -n "${seen_placement[$p]:-}" ]]; then
        echo "$me: BENCH_PLACEMENTS names $p twice" >&2
        exit 1
    fi
    seen_placement[$p]=1
done
((${#placements[@]})) || { echo "$me: BENCH_PLACEMENTS is empty" >&2; exit 1; }

# placement_use NAME: sets placement, pin (its description for the
# tables), srv_pin and cli_pin (command prefixes).
placement_use() {
    placement="$1"
    srv_pin=()
    cli_pin=()
    case "$1" in
        split | same)
            if ! command -v taskset >/dev/null 2>&1; then
                pin="$1 asked, but taskset is missing: unpinned"
            elif [[ "$1" == same ]] || (($(nproc) < 2)); then
                srv_pin=(taskset -c 0)
                cli_pin=(taskset -c 0)
                pin="$1 (server and client on CPU 0)"
            else
                srv_pin=(taskset -c 0)
                cli_pin=(taskset -c 1)
                pin="split (server on CPU 0, client on CPU 1)"
            fi ;;
        unpinned) pin="unpinned (the scheduler decides)" ;;
        hog) pin="hog (unpinned, stress-ng --cpu $hog_workers running beside the runs)" ;;
    esac
}

# The hog placement's load: stress-ng started by hog_start BOUND just
# before a placement's runs and ended by hog_stop (by pid) right after
# them; --timeout BOUND (the runs' worst case, or BENCH_HOG_LIMIT seconds
# if that is less) ends it should this script be killed before it can.
# hog_pid: its pid while it runs.
hog_pid=""
hog_kids=""
hog_log=""
hog_start() {
    local i
    if ! command -v stress-ng >/dev/null 2>&1; then
        echo "$me: stress-ng not installed (scripts/setup.sh installs it); placement hog skipped" >&2
        return 1
    fi
    local bound="$1" cap="${BENCH_HOG_LIMIT:-}"
    [[ "$cap" =~ ^[1-9][0-9]*$ ]] && ((cap < bound)) && bound=$cap
    hog_log="$(mktemp /tmp/sdirect-hog.XXXXXX)"
    stress-ng --cpu "$hog_workers" --timeout "${bound}s" </dev/null >"$hog_log" 2>&1 &
    hog_pid=$!
    # Running once its workers are: the measurements start under the load.
    for ((i = 0; i < 100; i++)); do
        hog_kids="$(ps -o pid= --ppid "$hog_pid" 2>/dev/null | xargs)"
        (($(wc -w <<<"$hog_kids") >= hog_workers)) && break
        if ! kill -0 "$hog_pid" 2>/dev/null; then
            echo "$me: stress-ng did not start: $(head -c 200 "$hog_log" | tr '\n' ' ')" >&2
            wait "$hog_pid" 2>/dev/null
            hog_pid=""
            rm -f "$hog_log"
            return 1
        fi
        sleep 0.05
    done
    echo "$me: stress-ng --cpu $hog_workers running (pid $hog_pid, --timeout ${bound}s)" >&2
    return 0
}
# hog_stop: ends stress-ng and its workers; returns 1 if it had already
# ended by itself (its --timeout came before the runs' end).
hog_stop() {
    local i early=0 k
    [[ -n "$hog_pid" ]] || return 0
    if kill -0 "$hog_pid" 2>/dev/null; then
        kill -TERM "$hog_pid" 2>/dev/null
        for ((i = 0; i < 100; i++)); do
            kill -0 "$hog_pid" 2>/dev/null || break
            sleep 0.05
        done
        kill -0 "$hog_pid" 2>/dev/null && kill -KILL "$hog_pid" 2>/dev/null
    else
        early=1
    fi
    wait "$hog_pid" 2>/dev/null
    # Workers stress-ng could not stop (it was SIGKILLed) are ended too:
    # the pids recorded at the start, if they are still stress-ng.
    for k in $hog_kids; do
        [[ "$(ps -o comm= -p "$k" 2>/dev/null)" == stress-ng* ]] && kill -KILL "$k" 2>/dev/null
    done
    hog_pid=""
    hog_kids=""
    rm -f "$hog_log"
    if ((early)); then
        echo "$me: stress-ng had ended before the runs did (its --timeout)" >&2
        return 1
    fi
    return 0
}

# Results of one invocation: a new folder benchmarks/results/<UTC time>/
# (BENCH_OUT, exported so that run.sh's children write into the same one)
# with a folder per placement; benchmarks/results/latest links to it. The
# committed figures in benchmarks/results/ change only through
# benchmarks/publish.sh.
bench_out_init() {
    if [[ -n "${BENCH_OUT:-}" ]]; then
        out="$BENCH_OUT"
        mkdir -p "$out" || exit 1
    else
        local stamp base n
        base="$(date -u +%Y%m%dT%H%M%SZ)"
        stamp="$base"
        mkdir -p "$results" || exit 1
        for ((n = 1; n < 100; n++)); do
            mkdir "$results/$stamp" 2>/dev/null && break
            stamp="$base-$n"
        done
        [[ -d "$results/$stamp" ]] || { echo "$me: cannot make a folder in $results" >&2; exit 1; }
        out="$results/$stamp"
        ln -sfn "$stamp" "$results/latest"
    fi
    out="$(cd "$out" && pwd)"
    export BENCH_OUT="$out"
}

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
    hog_stop
    if [[ -n "$srv_pid" ]] && kill -0 "$srv_pid" 2>/dev/null; then
        kill "$srv_pid" 2>/dev/null
        wait "$srv_pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}

# wait_listen, port_in_use and free_port_from.
# shellcheck source=scripts/ports.sh
source "$bench_root/scripts/ports.sh"

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
