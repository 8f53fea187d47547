#!/usr/bin/env bash
# shellcheck disable=SC2154  # lib.sh's variables
# A server's speed for one active client while it holds many idle
# connections, kernel vs sdirect, in each placement of BENCH_PLACEMENTS
# (lib.sh; default split, unpinned, hog). Every process runs with the
# library's own settings (bench_defaults): connections upgrade only once
# they earn it, as users run them.
#
#   redis   redis-server; one client process (benchmarks/idle_hold.py)
#           opens BENCH_IDLE_N (500) connections and PINGs on each every
#           10 ms for a second, which earns their upgrade; they stay open
#           and idle. Then `redis-benchmark -c 1 -t ping_mbulk -n
#           BENCH_IDLE_REQS` (20000): requests a second. The idle
#           connections' modes come from the holder's stats.
#   mixed   as redis, but only the server runs the library (sdirect) or
#           nothing does (kernel): its clients do not, as when a server
#           alone is preloaded. Its idle connections earn their upgrade,
#           ask for it and wait for one their peer never asks for. Their
#           modes come from the server's stats.
#   nginx   nginx, one worker; the holder opens BENCH_IDLE_N keep-alive
#           connections, one request each (too few calls to earn an
#           upgrade: they stay on TCP, asked for nothing); then ab -c 1
#           without keep-alive for BENCH_IDLE_AB_SECS (3) s: requests a
#           second.
#
# Each row runs kernel then sdirect BENCH_REPEATS times (5; 1 with
# BENCH_QUICK=1), interleaved; the table has the medians and their ratio.
# Writes benchmarks/results/<UTC time>/<placement>/idle_load.txt (and
# idle_load.runs, one line a run).
#
# Usage: benchmarks/idle_load.sh [redis] [mixed] [nginx]   (all by default)
set -u
me=idle_load.sh
# shellcheck source=benchmarks/lib.sh
source "$(dirname "$(readlink -f "$0")")/lib.sh"

idle_n="${BENCH_IDLE_N:-500}"
reqs="${BENCH_IDLE_REQS:-20000}"
ab_secs="${BENCH_IDLE_AB_SECS:-3}"
for v in idle_n reqs ab_secs; do
    if ! [[ "${!v}" =~ ^[1-9][0-9]*$ ]]; then
        echo "$me: $v must be a positive number" >&2
        exit 1
    fi
done
((idle_n <= 3000)) || { echo "$me: BENCH_IDLE_N must be at most 3000" >&2; exit 1; }

rows=("$@")
((${#rows[@]})) || rows=(redis mixed nginx)
for r in "${rows[@]}"; do
    case "$r" in
        redis | mixed) need=(redis-server redis-benchmark) ;;
        nginx) need=(nginx ab) ;;
        *) echo "usage: $me [redis] [mixed] [nginx]" >&2; exit 2 ;;
    esac
    for c in "${need[@]}"; do
        command -v "$c" >/dev/null || { echo "$me: $c missing (scripts/setup.sh installs it)" >&2; exit 1; }
    done
done
bench_have_sdirect || { echo "$me: $sd_lib cannot be preloaded (build first)" >&2; exit 1; }
py="$(command -v python3)" || { echo "$me: python3 missing" >&2; exit 1; }

bench_tmp idle-load
bench_out_init
ulimit -n $((idle_n * 2 + 1024)) 2>/dev/null || { echo "$me: cannot raise the fd limit" >&2; exit 1; }
head -c 4096 /dev/zero >"$tmp/f4k"
port=$(free_port_from $((43000 + RANDOM % 1000)) 200)

# pre HOW: the command prefix of a process measured as HOW.
pre() {
    local p=("${bench_defaults[@]}")
    [[ "$1" == sdirect ]] && p+=("LD_PRELOAD=$sd_lib")
    echo "${p[@]}"
}

# hold ROW HOW STATS: starts the holder of the idle connections (hold_pid)
# and waits until they are all open and idle.
hold() {
    local i p
    read -r -a p <<<"$(pre "$2")"
    SDIRECT_STATS_FILE="$3" "${cli_pin[@]}" "${p[@]}" "$py" "$bench_dir/idle_hold.py" "$1" "$port" \
        "$idle_n" >"$tmp/hold.out" 2>"$tmp/hold.err" &
    hold_pid=$!
    for ((i = 0; i < 600; i++)); do
        grep -q '^ready' "$tmp/hold.out" 2>/dev/null && return 0
        kill -0 "$hold_pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "$me: $1 $2: the idle connections did not open: $(head -c 300 "$tmp/hold.err")" >&2
    return 1
}
unhold() {
    kill -TERM "$hold_pid" 2>/dev/null
    wait "$hold_pid" 2>/dev/null
}

# beside_idle ROW HOW STATS SIG MEASURE: once the server (srv_pid) on
# `port` listens and the idle connections are held, MEASURE's output
# (requests a second), else n/a; then the holder and the server (with
# SIG) end. Run in a subshell: the server's pid goes with it.
beside_idle() {
    local val=n/a
    if wait_listen "$port" "$srv_pid" && hold "$1" "$2" "$3"; then
        val="$("$5")"
        unhold
    fi
    kill "-$4" "$srv_pid" 2>/dev/null
    wait "$srv_pid" 2>/dev/null
    srv_pid=""
    echo "${val:-n/a}"
}

bench_redis() {
    "${cli_pin[@]}" "${p[@]}" redis-benchmark -h 127.0.0.1 -p "$port" -c 1 -n "$reqs" \
        -t ping_mbulk -q 2>/dev/null | tr '\r' '\n' |
        awk '/requests per second/ { v = $2 } END { print v == "" ? "n/a" : v }'
}

bench_ab() {
    "${cli_pin[@]}" "${p[@]}" ab -q -c 1 -t "$ab_secs" -n 10000000 "http://127.0.0.1:$port/f4k" \
        2>/dev/null | awk '/^Requests per second/ { v = $4 } END { print v == "" ? "n/a" : v }'
}

# redis_server HOW [STATS]: redis-server on `port` as HOW (srv_pid), its
# own statistics to STATS if given.
redis_server() {
    local p
    read -r -a p <<<"$(pre "$1")"
    [[ -n "${2:-}" ]] && p+=("SDIRECT_STATS_FILE=$2")
    mkdir -p "$tmp/redis"
    "${srv_pin[@]}" "${p[@]}" redis-server --bind 127.0.0.1 \
        --port "$port" --save '' --appendonly no --dir "$tmp/redis" --daemonize no \
        --protected-mode no --maxclients $((idle_n + 100)) >"$tmp/srv.out" 2>&1 &
    srv_pid=$!
}

# run_ROW HOW: requests a second, or n/a (on `port`).
run_redis() {
    local stats="$tmp/hold-redis-$1.stats" p
    read -r -a p <<<"$(pre "$1")"
    rm -f "$stats"
    redis_server "$1"
    beside_idle redis "$1" "$stats" TERM bench_redis
}

run_mixed() {
    local stats="$tmp/hold-mixed-$1.stats" p
    read -r -a p <<<"$(pre kernel)"  # the clients never run the library
    rm -f "$stats"
    redis_server "$1" "$stats"
    beside_idle redis kernel "$tmp/hold-mixed-none.stats" TERM bench_redis
}

run_nginx() {
    local stats="$tmp/hold-nginx-$1.stats" p
    read -r -a p <<<"$(pre "$1")"
    rm -f "$stats"
    cat >"$tmp/nginx.conf" <<EOF
daemon off; master_process on; worker_processes 1; pid $tmp/nginx.pid;
error_log $tmp/nginx.err; user root root; worker_rlimit_nofile $((idle_n * 2 + 1024));
events { worker_connections $((idle_n + 512)); }
http { access_log off; keepalive_timeout 300s; keepalive_requests 1000000;
       server { listen 127.0.0.1:$port; root $tmp; } }
EOF
    "${srv_pin[@]}" "${p[@]}" nginx -c "$tmp/nginx.conf" -p "$tmp" >"$tmp/srv.out" 2>&1 &
    srv_pid=$!
    beside_idle nginx "$1" "$stats" QUIT bench_ab
}

for pl in "${placements[@]}"; do
    placement_use "$pl"
    mkdir -p "$out/$pl"
    runs="$out/$pl/idle_load.runs"
    : >"$runs"
    if [[ "$pl" == hog ]] && ! hog_start $((${#rows[@]} * repeats * (ab_secs + 60) + 120)); then
        continue
    fi
    echo "$me: $pin, $idle_n idle connections, $repeats repeats" >&2
    for ((k = 1; k <= repeats; k++)); do
        for r in "${rows[@]}"; do
            for how in kernel sdirect; do
                port=$(free_port_from $((port + 1)) 200)
                v="$("run_$r" "$how")"
                modes="$(modes_on_port "$port" "$tmp/hold-$r-$how.stats" | sort | uniq -c |
                    awk '{ printf "%s%s=%s", (NR > 1 ? "," : ""), $2, $1 }')"
                echo "$r $how $k $v ${modes:-no-stats}" >>"$runs"
                echo "  $r $how round $k: $v req/s (idle connections: ${modes:-no stats})" >&2
            done
        done
    done
    [[ "$pl" == hog ]] && hog_stop
    {
        echo "# $pin; $idle_n idle connections; medians of $repeats rounds (req/s)"
        printf '%-8s %10s %10s %8s  %s\n' row kernel sdirect ratio "idle connections (sdirect)"
        for r in "${rows[@]}"; do
            kv="$(awk -v r="$r" '$1 == r && $2 == "kernel" { print $4 }' "$runs" | grep -v n/a | median)"
            sv="$(awk -v r="$r" '$1 == r && $2 == "sdirect" { print $4 }' "$runs" | grep -v n/a | median)"
            m="$(awk -v r="$r" '$1 == r && $2 == "sdirect" { print $5 }' "$runs" | tail -1)"
            printf '%-8s %10s %10s %8s  %s\n' "$r" "$kv" "$sv" "$(ratio "$sv" "$kv")" "$m"
        done
    } >"$out/$pl/idle_load.txt"
    cat "$out/$pl/idle_load.txt"
done
echo "$me: results in $out" >&2
