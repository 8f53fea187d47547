#!/usr/bin/env bash
# Sanitizer builds: ASan+UBSan in build-asan, TSan in build-tsan, each
# running the unit tests and the behaviour suite in the direct configuration
# (both ends preloaded with the sanitized library). Exit status non-zero if
# any test fails or a sanitizer reports.
#
# Skipped, visibly:
#   bad-input-direct under both: the peer program, built with the sanitizer,
#     passes deliberately bad pointers, and the sanitizer's own interceptors
#     fault on them before the library is reached;
#   many-direct under TSan: too slow (hundreds of connections and processes).
#
# Environment: SDIRECT_SANITIZERS (default "asan tsan").
set -uo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." || exit 1

rc=0
for kind in ${SDIRECT_SANITIZERS:-asan tsan}; do
    dir="build-$kind"
    case "$kind" in
    asan) opts=(-Db_sanitize=address,undefined -Db_lundef=false) ;;
    tsan) opts=(-Db_sanitize=thread -Db_lundef=false) ;;
    *) echo "sanitize: unknown sanitizer $kind" >&2; exit 2 ;;
    esac
    if [[ -f "$dir/meson-private/coredata.dat" ]]; then
        meson setup --reconfigure "$dir" --buildtype=debugoptimized "${opts[@]}" >/dev/null || { rc=1; continue; }
    else
        meson setup "$dir" --buildtype=debugoptimized "${opts[@]}" >/dev/null || { rc=1; continue; }
    fi
    ninja -C "$dir" >/dev/null || { echo "sanitize: $kind build failed"; rc=1; continue; }
    # Reports fail the test (non-zero exit) instead of scrolling by.
    export ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:exitcode=86"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=86"
    # die_after_fork=0: children of threaded parents (fork tests) start
    # threads of their own, which TSan otherwise refuses.
    export TSAN_OPTIONS="halt_on_error=1:exitcode=86:report_signal_unsafe=0:die_after_fork=0"
    tests=()
    while read -r name; do
        [[ "$name" == *-direct || "$name" == unit ]] || continue
        if [[ "$name" == bad-input-direct ]]; then
            echo "SKIP $kind $name (the sanitizer's interceptors fault on the test's bad pointers)"
            continue
        fi
        if [[ "$kind" == tsan && "$name" == many-direct ]]; then
            echo "SKIP $kind $name (too slow under TSan)"
            continue
        fi
        tests+=("$name")
    done < <(meson test -C "$dir" --list 2>/dev/null | sed 's/^.* \/ //')
    echo "sanitize: $kind: ${#tests[@]} tests"
    if meson test -C "$dir" --num-processes 1 --timeout-multiplier 4 --print-errorlogs "${tests[@]}"; then
        echo "PASS sanitize $kind"
    else
        echo "FAIL sanitize $kind"
        rc=1
    fi
done
exit $rc
