#!/usr/bin/env bash
# Debian's python3 on both ends, with this directory's fork_echo.py:
#   server: socketserver.ForkingTCPServer, the accept -> fork -> parent
#   closes its copy -> child serves pattern of PostgreSQL's postmaster;
#   each child echoes until EOF;
#   client: 6 connections one after another (as pgbench connects), each
#   200 ping-pong round trips of 1 to 64 B, then 1 B, 1000 B, 100 kB or
#   3 MiB written in random pieces while a thread reads the echo,
#   half-close, echo compared byte for byte;
#   then again with the parent keeping its copy 0.1 s, the client sending
#   bulk at once in paced pieces, so that the child becomes the only holder
#   mid-stream.
#   then the accepting process serves itself while a forked child holds a
#   copy until it is SIGKILLed (not reaped until the end).
# The server exits by itself once its 6 children have ended, all with
# status 0. Once the parent has closed its copy, the child is the only
# holder and upgrades the connection (the return to direct mode): every
# connection must end direct, with bytes on the fabric. Checked on the
# client only, as the children end with os._exit and write no stats.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_preflight
# Each forked server process builds its own engine at its first upgrade;
# on a loaded machine that may take longer than the default wait, and a
# short session would then end on TCP before its late upgrade.
export SDIRECT_ENGINE_WAIT_MS="${SDIRECT_ENGINE_WAIT_MS:-30000}"

conns=6

# phase NAME SERVER-ROLE SERVER-OPTION ROUNDS SIZES PACE: one server, one
# client, checked.
phase() {
    local name=$1 role=$2 option=$3 rounds=$4 sizes=$5 pace=$6
    local port total direct kernel shared idle txf txk why text
    it_py_pair "$name" fork_echo.py "$role" --clients "$conns" $option \
        -- --conns "$conns" --rounds "$rounds" --sizes "$sizes" --pace "$pace" || return
    port=$it_pair_port
    # Every connection moves bytes, so none is idle: all must be counted.
    if ((it_kernel)); then
        it_log "$name: mode check skipped (SDIRECT_IT_KERNEL=1)"
        return
    fi
    read -r total direct kernel shared idle txf txk why \
        < <(it_stats_summary "$it_tmp/$name-client.stats" "$port")
    text="$name client: $total connections (direct $direct, kernel $kernel), tx_fabric $txf B, tx_kernel $txk B"
    if ((total == conns && direct == conns && txf > 0)); then
        it_ok "$text: all direct once the child was their only holder"
    else
        it_bad "$text; expected $conns direct connections with bytes on the fabric ($why)"
    fi
}

# The parent closes its copy at once: the child upgrades at its first I/O.
phase forking server --close-delay=0 200 1,1000,100000,3145728 0
# The parent keeps its copy 0.1 s while the child echoes bulk sent in
# pieces 20 ms apart (0.3 to 0.5 s in all): the child upgrades mid-stream,
# with bytes in flight each way.
phase late server --close-delay=0.1 0 3145728,2000000 0.02
# The accepting process serves, while a child it forked holds a copy
# until SIGKILLed after 0.1 s: the server returns to direct mode once it
# sees the child dead (a zombie until the end).
phase killed keeper --kill-after=0.1 0 3145728,2000000 0.02
it_finish
