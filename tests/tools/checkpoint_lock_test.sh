#!/usr/bin/env bash
# checkpoint_lock_test.sh WLB4D WLB4D_PREP SOURCE_DIR
# Two runs on one checkpoint.dir (checkpoint directory lock): while run A holds the directory
# (stalled by WLB4D_FAULT at step 3, deterministically), run B is refused with
# a message naming the directory and A's host and pid; once A is gone (killed,
# so no clean-up ran), a new run takes the directory: no stale lock.
set -u
source "$(dirname "$0")/lib.sh"
wlb4d=$1 prep=$2 src=$3
pid_a=
at_exit() { [ -n "$pid_a" ] && kill -9 "$pid_a" 2>/dev/null; }
scratch_dir lock
prep_tiny "$prep" "$src"
args=("$src/inputs/ci-tiny.ini" --train.steps=6 --checkpoint.dir=ck --checkpoint.every=2)
WLB4D_FAULT=stall:rank=0:step=3 "$wlb4d" "${args[@]}" > a.log 2>&1 &
pid_a=$!
for _ in $(seq 1 100); do grep -q "stalling at step 3" a.log && break; sleep 0.2; done
grep -q "stalling at step 3" a.log || { cat a.log; fail "run A did not reach its stall"; }
run_timed 60 "$wlb4d" "${args[@]}"
printf '%s\n' "$out"
[ "$rc" -ne 0 ] || fail "run B was not refused"
out_has "checkpoint.dir='ck' is in use by another run (host .*, pid $pid_a," \
  || fail "run B's message does not name the directory and run A's pid $pid_a"
kill -9 "$pid_a"; wait "$pid_a" 2>/dev/null; pid_a=
out=$(timeout -s KILL 60 "$wlb4d" "${args[@]}" 2>&1) || { printf '%s\n' "$out"; fail "run C after A died failed"; }
echo "$test_label: ok"
