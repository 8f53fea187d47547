#!/usr/bin/env bash
# Debian's python3 on both ends, with this directory's echo programs:
#   echo_selectors.py with selectors.EpollSelector, PollSelector and
#   SelectSelector in turn (non-blocking sockets, 4 connections at once of
#   0 B, 1 B, 100 kB and 3 MiB, half-close, echo compared byte for byte);
#   echo_asyncio.py: asyncio streams (readexactly, drain, write_eof),
#   4 connections at once, 100 ping-pong frames of 0 B to 1 MiB and 64
#   pipelined frames each, every echo compared.
# Each server exits by itself once its clients are done. Then every
# connection must have run direct.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_preflight

# pair NAME PROGRAM MIN SERVER-ARGS -- CLIENT-ARGS: runs PROGRAM server and
# client on a free port; both must exit 0, and at least MIN connections,
# all direct.
# The selectors client writes each connection's bytes in chunks of up to
# 256 KiB as fast as the kernel takes them: 3 MiB can be in the loopback
# socket's buffers within a millisecond or two, before the upgrade
# commits (most of it is, every run: 1.9-2.9 MB on TCP, the rest on the
# fabric). So the client's connections must carry bytes on the fabric one
# way or the other (the server's echo after its switch point is), not
# necessarily its own sends.
pair() {
    local name="$1" prog="$2" min="$3"
    shift 3
    it_py_pair "$name" "$prog" server "$@" || return
    it_expect_direct "$it_pair_port" "$min" "$name-server"
    IT_FABRIC_EITHER=1 it_expect_direct "$it_pair_port" "$min" "$name-client"
}

for sel in epoll poll select; do
    # The 0 B connection (connect, shutdown, EOF) moves nothing and may
    # close before an upgrade: idle, not counted.
    pair "selectors-$sel" echo_selectors.py 3 --selector "$sel" --clients 4 \
        -- --selector "$sel" --sizes 0,1,100000,3145728
done
pair asyncio echo_asyncio.py 4 --clients 4 -- --conns 4 --rounds 100
it_finish
