#!/usr/bin/env bash
# The soak: checksummed traffic between preloaded processes through random
# call families and sizes, forks (the child carrying on, or leaving the
# socket alone, with or without close_range), execs, SIGSTOP/SIGCONT,
# SIGKILL of one side, setuid (as root), interval-timer signal storms, and
# one-shot client processes (some killed). Every byte is checked at its
# stream offset, so a lost, duplicated or injected byte is an error; a side
# whose peer was killed must end with EOF or a reset. Every process has a
# bound; one still running at it is killed and counted as a hang.
#
# usage: soak.sh [--short] [--bytes N] [--seconds T] [--procs P]
#                [--clients K] [--actions LIST] [--seed S]
#   defaults: 10 GB, 3600 s, 2 sessions at a time, 50 clients, all actions
#   --short:  200 MB, 60 s, 20 clients, every action (the meson test
#             soak-short). The fork hand-off was left out while about one
#             run in 35 failed with EIO or hung: an upgrade still under
#             way when a side exec'd, forked or dropped its privileges
#             ended direct behind the hold, so the peer wrote into a
#             process that had exec'd (EFAULT: EIO) or waited for it, and
#             a child whose parent was killed between its fork and its
#             close got EIO instead of the reset. With both fixed, 240
#             consecutive runs passed, SDIRECT_SOAK_LOG=error: seeds
#             1000-1089, 3000-3079 and 4000-4069 (the last after the merge
#             of the exec hand-over): 1074 sessions, 280 with a side
#             killed, 7300 forks (idle and hand-off), 1246 execs, 0 errors,
#             0 hangs.
# Environment: SDIRECT_SOAK_WORKER, SDIRECT_SOAK_LIB (default: build/),
# SDIRECT_SOAK_PLAIN=1 runs without the library (checks the soak itself),
# SDIRECT_SOAK_LOG=LEVEL sets the library's log level in every process.
# SDIRECT_SOAK_UPGRADE_AFTER_MS the upgrade policy (default 0: at once).
# Prints each session's line, a summary, and the modes the library's
# statistics saw; exit 1 on any error or hang.
set -uo pipefail
root="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
worker="${SDIRECT_SOAK_WORKER:-$root/build/tests/soak/soak-worker}"
lib="${SDIRECT_SOAK_LIB:-$root/build/intercept/libsdirect.so}"

bytes=10000000000 seconds=3600 procs=2 clients=50 actions=all seed=$(date +%s)
while (($#)); do
    case $1 in
        --short) bytes=200000000 seconds=60 clients=20 actions=all; shift ;;
        --bytes) bytes=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --procs) procs=$2; shift 2 ;;
        --clients) clients=$2; shift 2 ;;
        --actions) actions=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        *) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
for f in "$worker" "$lib"; do
    [[ -e $f ]] || { echo "soak.sh: $f missing (build first: bash scripts/build.sh)" >&2; exit 2; }
done

tmp=$(mktemp -d /tmp/sdirect-soak.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# The registry must be reachable by a side that dropped to nobody.
mkdir -m 700 "$tmp/registry"
stats="$tmp/stats"

env_args=()
for v in $(env | grep -o '^\(SDIRECT_[A-Z_]*\|LD_PRELOAD\)='); do env_args+=(-u "${v%=}"); done
if [[ -z ${SDIRECT_SOAK_PLAIN:-} ]]; then
    # Sessions last under a second: they upgrade at once, so that their
    # bytes cross the fabric (by default they would end before earning
    # their upgrade). SDIRECT_SOAK_UPGRADE_AFTER_MS sets the policy.
    env_args+=(LD_PRELOAD="$lib" SDIRECT_REGISTRY="$tmp/registry" SDIRECT_STATS_FILE="$stats"
               SDIRECT_UPGRADE_AFTER_MS="${SDIRECT_SOAK_UPGRADE_AFTER_MS:-0}")
    # The library's log lines, mixed into the output (e.g. error).
    [[ -n ${SDIRECT_SOAK_LOG:-} ]] && env_args+=(SDIRECT_LOG="$SDIRECT_SOAK_LOG")
fi
# The worker bounds every process itself; this is the last resort.
timeout --signal=KILL $((${seconds%.*} + 240)) \
    env "${env_args[@]}" "$worker" soak --bytes "$bytes" --seconds "$seconds" --procs "$procs" \
    --clients "$clients" --actions "$actions" --seed "$seed"
rc=$?
if [[ -s $stats ]]; then
    echo "modes seen (connections, from the statistics of processes that ended normally):"
    grep -o 'mode=[a-z]* reason=[a-z_]*' "$stats" | sort | uniq -c | sed 's/^/  /'
elif [[ -z ${SDIRECT_SOAK_PLAIN:-} ]]; then
    echo "modes seen: no statistics written"
fi
((rc == 0)) && echo "soak: passed" || echo "soak: FAILED (exit $rc, seed $seed)"
exit $rc
