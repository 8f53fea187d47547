#!/usr/bin/env bash
# Debian's git daemon and git clone over git:// (every end preloaded).
# git daemon forks a child per connection that execs `git daemon --serve`
# with the socket on its stdin and stdout (the listener closes its copy
# only once that exec is done), which reads the request and execs, from a
# forked child again, `git upload-pack` on the same socket; upload-pack
# forks pack-objects on pipes. The client, git clone, forks index-pack,
# which inherits the socket (not close-on-exec) without using it.
# Checks: two clones of a repository (a 3 MB random file and 50 text
# files), each compared with the source (HEAD, every file byte for byte).
# With the library: the socket is handed over at each exec, on fd 0 and 1
# of the new program, whose stdin and stdout are streams that read and
# write through the library (upload-pack writes its ref list through
# stdout's buffer, the pack with write()); index-pack gets the clone's
# socket as a fork child holds it (its owner asked only at a first use,
# which never comes). So each clone's connection goes direct twice (with
# `git daemon --serve`, then with upload-pack) and stays direct to its
# end, the pack over the fabric: checked on both ends.
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_need git:git cmp:diffutils
it_preflight
export SDIRECT_ENGINE_WAIT_MS="${SDIRECT_ENGINE_WAIT_MS:-30000}"

src="$it_tmp/work"
if ! { git init -q "$src" &&
    head -c 3000000 /dev/urandom >"$src/big.bin" &&
    for i in $(seq 1 50); do head -c 20000 /dev/urandom | base64 >"$src/f$i.txt"; done &&
    git -C "$src" add . &&
    git -C "$src" -c user.email=t@example.org -c user.name=t commit -qm one &&
    git clone -q --bare "$src" "$it_tmp/repos/src.git"; } >"$it_tmp/setup.log" 2>&1; then
    it_bad "making the repository failed: $(tail -n 1 "$it_tmp/setup.log")"
    it_finish
fi
want="$(git -C "$src" rev-parse HEAD)"

port="$(it_free_port)"
# Its children's stderr is not the daemon's: the library's lines go to a file.
SDIRECT_LOG=info SDIRECT_LOG_FILE="$it_tmp/daemon-sdirect.log" \
    it_start daemon 90 git daemon --base-path="$it_tmp/repos" --export-all --reuseaddr \
    --listen=127.0.0.1 --port="$port"
srv=$it_pid
if ! it_wait_listen "$port" "$srv"; then
    it_bad "git daemon did not listen on 127.0.0.1:$port: $(tail -n 1 "$it_tmp/daemon.log")"
    it_stop "$srv" TERM 3
    it_finish
fi

clones=2
for n in $(seq 1 "$clones"); do
    SDIRECT_LOG=info it_run "clone$n" 40 git clone -q "git://127.0.0.1:$port/src.git" "$it_tmp/clone$n" \
        </dev/null >"$it_tmp/clone$n.log" 2>&1
    rc=$?
    if ((rc != 0)); then
        it_bad "clone $n: $(it_status "$rc"); $(grep -v '^sdirect' "$it_tmp/clone$n.log" | tail -n 1)"
        continue
    fi
    got="$(git -C "$it_tmp/clone$n" rev-parse HEAD 2>/dev/null)"
    if [[ "$got" == "$want" ]] && diff -r -q -x .git "$src" "$it_tmp/clone$n" >"$it_tmp/diff$n.txt" 2>&1; then
        it_ok "clone $n: HEAD $got, every file byte-exact"
    else
        it_bad "clone $n: HEAD '$got' (want $want); $(head -n 1 "$it_tmp/diff$n.txt")"
    fi
done
sleep 0.5
it_stop "$srv" TERM
it_log "git daemon: $it_stop_text"

if ((it_kernel)); then
    it_log "mode check skipped (SDIRECT_IT_KERNEL=1)"
    it_finish
fi
for n in $(seq 1 "$clones"); do
    if it_mode_check "$port" "clone$n" direct none upgrades=2 "rx_fabric>3000000"; then
        it_ok "clone $n: direct with both exec'd programs, the pack over the fabric: $it_mode_text"
    else
        it_bad "$it_mode_text"
    fi
done
# upload-pack's ends (comm git; `git daemon --serve`'s are git-daemon,
# back on the kernel when upload-pack took the socket over).
packs="$(awk '/ comm=git / && / mode=direct / {
        for (i = 1; i <= NF; i++) if ($i ~ /^tx_fabric=/) { split($i, kv, "="); if (kv[2] > 3000000) n++ }
    } END { print n + 0 }' "$it_tmp/daemon.stats" 2>/dev/null)"
if ((packs == clones)); then
    it_ok "upload-pack: $packs of $clones ends direct, each pack over the fabric"
else
    it_bad "upload-pack: $packs of $clones ends direct with the pack over the fabric"
fi
it_finish
