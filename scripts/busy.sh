#!/usr/bin/env bash
# The behaviour suites on a busy host: each round runs them while
# `stress-ng --cpu K` keeps every CPU busy, so that the library's threads
# (its control thread above all) are descheduled at any step, as on a
# loaded server. Races that a quiet host almost never shows come up here
# (a poll answered from the kernel while our control thread had yet to
# read an upgrade's commit failed 1 run in 4 of its case this way, and
# only now and then in CI). Not part of CI: a round takes ~10 minutes.
#
# usage: busy.sh [--rounds N] [--hogs K] [--suites "S1 S2 ..."] [--filter F]
#   --rounds   rounds (default 1)
#   --hogs     stress-ng CPU workers (default: the number of CPUs)
#   --suites   meson test suites (default: behaviour-direct behaviour-mixed
#              behaviour-provider)
#   --filter   run only the meson tests whose names contain F
# Environment: SDIRECT_BUILD_DIR (default build), SDIRECT_SKIP_SETUP=1.
# Writes each round's meson log to a run folder (busy-runs/DATE under the
# build directory); the last line is "N passed, N failed, N skipped" over
# all rounds, the status non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." || exit 1
build="${SDIRECT_BUILD_DIR:-build}"
me=busy.sh

rounds=1
hogs="$(nproc)"
suites="behaviour-direct behaviour-mixed behaviour-provider"
filter=""
while (($#)); do
    case "$1" in
        --rounds) rounds="${2:?}"; shift 2 ;;
        --hogs) hogs="${2:?}"; shift 2 ;;
        --suites) suites="${2:?}"; shift 2 ;;
        --filter) filter="${2:?}"; shift 2 ;;
        *) echo "usage: $me [--rounds N] [--hogs K] [--suites \"S1 S2\"] [--filter F]" >&2; exit 2 ;;
    esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ && "$hogs" =~ ^[1-9][0-9]*$ ]] || {
    echo "$me: --rounds and --hogs take a positive number" >&2
    exit 2
}

if [[ "${SDIRECT_SKIP_SETUP:-}" != 1 ]]; then
    bash scripts/setup.sh || { echo "$me: scripts/setup.sh failed" >&2; exit 1; }
fi
bash scripts/build.sh || { echo "$me: scripts/build.sh failed" >&2; exit 1; }
command -v stress-ng >/dev/null || { echo "$me: stress-ng is not installed" >&2; exit 1; }

out="$build/busy-runs/$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$out"

# The tests to run: every test of the suites, or those whose name has F.
mapfile -t tests < <(meson test -C "$build" --list $(printf -- '--suite %s ' $suites) 2>/dev/null |
    sed -n 's/^.* \/ //p' | { if [[ -n "$filter" ]]; then grep -F -- "$filter"; else cat; fi; })
if ((${#tests[@]} == 0)); then
    echo "$me: no test of suites '$suites'${filter:+ matching '$filter'}" >&2
    exit 2
fi

hog=""
stop_hog() {
    if [[ -n "$hog" ]]; then
        kill "$hog" 2>/dev/null
        wait "$hog" 2>/dev/null
        hog=""
    fi
}
trap stop_hog EXIT

passed=0
failed=0
skipped=0
count() { awk -F: -v key="$1" '$1 == key { n = $2 + 0 } END { print n + 0 }' "$2"; }
for ((r = 1; r <= rounds; ++r)); do
    log="$out/round-$r.log"
    # Bounded: the hog ends by itself even if this script is killed.
    stress-ng --cpu "$hogs" --timeout 3600 >/dev/null 2>&1 &
    hog=$!
    timeout 3000 meson test -C "$build" --no-rebuild --print-errorlogs --num-processes 1 \
        "${tests[@]}" >"$log" 2>&1
    rc=$?
    stop_hog
    ok=$(($(count Ok "$log") + $(count "Expected Fail" "$log")))
    bad=$(($(count Fail "$log") + $(count "Unexpected Pass" "$log") + $(count Timeout "$log")))
    skip=$(count Skipped "$log")
    if ((rc != 0 && bad == 0)); then bad=1; fi
    echo "round $r: $ok passed, $bad failed, $skip skipped ($log)"
    grep -E '^ *[0-9]+/[0-9]+ .* (FAIL|TIMEOUT) ' "$log" | sed 's/^/  /'
    passed=$((passed + ok))
    failed=$((failed + bad))
    skipped=$((skipped + skip))
done
echo "$passed passed, $failed failed, $skipped skipped"
((failed == 0))
