#!/usr/bin/env bash
# The summary of one benchmark run: for every placement measured, every
# row's ratio sdirect vs kernel (above 1: sdirect better; kernel/sdirect for
# times, sdirect/kernel for rates), its target and whether it is met, and a
# list of the rows where sdirect misses its target or is slower than the
# kernel, with the connection modes the library recorded; then the rows
# that could not be measured there (n/a, e.g. the rows of services under
# their own users when not root), with the reason, never counted as met.
#
# Usage: benchmarks/summary.sh [RUN_FOLDER]   (default benchmarks/results/latest)
# Reads each placement's pingpong.tsv, netpipe.tsv and apps.tsv; writes
# RUN_FOLDER/summary.txt and summary.tsv and prints the text. run.sh,
# netpipe.sh and apps.sh call it at their end.
set -uo pipefail

bench_dir="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)"
dir="${1:-$bench_dir/results/latest}"
if [[ ! -d "$dir" ]]; then
    echo "summary.sh: $dir is not a folder" >&2
    exit 1
fi
dir="$(cd "$dir" && pwd -P)"

# The placements in their usual order, then any other folder.
order=()
for p in split unpinned hog same; do [[ -d "$dir/$p" ]] && order+=("$p"); done
for d in "$dir"/*/; do
    p="$(basename "$d")"
    [[ " ${order[*]} " == *" $p "* ]] || order+=("$p")
done
if ((${#order[@]} == 0)); then
    echo "summary.sh: no placement folder in $dir" >&2
    exit 1
fi

# One line per row and placement: placement, row key, label, target,
# ratio (or value), met, sdirect mode, and the lowest and highest ratio of
# one repeat's pair ("-" where the table has none: sd_pingpong, NetPIPE,
# an apps table of a run before apps.sh wrote them).
rows() {
    local p="$1" d="$dir/$1"
    [[ -f "$d/pingpong.tsv" ]] && awk -F'\t' -v p="$p" '
        NR == 1 || $1 == "" { next }
        {
            label = "sd_pingpong " $1 " B " ($2 == "pingpong" ? "latency" : "stream")
            printf "%s\tpp:%s:%s\t%s\t-\t%s\t-\t%s\t-\n", p, $1, $2, label, $7, $14
        }' "$d/pingpong.tsv"
    [[ -f "$d/netpipe.tsv" ]] && awk -F'\t' -v p="$p" '
        NR == 1 { next }
        $1 == 1 || $1 == 64 || $1 == 4096 || $1 == 65536 || $1 == 1048576 {
            printf "%s\tnp:%s\tNetPIPE ping-pong %s B\t-\t%s\t-\t-\t-\n", p, $1, $1, $6
        }' "$d/netpipe.tsv"
    [[ -f "$d/apps.tsv" ]] && awk -F'\t' -v p="$p" '
        NR == 1 { next }
        {
            v = $6
            if (v == "-") v = ($5 == "n/a" ? "n/a" : $5 " " $3)  # no ratio: the value
            met = $8
            if (met ~ /^no/) met = "no"
            printf "%s\tapp:%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p, $1, $2, $7, v, met, $9, ($15 == "" ? "-" : $15)
        }' "$d/apps.tsv"
}
{
    printf 'placement\trow\tbenchmark\ttarget\tratio\tmet\tsdirect_mode\tper_repeat\n'
    for p in "${order[@]}"; do rows "$p"; done
} >"$dir/summary.tsv"

{
    echo "sdirect benchmark summary: run $(basename "$dir"), placements ${order[*]}"
    for p in "${order[@]}"; do
        case "$p" in
            split) echo "  split: server on CPU 0, client on CPU 1" ;;
            unpinned) echo "  unpinned: the scheduler places both" ;;
            hog) echo "  hog: unpinned, stress-ng --cpu N running beside the runs" ;;
            same) echo "  same: server and client on CPU 0" ;;
        esac
        for f in pingpong apps netpipe; do
            [[ -f "$dir/$p/$f.txt" ]] && echo "    $f: $(head -n 1 "$dir/$p/$f.txt" | cut -c 1-160)"
        done
    done
    echo "ratio: sdirect vs kernel, above 1.00 sdirect is better (kernel/sdirect for times, sdirect/kernel"
    echo "for rates); a value with a unit where a row has no ratio. ok: target met; MISS: target not met"
    echo "(or, for rows that must run direct, not direct); slower: no target and below 1.00."
    echo
    awk -F'\t' -v placements="${order[*]}" '
        NR == 1 { next }
        {
            key = $2
            if (!(key in label)) { keys[++n] = key; label[key] = $3; target[key] = $4 }
            ratio[key, $1] = $5; met[key, $1] = $6; mode[key, $1] = $7; spread[key, $1] = $8
        }
        function cell(k, p,   r, m) {
            if (!((k, p) in ratio)) return "-"
            r = ratio[k, p]; m = met[k, p]
            if (m == "yes") return r " ok"
            if (m == "no") return r " MISS"
            if (r ~ /^[0-9.]+$/ && r + 0 < 1) return r " slower"
            return r
        }
        END {
            np = split(placements, pl, " ")
            printf "%-44s %-8s", "benchmark", "target"
            for (i = 1; i <= np; i++) printf " %-16s", pl[i]
            printf "\n"
            for (j = 1; j <= n; j++) {
                k = keys[j]
                printf "%-44s %-8s", substr(label[k], 1, 44), target[k]
                for (i = 1; i <= np; i++) printf " %-16s", cell(k, pl[i])
                printf "\n"
            }
            printf "\nWhere sdirect misses its target or is slower than the kernel:\n"
            bad = 0
            for (i = 1; i <= np; i++) {
                p = pl[i]; met_n = 0; tgt_n = 0; slow = 0
                for (j = 1; j <= n; j++) {
                    k = keys[j]
                    if (!((k, p) in ratio)) continue
                    r = ratio[k, p]; m = met[k, p]
                    if (m == "yes" || m == "no") tgt_n++
                    if (m == "yes") met_n++
                    lower = (r ~ /^[0-9.]+$/ && r + 0 < 1)
                    if (lower) slow++
                    if (m == "no" || lower) {
                        bad++
                        printf "  %-9s %-44s %s%s (target %s; sdirect mode %s)\n", p, substr(label[k], 1, 44), r,
                            (spread[k, p] != "" && spread[k, p] != "-" ? " (per repeat " spread[k, p] ")" : ""),
                            target[k], mode[k, p]
                    }
                }
                tot[p] = sprintf("%s: %d of %d targets met, %d rows slower than the kernel", p, met_n, tgt_n, slow)
            }
            if (!bad) printf "  nowhere\n"
            na = 0
            for (i = 1; i <= np; i++) {
                p = pl[i]
                for (j = 1; j <= n; j++) {
                    k = keys[j]
                    if (!((k, p) in mode) || mode[k, p] !~ /^n\/a: /) continue
                    if (!na++) printf "\nNot measured (n/a):\n"
                    printf "  %-9s %-44s %s\n", p, substr(label[k], 1, 44), substr(mode[k, p], 6)
                }
            }
            printf "\n"
            for (i = 1; i <= np; i++) print tot[pl[i]]
        }' "$dir/summary.tsv"
} >"$dir/summary.txt"
cat "$dir/summary.txt"
echo "summary: $dir/summary.txt" >&2
