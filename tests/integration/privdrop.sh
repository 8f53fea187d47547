#!/usr/bin/env bash
# Processes that change their ids, each in an echo of 3 MB (pieces of
# 1 B to 1 MiB, counts and SHA-256 on both ends) with xuser_echo.py's
# client:
#   before-listen: a root server that becomes nobody before it listens
#     (it holds nothing of the fabric then) goes on as nobody: with a
#     nobody client and every setting at its default, both ends direct.
#   fork: a root server that listens (its fabric engine is built there),
#     forks, and whose child becomes nobody and serves (a pre-fork
#     server's worker): direct with a nobody client, and the child keeps
#     no map of root's registry or of the parent's region, nor its
#     control socket.
#   after-listen: a root server that listens (its engine is built there)
#     and then becomes nobody itself, before any connection: the unused
#     engine is given up, the server goes on as nobody, direct with a
#     nobody client, and nothing of its old engine stays (files in root's
#     registry and /dev/shm, maps, control socket).
#   not-dumpable: as before-listen, but the server does not make itself
#     dumpable again after the change (the kernel makes it not dumpable):
#     the pair goes through the message queues, as across users: direct
#     on both ends, every byte inline (no ring write, no zero-copy).
#   holds-direct: a root server whose connection with a root client is
#     direct, and that becomes nobody after 1 MiB, once it has sent on
#     the fabric (its stats say so; on a busy host the upgrade may come
#     later than 1 MiB): the connection goes on
#     over the kernel, byte-exact, reason privilege on both ends (direct
#     first: one upgrade, one leave).
#   accept-fork: a root server that accepts a root client's connection
#     and forks; its child becomes nobody (it holds the socket shared
#     with the idle parent, nothing of the fabric: it goes on afresh),
#     takes the connection over from the parent and upgrades it across
#     users, asking the client itself; after half the bytes the parent
#     uses the socket: it asks the child, of another uid now, to move the
#     connection back to the kernel, and echoes the rest there (client:
#     one upgrade, one leave, then shared; both halves byte-exact).
#   accept-fork-late: as accept-fork, but the client sends its first
#     byte 1 s after its connect: the child's engine is built by then, it
#     takes the connection over at its first echo and finds no entry of
#     the client's (whose engine builds only now); the client then finds
#     only the parent's mark (shared) in root's registry, never the
#     child's entry (the kernel names root as the owner of the child's
#     socket), so the child must look again until the client's entry is
#     there (same checks as accept-fork).
#   monitor: sshd's shape for a login as another user, with a root
#     client: the root server echoes the first 100 kB itself (direct), a
#     child it forks the next 100 kB (the server leaves the fabric for
#     sharing), the server's seteuid(nobody) and back while that child
#     lives retires it; then a second child becomes nobody (it goes on
#     afresh: the retirement was by ids, and it has no engine of its
#     own), takes the connection over from the idle server and echoes
#     the rest direct across users (client: two upgrades, one leave,
#     ending direct).
#   seteuid: a root server that changes only its effective uid (mixed
#     ids) retires as before: its connection is never tracked, and the
#     client (root) finds no entry (no_peer).
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/private_shm.sh"
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_need setpriv:util-linux
getent passwd nobody >/dev/null || it_skip "user nobody is needed"
it_preflight
it_shared_tmp

nobody=$(id -u nobody)
nogroup=$(id -g nobody)
it_as nobody
as_nobody=("${it_as_words[@]}")
bytes=3000000
client_args=()  # more arguments of echo_pair's client
# Each end's account of its upgrades, leaves and take-overs goes to its
# log, whose last lines a failed check prints.
export SDIRECT_LOG="${SDIRECT_LOG:-info}"

# echo_pair NAME CLIENT-AS SERVER-ARG...: one server and its client.
echo_pair() {
    local name="$1" cli_as="$2" port srv rc pre=()
    shift 2
    port="$(it_free_port)"
    pair_port=$port
    : >"$it_tmp/$name-server.stats"
    chmod 0666 "$it_tmp/$name-server.stats"
    it_start "$name-server" 40 "$it_py" "$it_dir/privdrop_echo.py" --port "$port" --gid "$nogroup" "$@"
    srv=$it_pid
    if ! it_wait_listen "$port" "$srv"; then
        it_bad "$name: server did not listen on 127.0.0.1:$port"
        it_stop "$srv" TERM 3
        return 1
    fi
    [[ "$cli_as" == nobody ]] && pre=("${as_nobody[@]}")
    it_run "$name-client" 30 "${pre[@]}" "$it_py" "$it_dir/xuser_echo.py" client --port "$port" \
        --bytes "$bytes" "${client_args[@]}" </dev/null >"$it_tmp/$name-client.log" 2>&1
    rc=$?
    it_check "$rc" "$name: client ($cli_as) $(it_status "$rc")"
    if it_reap "$srv" 10; then
        it_check "$it_stop_rc" "$name: server $it_stop_text"
    else
        it_bad "$name: server still running 10 s after its client ended"
    fi
    it_echo_bytes "$name" "$bytes"
    return 0
}

if echo_pair before-listen nobody --before-listen "$nobody"; then
    it_expect_mode "$pair_port" before-listen-server direct none "rx_fabric+rx_kernel=$bytes" "tx_fabric>0"
    it_expect_mode "$pair_port" before-listen-client direct none "tx_fabric+tx_kernel=$bytes" "tx_fabric>0"
fi

# inherited_ok NAME TEXT: the server's "inherited" line (NAME-server.log)
# says that the process that changed its ids kept nothing of the old
# uid's registry or region (TEXT says what).
inherited_ok() {
    local line
    line="$(grep '^inherited' "$it_tmp/$1-server.log")"
    if ((it_kernel)); then
        it_log "$1: inherited maps check skipped (SDIRECT_IT_KERNEL=1): $line"
    else
        [[ "$line" == "inherited ok" ]]
        it_check $? "$1: $2: $line"
    fi
}

if echo_pair fork nobody --fork "$nobody"; then
    inherited_ok fork "the child (nobody) keeps nothing of root's registry or of the parent's region"
    it_expect_mode "$pair_port" fork-server direct none "rx_fabric+rx_kernel=$bytes" "tx_fabric>0"
    # The child builds its engine at its first connection: the client's
    # bytes may all have gone before the upgrade, the echo after it.
    it_expect_mode "$pair_port" fork-client direct none "tx_fabric+tx_kernel=$bytes" \
        "tx_fabric+rx_fabric>0"
fi

if echo_pair after-listen nobody --after-listen "$nobody"; then
    inherited_ok after-listen "nothing of the engine built as root stays"
    it_expect_mode "$pair_port" after-listen-server direct none "rx_fabric+rx_kernel=$bytes" \
        "tx_fabric+rx_fabric>0"
    it_expect_mode "$pair_port" after-listen-client direct none "tx_fabric+tx_kernel=$bytes" \
        "tx_fabric+rx_fabric>0"
fi

if echo_pair not-dumpable nobody --before-listen "$nobody" --not-dumpable; then
    it_expect_mode "$pair_port" not-dumpable-server direct none "rx_fabric+rx_kernel=$bytes" \
        "tx_fabric>0" "tx_inline>0" "tx_ring=0" "tx_zcopy=0"
    it_expect_mode "$pair_port" not-dumpable-client direct none "tx_fabric+tx_kernel=$bytes" \
        "tx_fabric>0" "tx_inline>0" "tx_ring=0" "tx_zcopy=0"
fi

# xuser_echo.py's own server drops mid-stream (--drop-to).
port="$(it_free_port)"
: >"$it_tmp/holds-direct-server.stats"
chmod 0666 "$it_tmp/holds-direct-server.stats"
stat_tool=()
((it_kernel)) || stat_tool=(--stat-tool "$it_tools/sdirect-stat")
it_start holds-direct-server 40 "$it_py" "$it_dir/xuser_echo.py" server --port "$port" \
    --drop-to "$nobody" "${stat_tool[@]}"
srv=$it_pid
if it_wait_listen "$port" "$srv"; then
    it_run holds-direct-client 30 "$it_py" "$it_dir/xuser_echo.py" client --port "$port" \
        --bytes "$bytes" </dev/null >"$it_tmp/holds-direct-client.log" 2>&1
    rc=$?
    it_check "$rc" "holds-direct: client (root) $(it_status "$rc")"
    it_reap "$srv" 10
    it_check "$it_stop_rc" "holds-direct: server (root, then nobody) $it_stop_text"
    sent="$(awk '/^client sent/ {print $3, $4}' "$it_tmp/holds-direct-client.log")"
    recv_c="$(awk '/^client received/ {print $3, $4}' "$it_tmp/holds-direct-client.log")"
    recv_s="$(awk '/^server received/ {print $3, $4}' "$it_tmp/holds-direct-server.log")"
    [[ -n "$sent" && "$sent" == "$recv_s" && "$sent" == "$recv_c" && "${sent%% *}" == "$bytes" ]]
    it_check $? "holds-direct: $bytes bytes each way, byte-exact: sent '$sent', server '$recv_s', back '$recv_c'"
    # Bytes the leave handed back unread count once, on the kernel.
    it_expect_mode "$port" holds-direct-server kernel privilege "upgrades=1" "leaves=1" \
        "tx_fabric>0" "tx_fabric+tx_kernel=$bytes" "rx_fabric+rx_kernel=$bytes"
    it_expect_mode "$port" holds-direct-client kernel privilege "upgrades=1" "tx_fabric>0" \
        "tx_fabric+tx_kernel=$bytes" "rx_fabric+rx_kernel=$bytes"
else
    it_bad "holds-direct: server did not listen on 127.0.0.1:$port"
    it_stop "$srv" TERM 3
fi

if echo_pair accept-fork root --accept-fork "$nobody" --half $((bytes / 2)) "${stat_tool[@]}"; then
    inherited_ok accept-fork "the child (nobody) keeps nothing of root's registry or of the parent's region"
    # The client may have sent all its bytes before the upgrade, the echo
    # after it.
    it_expect_mode "$pair_port" accept-fork-client kernel shared "upgrades=1" "leaves=1" \
        "tx_fabric+rx_fabric>0" "tx_fabric+tx_kernel=$bytes" "rx_fabric+rx_kernel=$bytes"
fi

client_args=(--pause 1)
if echo_pair accept-fork-late root --accept-fork "$nobody" --half $((bytes / 2)) "${stat_tool[@]}"; then
    inherited_ok accept-fork-late "the child (nobody) keeps nothing of root's registry or of the parent's region"
    it_expect_mode "$pair_port" accept-fork-late-client kernel shared "upgrades=1" "leaves=1" \
        "tx_fabric+rx_fabric>0" "tx_fabric+tx_kernel=$bytes" "rx_fabric+rx_kernel=$bytes"
fi
client_args=()

if echo_pair monitor root --monitor "$nobody" --piece 100000 "${stat_tool[@]}"; then
    inherited_ok monitor "the second child (nobody) keeps nothing of root's registry or of the parent's region"
    it_expect_mode "$pair_port" monitor-client direct none "upgrades=2" "leaves=1" \
        "rx_fabric>1000000" "tx_fabric+tx_kernel=$bytes" "rx_fabric+rx_kernel=$bytes"
fi

if echo_pair seteuid root --seteuid "$nobody"; then
    if ((!it_kernel)); then
        n="$(it_stats_summary "$it_tmp/seteuid-server.stats" "$pair_port" | cut -d' ' -f1)"
        ((n == 0))
        it_check $? "seteuid: the server (ids mixed) tracks no connection: $n in its stats"
    fi
    it_expect_mode "$pair_port" seteuid-client kernel no_peer "tx_fabric=0"
fi
it_finish
