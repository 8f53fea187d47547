# Sourced first (before lib.sh) by the scripts that run processes as other
# users (services as their Debian users, clients as root): they need
# root, and they run in a mount namespace of their own with a private
# /dev/shm, so that the registries they open to other users are not the
# host's. Re-runs the script there (exit 77, a visible skip, where it
# cannot). The caller may set private_shm_why (what root is needed for)
# and private_shm_users (users that must exist) first.
if [[ "${SDIRECT_IT_PRIVATE_SHM:-0}" != 1 ]]; then
    ps_name="integration-$(basename "$0" .sh)"
    ps_skip() { printf 'SKIP %s: %s\n' "$ps_name" "$1"; printf 'SKIP %s: %s\n' "$ps_name" "$1" >&2; exit 77; }
    ((EUID == 0)) || ps_skip "needs root (${private_shm_why:-starts the service as root, as its package does})"
    for ps_user in ${private_shm_users:-}; do
        getent passwd "$ps_user" >/dev/null || ps_skip "user $ps_user is needed"
    done
    command -v setpriv >/dev/null || ps_skip "setpriv is not installed (util-linux)"
    command -v unshare >/dev/null || ps_skip "unshare is not installed (util-linux)"
    unshare --mount --propagation private true 2>/dev/null ||
        ps_skip "cannot make a mount namespace here (unshare --mount)"
    SDIRECT_IT_PRIVATE_SHM=1 exec unshare --mount --propagation private bash "$0" "$@"
fi
mount -t tmpfs -o mode=1777,size=512m sdirect-services /dev/shm || {
    echo "SKIP: cannot mount a private /dev/shm"
    exit 77
}
