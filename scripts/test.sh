#!/usr/bin/env bash
# Everything: setup, build, the meson test suites, the NetPIPE integrity
# pairings. The last line is always "N passed, N failed, N skipped"; the exit
# status is non-zero if anything failed.
#
# Environment: SDIRECT_BUILD_DIR (default build), SDIRECT_SKIP_SETUP=1,
# SDIRECT_TEST_TIMEOUT (seconds for the whole meson test run, default 3600).
set -uo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." || exit 1
build="${SDIRECT_BUILD_DIR:-build}"

passed=0
failed=0
skipped=0
finish() {
    echo "$passed passed, $failed failed, $skipped skipped"
    ((failed == 0))
    exit
}

if ! bash scripts/setup.sh; then
    echo "test: scripts/setup.sh failed"
    failed=$((failed + 1))
    finish
fi
if ! bash scripts/build.sh; then
    echo "test: scripts/build.sh failed"
    failed=$((failed + 1))
    finish
fi

log="$(mktemp /tmp/sdirect-test.XXXXXX)"
trap 'rm -f "$log"' EXIT

# meson's closing summary has "Ok:", "Expected Fail:", "Fail:",
# "Unexpected Pass:", "Skipped:" and "Timeout:" lines.
timeout "${SDIRECT_TEST_TIMEOUT:-3600}" \
    meson test -C "$build" --print-errorlogs --num-processes 1 2>&1 | tee "$log"
meson_rc=${PIPESTATUS[0]}
count() { awk -F: -v key="$1" '$1 == key { n = $2 + 0 } END { print n + 0 }' "$log"; }
m_ok=$(($(count "Ok") + $(count "Expected Fail")))
m_fail=$(($(count "Fail") + $(count "Unexpected Pass") + $(count "Timeout")))
m_skip=$(count "Skipped")
if ((meson_rc != 0 && m_fail == 0)); then
    echo "test: meson test exited with status $meson_rc"
    m_fail=1
fi
passed=$((passed + m_ok))
failed=$((failed + m_fail))
skipped=$((skipped + m_skip))

bash scripts/netpipe_integrity.sh 2>&1 | tee "$log"
np_rc=${PIPESTATUS[0]}
n_pass=$(grep -c '^PASS' "$log")
n_fail=$(grep -c '^FAIL' "$log")
n_skip=$(grep -c '^SKIP' "$log")
if ((np_rc != 0 && n_fail == 0)); then
    echo "test: scripts/netpipe_integrity.sh exited with status $np_rc"
    n_fail=1
fi
passed=$((passed + n_pass))
failed=$((failed + n_fail))
skipped=$((skipped + n_skip))

finish
