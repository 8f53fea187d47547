#!/usr/bin/env bash
# apache2 as Debian runs it: started as root (it listens, and builds its
# fabric engine there), children that it forks and that become www-data
# (setgid, initgroups, setuid) before they accept anything; the prefork
# and the event MPM. A file of 4 MiB of random content (and 0 B, 1 B,
# 100 KiB ones) fetched by a python3 client (http_fetch.py: keep-alive,
# HEAD, Range, 404, 4 parallel connections, HTTP/1.0 to EOF) as www-data
# with every setting at its default, and by curl as root (4 processes, 2
# keep-alive GETs each) with SDIRECT_CROSS_USER=1 on both ends; every
# body compared by sha256.
#
# With Debian's configuration the children are not dumpable (the kernel
# clears the flag when they change their uid, and apache2 sets it again
# only where CoreDumpDirectory is configured): their connections go
# through the message queues, as across users, and every one must run
# direct on both ends, every byte inline (no ring write, no zero-copy).
# With `CoreDumpDirectory` set, the children make themselves dumpable
# again after setuid, and every connection must run direct on both ends.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/private_shm.sh"
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
if [[ -x /usr/sbin/apache2 ]] && ! command -v apache2 >/dev/null 2>&1; then
    PATH="$PATH:/usr/sbin"
fi
it_need apache2:apache2 setpriv:util-linux curl:curl
getent passwd www-data >/dev/null || it_skip "user www-data is needed (Debian's base-passwd)"
modules=/usr/lib/apache2/modules
it_preflight
it_shared_tmp

www="$it_tmp/www"
mkdir -p "$www" "$it_tmp/core"
chown www-data "$it_tmp/core"
: >"$www/empty.bin"
head -c 1 /dev/urandom >"$www/one.bin"
head -c 102400 /dev/urandom >"$www/100k.bin"
head -c 4194304 /dev/urandom >"$www/4m.bin"
chmod -R a+rX "$www"

# round NAME MPM CLIENT-AS CROSS DUMPABLE
round() {
    local name="$1" mpm="$2" cli_as="$3" cross="$4" dumpable="$5" port srv conf mpm_conf core="" i
    if [[ ! -f "$modules/mod_mpm_$mpm.so" ]]; then
        it_bad "$name: $modules/mod_mpm_$mpm.so is missing (Debian package apache2)"
        return
    fi
    port="$(it_free_port)"
    conf="$it_tmp/$name.conf"
    if [[ "$mpm" == prefork ]]; then
        mpm_conf="StartServers 2
MinSpareServers 1
MaxSpareServers 2
MaxRequestWorkers 8"
    else
        mpm_conf="StartServers 2
ServerLimit 2
ThreadsPerChild 8
MinSpareThreads 1
MaxSpareThreads 16
MaxRequestWorkers 16"
    fi
    ((dumpable)) && core="CoreDumpDirectory $it_tmp/core"
    cat >"$conf" <<CONF
ServerRoot $it_tmp
ServerName localhost
Listen 127.0.0.1:$port
LoadModule mpm_${mpm}_module $modules/mod_mpm_$mpm.so
LoadModule authz_core_module $modules/mod_authz_core.so
User www-data
Group www-data
PidFile $it_tmp/$name.pid
ErrorLog $it_tmp/$name-error.log
LogLevel notice
DocumentRoot $www
KeepAlive On
$core
$mpm_conf
<Directory $www>
    Require all granted
</Directory>
CONF
    if ! timeout 10 apache2 -f "$conf" -t >"$it_tmp/$name-config.log" 2>&1; then
        it_bad "$name: apache2 -t rejects the configuration: $(tail -n 1 "$it_tmp/$name-config.log")"
        return
    fi
    export SDIRECT_CROSS_USER="$cross"
    it_stats_open "$name-server"
    # In a session of its own: apache2 stopping signals its whole process
    # group, which would otherwise be the test's (and timeout's).
    it_start "$name-server" 60 setsid apache2 -f "$conf" -DFOREGROUND
    srv=$it_pid
    if ! it_wait_listen "$port" "$srv"; then
        it_bad "$name: apache2 did not listen on 127.0.0.1:$port"
        it_stop "$srv" TERM 3
        unset SDIRECT_CROSS_USER
        return
    fi
    if [[ "$cli_as" == www-data ]]; then
        it_fetch_as "$name" www-data "$port" "$www" empty.bin one.bin 100k.bin 4m.bin
    else
        it_curl_as "$name" root "$port" "$www/4m.bin"
    fi
    # The server's processes: the master (timeout's child, the same
    # process through sdirect-run and setsid) and its children.
    local master kids k left=""
    master="$(ps -o pid= --ppid "$srv" | tr -d ' ')"
    kids="$([[ -n "$master" ]] && ps -o pid= --ppid "$master")"
    it_stop "$srv" TERM
    it_check "$it_stop_rc" "$name: apache2 ended on SIGTERM: $it_stop_text"
    # None may outlive it (their statistics are written as they exit);
    # one that does is stopped here, by its pid.
    for k in $kids; do
        for ((i = 0; i < 100; i++)); do kill -0 "$k" 2>/dev/null || break; sleep 0.05; done
        if kill -0 "$k" 2>/dev/null; then
            left+=" $k"
            kill -KILL "$k" 2>/dev/null
        fi
    done
    [[ -z "$left" ]]
    it_check $? "$name: every child of apache2 ended with it${left:+; still running 5 s later, killed:$left}"
    if grep -E '\[[a-z_]*:(alert|crit|emerg)\]' "$it_tmp/$name-error.log" >"$it_tmp/$name-alerts.log"; then
        it_bad "$name: apache2 error log: $(head -n 1 "$it_tmp/$name-alerts.log" | cut -c 1-200)"
    fi
    unset SDIRECT_CROSS_USER
    # keep-alive 1 + parallel 4 + HTTP/1.0 1, or 4 curls
    it_expect_direct "$port" "$([[ "$cli_as" == www-data ]] && echo 6 || echo 4)" \
        "$name-server" "$name-client"
    if ((!dumpable)); then
        it_expect_mode "$port" "$name-server" direct none "tx_ring=0" "tx_zcopy=0"
        it_expect_mode "$port" "$name-client" direct none "tx_ring=0" "tx_zcopy=0"
    fi
}

for mpm in prefork event; do
    round "$mpm-debian" "$mpm" www-data 0 0
    round "$mpm-coredumpdir" "$mpm" www-data 0 1
    round "$mpm-coredumpdir-root" "$mpm" root 1 1
done
it_finish
