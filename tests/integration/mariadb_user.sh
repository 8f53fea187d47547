#!/usr/bin/env bash
# MariaDB as Debian runs it, on a data directory of the test's own
# (mariadb-install-db as the user mysql, root without a password on
# 127.0.0.1) with no systemd, listening on 127.0.0.1 on a free port:
#   dash-user  started by root with --user=mysql, as Debian's init script
#              (through mysqld_safe) starts it: mariadbd changes to mysql
#              itself (initgroups, setgid, setuid) before InnoDB starts
#              and before it listens, and is then not dumpable;
#   as-mysql   started as mysql (setpriv, as the unit's User=mysql), with
#              --user=mysql too, which changes nothing then.
# Clients, over TCP, every setting at its default on both ends (but for
# lib.sh's upgrades at once):
#   mysqlslap --auto-generate-sql, 400 queries by 4 connections at a time,
#   3 iterations, as root and as nobody;
#   the mysql client as root inserts 10 rows of 0 B to 1 MiB (random
#   bytes, every byte value, the bytes SQL escapes, UTF-8 text) as
#   _binary literals (max_allowed_packet 64 MiB on both ends); the
#   server's LENGTH, MD5 and SHA2 of each must be those of the bytes sent,
#   and SELECT b read back with --raw, as root and as nobody, must be the
#   bytes themselves.
# Every connection must run direct on both ends (the server's stats and
# every client's), the blob rows' bytes over the fabric; each joins two
# uids, so every byte goes inline through the message queues between
# users (no ring write, no zero-copy). In kernel mode (nothing
# preloaded) the same checks of the results, mariadbd must not have the
# library mapped, and no process may have written stats.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/private_shm.sh"
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
[[ -x /usr/sbin/mariadbd ]] && PATH="$PATH:/usr/sbin"
it_need mariadbd:mariadb-server mariadb-install-db:mariadb-server mysql:mariadb-client \
    mysqlslap:mariadb-client setpriv:util-linux
getent passwd mysql >/dev/null || it_skip "user mysql is needed (Debian package mariadb-server)"
it_preflight
it_shared_tmp
it_as mysql
as_my=("${it_as_words[@]}" --)
it_as nobody
as_nobody=("${it_as_words[@]}" --)
it_share_tools

read -r nrows nbytes < <("$it_py" "$it_dir/mariadb_blobs.py" "$it_tmp")
[[ "$nrows" =~ ^[0-9]+$ ]] || { it_bad "mariadb_blobs.py wrote no rows"; it_finish; }
chmod a+r "$it_tmp"/blobs.*

# One data directory for both rounds, owned by mysql; mariadbd's socket,
# pid file and temporary files in a folder of mysql's too.
data="$it_tmp/data"
run="$it_tmp/run"
mkdir -p "$data" "$run"
chown mysql: "$data" "$run"
chmod 0700 "$data"
if ! (cd "$it_tmp" && timeout "$(it_secs 60)" "${as_my[@]}" mariadb-install-db --no-defaults \
    --user=mysql --datadir="$data" --auth-root-authentication-method=normal --skip-test-db) \
    >"$it_tmp/install-db.log" 2>&1; then
    it_bad "mariadb-install-db as mysql failed: $(tail -n 1 "$it_tmp/install-db.log")"
    it_finish
fi
it_ok "mariadb-install-db as mysql: $data"

# cli_words USER: sets cli to the words that run a client as USER.
cli_words() {
    cli=()
    [[ "$1" == nobody ]] && cli=("${as_nobody[@]}")
}

# slap NAME USER PORT: mysqlslap as USER, its connections' stats in NAME.
slap() {
    local name="$1" user="$2" port="$3" rc runs
    cli_words "$user"
    it_run "$name" 60 "${cli[@]}" mysqlslap --no-defaults --protocol=tcp -h 127.0.0.1 -P "$port" -u root \
        --concurrency=4 --iterations=3 --auto-generate-sql --number-of-queries=400 \
        </dev/null >"$it_tmp/$name.log" 2>&1
    rc=$?
    runs="$(sed -n 's/^[[:space:]]*Average number of seconds to run all queries: \([0-9.]*\).*/\1/p' \
        "$it_tmp/$name.log")"
    [[ $rc == 0 && -n "$runs" ]]
    it_check $? "$name: mysqlslap as $user, 4 at a time, 3 iterations: $(it_status "$rc"), average ${runs:-?} s"
}

# readback NAME USER PORT: SELECT b as USER, the raw bytes compared with
# the rows inserted.
readback() {
    local name="$1" user="$2" port="$3" rc
    cli_words "$user"
    it_run "$name" 30 "${cli[@]}" mysql --no-defaults --protocol=tcp -h 127.0.0.1 -P "$port" -u root \
        --max-allowed-packet=64M --default-character-set=binary --batch --raw --skip-column-names \
        -e "SELECT b FROM it.blobs ORDER BY id" </dev/null >"$it_tmp/$name.out" 2>"$it_tmp/$name.err"
    rc=$?
    ((rc == 0)) && cmp -s "$it_tmp/blobs.raw" "$it_tmp/$name.out"
    it_check $? "$name: SELECT b as $user: $(it_status "$rc"), $(wc -c <"$it_tmp/$name.out") B read back, byte-exact"
}

# mapped PID: PID has libsdirect.so mapped.
mapped() {
    grep -q 'libsdirect\.so' "/proc/$1/maps" 2>/dev/null
}

# round NAME HOW: HOW is dash-user (root, --user=mysql) or as-mysql.
round() {
    local name="$1" how="$2" port srv pid rc i uid pre=() sql=()
    local mysql=(mysql --no-defaults --protocol=tcp -h 127.0.0.1 -u root --max-allowed-packet=64M)
    [[ "$how" == as-mysql ]] && pre=("${as_my[@]}")
    port="$(it_free_port)"
    mysql+=(-P "$port")
    it_stats_open "$name-server"
    it_start "$name-server" 120 "${pre[@]}" mariadbd --no-defaults --user=mysql --datadir="$data" \
        --bind-address=127.0.0.1 --port="$port" --socket="$run/mysqld.sock" --pid-file="$run/mysqld.pid" \
        --tmpdir="$run" --skip-name-resolve --character-set-server=utf8mb4 \
        --collation-server=utf8mb4_general_ci --max-allowed-packet=64M --innodb-buffer-pool-size=64M \
        --innodb-flush-log-at-trx-commit=0
    srv=$it_pid
    for ((i = 0; i < $(it_secs 30) * 20; i++)); do
        grep -q "ready for connections" "$it_tmp/$name-server.log" 2>/dev/null && break
        kill -0 "$srv" 2>/dev/null || break
        sleep 0.05
    done
    if ! grep -q "ready for connections" "$it_tmp/$name-server.log" 2>/dev/null ||
        ! it_listening "$port"; then
        it_bad "$name: mariadbd is not ready on 127.0.0.1:$port"
        it_stop "$srv" TERM 10
        return
    fi
    pid="$(ps -o pid= --ppid "$srv" | tr -d ' ')"
    uid="$(it_child_uids "$srv")"
    [[ "$uid" == "$(id -u mysql) " && "$(cat "$run/mysqld.pid" 2>/dev/null)" == "$pid" ]]
    it_check $? "$name: mariadbd (pid ${pid:-?}) runs as uid $(id -u mysql) (mysql): uids '$uid'"
    if ((it_kernel)); then
        ! mapped "$pid"
        it_check $? "$name: mariadbd has no libsdirect.so mapped (kernel mode)"
    else
        mapped "$pid"
        it_check $? "$name: mariadbd has libsdirect.so mapped"
    fi

    slap "$name-slap-root" root "$port"
    slap "$name-slap-nobody" nobody "$port"

    it_run "$name-insert" 30 "${mysql[@]}" --binary-mode --default-character-set=binary \
        <"$it_tmp/blobs.sql" >"$it_tmp/$name-insert.log" 2>&1
    rc=$?
    it_check "$rc" "$name: $nrows rows of $nbytes B in all inserted as root: $(it_status "$rc") $(tail -n 1 "$it_tmp/$name-insert.log")"
    it_run "$name-sums" 30 "${mysql[@]}" --batch --skip-column-names \
        -e "SELECT id, LENGTH(b), MD5(b), SHA2(b, 256) FROM it.blobs ORDER BY id" \
        </dev/null >"$it_tmp/$name-sums.out" 2>"$it_tmp/$name-sums.err"
    rc=$?
    ((rc == 0)) && cmp -s "$it_tmp/blobs.want" "$it_tmp/$name-sums.out"
    it_check $? "$name: the server's LENGTH, MD5 and SHA2 of the $nrows rows are those of the bytes sent: $(it_status "$rc")"
    readback "$name-read-root" root "$port"
    readback "$name-read-nobody" nobody "$port"

    # mariadbd shuts down on SIGTERM and ends through exit() (stats written).
    it_stop "$srv" TERM 30
    it_check "$it_stop_rc" "$name: mariadbd ended on SIGTERM: $it_stop_text"
    if ((it_kernel)); then
        ! cat "$it_tmp/$name"-*.stats 2>/dev/null | grep -q .
        it_check $? "$name: no process wrote stats (kernel mode: nothing preloaded)"
        return
    fi
    # mysqlslap: one connection for the whole run and one per client in
    # each iteration; the blob rows' bytes over the fabric each way.
    it_expect_direct "$port" 13 "$name-slap-root" "$name-slap-nobody"
    it_expect_direct "$port" 1 "$name-insert" "$name-sums" "$name-read-root" "$name-read-nobody"
    it_expect_mode "$port" "$name-insert" direct none "tx_fabric>$nbytes"
    it_expect_mode "$port" "$name-read-root" direct none "rx_fabric>$nbytes"
    it_expect_mode "$port" "$name-read-nobody" direct none "rx_fabric>$nbytes"
    it_expect_direct "$port" 30 "$name-server"
    # Every client is of another uid than mysql: the message queues.
    it_expect_mode "$port" "$name-server" direct none "tx_ring=0" "tx_zcopy=0"
}

round dash-user dash-user
round as-mysql as-mysql
it_finish
