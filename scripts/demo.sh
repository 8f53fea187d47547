#!/usr/bin/env bash
# Setup, build, then one benchmark run: kernel TCP vs sdirect vs raw
# libfabric (fi_pingpong). benchmarks/run.sh prints the table; it is also
# kept in benchmarks/results/ with the TSV and the plots.
set -euo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."

bash scripts/setup.sh
bash scripts/build.sh
bash benchmarks/run.sh
