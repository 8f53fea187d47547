#!/usr/bin/env bash
# NetPIPE's full curve: NPtcp (Debian's netpipe-tcp, unchanged) ping-pong
# from 1 B to BENCH_NP_UPPER (1 MiB) in NetPIPE's own steps, over kernel
# TCP and with both ends under sdirect-run, BENCH_NP_REPEATS runs each
# (3; a run takes 20-60 s here), alternated; the median per size. Both preloaded ends must report their
# connection direct (SDIRECT_STATS_FILE), or the run does not count.
#
# Each placement of BENCH_PLACEMENTS (lib.sh) in turn, the hog's stress-ng
# running for exactly that placement's runs.
#
# Output, in the run's folder (BENCH_OUT, or a new benchmarks/results/<UTC
# time>/) per placement: netpipe.tsv (size, Mbit/s and one-way us per
# column, the ratio), netpipe.png (throughput and latency vs size) and
# netpipe.txt, a short table of a few sizes (also on stdout); then
# benchmarks/summary.sh's summary.txt (unless BENCH_SUMMARY=0).
#
# Environment: BENCH_PLACEMENTS, BENCH_HOG_WORKERS, SDIRECT_BUILD_DIR as for
# run.sh;
# BENCH_NP_REPEATS (3), BENCH_NP_UPPER (largest size, 1048576), BENCH_NP_PORT (first
# port, BENCH_PORT + 200 = 47300).
set -uo pipefail

me=netpipe.sh
# shellcheck source=benchmarks/lib.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
upper="${BENCH_NP_UPPER:-1048576}"
repeats="${BENCH_NP_REPEATS:-3}"
port_base="${BENCH_NP_PORT:-$((${BENCH_PORT:-47100} + 200))}"
run_limit=180

if ! command -v NPtcp >/dev/null 2>&1; then
    echo "$me: NPtcp not installed (package netpipe-tcp); skipped" >&2
    exit 0
fi
have_sdirect=1
bench_have_sdirect || { echo "$me: libsdirect.so not available; sdirect column n/a" >&2; have_sdirect=0; }

bench_tmp netpipe
bench_out_init

# One NPtcp run; $1 kernel|sdirect, $2 run number. Its curve (NPtcp's -o
# file: size, Mbit/s, seconds one-way) in $tmp/$1.$2; status 1 on failure.
measure() {
    local how="$1" n="$2" pre=() port rc t0=$SECONDS
    port=$((port_base + n % 50))
    if [[ "$how" == sdirect ]]; then
        pre=("$run")
        port=$((port + 50))
    fi
    # Past a port some socket uses (an earlier run's in TIME-WAIT, another
    # connection's ephemeral port), at most 20 further.
    port="$(free_port_from "$port" 20)"
    rm -f "$tmp/srv.stats" "$tmp/cli.stats"
    SDIRECT_STATS_FILE="$tmp/srv.stats" timeout "$run_limit" "${srv_pin[@]}" "${pre[@]}" \
        NPtcp -P "$port" >"$tmp/srv.out" 2>&1 &
    srv_pid=$!
    if ! wait_listen "$port" "$srv_pid"; then
        echo "  $how run $n: NPtcp server did not listen: $(head -c 200 "$tmp/srv.out" | tr '\n' ' ')" >&2
        return 1
    fi
    (cd "$tmp" && SDIRECT_STATS_FILE="$tmp/cli.stats" timeout "$run_limit" "${cli_pin[@]}" \
        "${pre[@]}" NPtcp -h 127.0.0.1 -P "$port" -u "$upper" -o "$tmp/$how.$n" \
        >"$tmp/cli.out" 2>&1)
    rc=$?
    wait "$srv_pid" 2>/dev/null
    srv_pid=""
    if ((rc != 0)) || [[ ! -s "$tmp/$how.$n" ]]; then
        echo "  $how run $n failed (status $rc): $(tail -c 200 "$tmp/cli.out" | tr '\n' ' ')" >&2
        rm -f "$tmp/$how.$n"
        return 1
    fi
    if [[ "$how" == sdirect ]]; then
        local modes
        modes="$(modes_on_port "$port" "$tmp/srv.stats" "$tmp/cli.stats" | sort | uniq -c | xargs)"
        if [[ "$modes" != "2 direct" ]]; then
            echo "  sdirect run $n: connections not direct ($modes); left out" >&2
            rm -f "$tmp/$how.$n"
            return 1
        fi
    fi
    echo "  $how run $n: $((SECONDS - t0)) s" >&2
    return 0
}

hows=(kernel)
((have_sdirect)) && hows+=(sdirect)
started=$SECONDS

# Per column: size, median Mbit/s, median one-way us over the good runs.
medians() {
    local how="$1" files
    files=("$tmp/$how".*)
    [[ -e "${files[0]}" ]] || return 0
    awk '{ n[$1]++; bw[$1, n[$1]] = $2; us[$1, n[$1]] = $3 * 1e6 }
        function med(a, s, k,   i, j, t, v) {
            for (i = 1; i <= k; i++) v[i] = a[s, i]
            for (i = 2; i <= k; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
            return k % 2 ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
        }
        END { for (s in n) printf "%d %.6g %.6g %d\n", s, med(bw, s, n[s]), med(us, s, n[s]), n[s] }' \
        "${files[@]}" | sort -k1,1
}

# netpipe_placement: the runs of the current placement, its files in $pdir.
netpipe_placement() {
    local r how
    rm -f "$tmp"/kernel.* "$tmp"/sdirect.*
    echo "netpipe: NPtcp 1 B to $upper B, $repeats run(s) each, placement $pin" >&2
    for ((r = 0; r < repeats; r++)); do
        for how in "${hows[@]}"; do
            measure "$how" "$r"
        done
    done

    medians kernel >"$tmp/k.dat"
    medians sdirect >"$tmp/s.dat"

    {
        printf 'size\tkernel_mbit\tsdirect_mbit\tkernel_us\tsdirect_us\tspeedup\tkernel_runs\tsdirect_runs\n'
        join -a 1 -e n/a -o 0,1.2,2.2,1.3,2.3,1.4,2.4 "$tmp/k.dat" "$tmp/s.dat" |
            awk '{ r = ($3 == "n/a" || $2 + 0 == 0) ? "n/a" : sprintf("%.2f", $3 / $2)
                   printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", $1, $2, $3, $4, $5, r, $6, $7 }' |
            sort -n
    } >"$pdir/netpipe.tsv"

    {
        echo "NetPIPE (NPtcp ping-pong), $(date -u '+%Y-%m-%d %H:%M UTC'), median of $repeats run(s), placement $pin"
        printf '%-9s %12s %12s %10s %10s %8s\n' size "kernel Mb/s" "sdirect Mb/s" "kernel us" "sdirect us" speedup
        awk -F'\t' 'NR > 1 && ($1 == 1 || $1 == 64 || $1 == 1024 || $1 == 4096 || $1 == 65536 || $1 == 262144 || $1 == 1048576) {
            printf "%-9s %12.1f %12s %10.2f %10s %8s\n", $1, $2, $3, $4, $5, $6 }' "$pdir/netpipe.tsv"
    } >"$pdir/netpipe.txt"
    cat "$pdir/netpipe.txt"

    if command -v gnuplot >/dev/null 2>&1; then
        tail -n +2 "$pdir/netpipe.tsv" >"$tmp/np.dat"
        if timeout 60 gnuplot 2>"$tmp/gnuplot.err" <<EOF; then
set datafile missing "n/a"
set terminal pngcairo size 900,900 noenhanced
set output "$pdir/netpipe.png"
set multiplot layout 2,1 title "NetPIPE (NPtcp ping-pong), median of $repeats run(s), placement $placement"
set logscale xy
set grid
set key top left
set xrange [1:$upper * 1.5]
set xlabel "message size (bytes)"
set ylabel "throughput (Mbit/s)"
plot "$tmp/np.dat" using 1:2 with linespoints lw 1.5 pt 7 ps 0.4 title "kernel TCP", \
     "" using 1:3 with linespoints lw 1.5 pt 7 ps 0.4 title "sdirect"
set ylabel "one-way latency (us)"
plot "$tmp/np.dat" using 1:4 with linespoints lw 1.5 pt 7 ps 0.4 title "kernel TCP", \
     "" using 1:5 with linespoints lw 1.5 pt 7 ps 0.4 title "sdirect"
unset multiplot
EOF
            echo "plot: $pdir/netpipe.png" >&2
        else
            echo "$me: gnuplot failed: $(head -c 300 "$tmp/gnuplot.err")" >&2
        fi
    fi
}

# Worst case of one placement (every NPtcp pair to its timeout): the hog's
# --timeout.
hog_bound=$((repeats * ${#hows[@]} * (run_limit + 10) + 30))
for p in "${placements[@]}"; do
    pdir="$out/$p"
    mkdir -p "$pdir"
    placement_use "$p"
    if [[ "$p" == hog ]] && ! hog_start "$hog_bound"; then
        echo "placement hog not measured: stress-ng could not run" | tee "$pdir/netpipe.txt"
        continue
    fi
    netpipe_placement
    if ! hog_stop; then
        echo "NOTE: stress-ng ended before these runs did; the last ones ran without it" |
            tee -a "$pdir/netpipe.txt"
    fi
done
echo "results: $out ($((SECONDS - started)) s)" >&2
[[ "${BENCH_SUMMARY:-1}" == 0 ]] || bash "$bench_dir/summary.sh" "$out" >/dev/null
