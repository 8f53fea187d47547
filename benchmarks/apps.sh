#!/usr/bin/env bash
# Kernel TCP vs sdirect with programs as Debian ships them, one run, same
# machine: both ends of every connection run unmodified, plainly (kernel)
# or both under build/tools/sdirect-run (sdirect).
#
#   sockperf  `sockperf sr --tcp` / `sockperf pp --tcp -m 64 -t S --mps 2000000`
#             (without --mps, sockperf's table of send times holds 600k
#             messages a second and a faster run fails): 64-byte
#             ping-pong for S seconds (BENCH_SOCKPERF_SECS, 5); sockperf's
#             one-way latency (RTT/2): its 50th percentile and its mean.
#   redis     redis-server and `redis-benchmark -t set,get -c C -n N --csv`,
#             no pipelining, C = 1 (N = BENCH_REDIS_N1, 20000) and C = 50
#             (N = BENCH_REDIS_N50, 100000): requests per second. Then
#             BENCH_REDIS_CLI_N (100) fresh `redis-cli ping` processes one
#             after the other: the median wall time of one (start to exit;
#             preloaded with LD_PRELOAD directly, as sdirect-run's own
#             start would be counted too).
#   pg        PostgreSQL 15 (postgres, as Debian ships it) on a loopback
#             port and pgbench -n on a scale-1 database made once: the
#             select-only script (-S) with 1, 8 and 16 clients and the
#             TPC-B-like one with 1 and 8 (-j 2 from 8 clients),
#             BENCH_PG_SECS (5) seconds a run: transactions/s and mean
#             latency; then, against a server started afresh,
#             `pgbench -C -S` (a new connection, so a new backend, for
#             every transaction). Every backend is forked by the
#             postmaster, which closes its copy of the connection: the
#             backend's connection is upgraded after that fork. As root,
#             PostgreSQL runs as nobody (it refuses root), pgbench too:
#             both ends one user (pg-users has them apart).
#   pg-C      the `pgbench -C -S` row of pg alone.
#   pg-users  PostgreSQL as Debian runs it: the server as the user
#             postgres (setpriv from root, as pg_ctlcluster changes to
#             postgres), in a data directory of its own owned by postgres
#             (initdb as postgres, scale 1), the library copied where
#             postgres may read it; pgbench -S as root against it, 1
#             client and 8 (-j 2), BENCH_PG_SECS each: transactions/s and
#             mean latency. The postmaster must be postgres, and every
#             connection direct on both ends (server and clients' stats).
#   netperf   netserver in its default forking mode (the child it forks for
#             each test makes the data connection) and netperf -P 0 for
#             TCP_RR, TCP_STREAM and TCP_MAERTS, BENCH_NETPERF_SECS (3)
#             seconds each: transactions/s and 10^6 bit/s; then TCP_CRR
#             (a connection per 1-byte transaction) against a netserver
#             started afresh: connections/s. The proof of direct mode is
#             each test's data connection (to a port netserver's child
#             takes, not the benchmark's), direct on both ends: the
#             control connection makes too few calls to earn its upgrade
#             and leaves no counters (any it leaves must say direct).
#   nginx     nginx (its own master process, daemon off, 2 workers, a
#             configuration written into the temporary folder, a private
#             port) serving a 4 KiB file to ab (apache2-utils) for
#             BENCH_AB_SECS (3) seconds each: without keep-alive (a
#             connection per request) and with (-k), 1 and 4 concurrent
#             requests: requests/s. As root the workers stay root
#             (`user root root;`), as ab is (nginx-users has them apart).
#   nginx-users  nginx as Debian configures it: `user www-data;` in the
#             same configuration, the master started as root (it listens)
#             and its two workers www-data (checked: the rows fail
#             otherwise); ab as root, BENCH_AB_SECS each: with keep-alive,
#             1 and 4 concurrent requests (every connection direct on both
#             ends, the workers' stats and ab's), and without keep-alive, 1
#             at a time (a connection per request, the library's own
#             settings, modes counted, see below): requests/s. (wrk is not
#             used: ab serves all three rows.)
#   mariadb-users  MariaDB as Debian runs it: mariadbd started by root with
#             --user=mysql (as the init script starts it through
#             mysqld_safe; it becomes mysql before it listens; checked), on
#             a data directory of its own made by mariadb-install-db as
#             mysql; mysqlslap as root, BENCH_MARIADB_QUERIES (50000)
#             primary-key reads (--auto-generate-sql-load-type=key) by 1
#             client and by 8, one iteration: queries/s (the queries over
#             mysqlslap's own seconds, which count from the clients'
#             connect). Both ends upgrade at once
#             (SDIRECT_UPGRADE_AFTER_MS=0, see apps_users.sh), and every
#             connection must be direct on both ends (the server's stats
#             and mysqlslap's).
#   idle      benchmarks/idle_conns.py: a server and a client process hold
#             BENCH_IDLE_CONNS (100) connections that carried one byte each
#             way and are now idle, the server blocked in epoll_wait on
#             them, the client in poll. After a second to settle, the CPU
#             time (utime + stime of /proc/PID/stat, every thread) each
#             uses in BENCH_IDLE_SECS (10) seconds, in % of one core, and
#             its threads' context switches per second (wake-ups).
#
# Each placement of BENCH_PLACEMENTS (split, unpinned, hog; see lib.sh) in
# turn, the hog's stress-ng running for exactly that placement's runs.
# Every measurement is repeated BENCH_REPEATS times (default 5), the
# programs interleaved (repeat 1 of each, then repeat 2 ...) so a burst of
# load elsewhere hits all columns alike; the table shows medians. Every
# process is started afresh for every measurement and bounded by timeout.
# A failed run (timeout, no report) is left out of the median, counted in
# the runs column and listed under the table (with the library's view of
# the connections when a preloaded client stalled); three failed runs in a
# row retire that column of that program. A server that could not start
# (its port taken meanwhile, e.g. as some connection's ephemeral port) is
# tried once more on the next port.
#
# pg-users, nginx-users and mariadb-users need root and their users
# (postgres, www-data, mysql):
# otherwise their rows are n/a, with the reason in the mode column and
# under the table, never a pass. Their connections join two uids, direct
# through the library's queues between users (SDIRECT_CROSS_USER, 1 by
# default); their processes write their stats files into a folder owned by
# the service's user.
#
# Each sdirect run of a program that keeps its connections must prove it
# ran direct: the library writes every connection to SDIRECT_STATS_FILE at
# exit, and every connection on the benchmark's port, on both ends, must
# end in mode=direct having moved bytes over the fabric; otherwise the row
# says NOT DIRECT and misses its target. The rows that make a process or a
# connection per transaction (redis-cli ping, TCP_CRR, ab, pgbench -C,
# nginx-users without keep-alive) run
# both ends with the library's own settings (SDIRECT_ENGINE_WAIT_MS left
# unset unless you set it; the other rows wait for the engine so that they
# measure direct mode from the first byte), and the library may leave such
# short connections on TCP: their mode column counts the client's
# connections by the mode they ended in (e.g. "kernel 100/100"; a process
# records its last 4096 connections; ab's connections that closed before
# asking to go direct, of which the library keeps no counters, count as
# "unasked"), and their target is on speed alone.
#
# Each row's speedup is of the medians; beside it, the lowest and highest
# speedup of one repeat's pair (the kernel's run and sdirect's, one after
# the other): on a shared host the spread of one row can be wider than a
# target's margin (ab without keep-alive, c=1: 0.73-1.18 in one quick run),
# and a median of three then decides little.
#
# Output, in the run's folder (BENCH_OUT, or a new benchmarks/results/<UTC
# time>/) per placement: apps.tsv and apps.txt (the table, also on stdout);
# then benchmarks/summary.sh's summary.txt (unless BENCH_SUMMARY=0).
#
# Quick run (BENCH_QUICK=1): redis, pg, pg-users, netperf, nginx,
# nginx-users and mariadb-users only (sockperf and idle when named), 1 repeat,
# redis-benchmark -n 40000 / 100000 (about a second each: a client
# process without an engine asks to go direct only once its connection
# has lived SDIRECT_BUILD_AFTER_MS, and a shorter run ends on TCP, NOT
# DIRECT), 20
# redis-cli processes, pgbench 1 s, netperf 1 s, ab 1 s (sockperf 2 s,
# idle 3 s; mysqlslap 20000 queries).
#
# Usage: benchmarks/apps.sh [sockperf] [redis] [pg] [pg-users] [netperf]
#        [nginx] [nginx-users] [mariadb-users] [idle]   (default: all nine)
# Environment: BENCH_PLACEMENTS, BENCH_QUICK, BENCH_REPEATS,
# BENCH_HOG_WORKERS, SDIRECT_BUILD_DIR as for run.sh; BENCH_APPS_PORT
# (first port, default BENCH_PORT + 100 = 47200; up to 100 ports above it
# are used, skipping any a socket uses), BENCH_KEEP_TMP (0; 1 keeps the
# temporary folder: the last runs' logs and stats files), and the
# variables named above.
set -uo pipefail

me=apps.sh
# shellcheck source=benchmarks/lib.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
port_base="${BENCH_APPS_PORT:-$((${BENCH_PORT:-47100} + 100))}"
sp_secs="${BENCH_SOCKPERF_SECS:-$(qdef 5 2)}"
redis_n1="${BENCH_REDIS_N1:-$(qdef 20000 40000)}"
redis_n50="${BENCH_REDIS_N50:-$(qdef 100000 100000)}"
rcli_n="${BENCH_REDIS_CLI_N:-$(qdef 100 20)}"
idle_secs="${BENCH_IDLE_SECS:-$(qdef 10 3)}"
pg_secs="${BENCH_PG_SECS:-$(qdef 5 1)}"
np_secs="${BENCH_NETPERF_SECS:-$(qdef 3 1)}"
ab_secs="${BENCH_AB_SECS:-$(qdef 3 1)}"
myx_queries="${BENCH_MARIADB_QUERIES:-$(qdef 50000 20000)}"
idle_conns="${BENCH_IDLE_CONNS:-100}"
idle_settle=1  # seconds between "ready" and the first CPU reading
redis_limit=20  # seconds for one redis-benchmark run (kernel: 2-6 s here)
py=/usr/bin/python3
[[ -x "$py" ]] || py="$(command -v python3 || echo python3)"
clk_tck="$(getconf CLK_TCK)"

for v in sp_secs redis_n1 redis_n50 rcli_n pg_secs np_secs ab_secs myx_queries idle_secs idle_conns; do
    if ! [[ "${!v}" =~ ^[1-9][0-9]*$ ]]; then
        echo "$me: ${v} must be a positive integer (got '${!v}')" >&2
        exit 1
    fi
done
apps=("$@")
((${#apps[@]})) || read -r -a apps <<<"$(qdef "sockperf redis pg pg-users netperf nginx nginx-users mariadb-users idle" \
    "redis pg pg-users netperf nginx nginx-users mariadb-users")"
for app in "${apps[@]}"; do
    case "$app" in
        sockperf | redis | pg | pg-C | pg-users | netperf | nginx | nginx-users | mariadb-users | idle) ;;
        *) echo "usage: $me [sockperf] [redis] [pg] [pg-C] [pg-users] [netperf] [nginx] [nginx-users] [mariadb-users] [idle]" >&2; exit 2 ;;
    esac
done

hows=(kernel)
if bench_have_sdirect; then
    hows+=(sdirect)
else
    echo "$me: libsdirect.so not available; the sdirect column is n/a" >&2
fi

tmp="$(mktemp -d /tmp/sdirect-apps.XXXXXX)"
pids=()  # timeout wrappers still running, stopped at exit
cleanup() {
    local pid
    for pid in "${pids[@]}"; do stop_pid "$pid" TERM 5; done
    hog_stop
    if [[ "${BENCH_KEEP_TMP:-0}" == 1 ]]; then
        echo "$me: kept $tmp (logs and stats files of the last runs)" >&2
    else
        rm -rf "$tmp"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start_bg ROLE SECONDS HOW PIN-ARRAY CMD...: starts CMD in the background,
# bounded by timeout (SIGTERM at SECONDS, SIGKILL 3 s later), preloaded if
# HOW is sdirect, stats in $tmp/ROLE.stats, output in $tmp/ROLE.out and
# .err. Sets bg_pid (the timeout wrapper; it passes signals on to CMD).
# run_lib, if a caller sets it: the copy of the library sdirect-run
# preloads (one that another user may read).
run_lib=""
start_bg() {
    local role="$1" secs="$2" how="$3" pre=()
    local -n pinning="$4"
    shift 4
    if [[ "$how" == sdirect ]]; then
        pre=("$run")
        [[ -n "$run_lib" ]] && pre=(env "SDIRECT_LIB=$run_lib" "$run")
    fi
    # The redirections below truncate in the child, after this returns:
    # a caller reading ROLE's output at once must not see the last run's.
    rm -f "$tmp/$role.stats" "$tmp/$role.out" "$tmp/$role.err"
    # Without the library SDIRECT_STATS_FILE is inert.
    SDIRECT_STATS_FILE="$tmp/$role.stats" timeout -k 3 "$secs" "${pinning[@]}" "${pre[@]}" "$@" \
        </dev/null >"$tmp/$role.out" 2>"$tmp/$role.err" &
    bg_pid=$!
    pids+=("$bg_pid")
}

# run_fg ROLE SECONDS HOW PIN-ARRAY CMD...: the same in the foreground;
# returns CMD's status (124: timed out). A preloaded CMD still running
# two seconds before its timeout leaves the library's view of the
# connections on $port in $tmp/stall, for the failure note.
run_fg() {
    local until=$((SECONDS + $2 - 2))
    rm -f "$tmp/stall"
    start_bg "$@"
    while ((SECONDS < until)) && kill -0 "$bg_pid" 2>/dev/null; do
        sleep 0.05
    done
    [[ "$3" == sdirect ]] && kill -0 "$bg_pid" 2>/dev/null && stall_snapshot
    wait_pid "$bg_pid" 6
}

# stall_snapshot: the live connections on $port as sdirect-stat shows them
# (a few counters of the first four) into $tmp/stall.
stall_snapshot() {
    "$build/tools/sdirect-stat" 2>/dev/null | awk -v port="$port" '
        {
            lp = ""; pp = ""; keep = ""
            for (i = 1; i <= NF; i++) {
                if ($i ~ /^local=/) { lp = $i; sub(/.*:/, "", lp) }
                else if ($i ~ /^peer=/) { pp = $i; sub(/.*:/, "", pp) }
                if ($i ~ /^(pid|comm|local|peer|mode|tx_fabric|rx_fabric|tx_msgs|rx_msgs|tx_window|rx_queued)=/)
                    keep = keep (keep == "" ? "" : " ") $i
            }
            if ((lp == port || pp == port) && pp != "0") { n++; if (n <= 4) print keep }
        }
        END { if (n > 4) print "... " n " connections in all" }' >"$tmp/stall"
}

# wait_pid PID SECONDS: waits at most SECONDS for PID to end by itself,
# then stops it (stop_pid PID TERM 5); returns its status.
wait_pid() {
    local pid="$1" i
    for ((i = 0; i < $2 * 20; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    stop_pid "$pid" TERM 5
}

# stop_pid PID SIGNAL SECONDS: sends SIGNAL to PID (if it still runs),
# waits at most SECONDS, then SIGKILLs it; reaps it and returns its status.
# PID is a timeout wrapper started with -k 3: it passes the signal on to
# its program and SIGKILLs that 3 s later, so with SECONDS >= 4 the final
# SIGKILL (which the wrapper cannot pass on) is only a last resort.
stop_pid() {
    local pid="$1" i rc rest=()
    if kill -0 "$pid" 2>/dev/null; then
        kill "-$2" "$pid" 2>/dev/null
        for ((i = 0; i < $3 * 20; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
    rc=$?
    for i in "${pids[@]}"; do [[ "$i" == "$pid" ]] || rest+=("$i"); done
    pids=("${rest[@]}")
    return "$rc"
}

# status_text RC: an exit status in words.
status_text() {
    case "$1" in
        0) echo "exit 0" ;;
        124) echo "timed out" ;;
        137) echo "killed (timed out)" ;;
        *) if (($1 > 128)); then echo "killed by signal $(($1 - 128))"; else echo "exit $1"; fi ;;
    esac
}

# next_port: sets port to the next port of the range that no socket uses
# as its local port (listening or not: ports of this range can also be
# ephemeral ports of outgoing connections).
port_seq=0
next_port() {
    local i
    for ((i = 0; i < 100; i++)); do
        port=$((port_base + port_seq % 100))
        port_seq=$((port_seq + 1))
        ss -Htan "sport = :$port" 2>/dev/null | grep -q . || return 0
    done
    echo "$me: no free port in $port_base..$((port_base + 99))" >&2
    exit 1
}

# direct_verdict PORT MIN ROLE...: "direct" if, in each ROLE's stats file,
# the connections on PORT (or on any port of a comma-separated list;
# listeners aside; connections that never moved a byte and are not direct
# aside, as they needed no transport) number at least MIN (0: none need
# be recorded), are all mode=direct and moved bytes over the fabric;
# otherwise "NOT DIRECT: ..." saying why.
direct_verdict() {
    local port="$1" min="$2" role total direct fabric modes bad=""
    shift 2
    for role in "$@"; do
        if [[ ! -s "$tmp/$role.stats" ]]; then
            bad+="${bad:+; }$role wrote no stats"
            continue
        fi
        read -r total direct fabric modes < <(awk -v port="$port" '
            BEGIN { n = split(port, ps, ","); for (i = 1; i <= n; i++) want[ps[i]] = 1 }
            {
                lp = ""; pp = ""; mode = ""; moved = 0; fab = 0
                for (i = 1; i <= NF; i++) {
                    if ($i ~ /^local=/) { lp = $i; sub(/.*:/, "", lp) }
                    else if ($i ~ /^peer=/) { pp = $i; sub(/.*:/, "", pp) }
                    else if ($i ~ /^mode=/) mode = substr($i, 6)
                    else if ($i ~ /^(tx|rx)_(kernel|fabric)=/) {
                        v = $i; sub(/.*=/, "", v); moved += v
                        if ($i ~ /_fabric=/) fab += v
                    }
                }
                if (mode == "" || pp == "0" || !((lp in want) || (pp in want))) next
                if (mode != "direct" && moved == 0) next
                total++; seen[mode]++; fabric += fab
                if (mode == "direct") direct++
            }
            END {
                m = ""
                for (k in seen) m = m (m == "" ? "" : ",") k "x" seen[k]
                printf "%d %d %.0f %s\n", total, direct + 0, fabric, (m == "" ? "-" : m)
            }' "$tmp/$role.stats")
        if ((total < min)); then
            bad+="${bad:+; }$role: $total connections, expected $min"
        elif ((direct != total)); then
            bad+="${bad:+; }$role: modes $modes"
        elif ((total > 0)) && [[ "$fabric" == 0 ]]; then
            bad+="${bad:+; }$role: no byte over the fabric"
        fi
    done
    if [[ -z "$bad" ]]; then echo direct; else echo "NOT DIRECT: $bad"; fi
}

# mode_counts PORT WHICH FILE...: "MODE COUNT" lines, the connections in
# the stats files by the mode they ended in (listeners aside). WHICH: on
# (the connections on PORT) or off (those not on PORT: netperf's data
# connections, next to its control connection on PORT).
mode_counts() {
    local port="$1" which="$2"
    shift 2
    cat "$@" 2>/dev/null | awk -v port="$port" -v which="$which" '
        {
            lp = ""; pp = ""; mode = ""
            for (i = 1; i <= NF; i++) {
                if ($i ~ /^local=/) { lp = $i; sub(/.*:/, "", lp) }
                else if ($i ~ /^peer=/) { pp = $i; sub(/.*:/, "", pp) }
                else if ($i ~ /^mode=/) mode = substr($i, 6)
            }
            if (mode == "" || pp == "0" || pp == "") next
            on = (lp == port || pp == port)
            if ((which == "on") == on) n[mode]++
        }
        END { for (m in n) print m, n[m] }'
}

# Per-row values: $tmp/v/ROW.HOW holds one value per good run;
# $tmp/v/GROUP.HOW.runs one line per attempted run (ok or failed);
# $tmp/v/GROUP.mode one verdict per sdirect run.
mkdir -p "$tmp/v"
put() { echo "$3" >>"$tmp/v/$1.$2"; }  # ROW HOW VALUE
ran() { echo "$3" >>"$tmp/v/$1.$2.runs"; }  # GROUP HOW ok|failed

# One measurement each. $1: kernel|sdirect. Return 1 on failure, 2 if the
# server did not start (after saying why with failed), else 0 after
# recording the values with put.

# failed TEXT: a run failed; said on stderr and listed under the table.
failed() {
    echo "  $*" >&2
    echo "repeat $r: $*" >>"$tmp/failures"
    if [[ -s "$tmp/stall" ]]; then
        {
            echo "    live connections shortly before the timeout:"
            sed 's/^/    /' "$tmp/stall"
        } | tee -a "$tmp/failures" >&2
        rm -f "$tmp/stall"
    fi
}

# output_of FILE...: the last lines the files hold, on one line.
output_of() {
    local text
    text="$(cat "$@" 2>/dev/null | tr -d '\r' | grep -v '^[[:space:]]*$' | tail -n 3 | tr '\n' ' ')"
    echo "${text:-no output}" | cut -c 1-240
}

measure_sockperf() {
    local how="$1" rc vals med avg
    next_port
    start_bg sp-srv "$((sp_secs + 30))" "$how" srv_pin sockperf sr --tcp -i 127.0.0.1 -p "$port"
    local srv=$bg_pid
    if ! wait_listen "$port" "$srv"; then
        failed "sockperf $how: server did not start (tried once more on the next port): $(output_of "$tmp/sp-srv.out" "$tmp/sp-srv.err")"
        stop_pid "$srv" TERM 5
        return 2
    fi
    run_fg sp-cli "$((sp_secs + 15))" "$how" cli_pin \
        sockperf pp --tcp -i 127.0.0.1 -p "$port" -m 64 -t "$sp_secs" --mps 2000000
    rc=$?
    # sockperf ends through exit() (stats written) on SIGINT.
    stop_pid "$srv" INT 5
    # "====> avg-latency=2.075 (std-dev=70.279)" and
    # "---> percentile 50.000 =    0.787", among colour escapes.
    vals="$(awk '
        match($0, /avg-latency=[0-9.]+/) { avg = substr($0, RSTART + 12, RLENGTH - 12) }
        /percentile 50\.000 =/ { med = $NF }
        /# dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0/ { clean = 1 }
        END { if (avg != "" && med != "" && clean) print med, avg }' "$tmp/sp-cli.out")"
    if ((rc != 0)) || [[ -z "$vals" ]]; then
        failed "sockperf $how: $(status_text "$rc"), $(output_of "$tmp/sp-cli.out" "$tmp/sp-cli.err")"
        return 1
    fi
    read -r med avg <<<"$vals"
    put sp_med "$how" "$med"
    put sp_avg "$how" "$avg"
    [[ "$how" == sdirect ]] && direct_verdict "$port" 1 sp-srv sp-cli >>"$tmp/v/sp.mode"
    echo "  sockperf $how: median $med us, mean $avg us" >&2
}

measure_redis() {
    local how="$1" clients="$2" n rc vals set get
    n=$redis_n1
    ((clients > 1)) && n=$redis_n50
    next_port
    rm -rf "$tmp/redis"
    mkdir -p "$tmp/redis"
    start_bg rd-srv 120 "$how" srv_pin redis-server --bind 127.0.0.1 --port "$port" --save '' \
        --appendonly no --dir "$tmp/redis" --daemonize no --protected-mode no
    local srv=$bg_pid
    if ! wait_listen "$port" "$srv"; then
        failed "redis $how: server did not start (tried once more on the next port): $(output_of "$tmp/rd-srv.out" "$tmp/rd-srv.err")"
        stop_pid "$srv" TERM 5
        return 2
    fi
    run_fg rd-cli "$redis_limit" "$how" cli_pin \
        redis-benchmark -h 127.0.0.1 -p "$port" -t set,get -c "$clients" -n "$n" --csv
    rc=$?
    # redis-server shuts down through exit() (stats written) on SIGTERM.
    stop_pid "$srv" TERM 10
    # "SET","74404.77","0.010",...
    vals="$(awk -F, '
        { gsub(/"/, "") }
        $1 == "SET" { set = $2 }
        $1 == "GET" { get = $2 }
        END { if (set != "" && get != "") print set, get }' "$tmp/rd-cli.out")"
    if ((rc != 0)) || [[ -z "$vals" ]]; then
        failed "redis $how -c $clients: $(status_text "$rc"), $(output_of "$tmp/rd-cli.out" "$tmp/rd-cli.err")"
        return 1
    fi
    read -r set get <<<"$vals"
    put "rd_set_$clients" "$how" "$set"
    put "rd_get_$clients" "$how" "$get"
    # redis-benchmark opens one more connection (CONFIG GET) than -c.
    [[ "$how" == sdirect ]] && direct_verdict "$port" "$clients" rd-srv rd-cli >>"$tmp/v/rd$clients.mode"
    echo "  redis $how -c $clients: SET $set/s, GET $get/s" >&2
}

# netperf against netserver in its default forking mode (each test's
# control connection is accepted, then served by a forked child, which
# makes the data connection): TCP_RR (1-byte transactions), TCP_STREAM
# and TCP_MAERTS (16 KiB writes, the default), np_secs each.
measure_netperf() {
    local how="$1" t rc val verdict="" np_dports=""
    next_port
    start_bg np-srv 120 "$how" srv_pin netserver -D -4 -L 127.0.0.1 -p "$port"
    local srv=$bg_pid
    if ! wait_listen "$port" "$srv"; then
        failed "netperf $how: netserver did not start (tried once more on the next port): $(output_of "$tmp/np-srv.out" "$tmp/np-srv.err")"
        stop_pid "$srv" TERM 5
        return 2
    fi
    for t in TCP_RR TCP_STREAM TCP_MAERTS; do
        run_fg "np-$t" "$((np_secs + 20))" "$how" cli_pin \
            netperf -4 -H 127.0.0.1 -p "$port" -t "$t" -l "$np_secs" -P 0
        rc=$?
        # -P 0: one line, the result last (transactions/s or 10^6 bit/s).
        val="$(awk 'NF >= 5 { r = $NF } END { if (r + 0 > 0) print r }' "$tmp/np-$t.out")"
        if ((rc != 0)) || [[ -z "$val" ]]; then
            stop_pid "$srv" TERM 5
            failed "netperf -t $t $how: $(status_text "$rc"), $(output_of "$tmp/np-$t.out" "$tmp/np-$t.err")"
            return 1
        fi
        put "np_${t,,}" "$how" "$val"
        # The data connection the forked netserver made (to a port of its
        # own, not $port) carries the test: it must be direct with bytes on
        # the fabric on both ends (the server's side once netserver stops).
        # The control connection on $port moves a few hundred bytes in 3
        # or 4 calls, short of earning its upgrade (SDIRECT_UPGRADE_AFTER_MS),
        # so the library keeps no counters of it; recorded (it earned it,
        # e.g. at once), it must be direct too.
        if [[ "$how" == sdirect ]]; then
            local v dports
            v="$(direct_verdict "$port" 0 "np-$t")"
            if [[ "$v" == direct ]]; then
                dports="$(netperf_data_ports "$port" "$tmp/np-$t.stats")"
                if [[ -z "$dports" ]]; then
                    v="NOT DIRECT: np-$t: no data connection recorded"
                else
                    v="$(direct_verdict "$dports" 1 "np-$t")"
                    np_dports+="${np_dports:+,}$dports"
                fi
            fi
            [[ "$v" == direct ]] || verdict+="${verdict:+; }${v#NOT DIRECT: }"
        fi
        echo "  netperf -t $t $how: $val" >&2
    done
    stop_pid "$srv" TERM 5
    if [[ "$how" == sdirect ]]; then
        # netserver's children wrote their stats as they exited.
        local v
        v="$(direct_verdict "$port" 0 np-srv)"
        [[ "$v" == direct ]] || verdict+="${verdict:+; }${v#NOT DIRECT: }"
        if [[ "$v" == direct && -n "$np_dports" ]]; then
            v="$(direct_verdict "$np_dports" "$(awk -F, '{ print NF }' <<<"$np_dports")" np-srv)"
            [[ "$v" == direct ]] || verdict+="${verdict:+; }${v#NOT DIRECT: }"
        fi
        [[ -n "$verdict" ]] && verdict="NOT DIRECT: $verdict"
        echo "${verdict:-direct}" >>"$tmp/v/np.mode"
    fi
    return 0
}

# netperf_data_ports CTLPORT FILE: the ports netserver's children took for
# the data connections in a netperf client's stats FILE (its connections
# other than the control one on CTLPORT, listeners aside), comma-separated.
netperf_data_ports() {
    awk -v port="$1" '
        { lp = ""; pp = ""
          for (i = 1; i <= NF; i++) {
              if ($i ~ /^local=/) { lp = $i; sub(/.*:/, "", lp) }
              else if ($i ~ /^peer=/) { pp = $i; sub(/.*:/, "", pp) }
          }
          if (pp == "" || pp == "0" || lp == port || pp == port || seen[pp]++) next
          out = out (out == "" ? "" : ",") pp }
        END { print out }' "$2"
}

# users_lib: the library copied into $tmp/tools, where
# processes of other users may read them (the build may sit in a
# directory they cannot); sets users_lib_path. $tmp becomes searchable
# and readable by all.
users_lib_path=""
users_lib() {
    [[ -n "$users_lib_path" ]] && return 0
    chmod 755 "$tmp"
    mkdir -p "$tmp/tools"
    chmod 755 "$tmp/tools"
    if bench_have_sdirect; then
        cp "$build/intercept/libsdirect.so" "$build"/intercept/libsdirect-psm*.so "$tmp/tools/" || return 1
        chmod a+rx "$tmp"/tools/libsdirect*.so
        users_lib_path="$tmp/tools/libsdirect.so"
    fi
}

# PostgreSQL: one database for every run, made at the first pg measurement
# (initdb and pgbench -i, nothing preloaded); as root everything runs as
# nobody, with its own copy of the library (users_lib).
pg_as=()
pg_lib=""
pg_ready=0
pg_setup() {
    ((pg_ready)) && return 0
    pg_ready=2
    pgbin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
    if [[ -z "$pgbin" || ! -x "$pgbin/postgres" ]] || ! command -v pgbench >/dev/null; then
        echo "$me: PostgreSQL or pgbench not installed (Debian package postgresql); pg skipped" >&2
        return 1
    fi
    if ((EUID == 0)); then
        pg_as=(setpriv --reuid=nobody --regid=nogroup --clear-groups --)
        users_lib
        chown nobody:nogroup "$tmp"
        pg_lib="$users_lib_path"
    fi
    local port_init
    next_port
    port_init=$port
    if ! (cd "$tmp" && timeout 60 "${pg_as[@]}" "$pgbin/initdb" -D "$tmp/pgdata" -U postgres \
        -A trust --no-sync -E UTF8 --locale=C) >"$tmp/pg-initdb.log" 2>&1 ||
        ! pg_start kernel "$port_init" ||
        ! (cd "$tmp" && timeout 60 "${pg_as[@]}" pgbench -h 127.0.0.1 -p "$port_init" -U postgres \
            -i -s 1 -q postgres) >"$tmp/pg-init.log" 2>&1; then
        echo "$me: PostgreSQL set-up failed: $(output_of "$tmp/pg-initdb.log" "$tmp/pg-srv.err" "$tmp/pg-init.log"); pg skipped" >&2
        stop_pid "$pg_srv" TERM 20
        return 1
    fi
    stop_pid "$pg_srv" TERM 20
    pg_ready=1
}

# pg_start HOW PORT [PREFIX...]: the server on the database (PREFIX before
# it, e.g. bench_defaults), ready for connections; pg_srv its pid.
pg_start() {
    local how="$1" port="$2" i run_lib="$pg_lib"
    shift 2
    start_bg pg-srv 300 "$how" srv_pin "$@" "${pg_as[@]}" "$pgbin/postgres" -D "$tmp/pgdata" \
        -k "$tmp" -c listen_addresses=127.0.0.1 -p "$port" -c fsync=off -c synchronous_commit=off \
        -c full_page_writes=off -c max_connections=30 -c autovacuum=off
    pg_srv=$bg_pid
    for ((i = 0; i < 600; i++)); do
        grep -q "ready to accept connections" "$tmp/pg-srv.err" 2>/dev/null && return 0
        kill -0 "$pg_srv" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# pgbench_result FILE: "TPS LATENCY" of pgbench's report in FILE, if no
# transaction failed. "latency average = 0.083 ms", "tps = 12003.1
# (without initial connection time)", "number of failed transactions: 0
# (0.000%)".
pgbench_result() {
    awk '
        /^latency average = / { lat = $4 }
        /^tps = / { tps = $3 }
        /^number of failed transactions: 0 / { clean = 1 }
        END { if (tps != "" && lat != "" && clean) print tps, lat }' "$1"
}

measure_pg() {
    local how="$1" cfg script clients rc vals tps lat ok=0 run_lib
    pg_setup || return 1
    next_port
    if ! pg_start "$how" "$port"; then
        failed "pg $how: server did not start: $(output_of "$tmp/pg-srv.err")"
        stop_pid "$pg_srv" TERM 20
        return 2
    fi
    run_lib="$pg_lib"
    for cfg in S1 S8 S16 B1 B8; do
        script="${cfg:0:1}"
        clients="${cfg:1}"
        local opts=(-n -T "$pg_secs" -c "$clients" -j "$((clients > 1 ? 2 : 1))")
        [[ "$script" == S ]] && opts+=(-S)
        run_fg "pg-cli-$script$clients" "$((pg_secs + 30))" "$how" cli_pin "${pg_as[@]}" \
            pgbench -h 127.0.0.1 -p "$port" -U postgres "${opts[@]}" postgres
        rc=$?
        vals="$(pgbench_result "$tmp/pg-cli-$script$clients.out")"
        if ((rc != 0)) || [[ -z "$vals" ]]; then
            failed "pg $how -$script -c $clients: $(status_text "$rc"), $(output_of "$tmp/pg-cli-$script$clients.out" "$tmp/pg-cli-$script$clients.err")"
            continue
        fi
        read -r tps lat <<<"$vals"
        put "pg_${script}${clients}_tps" "$how" "$tps"
        put "pg_${script}${clients}_lat" "$how" "$lat"
        ok=$((ok + 1))
        echo "  pg $how -$script -c $clients: $tps tps, $lat ms" >&2
    done
    # Smart shutdown: the postmaster exits (stats written) once idle.
    stop_pid "$pg_srv" TERM 20
    ((ok == 5)) || return 1
    [[ "$how" == sdirect ]] &&
        direct_verdict "$port" 1 pg-srv pg-cli-S1 pg-cli-S8 pg-cli-S16 pg-cli-B1 pg-cli-B8 >>"$tmp/v/pg.mode"
    return 0
}

# The rows with a process or a connection per transaction: measure_rcli,
# measure_npcrr, measure_ab, measure_pgc.
# shellcheck source=benchmarks/apps_fresh.sh
source "$bench_dir/apps_fresh.sh"
# The rows of services under their own users with root's clients:
# measure_pgx, measure_abx, measure_abxc, measure_myx.
# shellcheck source=benchmarks/apps_users.sh
source "$bench_dir/apps_users.sh"

# cpu_of PID: "ticks switches" of a process: utime + stime (all its
# threads, /proc/PID/stat) and the context switches of its live threads.
cpu_of() {
    local ticks sw
    ticks="$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat" 2>/dev/null)" || return 1
    [[ -n "$ticks" ]] || return 1
    sw="$(cat "/proc/$1"/task/*/status 2>/dev/null |
        awk '/^(non)?voluntary_ctxt_switches:/ { n += $2 } END { print n + 0 }')"
    echo "$ticks $sw"
}

# wait_ready ROLE PID SECONDS: waits for "ready PID" in ROLE's output;
# sets ready_pid.
wait_ready() {
    local i
    ready_pid=""
    for ((i = 0; i < $3 * 20; i++)); do
        ready_pid="$(awk '$1 == "ready" { print $2; exit }' "$tmp/$1.out" 2>/dev/null)"
        [[ -n "$ready_pid" ]] && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

measure_idle() {
    local how="$1" limit=$((idle_secs + 60)) srv cli spid="" cpid="" s0="" c0="" s1 c1 t0 t1 ok rc_s rc_c
    next_port
    start_bg idle-srv "$limit" "$how" srv_pin "$py" "$bench_dir/idle_conns.py" server "$port" "$idle_conns"
    srv=$bg_pid
    if ! wait_listen "$port" "$srv"; then
        failed "idle $how: server did not start (tried once more on the next port): $(output_of "$tmp/idle-srv.err")"
        stop_pid "$srv" TERM 5
        return 2
    fi
    start_bg idle-cli "$limit" "$how" cli_pin "$py" "$bench_dir/idle_conns.py" client "$port" "$idle_conns"
    cli=$bg_pid
    # The server is ready once the client has set up every connection.
    wait_ready idle-srv "$srv" 30 && spid=$ready_pid &&
        wait_ready idle-cli "$cli" 10 && cpid=$ready_pid
    if [[ -z "$spid" || -z "$cpid" ]]; then
        failed "idle $how: connections not set up: $(output_of "$tmp/idle-srv.err" "$tmp/idle-cli.err")"
        stop_pid "$cli" TERM 5
        stop_pid "$srv" TERM 5
        return 1
    fi
    sleep "$idle_settle"
    t0=$EPOCHREALTIME
    s0="$(cpu_of "$spid")" && c0="$(cpu_of "$cpid")"
    sleep "$idle_secs"
    s1="$(cpu_of "$spid")" && c1="$(cpu_of "$cpid")"
    ok=$?
    t1=$EPOCHREALTIME
    # The client closes its connections on SIGTERM; the server then sees
    # EOF on all of them and exits by itself.
    stop_pid "$cli" TERM 10
    rc_c=$?
    wait_pid "$srv" 10
    rc_s=$?
    if ((ok != 0)) || [[ -z "$s0" || -z "$c0" ]]; then
        failed "idle $how: a process ended during the measurement (server $(status_text "$rc_s"), client $(status_text "$rc_c"))"
        return 1
    fi
    if ((rc_c != 0 || rc_s != 0)); then
        failed "idle $how: server $(status_text "$rc_s"), client $(status_text "$rc_c"): $(output_of "$tmp/idle-srv.err" "$tmp/idle-cli.err")"
        return 1
    fi
    local vals
    vals="$(awk -v t0="$t0" -v t1="$t1" -v hz="$clk_tck" -v s0="$s0" -v s1="$s1" -v c0="$c0" -v c1="$c1" '
        BEGIN {
            secs = t1 - t0
            split(s0, a, " "); split(s1, b, " "); split(c0, c, " "); split(c1, d, " ")
            printf "%.2f %.2f %.1f %.1f\n", (b[1] - a[1]) / hz / secs * 100, (d[1] - c[1]) / hz / secs * 100,
                (b[2] - a[2]) / secs, (d[2] - c[2]) / secs
        }')"
    read -r scpu ccpu swake cwake <<<"$vals"
    put idle_srv_cpu "$how" "$scpu"
    put idle_cli_cpu "$how" "$ccpu"
    put idle_srv_wake "$how" "$swake"
    put idle_cli_wake "$how" "$cwake"
    [[ "$how" == sdirect ]] && direct_verdict "$port" "$idle_conns" idle-srv idle-cli >>"$tmp/v/idle.mode"
    echo "  idle $how: server ${scpu}% ${swake} wake-ups/s, client ${ccpu}% ${cwake} wake-ups/s" >&2
}

# Measurement groups: name, the programs they need, the call.
declare -A need=([sp]="sockperf" [rd1]="redis-server redis-benchmark"
    [rd50]="redis-server redis-benchmark" [rcli]="redis-server redis-cli" [pg]="pgbench setpriv"
    [pgc]="pgbench setpriv" [np]="netperf netserver" [npcrr]="netperf netserver"
    [ab]="ab $nginx" [pgx]="pgbench setpriv" [abx]="ab $nginx" [abxc]="ab $nginx"
    [myx]="mysqlslap $mariadbd mariadb-install-db setpriv" [idle]="$py")
groups=()
for app in "${apps[@]}"; do
    case "$app" in
        sockperf) groups+=(sp) ;;
        redis) groups+=(rd1 rd50 rcli) ;;
        pg) groups+=(pg pgc) ;;
        pg-C) groups+=(pgc) ;;
        pg-users) groups+=(pgx) ;;
        netperf) groups+=(np npcrr) ;;
        nginx) groups+=(ab) ;;
        nginx-users) groups+=(abx abxc) ;;
        mariadb-users) groups+=(myx) ;;
        idle) groups+=(idle) ;;
    esac
done
# na_reason[GROUP]: why GROUP's rows are n/a here (shown in their mode
# column and under the table).
declare -A usable=() na_reason=()
for g in "${groups[@]}"; do
    usable[$g]=1
    for prog in ${need[$g]}; do
        if ! command -v "$prog" >/dev/null 2>&1; then
            echo "$me: $prog not installed (scripts/setup.sh installs it); its rows are n/a" >&2
            usable[$g]=0
            na_reason[$g]="${na_reason[$g]:-$prog not installed}"
        fi
    done
    case "$g" in
        pgx | abx | abxc | myx)
            why="$(users_missing "$g")"
            if [[ -n "$why" && -z "${na_reason[$g]:-}" ]]; then
                echo "$me: $g rows n/a: $why" >&2
                usable[$g]=0
                na_reason[$g]="$why"
            fi ;;
    esac
done
measure() {  # GROUP HOW
    case "$1" in
        sp) measure_sockperf "$2" ;;
        rd1) measure_redis "$2" 1 ;;
        rd50) measure_redis "$2" 50 ;;
        rcli) measure_rcli "$2" ;;
        pg) measure_pg "$2" ;;
        pgc) measure_pgc "$2" ;;
        np) measure_netperf "$2" ;;
        npcrr) measure_npcrr "$2" ;;
        ab) measure_ab "$2" ;;
        pgx) measure_pgx "$2" ;;
        abx) measure_abx "$2" ;;
        abxc) measure_abxc "$2" ;;
        myx) measure_myx "$2" ;;
        idle) measure_idle "$2" ;;
    esac
}
# group_limit GROUP: seconds one measurement can take at worst (every
# process to its timeout).
group_limit() {
    case "$1" in
        sp) echo $((2 * sp_secs + 60)) ;;
        rd1 | rd50) echo $((redis_limit + 20)) ;;
        rcli) echo $((rcli_n * 11 + 40)) ;;
        pg) echo $((5 * (pg_secs + 36) + 220)) ;;
        pgc) echo $((pg_secs + 80)) ;;
        np) echo $((3 * (np_secs + 26) + 10)) ;;
        npcrr) echo $((np_secs + 40)) ;;
        ab) echo $((4 * (ab_secs + 26) + 20)) ;;
        pgx) echo $((2 * (pg_secs + 36) + 220)) ;;
        abx) echo $((2 * (ab_secs + 26) + 30)) ;;
        abxc) echo $((ab_secs + 56)) ;;
        myx) echo $((2 * 60 + 120)) ;;
        idle) echo $((idle_secs + 130)) ;;
    esac
}

# apps_measure: every repeat of every group, both columns, in the current
# placement.
declare -A failed_row=()
apps_measure() {
    local r g how rc
    for ((r = 1; r <= repeats; r++)); do
        echo " repeat $r of $repeats ($((SECONDS - started)) s)" >&2
        for g in "${groups[@]}"; do
            ((usable[$g])) || continue
            for how in "${hows[@]}"; do
                # Three failed runs in a row retire the column: a hanging
                # library cannot stretch the run by a timeout per repeat.
                ((${failed_row[$g.$how]:-0} >= 3)) && continue
                measure "$g" "$how"
                rc=$?
                if ((rc == 2)); then
                    measure "$g" "$how"
                    rc=$?
                fi
                if ((rc == 0)); then
                    ran "$g" "$how" ok
                    failed_row[$g.$how]=0
                else
                    ran "$g" "$how" failed
                    failed_row[$g.$how]=$((${failed_row[$g.$how]:-0} + 1))
                    ((failed_row[$g.$how] >= 3)) &&
                        echo "$me: $g $how failed three times in a row; no more runs of it" >&2
                fi
            done
        done
    done
}

# The rows: id, group, label, unit, kind (lower: latency, speedup
# kernel/sdirect; higher: rate, speedup sdirect/kernel; max: an absolute
# bound on sdirect; info: no target), target, and how the mode is judged
# (strict, the default: every connection direct, else the row says NOT
# DIRECT and misses its target; counts: the client's connections counted
# by mode, the target on speed alone).
rows=(
    "sp_med sp sockperf_ping-pong_64_B,_median us lower 10"
    "sp_avg sp sockperf_ping-pong_64_B,_mean us lower -"
    "rd_set_1 rd1 redis_SET,_1_client req/s higher 2"
    "rd_get_1 rd1 redis_GET,_1_client req/s higher 2"
    "rd_set_50 rd50 redis_SET,_50_clients req/s higher 1.3"
    "rd_get_50 rd50 redis_GET,_50_clients req/s higher 1.3"
    "rcli_ms rcli redis-cli_ping,_${rcli_n}_processes_(median) ms lower 0.91 counts"
    "pg_S1_tps pg pgbench_select-only,_1_client tx/s higher 1.5"
    "pg_S1_lat pg pgbench_select-only,_1_client,_latency ms lower -"
    "pg_S8_tps pg pgbench_select-only,_8_clients tx/s higher 1.3"
    "pg_S8_lat pg pgbench_select-only,_8_clients,_latency ms lower -"
    "pg_S16_tps pg pgbench_select-only,_16_clients tx/s higher 1.0"
    "pg_S16_lat pg pgbench_select-only,_16_clients,_latency ms lower -"
    "pg_B1_tps pg pgbench_TPC-B-like,_1_client tx/s higher -"
    "pg_B8_tps pg pgbench_TPC-B-like,_8_clients tx/s higher -"
    "pg_C_tps pgc pgbench_-C_-S,_connection_per_tx tx/s higher 1.0 counts"
    "np_tcp_rr np netperf_TCP_RR,_forking_netserver trans/s higher -"
    "np_tcp_stream np netperf_TCP_STREAM_(16_KiB_writes) Mbit/s higher -"
    "np_tcp_maerts np netperf_TCP_MAERTS_(16_KiB_writes) Mbit/s higher -"
    "np_tcp_crr npcrr netperf_TCP_CRR,_forking_netserver conn/s higher 1.0 counts"
    "ab_c1 ab ab+nginx_4_KiB,_no_keep-alive,_c=1 req/s higher 1.0 counts"
    "ab_c4 ab ab+nginx_4_KiB,_no_keep-alive,_c=4 req/s higher 1.0 counts"
    "ab_k1 ab ab+nginx_4_KiB,_keep-alive,_c=1 req/s higher 1.0 counts"
    "ab_k4 ab ab+nginx_4_KiB,_keep-alive,_c=4 req/s higher 1.0 counts"
    "pgx_S1_tps pgx pg-users_select-only,_1_client tx/s higher 1.5"
    "pgx_S1_lat pgx pg-users_select-only,_1_client,_latency ms lower -"
    "pgx_S8_tps pgx pg-users_select-only,_8_clients tx/s higher 1.3"
    "pgx_S8_lat pgx pg-users_select-only,_8_clients,_latency ms lower -"
    "abx_k1 abx nginx-users_ab_4_KiB,_keep-alive,_c=1 req/s higher 1.0"
    "abx_k4 abx nginx-users_ab_4_KiB,_keep-alive,_c=4 req/s higher 1.0"
    "abx_c1 abxc nginx-users_ab_4_KiB,_no_keep-alive,_c=1 req/s higher 1.0 counts"
    "myx_c1_qps myx mariadb-users_key_reads,_1_client q/s higher 1.0"
    "myx_c8_qps myx mariadb-users_key_reads,_8_clients q/s higher 1.0"
    "idle_srv_cpu idle idle_${idle_conns}_conns:_server_CPU_(epoll) %_core max 1"
    "idle_cli_cpu idle idle_${idle_conns}_conns:_client_CPU_(poll) %_core max 1"
    "idle_srv_wake idle idle_${idle_conns}_conns:_server_wake-ups /s info -"
    "idle_cli_wake idle idle_${idle_conns}_conns:_client_wake-ups /s info -"
)
runs_of() {  # GROUP HOW: "good/attempted"
    local f="$tmp/v/$1.$2.runs"
    [[ -f "$f" ]] || { echo 0/0; return; }
    echo "$(grep -c '^ok$' "$f")/$(wc -l <"$f")"
}
# counts_text FILE: the "MODE COUNT" lines of every run summed up, as
# "direct 3/100, kernel 97/100" (most frequent first).
counts_text() {
    awk '{ n[$1] += $2; t += $2 }
        END { for (m in n) printf "%d %s %d/%d\n", n[m], m, n[m], t }' "$1" |
        sort -k1,1nr -k2,2 | awk '{ printf "%s%s %s", (NR > 1 ? ", " : ""), $2, $3 } END { print "" }'
}

# run_range KIND KVALUES SVALUES: the lowest and highest speedup of one
# repeat's pair ("0.91-1.04"), kernel and sdirect of the same repeat run
# one after the other; "-" unless every repeat of both is there (a failed
# run would pair values of different repeats) or with one repeat.
run_range() {
    awk -v kind="$1" -v kv="$2" -v sv="$3" 'BEGIN {
        n = split(kv, k, ","); m = split(sv, s, ",")
        if (n != m || n < 2 || (kind != "lower" && kind != "higher")) { print "-"; exit }
        for (i = 1; i <= n; i++) {
            if (k[i] + 0 <= 0 || s[i] + 0 <= 0) { print "-"; exit }
            r = kind == "lower" ? k[i] / s[i] : s[i] / k[i]
            if (i == 1 || r < lo) lo = r
            if (i == 1 || r > hi) hi = r
        }
        printf "%.2f-%.2f\n", lo, hi
    }'
}

# apps_table: the current placement's table into $pdir/apps.{tsv,txt}.
apps_table() {
    local row id g label unit kind target check k s speedup mode met tshow kv sv
    local tsv="$tmp/apps.tsv"
    printf 'id\tbenchmark\tunit\tkernel\tsdirect\tspeedup\ttarget\tmet\tsdirect_mode\tkernel_runs\tsdirect_runs\trepeats\tkernel_values\tsdirect_values\tspeedup_range\n' >"$tsv"
    for row in "${rows[@]}"; do
        read -r id g label unit kind target check <<<"$row"
        [[ " ${groups[*]} " == *" $g "* ]] || continue
        label="${label//_/ }"
        unit="${unit//_/ }"
        k=n/a
        s=n/a
        [[ -f "$tmp/v/$id.kernel" ]] && k="$(median <"$tmp/v/$id.kernel")"
        [[ -f "$tmp/v/$id.sdirect" ]] && s="$(median <"$tmp/v/$id.sdirect")"
        case "$kind" in
            lower) speedup="$(ratio "$k" "$s")" ;;
            higher) speedup="$(ratio "$s" "$k")" ;;
            *) speedup=- ;;
        esac
        if [[ -n "${na_reason[$g]:-}" ]]; then
            mode="n/a: ${na_reason[$g]}"
        elif [[ "$s" == n/a ]]; then
            mode=n/a
        elif [[ "$check" == counts ]]; then
            mode=unknown
            [[ -s "$tmp/v/$id.counts" ]] && mode="$(counts_text "$tmp/v/$id.counts")"
        elif [[ ! -f "$tmp/v/$g.mode" ]]; then
            mode=unknown
        elif ! grep -qv '^direct$' "$tmp/v/$g.mode"; then
            mode=direct
        else
            mode="NOT DIRECT in $(grep -cv '^direct$' "$tmp/v/$g.mode") of $(wc -l <"$tmp/v/$g.mode") runs ($(grep -v '^direct$' "$tmp/v/$g.mode" | head -n 1 | sed 's/^NOT DIRECT: //'))"
        fi
        met=-
        case "$kind" in
            lower | higher)
                [[ "$target" == - ]] && tshow=- || tshow=">=${target}x"
                [[ "$target" != - && "$speedup" != n/a ]] &&
                    met="$(awk -v a="$speedup" -v t="$target" 'BEGIN { print (a + 0 >= t + 0 ? "yes" : "no") }')" ;;
            max)
                tshow="<${target}%"
                [[ "$s" != n/a ]] && met="$(awk -v a="$s" -v t="$target" 'BEGIN { print (a + 0 < t + 0 ? "yes" : "no") }')" ;;
            *) tshow=- ;;
        esac
        [[ "$check" != counts && "$mode" != direct && "$met" == yes ]] && met="no (not direct)"
        kv="$(paste -sd, "$tmp/v/$id.kernel" 2>/dev/null)"
        sv="$(paste -sd, "$tmp/v/$id.sdirect" 2>/dev/null)"
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$id" "$label" "$unit" "$k" "$s" \
            "$speedup" "$tshow" "$met" "$mode" "$(runs_of "$g" kernel)" "$(runs_of "$g" sdirect)" \
            "$repeats" "${kv:--}" "${sv:--}" "$(run_range "$kind" "$kv" "$sv")" >>"$tsv"
    done
    cp "$tsv" "$pdir/apps.tsv"

    {
        echo "sdirect application benchmarks, $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -r), $(nproc) CPUs, median of $repeats run(s), placement $pin, load $load_at_start at start"
        echo "sockperf: one-way latency (RTT/2) of 64 B TCP ping-pong, ${sp_secs} s a run; redis: requests/s, no pipelining, -n $redis_n1 (1 client) / $redis_n50 (50 clients)"
        echo "redis-cli: median wall time of one of $rcli_n fresh \`redis-cli ping\` processes; target: at most 1.1x the kernel's, i.e. a ratio >=0.91"
        echo "pg: PostgreSQL + pgbench, scale 1, ${pg_secs} s a run; transactions/s and mean latency (select-only and TPC-B-like; -C: a new connection per transaction)"
        echo "netperf: netserver forking a child per test, netperf -P 0 for ${np_secs} s a test (TCP_RR: 1-byte transactions/s; TCP_STREAM/TCP_MAERTS: 10^6 bit/s; TCP_CRR: connections/s)"
        echo "ab+nginx: requests/s for a 4 KiB file, ${ab_secs} s a run, c = concurrent requests"
        echo "pg-users: PostgreSQL run as postgres (its own data directory), pgbench -S as root, ${pg_secs} s a run; nginx-users: nginx with \`user www-data;\` (master root, workers www-data), ab as root"
        echo "mariadb-users: mariadbd started by root with --user=mysql (its own data directory), mysqlslap as root, $myx_queries primary-key reads a run; both ends SDIRECT_UPGRADE_AFTER_MS=0"
        echo "idle: $idle_conns idle connections, CPU in % of one core and context switches/s of each process over ${idle_secs} s"
        echo "speedup: kernel/sdirect for latency, sdirect/kernel for rates, of the medians; per repeat: the lowest and highest speedup of one"
        echo "repeat's pair (kernel and sdirect run one after the other), the run-to-run spread a row's speedup stands in;"
        echo "runs: good/attempted; sdirect mode: as recorded by the library"
        echo "(MODE n/N: the client's connections by the mode they ended in, over all runs; a process records its last 4096;"
        echo " unasked: ab connections that closed before asking to go direct, on TCP, of which the library keeps no counters)"
        [[ -n "${hog_note:-}" ]] && echo "$hog_note"
        echo
        awk -F'\t' '
            function f(v) {
                if (v == "n/a" || v == "-") return v
                if (v + 0 >= 100) return sprintf("%.0f", v)
                if (v + 0 >= 10) return sprintf("%.1f", v)
                return sprintf("%.2f", v)
            }
            NR == 1 {
                printf "%-38s %-7s %9s %9s %8s %11s %7s %4s %6s %6s  %s\n", "benchmark", "unit", "kernel", "sdirect",
                    "speedup", "per repeat", "target", "met", "k runs", "s runs", "sdirect mode"
                next
            }
            {
                printf "%-38s %-7s %9s %9s %8s %11s %7s %4s %6s %6s  %s\n", $2, $3, f($4), f($5), $6, $15, $7,
                    ($8 == "no (not direct)" ? "no" : $8), $10, $11, $9
            }' "$tsv"
        if [[ -s "$tmp/failures" ]]; then
            echo
            echo "failed runs (left out of the medians) and retries:"
            sed 's/^/  /' "$tmp/failures"
        fi
        local ng first=1
        for ng in "${groups[@]}"; do
            [[ -n "${na_reason[$ng]:-}" ]] || continue
            ((first)) && echo
            first=0
            echo "not measured: $ng rows n/a: ${na_reason[$ng]}"
        done
    } >"$pdir/apps.txt"
    cat "$pdir/apps.txt"
}

# The hog's --timeout: the worst case of one placement's runs.
hog_bound=200
for g in "${groups[@]}"; do
    hog_bound=$((hog_bound + repeats * ${#hows[@]} * 2 * $(group_limit "$g")))
done
bench_out_init
echo "$me: ${apps[*]}, $repeats repeat(s), placements ${placements[*]}" >&2
started=$SECONDS
for p in "${placements[@]}"; do
    pdir="$out/$p"
    mkdir -p "$pdir"
    placement_use "$p"
    rm -rf "$tmp/v" "$tmp/failures"
    mkdir -p "$tmp/v"
    failed_row=()
    echo
    echo "$me: placement $pin" >&2
    if [[ "$p" == hog ]] && ! hog_start "$hog_bound"; then
        echo "placement hog not measured: stress-ng could not run" | tee "$pdir/apps.txt"
        continue
    fi
    load_at_start="$(bench_load)"
    apps_measure
    hog_note=""
    hog_stop || hog_note="NOTE: stress-ng ended (its --timeout) before these runs did; the last ones ran without it"
    apps_table
done
echo "results: $out ($((SECONDS - started)) s)" >&2
[[ "${BENCH_SUMMARY:-1}" == 0 ]] || bash "$bench_dir/summary.sh" "$out" >/dev/null
