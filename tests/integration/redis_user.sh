#!/usr/bin/env bash
# redis-server as Debian's unit runs it (User=redis: it starts with the
# ids of redis and changes none itself; here setpriv stands in for
# systemd). Clients: redis-benchmark (-n 2000 -c 8, SET and GET) and a
# redis-cli session of SETs and GETs of values of 1 B to 512 KiB whose
# replies must be exactly the values:
#   as redis, every setting at its default on both ends;
#   as root, every setting at its default too (two uids).
# Each time every connection must have run direct on both ends.
# Then, with the server logging at debug, 6 root client processes hold
# connections open (redis_pingers.py) while a seventh, redis-benchmark -c
# 1, runs its PINGs: the server's epoll sleeps over connections to more
# links of another uid than a thread keeps bells for (4), and must make
# a bell for a link at most twice, not one at each sleep.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/private_shm.sh"
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_need redis-server:redis-server redis-benchmark:redis-tools redis-cli:redis-tools setpriv:util-linux
getent passwd redis >/dev/null || it_skip "user redis is needed (Debian package redis-server)"
it_preflight
it_shared_tmp
it_as redis
as_redis=("${it_as_words[@]}")

"$it_py" - "$it_tmp/session.in" "$it_tmp/session.want" <<'PY'
import random, string, sys
rng = random.Random(7)
alphabet = string.ascii_letters + string.digits
cmds, want = [], []
for i, size in enumerate([1, 100, 4096, 65536, 100000, 524288]):
    v = "".join(rng.choice(alphabet) for _ in range(size))
    cmds += [f"SET it:{i} {v}", f"GET it:{i}"]
    want += ["OK", v]
cmds.append("GET it:missing")
want.append("")
open(sys.argv[1], "w").write("\n".join(cmds) + "\n")
open(sys.argv[2], "w").write("\n".join(want) + "\n")
PY

# start_server NAME [ENV...]: redis-server as redis on a free port (in
# $port, its pid in $srv), with the settings ENV (KEY=VALUE); status 1
# if it did not listen (then stopped).
start_server() {
    local name="$1"
    shift
    port="$(it_free_port)"
    mkdir -p "$it_tmp/$name-data"
    chown redis "$it_tmp/$name-data"
    it_stats_open "$name-server"
    it_start "$name-server" 60 "${as_redis[@]}" env "$@" redis-server --bind 127.0.0.1 \
        --port "$port" --save '' --appendonly no --dir "$it_tmp/$name-data" --daemonize no \
        --protected-mode no
    srv=$it_pid
    it_wait_listen "$port" "$srv" && return 0
    it_bad "$name: redis-server did not listen on 127.0.0.1:$port"
    it_stop "$srv" TERM 3
    return 1
}

# round NAME CLIENT-AS
round() {
    local name="$1" cli_as="$2" port srv rc pre=() uid
    [[ "$cli_as" == redis ]] && pre=("${as_redis[@]}")
    start_server "$name" || return
    uid="$(it_child_uids "$srv")"
    [[ "$uid" == "$(id -u redis) " ]]
    it_check $? "$name: redis-server runs as uid $(id -u redis) (redis): uids '$uid'"
    it_run "$name-bench" 30 "${pre[@]}" redis-benchmark -h 127.0.0.1 -p "$port" -q -n 2000 -c 8 \
        -t set,get </dev/null >"$it_tmp/$name-bench.log" 2>&1
    rc=$?
    local n
    n="$(tr '\r' '\n' <"$it_tmp/$name-bench.log" | grep -cE '^(SET|GET): [0-9.]+ requests per second')"
    ((rc == 0 && n == 2))
    it_check $? "$name: redis-benchmark as $cli_as: $(it_status "$rc"), $n of 2 results"
    it_run "$name-cli" 20 "${pre[@]}" redis-cli -h 127.0.0.1 -p "$port" <"$it_tmp/session.in" \
        >"$it_tmp/$name-session.out" 2>"$it_tmp/$name-cli.err"
    rc=$?
    ((rc == 0)) && cmp -s "$it_tmp/session.want" "$it_tmp/$name-session.out"
    it_check $? "$name: redis-cli as $cli_as: $(it_status "$rc"), $(wc -l <"$it_tmp/session.in") commands, replies exact"
    it_stop "$srv" TERM
    it_check "$it_stop_rc" "$name: redis-server ended on SIGTERM: $it_stop_text"
    it_expect_direct "$port" 9 "$name-server"
    it_expect_direct "$port" 8 "$name-bench"
    it_expect_direct "$port" 1 "$name-cli"
}

round as-redis redis
round root-client root

# Seven client processes of another uid in one epoll wait.
many_links() {
    local name=many-links port srv rc bells
    : >"$it_tmp/$name-server.debug"
    chmod 0666 "$it_tmp/$name-server.debug"
    start_server "$name" SDIRECT_LOG=debug "SDIRECT_LOG_FILE=$it_tmp/$name-server.debug" || return
    # Direct from the first byte: the links exist before the benchmark.
    SDIRECT_UPGRADE_AFTER_MS=0 it_start "$name-pingers" 40 "$it_py" "$it_dir/redis_pingers.py" "$port" \
        --count 6 --until "$it_tmp/$name.done"
    local pingers=$it_pid
    sleep 1
    SDIRECT_UPGRADE_AFTER_MS=0 it_run "$name-bench" 30 redis-benchmark -h 127.0.0.1 -p "$port" -q \
        -n 4000 -c 1 -t ping </dev/null >"$it_tmp/$name-bench.log" 2>&1
    rc=$?
    local n
    n="$(tr '\r' '\n' <"$it_tmp/$name-bench.log" | grep -cE '^PING_(INLINE|MBULK): [0-9.]+ requests per second')"
    ((rc == 0 && n == 2))
    it_check $? "$name: redis-benchmark -c 1 beside 6 idle clients: $(it_status "$rc"), $n of 2 results:" \
        "$(tr '\r' '\n' <"$it_tmp/$name-bench.log" | grep -E '^PING.*requests per second' | tr '\n' ' ')"
    touch "$it_tmp/$name.done"
    it_reap "$pingers" 20
    it_check "$it_stop_rc" "$name: redis_pingers.py: $(cat "$it_tmp/$name-pingers.log")"
    it_stop "$srv" TERM
    it_check "$it_stop_rc" "$name: redis-server ended on SIGTERM: $it_stop_text"
    it_expect_direct "$port" 7 "$name-server"
    it_expect_direct "$port" 6 "$name-pingers"
    it_expect_direct "$port" 1 "$name-bench"
    if ((!it_kernel)); then
        bells="$(grep -c 'wake bell .* made and offered' "$it_tmp/$name-server.debug")"
        ((bells >= 1 && bells <= 14))
        it_check $? "$name: the server made $bells wake bells for 7 links (at least 1, at most 14)"
    fi
}
many_links
it_finish
