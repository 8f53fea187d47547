# shellcheck shell=bash
# TCP port helpers shared by the benchmarks (benchmarks/lib.sh) and
# scripts/netpipe_integrity.sh (sourced, not run; defines functions only).

# wait_listen PORT PID: waits (at most 5 s) until something listens on TCP
# PORT while PID lives.
wait_listen() {
    local i
    for ((i = 0; i < 100; i++)); do
        ss -Htln "sport = :$1" 2>/dev/null | grep -q . && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# port_in_use PORT: some socket (listening, connected or in TIME-WAIT) has
# PORT as its local port, so a server could not bind it; ports of the
# benchmarks' ranges can also be other connections' ephemeral ports.
port_in_use() {
    ss -Htan "sport = :$1" 2>/dev/null | grep -q .
}

# free_port_from PORT MAX: prints the first port from PORT on that no
# socket uses, looking at most MAX ports further (then the last one looked
# at).
free_port_from() {
    local p="$1" i
    for ((i = 0; i < $2; i++)); do
        port_in_use "$p" || break
        p=$((p + 1))
    done
    echo "$p"
}
