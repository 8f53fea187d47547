#!/usr/bin/env bash
# A hostile peer of another uid: a root echo server (the victim) serves at
# once an honest client of a third uid (daemon), which sends checksummed
# bytes for 4 s, and a nobody client (xuser_hostile.py), direct with it,
# which sends over every local datagram socket it holds offers of a
# thread's bell, most of them bad (the victim's fd count must stay
# bounded), fills to the top and makes blocking every bell it holds (an
# eventfd shared with the victim would make the victim's next ring wait
# for ever), says it has sleepers and has the victim answer it, then
# forges messages for the victim's other connections in the queue
# it writes into, makes that queue's tail and lengths lie, writes random
# bytes over both queues of the pair, its own process page and its own
# region, tries to truncate the queue the victim maps, and truncates its
# own page (which the victim reads, never maps). The victim must
# neither die of it nor hang, and the honest connection must stay direct
# and byte-exact: a peer of another uid can at most break its own
# connections. Three seeds. Root only, private /dev/shm.
if [[ "${SDIRECT_IT_KERNEL:-0}" == 1 ]]; then
    printf 'SKIP integration-%s: nothing is shared without the library\n' "$(basename "$0" .sh)"
    exit 77
fi
private_shm_why="runs the hostile side as nobody"
private_shm_users="nobody daemon"
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/private_shm.sh"

source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/lib.sh"
it_need setpriv:util-linux
it_preflight
chmod 0777 "$it_tmp"
as_nobody=(setpriv "--reuid=$(id -u nobody)" "--regid=$(id -g nobody)" --clear-groups)
as_daemon=(setpriv "--reuid=$(id -u daemon)" "--regid=$(id -g daemon)" --clear-groups)

for seed in 1 2 3; do
    port="$(it_free_port)"
    it_start "victim-$seed" 40 "$it_py" "$it_dir/xuser_echo.py" server --port "$port" --clients 2
    srv=$it_pid
    if ! it_wait_listen "$port" "$srv"; then
        it_bad "seed $seed: the victim did not listen"
        it_stop "$srv" TERM 3
        continue
    fi
    it_start "honest-$seed" 30 "${as_daemon[@]}" "$it_py" "$it_dir/xuser_echo.py" client \
        --port "$port" --seconds 4 --seed "$seed"
    honest=$it_pid
    sleep 0.3
    # The victim itself (it_start's pid is its wrapper's).
    victim="$(pgrep -n -f "xuser_echo.py server --port $port")"
    fds_before=$(ls "/proc/$victim/fd" 2>/dev/null | wc -l)
    it_run "hostile-$seed" 20 "${as_nobody[@]}" "$it_py" "$it_dir/xuser_hostile.py" \
        --port "$port" --seed "$seed" </dev/null >"$it_tmp/hostile-$seed.log" 2>&1 &
    hostile=$!
    # Counted while the hostile peer pauses after its offers: the victim
    # has its link to it then (a dozen fds: the connection, the queues,
    # the bells) and at most 16 bells of it; a leak would be hundreds.
    for ((i = 0; i < 200; i++)); do
        grep -q '^offers' "$it_tmp/hostile-$seed.log" 2>/dev/null && break
        sleep 0.05
    done
    sleep 0.5
    fds_after=$(ls "/proc/$victim/fd" 2>/dev/null | wc -l)
    wait "$hostile"
    offers="$(awk '/^offers/ {print $2}' "$it_tmp/hostile-$seed.log")"
    [[ -n "$victim" && "$fds_before" -gt 3 && "${offers:-0}" -gt 0 && "$fds_after" -le $((fds_before + 40)) ]]
    it_check $? "seed $seed: the hostile peer sent the victim ${offers:-no} offers of bells (pipes, three fds at once, fds on rings, real ones): the victim's fds $fds_before before, $fds_after after"
    bells="$(awk '/^bells/ {print $2}' "$it_tmp/hostile-$seed.log")"
    [[ "${bells:-0}" -gt 0 ]]
    it_check $? "seed $seed: the hostile peer filled to the top and made blocking every bell it holds (${bells:-none}), then had the victim answer it ($(grep -h '^answered\|^no answer' "$it_tmp/hostile-$seed.log"))"
    line="$(grep -h '^wrote\|^no queue' "$it_tmp/hostile-$seed.log")"
    [[ "$line" == wrote* ]]
    it_check $? "seed $seed: the hostile peer had the victim's queue mapped and wrote over what it could reach ('$line', $(grep -h '^forged\|^page' "$it_tmp/hostile-$seed.log" | tr '\n' ' '))"
    grep -q '^truncate refused' "$it_tmp/hostile-$seed.log"
    it_check $? "seed $seed: the queue the victim maps cannot be shrunk by its creator ($(grep -h '^truncate' "$it_tmp/hostile-$seed.log"))"
    if it_reap "$honest" 20; then
        it_check "$it_stop_rc" "seed $seed: honest client (daemon) $it_stop_text"
    else
        it_bad "seed $seed: honest client still running 20 s after it started"
    fi
    sent="$(awk '/^client sent/ {print $3, $4}' "$it_tmp/honest-$seed.log")"
    recv="$(awk '/^client received/ {print $3, $4}' "$it_tmp/honest-$seed.log")"
    [[ -n "$sent" && "$sent" == "$recv" && "${sent%% *}" -gt 0 ]]
    it_check $? "seed $seed: the honest connection is byte-exact through the attack (sent '$sent', received back '$recv')"
    it_expect_mode "$port" "honest-$seed" direct none "tx_fabric>0" "tx_ring=0" "tx_zcopy=0"
    if ! it_reap "$srv" 10; then
        it_bad "seed $seed: the victim hung (still running 10 s after its peers ended)"
        it_stop "$srv" KILL 3
    elif ((it_stop_rc != 0)); then
        it_bad "seed $seed: the victim $it_stop_text"
    else
        it_ok "seed $seed: the victim survived its hostile peer ($it_stop_text; $(grep -h '^server conn' "$it_tmp/victim-$seed.log" | tr '\n' ';'))"
    fi
done
it_finish
