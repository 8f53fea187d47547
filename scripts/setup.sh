#!/usr/bin/env bash
# Installs everything the build, the tests and the benchmarks use, on Debian 12.
# Idempotent; needs root (re-runs itself with sudo when it can).
# SDIRECT_SKIP_SETUP=1 skips it.
set -euo pipefail

if [[ "${SDIRECT_SKIP_SETUP:-0}" == 1 ]]; then
    echo "setup: skipped (SDIRECT_SKIP_SETUP=1)"
    exit 0
fi

if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        exec sudo --preserve-env=SDIRECT_SKIP_SETUP,http_proxy,https_proxy \
            bash "$(readlink -f "${BASH_SOURCE[0]}")" "$@"
    fi
    echo "setup: must run as root (sudo not available); try: su -c 'bash scripts/setup.sh'" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive

packages=(
    build-essential g++ meson ninja-build pkg-config catch2
    libfabric-dev libfabric-bin libibverbs-dev libboost-dev
    netpipe-tcp iperf3 iperf sockperf qperf netperf gnuplot-nox
    apache2-utils stress-ng
    iproute2 procps strace gdb
    redis-server redis-tools postgresql memcached nginx-light apache2 curl
    mariadb-server mariadb-client
    openssh-server openssh-client socat git
    python3
)

# netperf lives in non-free. Only Debian archive entries get it (a
# third-party repository has no such component): in deb822 files the
# "Components:" line of every stanza whose URIs point at Debian, in classic
# files every "deb"/"deb-src" line of a Debian URL with "main". Entries that
# already have it are left alone, so a second run changes nothing.
debian_url='(debian[.]org|/debian(-security)?(/|[[:space:]]|$))'

rewrite_if_changed() {  # file, awk program
    local f="$1" tmp
    tmp="$(mktemp)"
    awk -v url="$debian_url" "$2" "$f" >"$tmp"
    if ! cmp -s "$f" "$tmp"; then
        cat "$tmp" >"$f"
        echo "setup: enabled the non-free component in $f"
    fi
    rm -f "$tmp"
}

enable_non_free() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f "$f" ]] || continue
        rewrite_if_changed "$f" '
            function flush(  i) {
                for (i = 1; i <= n; i++) {
                    if (deb && buf[i] ~ /^[ \t]*Components:/ && buf[i] ~ /[ \t]main([ \t]|$)/ &&
                        buf[i] !~ /[ \t]non-free([ \t]|$)/)
                        sub(/[ \t]*$/, " non-free", buf[i])
                    print buf[i]
                }
                n = 0
                deb = 0
            }
            /^[ \t]*$/ { flush(); print; next }
            { buf[++n] = $0; if ($0 ~ /^[ \t]*URIs:/ && $0 ~ url) deb = 1 }
            END { flush() }'
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f "$f" ]] || continue
        rewrite_if_changed "$f" '
            /^[ \t]*deb(-src)?[ \t]/ && $0 ~ url && / main([ \t]|$)/ && $0 !~ /[ \t]non-free([ \t]|$)/ {
                sub(/[ \t]*$/, " non-free")
            }
            { print }'
    done
}

missing() {
    local p
    for p in "${packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
    done
}

enable_non_free
todo="$(missing)"
if [[ -z "$todo" ]]; then
    echo "setup: all packages present"
    exit 0
fi
# openssh-server's installation would start the system's sshd on port 22;
# the tests run their own sshd on a private port and need none. Where no
# policy-rc.d is in place (a container's usually denies every start), one
# that denies sshd's alone stands in while apt runs; invoke-rc.d and
# deb-systemd-invoke both ask it.
policy=/usr/sbin/policy-rc.d
own_policy=0
if [[ ! -e "$policy" ]]; then
    cat >"$policy" <<'POLICY'
#!/bin/sh
# Put in place by sdirect's scripts/setup.sh while it installs packages.
case "$1" in
ssh | ssh.* | sshd | sshd.* | rescue-ssh.target) exit 101 ;;
esac
exit 0
POLICY
    chmod 755 "$policy"
    own_policy=1
    trap 'rm -f "$policy"' EXIT
fi

echo "setup: installing: ${todo//$'\n'/ }"
timeout 600 apt-get update
# shellcheck disable=SC2086
timeout 1800 apt-get install -y --no-install-recommends $todo
((own_policy)) && rm -f "$policy" && trap - EXIT
echo "setup: done"
