#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for the sweep tests and for trying sweeps without a cluster.
#
#   bash scripts/slurm_local.sh install     # Debian's slurm-wlm and munge (root, apt-get)
#   bash scripts/slurm_local.sh start DIR   # writes DIR/slurm.conf, starts munged, slurmctld and slurmd
#   export SLURM_CONF=DIR/slurm.conf        # then sbatch/squeue/scontrol talk to it
#   bash scripts/slurm_local.sh stop DIR
#
# Every state, spool, log and pid file lives under DIR, so the cluster leaves nothing behind but munged.
set -euo pipefail

cmd=${1:-}
dir=${2:-}

install() {
    if command -v slurmctld >/dev/null 2>&1 && command -v munged >/dev/null 2>&1; then
        return 0
    fi
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo 'error: SLURM is missing and cannot be installed here (needs root and apt-get: apt-get install slurm-wlm munge)' >&2
        return 1
    fi
    echo 'installing slurm-wlm and munge (a local SLURM cluster for the sweep tests)'
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge; } >/dev/null
}

start() {
    [ -n "$dir" ] || { echo 'usage: slurm_local.sh start DIR' >&2; exit 2; }
    mkdir -p "$dir/state" "$dir/spool"
    dir=$(cd "$dir" && pwd)
    local host cpus mem
    host=$(hostname -s)
    cpus=$(nproc)
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
    cat >"$dir/slurm.conf" <<EOF
ClusterName=qclocal
SlurmctldHost=$host(127.0.0.1)
SlurmUser=$(id -un)
SlurmdUser=root
AuthType=auth/munge
# A requeued job waits this long before it starts again (Slurm default 120 s).
AuthInfo=cred_expire=${SLURM_CRED_EXPIRE:-120}
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldPort=${SLURMCTLD_PORT:-6817}
SlurmdPort=${SLURMD_PORT:-6818}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=60
MinJobAge=600
# The scheduler passes every second (Slurm default 60 s): a requeued job starts as soon as its wait is over.
SchedulerParameters=defer_batch,sched_interval=1
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    # munged runs as its own user; one already running (another cluster, a host service) is reused.
    if ! pgrep -x munged >/dev/null; then
        mkdir -p /run/munge && chown munge:munge /run/munge
        runuser -u munge -- /usr/sbin/munged
    fi
    export SLURM_CONF="$dir/slurm.conf"
    slurmctld -c -f "$SLURM_CONF"
    slurmd -f "$SLURM_CONF"
    for _ in $(seq 60); do
        if sinfo -h -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated)'; then
            echo "SLURM is up: export SLURM_CONF=$SLURM_CONF"
            return 0
        fi
        sleep 1
    done
    echo "error: SLURM did not come up; see $dir/slurmctld.log and $dir/slurmd.log" >&2
    return 1
}

stop() {
    [ -n "$dir" ] || { echo 'usage: slurm_local.sh stop DIR' >&2; exit 2; }
    for name in slurmd slurmctld; do
        if [ -f "$dir/$name.pid" ]; then
            kill "$(cat "$dir/$name.pid")" 2>/dev/null || true
        fi
    done
    for name in slurmd slurmctld; do
        for _ in $(seq 30); do
            [ -f "$dir/$name.pid" ] && kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null || break
            sleep 0.5
        done
    done
}

case "$cmd" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    *) echo 'usage: slurm_local.sh install | start DIR | stop DIR' >&2; exit 2 ;;
esac
