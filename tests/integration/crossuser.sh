#!/usr/bin/env bash
# Connections between two users on one host (on by default): an
# echo of 6 MB in pieces of 1 B to 1 MiB between a root process and one of
# nobody, each way round (root client to a nobody server, nobody client to
# a root server), and between nobody and daemon. Every byte must come back
# as sent (counts and SHA-256 on both ends) and both ends must have run
# direct (their stats files). While each root<->nobody connection is up, a
# process of a third uid (daemon) must get EACCES opening any shm region
# or process page either end has mapped, the peer's uid must get EACCES
# on our region (never opened to it: the pair's messages go by two
# queues, sealed memfds, never through the provider) and be able to open
# our page read-only only; every byte went inline, in messages (no ring
# write, no zero-copy across users). A root server that becomes daemon
# mid-stream goes on over the kernel and keeps nothing of its peer mapped
# (no page, no queue). An entry a third user forged for someone else's
# connection gets nothing opened to it. With SDIRECT_CROSS_USER=0 the same
# pair stays on TCP (other_user or no_peer).
#
# Needs root (setpriv to other uids); it runs in a mount namespace of its
# own with a private /dev/shm, so that the registries it opens to other
# users are not the host's.
private_shm_why="runs one side as nobody, probes as daemon"
private_shm_users="nobody daemon"
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/private_shm.sh"

source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_need setpriv:util-linux
it_preflight
# Both users write their stats and logs here.
chmod 0777 "$it_tmp"

nobody=$(id -u nobody)
third=$(id -u daemon)
as_nobody=(setpriv "--reuid=$nobody" "--regid=$(id -g nobody)" --clear-groups)
as_daemon=(setpriv "--reuid=$third" "--regid=$(id -g daemon)" --clear-groups)
bytes=6000000


# pair NAME CROSS SERVER-AS CLIENT-AS: one echo; SERVER-AS and CLIENT-AS
# are root, nobody or daemon; CROSS is the SDIRECT_CROSS_USER value, or
# "default" (not set). A root side probes (a user's process cannot switch
# to the third uid).
pair() {
    local name="$1" setting="$2" srv_as="$3" cli_as="$4" port srv rc cross=1
    [[ "$setting" == 0 ]] && cross=0
    local srv_pre=() cli_pre=() srv_probe=() cli_probe=()
    [[ "$srv_as" == nobody ]] && srv_pre=("${as_nobody[@]}")
    [[ "$cli_as" == nobody ]] && cli_pre=("${as_nobody[@]}")
    [[ "$srv_as" == daemon ]] && srv_pre=("${as_daemon[@]}")
    [[ "$cli_as" == daemon ]] && cli_pre=("${as_daemon[@]}")
    if ((!it_kernel && cross)) && [[ "$srv_as" == root || "$cli_as" == root ]]; then
        if [[ "$srv_as" == root ]]; then
            srv_probe=(--probe "$third" --peer-uid "$nobody")
        else
            cli_probe=(--probe "$third" --peer-uid "$nobody")
        fi
    fi
    port="$(it_free_port)"
    if [[ "$setting" == default ]]; then unset SDIRECT_CROSS_USER; else export SDIRECT_CROSS_USER="$setting"; fi
    it_start "$name-server" 40 "${srv_pre[@]}" "$it_py" "$it_dir/xuser_echo.py" server \
        --port "$port" "${srv_probe[@]}"
    srv=$it_pid
    if ! it_wait_listen "$port" "$srv"; then
        it_bad "$name: server ($srv_as) did not listen on 127.0.0.1:$port"
        it_stop "$srv" TERM 3
        return
    fi
    it_run "$name-client" 30 "${cli_pre[@]}" "$it_py" "$it_dir/xuser_echo.py" client \
        --port "$port" --bytes "$bytes" "${cli_probe[@]}" </dev/null >"$it_tmp/$name-client.log" 2>&1
    rc=$?
    it_check "$rc" "$name: client ($cli_as) $(it_status "$rc")"
    if it_reap "$srv" 10; then
        it_check "$it_stop_rc" "$name: server ($srv_as) $it_stop_text"
    else
        it_bad "$name: server still running 10 s after its client ended"
    fi
    unset SDIRECT_CROSS_USER
    it_echo_bytes "$name" "$bytes"
    if ((${#srv_probe[@]} + ${#cli_probe[@]})); then
        local line
        line="$(grep -h '^probe' "$it_tmp/$name-server.log" "$it_tmp/$name-client.log")"
        [[ "$line" == "probe ok "* ]]
        it_check $? "$name: uid $third gets EACCES on every shared file; uid $nobody gets EACCES on our region, opens our page ro only; two queues mapped: $line"
    fi
    if ((cross)); then
        # Direct from the first byte unless the engine's build outlasted
        # connect's wait (a loaded host): then the first bytes went on the
        # kernel, counted.
        it_expect_mode "$port" "$name-server" direct none "rx_fabric+rx_kernel=$bytes" \
            "tx_fabric+tx_kernel=$bytes" "tx_fabric>0"
        it_expect_mode "$port" "$name-client" direct none "tx_fabric+tx_kernel=$bytes" \
            "rx_fabric+rx_kernel=$bytes" "tx_fabric>0" "tx_inline>0" "tx_ring=0" "tx_zcopy=0"
    else
        # Today's reasons: the nobody end cannot look into root's registry
        # (no_peer); the root end may find nobody's entry there, if its
        # verdict comes after that entry was written (other_user), or not.
        it_expect_mode "$port" "$name-server" kernel no_peer "tx_fabric=0"
        if ((!it_kernel)) && ! it_mode_check "$port" "$name-client" kernel other_user "tx_fabric=0"; then
            it_expect_mode "$port" "$name-client" kernel no_peer "tx_fabric=0"
        else
            it_expect_mode "$port" "$name-client" kernel other_user "tx_fabric=0"
        fi
    fi
}

# drop NAME: a root server, direct with a nobody client, becomes uid
# daemon after 1 MiB, once it has sent on the fabric: the connection goes on over the kernel, byte-exact,
# and the server has none of the nobody process's memory mapped after.
drop() {
    local name="$1" port srv rc stat=()
    port="$(it_free_port)"
    unset SDIRECT_CROSS_USER  # on by default
    ((it_kernel)) || stat=(--stat-tool "$it_tools/sdirect-stat")
    it_start "$name-server" 40 "$it_py" "$it_dir/xuser_echo.py" server --port "$port" \
        --drop-to "$third" "${stat[@]}"
    srv=$it_pid
    if ! it_wait_listen "$port" "$srv"; then
        it_bad "$name: server did not listen on 127.0.0.1:$port"
        it_stop "$srv" TERM 3
        return
    fi
    it_run "$name-client" 30 "${as_nobody[@]}" "$it_py" "$it_dir/xuser_echo.py" client \
        --port "$port" --bytes "$bytes" </dev/null >"$it_tmp/$name-client.log" 2>&1
    rc=$?
    it_check "$rc" "$name: client (nobody) $(it_status "$rc")"
    if it_reap "$srv" 10; then
        it_check "$it_stop_rc" "$name: server (root, then daemon) $it_stop_text"
    else
        it_bad "$name: server still running 10 s after its client ended"
    fi
    unset SDIRECT_CROSS_USER
    it_echo_bytes "$name" "$bytes"
    if ((!it_kernel)); then
        local line
        line="$(grep -h '^maps' "$it_tmp/$name-server.log")"
        [[ "$line" == "maps ok" ]]
        it_check $? "$name: the server mapped its peer's page and their queues before its setresuid, nothing of them after: $line"
        # Direct first (bytes on the fabric), then on the kernel for good.
        it_expect_mode "$port" "$name-server" kernel privilege "tx_fabric>0" "tx_kernel>0"
        it_expect_mode "$port" "$name-client" kernel privilege "rx_fabric>0" "rx_kernel>0"
    fi
}

# forged NAME: a third user (daemon) plants, in its own registry, a valid
# entry claiming the server end of a connection between a root client and
# a plain server of nobody (not preloaded). The client finds it there; the
# kernel says that end is nobody's, so nothing of the client is opened to
# daemon (its region's ACL names no such uid) and the connection stays on
# TCP, byte-exact (other_user).
forged() {
    local name="$1" port cport srv rc sleeper line
    port="$(it_free_port)"
    cport="$(it_free_port)"
    (cd "$it_tmp" && exec timeout 40 "${as_nobody[@]}" "$it_py" "$it_dir/xuser_echo.py" server \
        --port "$port") </dev/null >"$it_tmp/$name-server.log" 2>&1 &
    srv=$!
    it_servers+=("$srv")
    if ! it_wait_listen "$port" "$srv"; then
        it_bad "$name: server did not listen on 127.0.0.1:$port"
        it_stop "$srv" TERM 3
        return
    fi
    setpriv "--reuid=$third" "--regid=$third" --clear-groups sleep 40 &
    sleeper=$!
    setpriv "--reuid=$third" "--regid=$third" --clear-groups "$it_py" "$it_dir/xuser_plant.py" \
        --port "$port" --client-port "$cport" --pid "$sleeper" >"$it_tmp/$name-plant.log" 2>&1
    it_check $? "$name: uid $third planted $(cat "$it_tmp/$name-plant.log")"
    unset SDIRECT_CROSS_USER  # on by default
    it_run "$name-client" 30 "$it_py" "$it_dir/xuser_echo.py" client --port "$port" \
        --bytes "$bytes" --bind-port "$cport" --check-acl "$third" \
        </dev/null >"$it_tmp/$name-client.log" 2>&1
    rc=$?
    unset SDIRECT_CROSS_USER
    kill "$sleeper" 2>/dev/null
    wait "$sleeper" 2>/dev/null
    it_check "$rc" "$name: client (root) $(it_status "$rc")"
    if it_reap "$srv" 10; then
        it_check "$it_stop_rc" "$name: server (nobody, plain) $it_stop_text"
    else
        it_bad "$name: server still running 10 s after its client ended"
    fi
    it_echo_bytes "$name" "$bytes"
    line="$(grep -h '^acl' "$it_tmp/$name-client.log")"
    [[ "$line" == "acl ok" ]]
    it_check $? "$name: the client's region is not opened to uid $third: $line"
    it_expect_mode "$port" "$name-client" kernel other_user "tx_fabric=0"
}

# First, while neither registry was opened to other users.
pair setting-off 0 nobody root
pair root-to-nobody default nobody root
pair nobody-to-root default root nobody
drop setuid-after
pair nobody-to-daemon default daemon nobody
((it_kernel)) || forged forged-entry
it_finish
