#!/usr/bin/env bash
# nginx (master + 2 workers that accept on the master's listener, epoll,
# sendfile on) serving files of 0 B, 1 B, 100 KiB and 5 MiB of random
# content from a temporary root, fetched by a python3 client
# (http_fetch.py: keep-alive GETs, HEAD, Range, 404, 4 parallel
# connections, HTTP/1.0 to EOF), every body compared by sha256. Then every
# connection, on the workers' side and the client's, must have run direct.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
if [[ -x /usr/sbin/nginx ]] && ! command -v nginx >/dev/null 2>&1; then
    PATH="$PATH:/usr/sbin"
fi
it_need nginx:nginx-light
it_preflight

port="$(it_free_port)"
www="$it_tmp/www"
mkdir -p "$www" "$it_tmp/temp"
: >"$www/empty.bin"
head -c 1 /dev/urandom >"$www/one.bin"
head -c 102400 /dev/urandom >"$www/100k.bin"
head -c 5242880 /dev/urandom >"$www/5m.bin"

# Run as root, the master would hand the workers to "nobody", who can read
# neither the temporary root nor (being another user) go direct with the
# client: keep the workers as the current user.
user_line=""
((EUID == 0)) && user_line="user $(id -un) $(id -gn);"
cat >"$it_tmp/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes 2;
$user_line
pid $it_tmp/nginx.pid;
error_log $it_tmp/error.log notice;
events {
    worker_connections 128;
}
http {
    access_log $it_tmp/access.log;
    client_body_temp_path $it_tmp/temp/body;
    proxy_temp_path $it_tmp/temp/proxy;
    fastcgi_temp_path $it_tmp/temp/fastcgi;
    uwsgi_temp_path $it_tmp/temp/uwsgi;
    scgi_temp_path $it_tmp/temp/scgi;
    default_type application/octet-stream;
    sendfile on;
    keepalive_timeout 30;
    server {
        listen 127.0.0.1:$port;
        root $www;
    }
}
EOF
ngx=(nginx -p "$it_tmp/" -c "$it_tmp/nginx.conf" -e "$it_tmp/error.log")
if ! timeout 10 "${ngx[@]}" -t >"$it_tmp/config.log" 2>&1; then
    it_bad "nginx -t rejects the configuration: $(tail -n 1 "$it_tmp/config.log")"
    it_finish
fi

it_start server 60 "${ngx[@]}"
srv=$it_pid
if ! it_wait_listen "$port" "$srv"; then
    it_bad "nginx did not listen on 127.0.0.1:$port"
    it_finish
fi

it_run client 40 "$it_py" "$it_dir/http_fetch.py" "$port" "$www" \
    empty.bin one.bin 100k.bin 5m.bin </dev/null >"$it_tmp/client.log" 2>&1
rc=$?
if ((rc == 0)); then
    while read -r line; do it_ok "http_fetch.py: $line"; done <"$it_tmp/client.log"
else
    it_bad "http_fetch.py: $(it_status "$rc"); $(tail -n 1 "$it_tmp/client.log")"
fi

# SIGTERM: the master stops the workers (each ends through exit()) and
# exits 0.
it_stop "$srv" TERM
it_check "$it_stop_rc" "nginx ended on SIGTERM: $it_stop_text"
if grep -E '\[(alert|crit|emerg)\]' "$it_tmp/error.log" >"$it_tmp/alerts.log"; then
    it_bad "nginx error.log: $(head -n 1 "$it_tmp/alerts.log" | cut -c 1-200)"
fi

# keep-alive 1 + parallel 4 + HTTP/1.0 1
it_expect_direct "$port" 6 server client
it_finish
