#!/usr/bin/env bash
# watchdog_test.sh MPIEXEC WLB4D WLB4D_PREP SOURCE_DIR
# A rank that stops making progress (WLB4D_FAULT=stall, as under SIGSTOP)
# must not hang the job (issue [N]): with comm.timeout_s=5 the other rank's
# wait ends in a "communication timeout" naming the operation and the group,
# and the job exits non-zero well within the ctest timeout.
set -u
mpiexec=$1 wlb4d=$2 prep=$3 src=$4
work=$(mktemp -d /tmp/wlb4d-watchdog-XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$prep" --input "$src/tests/data/tiny.jsonl" --output tiny-train.h5 > /dev/null || exit 1
start=$(date +%s)
out=$(WLB4D_FAULT=stall:rank=1:step=2 timeout -s KILL 100 "$mpiexec" -n 2 "$wlb4d" "$src/inputs/ci-tiny.ini" \
      --parallel.dp=2 --train.steps=6 --checkpoint.at_end=false --comm.timeout_s=5 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
printf '%s\n' "$out"
fail() { echo "watchdog_test: $*"; exit 1; }
[ "$rc" -eq 137 ] && fail "the job hung (killed after 100 s)"
[ "$rc" -ne 0 ] || fail "the job exited 0"
printf '%s\n' "$out" | grep -q "WLB4D_FAULT: stalling at step 2" || fail "the fault was not injected"
printf '%s\n' "$out" | grep -Eq "\[r0\].*communication timeout: [a-z_]+ on the (world|DP|DP×CP|PP|TP|CP) group .*comm.timeout_s=5" \
  || fail "rank 0 did not report the timeout with the operation and group"
echo "watchdog_test: ok (rc=$rc after ${elapsed} s)"
