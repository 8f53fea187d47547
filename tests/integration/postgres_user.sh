#!/usr/bin/env bash
# PostgreSQL 15 as Debian runs it: the postgres binary under the user
# postgres (pg_ctlcluster, run by root, changes to postgres before it
# starts it; here setpriv stands in, in a data directory of the test's
# own rather than the host's cluster). The postmaster accepts, forks a
# backend per connection and closes its copy. Clients: pgbench (-i -s 1,
# then the select-only script with 2 clients and TPC-B-like with 2, every
# transaction done and none failed) and psql (TPC-B's invariant: the
# balances sum to the history's deltas, and the history holds every
# transaction):
#   as postgres, every setting at its default on both ends;
#   as root, every setting at its default too (two uids).
# Each time every connection must have run direct on both ends.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/private_shm.sh"
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_need pgbench:postgresql psql:postgresql-client setpriv:util-linux
getent passwd postgres >/dev/null || it_skip "user postgres is needed (Debian package postgresql)"
pgbin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
[[ -n "$pgbin" && -x "$pgbin/postgres" && -x "$pgbin/initdb" ]] ||
    it_skip "PostgreSQL server is not installed (Debian package postgresql)"
it_preflight
it_shared_tmp
# Each backend builds its own engine at its first upgrade (see postgres.sh).
export SDIRECT_ENGINE_WAIT_MS="${SDIRECT_ENGINE_WAIT_MS:-30000}"
it_as postgres
as_pg=("${it_as_words[@]}" --)
it_share_tools

# round NAME CLIENT-AS
round() {
    local name="$1" cli_as="$2" port srv rc data pre=() i done failed answer
    data="$it_tmp/$name-data"
    mkdir -p "$data"
    chown postgres "$data"
    chmod 0700 "$data"
    if ! (cd "$it_tmp" && timeout 60 "${as_pg[@]}" "$pgbin/initdb" -D "$data" -U postgres -A trust \
        --no-sync -E UTF8 --locale=C) >"$it_tmp/$name-initdb.log" 2>&1; then
        it_bad "$name: initdb failed: $(tail -n 1 "$it_tmp/$name-initdb.log")"
        return
    fi
    [[ "$cli_as" == postgres ]] && pre=("${as_pg[@]}")
    port="$(it_free_port)"
    it_stats_open "$name-server"
    it_start "$name-server" 80 "${as_pg[@]}" "$pgbin/postgres" -D "$data" -k "$it_tmp" \
        -c listen_addresses=127.0.0.1 -p "$port" -c fsync=off -c synchronous_commit=off \
        -c full_page_writes=off -c max_connections=20 -c autovacuum=off
    srv=$it_pid
    for ((i = 0; i < 600; i++)); do
        grep -q "ready to accept connections" "$it_tmp/$name-server.log" 2>/dev/null && break
        kill -0 "$srv" 2>/dev/null || break
        sleep 0.05
    done
    if ! grep -q "ready to accept connections" "$it_tmp/$name-server.log" 2>/dev/null ||
        ! it_listening "$port"; then
        it_bad "$name: postgres is not ready on 127.0.0.1:$port"
        it_stop "$srv" TERM 5
        return
    fi
    it_run "$name-init" 60 "${pre[@]}" pgbench -h 127.0.0.1 -p "$port" -U postgres -i -s 1 -q postgres \
        </dev/null >"$it_tmp/$name-init.log" 2>&1
    rc=$?
    it_check "$rc" "$name: pgbench -i -s 1 as $cli_as: $(it_status "$rc")"
    local role args
    for role in select tpcb; do
        args=(-S -c 2 -j 2 -t 500)
        [[ "$role" == tpcb ]] && args=(-c 2 -j 2 -t 200)
        it_run "$name-$role" 40 "${pre[@]}" pgbench -h 127.0.0.1 -p "$port" -U postgres -n "${args[@]}" \
            postgres </dev/null >"$it_tmp/$name-$role.log" 2>&1
        rc=$?
        done="$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$it_tmp/$name-$role.log")"
        failed="$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$it_tmp/$name-$role.log")"
        if ((rc == 0)) && [[ -n "$done" && "$failed" == 0 ]] && ((done > 0)); then
            it_ok "$name: pgbench ${args[*]} as $cli_as: $done transactions, none failed"
        else
            it_bad "$name: pgbench ${args[*]} as $cli_as: $(it_status "$rc"); processed '${done:-?}', failed '${failed:-?}'"
        fi
    done
    it_run "$name-psql" 20 "${pre[@]}" psql -h 127.0.0.1 -p "$port" -U postgres -X -A -t \
        -v ON_ERROR_STOP=1 -d postgres -c "
        select (select sum(abalance) from pgbench_accounts) = (select coalesce(sum(delta), 0) from pgbench_history)
           and (select sum(tbalance) from pgbench_tellers) = (select coalesce(sum(delta), 0) from pgbench_history),
               (select count(*) from pgbench_history)" </dev/null >"$it_tmp/$name-psql.log" 2>&1
    rc=$?
    answer="$(tr -d ' \n' <"$it_tmp/$name-psql.log")"
    [[ $rc == 0 && "$answer" == "t|400" ]]
    it_check $? "$name: psql as $cli_as: balances match the history, 400 rows: '$answer'"
    it_stop "$srv" TERM 20
    it_check "$it_stop_rc" "$name: postgres: $it_stop_text"
    it_expect_direct "$port" 1 "$name-init" "$name-select" "$name-tpcb" "$name-psql"
    it_expect_direct "$port" 6 "$name-server"
}

round as-postgres postgres
round root-client root
it_finish
