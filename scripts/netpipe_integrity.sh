#!/usr/bin/env bash
# NetPIPE integrity mode (NPtcp -i, 5 B up to 1 MiB, every byte checked)
# through the library, on 127.0.0.1, in three pairings:
#   both ends preloaded             -> bytes intact, connection direct
#   preloaded server, plain client  -> bytes intact, server stays kernel
#   plain server, preloaded client  -> bytes intact, client stays kernel
# The mode comes from SDIRECT_STATS_FILE (written by each preloaded end at
# exit). Prints one PASS/FAIL line per pairing; exit status 1 on any FAIL.
#
# Environment: SDIRECT_BUILD_DIR (default build), SDIRECT_NP_PORT (the
# first port tried, default 47080; a port some socket still uses is
# skipped), SDIRECT_NP_TIMEOUT (seconds per run, 120).
set -uo pipefail

root="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
build="${SDIRECT_BUILD_DIR:-build}"
[[ "$build" == /* ]] || build="$root/$build"
run="$build/tools/sdirect-run"
port_base="${SDIRECT_NP_PORT:-47080}"
limit="${SDIRECT_NP_TIMEOUT:-120}"
upper=1048576
# NPtcp steps sizes by 1.5x with +-3 B perturbations and stops below -u;
# reaching 512 KiB shows the large sizes ran.
min_reached=524288

tmp="$(mktemp -d /tmp/sdirect-netpipe.XXXXXX)"
srv_pid=""
cleanup() {
    if [[ -n "$srv_pid" ]] && kill -0 "$srv_pid" 2>/dev/null; then
        kill "$srv_pid" 2>/dev/null
        wait "$srv_pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

configs=("both-preloaded" "preloaded-server" "preloaded-client")

if ! command -v NPtcp >/dev/null 2>&1; then
    for c in "${configs[@]}"; do echo "FAIL netpipe $c: NPtcp not installed (package netpipe-tcp)"; done
    exit 1
fi
if [[ ! -x "$run" ]] || ! why="$(timeout 20 "$run" true 2>&1)"; then
    for c in "${configs[@]}"; do
        echo "FAIL netpipe $c: cannot preload the library (${why:-$run missing}); run scripts/build.sh"
    done
    exit 1
fi

# wait_listen, port_in_use and free_port_from.
# shellcheck source=scripts/ports.sh
source "$root/scripts/ports.sh"

# Modes of the connections to or from port $2 in stats file $1, one per line.
# The listener itself (peer port 0) is not a connection.
modes_for_port() {
    [[ -f "$1" ]] || return 0
    awk -v port="$2" '
        {
            lp = ""; pp = ""; mode = ""
            for (i = 1; i <= NF; i++) {
                if ($i ~ /^local=/) { lp = $i; sub(/.*:/, "", lp) }
                else if ($i ~ /^peer=/) { pp = $i; sub(/.*:/, "", pp) }
                else if ($i ~ /^mode=/) { mode = substr($i, 6) }
            }
            if ((lp == port || pp == port) && pp != "0" && mode != "") print mode
        }' "$1"
}

# Checks that every connection of the preloaded end $1 (server|client) is in
# mode $3; stats file $2. Prints a short verdict; status 0 if good.
check_mode() {
    local who="$1" file="$2" want="$3" port="$4" modes
    modes="$(modes_for_port "$file" "$port" | sort | uniq -c | awk '{printf "%s%s x%s", (NR > 1 ? "," : ""), $2, $1}')"
    if [[ -z "$modes" ]]; then
        echo "$who: no connection on port $port in SDIRECT_STATS_FILE"
        return 1
    fi
    if modes_for_port "$file" "$port" | grep -vqx "$want"; then
        echo "$who: mode $modes, expected $want"
        return 1
    fi
    echo "$who=$want"
    return 0
}

# Checks NPtcp's own output: every size reported "Integrity check passed",
# nothing failed, and the large sizes were reached.
check_output() {
    local cli="$1" srv="$2" lines passed largest
    if grep -Eiq 'fail|error|cannot' "$cli" "$srv"; then
        grep -Eih 'fail|error|cannot' "$cli" "$srv" | head -n 1
        return 1
    fi
    lines="$(grep -c -- '-->' "$cli")"
    passed="$(grep -c -- '--> *Integrity check passed' "$cli")"
    largest="$(awk '/-->/ { if ($2 + 0 > max) max = $2 + 0 } END { print max + 0 }' "$cli")"
    if ((lines == 0 || passed != lines)); then
        echo "only $passed of $lines sizes passed"
        return 1
    fi
    if ((largest < min_reached)); then
        echo "stopped at $largest B"
        return 1
    fi
    echo "$passed sizes up to $largest B intact"
    return 0
}

fails=0
run_config() {
    local name="$1" srv_pre="$2" cli_pre="$3" want="$4" port="$5"
    local dir="$tmp/$name" srv_rc cli_rc i verdict ok=1 notes=()
    mkdir -p "$dir"
    local srv_cmd=(NPtcp -i -u "$upper" -P "$port" -o "$dir/srv.np")
    local cli_cmd=(NPtcp -h 127.0.0.1 -i -u "$upper" -P "$port" -o "$dir/cli.np")
    ((srv_pre)) && srv_cmd=(env SDIRECT_STATS_FILE="$dir/srv.stats" "$run" "${srv_cmd[@]}")
    ((cli_pre)) && cli_cmd=(env SDIRECT_STATS_FILE="$dir/cli.stats" "$run" "${cli_cmd[@]}")

    (cd "$dir" && exec timeout "$limit" "${srv_cmd[@]}") >"$dir/srv.out" 2>&1 &
    srv_pid=$!
    if ! wait_listen "$port" "$srv_pid"; then
        echo "FAIL netpipe $name: server did not listen on port $port ($(tail -n 2 "$dir/srv.out" | tr '\n' ' ' | tail -c 300))"
        fails=$((fails + 1))
        kill "$srv_pid" 2>/dev/null
        wait "$srv_pid" 2>/dev/null
        srv_pid=""
        return
    fi
    (cd "$dir" && exec timeout "$limit" "${cli_cmd[@]}") >"$dir/cli.out" 2>&1
    cli_rc=$?
    # The server ends by itself right after the client; give it 10 s.
    for ((i = 0; i < 100; i++)); do
        kill -0 "$srv_pid" 2>/dev/null || break
        sleep 0.1
    done
    kill "$srv_pid" 2>/dev/null
    wait "$srv_pid"
    srv_rc=$?
    srv_pid=""

    if ((cli_rc != 0 || srv_rc != 0)); then
        ok=0
        notes+=("exit status client $cli_rc server $srv_rc")
    fi
    if verdict="$(check_output "$dir/cli.out" "$dir/srv.out")"; then
        notes+=("$verdict")
    else
        ok=0
        notes+=("integrity: $verdict")
    fi
    if ((srv_pre)); then
        verdict="$(check_mode server "$dir/srv.stats" "$want" "$port")" || ok=0
        notes+=("$verdict")
    fi
    if ((cli_pre)); then
        verdict="$(check_mode client "$dir/cli.stats" "$want" "$port")" || ok=0
        notes+=("$verdict")
    fi
    local text="${notes[0]}"
    for ((i = 1; i < ${#notes[@]}; i++)); do text+="; ${notes[i]}"; done
    if ((ok)); then
        echo "PASS netpipe $name: $text"
    else
        echo "FAIL netpipe $name: $text"
        fails=$((fails + 1))
    fi
}

# NPtcp's server cannot bind a port that an earlier test's connection still
# holds (in TIME-WAIT, or as an ephemeral port), and these ports lie in the
# ephemeral range: each pairing takes the next free one, at most 50 further.
cd "$tmp" || exit 1
port="$(free_port_from "$port_base" 50)"
run_config both-preloaded 1 1 direct "$port"
port="$(free_port_from "$((port + 1))" 50)"
run_config preloaded-server 1 0 kernel "$port"
port="$(free_port_from "$((port + 1))" 50)"
run_config preloaded-client 0 1 kernel "$port"
((fails == 0))
