#!/usr/bin/env bash
# PostgreSQL 15 from Debian and its pgbench, both preloaded, over a
# loopback TCP port:
#   the postmaster accepts each connection, forks a backend and closes its
#   copy; the backend, left as the only holder, must upgrade the connection
#   (the return to direct mode after fork);
#   pgbench initialises (scale 1), runs the select-only script (-S, 2
#   clients) and the TPC-B-like script (4 clients), each for a bounded
#   number of transactions with no failed one; then psql checks TPC-B's
#   invariant: the accounts', tellers' and branches' balances each sum to
#   the history's deltas, so no update was lost or applied twice.
# PostgreSQL refuses to run as root: as root, every PostgreSQL program runs
# as nobody, with a copy of the library and sdirect-run it can read. An
# upgrade needs both ends to be the same user, so the clients run as the
# server's user too.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_preflight
# Each forked server process builds its own engine at its first upgrade;
# on a loaded machine that may take longer than the default wait, and a
# short session would then end on TCP before its late upgrade.
export SDIRECT_ENGINE_WAIT_MS="${SDIRECT_ENGINE_WAIT_MS:-30000}"
it_need pgbench:postgresql psql:postgresql-client setpriv:util-linux
pgbin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
[[ -n "$pgbin" && -x "$pgbin/postgres" && -x "$pgbin/initdb" ]] ||
    it_skip "PostgreSQL server is not installed (Debian package postgresql)"

as=()
if ((EUID == 0)); then
    as=(setpriv --reuid=nobody --regid=nogroup --clear-groups --)
    chmod 755 "$it_tmp"
    chown nobody:nogroup "$it_tmp"
    it_share_tools
fi

data="$it_tmp/pgdata"
if ! (cd "$it_tmp" && timeout 60 "${as[@]}" "$pgbin/initdb" -D "$data" -U postgres -A trust \
    --no-sync -E UTF8 --locale=C) >"$it_tmp/initdb.log" 2>&1; then
    it_bad "initdb failed: $(tail -n 1 "$it_tmp/initdb.log")"
    it_finish
fi
port="$(it_free_port)"
it_start pg-server 70 "${as[@]}" "$pgbin/postgres" -D "$data" -k "$it_tmp" \
    -c listen_addresses=127.0.0.1 -p "$port" -c fsync=off -c synchronous_commit=off \
    -c full_page_writes=off -c max_connections=20 -c autovacuum=off
srv=$it_pid
# Ready once the log says so (a probe connection would count in the stats).
for ((i = 0; i < 600; i++)); do
    grep -q "ready to accept connections" "$it_tmp/pg-server.log" 2>/dev/null && break
    kill -0 "$srv" 2>/dev/null || break
    sleep 0.05
done
if ! grep -q "ready to accept connections" "$it_tmp/pg-server.log" 2>/dev/null ||
    ! it_listening "$port"; then
    it_bad "postgres is not ready on 127.0.0.1:$port"
    it_finish
fi

# pg ROLE SECONDS PROGRAM ARGS...: a client program against the server.
pg() {
    local role="$1" secs="$2" prog="$3"
    shift 3
    it_run "$role" "$secs" "${as[@]}" "$prog" -h 127.0.0.1 -p "$port" -U postgres "$@" \
        </dev/null >"$it_tmp/$role.log" 2>&1
}

# bench ROLE ARGS...: a pgbench run that must end with every transaction
# done and none failed.
bench() {
    local role="$1" rc done failed
    shift
    pg "$role" 40 pgbench -n "$@" postgres
    rc=$?
    done="$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$it_tmp/$role.log")"
    failed="$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$it_tmp/$role.log")"
    if ((rc == 0)) && [[ -n "$done" && "$failed" == 0 ]] && ((done > 0)); then
        it_ok "$role: $done transactions, none failed, $(grep -m1 '^tps' "$it_tmp/$role.log")"
    else
        it_bad "$role: $(it_status "$rc"); processed '${done:-?}', failed '${failed:-?}': $(tail -n 1 "$it_tmp/$role.log")"
    fi
}

pg pgbench-init 60 pgbench -i -s 1 -q postgres
rc=$?
it_check "$rc" "pgbench -i -s 1: $(it_status "$rc"); $(tail -n 1 "$it_tmp/pgbench-init.log")"
bench pgbench-select -S -c 2 -j 2 -t 2000
bench pgbench-tpcb -c 4 -j 2 -t 300

# TPC-B's invariant, and the number of transactions the history holds.
pg psql-check 20 psql -X -A -t -v ON_ERROR_STOP=1 -d postgres -c "
    select (select sum(abalance) from pgbench_accounts) = (select coalesce(sum(delta), 0) from pgbench_history)
       and (select sum(tbalance) from pgbench_tellers) = (select coalesce(sum(delta), 0) from pgbench_history)
       and (select sum(bbalance) from pgbench_branches) = (select coalesce(sum(delta), 0) from pgbench_history),
           (select count(*) from pgbench_history)"
rc=$?
answer="$(tr -d ' \n' <"$it_tmp/psql-check.log")"
if ((rc == 0)) && [[ "$answer" == "t|1200" ]]; then
    it_ok "psql: balances match the 1200 history rows (TPC-B invariant holds)"
else
    it_bad "psql: $(it_status "$rc"); expected 't|1200' (balances = history, 1200 rows), got '$answer'"
fi

# Smart shutdown: the postmaster waits for its backends, then exits.
it_stop "$srv" TERM 20
it_check "$it_stop_rc" "postgres: $it_stop_text"
it_expect_direct "$port" 1 pgbench-init pgbench-select pgbench-tpcb psql-check
# Backends write their connections when they exit; the postmaster has no
# connection of its own (it only accepts and forks).
it_expect_direct "$port" 9 pg-server
it_finish
