#!/usr/bin/env bash
# Setup, build, then a quick benchmark run (BENCH_QUICK=1): kernel TCP vs
# sdirect (and raw libfabric, fi_pingpong) in each placement of
# BENCH_PLACEMENTS (split, unpinned, hog), with one repeat and short runs
# (benchmarks/run.sh and apps.sh list what the quick run shortens). The
# tables go to a new folder benchmarks/results/<UTC time>/ (results/latest
# links to it), its summary.txt last on stdout; the committed figures are
# not touched (benchmarks/publish.sh does that). The full run:
# `bash benchmarks/run.sh`.
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

bash scripts/setup.sh
bash scripts/build.sh
BENCH_QUICK="${BENCH_QUICK:-1}" bash benchmarks/run.sh
