#!/usr/bin/env bash
# Publishes one benchmark run: copies its files into benchmarks/results/,
# the figures that are committed and that README.md quotes. Nothing else
# writes there; a run writes only its own folder benchmarks/results/<UTC
# time>/.
#
# Usage: benchmarks/publish.sh [--placement P] [--partial] [RUN_FOLDER]
#   RUN_FOLDER    default benchmarks/results/latest (the newest run)
#   --placement   whose tables become the main ones (default split): its
#                 pingpong.{tsv,txt} become latest.{tsv,txt}, and its
#                 latency.png, bandwidth.png, protocols.{txt,png},
#                 netpipe.{tsv,txt,png}, apps.{tsv,txt} are copied as they are
#   --partial     publish even if the run lacks some of those files (the old
#                 ones stay, from another run: README.md must say so)
# The run's summary.{txt,tsv} (every placement) and each placement's
# tables (pingpong.txt, apps.txt, netpipe.txt) go to
# benchmarks/results/placements/<placement>/ as well.
#
# It copies files only: the tables quoted in README.md's "Figures" are
# then pasted from benchmarks/results/*.txt by hand, and the commit says
# which run (the summary's first line names it) and on what machine.
set -euo pipefail

bench_dir="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)"
results="$bench_dir/results"
placement="split"
partial=0
src=""
while (($#)); do
    case "$1" in
        --placement) placement="${2:?--placement needs a name}"; shift 2 ;;
        --placement=*) placement="${1#*=}"; shift ;;
        --partial) partial=1; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "publish.sh: unknown option $1" >&2; exit 2 ;;
        *) src="$1"; shift ;;
    esac
done
src="${src:-$results/latest}"
if [[ ! -d "$src/$placement" ]]; then
    echo "publish.sh: $src/$placement is not a folder (a run's folder holds one per placement)" >&2
    exit 1
fi
src="$(cd "$src" && pwd -P)"
if [[ "$src" == "$(cd "$results" && pwd -P)" ]]; then
    echo "publish.sh: $src is the published folder itself; name a run's folder" >&2
    exit 1
fi

# from-name:to-name, from the placement's folder into results/.
files=(pingpong.tsv:latest.tsv pingpong.txt:latest.txt latency.png:latency.png
    bandwidth.png:bandwidth.png protocols.txt:protocols.txt protocols.png:protocols.png
    netpipe.tsv:netpipe.tsv netpipe.txt:netpipe.txt netpipe.png:netpipe.png
    apps.tsv:apps.tsv apps.txt:apps.txt)
missing=()
for f in "${files[@]}"; do
    [[ -f "$src/$placement/${f%%:*}" ]] || missing+=("${f%%:*}")
done
[[ -f "$src/summary.txt" ]] || missing+=(../summary.txt)
if ((${#missing[@]})) && ((!partial)); then
    echo "publish.sh: $src/$placement lacks ${missing[*]}; a full run (benchmarks/run.sh" \
        "without BENCH_QUICK) writes them all; --partial publishes what there is" >&2
    exit 1
fi

for f in "${files[@]}"; do
    from="$src/$placement/${f%%:*}"
    [[ -f "$from" ]] || continue
    cp "$from" "$results/${f#*:}"
    echo "published: ${f#*:} (from $placement/${f%%:*})"
done
for f in summary.txt summary.tsv; do
    [[ -f "$src/$f" ]] && cp "$src/$f" "$results/$f" && echo "published: $f"
done
for d in "$src"/*/; do
    p="$(basename "$d")"
    mkdir -p "$results/placements/$p"
    for f in pingpong.txt apps.txt netpipe.txt; do
        [[ -f "$d/$f" ]] && cp "$d/$f" "$results/placements/$p/$f" &&
            echo "published: placements/$p/$f"
    done
done
((${#missing[@]})) && echo "publish.sh: not in this run, left as they were: ${missing[*]}" >&2
echo "Now paste the tables README.md quotes (\"Figures\") from benchmarks/results/*.txt" \
    "and commit, naming the run ($(basename "$src")) and the machine."
