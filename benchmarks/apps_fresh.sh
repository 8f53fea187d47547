# shellcheck shell=bash disable=SC2034,SC2154
# The rows of benchmarks/apps.sh that make a process or a connection per
# transaction (sourced by apps.sh, not run): fresh redis-cli processes,
# netperf TCP_CRR, ab against nginx, pgbench -C. Both ends of these run
# with the library's own settings (bench_defaults, lib.sh), and each
# records the modes its client's connections ended in (mode_counts), as the
# library may leave such short connections on TCP.

# BENCH_REDIS_CLI_N fresh `redis-cli ping` processes, one after the
# other, against one redis-server: the wall time of each from its start to
# its exit (the same exec chain, timeout, taskset and env, in both
# columns), the median in ms. Both ends run with the library's own settings
# (bench_defaults); the clients are preloaded directly.
measure_rcli() {
    local how="$1" i rc t0 t1 pre=("${bench_defaults[@]}") med
    next_port
    rm -rf "$tmp/redis"
    mkdir -p "$tmp/redis"
    start_bg rc-srv $((rcli_n * 10 + 30)) "$how" srv_pin "${bench_defaults[@]}" redis-server \
        --bind 127.0.0.1 --port "$port" --save '' --appendonly no --dir "$tmp/redis" \
        --daemonize no --protected-mode no
    local srv=$bg_pid
    if ! wait_listen "$port" "$srv"; then
        failed "redis-cli $how: server did not start (tried once more on the next port): $(output_of "$tmp/rc-srv.out" "$tmp/rc-srv.err")"
        stop_pid "$srv" TERM 5
        return 2
    fi
    [[ "$how" == sdirect ]] && pre+=("LD_PRELOAD=$sd_lib")
    rm -f "$tmp/rc-cli.stats" "$tmp/rc.times"
    for ((i = 0; i < rcli_n; i++)); do
        t0=$EPOCHREALTIME
        SDIRECT_STATS_FILE="$tmp/rc-cli.stats" timeout -k 1 10 "${cli_pin[@]}" "${pre[@]}" \
            redis-cli -h 127.0.0.1 -p "$port" ping </dev/null >"$tmp/rc-cli.out" 2>"$tmp/rc-cli.err"
        rc=$?
        t1=$EPOCHREALTIME
        if ((rc != 0)) || [[ "$(tr -d '\r' <"$tmp/rc-cli.out")" != PONG ]]; then
            stop_pid "$srv" TERM 10
            failed "redis-cli ping $how, process $((i + 1)) of $rcli_n: $(status_text "$rc"), $(output_of "$tmp/rc-cli.out" "$tmp/rc-cli.err")"
            return 1
        fi
        echo "$t0 $t1" >>"$tmp/rc.times"
    done
    stop_pid "$srv" TERM 10
    med="$(awk '{ printf "%.3f\n", ($2 - $1) * 1000 }' "$tmp/rc.times" | median)"
    put rcli_ms "$how" "$med"
    [[ "$how" == sdirect ]] && mode_counts "$port" on "$tmp/rc-cli.stats" >>"$tmp/v/rcli_ms.counts"
    echo "  redis-cli ping $how: $rcli_n processes, median $med ms" >&2
}

# netperf TCP_CRR against a forking netserver: a new data connection for
# every 1-byte transaction, np_secs; both ends with the library's own
# settings. The modes counted are those of netperf's data connections.
measure_npcrr() {
    local how="$1" rc val
    next_port
    start_bg crr-srv 120 "$how" srv_pin "${bench_defaults[@]}" netserver -D -4 -L 127.0.0.1 -p "$port"
    local srv=$bg_pid
    if ! wait_listen "$port" "$srv"; then
        failed "netperf TCP_CRR $how: netserver did not start (tried once more on the next port): $(output_of "$tmp/crr-srv.out" "$tmp/crr-srv.err")"
        stop_pid "$srv" TERM 5
        return 2
    fi
    run_fg crr-cli "$((np_secs + 20))" "$how" cli_pin "${bench_defaults[@]}" \
        netperf -4 -H 127.0.0.1 -p "$port" -t TCP_CRR -l "$np_secs" -P 0
    rc=$?
    stop_pid "$srv" TERM 5
    val="$(awk 'NF >= 5 { r = $NF } END { if (r + 0 > 0) print r }' "$tmp/crr-cli.out")"
    if ((rc != 0)) || [[ -z "$val" ]]; then
        failed "netperf -t TCP_CRR $how: $(status_text "$rc"), $(output_of "$tmp/crr-cli.out" "$tmp/crr-cli.err")"
        return 1
    fi
    put np_tcp_crr "$how" "$val"
    [[ "$how" == sdirect ]] && mode_counts "$port" off "$tmp/crr-cli.stats" >>"$tmp/v/np_tcp_crr.counts"
    echo "  netperf -t TCP_CRR $how: $val" >&2
}

# ab against nginx: nginx as its own master process (daemon off, ended by
# pid), 2 workers, its configuration, logs and temporary files in
# $tmp/nginx, a private port; ab asks for a 4 KiB file for ab_secs, without
# keep-alive (a connection per request) and with it, 1 and 4 requests at a
# time. Both ends with the library's own settings.
nginx="$(command -v nginx || echo /usr/sbin/nginx)"

# nginx_conf DIR PORT USER_LINE: nginx's configuration into DIR/nginx.conf
# (its pid file, logs and temporary files in DIR, the files it serves in
# DIR/www), listening on 127.0.0.1:PORT; USER_LINE is its `user` directive
# (empty: none).
nginx_conf() {
    cat >"$1/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes 2;
$3
pid $1/nginx.pid;
error_log $1/error.log warn;
events {
    worker_connections 256;
}
http {
    access_log off;
    client_body_temp_path $1/temp/body;
    proxy_temp_path $1/temp/proxy;
    fastcgi_temp_path $1/temp/fastcgi;
    uwsgi_temp_path $1/temp/uwsgi;
    scgi_temp_path $1/temp/scgi;
    default_type application/octet-stream;
    sendfile on;
    keepalive_timeout 30;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$2;
        root $1/www;
    }
}
EOF
}

# ab_rate FILE: the requests/s of ab's report in FILE, if no request
# failed. "Requests per second:    9342.66 [#/sec] (mean)", "Failed
# requests:        0"; "Non-2xx responses:" only when there were.
ab_rate() {
    awk '
        /^Requests per second:/ { r = $4 }
        /^Failed requests: +0$/ { clean = 1 }
        /^Non-2xx responses:/ { bad = 1 }
        END { if (r != "" && clean && !bad) print r }' "$1"
}

# counts_or_unasked PORT STATS N COUNTS: the modes of the connections on
# PORT in the stats file STATS appended to COUNTS. With none there, none
# of the client's connections asked to go direct (each closed before
# SDIRECT_UPGRADE_AFTER_MS; the library keeps no counters for those): all
# N of them count as "unasked" (on TCP).
counts_or_unasked() {
    local counted
    counted="$(mode_counts "$1" on "$2")"
    if [[ -n "$counted" ]]; then
        echo "$counted" >>"$4"
        return
    fi
    [[ "$3" =~ ^[1-9][0-9]*$ ]] && echo "unasked $3" >>"$4"
}

# ab_counts PORT VARIANT ROLE COUNTS: the modes of ab's connections (ab
# run ROLE, VARIANT k or c then the concurrency) appended to COUNTS: with
# keep-alive one connection per concurrent request, without it one per
# completed request.
ab_counts() {
    local n="${2#?}"
    [[ "$2" == c* ]] && n="$(awk '/^Complete requests:/ { print $3 }' "$tmp/$3.out")"
    counts_or_unasked "$1" "$tmp/$3.stats" "$n" "$4"
}

measure_ab() {
    local how="$1" rc val v conc opts user_line="" ok=0
    next_port
    rm -rf "$tmp/nginx"
    mkdir -p "$tmp/nginx/www" "$tmp/nginx/temp"
    head -c 4096 /dev/urandom >"$tmp/nginx/www/4k.bin"
    # As root the workers would become nobody, another user than ab: they
    # stay the current user here (the abx rows measure Debian's www-data).
    ((EUID == 0)) && user_line="user $(id -un) $(id -gn);"
    nginx_conf "$tmp/nginx" "$port" "$user_line"
    start_bg ngx-srv 300 "$how" srv_pin "${bench_defaults[@]}" "$nginx" -p "$tmp/nginx/" \
        -c "$tmp/nginx/nginx.conf" -e "$tmp/nginx/error.log"
    local srv=$bg_pid
    if ! wait_listen "$port" "$srv"; then
        failed "ab $how: nginx did not start (tried once more on the next port): $(output_of "$tmp/ngx-srv.err" "$tmp/nginx/error.log")"
        stop_pid "$srv" TERM 5
        return 2
    fi
    for v in c1 c4 k1 k4; do
        conc="${v#?}"
        opts=(-q -t "$ab_secs" -n 500000 -c "$conc")
        [[ "$v" == k* ]] && opts+=(-k)
        run_fg "ab-$v" "$((ab_secs + 20))" "$how" cli_pin "${bench_defaults[@]}" \
            ab "${opts[@]}" "http://127.0.0.1:$port/4k.bin"
        rc=$?
        val="$(ab_rate "$tmp/ab-$v.out")"
        if ((rc != 0)) || [[ -z "$val" ]]; then
            failed "ab -$v $how: $(status_text "$rc"), $(output_of "$tmp/ab-$v.out" "$tmp/ab-$v.err")"
            continue
        fi
        put "ab_$v" "$how" "$val"
        [[ "$how" == sdirect ]] && ab_counts "$port" "$v" "ab-$v" "$tmp/v/ab_$v.counts"
        ok=$((ok + 1))
        echo "  ab -$v $how: $val req/s" >&2
    done
    # SIGTERM: the master stops its workers (each ends through exit()).
    stop_pid "$srv" TERM 10
    ((ok == 4))
}

# pgc_counts PORT COUNTS: the modes of pgbench -C's connections, one per
# transaction processed, appended to COUNTS.
pgc_counts() {
    local n
    n="$(awk '/^number of transactions actually processed:/ { print $NF }' "$tmp/pgc-cli.out")"
    counts_or_unasked "$1" "$tmp/pgc-cli.stats" "$n" "$2"
}

# pgbench -C -S: select-only, one client, a new connection (so a backend
# forked anew) for every transaction, pg_secs, against a server started
# for it; both ends with the library's own settings. The modes counted are
# those of pgbench's connections.
measure_pgc() {
    local how="$1" rc vals tps run_lib
    pg_setup || return 1
    next_port
    if ! pg_start "$how" "$port" "${bench_defaults[@]}"; then
        failed "pgbench -C $how: server did not start: $(output_of "$tmp/pg-srv.err")"
        stop_pid "$pg_srv" TERM 20
        return 2
    fi
    run_lib="$pg_lib"
    run_fg pgc-cli "$((pg_secs + 30))" "$how" cli_pin "${bench_defaults[@]}" "${pg_as[@]}" \
        pgbench -h 127.0.0.1 -p "$port" -U postgres -n -C -S -T "$pg_secs" -c 1 -j 1 postgres
    rc=$?
    stop_pid "$pg_srv" TERM 20
    # "tps = 812.3 (including reconnection times)"
    vals="$(awk '
        /^tps = / { tps = $3 }
        /^number of failed transactions: 0 / { clean = 1 }
        END { if (tps != "" && clean) print tps }' "$tmp/pgc-cli.out")"
    if ((rc != 0)) || [[ -z "$vals" ]]; then
        failed "pgbench -C -S $how: $(status_text "$rc"), $(output_of "$tmp/pgc-cli.out" "$tmp/pgc-cli.err")"
        return 1
    fi
    tps="$vals"
    put pg_C_tps "$how" "$tps"
    [[ "$how" == sdirect ]] && pgc_counts "$port" "$tmp/v/pg_C_tps.counts"
    echo "  pgbench -C -S $how: $tps tps" >&2
}
