#!/usr/bin/env bash
# A server that forks a child per connection (build/benchmarks/sd_forkserve:
# the child reads 100 bytes, answers 400 and exits), its client making
# BENCH_FORK_CONNS connections one after the other: the page faults and
# the CPU of the server and its children per connection (getrusage), and
# the client's wall time per connection, over kernel TCP and with both
# ends preloaded, BENCH_REPEATS runs each, alternated; medians. Page
# faults are counted, not timed: they stand where this host's timing
# scatters, and each is a page of the library's that a fork made the
# parent or the child copy or map again.
#
# Each placement of BENCH_PLACEMENTS (lib.sh) in turn, the hog's stress-ng
# running for exactly that placement's runs.
#
# Output, in the run's folder (BENCH_OUT, or a new benchmarks/results/<UTC
# time>/) per placement: forkserve.txt (the table, also on stdout) and
# forkserve.tsv (every run).
#
# Both ends run with the library's own settings (bench_defaults, lib.sh):
# each connection is over before it would ask to go direct, as a forking
# server's short connections are.
#
# Environment: BENCH_PLACEMENTS, BENCH_HOG_WORKERS, BENCH_REPEATS (5; 1
# with BENCH_QUICK=1), SDIRECT_BUILD_DIR as for run.sh; BENCH_FORK_CONNS
# (2000; 500 with BENCH_QUICK=1).
set -uo pipefail

me=forkserve.sh
# shellcheck source=benchmarks/lib.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
conns="${BENCH_FORK_CONNS:-$(qdef 2000 500)}"
if ! [[ "$conns" =~ ^[1-9][0-9]*$ ]] || ((conns > 100000)); then
    echo "$me: BENCH_FORK_CONNS must be 1..100000" >&2
    exit 1
fi
prog="$build/benchmarks/sd_forkserve"
if [[ ! -x "$prog" ]]; then
    echo "$me: $prog not built (scripts/build.sh)" >&2
    exit 1
fi
hows=(kernel)
if bench_have_sdirect && [[ -r "$sd_lib" ]]; then
    hows+=(sdirect)
else
    echo "$me: libsdirect.so not available; the sdirect column is n/a" >&2
fi
# Each run's bound: a connection takes a few ms on a slow host.
run_limit=$((60 + conns / 20))

bench_tmp forkserve
bench_out_init

# One run: $1 kernel|sdirect. Appends "how faults cpu_us wall_us" to
# $tmp/runs; status 1 on failure.
measure() {
    local how="$1" pre=() srv cli i
    # The library's own settings (bench_defaults): a connection of one
    # request never asks to go direct, and no child builds an engine.
    [[ "$how" == sdirect ]] && pre=("${bench_defaults[@]}" "LD_PRELOAD=$sd_lib")
    rm -f "$tmp/port"
    timeout "$run_limit" "${srv_pin[@]}" "${pre[@]}" "$prog" server "$tmp/port" "$conns" \
        >"$tmp/srv.out" 2>"$tmp/srv.err" &
    srv_pid=$!
    for ((i = 0; i < 400; i++)); do
        [[ -s "$tmp/port" ]] && break
        kill -0 "$srv_pid" 2>/dev/null || break
        sleep 0.05
    done
    if [[ ! -s "$tmp/port" ]]; then
        echo "  $how: the server did not listen: $(head -c 200 "$tmp/srv.err" | tr '\n' ' ')" >&2
        return 1
    fi
    cli="$(timeout "$run_limit" "${cli_pin[@]}" "${pre[@]}" "$prog" client "$(cat "$tmp/port")" \
        "$conns" 2>"$tmp/cli.err")"
    local rc=$?
    wait "$srv_pid"
    local src=$?
    srv_pid=""
    srv="$(cat "$tmp/srv.out")"
    if ((rc != 0 || src != 0)); then
        echo "  $how: client status $rc, server status $src: $(head -c 200 "$tmp/cli.err" "$tmp/srv.err" | tr '\n' ' ')" >&2
        return 1
    fi
    # conns=N faults_per_conn=F cpu_us_per_conn=C / conns=N wall_us_per_conn=W
    awk -v how="$how" -v s="$srv" -v c="$cli" 'BEGIN {
        n = split(s " " c, f, /[ =]/)
        for (i = 1; i < n; i += 2) v[f[i]] = f[i + 1]
        print how, v["faults_per_conn"], v["cpu_us_per_conn"], v["wall_us_per_conn"] }' >>"$tmp/runs"
    echo "  $how: $srv $cli" >&2
}

# col HOW FIELD: the median of FIELD (2 faults, 3 cpu, 4 wall) of HOW's runs.
col() { awk -v h="$1" -v f="$2" '$1 == h { print $f }' "$tmp/runs" | median; }

for p in "${placements[@]}"; do
    placement_use "$p"
    dir="$out/$p"
    mkdir -p "$dir" || exit 1
    : >"$tmp/runs"
    if [[ "$p" == hog ]] && ! hog_start $((repeats * ${#hows[@]} * run_limit + 60)); then
        continue
    fi
    echo "$me: $pin, $repeats repeat(s) of $conns connections" >&2
    for ((r = 1; r <= repeats; r++)); do
        for how in "${hows[@]}"; do measure "$how"; done
    done
    hog_stop
    cp "$tmp/runs" "$dir/forkserve.tsv"
    {
        echo "forkserve: a server forking a child per connection (the child reads 100 B, answers 400 B, exits), $conns connections a run, medians of $repeats; $pin"
        echo "faults and CPU: the server and its children, per connection (getrusage); wall: the client's, per connection"
        printf '%-24s %10s %10s %10s\n' "" kernel sdirect "sdirect/kernel"
        for f in 2:"page faults / conn" 3:"CPU us / conn" 4:"wall us / conn"; do
            k="$(col kernel "${f%%:*}")"
            s="$(col sdirect "${f%%:*}")"
            printf '%-24s %10s %10s %10s\n' "${f#*:}" "$k" "$s" "$(ratio "$s" "$k")"
        done
    } | tee "$dir/forkserve.txt"
done
echo "$me: results in $out" >&2
