#!/usr/bin/env bash
# Unit test of the Slurm templates without Slurm (label unit): the scripts are
# run as plain bash with DRY_RUN=1 and the SLURM_* variables a job would have,
# so the layout check, the sweep-line selection, the launch lines and the
# chain helper are checked on every CI run, Slurm daemons or not.
#   WLB4D_SRC=. WLB4D_BIN=build/app/wlb4d tests/slurm/templates_test.sh
set -uo pipefail
SRC=${WLB4D_SRC:?}
BIN=${WLB4D_BIN:?}
T=$(mktemp -d)
# The shipped quickstart deck is 8-rank 4D; the launch-line cases below use a
# 1-rank copy (same name, so the patterns still see quickstart.ini).
sed -e "s/^dp = .*/dp = 1/" -e "s/^pp = .*/pp = 1/" -e "s/^cp = .*/cp = 1/" inputs/quickstart.ini > "$T/quickstart.ini"
trap 'rm -rf "$T"' EXIT
cd "$SRC"
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect() { # expect DESCRIPTION STATUS PATTERN -- command...: status and output pattern
  local what=$1 want=$2 pat=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" = "$want" ] && grep -Eq -- "$pat" <<<"$out"; then ok "$what"; else
    bad "$what (status $rc, want $want; pattern '$pat')"
    echo "$out" | sed 's/^/    /'
  fi
}
run() { env -u SLURM_JOB_ID -u SLURM_NTASKS -u SLURM_NPROCS DRY_RUN=1 WLB4D_BIN="$BIN" "$@"; }

for f in slurm/*.sbatch slurm/*.sh slurm/lib/*.sh tests/slurm/*.sh; do
  if bash -n "$f"; then ok "bash -n $f"; else bad "bash -n $f"; fi
done

# Every line of the shipped 8-rank sweep resolves against the quickstart deck.
n=$(sed -e 's/#.*//' inputs/sweeps/layouts-8.txt | grep -c '[^[:space:]]')
for ((i = 0; i < n; i++)); do
  expect "layouts-8.txt line $i is a valid 8-rank layout of quickstart.ini" 0 'layout dp=[0-9]+ pp=[0-9]+ cp=[0-9]+ tp=[0-9]+ -> 8 ranks' -- \
    run SLURM_NTASKS=8 TASK=$i RUN_DIR="$T/sweep/$i" bash slurm/sweep.sbatch inputs/quickstart.ini inputs/sweeps/layouts-8.txt
done
expect "sweep: the task's own checkpoint dir and timing log" 0 "checkpoint.dir=$T/sweep/1/checkpoints.*log.timing_file=$T/sweep/1/timing.h5" -- \
  run SLURM_NTASKS=8 TASK=1 RUN_DIR="$T/sweep/1" bash slurm/sweep.sbatch inputs/quickstart.ini inputs/sweeps/layouts-8.txt
expect "sweep: an index past the file fails" 2 "array task $n but .* has $n lines" -- \
  run SLURM_NTASKS=8 TASK=$n RUN_DIR="$T/sweep/x" bash slurm/sweep.sbatch inputs/quickstart.ini inputs/sweeps/layouts-8.txt

# Layout check of the CPU template.
expect "train-cpu: matching layout, srun launch line" 0 'launch: srun --mpi=pmi2 --ntasks=4 --kill-on-bad-exit=1 --cpu-bind=cores .*quickstart.ini --parallel.dp=4' -- \
  run SLURM_NTASKS=4 RUN_DIR="$T/cpu" bash slurm/train-cpu.sbatch "$T/quickstart.ini" --parallel.dp=4
expect "train-cpu: task count != dp*pp*cp*tp fails with the keys" 2 'parallel.dp\*pp\*cp\*tp = 2\*1\*1\*1 = 2 ranks, but this job has 3 tasks' -- \
  run SLURM_NTASKS=3 RUN_DIR="$T/cpu" bash slurm/train-cpu.sbatch "$T/quickstart.ini" --parallel.dp=2
expect "train-cpu: EXTRA overrides are applied" 2 '= 2\*2\*1\*1 = 4 ranks, but this job has 2 tasks' -- \
  run SLURM_NTASKS=2 EXTRA="--parallel.pp=2" RUN_DIR="$T/cpu" bash slurm/train-cpu.sbatch "$T/quickstart.ini" --parallel.dp=2
expect "train-cpu: a bad deck key fails before launch" 2 'does not resolve' -- \
  run SLURM_NTASKS=1 RUN_DIR="$T/cpu" bash slurm/train-cpu.sbatch "$T/quickstart.ini" --parallel.dq=2
expect "train-cpu: LAUNCHER=mpiexec, one core per rank with -c 1" 0 'launch: mpiexec -n 2 -bind-to core:1 ' -- \
  run SLURM_NTASKS=2 LAUNCHER=mpiexec RUN_DIR="$T/cpu" bash slurm/train-cpu.sbatch "$T/quickstart.ini" --parallel.dp=2
expect "train-cpu: LAUNCHER=mpiexec binds each rank to its -c 2 cores (hydra -bind-to core:2)" 0 'launch: mpiexec -n 2 -bind-to core:2 ' -- \
  run SLURM_NTASKS=2 SLURM_CPUS_PER_TASK=2 LAUNCHER=mpiexec RUN_DIR="$T/cpu2" bash slurm/train-cpu.sbatch "$T/quickstart.ini" --parallel.dp=2
# The real hydra with the template's options: a rank of a -c 2 job runs on 2 cores.
margs=$(sed -n 's/^mpiexec -n 2 \(.*\) [^ ]*wlb4d .*/\1/p' "$T/cpu2/launch.txt")
if [ "$(nproc)" -ge 2 ] && command -v mpiexec >/dev/null; then
  expect "hydra with the template's '$margs': the rank's CPU mask has 2 CPUs" 0 '^2$' -- \
    bash -c "mpiexec -n 1 $margs grep Cpus_allowed_list /proc/self/status | awk '{n=0; k=split(\$2,a,\",\"); for(i=1;i<=k;i++){m=split(a[i],r,\"-\"); n+=(m==1?1:r[2]-r[1]+1)} print n}'"
else
  echo "skip: hydra binding check (needs mpiexec and 2 CPUs)"
fi
expect "srun: --kill-on-bad-exit=1 (one failed rank ends the step)" 0 'launch: srun .*--kill-on-bad-exit=1 ' -- \
  run SLURM_NTASKS=2 RUN_DIR="$T/kill" bash slurm/train-cpu.sbatch "$T/quickstart.ini" --parallel.dp=2
# Site placeholders and environment hook.
for f in slurm/train-cpu.sbatch slurm/train-gpu.sbatch slurm/sweep.sbatch; do
  for o in account qos constraint partition; do
    expect "$f: a disabled ##SBATCH --$o=<...> placeholder" 0 "^##SBATCH --$o=<" -- cat "$f"
  done
  expect "$f: no live #SBATCH --account (a site choice)" 0 '' -- bash -c "! grep -Eq '^#SBATCH --account' $f"
done
printf 'export WLB4D_BIN=%q\necho "site: module load stand-in"\n' "$BIN" >"$T/site.sh"
expect "WLB4D_SITE_ENV is sourced first (its WLB4D_BIN is used)" 0 "site environment: source $T/site.sh.*site: module load stand-in.*bin $BIN " -- \
  bash -c "env -u SLURM_JOB_ID -u WLB4D_BIN DRY_RUN=1 SLURM_NTASKS=1 WLB4D_SITE_ENV=$T/site.sh RUN_DIR=$T/site bash slurm/train-cpu.sbatch $T/quickstart.ini 2>&1 | tr '\n' ' '"
expect "WLB4D_SITE_ENV naming a missing file fails" 2 'WLB4D_SITE_ENV=/nonexistent/site.sh is not a readable file' -- \
  run SLURM_NTASKS=1 WLB4D_SITE_ENV=/nonexistent/site.sh RUN_DIR="$T/site" bash slurm/train-cpu.sbatch "$T/quickstart.ini"
expect "train-cpu: task count from SLURM_NNODES*SLURM_NTASKS_PER_NODE" 0 '-> 4 ranks \| job: 4 tasks on 2 nodes' -- \
  run SLURM_NNODES=2 SLURM_NTASKS_PER_NODE=2 RUN_DIR="$T/cpu" bash slurm/train-cpu.sbatch "$T/quickstart.ini" --parallel.dp=4
expect "train-cpu: LAUNCHER must be srun or mpiexec" 2 'LAUNCHER=aprun: must be srun or mpiexec' -- \
  run SLURM_NTASKS=1 LAUNCHER=aprun RUN_DIR="$T/cpu" bash slurm/train-cpu.sbatch "$T/quickstart.ini"

# GPU template: --gpu-bind=none, per-rank device from the local rank, NCCL backend.
expect "train-gpu: srun --gpu-bind=none, bind-gpu.sh, comm.backend=nccl" 0 \
  'launch: srun --mpi=pmi2 --ntasks=8 --kill-on-bad-exit=1 --cpu-bind=cores --gpu-bind=none .*/lib/bind-gpu.sh .*quickstart.ini .*--comm.backend=nccl' -- \
  run SLURM_NTASKS=8 SLURM_NNODES=2 SLURM_NTASKS_PER_NODE=4 SLURM_GPUS_PER_NODE=4 RUN_DIR="$T/gpu" \
  bash slurm/train-gpu.sbatch "$T/quickstart.ini" --parallel.dp=8 --train.micro_batches=8
# The deck's plan.devices_per_node (8 by default, as inputs/cluster-h200.ini)
# against the job's GPUs per node: a warning when they differ, none when equal.
expect "train-gpu: warns when plan.devices_per_node differs from the job's GPUs per node" 0 \
  "warning: the deck's plan.devices_per_node=8 but this job has 4 GPUs per node" -- \
  run SLURM_NTASKS=8 SLURM_NNODES=2 SLURM_NTASKS_PER_NODE=4 SLURM_GPUS_PER_NODE=4 RUN_DIR="$T/gpu-dpn" \
  bash slurm/train-gpu.sbatch "$T/quickstart.ini" --parallel.dp=8 --train.micro_batches=8
expect "train-gpu: no warning when they agree" 0 '' -- bash -c "! env -u SLURM_JOB_ID -u SLURM_NTASKS DRY_RUN=1 \
  WLB4D_BIN=$BIN SLURM_NTASKS=8 SLURM_NNODES=1 SLURM_NTASKS_PER_NODE=8 SLURM_GPUS_PER_NODE=h200:8 \
  RUN_DIR=$T/gpu-dpn8 bash slurm/train-gpu.sbatch $T/quickstart.ini --parallel.dp=8 --train.micro_batches=8 2>&1 |
  grep -q 'plan.devices_per_node'"
expect "bind-gpu.sh: KOKKOS_DEVICE_ID = SLURM_LOCALID" 0 '^3$' -- \
  env -u MPI_LOCALRANKID SLURM_LOCALID=3 SLURM_GPUS_ON_NODE=4 slurm/lib/bind-gpu.sh bash -c 'echo $KOKKOS_DEVICE_ID'
expect "bind-gpu.sh: mpiexec's MPI_LOCALRANKID wins over SLURM_LOCALID, modulo GPUs" 0 '^1$' -- \
  env -u WLB4D_GPU_MAP MPI_LOCALRANKID=5 SLURM_LOCALID=0 SLURM_GPUS_ON_NODE=4 slurm/lib/bind-gpu.sh bash -c 'echo $KOKKOS_DEVICE_ID'
expect "bind-gpu.sh: WLB4D_GPU_MAP maps local rank 1 -> GPU 3" 0 '^3$' -- \
  env -u MPI_LOCALRANKID SLURM_LOCALID=1 WLB4D_GPU_MAP=2,3,0,1 slurm/lib/bind-gpu.sh bash -c 'echo $KOKKOS_DEVICE_ID'
# GPU order from `nvidia-smi topo -m` (a stand-in printing the layout of a node whose
# GPUs 0,1 sit on NUMA node 1 and 2,3 on NUMA node 0, with two NIC columns).
mkdir -p "$T/smi"
{
  echo '#!/bin/bash'
  echo '[ "$1 $2" = "topo -m" ] || exit 1'
  echo "printf '\\tGPU0\\tGPU1\\tGPU2\\tGPU3\\tNIC0\\tNIC1\\tCPU Affinity\\tNUMA Affinity\\tGPU NUMA ID\\n'"
  echo "printf 'GPU0\\t X \\tNV18\\tNV18\\tNV18\\tSYS\\tPIX\\t48-95\\t1\\t\\tN/A\\n'"
  echo "printf 'GPU1\\tNV18\\t X \\tNV18\\tNV18\\tSYS\\tPIX\\t48-95\\t1\\t\\tN/A\\n'"
  echo "printf 'GPU2\\tNV18\\tNV18\\t X \\tNV18\\tPIX\\tSYS\\t0-47\\t0\\t\\tN/A\\n'"
  echo "printf 'GPU3\\tNV18\\tNV18\\tNV18\\t X \\tPIX\\tSYS\\t0-47\\t0\\t\\tN/A\\n'"
  echo "printf '\\nLegend:\\n\\n  X    = Self\\n'"
} >"$T/smi/nvidia-smi"
chmod +x "$T/smi/nvidia-smi"
expect "wlb4d_gpu_numa_order: GPUs sorted by NUMA affinity" 0 '^2,3,0,1$' -- \
  bash -c "PATH=$T/smi:\$PATH; source slurm/lib/wlb4d-job.sh; wlb4d_gpu_numa_order"
expect "train-gpu: WLB4D_GPU_MAP defaults to the NUMA order" 0 'WLB4D_GPU_MAP=2,3,0,1' -- \
  bash -c "PATH=$T/smi:\$PATH env -u SLURM_JOB_ID -u WLB4D_GPU_MAP DRY_RUN=1 WLB4D_BIN=$BIN SLURM_NTASKS=1 RUN_DIR=$T/gpumap bash slurm/train-gpu.sbatch $T/quickstart.ini >/dev/null 2>&1; cat $T/gpumap/launch.txt $T/gpumap/env.txt"
expect "wlb4d_gpu_numa_order: nothing without nvidia-smi" 0 '^$' -- \
  bash -c "NVIDIA_SMI=/nonexistent/nvidia-smi; source slurm/lib/wlb4d-job.sh; wlb4d_gpu_numa_order"
# NCCL fabric settings: documented as commented site choices, never set by default.
for v in NCCL_NET NCCL_SOCKET_IFNAME NCCL_IB_HCA FI_PROVIDER FI_CXI_DISABLE_HOST_REGISTER FI_CXI_DEFAULT_CQ_SIZE; do
  expect "train-gpu: $v documented as a commented site choice" 0 "^# export $v=" -- cat slurm/train-gpu.sbatch
  expect "train-gpu: $v not set by the template" 0 '' -- bash -c "! grep -Eq '^[[:space:]]*export $v=' slurm/train-gpu.sbatch"
done

# submit-chain.sh against a fake sbatch that records its arguments.
mkdir -p "$T/bin"
cat >"$T/bin/sbatch" <<'EOF'
#!/bin/bash
n=$(($(cat "$FAKE_DIR/n" 2>/dev/null || echo 100) + 1)); echo $n >"$FAKE_DIR/n"
echo "$*" >>"$FAKE_DIR/calls"; echo "$n"
EOF
chmod +x "$T/bin/sbatch"
expect "submit-chain.sh prints 3 job ids" 0 '^101 102 103$' -- \
  bash -c "FAKE_DIR=$T PATH=$T/bin:\$PATH SCRIPT=slurm/train-cpu.sbatch SBATCH_ARGS='-N 2' slurm/submit-chain.sh 3 inputs/quickstart.ini --train.steps=10 2>/dev/null | paste -sd' '"
expect "submit-chain.sh: job 1 without a dependency, resume=auto added" 0 '^--parsable --signal=USR1@120 -N 2 slurm/train-cpu.sbatch inputs/quickstart.ini --train.steps=10 --checkpoint.resume=auto --checkpoint.at_end=true$' -- \
  sed -n 1p "$T/calls"
expect "submit-chain.sh: job k+1 runs only after job k succeeded (afterok), else is cancelled" 0 '^--parsable --signal=USR1@120 -N 2 --dependency=afterok:102 --kill-on-invalid-dep=yes slurm/train-cpu.sbatch' -- \
  sed -n 3p "$T/calls"
expect "submit-chain.sh: no afterany left" 0 '' -- bash -c "! grep -q afterany $T/calls"
rm -f "$T/calls" "$T/n"
expect "submit-chain.sh: STOP_LEAD_S sets the stop signal's lead time" 0 '^--parsable --signal=USR1@300 ' -- \
  bash -c "FAKE_DIR=$T PATH=$T/bin:\$PATH STOP_LEAD_S=300 slurm/submit-chain.sh 1 inputs/quickstart.ini >/dev/null 2>&1; cat $T/calls"
rm -f "$T/calls" "$T/n"
expect "submit-chain.sh: STOP_LEAD_S must be a number of seconds" 2 'STOP_LEAD_S=2m: must be a positive number' -- \
  bash -c "FAKE_DIR=$T PATH=$T/bin:\$PATH STOP_LEAD_S=2m slurm/submit-chain.sh 1 inputs/quickstart.ini"
rm -f "$T/calls" "$T/n"
expect "submit-chain.sh keeps an explicit --checkpoint.resume" 0 'quickstart.ini --checkpoint.resume=never --checkpoint.at_end=true$' -- \
  bash -c "FAKE_DIR=$T PATH=$T/bin:\$PATH AFTER=7 slurm/submit-chain.sh 1 inputs/quickstart.ini --checkpoint.resume=never >/dev/null 2>&1; cat $T/calls"
expect "submit-chain.sh: AFTER= appends to an existing chain" 0 '^--parsable --signal=USR1@120 --dependency=afterok:7 ' -- cat "$T/calls"

echo "templates_test: $fails failure(s)"
[ "$fails" = 0 ]
