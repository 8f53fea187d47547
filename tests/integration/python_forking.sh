#!/usr/bin/env bash
# Debian's python3 on both ends, with this directory's fork_echo.py:
#   server: socketserver.ForkingTCPServer, the accept -> fork -> parent
#   closes its copy -> child serves pattern of PostgreSQL's postmaster;
#   each child echoes until EOF;
#   client: 6 connections one after another (as pgbench connects), each
#   200 ping-pong round trips of 1 to 64 B, then 1 B, 1000 B, 100 kB or
#   3 MiB written in random pieces while a thread reads the echo,
#   half-close, echo compared byte for byte.
# The server exits by itself once its 6 children have ended, all with
# status 0. A socket that went through fork is never upgraded (the return
# to direct mode when one holder is left is not built yet): every
# connection must have stayed on TCP, all its bytes on the kernel socket.
# Checked on the client only, as the children end with os._exit and write
# no stats.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_preflight

conns=6
port="$(it_free_port)"
it_start forking-server 50 "$it_py" "$it_dir/fork_echo.py" server --port "$port" --clients "$conns"
srv=$it_pid
if ! it_wait_listen "$port" "$srv"; then
    it_bad "fork_echo.py server did not listen on 127.0.0.1:$port"
    it_stop "$srv" TERM 3
    it_finish
fi
it_run forking-client 30 "$it_py" "$it_dir/fork_echo.py" client --port "$port" --conns "$conns" \
    --rounds 200 --sizes 1,1000,100000,3145728 </dev/null >"$it_tmp/forking-client.log" 2>&1
rc=$?
it_check "$rc" "client: $(it_status "$rc"); $(tail -n 1 "$it_tmp/forking-client.log")"
if it_reap "$srv" 10; then
    it_check "$it_stop_rc" "server: $it_stop_text; $(tail -n 1 "$it_tmp/forking-server.log")"
else
    it_bad "server: still running 10 s after its client ended; $(tail -n 1 "$it_tmp/forking-server.log")"
fi
# Every connection moves bytes, so none is idle: all must be counted.
if ((it_kernel)); then
    it_log "mode check skipped (SDIRECT_IT_KERNEL=1)"
else
    read -r total direct kernel shared idle txf txk why \
        < <(it_stats_summary "$it_tmp/forking-client.stats" "$port")
    text="forking-client: $total connections (direct $direct, kernel $kernel), tx_fabric $txf B, tx_kernel $txk B"
    if ((total == conns && kernel == conns && txf == 0)); then
        it_ok "$text: all on TCP, as a socket shared by fork stays"
    else
        it_bad "$text; expected $conns connections on TCP, nothing on the fabric"
    fi
fi
it_finish
