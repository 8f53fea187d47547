#!/usr/bin/env bash
# Debian's socat as an echo server through EXEC: (the way it runs a
# program for each connection): `socat TCP-LISTEN:P,fork EXEC:cat`. For
# each connection the listener forks a child that holds the connection;
# that child forks again and the grandchild execs cat on a socketpair (the
# TCP socket is close-on-exec: cat never has it), and the child relays
# between the two. Against it, this directory's fork_echo.py client (every
# end preloaded): 3 connections one after another, 200 ping-pong round
# trips of 1 to 64 B, then 1000 B to 3 MiB of bulk read back by a thread,
# every echo byte compared.
# With the library, the relaying child must be direct with the client once
# the exec is done: the grandchild's holder entry goes at its exec (its new
# program does not inherit the socket) and the child, alone, upgrades. So
# every connection of the client ends direct with bytes on the fabric, and
# the socat children recorded their connection direct too.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_need socat:socat cat:coreutils
it_preflight
export SDIRECT_ENGINE_WAIT_MS="${SDIRECT_ENGINE_WAIT_MS:-30000}"

conns=3
port="$(it_free_port)"
it_start socat 60 socat "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr,fork" EXEC:cat
srv=$it_pid
if ! it_wait_listen "$port" "$srv"; then
    it_bad "socat did not listen on 127.0.0.1:$port: $(tail -n 1 "$it_tmp/socat.log")"
    it_stop "$srv" TERM 3
    it_finish
fi

it_run client 40 "$it_py" "$it_dir/fork_echo.py" client --port "$port" --conns "$conns" \
    --rounds 200 --sizes 1000,100000,3145728 </dev/null >"$it_tmp/client.log" 2>&1
rc=$?
it_check "$rc" "client: $(it_status "$rc"); $(tail -n 1 "$it_tmp/client.log")"

# The children end once their connection does; the listener on SIGTERM.
sleep 0.5
it_stop "$srv" TERM
if ((it_stop_rc == 0 || it_stop_rc == 143)); then
    it_ok "socat listener ended on SIGTERM: $it_stop_text"
else
    it_bad "socat listener: $it_stop_text"
fi

if ((it_kernel)); then
    it_log "mode check skipped (SDIRECT_IT_KERNEL=1)"
else
    it_expect_direct "$port" "$conns" client
    # The relaying children's lines (socat, one per connection).
    direct=$(awk -v p=":$port " '/ comm=socat / && index($0, "local=127.0.0.1" p) &&
        / mode=direct / && !/ tx_fabric=0 /' "$it_tmp/socat.stats" 2>/dev/null | wc -l)
    if ((direct == conns)); then
        it_ok "socat: $direct relaying children recorded their connection direct"
    else
        it_bad "socat: $direct relaying children recorded a direct connection, expected $conns: $(grep -m1 "local=127.0.0.1:$port " "$it_tmp/socat.stats" 2>/dev/null | cut -c 1-200)"
    fi
fi
it_finish
