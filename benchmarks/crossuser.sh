#!/usr/bin/env bash
# Between users, kernel against sdirect: iperf3 (3 s, 128 KiB and 16 KiB
# writes) and sockperf ping-pong (64 B, 3 s) with the server as nobody and
# the client as root, the reverse, and both root (one user, for
# comparison), RUNS times each (default 1 2 3). Every sdirect line says
# the mode each end's stats file reports. Root only; it runs in a mount
# namespace of its own with a private /dev/shm (the registries it opens to
# other users are not the host's).
#   benchmarks/crossuser.sh OUTDIR [BUILD]     (BUILD: default ./build)
# Under load: stress-ng --cpu 2 beside it (bounded with timeout). PAIRS:
# "SERVER CLIENT,..." to run fewer pairs (e.g. PAIRS="root root"); TOOLS:
# some of iperf128 iperf16 pp.
if [[ "${SDIRECT_BENCH_PRIVATE_SHM:-0}" != 1 ]]; then
    SDIRECT_BENCH_PRIVATE_SHM=1 exec unshare --mount --propagation private bash "$0" "$@"
fi
mount -t tmpfs -o mode=1777,size=512m sdirect-bench /dev/shm || exit 1
out="$1"; mkdir -p "$out"; chmod 0777 "$out"
run="$(readlink -f "${2:-build}")/tools/sdirect-run"
nob=(setpriv --reuid=$(id -u nobody) --regid=$(id -g nobody) --clear-groups)
port=$((40000 + ($$ % 1000) * 20))  # apart from an earlier run's lingering ports
# Waits (up to 5 s) for a listener on 127.0.0.1:PORT.
listening() {
    local i
    for ((i = 0; i < 100; i++)); do
        ss -Hltn "sport = :$1" | grep -q . && return 0
        sleep 0.05
    done
    return 1
}
# one MODE(kernel|sdirect) SRV(root|nobody) CLI(root|nobody) TOOL(iperf128|iperf16|pp) TAG
one() {
    local mode=$1 srv=$2 cli=$3 tool=$4 tag=$5 spre=() cpre=() w=() sp cp
    port=$((port + 1))
    [[ $srv == nobody ]] && spre=("${nob[@]}")
    [[ $cli == nobody ]] && cpre=("${nob[@]}")
    [[ $mode == sdirect ]] && w=("$run")
    local st="$out/$tag.srv.stats" ct="$out/$tag.cli.stats"
    rm -f "$st" "$ct"
    if [[ $tool == pp ]]; then
        SDIRECT_STATS_FILE=$st timeout 20 "${spre[@]}" "${w[@]}" sockperf sr --tcp -i 127.0.0.1 -p $port >/dev/null 2>&1 &
        sp=$!; listening $port
        SDIRECT_STATS_FILE=$ct timeout 15 "${cpre[@]}" "${w[@]}" sockperf pp --tcp -i 127.0.0.1 -p $port -t 3 -m 64 --mps 2000000 >"$out/$tag.out" 2>&1
        kill $sp 2>/dev/null; wait $sp 2>/dev/null
        res=$(grep -o 'avg-latency=[0-9.]*' "$out/$tag.out" | head -1)
    else
        local len=128K; [[ $tool == iperf16 ]] && len=16K
        SDIRECT_STATS_FILE=$st timeout 20 "${spre[@]}" "${w[@]}" iperf3 -s -1 -p $port >/dev/null 2>&1 &
        sp=$!; listening $port
        SDIRECT_STATS_FILE=$ct timeout 15 "${cpre[@]}" "${w[@]}" iperf3 -c 127.0.0.1 -p $port -t 3 -l $len -J >"$out/$tag.out" 2>&1
        wait $sp 2>/dev/null
        res=$(python3 -c "import json,sys; d=json.load(open('$out/$tag.out')); print('%.1f Gbit/s' % (d['end']['sum_received']['bits_per_second']/1e9))" 2>/dev/null)
    fi
    sleep 0.3
    local modes=""
    [[ $mode == sdirect ]] && modes=" srv:$(grep -o 'mode=[a-z]*' "$st" 2>/dev/null | sort | uniq -c | tr -s ' ' | tr '\n' ',') cli:$(grep -o 'mode=[a-z]*' "$ct" 2>/dev/null | sort | uniq -c | tr -s ' ' | tr '\n' ',')"
    echo "$tag $mode srv=$srv cli=$cli $tool: $res$modes"
}
for r in ${RUNS:-1 2 3}; do
  for tool in ${TOOLS:-iperf128 iperf16 pp}; do
    IFS=, read -ra pairs <<<"${PAIRS:-nobody root,root nobody,root root}"
    for pair in "${pairs[@]}"; do
      set -- $pair
      for mode in kernel sdirect; do one $mode $1 $2 $tool "r$r-$tool-$1-$2-$mode"; done
    done
  done
done
