#!/usr/bin/env bash
# OpenSSH's sshd from Debian, run as root the way users run it (privilege
# separation: each connection's pre-auth child chroots to /run/sshd,
# becomes the sshd user and enters a seccomp sandbox), on a private port
# with its own configuration, host key and authorized key, in two forms:
#   reexec  the default: the listener's child re-executes sshd for each
#           connection (the socket reaches the new program on fd 0/1,
#           handed over: the new sshd upgrades it);
#   no-reexec  sshd -r: the listener's child goes on with the connection
#           itself, and forks the sandboxed pre-auth child from there.
# Against each, Debian's ssh and scp (every end preloaded):
#   ssh ... cat, 4 MiB of random bytes in and the same bytes back;
#   ssh ... 'cat > file', 4 MiB, the file compared;
#   scp of 1 MiB up and of 1 MiB down (sftp protocol), compared;
#   ssh ... cat as another user (a system user made for the test), 1 MiB
#   in and back.
# Then the modes, from the clients' stats: ssh is the only end whose
# connection is recorded (sshd's connection processes end through _exit,
# which writes no stats; the pre-auth child could not open the file in its
# sandbox anyway). The session's bytes must cross the fabric
# (went_direct; for another user's login, the check after it).
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_need ssh:openssh-client scp:openssh-client ssh-keygen:openssh-client cmp:diffutils
[[ -x /usr/sbin/sshd ]] ||
    it_skip "'/usr/sbin/sshd' is not installed (Debian package openssh-server; scripts/setup.sh installs it)"
((EUID == 0)) || it_skip "sshd's privilege separation (chroot, setuid) and root's login need root"
it_preflight

# The privilege separation directory (the pre-auth child's chroot), which
# systemd or the init script would make.
if [[ ! -d /run/sshd ]]; then
    mkdir -p /run/sshd && chmod 0755 /run/sshd
fi

if ! ssh-keygen -q -t ed25519 -N '' -C sdirect-host -f "$it_tmp/host_ed25519" </dev/null ||
    ! ssh-keygen -q -t ed25519 -N '' -C sdirect-client -f "$it_tmp/client_ed25519" </dev/null; then
    it_bad "ssh-keygen failed"
    it_finish
fi
cp "$it_tmp/client_ed25519.pub" "$it_tmp/authorized_keys"
# sshd reads the authorized keys as the user who logs in.
chmod 0711 "$it_tmp"
chmod 0644 "$it_tmp/authorized_keys"

# A login as another user: a system user made for the
# test, removed at the end; none if useradd fails (then not checked).
ssh_user=sdirect-ssh
made_user=0
if ! id "$ssh_user" >/dev/null 2>&1; then
    if useradd -r -M -d / -s /bin/sh -p '*' "$ssh_user" >/dev/null 2>&1; then
        made_user=1
    else
        it_log "useradd $ssh_user failed: the other user's login is not checked"
        ssh_user=""
    fi
fi
trap 'it_cleanup; ((made_user)) && userdel "$ssh_user" >/dev/null 2>&1' EXIT
head -c 4194304 /dev/urandom >"$it_tmp/4m.bin"
head -c 1048576 /dev/urandom >"$it_tmp/up-1m.bin"
head -c 1048576 /dev/urandom >"$it_tmp/down-1m.bin"
sftp_server=/usr/lib/openssh/sftp-server
[[ -x "$sftp_server" ]] || sftp_server=internal-sftp

# config PORT: a configuration that reads nothing of the system's.
config() {
    cat <<EOF
Port $1
ListenAddress 127.0.0.1
HostKey $it_tmp/host_ed25519
PidFile $it_tmp/sshd-$1.pid
PermitRootLogin prohibit-password
AuthorizedKeysFile $it_tmp/authorized_keys
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PrintMotd no
Subsystem sftp $sftp_server
EOF
}

opts=(-F /dev/null -i "$it_tmp/client_ed25519" -o IdentitiesOnly=yes
    -o StrictHostKeyChecking=no -o "UserKnownHostsFile=$it_tmp/known_hosts"
    -o BatchMode=yes -o ConnectTimeout=10 -o LogLevel=ERROR)

# since START: the time since START (an $EPOCHREALTIME), e.g. "0.71 s".
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f s", b - a }'; }

# timed ROLE SECONDS CMD...: it_run, with the time it took in `took`.
timed() {
    local start=$EPOCHREALTIME rc
    it_run "$@"
    rc=$?
    took="$(since "$start")"
    return "$rc"
}

# same ROLE EXPECTED GOT TEXT: one check that the transfer's bytes are
# exactly the expected ones.
same() {
    local role="$1" rc="$2" want="$3" got="$4" text="$5"
    if ((rc != 0)); then
        it_bad "$role: $text: $(it_status "$rc"); $(tail -n 1 "$it_tmp/$role.err" 2>/dev/null)"
    elif cmp -s "$want" "$got"; then
        it_ok "$role: $text, byte-exact, $took"
    else
        it_bad "$role: $text: $(cmp "$want" "$got" 2>&1 | head -n 1)"
    fi
}

# variant NAME SSHD-FLAG...: starts sshd, runs the four transfers, stops it.
variant() {
    local name="$1" port srv rc
    shift
    port="$(it_free_port)"
    config "$port" >"$it_tmp/sshd-$name.conf"
    if ! timeout 10 /usr/sbin/sshd -t -f "$it_tmp/sshd-$name.conf" >"$it_tmp/sshd-$name-t.log" 2>&1; then
        it_bad "$name: sshd -t rejects the configuration: $(tail -n 1 "$it_tmp/sshd-$name-t.log")"
        return 1
    fi
    local start=$EPOCHREALTIME
    # sshd reads and writes the connection with read/write, never through
    # stdio: its re-exec'd image may adopt the socket on fd 0/1.
    it_start "sshd-$name" 60 /usr/sbin/sshd -D -e "$@" -f "$it_tmp/sshd-$name.conf"
    srv=$it_pid
    if ! it_wait_listen "$port" "$srv"; then
        it_bad "$name: sshd did not listen on 127.0.0.1:$port: $(tail -n 1 "$it_tmp/sshd-$name.log")"
        it_stop "$srv" TERM 3
        return 1
    fi
    it_log "$name: sshd $* listening on 127.0.0.1:$port after $(since "$start")"
    variant_port=$port

    timed "$name-cat" 30 ssh "${opts[@]}" -p "$port" root@127.0.0.1 cat \
        <"$it_tmp/4m.bin" >"$it_tmp/$name-cat.out" 2>"$it_tmp/$name-cat.err"
    same "$name-cat" $? "$it_tmp/4m.bin" "$it_tmp/$name-cat.out" "ssh cat, 4 MiB there and back"

    rm -f "$it_tmp/$name-remote.bin"
    timed "$name-upload" 30 ssh "${opts[@]}" -p "$port" root@127.0.0.1 \
        "cat > $it_tmp/$name-remote.bin" <"$it_tmp/4m.bin" >/dev/null 2>"$it_tmp/$name-upload.err"
    same "$name-upload" $? "$it_tmp/4m.bin" "$it_tmp/$name-remote.bin" "ssh 'cat > file', 4 MiB"

    timed "$name-scp-up" 30 scp "${opts[@]}" -P "$port" "$it_tmp/up-1m.bin" \
        "root@127.0.0.1:$it_tmp/$name-scp-up.bin" </dev/null >/dev/null 2>"$it_tmp/$name-scp-up.err"
    same "$name-scp-up" $? "$it_tmp/up-1m.bin" "$it_tmp/$name-scp-up.bin" "scp 1 MiB up"

    timed "$name-scp-down" 30 scp "${opts[@]}" -P "$port" "root@127.0.0.1:$it_tmp/down-1m.bin" \
        "$it_tmp/$name-scp-down.bin" </dev/null >/dev/null 2>"$it_tmp/$name-scp-down.err"
    same "$name-scp-down" $? "$it_tmp/down-1m.bin" "$it_tmp/$name-scp-down.bin" "scp 1 MiB down"

    if [[ -n "$ssh_user" ]]; then
        timed "$name-user" 30 ssh "${opts[@]}" -p "$port" "$ssh_user@127.0.0.1" cat \
            <"$it_tmp/up-1m.bin" >"$it_tmp/$name-user.out" 2>"$it_tmp/$name-user.err"
        same "$name-user" $? "$it_tmp/up-1m.bin" "$it_tmp/$name-user.out" \
            "ssh $ssh_user@ cat, 1 MiB there and back"
        # Another user's session is direct too: after the authentication
        # the monitor (retired by its temporary seteuid to read the user's
        # files, and idle on the socket from then on) forks the session
        # child, which becomes the user: it goes on afresh as that uid,
        # takes the socket over from the idle monitor and upgrades it
        # across users, asking the client itself (the kernel names root,
        # the socket's maker, as the owner of sshd's end). So two
        # upgrades, one leave (the pre-auth child's), and the 1 MiB echoed
        # back on the fabric. The client's upload starts with the session
        # and races that upgrade: part or all of it may cross on TCP
        # before it (the bytes are exact either way, checked above), so
        # only some of it is required on the fabric.
        if ((!it_kernel)); then
            if it_mode_check "$port" "$name-user" direct none peer_pid'>0' upgrades=2 leaves=1 \
                tx_fabric'>0' rx_fabric'>1048575'; then
                it_ok "$it_mode_text"
            else
                it_bad "$it_mode_text"
            fi
        fi
    fi

    # SIGTERM: the listener closes its socket and exits 0.
    start=$EPOCHREALTIME
    it_stop "$srv" TERM
    it_check "$it_stop_rc" "$name: sshd ended on SIGTERM: $it_stop_text, $(since "$start")"
    if grep -E 'fatal|terminated by signal' "$it_tmp/sshd-$name.log" >"$it_tmp/$name-alerts.txt"; then
        it_bad "$name: sshd log: $(head -n 1 "$it_tmp/$name-alerts.txt" | cut -c 1-200)"
    fi
    rc=$(grep -c '^Accepted publickey for root' "$it_tmp/sshd-$name.log")
    if ((rc == 4)); then
        it_ok "$name: sshd accepted 4 logins"
    else
        it_bad "$name: sshd accepted $rc logins, expected 4"
    fi

    if ((!it_kernel)); then
        # The listener ran the library (its process line is written at
        # exit) and has no connection of its own: it accepts, forks, and
        # closes its copy before any I/O.
        if ! grep -q '^process pid=[0-9]* comm=sshd ' "$it_tmp/sshd-$name.stats" 2>/dev/null; then
            it_bad "$name: the sshd listener wrote no stats (library not active in it?)"
        elif grep -q "^pid=.*:$port " "$it_tmp/sshd-$name.stats"; then
            it_bad "$name: the sshd listener recorded a connection: $(grep -m1 "^pid=.*:$port " "$it_tmp/sshd-$name.stats" | cut -c 1-200)"
        else
            it_ok "$name: the sshd listener ran the library and kept no connection"
        fi
    fi
    return 0
}

roles() { echo "$1-cat $1-upload $1-scp-up $1-scp-down"; }

# bulk ROLE: what the transfer must have carried on the fabric, from the
# client's side (its own bytes, not counting the protocol's).
bulk() {
    case "$1" in
    *-cat) echo "tx_fabric>4194303 rx_fabric>4194303" ;;
    *-upload) echo "tx_fabric>4194303" ;;
    *-scp-up) echo "tx_fabric>1048575" ;;
    *-scp-down) echo "rx_fabric>1048575" ;;
    esac
}

# went_direct NAME: the modes, from the client's stats. The connection
# process (the listener's child, or with re-exec the new sshd it executed,
# which adopts the socket it inherited and upgrades it as a fresh one)
# upgrades the connection at the identification exchange. Then it forks
# the pre-auth child, whose chroot retires it: the connection leaves the
# fabric for sharing (the client's end waits for an upgrade again), and
# the child's kernel bytes are counted for the holders. After the
# authentication that child exits, and for root sshd serves the session in
# the connection process itself (no session child: OpenSSH skips that
# fork for root), now the only holder left, which upgrades the connection
# again from the counts. So the session's bytes (the 4 MiB, the scp
# files) cross the fabric: two upgrades, one leave, the bulk on the
# fabric; the client closes first and ends direct. Also correct: the
# first upgrade did not happen before the pre-auth fork (one upgrade, no
# leave: seen when the listener closes its copy late). Never correct: the
# bulk on the kernel.
went_direct() {
    local name="$1" role first direct=0 want
    if ((it_kernel)); then
        it_log "mode check skipped ($name; SDIRECT_IT_KERNEL=1)"
        return
    fi
    for role in $(roles "$name"); do
        want="$(bulk "$role")"
        # shellcheck disable=SC2086 # the conditions are words
        if it_mode_check "$variant_port" "$role" direct none peer_pid'>0' upgrades=2 leaves=1 $want ||
            it_mode_check "$variant_port" "$role" direct none peer_pid'>0' upgrades=1 leaves=0 $want; then
            it_ok "$it_mode_text"
            direct=$((direct + 1))
        else
            it_mode_check "$variant_port" "$role" direct none peer_pid'>0' upgrades=2 leaves=1 $want
            it_bad "$it_mode_text"
        fi
    done
    if ((direct == 4)); then
        it_ok "$name: the session's bytes of all 4 connections crossed the fabric"
    fi
}

# Re-exec: the listener's child executes sshd again with the socket on
# fd 0/1, never used before. The child's library hands it over (the
# environment preloads the library, and SDIRECT_EXEC_STDIO is at its
# default, 1): the new sshd tracks the inherited socket in the holders' slot and
# goes direct like -r's child once the listener has closed its copy.
if variant reexec; then
    went_direct reexec
fi

# -r: the listener's child goes on with the connection itself, alone with
# the socket once the listener closed its copy.
if variant no-reexec -r; then
    went_direct no-reexec
fi

it_finish
