#!/usr/bin/env bash
# A throwaway 3-node Slurm 22.05 cluster on this one machine, for clusterddp's own tests (and by hand).
#
#   tests/slurm/cluster.sh install   # Debian packages: munge slurmctld slurmd slurm-client iproute2
#   tests/slurm/cluster.sh up        # start munged, slurmctld, and slurmd "node1" and "node2"
#   source /tmp/clusterddp-cluster/env.sh; sinfo; sbatch ...
#   tests/slurm/cluster.sh status
#   tests/slurm/cluster.sh down      # stop what `up` started (by pid file), remove namespaces and hosts entries
#
# Each node is a slurmd in its own network namespace (veth to a private bridge on 10.200.0.0/24, no default
# route) and its own UTS namespace (hostname nodeN, plus an /etc/hosts entry): without its own hostname gloo
# binds to 127.0.0.1 and ranks on different "nodes" cannot connect. Needs root and Linux; no Docker.
# A "login node" namespace (10.200.0.10, no slurmd) is where the SSH tests start their sshd.
#
# A second, independent cluster (its own controller, munge, job ids) comes from the same script with other
# CLUSTERDDP_CLUSTER_* values (tests/test_remote.py does this); the defaults are the main test cluster.
#
# Three Slurm releases: CLUSTERDDP_SLURM_RELEASE=22.05 (default) runs Debian 12's packages from this machine;
# CLUSTERDDP_SLURM_RELEASE=24.11 runs Debian 13's (trixie) and 26.05 Debian testing's (forky), each installed by
# `install` into a root file system made with debootstrap (CLUSTERDDP_SLURM_ROOT, default
# /var/lib/clusterddp/slurm-RELEASE). Its daemons and clients run
# chrooted there, inside one private mount namespace (held by a sleeping process) in which /proc, /sys, /dev,
# /tmp, /root, /home, /work, /opt, /usr/local, /srv, /var/tmp, /etc/hosts, this repository, the tests' Python and
# CLUSTERDDP_CLUSTER_SHARE are the machine's own, so jobs see the same paths and Python environment; nothing of it
# is mounted on the machine itself. Clients come as
# wrappers in $DIR/bin (sbatch, srun, squeue, ...): `source $DIR/env.sh` puts them first on PATH.
set -euo pipefail

DIR="${CLUSTERDDP_CLUSTER_DIR:-/tmp/clusterddp-cluster}"
NAME="${CLUSTERDDP_CLUSTER_NAME:-cddptest}"
read -r -a NODES <<<"${CLUSTERDDP_CLUSTER_NODES:-node1 node2 node3}"
SUBNET="${CLUSTERDDP_CLUSTER_SUBNET:-10.200.0}"
BRIDGE="${CLUSTERDDP_CLUSTER_BRIDGE:-cddpbr0}"
IFPREFIX="${CLUSTERDDP_CLUSTER_IFPREFIX:-cddp-}"  # veth names: at most 15 bytes with the suffix
LOGIN="${CLUSTERDDP_CLUSTER_LOGIN-login}"         # empty: no login node namespace
FIRST_JOB_ID="${CLUSTERDDP_CLUSTER_FIRST_JOB_ID:-1}"
CTLD_ADDR=$SUBNET.254
CTLD_PORT="${CLUSTERDDP_CLUSTER_PORT:-16817}"
SLURMD_PORT=$((CTLD_PORT + 1))
CPUS_PER_NODE=8
GPUS_PER_NODE=2
HOSTS_TAG="# clusterddp-test-cluster${CLUSTERDDP_CLUSTER_TAG:-}"
RELEASE="${CLUSTERDDP_SLURM_RELEASE:-22.05}"
case "$RELEASE" in
    22.05) ROOT="" ; SUITE="" ;;
    24.11) ROOT="${CLUSTERDDP_SLURM_ROOT:-/var/lib/clusterddp/slurm-24.11}" ; SUITE=trixie ;;
    26.05) ROOT="${CLUSTERDDP_SLURM_ROOT:-/var/lib/clusterddp/slurm-26.05}" ; SUITE="${CLUSTERDDP_SLURM_SUITE:-forky}" ;;
    *) echo "cluster.sh: error: CLUSTERDDP_SLURM_RELEASE=$RELEASE: expected 22.05, 24.11 or 26.05" >&2; exit 2 ;;
esac
CLIENTS=(sbatch srun salloc squeue scontrol scancel sinfo sacct)
# What jobs in a release's root must see as on this machine (the Python environment, the tests' directories).
SHARED_DIRS=(/tmp /root /home /work /opt /usr/local /srv /var/tmp)
# ... and, wherever they are, this repository (an editable install points into it; CI clones it anywhere),
# the Python that runs the tests, and CLUSTERDDP_CLUSTER_SHARE (colon-separated directories).
HERE_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
# Libraries that a Python built on this machine (pyenv, venv) and torch need inside the root (trixie, forky).
ROOT_PACKAGES=slurmctld,slurmd,slurm-client,munge,util-linux,procps,libffi8,libssl3t64,libbz2-1.0,liblzma5,libsqlite3-0,libreadline8t64,libncursesw6,libuuid1,zlib1g,libstdc++6,libgomp1,libnsl2,libtirpc3t64,libcrypt1,libexpat1
# (libnsl2, for Python's nis module only, is libnsl3 in forky.)
[ "$SUITE" != forky ] || ROOT_PACKAGES="${ROOT_PACKAGES/libnsl2/libnsl3}"

log() { echo "cluster.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

need_root() {
    [ "$(id -u)" = 0 ] || die "must run as root (network namespaces, munged, slurmd)"
    [ "$(uname -s)" = Linux ] || die "needs Linux (network and UTS namespaces)"
}

install_root() {
    # Debian 13 "trixie" ships Slurm 24.11, testing ("forky") 26.05; their packages come from Debian's own mirror.
    if [ -x "$ROOT/usr/sbin/slurmctld" ] && [ -e "$ROOT/.clusterddp-slurm-root" ]; then
        local have
        have="$(chroot "$ROOT" dpkg-query -W -f="\${Version}" slurm-client 2>/dev/null || true)"
        # A moving suite (forky) holds whatever Slurm it had the day the root was made: the tests are labelled
        # with a release, so a root of another release is made again.
        if [ "${have%%.*}.$(cut -d. -f2 <<<"$have")" = "$RELEASE" ]; then
            log "Slurm $RELEASE root already at $ROOT (slurm-client $have)"
            return 0
        fi
        log "the root at $ROOT holds slurm-client ${have:-none}, not Slurm $RELEASE: making it again"
        rm -rf --one-file-system "$ROOT"
    fi
    if ! command -v debootstrap >/dev/null 2>&1; then
        log "installing debootstrap"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
    fi
    log "making a Debian $SUITE root with Slurm $RELEASE at $ROOT (debootstrap, about a minute)"
    local tmp="$ROOT.partial"
    rm -rf --one-file-system "$tmp"
    mkdir -p "$(dirname "$ROOT")"
    # A suite newer than this machine's debootstrap (forky on Debian 12) is made with the script of sid, which
    # every Debian suite after it shares.
    local script=()
    [ -e "/usr/share/debootstrap/scripts/$SUITE" ] || script=(/usr/share/debootstrap/scripts/sid)
    debootstrap --variant=minbase --include="$ROOT_PACKAGES" "$SUITE" "$tmp" \
        "${CLUSTERDDP_DEBIAN_MIRROR:-http://deb.debian.org/debian}" "${script[@]}" >"$ROOT.log" 2>&1 \
        || { tail -n 30 "$ROOT.log" >&2; die "debootstrap failed (log: $ROOT.log)"; }
    touch "$tmp/.clusterddp-slurm-root"
    mv "$tmp" "$ROOT"
    local got
    got="$(chroot "$ROOT" dpkg-query -W -f="\${Version}" slurm-client)"
    log "installed: slurm-client $got"
    [ "${got%%.*}.$(cut -d. -f2 <<<"$got")" = "$RELEASE" ] || log "warning: Debian's $SUITE now ships Slurm $got, not $RELEASE: the tests labelled $RELEASE run on $got (the summary says so); update RELEASES in tests/conftest.py"
}

cmd_install() {
    need_root
    [ -z "$ROOT" ] || { cmd_install_host; install_root; return; }
    cmd_install_host
}

cmd_install_host() {
    local missing=()
    # sshd and rsync: the remote-cluster tests log in to the login node and copy code there; tcsh and fish: login
    # shells that are not sh-like, which remote command lines must pass through (tests/test_clusters.py); openssl:
    # the password login node's test password (tests/login_node.py).
    for bin in munged slurmctld slurmd sbatch ip nsenter unshare /usr/sbin/sshd rsync ssh tcsh fish openssl; do
        command -v "$bin" >/dev/null 2>&1 || missing+=("$bin")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        log "Slurm, munge, sshd, rsync, tcsh and fish already installed"
        return 0
    fi
    log "installing munge, Slurm, sshd, rsync, tcsh and fish (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends munge slurmctld slurmd slurm-client iproute2 util-linux \
        openssh-server openssh-client rsync tcsh fish openssl >/dev/null
    # The packages' own services would fight ours for the default ports and key; we never use them.
    for svc in munge slurmctld slurmd ssh; do
        if command -v systemctl >/dev/null 2>&1; then systemctl stop "$svc" >/dev/null 2>&1 || true; fi
    done
}

pair_line() {
    # pair: two nodes and none to spare (a requeue without one of them could never start: tests/test_self_healing.py)
    [ "${#NODES[@]}" -lt 2 ] || echo "PartitionName=pair Nodes=${NODES[0]},${NODES[1]} Default=NO MaxTime=INFINITE State=UP"
}

expedite_line() {
    # Slurm 25.11+: jobs may ask for an expedited requeue (sbatch --requeue=expedite); clusterddp uses it where a
    # cluster allows it (tests/test_self_healing.py), so the newest release's cluster allows it.
    [ "$RELEASE" != 26.05 ] || echo "SlurmctldParameters=enable_expedited_requeue"
}

memory_lines() {
    # The newest release's cluster limits memory as a site would, so that a rank using more than its job asked for
    # is killed by Slurm for real (tests/test_self_healing.py): memory is consumable and each step's use is polled
    # every second and killed over its limit (OverMemoryKill: task/cgroup would need a cgroup tree per slurmd, and
    # the three share this machine's). A job that asks nothing gets 8000M per node, far more than any test uses,
    # and the nodes claim 8 x that, so that memory never decides where or when a job runs: CPUs still do.
    if [ "$RELEASE" = 26.05 ]; then
        echo "JobAcctGatherType=jobacct_gather/linux"
        echo "JobAcctGatherParams=OverMemoryKill"
        echo "JobAcctGatherFrequency=task=1"
        echo "SelectTypeParameters=CR_CPU_Memory"
        echo "DefMemPerNode=8000"
    else
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "SelectTypeParameters=CR_CPU"
    fi
}

node_memory() { if [ "$RELEASE" = 26.05 ]; then echo 64000; else echo 8000; fi; }

node_lines() {
    local i=1
    for n in "${NODES[@]}"; do
        echo "NodeName=$n NodeAddr=$SUBNET.$i NodeHostname=$n CPUs=$CPUS_PER_NODE RealMemory=$(node_memory) Gres=gpu:$GPUS_PER_NODE State=UNKNOWN"
        i=$((i + 1))
    done
}

write_config() {
    local ctl_host
    ctl_host="$(hostname -s)"
    mkdir -p "$DIR"/{state,log,run,munge,dev}
    for n in "${NODES[@]}"; do mkdir -p "$DIR/spool/$n"; done
    # Fake GPUs: character devices, so that Slurm sets CUDA_VISIBLE_DEVICES (plain files are accepted silently
    # but then it never does). Jobs still run gloo on CPU.
    for ((i = 0; i < GPUS_PER_NODE; i++)); do
        [ -c "$DIR/dev/nvidia$i" ] || mknod "$DIR/dev/nvidia$i" c 195 "$i"
    done
    cat >"$DIR/slurm.conf" <<EOF
ClusterName=$NAME
FirstJobId=$FIRST_JOB_ID
SlurmctldHost=$ctl_host($CTLD_ADDR)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
$(memory_lines)
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
SelectType=select/cons_tres
SlurmdParameters=config_overrides
SchedulerParameters=batch_sched_delay=0
$(expedite_line)
MpiDefault=none
ReturnToService=2
MinJobAge=300
KillWait=5
InactiveLimit=0
SlurmdTimeout=60
MessageTimeout=20
GresTypes=gpu
$(node_lines)
PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP
$(pair_line)
EOF
    cat >"$DIR/gres.conf" <<EOF
AutoDetect=off
Name=gpu File=$DIR/dev/nvidia[0-$((GPUS_PER_NODE - 1))]
EOF
    if [ -n "$ROOT" ]; then
        printf 'export SLURM_CONF=%s\nexport PATH=%s/bin:"$PATH"\n' "$DIR/slurm.conf" "$DIR" >"$DIR/env.sh"
    else
        echo "export SLURM_CONF=$DIR/slurm.conf" >"$DIR/env.sh"
    fi
}

# --- a release's root: one private mount namespace; daemons and clients chrooted in it ------------------------
extra_shared_dirs() {
    echo "$HERE_REPO"
    local py
    for py in "${CLUSTERDDP_PYTHON:-}" "$(command -v python3 || true)"; do
        [ -n "$py" ] && "$py" -c 'import os, sys; print(os.path.realpath(sys.prefix)); print(os.path.realpath(sys.base_prefix))' 2>/dev/null || true
    done
    local IFS=:
    for py in ${CLUSTERDDP_CLUSTER_SHARE:-}; do echo "$py"; done
}

# True when $1 need not be bound: under one already bound, or a system directory of the root itself
# (a Python in /usr must stay the root's own /usr, not shadow it).
shared_already() {
    local d="$1" b; shift
    case "$d" in
        / | /usr | /usr/* | /etc | /etc/* | /bin* | /sbin* | /lib* | /var | /var/lib* | /proc* | /sys* | /dev* | /run*) return 0 ;;
    esac
    for b in "$@"; do
        case "$d/" in "$b"/*) return 0 ;; esac
    done
    return 1
}

start_holder() {
    mkdir -p "$DIR/run" "$DIR/bin"
    local binds=() d
    for d in "${SHARED_DIRS[@]}"; do
        [ -d "$d" ] && binds+=("$d")
    done
    while IFS= read -r d; do
        d="$(realpath -e -- "$d" 2>/dev/null)" || continue
        [ -d "$d" ] && shared_already "$d" "${binds[@]}" || binds+=("$d")
    done < <(extra_shared_dirs)
    log "the $RELEASE root sees the machine's ${binds[*]}"
    # The mounts exist only in this namespace (private propagation): the machine's own tree is never touched,
    # and they vanish with the last process in it.
    # (setsid, and no inherited output: it outlives this script, which must not hold a caller's pipe open.)
    setsid unshare --mount --propagation private sh -c '
        root="$1"; shift
        for d in /proc /sys /dev "$@"; do mkdir -p "$root$d" && mount --rbind "$d" "$root$d" || exit 1; done
        [ -e "$root/etc/hosts" ] || : >"$root/etc/hosts"
        mount --bind /etc/hosts "$root/etc/hosts" || exit 1
        # The ready mark lives on a tmpfs of this namespace only: it cannot be a leftover of an earlier run.
        mount -t tmpfs -o size=1m clusterddp-mark "$root/mnt" && touch "$root/mnt/.clusterddp-mounted"
        exec sleep infinity' clusterddp-holder "$ROOT" "${binds[@]}" </dev/null >"$DIR/log/holder.log" 2>&1 &
    echo $! >"$DIR/run/holder.pid"
    local i
    for i in $(seq 100); do
        kill -0 "$(cat "$DIR/run/holder.pid")" 2>/dev/null || die "the mount namespace for $ROOT could not be made"
        if nsenter --mount="/proc/$(cat "$DIR/run/holder.pid")/ns/mnt" test -e "$ROOT/mnt/.clusterddp-mounted" 2>/dev/null
        then break; fi
        [ "$i" != 100 ] || die "the mount namespace for $ROOT did not come up"
        sleep 0.1
    done
    local c holder
    holder="$(cat "$DIR/run/holder.pid")"
    for c in "${CLIENTS[@]}"; do
        # Inside the root (a job calling scontrol), the real client; outside, enter the namespace and the root,
        # in the same working directory (the shared directories have the same paths there).
        cat >"$DIR/bin/$c" <<EOF
#!/bin/sh
# Slurm $RELEASE's $c from $ROOT (tests/slurm/cluster.sh).
[ -e /.clusterddp-slurm-root ] && exec /usr/bin/$c "\$@"
exec nsenter --mount=/proc/$holder/ns/mnt -- chroot "$ROOT" /bin/sh -c 'cd "\$1" 2>/dev/null || cd /; shift; exec "\$0" "\$@"' /usr/bin/$c "\$(pwd -P)" "\$@"
EOF
        chmod 0755 "$DIR/bin/$c"
    done
}

# "$@" chrooted in the release's root (in the holder's namespace), or as it is for 22.05.
in_root() {
    if [ -n "$ROOT" ]; then
        nsenter --mount="/proc/$(cat "$DIR/run/holder.pid")/ns/mnt" -- chroot "$ROOT" "$@"
    else
        "$@"
    fi
}

start_munge() {
    local m="$DIR/munge"
    # munged checks permissions: the socket directory must be world-executable, the key private.
    chmod 0755 "$DIR" "$m"
    if [ ! -f "$m/munge.key" ]; then
        dd if=/dev/urandom of="$m/munge.key" bs=1024 count=1 status=none
    fi
    chmod 0400 "$m/munge.key"
    in_root munged --socket="$m/munge.socket" --key-file="$m/munge.key" --pid-file="$m/munged.pid" \
        --log-file="$DIR/log/munged.log" --seed-file="$m/munged.seed"
}

setup_network() {
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
    ip addr replace "$CTLD_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    local i=1
    for n in "${NODES[@]}" $LOGIN; do
        local ns="cddp-$n" host_if="${IFPREFIX}h$i" node_if="${IFPREFIX}n$i"
        local addr="$SUBNET.$i"
        [ "$n" != "$LOGIN" ] || addr="$SUBNET.10"
        ip netns add "$ns" 2>/dev/null || true
        ip link show "$host_if" >/dev/null 2>&1 || ip link add "$host_if" type veth peer name "$node_if" netns "$ns"
        ip link set "$host_if" master "$BRIDGE" up
        ip -n "$ns" addr replace "$addr/24" dev "$node_if"
        ip -n "$ns" link set "$node_if" up
        ip -n "$ns" link set lo up
        grep -q "^$addr $n " /etc/hosts || echo "$addr $n $HOSTS_TAG" >>/etc/hosts
        i=$((i + 1))
    done
}

start_slurm() {
    export SLURM_CONF="$DIR/slurm.conf"
    in_root slurmctld -f "$DIR/slurm.conf"
    start_slurm_nodes
}

start_slurm_nodes() {
    for n in "${NODES[@]}"; do
        # Not `ip netns exec`: it remounts /sys, hides the cgroup tree, and slurmd 22.05 then dies
        # ("Unable to initialize cgroup plugin"). nsenter keeps the mounts; unshare --uts gives the hostname.
        if [ -n "$ROOT" ]; then
            nsenter --net="/run/netns/cddp-$n" --mount="/proc/$(cat "$DIR/run/holder.pid")/ns/mnt" \
                unshare --uts chroot "$ROOT" \
                sh -c 'hostname "$1" && exec slurmd -f "$2" -N "$1"' sh "$n" "$DIR/slurm.conf"
        else
            nsenter --net="/run/netns/cddp-$n" unshare --uts \
                sh -c 'hostname "$1" && exec slurmd -f "$2" -N "$1"' sh "$n" "$DIR/slurm.conf"
        fi
    done
}

wait_ready() {
    export SLURM_CONF="$DIR/slurm.conf"
    [ -z "$ROOT" ] || export PATH="$DIR/bin:$PATH"
    local deadline=$((SECONDS + 60))
    while ((SECONDS < deadline)); do
        local states
        states="$(sinfo --noheader --Node --partition=debug --format='%N %T' 2>/dev/null || true)"
        if [ "$(grep -c ' idle$' <<<"$states" || true)" = "${#NODES[@]}" ]; then
            log "up: ${#NODES[@]} nodes idle, $(sbatch --version) (source $DIR/env.sh to use it)"
            return 0
        fi
        sleep 0.3
    done
    log "nodes did not become idle within 60 s:"
    sinfo --Node --long >&2 || true
    tail -n 20 "$DIR"/log/*.log >&2 || true
    return 1
}

cmd_up() {
    need_root
    if [ -n "$ROOT" ]; then
        [ -e "$ROOT/.clusterddp-slurm-root" ] || die "no Slurm $RELEASE root at $ROOT: run 'CLUSTERDDP_SLURM_RELEASE=$RELEASE $0 install' first"
    else
        for bin in munged slurmctld slurmd sbatch ip nsenter unshare; do
            command -v "$bin" >/dev/null 2>&1 || die "$bin is not installed: run '$0 install' first"
        done
    fi
    if [ -f "$DIR/run/slurmctld.pid" ] && kill -0 "$(cat "$DIR/run/slurmctld.pid")" 2>/dev/null; then
        log "already up (down first for a fresh cluster)"
        wait_ready
        return
    fi
    # Job state survives a slurmctld restart: a fresh cluster needs a fresh state directory.
    stop_all quiet
    rm -rf "$DIR"
    write_config
    [ -z "$ROOT" ] || start_holder
    start_munge
    setup_network
    start_slurm
    wait_ready
}

kill_pidfile() {
    local f="$1"
    [ -f "$f" ] || return 0
    local pid
    pid="$(cat "$f")"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
}

stop_all() {
    local quiet="${1:-}"
    # Job steps started by slurmd live in the node namespaces: end them with their namespace's processes
    # (and the login node's sshd with its sessions).
    for n in "${NODES[@]}" $LOGIN; do
        if [ -e "/run/netns/cddp-$n" ]; then
            for pid in $(ip netns pids "cddp-$n" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
        fi
        kill_pidfile "$DIR/run/slurmd-$n.pid"
    done
    kill_pidfile "$DIR/run/slurmctld.pid"
    kill_pidfile "$DIR/munge/munged.pid"
    kill_pidfile "$DIR/run/holder.pid"  # the root's mount namespace ends with it
    local i=1
    for n in "${NODES[@]}" $LOGIN; do
        ip link del "${IFPREFIX}h$i" 2>/dev/null || true
        ip netns del "cddp-$n" 2>/dev/null || true
        i=$((i + 1))
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    if grep -q "$HOSTS_TAG\$" /etc/hosts; then
        # /etc/hosts may be a bind mount: rewrite it in place rather than replacing the file.
        local kept
        kept="$(grep -v "$HOSTS_TAG\$" /etc/hosts)"
        printf '%s\n' "$kept" >/etc/hosts
    fi
    [ -n "$quiet" ] || log "down"
}

# A node that dies whole (tests: Slurm's own node failure): every process in its namespace, slurmd included, killed.
cmd_kill_node() {
    local n="${1:?usage: $0 kill-node NODE}" pids
    pids="$(ip netns pids "cddp-$n" 2>/dev/null || true)"
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
    log "killed every process of $n"
}

# The node back: its slurmd started again (ReturnToService=2 then returns it to service when it registers).
cmd_revive_node() {
    local n="${1:?usage: $0 revive-node NODE}"
    export SLURM_CONF="$DIR/slurm.conf"
    [ -z "$ROOT" ] || export PATH="$DIR/bin:$PATH"
    NODES=("$n")
    start_slurm_nodes
    local deadline=$((SECONDS + 60))
    while ((SECONDS < deadline)); do
        scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true
        [ "$(sinfo --noheader --Node --nodes="$n" --format='%t' 2>/dev/null | head -n1)" = idle ] && { log "$n is back"; return 0; }
        sleep 0.5
    done
    die "$n did not come back within 60 s"
}

cmd_down() {
    need_root
    stop_all
    [ "${1:-}" = "--keep" ] || rm -rf "$DIR"
}

cmd_status() {
    export SLURM_CONF="$DIR/slurm.conf"
    [ -z "$ROOT" ] || export PATH="$DIR/bin:$PATH"
    [ -f "$SLURM_CONF" ] || die "not up ($DIR has no slurm.conf)"
    sinfo --Node --long
    squeue
}

case "${1:-}" in
    install) cmd_install ;;
    up) cmd_up ;;
    down) shift; cmd_down "$@" ;;
    kill-node) shift; cmd_kill_node "$@" ;;
    revive-node) shift; cmd_revive_node "$@" ;;
    status) cmd_status ;;
    env) cat "$DIR/env.sh" ;;
    *) echo "usage: $0 install|up|down [--keep]|status|env" >&2; exit 2 ;;
esac
