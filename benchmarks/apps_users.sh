# shellcheck shell=bash disable=SC2034,SC2154
# The rows of benchmarks/apps.sh for services as Debian runs them, each
# under its own user, with root's tools as the clients (sourced by apps.sh,
# not run). Every connection joins two uids, and goes direct through the
# library's message queues between users (SDIRECT_CROSS_USER, on by
# default on both ends):
#   pgx   PostgreSQL's postgres binary as the user postgres (setpriv, as
#         pg_ctlcluster changes to postgres before it starts it), in a data
#         directory of its own owned by postgres; pgbench as root.
#   abx   nginx with Debian's `user www-data;`: the master started as root,
#         its two workers www-data; ab as root, keep-alive.
#   abxc  the same, ab without keep-alive (a connection per request), both
#         ends with the library's own settings, modes counted.
#   myx   MariaDB's mariadbd started by root with --user=mysql (as Debian's
#         init script starts it through mysqld_safe: it changes to mysql
#         itself before it listens), in a data directory of its own made
#         by mariadb-install-db as mysql; mysqlslap as root.
# Each needs root and its user; otherwise users_missing says why, and
# apps.sh shows the rows as n/a with that reason.

# users_missing GROUP: why GROUP cannot run here (nothing if it can).
users_missing() {
    local user=www-data pkg=base-passwd
    case "$1" in
        pgx) user=postgres pkg=postgresql ;;
        myx) user=mysql pkg=mariadb-server ;;
    esac
    if ((EUID != 0)); then
        echo "not root: the server must be started by root and run as $user"
    elif ! getent passwd "$user" >/dev/null; then
        echo "no user $user on this host (Debian package $pkg makes it)"
    fi
}

# users_dir USER NAME: a fresh folder $tmp/NAME owned by USER, where that
# user's processes write their stats files (created 0600 by the first
# process that writes one).
users_dir() {
    users_lib || return 1
    rm -rf "${tmp:?}/$2"
    mkdir -p "$tmp/$2" && chown "$1:" "$tmp/$2" && chmod 755 "$tmp/$2"
}

# combine_verdicts VERDICT...: "direct" if every one is, else the
# NOT DIRECT ones joined.
combine_verdicts() {
    local v bad=""
    for v in "$@"; do
        [[ "$v" == direct ]] || bad+="${bad:+; }${v#NOT DIRECT: }"
    done
    if [[ -z "$bad" ]]; then echo direct; else echo "NOT DIRECT: $bad"; fi
}

# PostgreSQL as postgres: one database for every run, made at the first
# pgx measurement (initdb as postgres, pgbench -i as root, nothing
# preloaded). The server gets the library's copy in $tmp/tools (users_lib).
pgx_as=(setpriv --reuid=postgres --regid=postgres --init-groups --)
pgx_ready=0  # 1: made; 2: failed (pgx_why says why)
pgx_why=""
pgx_setup() {
    ((pgx_ready == 1)) && return 0
    ((pgx_ready == 2)) && return 1
    pgx_ready=2
    pgbin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
    if [[ -z "$pgbin" || ! -x "$pgbin/postgres" ]]; then
        pgx_why="PostgreSQL not installed (Debian package postgresql)"
        return 1
    fi
    if ! users_dir postgres pgx; then
        pgx_why="cannot make $tmp/pgx for postgres"
        return 1
    fi
    local port_init
    next_port
    port_init=$port
    if ! (cd "$tmp/pgx" && timeout 60 "${pgx_as[@]}" "$pgbin/initdb" -D "$tmp/pgx/data" -U postgres \
        -A trust --no-sync -E UTF8 --locale=C) >"$tmp/pgx-initdb.log" 2>&1 ||
        ! pgx_start kernel "$port_init" ||
        ! timeout 60 pgbench -h 127.0.0.1 -p "$port_init" -U postgres -i -s 1 -q postgres \
            </dev/null >"$tmp/pgx-init.log" 2>&1; then
        pgx_why="set-up failed: $(output_of "$tmp/pgx-initdb.log" "$tmp/pgx/srv.err" "$tmp/pgx-init.log")"
        stop_pid "$pgx_srv" TERM 20
        return 1
    fi
    stop_pid "$pgx_srv" TERM 20
    pgx_ready=1
}

# pgx_start HOW PORT: the server as postgres on its database, ready for
# connections; pgx_srv its pid. Its stats file: $tmp/pgx/srv.stats.
pgx_start() {
    local how="$1" port="$2" i run_lib="$users_lib_path"
    pgx_srv=""
    start_bg pgx/srv 300 "$how" srv_pin "${pgx_as[@]}" "$pgbin/postgres" -D "$tmp/pgx/data" \
        -k "$tmp/pgx" -c listen_addresses=127.0.0.1 -p "$port" -c fsync=off -c synchronous_commit=off \
        -c full_page_writes=off -c max_connections=30 -c autovacuum=off
    pgx_srv=$bg_pid
    for ((i = 0; i < 600; i++)); do
        grep -q "ready to accept connections" "$tmp/pgx/srv.err" 2>/dev/null && return 0
        kill -0 "$pgx_srv" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# pgbench -S as root against the server as postgres, 1 and 8 clients
# (-j 2 for 8), pg_secs each: transactions/s and mean latency. Every
# connection on the port must be direct on both ends.
measure_pgx() {
    local how="$1" clients rc vals tps lat ok=0 uid
    if ! pgx_setup; then
        failed "pg-users $how: $pgx_why"
        return 1
    fi
    next_port
    if ! pgx_start "$how" "$port"; then
        failed "pg-users $how: server did not start: $(output_of "$tmp/pgx/srv.err")"
        stop_pid "$pgx_srv" TERM 20
        return 2
    fi
    # Proof of who runs as whom: the postmaster is postgres.
    uid="$(ps -o uid= -p "$(head -n 1 "$tmp/pgx/data/postmaster.pid" 2>/dev/null)" 2>/dev/null | tr -d ' ')"
    if [[ "$uid" != "$(id -u postgres)" ]]; then
        failed "pg-users $how: the postmaster runs as uid '${uid:-?}', not postgres"
        stop_pid "$pgx_srv" TERM 20
        return 1
    fi
    for clients in 1 8; do
        run_fg "pgx-cli-S$clients" "$((pg_secs + 30))" "$how" cli_pin \
            pgbench -h 127.0.0.1 -p "$port" -U postgres -n -S -T "$pg_secs" -c "$clients" \
            -j "$((clients > 1 ? 2 : 1))" postgres
        rc=$?
        vals="$(pgbench_result "$tmp/pgx-cli-S$clients.out")"
        if ((rc != 0)) || [[ -z "$vals" ]]; then
            failed "pg-users $how -S -c $clients: $(status_text "$rc"), $(output_of "$tmp/pgx-cli-S$clients.out" "$tmp/pgx-cli-S$clients.err")"
            continue
        fi
        read -r tps lat <<<"$vals"
        put "pgx_S${clients}_tps" "$how" "$tps"
        put "pgx_S${clients}_lat" "$how" "$lat"
        ok=$((ok + 1))
        echo "  pg-users $how -S -c $clients: $tps tps, $lat ms" >&2
    done
    # Smart shutdown: the postmaster exits (stats written) once idle.
    stop_pid "$pgx_srv" TERM 20
    ((ok == 2)) || return 1
    [[ "$how" == sdirect ]] &&
        combine_verdicts "$(direct_verdict "$port" 9 pgx/srv)" "$(direct_verdict "$port" 1 pgx-cli-S1)" \
            "$(direct_verdict "$port" 8 pgx-cli-S8)" >>"$tmp/v/pgx.mode"
    return 0
}

# nginx with `user www-data;` (nginx_conf, as the nginx row writes it
# otherwise), the master started as root: abx asks for the 4 KiB file
# with keep-alive, 1 and 4 requests at a time, and every connection must
# be direct on both ends; abxc without keep-alive, 1 at a time, with the
# library's own settings, the client's connections counted by mode.
measure_abx() { ngx_users "$1" abx k1 k4; }
measure_abxc() { ngx_users "$1" abxc c1; }

# ngx_users HOW GROUP VARIANT...: one nginx for GROUP's ab runs (VARIANT:
# k or c, then the concurrency); its files in $tmp/GROUP (owned by
# www-data, which writes the workers' stats there).
ngx_users() {
    local how="$1" g="$2" dir="$tmp/$2" v conc opts rc val ok=0 pre=() srv master line i
    local verdicts=() www_uid
    shift 2
    [[ "$g" == abxc ]] && pre=("${bench_defaults[@]}")
    next_port
    if ! users_dir www-data "$g"; then
        failed "nginx-users $how: cannot make $dir for www-data"
        return 1
    fi
    mkdir -p "$dir/www" "$dir/temp"
    head -c 4096 /dev/urandom >"$dir/www/4k.bin"
    chmod -R a+rX "$dir/www"
    nginx_conf "$dir" "$port" "user www-data;"
    start_bg "$g/srv" 300 "$how" srv_pin "${pre[@]}" "$nginx" -p "$dir/" -c "$dir/nginx.conf" -e "$dir/error.log"
    srv=$bg_pid
    # The master (root) writes its line after its workers have written
    # theirs; a file it created first would be closed to them.
    : >"$dir/srv.stats" && chown www-data: "$dir/srv.stats"
    if ! wait_listen "$port" "$srv"; then
        failed "nginx-users $how: nginx did not start (tried once more on the next port): $(output_of "$dir/srv.err" "$dir/error.log")"
        stop_pid "$srv" TERM 5
        return 2
    fi
    # Proof of who runs as whom: the master root, its workers www-data
    # (they drop their ids right after the fork; waited for, bounded).
    www_uid="$(id -u www-data)"
    for ((i = 0; i < 100; i++)); do
        master="$(cat "$dir/nginx.pid" 2>/dev/null)"
        line=""
        [[ -n "$master" ]] && line="$(ps -o uid= --ppid "$master" 2>/dev/null | tr -d ' ' | sort -u | xargs)"
        [[ "$line" == "$www_uid" ]] && break
        sleep 0.05
    done
    if [[ "$line" != "$www_uid" || "$(ps -o uid= -p "$master" 2>/dev/null | tr -d ' ')" != 0 ]]; then
        failed "nginx-users $how: master ${master:-?} not root or its workers not www-data (uids '${line}')"
        stop_pid "$srv" TERM 10
        return 1
    fi
    for v in "$@"; do
        conc="${v#?}"
        opts=(-q -t "$ab_secs" -n 500000 -c "$conc")
        [[ "$v" == k* ]] && opts+=(-k)
        run_fg "$g-$v" "$((ab_secs + 20))" "$how" cli_pin "${pre[@]}" \
            ab "${opts[@]}" "http://127.0.0.1:$port/4k.bin"
        rc=$?
        val="$(ab_rate "$tmp/$g-$v.out")"
        if ((rc != 0)) || [[ -z "$val" ]]; then
            failed "nginx-users ab -$v $how: $(status_text "$rc"), $(output_of "$tmp/$g-$v.out" "$tmp/$g-$v.err")"
            continue
        fi
        put "abx_$v" "$how" "$val"
        if [[ "$how" == sdirect ]]; then
            if [[ "$g" == abxc ]]; then
                ab_counts "$port" "$v" "$g-$v" "$tmp/v/abx_$v.counts"
            else
                verdicts+=("$(direct_verdict "$port" "$conc" "$g-$v")")
            fi
        fi
        ok=$((ok + 1))
        echo "  nginx-users ab -$v $how: $val req/s" >&2
    done
    # SIGTERM: the master stops its workers (each ends through exit()).
    stop_pid "$srv" TERM 10
    (($# == ok)) || return 1
    if [[ "$how" == sdirect && "$g" == abx ]]; then
        # The workers' side: at least one connection per ab connection.
        local all=0
        for v in "$@"; do all=$((all + ${v#?})); done
        combine_verdicts "$(direct_verdict "$port" "$all" "$g/srv")" "${verdicts[@]}" >>"$tmp/v/abx.mode"
    fi
    return 0
}

# MariaDB as mysql: one data directory for every run, made at the first
# myx measurement (mariadb-install-db as mysql, root without a password on
# 127.0.0.1). mysqlslap times its clients from their connect on, and a
# client process builds its fabric engine only when a connection asks,
# from SDIRECT_BUILD_AFTER_MS (250 ms) of its life on: with the library's own settings a run of a
# second or two would be half over on TCP before the client's engine is
# there, and connections that end before it stay on TCP unrecorded. So
# both ends upgrade at once (SDIRECT_UPGRADE_AFTER_MS=0): mysqlslap's
# first connection, made before its timed part (it creates and loads the
# table), waits for the engine, and every client connection is direct
# from its first byte.
myx_ready=0  # 1: made; 2: failed (myx_why says why)
myx_why=""
myx_at_once=(env SDIRECT_UPGRADE_AFTER_MS=0)
mariadbd="$(command -v mariadbd || echo /usr/sbin/mariadbd)"
myx_setup() {
    ((myx_ready == 1)) && return 0
    ((myx_ready == 2)) && return 1
    myx_ready=2
    if ! users_dir mysql myx; then
        myx_why="cannot make $tmp/myx for mysql"
        return 1
    fi
    mkdir -p "$tmp/myx/data" "$tmp/myx/run"
    chown mysql: "$tmp/myx/data" "$tmp/myx/run"
    chmod 0700 "$tmp/myx/data"
    if ! (cd "$tmp/myx" && timeout 60 setpriv --reuid=mysql --regid=mysql --init-groups -- \
        mariadb-install-db --no-defaults --user=mysql --datadir="$tmp/myx/data" \
        --auth-root-authentication-method=normal --skip-test-db) >"$tmp/myx-install.log" 2>&1; then
        myx_why="mariadb-install-db failed: $(output_of "$tmp/myx-install.log")"
        return 1
    fi
    myx_ready=1
}

# myx_start HOW PORT: mariadbd as root with --user=mysql on its data
# directory, ready for connections; myx_srv its pid (the timeout wrapper),
# myx_pid the server's own. Its stats file: $tmp/myx/srv.stats.
myx_start() {
    local how="$1" port="$2" i run_lib="$users_lib_path"
    myx_srv=""
    myx_pid=""
    start_bg myx/srv 300 "$how" srv_pin "${myx_at_once[@]}" "$mariadbd" --no-defaults --user=mysql \
        --datadir="$tmp/myx/data" --bind-address=127.0.0.1 --port="$port" \
        --socket="$tmp/myx/run/mysqld.sock" --pid-file="$tmp/myx/run/mysqld.pid" --tmpdir="$tmp/myx/run" \
        --skip-name-resolve --max-connections=50 --innodb-buffer-pool-size=64M
    myx_srv=$bg_pid
    for ((i = 0; i < 600; i++)); do
        if grep -q "ready for connections" "$tmp/myx/srv.err" 2>/dev/null; then
            myx_pid="$(cat "$tmp/myx/run/mysqld.pid" 2>/dev/null)"
            return 0
        fi
        kill -0 "$myx_srv" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# mysqlslap_secs FILE: the "Average number of seconds to run all queries"
# of mysqlslap's report in FILE.
mysqlslap_secs() {
    awk '/Average number of seconds to run all queries:/ { s = $(NF - 1) }
        END { if (s + 0 > 0) print s }' "$1"
}

# mysqlslap as root against mariadbd as mysql: myx_queries primary-key
# reads (--auto-generate-sql-load-type=key) spread over 1 client and over
# 8, one iteration: queries/s (the queries over mysqlslap's seconds). Every
# connection on the port must be direct on both ends: the server's, and
# mysqlslap's (the one that makes the table, and one per client).
measure_myx() {
    local how="$1" clients rc secs qps ok=0 uid
    if ! myx_setup; then
        failed "mariadb-users $how: $myx_why"
        return 1
    fi
    next_port
    if ! myx_start "$how" "$port"; then
        failed "mariadb-users $how: server did not start: $(output_of "$tmp/myx/srv.err")"
        stop_pid "$myx_srv" TERM 30
        return 2
    fi
    # Proof of who runs as whom: the server is mysql.
    uid="$(ps -o uid= -p "${myx_pid:-0}" 2>/dev/null | tr -d ' ')"
    if [[ "$uid" != "$(id -u mysql)" ]]; then
        failed "mariadb-users $how: mariadbd runs as uid '${uid:-?}', not mysql"
        stop_pid "$myx_srv" TERM 30
        return 1
    fi
    for clients in 1 8; do
        run_fg "myx-cli-c$clients" 60 "$how" cli_pin "${myx_at_once[@]}" \
            mysqlslap --no-defaults --protocol=tcp -h 127.0.0.1 -P "$port" -u root \
            --concurrency="$clients" --iterations=1 --number-of-queries="$myx_queries" \
            --auto-generate-sql --auto-generate-sql-load-type=key --auto-generate-sql-add-autoincrement
        rc=$?
        secs="$(mysqlslap_secs "$tmp/myx-cli-c$clients.out")"
        if ((rc != 0)) || [[ -z "$secs" ]]; then
            failed "mariadb-users $how -c $clients: $(status_text "$rc"), $(output_of "$tmp/myx-cli-c$clients.out" "$tmp/myx-cli-c$clients.err")"
            continue
        fi
        qps="$(awk -v n="$myx_queries" -v s="$secs" 'BEGIN { printf "%.0f", n / s }')"
        put "myx_c${clients}_qps" "$how" "$qps"
        ok=$((ok + 1))
        echo "  mariadb-users $how -c $clients: $myx_queries queries in $secs s, $qps/s" >&2
    done
    # mariadbd shuts down on SIGTERM and ends through exit() (stats written).
    stop_pid "$myx_srv" TERM 30
    ((ok == 2)) || return 1
    [[ "$how" == sdirect ]] &&
        combine_verdicts "$(direct_verdict "$port" 11 myx/srv)" "$(direct_verdict "$port" 2 myx-cli-c1)" \
            "$(direct_verdict "$port" 9 myx-cli-c8)" >>"$tmp/v/myx.mode"
    return 0
}
