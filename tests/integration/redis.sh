#!/usr/bin/env bash
# redis-server (epoll event loop) with redis-benchmark (8 connections,
# pipelined and not) and a redis-cli session on the other end:
#   redis-benchmark -q -n 2000 -t set,get  must report both tests,
#   redis-benchmark -P 16 likewise (16 requests per write),
#   a redis-cli session (one connection, commands on stdin) that SETs
#   values of 1 B to 512 KiB, GETs them back, and MSET/MGET/APPEND/STRLEN/
#   DEL, must print exactly the expected replies.
# Then every connection must have run direct.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_need redis-server:redis-server redis-benchmark:redis-tools redis-cli:redis-tools
it_preflight

port="$(it_free_port)"
mkdir -p "$it_tmp/data"
it_start server 60 redis-server --bind 127.0.0.1 --port "$port" --save '' \
    --appendonly no --dir "$it_tmp/data" --daemonize no --protected-mode no
srv=$it_pid
if ! it_wait_listen "$port" "$srv"; then
    it_bad "redis-server did not listen on 127.0.0.1:$port"
    it_finish
fi

# bench NAME ARGS...: both SET and GET report a request rate.
bench() {
    local name="$1" rc verdict ok
    shift
    it_run "bench-$name" 30 redis-benchmark -h 127.0.0.1 -p "$port" -q -n 2000 -c 8 \
        -t set,get "$@" </dev/null >"$it_tmp/bench-$name.log" 2>&1
    rc=$?
    # -q prints progress lines ending in CR, then one line per test.
    verdict="$(tr '\r' '\n' <"$it_tmp/bench-$name.log" | awk '
        match($0, /(SET|GET): [0-9.]+ requests per second/) {
            split(substr($0, RSTART, RLENGTH), w, " ")
            got[w[1]] = w[2]
        }
        END {
            if (!("SET:" in got) || !("GET:" in got)) { print "no SET and GET results"; exit 1 }
            printf "SET %s/s, GET %s/s\n", got["SET:"], got["GET:"]
        }')"
    ok=$?
    ((rc == 0)) || ok=1
    it_check "$ok" "redis-benchmark -n 2000 -c 8${*:+ $*} ($name): $(it_status "$rc"); $verdict"
}
bench plain
bench pipelined -P 16

# The redis-cli session: commands and the replies redis-cli prints for them
# when its output is not a terminal (raw: OK, values, an empty line for nil).
"$it_py" - "$it_tmp/session.in" "$it_tmp/session.want" <<'EOF'
import random, string, sys
rng = random.Random(7)
alphabet = string.ascii_letters + string.digits
cmds, want = [], []
values = {}
for i, size in enumerate([1, 2, 100, 1000, 4096, 65536, 100000, 524288]):
    key = f"it:key:{i}"
    values[key] = "".join(rng.choice(alphabet) for _ in range(size))
    cmds.append(f"SET {key} {values[key]}")
    want.append("OK")
for key in values:
    cmds.append(f"GET {key}")
    want.append(values[key])
cmds.append('SET it:spaced "two words"')
want.append("OK")
cmds.append("GET it:spaced")
want.append("two words")
cmds.append("GET it:missing")
want.append("")
cmds.append("MSET it:a alpha it:b beta")
want.append("OK")
cmds.append("MGET it:a it:b it:missing")
want += ["alpha", "beta", ""]
cmds.append("APPEND it:a -omega")
want.append("11")
cmds.append("GET it:a")
want.append("alpha-omega")
cmds.append("STRLEN it:key:7")
want.append("524288")
cmds.append("DEL it:a it:b it:missing")
want.append("2")
cmds.append("EXISTS it:a")
want.append("0")
open(sys.argv[1], "w").write("\n".join(cmds) + "\n")
open(sys.argv[2], "w").write("\n".join(want) + "\n")
EOF
it_run cli 20 redis-cli -h 127.0.0.1 -p "$port" <"$it_tmp/session.in" \
    >"$it_tmp/session.out" 2>"$it_tmp/cli.err"
rc=$?
if ((rc == 0)) && cmp -s "$it_tmp/session.want" "$it_tmp/session.out"; then
    it_ok "redis-cli session: $(wc -l <"$it_tmp/session.in") commands, replies exactly as expected"
else
    it_bad "redis-cli session: $(it_status "$rc"); replies differ: $(cmp "$it_tmp/session.want" "$it_tmp/session.out" 2>&1 | head -n 1)"
fi

# redis-server shuts down on SIGTERM and exits 0.
it_stop "$srv" TERM
it_check "$it_stop_rc" "redis-server ended on SIGTERM: $it_stop_text"

it_expect_direct "$port" 17 server
it_expect_direct "$port" 8 bench-plain bench-pipelined
it_expect_direct "$port" 1 cli
it_finish
