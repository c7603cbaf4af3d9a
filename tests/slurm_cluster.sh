#!/usr/bin/env bash
# A private single-node Slurm cluster for the launch tests: munged + slurmctld + slurmd, CPU-only, no GPUs.
#
#   tests/slurm_cluster.sh start DIR   # writes DIR/slurm.conf, starts the daemons, waits until the node is idle
#   tests/slurm_cluster.sh stop DIR    # stops them (by the pid files in DIR)
#
# Everything lives in DIR (key, sockets, state, logs, free ports): nothing under /etc is touched, so it can run
# next to a real Slurm. Clients find it through SLURM_CONF=DIR/slurm.conf. Needs root (slurmd starts tasks as
# the submitting user) and the Debian packages slurm-wlm and munge (.ci/run installs them).
set -euo pipefail
action=${1:?usage: slurm_cluster.sh start|stop DIR}
dir=$(realpath -m "${2:?usage: slurm_cluster.sh start|stop DIR}")
node=topoplan-node
# The node's address as Slurm records it (NodeAddr): a loopback alias that no launch option names, so a script
# that serves or meets there has read it from the allocation.
node_addr=127.0.0.2

stop() {
  for daemon in slurmd slurmctld munged; do
    if [ -s "$dir/$daemon.pid" ]; then kill "$(cat "$dir/$daemon.pid")" 2>/dev/null || true; fi
  done
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

if [ "$action" = stop ]; then stop; exit 0; fi
[ "$action" = start ] || { echo "slurm_cluster.sh: unknown action $action" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "slurm_cluster.sh: slurmd must run as root" >&2; exit 2; }
mkdir -p "$dir/ctld" "$dir/spool" "$dir/munge"
chmod 700 "$dir/munge"
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
       --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/munge.seed"

# This machine as slurmd sees it (CPUs, sockets, cores, threads), under our node name, with memory left to spare.
hardware=$(slurmd -C | head -n 1 | sed -e "s/^NodeName=[^ ]*/NodeName=$node NodeHostname=$(hostname) NodeAddr=$node_addr/" \
                                       -e 's/ RealMemory=[0-9]*/ RealMemory=1000/')
cat > "$dir/slurm.conf" <<CONF
ClusterName=topoplan
SlurmctldHost=$(hostname)(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
$hardware State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$dir/slurm.conf
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N "$node"
for _ in $(seq 60); do
  state=$(sinfo -h -n "$node" -o %t 2>/dev/null || true)
  case "$state" in idle*) echo "slurm_cluster.sh: node $node is $state (SLURM_CONF=$SLURM_CONF)"; exit 0 ;; esac
  sleep 1
done
echo "slurm_cluster.sh: node $node did not become idle (state: ${state:-none}); logs in $dir" >&2
tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
stop
exit 1
