#!/usr/bin/env bash
# Setup, build, then kernel TCP vs sdirect (and raw libfabric, fi_pingpong)
# measured the way programs run: unpinned (the scheduler decides) and on a
# busy host (stress-ng beside every run). Every table goes to a new folder
# benchmarks/results/<UTC time>/ (results/latest links to it), its
# summary.txt last on stdout; the committed figures are not touched
# (benchmarks/publish.sh does that).
#
#   scripts/demo.sh          the headline, a few minutes: 64-byte and
#                            1 MiB ping-pong and stream, redis-benchmark,
#                            pgbench (also against PostgreSQL run as
#                            postgres, client root) and ab against nginx
#                            with 'user www-data;' (client root); quick
#                            settings, one repeat, unpinned and hog
#   scripts/demo.sh --quick  every row of the quick run, in all three
#                            placements (split pinning too)
#   scripts/demo.sh --full   the full run (benchmarks/run.sh: five
#                            repeats, every size, NetPIPE, sdirect-tune)
#
# Environment as for benchmarks/run.sh; what is set here is only a default.
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

mode="${1:-headline}"
case "$mode" in
    headline | --quick | --full) ;;
    *) echo "usage: scripts/demo.sh [--quick | --full]" >&2; exit 2 ;;
esac

bash scripts/setup.sh
bash scripts/build.sh
case "$mode" in
    headline)
        BENCH_QUICK="${BENCH_QUICK:-1}" \
            BENCH_PLACEMENTS="${BENCH_PLACEMENTS:-unpinned hog}" \
            BENCH_SIZES="${BENCH_SIZES:-64 1048576}" \
            BENCH_APP_LIST="${BENCH_APP_LIST:-redis pg pg-users nginx-users}" \
            bash benchmarks/run.sh
        ;;
    --quick) BENCH_QUICK="${BENCH_QUICK:-1}" bash benchmarks/run.sh ;;
    --full) bash benchmarks/run.sh ;;
esac
