#!/usr/bin/env bash
# PostgreSQL as Debian's own tooling runs it: a cluster of the test's own
# made by pg_createcluster (named sdtest<pid>, data directory in the
# test's folder, a free port, listen_addresses 127.0.0.1, start.conf
# manual, trust for postgres from 127.0.0.1 in its pg_hba.conf) and
# started by root with pg_ctlcluster, which becomes postgres itself. The
# library is given the way a user gives it: LD_PRELOAD and the SDIRECT_*
# settings in the cluster's environment file
# (/etc/postgresql/VERSION/NAME/environment), the only environment
# pg_ctlcluster gives the server. --skip-systemctl-redirect, as systemd's
# postgresql@.service passes it, keeps the server in this script's mount
# namespace (its private /dev/shm) on a host where systemd runs.
# Checks:
#   the postmaster and every child of it, the client backends of a
#   pgbench run among them, run as postgres with libsdirect.so mapped
#   (kernel mode: none has it mapped);
#   clients as root over TCP: pgbench -i, pgbench -S -T 3 -c 2 (done,
#   none failed), psql (the accounts' count, the server's address, port
#   and user);
#   bytea rows of 0 B to 1 MiB (random bytes, and one of every byte
#   value) sent raw by psql's \copy in binary COPY format: the server's
#   length and md5 of each are those computed here, and the rows read
#   back by \copy in binary format are the file sent, byte for byte;
#   pg_ctlcluster stop ends the server, pg_dropcluster removes the
#   cluster, and the host's other clusters are as they were.
# Every connection must run direct on both ends (the server's stats file,
# named in the environment file, and every client's), the rows' bytes
# over the fabric; root and postgres are two uids, so the server sends
# everything inline through the message queues between users. In kernel
# mode (nothing preloaded) the same checks of the results, and no
# process may have written stats. The cluster is dropped however the
# script ends (EXIT trap).
private_shm_why="creates, starts and drops a PostgreSQL cluster with pg_createcluster and pg_ctlcluster"
private_shm_users=postgres
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/private_shm.sh"
# Making the cluster (initdb) and pg_ctlcluster's own readiness probes
# take a good part of a minute on a loaded host.
export SDIRECT_IT_BUDGET="${SDIRECT_IT_BUDGET:-150}"
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_need pg_createcluster:postgresql-common pg_ctlcluster:postgresql-common \
    pg_dropcluster:postgresql-common pg_lsclusters:postgresql-common \
    pgbench:postgresql psql:postgresql-client
ver="$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n 1)"
[[ -n "$ver" && -x "/usr/lib/postgresql/$ver/bin/postgres" ]] ||
    it_skip "PostgreSQL server is not installed (Debian package postgresql)"
it_preflight
it_shared_tmp
# Each backend builds its own engine at its first upgrade (see postgres.sh).
export SDIRECT_ENGINE_WAIT_MS="${SDIRECT_ENGINE_WAIT_MS:-30000}"
it_share_tools

name="sdtest$$"
conf="/etc/postgresql/$ver/$name"
data="$it_tmp/data"
pg_uid="$(id -u postgres)"
[[ -e "$conf" ]] && { it_bad "cluster $ver/$name exists already; left alone"; it_finish; }

# clusters: the host's clusters other than ours, "version name port" each.
clusters() {
    timeout 20 pg_lsclusters -h 2>/dev/null | awk -v n="$name" '$2 != n { print $1, $2, $3 }' | sort
}

# drop_cluster: drops the cluster if this script made it (stopping it
# first, at once if it does not stop); status 0 if its folder in
# /etc/postgresql is gone.
made=0
drop_cluster() {
    ((made)) || return 0
    # pg_dropcluster removes the files it made; this one is ours.
    rm -f "$conf/conf.d/sdirect-test.conf"
    timeout 60 pg_dropcluster --stop "$ver" "$name" >>"$it_tmp/dropcluster.log" 2>&1
    if [[ -e "$conf" ]]; then
        timeout 30 pg_ctlcluster --skip-systemctl-redirect -m immediate "$ver" "$name" stop \
            >>"$it_tmp/dropcluster.log" 2>&1
        timeout 30 pg_dropcluster "$ver" "$name" >>"$it_tmp/dropcluster.log" 2>&1
    fi
    [[ -e "$conf" ]] && return 1
    made=0
}
on_exit() {
    drop_cluster || echo "$it_name: could not drop cluster $ver/$name (pg_lsclusters; pg_dropcluster --stop $ver $name)" >&2
    it_cleanup
}
trap on_exit EXIT

# mapped PID: PID has libsdirect.so mapped.
mapped() {
    grep -q 'libsdirect\.so' "/proc/$1/maps" 2>/dev/null
}

# check_procs WHAT PID...: each PID runs as postgres and has the library
# mapped (kernel mode: has it not).
check_procs() {
    local what="$1" pid bad=() uid
    shift
    for pid in "$@"; do
        uid="$(awk '/^Uid:/ { print $2 }' "/proc/$pid/status" 2>/dev/null)"
        if [[ "$uid" != "$pg_uid" ]]; then
            bad+=("$pid:uid=${uid:-gone}")
        elif ((it_kernel)) && mapped "$pid"; then
            bad+=("$pid:mapped")
        elif ((!it_kernel)) && ! mapped "$pid"; then
            bad+=("$pid:not-mapped")
        fi
    done
    local text="$what: $# process(es) ($*) run as postgres (uid $pg_uid), libsdirect.so mapped"
    ((it_kernel)) && text="$what: $# process(es) ($*) run as postgres (uid $pg_uid), no libsdirect.so mapped (kernel mode)"
    ((${#bad[@]} == 0)) || text+="; not so: ${bad[*]}"
    (($# > 0 && ${#bad[@]} == 0))
    it_check $? "$text"
}

read -r nrows nbytes < <("$it_py" "$it_dir/pg_blobs.py" "$it_tmp")
[[ "$nrows" =~ ^[0-9]+$ ]] || { it_bad "pg_blobs.py wrote no rows"; it_finish; }
chmod a+r "$it_tmp"/blobs.*

host_before="$(clusters)"
port="$(it_free_port)"
made=1
if ! timeout "$(it_secs 90)" pg_createcluster --start-conf=manual --datadir="$data" \
    --logfile="$it_tmp/cluster.log" --port="$port" --locale=C.UTF-8 \
    "$ver" "$name" -- --no-sync </dev/null >"$it_tmp/createcluster.log" 2>&1 ||
    [[ ! -f "$conf/environment" ]]; then
    it_bad "pg_createcluster $ver $name failed: $(tail -n 1 "$it_tmp/createcluster.log")"
    it_finish
fi
it_ok "pg_createcluster $ver $name: port $port, data $data"

# The server's settings in a file of conf.d (postgresql.conf includes the
# folder), its clients in pg_hba.conf.
mkdir -p "$conf/conf.d"
cat >"$conf/conf.d/sdirect-test.conf" <<EOF
listen_addresses = '127.0.0.1'
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
cat >"$conf/pg_hba.conf" <<EOF
# TYPE  DATABASE  USER      ADDRESS       METHOD
local   all       postgres                peer
host    all       postgres  127.0.0.1/32  trust
EOF

# The environment file: pg_ctlcluster starts the server with these
# variables (and LANG) only. Every SDIRECT_* setting this script runs with
# goes there, as lib.sh gives them to the programs it starts.
it_stats_open server
: >>"$it_tmp/server-sdirect.log"
chmod 0666 "$it_tmp/server-sdirect.log"
{
    echo "# environment variables for postgres processes (postgresql.conf syntax)"
    ((it_kernel)) || echo "LD_PRELOAD = '$SDIRECT_LIB'"
    echo "SDIRECT_STATS_FILE = '$it_tmp/server.stats'"
    echo "SDIRECT_LOG = 'info'"
    echo "SDIRECT_LOG_FILE = '$it_tmp/server-sdirect.log'"
    while IFS='=' read -r key value; do
        [[ "$key" =~ ^SDIRECT_(IT_|LIB$|STATS_FILE$|LOG$|LOG_FILE$) ]] && continue
        [[ "$value" == *"'"* ]] && continue
        echo "$key = '$value'"
    done < <(env | grep '^SDIRECT_[A-Z0-9_]*=')
} >"$conf/environment"
cp "$conf/environment" "$it_tmp/environment"

if ! timeout "$(it_secs 90)" pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start \
    </dev/null >"$it_tmp/ctlcluster-start.log" 2>&1; then
    it_bad "pg_ctlcluster $ver $name start failed: $(tail -n 2 "$it_tmp/ctlcluster-start.log" | tr '\n' ' ')"
    cp "$it_tmp/cluster.log" "$it_tmp/postgresql.log" 2>/dev/null
    it_finish
fi
pm="$(head -n 1 "$data/postmaster.pid" 2>/dev/null)"
if [[ ! "$pm" =~ ^[0-9]+$ ]] || ! kill -0 "$pm" 2>/dev/null || ! it_listening "$port"; then
    it_bad "pg_ctlcluster start: no postmaster listening on 127.0.0.1:$port (postmaster.pid: '${pm:-}')"
    it_finish
fi
it_ok "pg_ctlcluster $ver $name start: postmaster $pm listens on 127.0.0.1:$port"
check_procs "postmaster" "$pm"
# shellcheck disable=SC2046
check_procs "postmaster's children (checkpointer, writers, launchers)" $(ps -o pid= --ppid "$pm")

pg=(-h 127.0.0.1 -p "$port" -U postgres)
psql=(psql "${pg[@]}" -X -A -t -v ON_ERROR_STOP=1 -d postgres)

it_run init 60 pgbench "${pg[@]}" -i -q postgres </dev/null >"$it_tmp/init.log" 2>&1
rc=$?
it_check "$rc" "pgbench -i as root: $(it_status "$rc")"

# The select-only run in the background, to look at its backends.
it_start select 40 pgbench "${pg[@]}" -S -T 3 -c 2 postgres
bench=$it_pid
backends=()
for ((i = 0; i < 60; i++)); do
    mapfile -t backends < <(ps -o pid=,args= --ppid "$pm" | awk '/127\.0\.0\.1\(/ { print $1 }')
    ((${#backends[@]} >= 2)) && break
    kill -0 "$bench" 2>/dev/null || break
    sleep 0.05
done
check_procs "client backends of pgbench -S" "${backends[@]}"
if it_reap "$bench" 30; then
    rc=$it_stop_rc
    processed="$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$it_tmp/select.log")"
    failed="$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$it_tmp/select.log")"
    ((rc == 0)) && [[ -n "$processed" && "$failed" == 0 ]] && ((processed > 0))
    it_check $? "pgbench -S -T 3 -c 2 as root: $(it_status "$rc"); processed '${processed:-?}', failed '${failed:-?}'"
else
    it_bad "pgbench -S -T 3 -c 2 as root: still running 30 s on"
fi

it_run psql 20 "${psql[@]}" -c "select (select count(*) from pgbench_accounts), inet_server_addr(),
    inet_server_port(), current_user, coalesce((select ssl from pg_stat_ssl where pid = pg_backend_pid()), false)" \
    </dev/null >"$it_tmp/psql.log" 2>&1
rc=$?
answer="$(tr -d ' \n' <"$it_tmp/psql.log")"
[[ $rc == 0 && "$answer" =~ ^100000\|127\.0\.0\.1\|$port\|postgres\|[tf]$ ]]
it_check $? "psql as root: accounts, server address, port, user, ssl: '$answer'"

it_run insert 40 "${psql[@]}" -c "create table blobs (id int primary key, b bytea)" \
    -c "\\copy blobs (id, b) from '$it_tmp/blobs.copy' with (format binary)" \
    </dev/null >"$it_tmp/insert.log" 2>&1
rc=$?
it_check "$rc" "$nrows bytea rows of $nbytes B in all sent by \\copy (binary) as root: $(it_status "$rc") $(tail -n 1 "$it_tmp/insert.log")"
it_run sums 30 "${psql[@]}" -c "select id, length(b), md5(b) from blobs order by id" \
    </dev/null >"$it_tmp/sums.out" 2>"$it_tmp/sums.err"
rc=$?
((rc == 0)) && cmp -s "$it_tmp/blobs.want" "$it_tmp/sums.out"
it_check $? "the server's length and md5 of the $nrows rows are those of the bytes sent: $(it_status "$rc")"
it_run readback 40 "${psql[@]}" \
    -c "\\copy (select id, b from blobs order by id) to '$it_tmp/readback.copy' with (format binary)" \
    </dev/null >"$it_tmp/readback.log" 2>&1
rc=$?
((rc == 0)) && cmp -s "$it_tmp/blobs.copy" "$it_tmp/readback.copy"
it_check $? "the rows read back by \\copy (binary) as root: $(it_status "$rc"), $(wc -c <"$it_tmp/readback.copy" 2>/dev/null || echo 0) B, the file sent byte for byte"

if timeout "$(it_secs 60)" pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" stop \
    </dev/null >"$it_tmp/ctlcluster-stop.log" 2>&1; then
    for ((i = 0; i < 200; i++)); do
        kill -0 "$pm" 2>/dev/null || break
        sleep 0.05
    done
    ! kill -0 "$pm" 2>/dev/null
    it_check $? "pg_ctlcluster $ver $name stop: postmaster $pm ended"
else
    it_bad "pg_ctlcluster $ver $name stop failed: $(tail -n 1 "$it_tmp/ctlcluster-stop.log")"
fi
cp "$it_tmp/cluster.log" "$it_tmp/postgresql.log" 2>/dev/null
drop_cluster
it_check $? "pg_dropcluster $ver $name: $conf is gone"
[[ "$(clusters)" == "$host_before" ]]
it_check $? "the host's other clusters are as they were: $(echo "$host_before" | tr '\n' ';')"

if ((it_kernel)); then
    ! cat "$it_tmp"/*.stats 2>/dev/null | grep -q .
    it_check $? "no process wrote stats (kernel mode: nothing preloaded)"
    it_finish
fi
clients=(init select psql insert sums readback)
it_expect_direct "$port" 1 init psql insert sums readback
it_expect_direct "$port" 2 select
it_expect_mode "$port" insert direct none "tx_fabric>$nbytes"
it_expect_mode "$port" readback direct none "rx_fabric>$nbytes"
ctotal=0
for role in "${clients[@]}"; do
    read -r total _ < <(it_stats_summary "$it_tmp/$role.stats" "$port")
    ctotal=$((ctotal + total))
done
it_expect_direct "$port" "$ctotal" server
read -r stotal _ < <(it_stats_summary "$it_tmp/server.stats" "$port")
((stotal == ctotal))
it_check $? "the server's end counts as many connections as the clients' ends: $stotal, $ctotal"
# Every client is root, the server postgres: the message queues.
it_expect_mode "$port" server direct none "tx_ring=0" "tx_zcopy=0"
it_finish
