#!/usr/bin/env bash
# sockperf over TCP with each of its multiplexers (-F epoll, poll, select)
# on both ends: per multiplexer one server and three clients, each a new
# connection: ping-pong with 64 B messages and with 1000..15000 B messages,
# both with --data-integrity (sockperf checks every payload), then
# throughput with 1400 B messages. Each must complete (sockperf exits 0
# even on bad arguments, so its report is what counts). Then every
# connection must have run direct.
#
# sockperf accepts -F only with a feed file (-f) and refuses --tcp next to
# one; a "T:" line in the feed file is what makes the connection TCP.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_need sockperf:sockperf
it_preflight

# check_pp FILE: a ping-pong report with messages answered, none lost,
# duplicated or reordered, and no error.
check_pp() {
    awk '
        /\[Valid Duration\]/ {
            for (i = 1; i <= NF; i++) if ($i ~ /^ReceivedMessages=/) { got = $i; sub(/.*=/, "", got) }
        }
        /# dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0/ { clean = 1 }
        /ERROR|[Ff]ail|integrity.*(error|mismatch)/ { bad = $0 }
        END {
            if (bad != "") { print "error: " bad; exit 1 }
            if (got + 0 <= 0) { print "no ping-pong report"; exit 1 }
            if (!clean) { print "messages dropped, duplicated or reordered"; exit 1 }
            printf "%d round trips\n", got
        }' "$1"
}

# check_tp FILE: a throughput report with messages sent.
check_tp() {
    awk '
        /Total of [0-9]+ messages sent/ { for (i = 1; i <= NF; i++) if ($i == "of") sent = $(i + 1) }
        /BandWidth is/ { bw = $0; sub(/.*BandWidth is /, "", bw) }
        /ERROR|[Ff]ail/ { bad = $0 }
        END {
            if (bad != "") { print "error: " bad; exit 1 }
            if (sent + 0 <= 0 || bw == "") { print "no throughput report"; exit 1 }
            printf "%d messages, %s\n", sent, bw
        }' "$1"
}

# client MUX NAME CHECK ARGS...
client() {
    local mux="$1" name="$2" check="$3" rc verdict
    shift 3
    it_run "client-$mux-$name" 15 sockperf "$@" -f "$feed" -F "$mux" -t 1 \
        >"$it_tmp/client-$mux-$name.log" 2>&1
    rc=$?
    if verdict="$("$check" "$it_tmp/client-$mux-$name.log")" && ((rc == 0)); then
        it_ok "sockperf $1 -F $mux ${*:2}: $verdict"
    else
        it_bad "sockperf $1 -F $mux ${*:2}: $(it_status "$rc"); $verdict"
    fi
}

for mux in epoll poll select; do
    port="$(it_free_port)"
    feed="$it_tmp/feed-$mux"
    echo "T:127.0.0.1:$port" >"$feed"
    it_start "server-$mux" 40 sockperf server -f "$feed" -F "$mux"
    srv=$it_pid
    if ! it_wait_listen "$port" "$srv"; then
        it_bad "sockperf server -F $mux did not listen on 127.0.0.1:$port"
        it_stop "$srv" INT 3
        continue
    fi
    # --mps: sockperf sizes its table of send times for 600k messages/s
    # unless told more, and fails ("_seqN > m_maxSequenceNo") when the
    # ping-pong is faster than that, as it can be direct.
    client "$mux" pp64 check_pp ping-pong -m 64 --data-integrity --mps 2000000
    client "$mux" ppmix check_pp ping-pong -m 8000 -r 7000 --data-integrity --mps 2000000
    client "$mux" tp check_tp throughput -m 1400
    # sockperf ends through exit() on SIGINT (SIGTERM kills it outright).
    it_stop "$srv" INT
    it_check "$it_stop_rc" "sockperf server -F $mux ended on SIGINT: $it_stop_text"
    it_expect_direct "$port" 3 "server-$mux"
    it_expect_direct "$port" 1 "client-$mux-pp64" "client-$mux-ppmix" "client-$mux-tp"
done
it_finish
