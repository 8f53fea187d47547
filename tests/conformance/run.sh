#!/usr/bin/env bash
# Runs the conformance catalogue plainly and with the library preloaded,
# then compares: any difference not named in the known list fails, so does
# a listed case that no longer differs, and so does a preloaded case whose
# connections did not go direct.
# usage: run.sh CONFORM LIBSDIRECT KNOWN_LIST
set -u
conform=$1 lib=$2 known=$3
tmp=$(mktemp -d /tmp/conform.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -m 700 "$tmp/registry"

plain_env=()
for v in $(env | grep -o '^\(SDIRECT_[A-Z_]*\|LD_PRELOAD\)='); do plain_env+=(-u "${v%=}"); done

env "${plain_env[@]}" "$conform" > "$tmp/kernel.out" 2> "$tmp/kernel.err"
echo "plain run: exit $?, $(wc -l < "$tmp/kernel.out") cases"
env "${plain_env[@]}" LD_PRELOAD="$lib" SDIRECT_REGISTRY="$tmp/registry" \
    SDIRECT_ENGINE_WAIT_MS=30000 SDIRECT_UPGRADE_AFTER_MS=0 SDIRECT_STATS_FILE="$tmp/lib.stats" \
    "$conform" --modes "$tmp/lib.modes" > "$tmp/lib.out" 2> "$tmp/lib.err"
echo "preloaded run: exit $?, $(wc -l < "$tmp/lib.out") cases"
for f in kernel lib; do
    if [[ -s $tmp/$f.err ]]; then echo "--- $f stderr:"; head -50 "$tmp/$f.err"; fi
done
"$conform" --compare "$tmp/kernel.out" "$tmp/lib.out" "$known" "$tmp/lib.modes"
rc=$?
if [[ -n ${SDIRECT_CONFORM_KEEP:-} ]]; then
    mkdir -p "$SDIRECT_CONFORM_KEEP" && cp "$tmp"/*.out "$tmp"/*.modes "$SDIRECT_CONFORM_KEEP"/
fi
exit $rc
