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
expect "train-cpu: matching layout, srun launch line" 0 'launch: srun --mpi=pmi2 --ntasks=4 --cpu-bind=cores .*quickstart.ini --parallel.dp=4' -- \
  run SLURM_NTASKS=4 RUN_DIR="$T/cpu" bash slurm/train-cpu.sbatch "$T/quickstart.ini" --parallel.dp=4
expect "train-cpu: task count != dp*pp*cp*tp fails with the keys" 2 'parallel.dp\*pp\*cp\*tp = 2\*1\*1\*1 = 2 ranks, but this job has 3 tasks' -- \
  run SLURM_NTASKS=3 RUN_DIR="$T/cpu" bash slurm/train-cpu.sbatch "$T/quickstart.ini" --parallel.dp=2
expect "train-cpu: EXTRA overrides are applied" 2 '= 2\*2\*1\*1 = 4 ranks, but this job has 2 tasks' -- \
  run SLURM_NTASKS=2 EXTRA="--parallel.pp=2" RUN_DIR="$T/cpu" bash slurm/train-cpu.sbatch "$T/quickstart.ini" --parallel.dp=2
expect "train-cpu: a bad deck key fails before launch" 2 'does not resolve' -- \
  run SLURM_NTASKS=1 RUN_DIR="$T/cpu" bash slurm/train-cpu.sbatch "$T/quickstart.ini" --parallel.dq=2
expect "train-cpu: LAUNCHER=mpiexec" 0 'launch: mpiexec -n 2 -bind-to core ' -- \
  run SLURM_NTASKS=2 LAUNCHER=mpiexec RUN_DIR="$T/cpu" bash slurm/train-cpu.sbatch "$T/quickstart.ini" --parallel.dp=2
expect "train-cpu: task count from SLURM_NNODES*SLURM_NTASKS_PER_NODE" 0 '-> 4 ranks \| job: 4 tasks on 2 nodes' -- \
  run SLURM_NNODES=2 SLURM_NTASKS_PER_NODE=2 RUN_DIR="$T/cpu" bash slurm/train-cpu.sbatch "$T/quickstart.ini" --parallel.dp=4
expect "train-cpu: LAUNCHER must be srun or mpiexec" 2 'LAUNCHER=aprun: must be srun or mpiexec' -- \
  run SLURM_NTASKS=1 LAUNCHER=aprun RUN_DIR="$T/cpu" bash slurm/train-cpu.sbatch "$T/quickstart.ini"

# GPU template: --gpu-bind=none, per-rank device from the local rank, NCCL backend.
expect "train-gpu: srun --gpu-bind=none, bind-gpu.sh, comm.backend=nccl" 0 \
  'launch: srun --mpi=pmi2 --ntasks=8 --cpu-bind=cores --gpu-bind=none .*/lib/bind-gpu.sh .*quickstart.ini .*--comm.backend=nccl' -- \
  run SLURM_NTASKS=8 SLURM_NNODES=2 SLURM_NTASKS_PER_NODE=4 SLURM_GPUS_PER_NODE=4 RUN_DIR="$T/gpu" \
  bash slurm/train-gpu.sbatch "$T/quickstart.ini" --parallel.dp=8 --train.micro_batches=8
expect "bind-gpu.sh: KOKKOS_DEVICE_ID = SLURM_LOCALID" 0 '^3$' -- \
  env -u MPI_LOCALRANKID SLURM_LOCALID=3 SLURM_GPUS_ON_NODE=4 slurm/lib/bind-gpu.sh bash -c 'echo $KOKKOS_DEVICE_ID'
expect "bind-gpu.sh: mpiexec's MPI_LOCALRANKID wins over SLURM_LOCALID, modulo GPUs" 0 '^1$' -- \
  env MPI_LOCALRANKID=5 SLURM_LOCALID=0 SLURM_GPUS_ON_NODE=4 slurm/lib/bind-gpu.sh bash -c 'echo $KOKKOS_DEVICE_ID'

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
expect "submit-chain.sh: job 1 without a dependency, resume=auto added" 0 '^--parsable -N 2 slurm/train-cpu.sbatch inputs/quickstart.ini --train.steps=10 --checkpoint.resume=auto --checkpoint.at_end=true$' -- \
  sed -n 1p "$T/calls"
expect "submit-chain.sh: job k+1 --dependency=afterany:job k" 0 '^--parsable -N 2 --dependency=afterany:102 slurm/train-cpu.sbatch' -- \
  sed -n 3p "$T/calls"
rm -f "$T/calls" "$T/n"
expect "submit-chain.sh keeps an explicit --checkpoint.resume" 0 'quickstart.ini --checkpoint.resume=never --checkpoint.at_end=true$' -- \
  bash -c "FAKE_DIR=$T PATH=$T/bin:\$PATH AFTER=7 slurm/submit-chain.sh 1 inputs/quickstart.ini --checkpoint.resume=never >/dev/null 2>&1; cat $T/calls"
expect "submit-chain.sh: AFTER= appends to an existing chain" 0 '^--parsable --dependency=afterany:7 ' -- cat "$T/calls"

echo "templates_test: $fails failure(s)"
[ "$fails" = 0 ]
