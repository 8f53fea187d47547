#!/usr/bin/env bash
# nginx as Debian configures it: `user www-data;`, the master started as
# root (it listens, and builds its fabric engine there), two workers that
# it forks and that become www-data (setgid, initgroups, setuid) before
# they accept anything. A file of 4 MiB of random content (and 0 B, 1 B,
# 100 KiB ones) fetched by a python3 client (http_fetch.py: keep-alive,
# HEAD, Range, 404, 4 parallel connections, HTTP/1.0 to EOF), every body
# compared by sha256, with every setting at its default on both ends: by
# the client as www-data, then as root (two uids).
# Each time every connection must have run direct on the workers' side
# and the client's, the workers must be www-data, and no worker may keep
# a map of root's registry or of the master's fabric region, nor the
# master's control socket.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/private_shm.sh"
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
if [[ -x /usr/sbin/nginx ]] && ! command -v nginx >/dev/null 2>&1; then
    PATH="$PATH:/usr/sbin"
fi
it_need nginx:nginx-light setpriv:util-linux
getent passwd www-data >/dev/null || it_skip "user www-data is needed (Debian's base-passwd)"
it_preflight
it_shared_tmp

www="$it_tmp/www"
mkdir -p "$www"
: >"$www/empty.bin"
head -c 1 /dev/urandom >"$www/one.bin"
head -c 102400 /dev/urandom >"$www/100k.bin"
head -c 4194304 /dev/urandom >"$www/4m.bin"
chmod -R a+rX "$www"

# round NAME CLIENT-AS
round() {
    local name="$1" cli_as="$2" port srv master w line
    port="$(it_free_port)"
    mkdir -p "$it_tmp/$name-temp"
    cat >"$it_tmp/$name.conf" <<CONF
daemon off;
master_process on;
worker_processes 2;
user www-data;
pid $it_tmp/$name.pid;
error_log $it_tmp/$name-error.log notice;
events {
    worker_connections 128;
}
http {
    access_log $it_tmp/$name-access.log;
    client_body_temp_path $it_tmp/$name-temp/body;
    proxy_temp_path $it_tmp/$name-temp/proxy;
    fastcgi_temp_path $it_tmp/$name-temp/fastcgi;
    uwsgi_temp_path $it_tmp/$name-temp/uwsgi;
    scgi_temp_path $it_tmp/$name-temp/scgi;
    default_type application/octet-stream;
    sendfile on;
    keepalive_timeout 30;
    server {
        listen 127.0.0.1:$port;
        root $www;
    }
}
CONF
    local ngx=(nginx -p "$it_tmp/" -c "$it_tmp/$name.conf" -e "$it_tmp/$name-error.log")
    if ! timeout 10 "${ngx[@]}" -t >"$it_tmp/$name-config.log" 2>&1; then
        it_bad "$name: nginx -t rejects the configuration: $(tail -n 1 "$it_tmp/$name-config.log")"
        return
    fi
    it_stats_open "$name-server"
    it_start "$name-server" 60 "${ngx[@]}"
    srv=$it_pid
    if ! it_wait_listen "$port" "$srv"; then
        it_bad "$name: nginx did not listen on 127.0.0.1:$port"
        it_stop "$srv" TERM 3
        return
    fi
    # The workers drop their ids right after the fork: wait (bounded) for it.
    master="$(cat "$it_tmp/$name.pid" 2>/dev/null)"
    for ((w = 0; w < 100; w++)); do
        [[ -n "$master" && "$(it_child_uids "$master")" == "$(id -u www-data) " ]] && break
        sleep 0.05
        master="$(cat "$it_tmp/$name.pid" 2>/dev/null)"
    done
    if [[ -n "$master" ]]; then
        line="$(it_child_uids "$master")"
        [[ "$line" == "$(id -u www-data) " ]]
        it_check $? "$name: the workers run as uid $(id -u www-data) (www-data): uids '$line'"
        # Before any client: what they hold then is what the fork left.
        if ((!it_kernel)); then
            for w in $(ps -o pid= --ppid "$master"); do
                if line="$(it_keeps_old_registry "$w" /dev/shm/sdirect-0 "$master")"; then
                    it_bad "$name: worker $w keeps something of root's: $line"
                else
                    it_ok "$name: worker $w keeps no map of root's registry or of the master's region, nor its control socket"
                fi
            done
        fi
    else
        it_bad "$name: no pid file"
    fi
    it_fetch_as "$name" "$cli_as" "$port" "$www" empty.bin one.bin 100k.bin 4m.bin
    it_stop "$srv" TERM
    it_check "$it_stop_rc" "$name: nginx ended on SIGTERM: $it_stop_text"
    if grep -E '\[(alert|crit|emerg)\]' "$it_tmp/$name-error.log" >"$it_tmp/$name-alerts.log"; then
        it_bad "$name: nginx error.log: $(head -n 1 "$it_tmp/$name-alerts.log" | cut -c 1-200)"
    fi
    # keep-alive 1 + parallel 4 + HTTP/1.0 1
    it_expect_direct "$port" 6 \
        "$name-server" "$name-client"
}

round same-user www-data
round root-client root
it_finish
