#!/usr/bin/env bash
# fault_crash_test.sh MPIEXEC WLB4D WLB4D_PREP WLB4D_CKPT SOURCE_DIR
# One rank dies mid-backward (fault tolerance): WLB4D_FAULT=crash:rank=1:step=4:
# phase=backward kills world rank 1 (SIGKILL, no handler) in its first
# backward action of step 5 (0-based 4), on 2 ranks with pp=2 (the other
# rank waits for its gradient). The whole job must end non-zero within
# seconds (mpiexec tears it down; the watchdog is the fallback), and no
# checkpoint is lost: `latest` names step 4 (checkpoint.every=2), no .tmp is
# left, and step 4's checkpoint verifies.
set -u
source "$(dirname "$0")/lib.sh"
mpiexec=$1 wlb4d=$2 prep=$3 ckpt=$4 src=$5
scratch_dir crash
prep_tiny "$prep" "$src"
WLB4D_FAULT=crash:rank=1:step=4:phase=backward run_timed 100 "$mpiexec" -n 2 "$wlb4d" \
  "$src/inputs/ci-tiny.ini" --parallel.pp=2 --train.steps=10 --train.print_every=1 --checkpoint.every=2 \
  --checkpoint.at_end=false --checkpoint.dir=ck --comm.timeout_s=60
printf '%s\n' "$out"
expect_job_failed
out_has "\[r1\] wlb4d: WLB4D_FAULT: crashing at step 4 (fault point backward)" || fail "the fault was not injected"
out_has -E "step +5/10" && fail "step 5 completed although rank 1 died in it"
[ "$elapsed" -le 30 ] || fail "the job took $elapsed s to end (mpiexec should end it within seconds)"
expect_checkpoints_intact "$ckpt" ck 4
echo "$test_label: ok (rc=$rc after ${elapsed} s)"
