#!/usr/bin/env bash
# fault_crash_test.sh MPIEXEC WLB4D WLB4D_PREP WLB4D_CKPT SOURCE_DIR
# One rank dies mid-backward (issue [N]): WLB4D_FAULT=crash:rank=1:step=4:
# phase=backward kills world rank 1 (SIGKILL, no handler) in its first
# backward action of step 5 (0-based 4), on 2 ranks with pp=2 (the other
# rank waits for its gradient). The whole job must end non-zero within
# seconds (mpiexec tears it down; the watchdog is the fallback), and no
# checkpoint is lost: `latest` names step 4 (checkpoint.every=2), no .tmp is
# left, and step 4's checkpoint verifies.
set -u
mpiexec=$1 wlb4d=$2 prep=$3 ckpt=$4 src=$5
work=$(mktemp -d /tmp/wlb4d-crash-XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$prep" --input "$src/tests/data/tiny.jsonl" --output tiny-train.h5 > /dev/null || exit 1
start=$(date +%s)
out=$(WLB4D_FAULT=crash:rank=1:step=4:phase=backward timeout -s KILL 100 "$mpiexec" -n 2 "$wlb4d" \
      "$src/inputs/ci-tiny.ini" --parallel.pp=2 --train.steps=10 --train.print_every=1 --checkpoint.every=2 \
      --checkpoint.at_end=false --checkpoint.dir=ck --comm.timeout_s=60 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
printf '%s\n' "$out"
fail() { echo "fault_crash_test: $*"; exit 1; }
[ "$rc" -eq 137 ] && fail "the job hung (killed after 100 s)"
[ "$rc" -ne 0 ] || fail "the job exited 0"
printf '%s\n' "$out" | grep -q "\[r1\] wlb4d: WLB4D_FAULT: crashing at step 4 (fault point backward)" || fail "the fault was not injected"
printf '%s\n' "$out" | grep -Eq "step +5/10" && fail "step 5 completed although rank 1 died in it"
[ "$elapsed" -le 30 ] || fail "the job took $elapsed s to end (mpiexec should end it within seconds)"
ls ck/*.tmp > /dev/null 2>&1 && fail "a .tmp was left: $(ls ck)"
[ "$(head -1 ck/latest)" = step_000004.h5 ] || fail "latest is '$(cat ck/latest)', expected step_000004.h5 first"
"$ckpt" verify ck/step_000004.h5 || fail "the step-4 checkpoint does not verify"
echo "fault_crash_test: ok (rc=$rc after ${elapsed} s)"
