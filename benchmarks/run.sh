#!/usr/bin/env bash
# Kernel TCP vs sdirect vs raw libfabric, one run, same machine, same sizes,
# in each placement of BENCH_PLACEMENTS (split, unpinned, hog; lib.sh).
#
#   kernel   sd_pingpong, plain
#   sdirect  sd_pingpong, both ends under build/tools/sdirect-run
#   fi       fi_pingpong -p shm -e rdm (ping-pong only)
#
# Every measurement is repeated BENCH_REPEATS times (default 5); the table
# shows the median of the repeats. Latency is one-way (RTT/2), the mean over
# one run's iterations (fi_pingpong's usec/xfer is that same statistic);
# the per-run median latencies of sd_pingpong go to the TSV as well. Each
# sd_pingpong ping-pong, kernel and sdirect alike, first warms up for
# BENCH_WARMUP_MS (200) untimed: the figure is the long connection's
# steady state, past its start (the upgrade, the first touch of its
# queues' pages, the scheduler's first placement of the two processes).
# fi_pingpong spins from its start and takes its own warm-up.
# Bandwidth is 10^6 B/s: sd_pingpong's stream mode (K messages one way, one
# ack); fi_pingpong has no stream mode, so its column in stream rows is its
# ping-pong bandwidth (size / one-way latency), not a streaming figure.
#
# Output: a new folder benchmarks/results/<UTC time>/ (results/latest
# links to it) with a folder per placement holding pingpong.{tsv,txt} (the
# table, also on stdout), latency.png, bandwidth.png and sdirect-tune's
# per-protocol table and plot (protocols.{txt,png}). Then
# benchmarks/netpipe.sh adds NetPIPE's curve (netpipe.{tsv,txt,png}) and
# benchmarks/apps.sh its table (apps.{tsv,txt}) to each placement's folder,
# and benchmarks/summary.sh writes summary.txt: every row's ratio in every
# placement and whether its target is met. The figures committed in
# benchmarks/results/ (the ones README.md quotes) change only when
# benchmarks/publish.sh copies a run there.
#
# Quick run (BENCH_QUICK=1, scripts/demo.sh): 1 repeat, sizes 1 4096
# 1048576, no sdirect-tune, no NetPIPE, apps.sh's quick settings.
#
# Environment: BENCH_PLACEMENTS ("split unpinned hog"), BENCH_QUICK (0),
# BENCH_REPEATS (5, quick 1), BENCH_PORT (first port, 47100; up to 100 ports
# above it are used), BENCH_SIZES (space-separated, default below),
# BENCH_HOG_WORKERS (2), SDIRECT_BUILD_DIR (build), BENCH_TUNE (1, quick 0;
# 0 skips sdirect-tune), BENCH_NETPIPE (1, quick 0; 0 skips netpipe.sh,
# NPtcp's full curve), BENCH_APP_LIST (apps.sh's arguments: which programs;
# default all), BENCH_APPS (1; 0 skips apps.sh, whose own settings
# are listed there), BENCH_OUT (the run's folder; default a new one),
# BENCH_WARMUP_MS (200; 0: sd_pingpong's own warm-up, a tenth of the
# iterations up to 1000), BENCH_WAIT (block; poll or epoll: both
# sd_pingpong ends non-blocking, waiting in poll() or in epoll_wait() as
# event-driven servers do, for the kernel and sdirect columns alike).
set -uo pipefail

me=run.sh
# shellcheck source=benchmarks/lib.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
pp="$build/benchmarks/sd_pingpong"
port_base="${BENCH_PORT:-47100}"
read -r -a sizes <<<"${BENCH_SIZES:-$(qdef "1 64 4096 65536 1048576" "1 4096 1048576")}"
modes=(pingpong stream)
run_limit=30  # seconds for one client or server process
wait_mode="${BENCH_WAIT:-block}"
case "$wait_mode" in
block | poll | epoll) ;;
*) echo "run.sh: BENCH_WAIT=$wait_mode: expected block, poll or epoll" >&2; exit 2 ;;
esac

if [[ ! -x "$pp" ]]; then
    echo "run.sh: $pp missing; run scripts/build.sh first" >&2
    exit 1
fi
have_sdirect=1
if ! bench_have_sdirect; then
    echo "run.sh: libsdirect.so not available; the sdirect column is n/a" >&2
    have_sdirect=0
fi
have_fi=1
if ! command -v fi_pingpong >/dev/null 2>&1; then
    echo "run.sh: fi_pingpong not installed (libfabric-bin); the fi_pingpong column is n/a" >&2
    have_fi=0
fi

bench_tmp bench
bench_out_init

# Iterations per measurement: about 0.2-0.4 s each with the kernel on 2 cores.
iters_for() {  # mode size
    case "$1:$2" in
        pingpong:*) (($2 >= 1048576)) && echo 300 && return
            (($2 >= 65536)) && echo 2000 && return
            echo 10000 ;;
        stream:*) (($2 >= 1048576)) && echo 256 && return
            (($2 >= 65536)) && echo 4000 && return
            (($2 >= 4096)) && echo 20000 && return
            echo 50000 ;;
    esac
}

# next_port: the next port of the range that no socket uses.
port_seq=0
next_port() {
    local i
    for ((i = 0; i < 100; i++)); do
        port=$((port_base + port_seq % 100))
        port_seq=$((port_seq + 1))
        port_in_use "$port" || return 0
    done
}

# Lets the background server end by itself (at most $1 tenths of a second,
# default 50), then reaps it.
reap_server() {
    local i
    for ((i = 0; i < ${1:-50}; i++)); do
        kill -0 "$srv_pid" 2>/dev/null || break
        sleep 0.1
    done
    kill "$srv_pid" 2>/dev/null
    wait "$srv_pid" 2>/dev/null
    srv_pid=""
}

# Value of key $2 in the key=value line $1.
field() { tr ' ' '\n' <<<"$1" | awk -F= -v k="$2" '$1 == k { print $2; exit }'; }

# One sd_pingpong measurement. $1: kernel|sdirect. Sets `line` (the client's
# output line, empty on failure) and appends the connection modes seen by
# the library to $tmp/modes.
measure_pp() {
    local how="$1" mode="$2" size="$3" iters="$4" pre=() warm=()
    [[ "$mode" == pingpong && "${BENCH_WARMUP_MS:-200}" != 0 ]] &&
        warm=(--warmup-ms "${BENCH_WARMUP_MS:-200}")
    next_port
    line=""
    rm -f "$tmp/srv.stats" "$tmp/cli.stats"
    [[ "$how" == sdirect ]] && pre=("$run")
    # Without the library SDIRECT_STATS_FILE is inert.
    SDIRECT_STATS_FILE="$tmp/srv.stats" timeout "$run_limit" "${srv_pin[@]}" "${pre[@]}" \
        "$pp" server "$port" --wait "$wait_mode" >"$tmp/srv.out" 2>&1 &
    srv_pid=$!
    if ! wait_listen "$port" "$srv_pid"; then
        echo "  $how server did not start: $(head -c 200 "$tmp/srv.out" | tr '\n' ' ')" >&2
        reap_server 0
        return 1
    fi
    local out
    out="$(SDIRECT_STATS_FILE="$tmp/cli.stats" timeout "$run_limit" "${cli_pin[@]}" "${pre[@]}" \
        "$pp" client 127.0.0.1 "$port" --size "$size" --iters "$iters" --mode "$mode" \
        --wait "$wait_mode" "${warm[@]}" 2>"$tmp/cli.err")"
    local rc=$?
    if ((rc != 0)); then reap_server 0; else reap_server; fi
    if ((rc != 0)) || [[ "$out" != size=* ]]; then
        echo "  $how $mode size=$size failed (status $rc): $(head -c 200 "$tmp/cli.err" | tr '\n' ' ')" >&2
        return 1
    fi
    line="$out"
    if [[ "$how" == sdirect ]]; then
        modes_on_port "$port" "$tmp/srv.stats" "$tmp/cli.stats" >>"$tmp/modes"
    fi
    return 0
}

# One fi_pingpong measurement; sets fi_lat (usec/xfer) and fi_bw (MB/sec).
measure_fi() {
    local size="$1" iters="$2"
    next_port
    fi_lat=""
    fi_bw=""
    timeout "$run_limit" "${srv_pin[@]}" fi_pingpong -p shm -e rdm -S "$size" -I "$iters" -B "$port" \
        >"$tmp/fsrv.out" 2>&1 &
    srv_pid=$!
    if ! wait_listen "$port" "$srv_pid"; then
        echo "  fi_pingpong size=$size: server did not start: $(head -c 200 "$tmp/fsrv.out" | tr '\n' ' ')" >&2
        reap_server
        return 1
    fi
    local out rc
    out="$(timeout "$run_limit" "${cli_pin[@]}" fi_pingpong -p shm -e rdm -S "$size" -I "$iters" \
        -P "$port" 127.0.0.1 2>&1)"
    rc=$?
    if ((rc != 0)); then reap_server 0; else reap_server; fi
    # Header "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec", then one row.
    local vals
    vals="$(awk '
        $1 == "bytes" { for (i = 1; i <= NF; i++) col[$i] = i; next }
        ("MB/sec" in col) && NF >= col["usec/xfer"] { print $col["usec/xfer"], $col["MB/sec"]; exit }
    ' <<<"$out")"
    if ((rc != 0)) || [[ -z "$vals" ]]; then
        echo "  fi_pingpong size=$size failed (status $rc): $(head -c 200 <<<"$out" | tr '\n' ' ')" >&2
        return 1
    fi
    read -r fi_lat fi_bw <<<"$vals"
    return 0
}

# pingpong_table: the sd_pingpong and fi_pingpong table of the current
# placement into $pdir (pingpong.{tsv,txt}, latency.png, bandwidth.png).
declare -A failed_cells retired
pingpong_table() {
    tsv="$tmp/pingpong.tsv"
    printf 'size\tmode\tmetric\tkernel\tsdirect\tfi_pingpong\tsdirect_vs_kernel\tsdirect_over_fi\tkernel_lat_median_us\tsdirect_lat_median_us\tkernel_mbps\tsdirect_mbps\tfi_mbps\tsdirect_mode\trepeats\n' >"$tsv"

    # Busy-polling columns (fi_pingpong, sdirect's spin) need idle CPUs.
    load_at_start="$(bench_load)"
    failed_cells=([kernel]=0 [sdirect]=0)
    retired=([kernel]=0 [sdirect]=0)
    echo "benchmarks, placement $pin: sizes ${sizes[*]}, $repeats repeat(s)" >&2
    for size in "${sizes[@]}"; do
        # fi_pingpong serves both rows of a size: latency and ping-pong bandwidth.
        : >"$tmp/fi_lat"
        : >"$tmp/fi_bw"
        if ((have_fi)); then
            for ((r = 0; r < repeats; r++)); do
                measure_fi "$size" "$(iters_for pingpong "$size")" || break
                echo "$fi_lat" >>"$tmp/fi_lat"
                echo "$fi_bw" >>"$tmp/fi_bw"
            done
        fi
        for mode in "${modes[@]}"; do
            iters="$(iters_for "$mode" "$size")"
            : >"$tmp/modes"
            for how in kernel sdirect; do
                : >"$tmp/$how.main"
                : >"$tmp/$how.median"
                : >"$tmp/$how.mbps"
                [[ "$how" == sdirect ]] && ((!have_sdirect)) && continue
                ((retired[$how])) && continue
                for ((r = 0; r < repeats; r++)); do
                    # A failed run is not repeated; three failed cells in a row
                    # retire the column, so a hanging library cannot stretch
                    # the run to hours.
                    if ! measure_pp "$how" "$mode" "$size" "$iters"; then
                        failed_cells[$how]=$((${failed_cells[$how]} + 1))
                        if ((failed_cells[$how] >= 3)); then
                            echo "run.sh: $how failed three times in a row; its column is n/a from here" >&2
                            retired[$how]=1
                        fi
                        break
                    fi
                    failed_cells[$how]=0
                    if [[ "$mode" == pingpong ]]; then
                        field "$line" lat_us_mean >>"$tmp/$how.main"
                        field "$line" lat_us_median >>"$tmp/$how.median"
                    else
                        field "$line" mbps >>"$tmp/$how.main"
                    fi
                    field "$line" mbps >>"$tmp/$how.mbps"
                done
            done
            k="$(median <"$tmp/kernel.main")"
            s="$(median <"$tmp/sdirect.main")"
            k_med="-"
            s_med="-"
            if [[ "$mode" == pingpong ]]; then
                metric=lat_us
                f="$(median <"$tmp/fi_lat")"
                vs_kernel="$(ratio "$k" "$s")"
                k_med="$(median <"$tmp/kernel.median")"
                s_med="$(median <"$tmp/sdirect.median")"
            else
                metric=mbps
                f="$(median <"$tmp/fi_bw")"
                vs_kernel="$(ratio "$s" "$k")"
            fi
            over_fi="$(ratio "$s" "$f")"
            sd_mode="$(sort -u "$tmp/modes" | paste -sd+ -)"
            # "unknown": measured, but the library wrote no SDIRECT_STATS_FILE line.
            [[ -z "$sd_mode" ]] && sd_mode="$([[ "$s" == n/a ]] && echo n/a || echo unknown)"
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
                "$size" "$mode" "$metric" "$k" "$s" "$f" "$vs_kernel" "$over_fi" "$k_med" "$s_med" \
                "$(median <"$tmp/kernel.mbps")" "$(median <"$tmp/sdirect.mbps")" \
                "$(median <"$tmp/fi_bw")" "$sd_mode" "$repeats" >>"$tsv"
            echo "  size=$size $mode: kernel=$k sdirect=$s fi=$f ($((SECONDS - started)) s)" >&2
        done
    done
    cp "$tsv" "$pdir/pingpong.tsv"

    # The table.
    {
        echo "sdirect benchmarks, $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -r), $(nproc) CPUs, median of $repeats run(s), placement $pin, load $load_at_start at start$([[ $wait_mode != block ]] && echo ", sd_pingpong waiting in $wait_mode")"
        echo "pingpong: one-way latency in us (lower is better); stream: MB/s = 10^6 B/s (higher is better)"
        echo "fi_pingpong in stream rows: its ping-pong bandwidth (size / one-way latency); it has no stream mode"
        echo "speedup: kernel/sdirect for latency, sdirect/kernel for bandwidth; sdirect mode: as recorded by the library"
        echo
        awk -F'\t' '
            NR == 1 { next }
            function f(v) {
                if (v == "n/a") return v
                if (v + 0 >= 100) return sprintf("%.0f", v)
                if (v + 0 >= 10) return sprintf("%.1f", v)
                return sprintf("%.2f", v)
            }
            {
                printf "%-8s %-9s %-7s %10s %10s %12s %8s %11s  %s\n", $1, $2, ($3 == "lat_us" ? "us" : "MB/s"),
                    f($4), f($5), f($6), $7, $8, $14
            }' "$tsv" | {
            printf '%-8s %-9s %-7s %10s %10s %12s %8s %11s  %s\n' size mode unit kernel sdirect fi_pingpong \
                speedup sdirect/fi "sdirect mode"
            cat
        }
    } >"$pdir/pingpong.txt"
    cat "$pdir/pingpong.txt"

    # NetPIPE-style plots, log-log. Lines are drawn from per-mode files: gnuplot
    # breaks a line at every undefined point, so rows of the other mode cannot
    # simply be masked out.
    awk -F'\t' 'NR > 1 && $2 == "pingpong" { print $1, $4, $5, $6, $11, $12, $13 }' "$tsv" >"$tmp/pp.dat"
    awk -F'\t' 'NR > 1 && $2 == "stream" { print $1, $4, $5, $6 }' "$tsv" >"$tmp/st.dat"
    xtics=""
    for size in "${sizes[@]}"; do
        if ((size >= 1048576 && size % 1048576 == 0)); then label="$((size / 1048576))M"
        elif ((size >= 1024 && size % 1024 == 0)); then label="$((size / 1024))K"
        else label="$size"; fi
        xtics+="${xtics:+, }\"$label\" $size"
    done
    if command -v gnuplot >/dev/null 2>&1; then
        if ! timeout 60 gnuplot 2>"$tmp/gnuplot.err" <<EOF; then
set datafile missing "n/a"
set terminal pngcairo size 900,600 noenhanced
set logscale xy
set grid
set key bottom right
set xlabel "message size (bytes)"
set xtics ($xtics)
set offsets graph 0.03, graph 0.03, 0, 0

set output "$pdir/latency.png"
set ylabel "one-way latency (us)"
set title "Ping-pong latency, lower is better (mean of each run, median of $repeats run(s)), placement $placement"
plot "$tmp/pp.dat" using 1:2 with linespoints lw 2 title "kernel TCP", \
     "" using 1:3 with linespoints lw 2 title "sdirect", \
     "" using 1:4 with linespoints lw 2 title "fi_pingpong (shm)"

set output "$pdir/bandwidth.png"
set ylabel "MB/s (10^6 B/s)"
set title "Bandwidth, higher is better: stream (solid), ping-pong size/latency (dashed), placement $placement"
plot "$tmp/st.dat" using 1:2 with linespoints lw 2 lc 1 title "kernel TCP, stream", \
     "" using 1:3 with linespoints lw 2 lc 2 title "sdirect, stream", \
     "$tmp/pp.dat" using 1:5 with linespoints lw 1 dt 2 lc 1 title "kernel TCP, ping-pong", \
     "" using 1:6 with linespoints lw 1 dt 2 lc 2 title "sdirect, ping-pong", \
     "" using 1:7 with linespoints lw 1 dt 2 lc 3 title "fi_pingpong (shm), ping-pong"
EOF
            echo "run.sh: gnuplot failed: $(head -c 300 "$tmp/gnuplot.err")" >&2
        else
            echo "plots: $pdir/latency.png $pdir/bandwidth.png" >&2
        fi
    else
        echo "run.sh: gnuplot not installed; no plots" >&2
    fi

}

# sdirect per protocol (current placement, into $pdir).
tune="$build/tools/sdirect-tune"
tune_protocols() {
    # sdirect per protocol: sdirect-tune streams every size by buffered, ring
    # and zcopy (each forced; the library's counters prove it) and keeps the
    # median of BENCH_REPEATS runs; its table is what SDIRECT_PROTOCOLS=auto
    # would read.
    if ((have_sdirect)) && [[ "${BENCH_TUNE:-$(qdef 1 0)}" != 0 && -x "$tune" ]]; then
        if timeout 900 "$build/tools/sdirect-run" "$tune" --out "$pdir/protocols.txt" \
            --repeats "$repeats" >/dev/null 2>"$tmp/tune.err"; then
            awk '!/^#/ { printf "%s", $1; for (i = 3; i <= NF; ++i) { split($i, kv, "="); printf " %s", kv[2] } print "" }' \
                "$pdir/protocols.txt" >"$tmp/proto.dat"
            if command -v gnuplot >/dev/null 2>&1 && timeout 60 gnuplot 2>>"$tmp/tune.err" <<EOF; then
set terminal pngcairo size 900,600 noenhanced
set logscale xy
set grid
set key bottom right
set xlabel "message size (bytes)"
set ylabel "MB/s (10^6 B/s)"
set title "sdirect stream bandwidth per protocol, each forced (median of $repeats run(s)), placement $placement"
set output "$pdir/protocols.png"
plot "$tmp/proto.dat" using 1:2 with linespoints lw 2 title "buffered (inline messages)", \
     "" using 1:3 with linespoints lw 2 title "ring (RMA write into the receive ring)", \
     "" using 1:4 with linespoints lw 2 title "zcopy (read zero-copy)"
EOF
                echo "plot: $pdir/protocols.png" >&2
            fi
            echo
            echo "sdirect per protocol (stream MB/s, median of $repeats; best: what SDIRECT_PROTOCOLS=auto picks):"
            grep -v '^# size' "$pdir/protocols.txt"
        else
            echo "run.sh: sdirect-tune failed: $(head -c 300 "$tmp/tune.err")" >&2
        fi
    fi
}

# Worst case of one placement's runs (every process to its timeout), the
# hog's --timeout.
hog_bound=$((${#sizes[@]} * repeats * 5 * (run_limit + 6) + 960))
started=$SECONDS
for p in "${placements[@]}"; do
    pdir="$out/$p"
    mkdir -p "$pdir"
    placement_use "$p"
    echo
    if [[ "$p" == hog ]] && ! hog_start "$hog_bound"; then
        echo "placement hog not measured: stress-ng could not run" | tee "$pdir/pingpong.txt"
        continue
    fi
    pingpong_table
    tune_protocols
    if ! hog_stop; then
        echo "NOTE: stress-ng ended before these runs did; the last ones ran without it" |
            tee -a "$pdir/pingpong.txt"
    fi
done
echo "results: $out ($((SECONDS - started)) s)" >&2

# NetPIPE's full curve, kernel TCP vs sdirect, then programs as they ship
# (sockperf, redis, PostgreSQL, netperf, nginx, idle connections): each in
# every placement, into the same folder; the summary once at the end.
if [[ "${BENCH_NETPIPE:-$(qdef 1 0)}" != 0 ]]; then
    echo
    BENCH_SUMMARY=0 bash "$bench_dir/netpipe.sh"
fi
if [[ "${BENCH_APPS:-1}" != 0 ]]; then
    echo
    # shellcheck disable=SC2086 # a list of app names, split on purpose
    BENCH_SUMMARY=0 bash "$bench_dir/apps.sh" ${BENCH_APP_LIST:-}
fi
echo
bash "$bench_dir/summary.sh" "$out"
