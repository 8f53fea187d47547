#!/usr/bin/env bash
# A hostile peer of another uid (SDIRECT_CROSS_USER=1): a nobody client,
# direct with a root echo server, writes random bytes over the server's
# whole shm region (its uid may: the region is opened to it for the
# connection) and goes on sending. The server must neither die of it nor
# hang: it may lose that connection, nothing else. Three seeds.
#
# Today libfabric 1.17's shm provider trusts the region and the server
# dies (SIGSEGV) or hangs: that is reported as a visible skip naming the known
# limit, which is why SDIRECT_CROSS_USER is off by default
# (docs/ARCHITECTURE.md, "Between users"). Root only, private /dev/shm.
if [[ "${SDIRECT_IT_PRIVATE_SHM:-0}" != 1 ]]; then
    name="integration-$(basename "$0" .sh)"
    skip() { printf 'SKIP %s: %s\n' "$name" "$1"; printf 'SKIP %s: %s\n' "$name" "$1" >&2; exit 77; }
    ((EUID == 0)) || skip "needs root (runs the hostile side as nobody)"
    command -v setpriv >/dev/null && command -v unshare >/dev/null || skip "needs setpriv and unshare (util-linux)"
    getent passwd nobody >/dev/null || skip "user nobody is needed"
    [[ "${SDIRECT_IT_KERNEL:-0}" == 1 ]] && skip "nothing is shared without the library"
    unshare --mount --propagation private true 2>/dev/null ||
        skip "cannot make a mount namespace here (unshare --mount)"
    SDIRECT_IT_PRIVATE_SHM=1 exec unshare --mount --propagation private bash "$0" "$@"
fi
mount -t tmpfs -o mode=1777,size=512m sdirect-hostile /dev/shm || {
    echo "SKIP: cannot mount a private /dev/shm"
    exit 77
}

source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_need setpriv:util-linux
it_preflight
chmod 0777 "$it_tmp"
export SDIRECT_CROSS_USER=1
as_nobody=(setpriv "--reuid=$(id -u nobody)" "--regid=$(id -g nobody)" --clear-groups)
died=()

for seed in 1 2 3; do
    port="$(it_free_port)"
    it_start "victim-$seed" 30 "$it_py" "$it_dir/xuser_echo.py" server --port "$port"
    srv=$it_pid
    if ! it_wait_listen "$port" "$srv"; then
        it_bad "seed $seed: the victim did not listen"
        it_stop "$srv" TERM 3
        continue
    fi
    it_run "hostile-$seed" 20 "${as_nobody[@]}" "$it_py" "$it_dir/xuser_hostile.py" \
        --port "$port" --seed "$seed" </dev/null >"$it_tmp/hostile-$seed.log" 2>&1
    line="$(grep -h '^wrote\|^no region' "$it_tmp/hostile-$seed.log")"
    if [[ "$line" != wrote* ]]; then
        it_bad "seed $seed: the hostile peer found no region of the victim mapped ('$line'): not direct"
    fi
    if ! it_reap "$srv" 10; then
        died+=("seed $seed: hung (still running 10 s after its peer ended)")
    elif ((it_stop_rc > 128 && it_stop_rc <= 192)); then
        died+=("seed $seed: $it_stop_text")
    else
        it_ok "seed $seed: the victim survived its hostile peer ($it_stop_text)"
    fi
done
if ((${#died[@]})); then
    it_skip "known limit, SDIRECT_CROSS_USER stays off by default: libfabric's shm provider trusts its region, and the victim did not survive: ${died[*]}"
fi
it_finish
