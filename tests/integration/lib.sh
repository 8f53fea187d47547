# Common part of the integration tests: programs as Debian ships them, run
# unchanged on both ends of 127.0.0.1 connections with libsdirect.so
# preloaded. Sourced by every tests/integration/<program>.sh, which
#   starts its server with it_start and waits for it with it_wait_listen,
#   runs its clients with it_run,
#   records each check with it_ok / it_bad,
#   stops the server with it_stop (by pid, never by name),
#   asserts from the stats files that the connections ran direct
#   (it_expect_direct), or in which mode they ended and why
#   (it_expect_mode), and ends with it_finish.
#
# Every preloaded process writes its connections to $it_tmp/<role>.stats
# (SDIRECT_STATS_FILE) when it exits, so servers are stopped with a signal
# they handle by calling exit(), and stats are read after the process ended.
#
# Environment:
#   SDIRECT_IT_LIB     libsdirect.so (default: <repo>/build/intercept/libsdirect.so)
#   SDIRECT_IT_TOOLS   directory with sdirect-run (default: <repo>/build/tools)
#   SDIRECT_IT_KERNEL  1: nothing preloaded; the same correctness checks, the
#                      mode check is skipped (validates the scripts themselves)
#   SDIRECT_IT_PYTHON  python3 for the test programs (default: /usr/bin/python3,
#                      Debian's, else python3 from PATH)
#   SDIRECT_IT_BUDGET  seconds the whole script may take (default 75); every
#                      wait is bounded by what is left of it
#   SDIRECT_IT_KEEP    1: keep the temporary directory (path printed at the end)
# Every other SDIRECT_* variable reaches the preloaded programs unchanged
# (SDIRECT_UPGRADE_AFTER_MS: 0, upgrades at once, unless set).
#
# Exit status: 0 pass, 1 fail, 77 skip (a program is not installed).

set -uo pipefail

it_name="integration-$(basename "$0" .sh)"
it_dir="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)"
it_root="$(cd "$it_dir/../.." && pwd)"
it_lib="${SDIRECT_IT_LIB:-$it_root/build/intercept/libsdirect.so}"
it_tools="${SDIRECT_IT_TOOLS:-$it_root/build/tools}"
it_kernel="${SDIRECT_IT_KERNEL:-0}"
[[ "$it_kernel" == 1 ]] || it_kernel=0
it_deadline=$((SECONDS + ${SDIRECT_IT_BUDGET:-75}))
# Most scripts assert that every connection ran direct, short ones too:
# those upgrade at once. A script that runs the library's own policy
# (connections earn their upgrade) sets SDIRECT_UPGRADE_AFTER_MS to the
# empty string (the library's default) before it sources this file.
export SDIRECT_UPGRADE_AFTER_MS="${SDIRECT_UPGRADE_AFTER_MS-0}"

if [[ -n "${SDIRECT_IT_PYTHON:-}" ]]; then
    it_py="$SDIRECT_IT_PYTHON"
elif [[ -x /usr/bin/python3 ]]; then
    it_py=/usr/bin/python3
else
    it_py="$(command -v python3 || echo python3)"
fi

it_tmp="$(mktemp -d "/tmp/sdirect-$it_name.XXXXXX")" || exit 1
it_checks=0
it_failures=0
it_servers=()  # pids of servers still running (timeout wrappers)
it_pid=""      # pid of the server it_start started last

if ((it_kernel)); then
    it_label="kernel: nothing preloaded"
else
    it_label="preloaded: $it_lib"
fi

# Runs at exit, however the script ends: stops the servers still running,
# each by its pid, and removes the temporary directory.
it_cleanup() {
    local pid
    for pid in "${it_servers[@]}"; do
        it_stop "$pid" TERM 5 >/dev/null 2>&1
    done
    if [[ "${SDIRECT_IT_KEEP:-0}" == 1 ]]; then
        echo "$it_name: kept $it_tmp"
    else
        rm -rf "$it_tmp"
    fi
}
trap it_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

it_log() { printf '%s: %s\n' "$it_name" "$*"; }

# it_skip REASON: the test cannot run here; exit 77 (meson shows SKIP).
it_skip() {
    printf 'SKIP %s: %s\n' "$it_name" "$*"
    printf 'SKIP %s: %s\n' "$it_name" "$*" >&2
    exit 77
}

# it_need PROGRAM[:PACKAGE]...: skips the test unless every program is on PATH.
it_need() {
    local item prog pkg
    for item in "$@"; do
        prog="${item%%:*}"
        pkg="${item#*:}"
        command -v "$prog" >/dev/null 2>&1 ||
            it_skip "'$prog' is not installed (Debian package $pkg; scripts/setup.sh installs it)"
    done
}

# Checks that the library (or, in kernel mode, nothing) can be preloaded.
# A missing library is a failure, not a skip: the build should have made it.
it_preflight() {
    it_need "$it_py:python3" timeout:coreutils
    it_log "$it_label"
    ((it_kernel)) && return 0
    local why
    if [[ ! -f "$it_lib" ]]; then
        echo "FAIL $it_name: $it_lib does not exist (build it: ninja -C build)"
        exit 1
    fi
    if [[ ! -x "$it_tools/sdirect-run" ]]; then
        echo "FAIL $it_name: $it_tools/sdirect-run does not exist (build it: ninja -C build)"
        exit 1
    fi
    export SDIRECT_LIB="$it_lib"
    if ! why="$(timeout 20 "$it_tools/sdirect-run" true 2>&1)"; then
        echo "FAIL $it_name: cannot preload $it_lib: $why"
        exit 1
    fi
}

# it_secs N: N, or what is left of the script's budget if that is less
# (at least 1, so a late step still runs and fails rather than hanging).
it_secs() {
    local left=$((it_deadline - SECONDS))
    ((left < 1)) && left=1
    ((left < $1)) && echo "$left" || echo "$1"
}

# it_free_port: a TCP port on 127.0.0.1 that nobody uses right now.
it_free_port() {
    "$it_py" -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

# it_prefix ROLE SECONDS: sets it_cmd to the words that run a program as
# ROLE for at most SECONDS (then SIGTERM, 3 s later SIGKILL), preloaded
# unless in kernel mode. --foreground keeps the program in the test's
# process group, so a runner that kills the group kills it too, and a
# signal sent to the timeout pid reaches the program only.
it_prefix() {
    it_cmd=(env "SDIRECT_STATS_FILE=$it_tmp/$1.stats"
        timeout --foreground -k 3 "$(it_secs "$2")")
    ((it_kernel)) || it_cmd+=("$it_tools/sdirect-run")
}

# it_run ROLE SECONDS CMD...: runs a client in the foreground from $it_tmp;
# the caller redirects its input and output. Returns its exit status
# (124: timed out).
it_run() {
    local role="$1" secs="$2"
    shift 2
    it_prefix "$role" "$secs"
    (cd "$it_tmp" && exec "${it_cmd[@]}" "$@")
}

# it_start ROLE SECONDS CMD...: starts a server in the background from
# $it_tmp, output in $it_tmp/ROLE.log; its pid (the timeout wrapper, which
# passes signals on to the server) in it_pid.
it_start() {
    local role="$1" secs="$2"
    shift 2
    it_prefix "$role" "$secs"
    (cd "$it_tmp" && exec "${it_cmd[@]}" "$@") </dev/null >"$it_tmp/$role.log" 2>&1 &
    it_pid=$!
    it_servers+=("$it_pid")
}

# it_listening PORT: something listens on 127.0.0.1:PORT (or any address).
# Reads /proc instead of connecting, which would add a connection to the
# server's stats.
it_listening() {
    local hex
    hex="$(printf ':%04X' "$1")"
    awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 }
        END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# it_wait_listen PORT PID [SECONDS]: waits (default at most 10 s) until
# PORT listens while PID lives.
it_wait_listen() {
    local port="$1" pid="$2" limit i
    limit=$(($(it_secs "${3:-10}") * 20))
    for ((i = 0; i < limit; i++)); do
        it_listening "$port" && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# it_stop PID [SIGNAL [SECONDS]]: sends SIGNAL (default TERM) to PID, waits
# at most SECONDS (default 10) for it to end, then SIGKILLs it. Sets
# it_stop_rc to its exit status and it_stop_text to that in words.
it_stop() {
    local pid="$1" sig="${2:-TERM}" limit i
    limit=$((${3:-10} * 20))
    kill "-$sig" "$pid" 2>/dev/null
    for ((i = 0; i < limit; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null
        it_collect "$pid"
        it_stop_rc=137
        it_stop_text="still running ${3:-10} s after SIG$sig, SIGKILLed"
        return 0
    fi
    it_collect "$pid"
    return 0
}

# it_collect PID: reaps PID, which has ended, into it_stop_rc and
# it_stop_text.
it_collect() {
    local i rest=()
    wait "$1" 2>/dev/null
    it_stop_rc=$?
    it_stop_text="$(it_status "$it_stop_rc")"
    for i in "${it_servers[@]}"; do
        [[ "$i" == "$1" ]] || rest+=("$i")
    done
    it_servers=("${rest[@]}")
}

# it_reap PID SECONDS: waits at most SECONDS for PID to end by itself,
# then stops it (it_stop). Sets it_stop_rc; status 1 if it had to be stopped.
it_reap() {
    local pid="$1" limit i
    limit=$(($(it_secs "$2") * 20))
    for ((i = 0; i < limit; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    if kill -0 "$pid" 2>/dev/null; then
        it_stop "$pid" TERM
        return 1
    fi
    it_collect "$pid"
    return 0
}

# it_status RC: an exit status in words.
it_status() {
    case "$1" in
        0) echo "exit 0" ;;
        124) echo "timed out" ;;
        137) echo "killed by SIGKILL (timed out)" ;;
        # 129-192: the shell's status of a child killed by signal 1-64;
        # above, a program's own exit status (ssh's 255).
        *) if (($1 > 128 && $1 <= 192)); then echo "killed by signal $(($1 - 128))"; else echo "exit $1"; fi ;;
    esac
}

it_ok() {
    it_checks=$((it_checks + 1))
    printf '  ok   %s\n' "$*"
}

it_bad() {
    it_checks=$((it_checks + 1))
    it_failures=$((it_failures + 1))
    printf '  FAIL %s\n' "$*"
}

# it_echo_bytes NAME BYTES: an echo's client (NAME-client.log) sent BYTES
# and got them back unchanged, and its server (NAME-server.log) received
# the same: the "client sent", "client received" and "server received"
# lines (count and digest) all agree.
it_echo_bytes() {
    local name="$1" bytes="$2" sent recv_c recv_s
    sent="$(awk '/^client sent/ {print $3, $4}' "$it_tmp/$name-client.log")"
    recv_c="$(awk '/^client received/ {print $3, $4}' "$it_tmp/$name-client.log")"
    recv_s="$(awk '/^server received/ {print $3, $4}' "$it_tmp/$name-server.log")"
    if [[ -n "$sent" && "$sent" == "$recv_s" && "$sent" == "$recv_c" && "${sent%% *}" == "$bytes" ]]; then
        it_ok "$name: $bytes bytes each way, byte-exact (${sent#* })"
    else
        it_bad "$name: sent '$sent', server received '$recv_s', client received back '$recv_c'"
    fi
}

# it_check CONDITION-STATUS TEXT: it_ok if the status is 0, else it_bad.
it_check() {
    local st="$1"
    shift
    if ((st == 0)); then it_ok "$@"; else it_bad "$@"; fi
}

# it_stats_summary FILE PORT: one line about the connections to or from
# PORT in a stats file: "total direct kernel shared idle tx_fabric
# tx_kernel reasons". Listeners (peer port 0) are not connections. An idle
# connection moved no byte either way and is not direct (e.g. connect,
# shutdown, close): it never needed a transport, so it is counted apart
# and not in total.
it_stats_summary() {
    [[ -f "$1" ]] || { echo "0 0 0 0 0 0 0 -"; return; }
    awk -v port="$2" '
        {
            lp = ""; pp = ""; mode = ""; reason = ""; moved = 0; txf = 0; txk = 0
            for (i = 1; i <= NF; i++) {
                if ($i ~ /^local=/) { lp = $i; sub(/.*:/, "", lp) }
                else if ($i ~ /^peer=/) { pp = $i; sub(/.*:/, "", pp) }
                else if ($i ~ /^mode=/) mode = substr($i, 6)
                else if ($i ~ /^reason=/) reason = substr($i, 8)
                else if ($i ~ /^(tx|rx)_(kernel|fabric)=/) {
                    v = $i; sub(/.*=/, "", v); moved += v
                    if ($i ~ /^tx_fabric=/) txf = v + 0
                    if ($i ~ /^tx_kernel=/) txk = v + 0
                }
            }
            if (mode == "" || pp == "0" || (lp != port && pp != port)) next
            if (mode != "direct" && moved == 0) { idle++; next }
            total++
            count[mode]++
            fabric += txf
            kernel += txk
            if (mode != "direct") why[mode "/" reason]++
        }
        END {
            r = ""
            for (k in why) r = r (r == "" ? "" : ",") k "x" why[k]
            printf "%d %d %d %d %d %.0f %.0f %s\n", total, count["direct"] + 0,
                count["kernel"] + 0, count["shared"] + 0, idle + 0, fabric, kernel,
                (r == "" ? "-" : r)
        }' "$1"
}

# it_py_pair NAME PROG SERVER-ROLE [SERVER-ARG...] -- [CLIENT-ARG...]:
# one of this directory's python programs as a server on a free port
# (`PROG SERVER-ROLE --port P SERVER-ARG...`, role NAME-server, 50 s) and as
# its client (`PROG client --port P CLIENT-ARG...`, NAME-client, 30 s);
# checks that the client exits 0 and that the server then ends by itself
# with 0. Sets it_pair_port to P. Status 1 if the server did not listen.
it_py_pair() {
    local name="$1" prog="$2" role="$3" port srv rc args_srv=()
    shift 3
    while (($# > 0)) && [[ "$1" != -- ]]; do args_srv+=("$1"); shift; done
    shift
    port="$(it_free_port)"
    it_pair_port=$port
    it_start "$name-server" 50 "$it_py" "$it_dir/$prog" "$role" --port "$port" "${args_srv[@]}"
    srv=$it_pid
    if ! it_wait_listen "$port" "$srv"; then
        it_bad "$name: $prog server did not listen on 127.0.0.1:$port"
        it_stop "$srv" TERM 3
        return 1
    fi
    it_run "$name-client" 30 "$it_py" "$it_dir/$prog" client --port "$port" "$@" \
        </dev/null >"$it_tmp/$name-client.log" 2>&1
    rc=$?
    it_check "$rc" "$name client: $(it_status "$rc"); $(tail -n 1 "$it_tmp/$name-client.log")"
    if it_reap "$srv" 10; then
        it_check "$it_stop_rc" "$name server: $it_stop_text; $(tail -n 1 "$it_tmp/$name-server.log")"
    else
        it_bad "$name server: still running 10 s after its client ended; $(tail -n 1 "$it_tmp/$name-server.log")"
    fi
    return 0
}

# it_stats_sum FILE PORT COUNTER: the sum of COUNTER (e.g. tx_zcopy) over
# the connections to or from PORT in a stats file (0 without the file).
it_stats_sum() {
    [[ -f "$1" ]] || { echo 0; return; }
    awk -v port="$2" -v key="$3" '
        {
            lp = ""; pp = ""; v = 0
            for (i = 1; i <= NF; i++) {
                if ($i ~ /^local=/) { lp = $i; sub(/.*:/, "", lp) }
                else if ($i ~ /^peer=/) { pp = $i; sub(/.*:/, "", pp) }
                else if (index($i, key "=") == 1) v = substr($i, length(key) + 2) + 0
            }
            if (pp != "0" && (lp == port || pp == port)) sum += v
        }
        END { printf "%.0f\n", sum }' "$1"
}

# it_expect_counter PORT ROLE COUNTER: in direct mode, the connections of
# ROLE to or from PORT moved bytes by COUNTER (a protocol's byte counter,
# e.g. tx_zcopy: read zero-copy ran). Skipped in kernel mode.
it_expect_counter() {
    local port="$1" role="$2" key="$3" sum
    ((it_kernel)) && return 0
    sum="$(it_stats_sum "$it_tmp/$role.stats" "$port" "$key")"
    if ((sum > 0)); then
        it_ok "$role: $key $sum B"
    else
        it_bad "$role: $key 0 B; expected the protocol to carry bytes"
    fi
}

# it_expect_direct PORT MIN ROLE...: for each ROLE, the connections to or
# from PORT in $it_tmp/ROLE.stats (idle ones aside) number at least MIN,
# are all in direct mode, and sent bytes over the fabric (tx_fabric > 0 in
# sum; with IT_FABRIC_EITHER=1, bytes over the fabric either way, for a
# role whose sends may all precede the upgrade). Skipped in kernel mode.
it_expect_direct() {
    local port="$1" min="$2" role total direct kernel shared idle txf txk why text
    shift 2
    if ((it_kernel)); then
        it_log "mode check skipped ($*; SDIRECT_IT_KERNEL=1)"
        return 0
    fi
    for role in "$@"; do
        read -r total direct kernel shared idle txf txk why \
            < <(it_stats_summary "$it_tmp/$role.stats" "$port")
        text="$role: $total connections (direct $direct, kernel $kernel, shared $shared)"
        ((idle == 0)) || text+=" + $idle idle"
        text+=", tx_fabric $txf B, tx_kernel $txk B"
        [[ "$why" == "-" ]] || text+=", not direct: $why"
        if [[ ! -s "$it_tmp/$role.stats" ]]; then
            it_bad "$role: no stats written (process did not exit normally, or library not active)"
        elif ((total < min)); then
            it_bad "$text; expected at least $min"
        elif ((direct != total)); then
            it_bad "$text; expected all direct"
        elif ((txf == 0)) && ! ((${IT_FABRIC_EITHER:-0})); then
            it_bad "$text; expected tx_fabric > 0"
        elif ((txf == 0)) && (($(it_stats_sum "$it_tmp/$role.stats" "$port" rx_fabric) == 0)); then
            it_bad "$text; expected tx_fabric or rx_fabric > 0"
        else
            it_ok "$text"
        fi
    done
}

# it_mode_check PORT ROLE MODE REASON [COND...]: whether the connections to
# or from PORT in $it_tmp/ROLE.stats number at least one, and every one
# ended in MODE with REASON and meets every COND: KEY=N, KEY>N or KEY<N, where KEY
# is a counter of the stats line or a sum of them (tx_fabric+rx_fabric).
# Status 0 if so, 1 if not, 2 without stats or connection; the words in
# it_mode_text (the first connection that differs, else the first one).
it_mode_check() {
    local port="$1" role="$2" mode="$3" reason="$4" out total bad text
    shift 4
    if [[ ! -s "$it_tmp/$role.stats" ]]; then
        it_mode_text="$role: no stats written (process did not exit normally, or library not active)"
        return 2
    fi
    out="$(awk -v port="$port" -v mode="$mode" -v reason="$reason" -v conds="$*" '
        {
            lp = ""; pp = ""; delete v
            for (i = 1; i <= NF; i++) {
                if ($i ~ /^local=/) { lp = $i; sub(/.*:/, "", lp) }
                else if ($i ~ /^peer=/) { pp = $i; sub(/.*:/, "", pp) }
                if (index($i, "=")) v[substr($i, 1, index($i, "=") - 1)] = substr($i, index($i, "=") + 1)
            }
            if (!("mode" in v) || pp == "0" || (lp != port && pp != port)) next
            n++
            text = "mode=" v["mode"] " reason=" v["reason"]
            bad = v["mode"] != mode || v["reason"] != reason
            k = split(conds, c, " ")
            for (j = 1; j <= k; j++) {
                op = index(c[j], ">") ? ">" : index(c[j], "<") ? "<" : "="
                split(c[j], kv, op)
                m = split(kv[1], keys, "+")
                sum = 0
                for (q = 1; q <= m; q++) sum += v[keys[q]]
                ok = op == ">" ? sum > kv[2] + 0 : op == "<" ? sum < kv[2] + 0 : sum == kv[2] + 0
                text = text " " kv[1] "=" sum
                if (!ok) { bad = 1; text = text "(want " op kv[2] ")" }
            }
            if (bad) nbad++
            if (bad || first == "") first = text
            if (bad && firstbad == "") firstbad = text
        }
        END {
            if (n == 0) { print "0 0 -"; exit }
            printf "%d %d %s\n", n, nbad + 0, (firstbad != "" ? firstbad : first)
        }' "$it_tmp/$role.stats")"
    read -r total bad text <<<"$out"
    if ((total == 0)); then
        it_mode_text="$role: no connection to or from port $port in the stats; expected $mode/$reason"
        return 2
    elif ((bad > 0)); then
        it_mode_text="$role: $bad of $total connections not $mode/$reason $*: $text"
        return 1
    fi
    it_mode_text="$role: $total connection(s) $text"
    return 0
}

# it_expect_mode PORT ROLE MODE REASON [COND...]: it_mode_check as a check,
# for connections that are not direct, or not only. Skipped in kernel mode.
it_expect_mode() {
    if ((it_kernel)); then
        it_log "mode check skipped ($2; SDIRECT_IT_KERNEL=1)"
        return 0
    fi
    if it_mode_check "$@"; then it_ok "$it_mode_text"; else it_bad "$it_mode_text"; fi
}

# it_finish: prints the verdict and exits 0 (pass) or 1 (fail); on failure
# shows the end of every log in the temporary directory.
it_finish() {
    local f
    if ((it_failures == 0 && it_checks > 0)); then
        echo "PASS $it_name ($it_label): $it_checks checks"
        exit 0
    fi
    for f in "$it_tmp"/*.log "$it_tmp"/*.err; do
        [[ -s "$f" ]] || continue
        echo "--- last lines of $(basename "$f")"
        tail -n 15 "$f" | cut -c 1-300
    done
    echo "FAIL $it_name ($it_label): $it_failures of $it_checks checks failed"
    exit 1
}

# it_as USER: sets it_as_words to the words that run a program as USER,
# its uid, primary gid and groups, as systemd's User= does.
it_as() {
    it_as_words=(setpriv "--reuid=$(id -u "$1")" "--regid=$(id -g "$1")" --init-groups)
}

# it_share_tools: the library (with its psm stand-ins) and sdirect-run copied where every user may
# read them (a service runs them as its own user); it_tools and
# SDIRECT_LIB point there. Nothing in kernel mode.
it_share_tools() {
    ((it_kernel)) && return 0
    mkdir -p "$it_tmp/tools"
    cp "$it_lib" "$it_tmp/tools/libsdirect.so"
    # The psm stand-ins it loads from beside itself (when built).
    cp "$(dirname "$it_lib")"/libsdirect-psm*.so "$it_tmp/tools/" 2>/dev/null || true
    cp "$it_tools/sdirect-run" "$it_tmp/tools/"
    chmod -R a+rX "$it_tmp/tools"
    it_tools="$it_tmp/tools"
    export SDIRECT_LIB="$it_tmp/tools/libsdirect.so"
}

# it_shared_tmp: processes of other users may write their stats and logs
# in $it_tmp (root's scratch folder otherwise).
it_shared_tmp() {
    chmod 0777 "$it_tmp"
}

# it_uids_of PID: the real uids of PID's children, sorted, one line.
it_child_uids() {
    ps -o uid= --ppid "$1" 2>/dev/null | tr -d ' ' | sort -u | tr '\n' ' '
}

# it_keeps_old_registry PID REGISTRY OLD: PID maps a file of REGISTRY or
# the fabric region of process OLD (its parent, before a fork), or holds a
# control socket bound in REGISTRY; prints what, status 0 if so.
it_keeps_old_registry() {
    local pid="$1" reg="$2" old="$3" ino found=1
    if grep -E "($reg/|/dev/shm/sd$old-)" "/proc/$pid/maps" 2>/dev/null | head -n 1 | grep .; then
        found=0
    fi
    for ino in $(awk -v r="$reg/ctl-" 'index($8, r) == 1 { print $7 }' /proc/net/unix 2>/dev/null); do
        if ls -l "/proc/$pid/fd" 2>/dev/null | grep -q "socket:\[$ino\]"; then
            echo "control socket inode $ino of $reg"
            found=0
        fi
    done
    return $found
}

# it_stats_open ROLE...: creates each ROLE's stats file, writable by every
# user (a service's processes of several uids append to it).
it_stats_open() {
    local role
    for role in "$@"; do
        : >>"$it_tmp/$role.stats"
        chmod 0666 "$it_tmp/$role.stats"
    done
}

# it_fetch_as NAME USER PORT ROOT FILE...: http_fetch.py as USER (root:
# as it is) against 127.0.0.1:PORT serving ROOT, role NAME-client; each
# line it prints is a check.
it_fetch_as() {
    local name="$1" user="$2" port="$3" root="$4" rc line pre=()
    shift 4
    if [[ "$user" != root ]]; then
        it_as "$user"
        pre=("${it_as_words[@]}")
    fi
    it_run "$name-client" 40 "${pre[@]}" "$it_py" "$it_dir/http_fetch.py" "$port" "$root" "$@" \
        </dev/null >"$it_tmp/$name-client.log" 2>&1
    rc=$?
    if ((rc == 0)); then
        while read -r line; do it_ok "$name: http_fetch.py as $user: $line"; done <"$it_tmp/$name-client.log"
    else
        it_bad "$name: http_fetch.py as $user: $(it_status "$rc"); $(tail -n 1 "$it_tmp/$name-client.log")"
    fi
}

# it_curl_as NAME USER PORT FILE: 4 curl processes as USER, one after the
# other, each 2 keep-alive GETs of /FILE from 127.0.0.1:PORT, every body
# compared by sha256 with FILE's on disk ($4 is its path; its name is
# the URL's), role NAME-client: a client of its own, curl, beside the
# python one of it_fetch_as.
it_curl_as() {
    local name="$1" user="$2" port="$3" file="$4" k rc want got ok=0 pre=()
    if [[ "$user" != root ]]; then
        it_as "$user"
        pre=("${it_as_words[@]}")
    fi
    want="$(sha256sum <"$file")"
    for ((k = 1; k <= 4; k++)); do
        rm -f "$it_tmp/$name-a.bin" "$it_tmp/$name-b.bin"
        it_run "$name-client" 20 "${pre[@]}" curl -sS --max-time 15 \
            -o "$it_tmp/$name-a.bin" "http://127.0.0.1:$port/$(basename "$file")" \
            -o "$it_tmp/$name-b.bin" "http://127.0.0.1:$port/$(basename "$file")" \
            </dev/null >>"$it_tmp/$name-client.log" 2>&1
        rc=$?
        got="$(sha256sum <"$it_tmp/$name-a.bin" 2>/dev/null) $(sha256sum <"$it_tmp/$name-b.bin" 2>/dev/null)"
        if ((rc == 0)) && [[ "$got" == "$want $want" ]]; then
            ok=$((ok + 1))
        else
            it_bad "$name: curl $k as $user: $(it_status "$rc"); bodies differ or are missing"
        fi
    done
    it_check $((ok != 4)) "$name: 4 curl processes as $user, each 2 keep-alive GETs of $(basename "$file"): $ok of 4 intact"
}
