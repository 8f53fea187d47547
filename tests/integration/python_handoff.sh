#!/usr/bin/env bash
# Debian's python3 on both ends, with this directory's fork_echo.py: the
# accepting process echoes the first messages of each connection itself
# (so the connection is direct), then hands the connection over to
#   handoff  a forked child that echoes the rest (its first use of the
#            inherited direct socket moves the connection back to the
#            kernel: the parent ends its fabric stream, returns the bytes
#            it had not read, and the client writes them into the kernel);
#   bulk     the same, with the hand-over at the start of the client's
#            bulk part: bytes in flight both ways when the fabric is left;
#   shared   the same, with the parent keeping its copy 0.1 s while bulk
#            comes in pieces 20 ms apart: the child, alone, upgrades again
#            mid-stream;
#   exec     a forked child that puts the socket on its stdin and stdout
#            and execs cat without the library;
#   spawn    cat without the library, started by subprocess (vfork + exec);
#   posix_spawn  the same by os.posix_spawn, the socket dup2'ed onto cat's
#            stdin and stdout by file actions (it keeps FD_CLOEXEC itself);
#   system   cat without the library, started by os.system.
# The client (fork_echo.py client) checks every echo byte for byte: 200
# ping-pong round trips of 1 to 64 B, then 1000 B, 100 kB or 3 MiB of bulk
# read back by a thread. With the library, each of the client's
# connections must have upgraded to direct (its log says so) and gone
# back to the kernel; then, where a process running the library is its
# only holder left (handoff, bulk, shared), direct again; where cat has
# it, on the kernel with the reason the server's side gave (shared:
# another process used it, or its owner closed it while another held it;
# exec: moved before an exec).
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_preflight
export SDIRECT_ENGINE_WAIT_MS="${SDIRECT_ENGINE_WAIT_MS:-30000}"

conns=3

# phase NAME ROLE END SERVER-OPTIONS SIZES PACE [LATE]: END is "direct" or
# the reasons (a regex) the connections stay on the kernel with. LATE=1:
# the client reads each upgrade's commit 0.1 s late (SDIRECT_COMMIT_PAUSE_US;
# the server initiates), so the server's leave at its hand-over comes
# first; each connection must still go direct (the commit read) and then
# say why it went back, its own sends all on the kernel meanwhile.
phase() {
    local name=$1 role=$2 end=$3 option=$4 sizes=$5 pace=$6 late=${7:-0}
    local total direct kernel shared idle txf txk why text back upgraded
    local pause=0
    ((late)) && pause=100000
    SDIRECT_COMMIT_PAUSE_US=$pause SDIRECT_LOG=info it_py_pair "$name" fork_echo.py "$role" \
        --clients "$conns" $option \
        -- --conns "$conns" --rounds 200 --sizes "$sizes" --pace "$pace" || return
    if ((it_kernel)); then
        it_log "$name: mode check skipped (SDIRECT_IT_KERNEL=1)"
        return
    fi
    read -r total direct kernel shared idle txf txk why \
        < <(it_stats_summary "$it_tmp/$name-client.stats" "$it_pair_port")
    # The client's own account of each upgrade and leave (SDIRECT_LOG=info).
    back=$(grep -c "back in kernel mode" "$it_tmp/$name-client.log" || true)
    upgraded=$(grep -c "upgraded to direct" "$it_tmp/$name-client.log" || true)
    text="$name client: $total connections (direct $direct, kernel $kernel: $why), tx_fabric $txf B, tx_kernel $txk B; $upgraded upgrades, $back rearmed"
    local one="kernel/($end)x[0-9]+"
    if [[ $end == direct ]]; then
        if ((total == conns && direct == conns && back == conns)); then
            it_ok "$text: direct, then the kernel while shared, then direct again"
        else
            it_bad "$text; expected $conns connections back in kernel mode once, then direct"
        fi
    # Direct first is counted by each connection's "upgraded to direct", not
    # by tx_fabric: the server can echo the first messages on the fabric and
    # hand over before any of the client's sends after its commit, so the
    # client may send nothing on the fabric.
    elif ((total == conns && kernel == conns && upgraded == conns)) && [[ "$why" =~ ^$one(,$one)*$ ]]; then
        if ((late)); then
            it_ok "$text: direct once its commit was read, then on the kernel for the peer's reason"
        else
            it_ok "$text: direct first, then on the kernel"
        fi
    else
        it_bad "$text; expected $conns connections upgraded to direct first, then kernel/$end"
    fi
}

phase handoff handoff direct "--handoff-after=50" 1000,100000,3145728 0
phase bulk handoff direct "--handoff-after=200" 3145728,2000000 0.01
phase shared handoff direct "--handoff-after=50 --close-delay=0.1" 3145728,2000000 0.02
# The child's exec and the parent's close race to move it (either is right).
phase exec exec "shared|exec" "--handoff-after=50" 1000,100000,3145728 0
phase spawn spawn exec "--handoff-after=50" 1000,100000,3145728 0
phase posix_spawn posix_spawn exec "--handoff-after=50" 1000,100000,3145728 0
phase system system exec "--handoff-after=50" 1000,100000,3145728 0
phase posix_spawn-late posix_spawn exec "--handoff-after=50" 1000,100000 0 1
it_finish
