#!/usr/bin/env bash
# Debian's python3 on both ends, with this directory's fork_echo.py: the
# accepting process hands each connection to a forked child that puts the
# socket on its stdin and stdout and execs python3 again as the handler
# (fork_echo.py stdio_echo, with the environment as it is, so the library
# runs in it too when preloaded); the parent closes its copy.
#   fresh   the hand-over before any I/O (ForkingTCPServer's pattern with
#           an exec'd handler, as inetd): the handler's image adopts the
#           connection and upgrades it;
#   direct  the parent first echoes 50 messages itself (the connection is
#           direct by then): at the child's exec the parent's connection
#           leaves the fabric for sharing, the client's end waits in kernel
#           mode, and the handler's image upgrades it again;
#   bulk    the same with the hand-over at the start of the client's bulk
#           part (bytes in flight both ways when the fabric is left);
#   stdio-off  as direct, with SDIRECT_EXEC_STDIO=0 (the other phases
#           leave it at its default, 1): a socket on fd 0-2 is not handed
#           over, and stays on TCP.
# The client (fork_echo.py client) checks every echo byte for byte: 200
# ping-pong round trips of 1 to 64 B, then 1000 B to 3 MiB of bulk read
# back by a thread. With the library, every connection of the client must
# end direct with bytes on the fabric, after the exec (direct, bulk: its
# log says it came back to kernel mode once per connection, and it
# upgraded twice), and every handler's connection (server stats) direct.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_preflight
export SDIRECT_ENGINE_WAIT_MS="${SDIRECT_ENGINE_WAIT_MS:-30000}"

conns=3

# phase NAME HANDOFF-AFTER SIZES PACE [STDIO]: STDIO is SDIRECT_EXEC_STDIO
# for the server (default 1, the library's own default: fds 0/1 are
# adopted).
phase() {
    local name=$1 after=$2 sizes=$3 pace=$4 stdio=${5:-1}
    local total direct kernel shared idle txf txk why text back ups handlers
    SDIRECT_EXEC_STDIO=$stdio SDIRECT_LOG=info it_py_pair "$name" fork_echo.py exec_self \
        --clients "$conns" --handoff-after="$after" \
        -- --conns "$conns" --rounds 200 --sizes "$sizes" --pace "$pace" || return
    if ((it_kernel)); then
        it_log "$name: mode check skipped (SDIRECT_IT_KERNEL=1)"
        return
    fi
    read -r total direct kernel shared idle txf txk why \
        < <(it_stats_summary "$it_tmp/$name-client.stats" "$it_pair_port")
    back=$(grep -c "back in kernel mode" "$it_tmp/$name-client.log" || true)
    ups=$(it_stats_sum "$it_tmp/$name-client.stats" "$it_pair_port" upgrades)
    text="$name client: $total connections (direct $direct, kernel $kernel: $why), tx_fabric $txf B, tx_kernel $txk B; $ups upgrades, $back rearmed"
    if ((stdio == 0)); then
        # Not handed over (the socket is on fd 0/1 of the handler): the
        # client's end went back to the kernel for good at the exec.
        if ((total == conns && kernel == conns)) && [[ "$why" =~ ^kernel/(exec|shared|peer_kernel)x[0-9]+(,kernel/(exec|shared|peer_kernel)x[0-9]+)*$ ]]; then
            it_ok "$text: on TCP, byte-exact (fds 0-2 not adopted with SDIRECT_EXEC_STDIO=0)"
        else
            it_bad "$text; expected $conns connections on the kernel, reason exec, shared (the parent closed its copy first) or peer_kernel"
        fi
        return
    fi
    if ((after == 0)); then
        if ((total == conns && direct == conns && txf > 0)); then
            it_ok "$text: direct with the exec'd handler"
        else
            it_bad "$text; expected $conns direct connections with bytes on the fabric"
        fi
    elif ((total == conns && direct == conns && txf > 0 && back == conns && ups == 2 * conns)); then
        it_ok "$text: direct, back to the kernel for the exec, direct again with the handler"
    else
        it_bad "$text; expected $conns connections direct again after the exec ($((2 * conns)) upgrades, $conns rearmed)"
    fi
    # The handlers' own lines (the exec'd images): direct, fabric bytes.
    handlers=$(awk -v port=":$it_pair_port" '$0 ~ /comm=python3/ && index($0, "local=127.0.0.1" port " ") &&
        / mode=direct / && !/ tx_fabric=0 /' "$it_tmp/$name-server.stats" 2>/dev/null | wc -l)
    if ((handlers == conns)); then
        it_ok "$name: $handlers handler images recorded their connection direct"
    else
        it_bad "$name: $handlers handler images recorded a direct connection, expected $conns"
    fi
}

phase fresh 0 1000,100000,3145728 0
phase direct 50 1000,100000,3145728 0
phase bulk 200 3145728,2000000 0.01
phase stdio-off 50 1000,100000,3145728 0 0
it_finish
