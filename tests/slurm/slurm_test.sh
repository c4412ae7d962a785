#!/usr/bin/env bash
# ctest driver of the `slurm` label (registered in tests/mpi/slurm/CMakeLists.txt):
# submits the shipped templates (slurm/*.sbatch, slurm/submit-chain.sh) to a
# running Slurm and checks what the jobs leave behind.
#
#   slurm_test.sh CASE     CASE = prep | train | resume | chain | mismatch | sweep
#
# Environment (set by CMake): WLB4D_SRC (source tree), WLB4D_WORK (work folder),
# WLB4D_BIN, WLB4D_PREP (the build's wlb4d and wlb4d-prep).
# Optional: SLURM_CONF (default: /etc/slurm/slurm.conf, else the test cluster of
# tests/slurm/start-slurm.sh), WLB4D_SLURM_TEST_SBATCH_ARGS (e.g. "-p debug -A proj"
# on a real cluster), WLB4D_SLURM_TEST_TIMEOUT (seconds per job, default 240).
#
# Exit status: 0 pass, 1 fail, 77 skip (no Slurm answering; or, for resume and
# chain, no checkpoint written by this build's trainer yet).
set -euo pipefail
CASE=${1:?usage: slurm_test.sh prep|train|resume|chain|mismatch|sweep}
SRC=${WLB4D_SRC:?}
WORK=${WLB4D_WORK:?}
BIN=${WLB4D_BIN:?}
DECK=$SRC/inputs/ci-slurm.ini
TIMEOUT=${WLB4D_SLURM_TEST_TIMEOUT:-240}
SKIP=77

say() { echo "[slurm-test:$CASE] $*"; }
skip() { say "SKIP: $*"; exit $SKIP; }
fail() { say "FAIL: $*"; exit 1; }
check() { # check DESCRIPTION command...
  local what=$1
  shift
  if "$@"; then say "ok: $what"; else fail "$what"; fi
}

need_slurm() {
  if [ -n "${SLURM_JOB_ID:-}" ] && [ "${WLB4D_SLURM_TEST_NESTED:-0}" != 1 ]; then
    skip "inside Slurm job $SLURM_JOB_ID: a submitted job would queue behind this allocation (WLB4D_SLURM_TEST_NESTED=1 to try anyway)"
  fi
  command -v sbatch >/dev/null 2>&1 || skip "no sbatch (tests/slurm/start-slurm.sh installs and starts a one-node test Slurm)"
  if [ -z "${SLURM_CONF:-}" ] && [ ! -f /etc/slurm/slurm.conf ]; then
    local c
    c=$(. "$(dirname "${BASH_SOURCE[0]}")/slurm-dir.sh" && echo "$WLB4D_TEST_SLURM_DIR")/etc/slurm.conf  # this checkout's
    [ -f "$c" ] || skip "no slurm.conf (SLURM_CONF unset, no /etc/slurm/slurm.conf, no $c): run tests/slurm/start-slurm.sh"
    export SLURM_CONF=$c
  fi
  timeout 10 scontrol ping 2>/dev/null | grep -q 'UP' || skip "slurmctld does not answer (SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf})"
  timeout 10 sinfo -h -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated|completing)' ||
    skip "no node up in $(sinfo -h -o '%P %T' 2>/dev/null | tr '\n' ' ')"
}

# run_job NAME [sbatch options...] SCRIPT [args...]: sbatch --wait in $PWD with a
# timeout; sets JID (job id), JRC (sbatch's exit status = the job's), JOUT (output file).
run_job() {
  local name=$1
  shift
  local log=$PWD/$name.sbatch.txt
  local t0=$SECONDS
  set +e
  # shellcheck disable=SC2086
  timeout "$TIMEOUT" sbatch --wait --parsable -J "wlb4d-test-$name" --time=10 -o "$name-%j.out" \
    ${WLB4D_SLURM_TEST_SBATCH_ARGS:-} "$@" >"$log" 2>&1
  JRC=$?
  set -e
  JID=$(grep -Eo '^[0-9]+' "$log" | head -1 || true)
  [ -n "$JID" ] || { cat "$log"; fail "sbatch did not submit $name"; }
  JOUT=$PWD/$name-$JID.out
  if [ "$JRC" = 124 ]; then
    scancel "$JID" 2>/dev/null || true
    cat "$JOUT" 2>/dev/null || true
    fail "job $JID ($name) did not end within ${TIMEOUT}s (WLB4D_SLURM_TEST_TIMEOUT)"
  fi
  say "job $JID ($name): sbatch --wait status $JRC after $((SECONDS - t0)) s"
  echo "----- $JOUT"
  cat "$JOUT" 2>/dev/null || true
  echo "-----"
}

# job_field JOBID FIELD: a field of `scontrol show job` (empty once forgotten, MinJobAge).
job_field() { scontrol show job -o "$1" 2>/dev/null | head -1 | grep -o "$2=[^ ]*" | head -1 | cut -d= -f2- || true; }

check_completed() { # check_completed JOBID: state COMPLETED, exit 0:0 (when still remembered)
  local st ec
  st=$(job_field "$1" JobState)
  ec=$(job_field "$1" ExitCode)
  if [ -z "$st" ]; then
    say "note: job $1 already forgotten by slurmctld (MinJobAge); relying on sbatch --wait's status"
    return 0
  fi
  check "job $1 state COMPLETED (got $st) exit 0:0 (got $ec)" test "$st:$ec" = "COMPLETED:0:0"
}

# Step lines: "step N/M | H:MM:SS | loss X | ..." (the elapsed field is optional).
step_lines() { grep -Ec "step +[0-9]+/$2 \|( [0-9:]+ \|)? loss" "$1" 2>/dev/null || true; }
loss_at() { { sed -En "s/.*step *$2\/$3 \|( [0-9:]+ \|)? loss ([0-9.]*).*/\2/p" "$1" | tail -1; } 2>/dev/null || true; }
first_step() { { sed -En "s/.*step *([0-9]*)\/$2 \|( [0-9:]+ \|)? loss.*/\1/p" "$1" | head -1; } 2>/dev/null || true; }
last_step() { { sed -En "s/.*step *([0-9]*)\/$2 \|( [0-9:]+ \|)? loss.*/\1/p" "$1" | tail -1; } 2>/dev/null || true; }
latest_of() { [ -s "$1/latest" ] && head -1 "$1/latest" || true; }

case "$CASE" in
prep) # fixture: a clean work folder with the tiny dataset (no Slurm needed)
  rm -rf "$WORK"
  mkdir -p "$WORK/train"
  "${WLB4D_PREP:?}" --input "$SRC/tests/data/tiny.jsonl" --output "$WORK/tiny-train.h5"
  ;;

train) # the CPU template, 1 rank, 6 steps, checkpoint every 3, timing log
  need_slurm
  cd "$WORK/train"
  rm -rf checkpoints runs timing.h5 timing.csv ./*.out ./*.txt
  ln -sf ../tiny-train.h5 tiny-train.h5
  run_job train -N 1 -n 1 --ntasks-per-node=1 --export=ALL,WLB4D_BIN="$BIN" "$SRC/slurm/train-cpu.sbatch" "$DECK"
  cp "$JOUT" ../train.out 2>/dev/null || true   # the reference losses of resume and sweep
  check "sbatch --wait exit status 0 (got $JRC)" test "$JRC" = 0
  check_completed "$JID"
  check "the template printed the layout it requested" grep -q 'layout dp=1 pp=1 cp=1 tp=1 -> 1 ranks | job: 1 tasks' "$JOUT"
  check "6 per-step lines in the job output (got $(step_lines "$JOUT" 6))" test "$(step_lines "$JOUT" 6)" = 6
  check "the job record runs/wlb4d-test-train_$JID/{config.ini,job.txt,launch.txt}" \
    test -s "runs/wlb4d-test-train_$JID/config.ini" -a -s "runs/wlb4d-test-train_$JID/job.txt" -a -s "runs/wlb4d-test-train_$JID/launch.txt"
  check "timing log timing.h5 written" test -s timing.h5
  if command -v h5ls >/dev/null 2>&1; then
    check "timing.h5 /steps holds 6 records ($(h5ls timing.h5/steps 2>&1 | head -1))" \
      bash -c 'h5ls timing.h5/steps | grep -q "{6/"'
  fi
  rows=$(awk -F, 'NR > 1 && $2 == 0' timing.csv | wc -l)
  check "timing.csv has 6 rows of rank 0 (got $rows)" test "$rows" = 6
  if [ -s checkpoints/latest ]; then
    check "checkpoints/latest names step_000006.h5 (got '$(latest_of checkpoints)')" \
      test "$(latest_of checkpoints)" = step_000006.h5
    check "checkpoints step_000003.h5 and step_000006.h5 (keep = 2)" test -s checkpoints/step_000003.h5 -a -s checkpoints/step_000006.h5
  else
    say "note: no checkpoints/latest: this build's trainer writes no checkpoints yet (resume and chain will skip)"
  fi
  ;;

resume) # a second job continues the first one's run from its step-3 checkpoint
  need_slurm
  src=$WORK/train/checkpoints
  [ -s "$src/latest" ] && [ -s "$src/step_000003.h5" ] ||
    skip "no checkpoint from the train job ($src/latest, step_000003.h5): checkpoint writing not in this build yet"
  rm -rf "$WORK/resume"
  mkdir -p "$WORK/resume/checkpoints"
  cd "$WORK/resume"
  ln -sf ../tiny-train.h5 tiny-train.h5
  # As if the first job had been stopped after step 3: only that checkpoint, named by latest.
  cp "$src/step_000003.h5" checkpoints/
  echo step_000003.h5 >checkpoints/latest
  run_job resume -N 1 -n 1 --ntasks-per-node=1 --export=ALL,WLB4D_BIN="$BIN" \
    "$SRC/slurm/train-cpu.sbatch" "$DECK" --checkpoint.resume=auto
  check "sbatch --wait exit status 0 (got $JRC)" test "$JRC" = 0
  check_completed "$JID"
  check "resumed at step 4 (first step line: $(first_step "$JOUT" 6))" test "$(first_step "$JOUT" 6)" = 4
  check "ran steps 4..6 only ($(step_lines "$JOUT" 6) step lines)" test "$(step_lines "$JOUT" 6)" = 3
  want=$(loss_at "$WORK/train.out" 6 6)
  got=$(loss_at "$JOUT" 6 6)
  check "step-6 loss equals the uninterrupted run's ($got vs $want)" test -n "$got" -a "$got" = "$want"
  check "checkpoints/latest advanced to step_000006.h5 (got '$(latest_of checkpoints)')" \
    test "$(latest_of checkpoints)" = step_000006.h5
  ;;

chain) # submit-chain.sh: job 1 stopped by SIGUSR1 (checkpoint, exit 0), job 2 resumes (afterok: job 1 exited 0)
  need_slurm
  [ -s "$WORK/train/checkpoints/latest" ] || skip "the train job wrote no checkpoint: checkpoint writing not in this build yet"
  rm -rf "$WORK/chain"
  mkdir -p "$WORK/chain"
  cd "$WORK/chain"
  ln -sf ../tiny-train.h5 tiny-train.h5
  steps=${WLB4D_SLURM_CHAIN_STEPS:-300}
  ids=$(SCRIPT=$SRC/slurm/train-cpu.sbatch WLB4D_BIN=$BIN \
    SBATCH_ARGS="-N 1 -n 1 --ntasks-per-node=1 -J wlb4d-test-chain --time=10 -o chain-%j.out ${WLB4D_SLURM_TEST_SBATCH_ARGS:-}" \
    "$SRC/slurm/submit-chain.sh" 2 "$DECK" --train.steps="$steps" --checkpoint.every=1000)
  j1=$(echo "$ids" | sed -n 1p)
  j2=$(echo "$ids" | sed -n 2p)
  say "chain: $j1 -> $j2"
  check "job 2 depends on job 1 (afterok)" bash -c "scontrol show job $j2 | grep -q 'Dependency=afterok:$j1'"
  # Stop job 1 like the time limit would (--signal=USR1@120) once it is training.
  t0=$SECONDS
  until grep -Eq "step +[0-9]+/$steps \|( [0-9:]+ \|)? loss" "chain-$j1.out" 2>/dev/null; do
    [ $((SECONDS - t0)) -lt "$TIMEOUT" ] || { scancel "$j1" "$j2"; fail "job 1 printed no step line in ${TIMEOUT}s"; }
    sleep 0.5
  done
  scancel --signal=USR1 "$j1"
  say "sent SIGUSR1 to job $j1 after $((SECONDS - t0)) s"
  t0=$SECONDS
  while squeue -h -j "$j1,$j2" 2>/dev/null | grep -q .; do
    [ $((SECONDS - t0)) -lt "$TIMEOUT" ] || { scancel "$j1" "$j2"; fail "the chain did not end within ${TIMEOUT}s"; }
    sleep 1
  done
  for j in "$j1" "$j2"; do echo "----- chain-$j.out"; cat "chain-$j.out" 2>/dev/null || true; done
  echo "-----"
  check_completed "$j1"
  check_completed "$j2"
  s1=$(last_step "chain-$j1.out" "$steps")
  f2=$(first_step "chain-$j2.out" "$steps")
  l2=$(last_step "chain-$j2.out" "$steps")
  check "job 1 stopped early on SIGUSR1 (last step ${s1:-none} < $steps)" test -n "$s1" -a "${s1:-0}" -lt "$steps"
  check "job 2 resumed where job 1 stopped (first step ${f2:-none} = ${s1:-?} + 1)" test "${f2:-x}" = "$(( ${s1:-0} + 1 ))"
  check "job 2 finished the run (last step ${l2:-none} = $steps)" test "${l2:-x}" = "$steps"
  ;;

mismatch) # the template refuses a job whose task count differs from the deck's layout
  need_slurm
  mkdir -p "$WORK/mismatch"
  cd "$WORK/mismatch"
  run_job mismatch -N 1 -n 2 --ntasks-per-node=2 --export=ALL,WLB4D_BIN="$BIN" \
    "$SRC/slurm/train-cpu.sbatch" "$DECK" --parallel.dp=1
  check "the job failed (sbatch --wait status $JRC != 0)" test "$JRC" != 0
  check "with the layout message" grep -q 'deck layout parallel.dp\*pp\*cp\*tp = 1\*1\*1\*1 = 1 ranks, but this job has 2 tasks' "$JOUT"
  check "before starting any rank" bash -c "! grep -Eq 'step +[0-9]+/' '$JOUT'"
  ;;

sweep) # job array over 2-rank layouts: every task completes with the same losses
  need_slurm
  rm -rf "$WORK/sweep"
  mkdir -p "$WORK/sweep"
  cd "$WORK/sweep"
  ln -sf ../tiny-train.h5 tiny-train.h5
  sweep=$SRC/tests/slurm/layouts-2.txt
  n=$(sed -e 's/#.*//' "$sweep" | grep -c '[^[:space:]]')
  run_job sweep --array=0-$((n - 1))%2 -N 1 -n 2 --ntasks-per-node=2 -o 'sweep-%A_%a.out' \
    --export=ALL,WLB4D_BIN="$BIN" "$SRC/slurm/sweep.sbatch" "$DECK" "$sweep" --checkpoint.every=0
  check "sbatch --wait exit status 0 for the array (got $JRC)" test "$JRC" = 0
  ref=$(loss_at "$WORK/train.out" 6 6 2>/dev/null || true)
  for ((i = 0; i < n; i++)); do
    out=sweep-${JID}_$i.out
    echo "----- $out"
    cat "$out" || true
    st=$(job_field "${JID}_$i" JobState)
    [ -z "$st" ] || check "array task $i state COMPLETED (got $st)" test "$st" = COMPLETED
    check "task $i ran line $i of the sweep file" grep -q "sweep .*layouts-2.txt line $i:" "$out"
    check "task $i: 6 step lines" test "$(step_lines "$out" 6)" = 6
    check "task $i: own timing log runs/wlb4d-test-sweep_$JID/$i/timing.csv" test -s "runs/wlb4d-test-sweep_$JID/$i/timing.csv"
    l=$(loss_at "$out" 6 6)
    if [ -n "$ref" ]; then
      check "task $i: step-6 loss $l equals the 1-rank run's $ref (layout-independent)" test "$l" = "$ref"
    fi
  done
  ;;

*)
  echo "unknown case $CASE" >&2
  exit 2
  ;;
esac
say "passed"
