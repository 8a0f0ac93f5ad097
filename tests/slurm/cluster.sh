#!/usr/bin/env bash
# A SLURM cluster on this machine, from Debian's packages (issue 53):
#
#   tests/slurm/cluster.sh up N        munged, slurmctld and N slurmd nodes node1..nodeN; prints
#                                      the `export` lines that make srun/sbatch/sinfo/scancel
#                                      talk to it:   eval "$(tests/slurm/cluster.sh up 2)"
#   tests/slurm/cluster.sh down        stops every daemon, removes everything `up` made
#   tests/slurm/cluster.sh status      sinfo, and the daemons' pids
#   tests/slurm/cluster.sh kill-node I SIGKILL every process of node I (its slurmd, slurmstepd,
#                                      tasks): the node is lost, as if powered off
#
# Each node is a network namespace (npsl-nodeI) with its own address 10.77.0.I/24 on a veth pair
# whose other end sits on a bridge (npslbr0, 10.77.0.254) in the root namespace, where slurmctld
# and munged run; each slurmd runs in a UTS and a mount namespace of its own too (`unshare --uts
# --mount` inside `nsenter --net`), so `hostname` on a node says nodeI. The subnet exists only
# inside this machine: nothing is routed out of it. Names resolve inside the nodes through
# $DIR/etc/hosts, bind-mounted over /etc/hosts in each node's own mount namespace; slurm.conf
# gives every node's address, so the root namespace needs no name. Processes share this
# machine's file system and PID namespace (a job's working directory is the same path on every
# node; `kill-node` finds a node's processes with `ip netns pids`).
#
# Needs root (namespaces, daemons as root); installs slurmctld, slurmd, slurm-client and munge
# with apt-get when they are missing. State, configuration and logs: $NPUSIM_SLURM_DIR (default
# /tmp/npusim-slurm); the daemons' logs are there when something fails.
set -euo pipefail
DIR=${NPUSIM_SLURM_DIR:-/tmp/npusim-slurm}
NET=10.77.0
BR=npslbr0
CTL=npslctl                 # the controller's host name (its own UTS namespace)
CTL_PORT=16817              # not slurm's default port: a system slurmctld may have that
PKGS="slurmctld slurmd slurm-client munge"

die() { echo "cluster.sh: $*" >&2; exit 1; }
log() { echo "cluster.sh: $*" >&2; }

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    for b in slurmctld slurmd srun munged; do
      command -v "$b" >/dev/null \
        || die "needs root, and slurm or munge is missing: sudo apt-get install -y $PKGS; sudo $0 $*"
    done
    die "needs root (network namespaces, daemons); run: sudo $0 $*"
  fi
  command -v ip >/dev/null || die "needs ip (iproute2): apt-get install iproute2"
  command -v unshare >/dev/null || die "needs unshare (util-linux)"
}

install_packages() {
  local missing=""
  for b in slurmctld slurmd srun munged; do
    command -v "$b" >/dev/null || missing=1
  done
  [ -z "$missing" ] && return 0
  [ "$(id -u)" -eq 0 ] || die "slurm or munge is missing: apt-get install -y $PKGS (as root)"
  log "installing $PKGS"
  export DEBIAN_FRONTEND=noninteractive
  # policy-rc.d may forbid starting services at install (a container): this script starts them
  if ! apt-get install -y --no-install-recommends $PKGS >"$DIR/apt.log" 2>&1; then
    apt-get update >>"$DIR/apt.log" 2>&1 || true
    apt-get install -y --no-install-recommends $PKGS >>"$DIR/apt.log" 2>&1 \
      || die "apt-get install $PKGS failed (log: $DIR/apt.log)"
  fi
}

nodes_made() { cat "$DIR/nodes" 2>/dev/null || echo 0; }

write_conf() {
  local n=$1 i
  mkdir -p "$DIR/etc" "$DIR/ctld" "$DIR/log" "$DIR/run"
  cat >"$DIR/etc/slurm.conf" <<EOF
# made by tests/slurm/cluster.sh up $n: a test cluster on one machine (see that script)
ClusterName=npusim
SlurmctldHost=$CTL($NET.254)
SlurmctldPort=$CTL_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/linear
ReturnToService=2
# a lost node is declared down after 20 s (slurm's default: 300 s), later than npurun's own
# NPUSIM_NODE_TIMEOUT (30 s, 5 s in the test): npurun names the lost ranks first
SlurmdTimeout=20
KillOnBadExit=1
SlurmctldTimeout=10
InactiveLimit=0
MinJobAge=10
KillWait=5
# the nodes share the machine's cores: each claims them (config, not hardware, counts)
SlurmdParameters=config_overrides
EOF
  for i in $(seq 1 "$n"); do
    echo "NodeName=node$i NodeAddr=$NET.$i NodeHostname=node$i CPUs=2 RealMemory=1000 State=UNKNOWN" \
      >>"$DIR/etc/slurm.conf"
  done
  echo "PartitionName=debug Nodes=node[1-$n] Default=YES MaxTime=INFINITE State=UP" \
    >>"$DIR/etc/slurm.conf"
  : >"$DIR/etc/cgroup.conf"
}

hosts_file() {
  local n=$1 i
  grep -Ev "(^| )(node[0-9]+|$CTL)( |$)" /etc/hosts || true
  echo "$NET.254 $CTL"
  for i in $(seq 1 "$n"); do echo "$NET.$i node$i"; done
}

wait_for() {   # wait_for SECONDS WHAT COMMAND...
  local t=$1 what=$2 end
  shift 2
  end=$(( $(date +%s) + t ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || { log "$what did not happen within $t s"; return 1; }
    sleep 0.2
  done
}

up() {
  local n=${1:-2} i
  [[ "$n" =~ ^[1-9][0-9]?$ ]] && [ "$n" -le 50 ] || die "up N: N must be 1..50, got '$n'"
  need_root up "$n"
  [ -e "$DIR/nodes" ] && die "a cluster is up already ($DIR); run: $0 down"
  if ip -o addr show | grep -q " $NET\."; then
    die "the test subnet $NET.0/24 is in use on this machine; bring it down first ($0 down)"
  fi
  mkdir -p "$DIR"
  chmod 755 "$DIR"
  install_packages
  echo 0 >"$DIR/nodes"
  write_conf "$n"
  hosts_file "$n" >"$DIR/etc/hosts"
  # munge: a fresh key, our own socket (slurm.conf's AuthInfo tells every daemon and client)
  mkdir -p "$DIR/munge"
  chmod 711 "$DIR/munge"
  head -c 1024 /dev/urandom >"$DIR/munge/munge.key"
  chmod 400 "$DIR/munge/munge.key"
  munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$DIR/munge/munged.seed" || die "munged did not start (log: $DIR/log/munged.log)"
  # the network: a bridge in the root namespace, one namespace per node
  ip link add "$BR" type bridge
  ip addr add "$NET.254/24" dev "$BR"
  ip link set "$BR" up
  for i in $(seq 1 "$n"); do
    local ns=npsl-node$i
    ip netns add "$ns"
    echo "$i" >"$DIR/nodes"
    ip link add "npslv$i" type veth peer name eth0 netns "$ns"
    ip link set "npslv$i" master "$BR" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$NET.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    mkdir -p "$DIR/spool/node$i"
  done
  # slurmctld in the root namespace (own UTS namespace: its host name is SlurmctldHost's)
  setsid unshare --uts sh -c "hostname $CTL && exec slurmctld -D -i -f '$DIR/etc/slurm.conf'" \
    >"$DIR/log/slurmctld.out" 2>&1 </dev/null &
  for i in $(seq 1 "$n"); do
    # nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup mounts slurmd needs;
    # the node's own mount namespace puts its hosts file over /etc/hosts
    setsid nsenter --net="/run/netns/npsl-node$i" unshare --uts --mount sh -c \
      "hostname node$i && mount --bind '$DIR/etc/hosts' /etc/hosts && \
       exec slurmd -D -N node$i -f '$DIR/etc/slurm.conf'" \
      >"$DIR/log/slurmd-node$i.out" 2>&1 </dev/null &
  done
  export SLURM_CONF="$DIR/etc/slurm.conf"
  if ! wait_for 60 "every node idle" sh -c \
      "[ \"\$(sinfo -h -N -t idle -o %N | sort -u | wc -l)\" -eq $n ]"; then
    sinfo -N >&2 || true
    tail -n 5 "$DIR"/log/*.log >&2 || true
    die "the cluster did not come up (logs: $DIR/log); run: $0 down"
  fi
  log "$n nodes idle: $(sinfo -h -N -o %N | sort -u | tr '\n' ' ')"
  echo "export SLURM_CONF=$DIR/etc/slurm.conf"
  echo "export PATH=$(dirname "$(command -v srun)"):\$PATH"
}

daemon_pids() {   # every slurmctld / slurmd / slurmstepd / munged this cluster started
  local p
  for p in $(pgrep -x 'slurmctld|slurmd|slurmstepd|munged' || true); do
    if { tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null | grep -q -- "$DIR/"; then
      echo "$p"
    elif [ "$(cat /proc/$p/comm 2>/dev/null)" = slurmstepd ]; then
      # a step daemon's command line is bare: it belongs to us if a node of ours runs it
      local ns
      ns=$(ip netns identify "$p" 2>/dev/null || true)
      [[ "$ns" == npsl-node* ]] && echo "$p"
    fi
  done
}

kill_node() {
  local i=$1 ns=npsl-node$1
  need_root kill-node "$i"
  ip netns list | grep -qw "$ns" || die "no node $i (namespace $ns)"
  local pids
  pids=$(ip netns pids "$ns" || true)
  [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
  log "node$i lost: killed $(echo $pids | wc -w) processes"
}

down() {
  need_root down
  local n i p pids
  n=$(nodes_made)
  # the nodes' processes first (slurmd, step daemons, tasks), then the controller and munge
  for i in $(seq 1 "$n"); do
    pids=$(ip netns pids "npsl-node$i" 2>/dev/null || true)
    [ -n "$pids" ] && kill -TERM $pids 2>/dev/null || true
  done
  pids=$(daemon_pids)
  [ -n "$pids" ] && kill -TERM $pids 2>/dev/null || true
  for _ in $(seq 1 50); do
    pids="$(daemon_pids) $(for i in $(seq 1 "$n"); do ip netns pids "npsl-node$i" 2>/dev/null; done)"
    [ -z "${pids// /}" ] && break
    sleep 0.1
  done
  pids="$(daemon_pids) $(for i in $(seq 1 "$n"); do ip netns pids "npsl-node$i" 2>/dev/null; done)"
  if [ -n "${pids// /}" ]; then
    kill -9 $pids 2>/dev/null || true
    sleep 0.2
  fi
  for i in $(seq 1 "$n"); do
    ip netns del "npsl-node$i" 2>/dev/null || true     # deletes its veth end, so the pair
    ip link del "npslv$i" 2>/dev/null || true
  done
  ip link del "$BR" 2>/dev/null || true
  rm -rf "$DIR"
  left=$(daemon_pids)
  [ -z "$left" ] || die "daemons left: $left"
  log "down: no daemon left, namespaces, bridge and $DIR removed"
}

status() {
  export SLURM_CONF="$DIR/etc/slurm.conf"
  [ -e "$DIR/nodes" ] || { echo "no cluster up ($DIR)"; return 1; }
  sinfo -N
  echo "daemons: $(daemon_pids | tr '\n' ' ')"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  status) status ;;
  kill-node) [ -n "${2:-}" ] || die "usage: $0 kill-node I"; kill_node "$2" ;;
  *) die "usage: $0 up N | down | status | kill-node I" ;;
esac
