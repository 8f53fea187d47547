#!/usr/bin/env bash
# memcached as Debian's package runs it: as root with `-u memcache`
# (/etc/memcached.conf), so memcached calls setgroups, setgid and setuid
# itself, before it listens and before any thread. Clients: memcache_client.py
# (values of 0 B to 512 KiB, multi-get, cas, 300 pipelined sets and gets,
# a second connection), every reply compared exactly.
#   -u memcache, client as memcache, every setting at its default: the
#     change of ids does not keep memcached on TCP (it holds nothing of
#     the fabric then), and the kernel leaves it not dumpable after
#     setuid (memcached does not set the flag again): its connections go
#     through the message queues, as across users, direct on both ends,
#     every byte inline (no ring write, no zero-copy).
#   started as memcache (setpriv, as systemd's User= would): direct with
#     a client of memcache at the defaults, and with a root client when
#     both ends set SDIRECT_CROSS_USER=1.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/private_shm.sh"
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_need memcached:memcached setpriv:util-linux
getent passwd memcache >/dev/null || it_skip "user memcache is needed (Debian package memcached)"
it_preflight
it_shared_tmp
it_as memcache
as_mc=("${it_as_words[@]}")

# round NAME HOW CLIENT-AS CROSS: HOW is dash-u or user.
round() {
    local name="$1" how="$2" cli_as="$3" cross="$4" port srv rc pre=() run=()
    port="$(it_free_port)"
    [[ "$how" == user ]] && run=("${as_mc[@]}")
    [[ "$cli_as" == memcache ]] && pre=("${as_mc[@]}")
    export SDIRECT_CROSS_USER="$cross"
    it_stats_open "$name-server"
    it_start "$name-server" 60 "${run[@]}" memcached -l 127.0.0.1 -p "$port" -U 0 -t 2 -m 64 \
        -u memcache
    srv=$it_pid
    if ! it_wait_listen "$port" "$srv"; then
        it_bad "$name: memcached did not listen on 127.0.0.1:$port"
        it_stop "$srv" TERM 3
        unset SDIRECT_CROSS_USER
        return
    fi
    local uid
    uid="$(it_child_uids "$srv")"
    it_run "$name-client" 30 "${pre[@]}" "$it_py" "$it_dir/memcache_client.py" "$port" \
        </dev/null >"$it_tmp/$name-client.log" 2>&1
    rc=$?
    it_check "$rc" "$name: memcache_client.py as $cli_as: $(it_status "$rc"); $(tail -n 1 "$it_tmp/$name-client.log")"
    it_stop "$srv" TERM
    it_check "$it_stop_rc" "$name: memcached ended on SIGTERM: $it_stop_text"
    unset SDIRECT_CROSS_USER
    [[ "$uid" == *"$(id -u memcache) "* ]]
    it_check $? "$name: memcached ran as uid $(id -u memcache) (memcache): uids '$uid'"
    if [[ "$how" == dash-u ]]; then
        it_expect_direct "$port" 2 "$name-server" "$name-client"
        it_expect_mode "$port" "$name-server" direct none "tx_ring=0" "tx_zcopy=0"
        it_expect_mode "$port" "$name-client" direct none "tx_ring=0" "tx_zcopy=0"
    else
        it_expect_direct "$port" 2 "$name-server" "$name-client"
    fi
}

round dash-u dash-u memcache 0
round as-memcache user memcache 0
round as-memcache-root-client user root 1
it_finish
