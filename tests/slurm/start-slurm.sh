#!/usr/bin/env bash
# A one-node Slurm on this machine for the `slurm` ctest label (and for trying
# the slurm/*.sbatch templates by hand): Debian 12's slurm-wlm 22.05 + munge,
# slurmctld and slurmd on localhost, configuration in a private directory.
#
#   tests/slurm/start-slurm.sh             # install if missing, configure, start, wait for idle
#   export SLURM_CONF=/tmp/wlb4d-slurm-<id>/etc/slurm.conf   # (printed at the end)
#   sbatch -n 2 slurm/train-cpu.sbatch inputs/ci-slurm.ini
#   tests/slurm/stop-slurm.sh              # tear down (keeps the directory; --purge removes it)
#
# Idempotent: if the daemons are up and the node answers, it only prints the
# SLURM_CONF line. Needs root (daemons, apt-get). Exit status 0 when the node
# is idle, non-zero (with a message) otherwise; callers that can live without
# Slurm do `tests/slurm/start-slurm.sh || echo "slurm tests will skip"`.
#
# Settings (environment):
#   WLB4D_TEST_SLURM_DIR  private directory (default per checkout, tests/slurm/slurm-dir.sh:
#                         /tmp/wlb4d-slurm-<hash of the checkout's path>): etc/ spool/ log/ run/,
#                         and `owner` (this checkout, the daemons' pids) for stop-slurm.sh
#   WLB4D_SLURM_CPUS   CPUs the node advertises (default 16 = the --ntasks-per-node of
#                      slurm/train-cpu.sbatch). The machine may have fewer:
#                      SlurmdParameters=config_overrides makes slurmd trust slurm.conf,
#                      so 2..16-rank jobs run oversubscribed on 2 cores
#                      (TaskPlugin=task/none: no binding to CPUs that do not exist).
#   WLB4D_SLURM_PORT   slurmctld port (default per checkout, 7000..8998; slurmd uses PORT+1)
#
# Choices (container/VM without systemd or a writable cgroup tree): no cgroups
# (proctrack/linuxproc, task/none), no accounting database
# (AccountingStorageType=accounting_storage/none, JobAcctGatherType=jobacct_gather/none),
# so `sacct` does not work; finished jobs stay visible to `scontrol show job`
# for MinJobAge=3600 s, and every job's end state and exit code is appended to
# $WLB4D_TEST_SLURM_DIR/log/jobcomp.txt (jobcomp/filetxt).
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/slurm-dir.sh"
DIR=$WLB4D_TEST_SLURM_DIR
CPUS=${WLB4D_SLURM_CPUS:-16}
PORT=$WLB4D_SLURM_PORT
CONF=$DIR/etc/slurm.conf
export SLURM_CONF=$CONF
NODE=$(hostname -s)

say() { echo "start-slurm: $*"; }
die() { echo "start-slurm: ERROR: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (starts munged/slurmctld/slurmd)"

# ---- packages -----------------------------------------------------------------
PKGS=(slurmctld slurmd slurm-client munge)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  apt-get update -qq || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >/dev/null || die "apt-get install ${missing[*]} failed"
fi

node_state() { sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null | head -1; }

wait_idle() {  # up to $1 seconds
  local t=0 st
  while [ "$t" -lt "$1" ]; do
    st=$(node_state || true)
    case "$st" in
      idle|mixed|allocated) say "node $NODE is $st"; return 0 ;;
      down*|drain*|fail*) scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 1; t=$((t + 1))
  done
  return 1
}

# A pid file's process is alive and is a daemon of this folder's slurm.conf
# (a reused pid, or another instance's daemon, is not ours).
pid_alive() {
  [ -s "$1" ] || return 1
  local p; p=$(cat "$1")
  kill -0 "$p" 2>/dev/null && tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "-f $CONF"
}
[ ! -f "$WLB4D_SLURM_OWNER" ] || grep -qxF "checkout=$WLB4D_CHECKOUT" "$WLB4D_SLURM_OWNER" ||
  die "$DIR belongs to another checkout ($(grep '^checkout=' "$WLB4D_SLURM_OWNER")); set WLB4D_TEST_SLURM_DIR to a folder of your own"

# ---- already running? ---------------------------------------------------------
if [ -f "$CONF" ] && pid_alive "$DIR/run/slurmctld.pid" && pid_alive "$DIR/run/slurmd.pid" \
   && wait_idle 5; then
  say "already running"
  echo "export SLURM_CONF=$CONF"
  exit 0
fi

# ---- configuration ------------------------------------------------------------
mkdir -p "$DIR"/{etc,spool/ctld,spool/d,log,run}
chmod 755 "$DIR" "$DIR"/{etc,spool,log,run}
MEM=$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
MEM=${MEM:-1024}
cat >"$CONF" <<EOF
# Written by tests/slurm/start-slurm.sh: one-node test cluster for wlb4d.
# Real hardware: $(slurmd -C 2>/dev/null | head -1)
ClusterName=wlb4d-test
SlurmctldHost=$NODE
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/d
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups here: process tracking by /proc, no task binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# trust the node line below rather than the hardware (CPUs > cores: oversubscribed test node)
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# srun --mpi=pmi2 is what MPICH's simple PMI client speaks (see docs/cluster.md)
MpiDefault=none
# no accounting database: sacct is unavailable; scontrol remembers jobs for MinJobAge
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
MinJobAge=3600
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=10
# requeued jobs (sbatch --requeue, scontrol requeue) may run again
JobRequeue=1
NodeName=$NODE CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
cat >"$DIR/etc/cgroup.conf" <<'EOF'
# Written by tests/slurm/start-slurm.sh. Not used: proctrack/linuxproc and
# task/none need no cgroup plugin (containers have no writable cgroup tree).
CgroupAutomount=no
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
EOF

# ---- munge --------------------------------------------------------------------
started_munged=$(sed -n 's/^munged=//p' "$WLB4D_SLURM_OWNER" 2>/dev/null || true)
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  [ -s /etc/munge/munge.key ] || { /usr/sbin/mungekey --create >/dev/null 2>&1 || \
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null; }
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged --force >/dev/null 2>&1 || die "munged did not start"
  for _ in $(seq 20); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.5; done
  munge -n | unmunge >/dev/null 2>&1 || die "munge does not round-trip a credential"
  say "munged started"
  started_munged=1
fi

# ---- slurm daemons ------------------------------------------------------------
stop_pid() {
  if pid_alive "$1"; then
    local p; p=$(cat "$1"); kill "$p" 2>/dev/null || true
    for _ in $(seq 20); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
  fi
  rm -f "$1"
}
# a half-started set (one daemon dead) is restarted as a whole
stop_pid "$DIR/run/slurmd.pid"
stop_pid "$DIR/run/slurmctld.pid"

/usr/sbin/slurmctld -f "$CONF" || die "slurmctld did not start (see $DIR/log/slurmctld.log)"
for _ in $(seq 30); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.5; done
scontrol ping 2>/dev/null | grep -q UP || die "slurmctld does not answer (see $DIR/log/slurmctld.log)"
/usr/sbin/slurmd -f "$CONF" || die "slurmd did not start (see $DIR/log/slurmd.log)"
# The owner record: stop-slurm.sh stops these daemons only, and only from this checkout.
cat >"$WLB4D_SLURM_OWNER" <<EOF
checkout=$WLB4D_CHECKOUT
conf=$CONF
slurmctld=$(cat "$DIR/run/slurmctld.pid" 2>/dev/null)
slurmd=$(cat "$DIR/run/slurmd.pid" 2>/dev/null)
munged=${started_munged:-0}
EOF

if ! wait_idle 60; then
  sinfo -N -l >&2 || true
  tail -20 "$DIR/log/slurmd.log" "$DIR/log/slurmctld.log" >&2 || true
  die "node $NODE is not idle after 60 s"
fi
say "Slurm up: $(sinfo -h -o '%P %D %c CPUs %T' | head -1) (config $CONF)"
echo "export SLURM_CONF=$CONF"
