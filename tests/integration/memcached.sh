#!/usr/bin/env bash
# memcached (libevent, epoll, worker threads) with a python3 client on the
# text protocol (memcache_client.py: values of 0 B to 512 KiB with CR LF
# inside, multi-get, a second connection, cas, append/prepend, incr/decr,
# delete, 300 pipelined sets and gets), every reply compared exactly.
# Then every connection must have run direct.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_need memcached:memcached
it_preflight

port="$(it_free_port)"
# memcached refuses to run as root unless told which user to be; being
# the current user keeps both ends under one uid (required for direct mode).
user=()
((EUID == 0)) && user=(-u "$(id -un)")
it_start server 60 memcached -l 127.0.0.1 -p "$port" -U 0 -t 2 -m 64 "${user[@]}"
srv=$it_pid
if ! it_wait_listen "$port" "$srv"; then
    it_bad "memcached did not listen on 127.0.0.1:$port"
    it_finish
fi

it_run client 30 "$it_py" "$it_dir/memcache_client.py" "$port" \
    </dev/null >"$it_tmp/client.log" 2>&1
rc=$?
it_check "$rc" "memcache_client.py: $(it_status "$rc"); $(tail -n 1 "$it_tmp/client.log")"

# memcached exits 0 on SIGTERM.
it_stop "$srv" TERM
it_check "$it_stop_rc" "memcached ended on SIGTERM: $it_stop_text"

it_expect_direct "$port" 2 server client
it_finish
