#!/usr/bin/env bash
# checkpoint_stall_test.sh SCENARIO MPIEXEC WLB4D WLB4D_PREP WLB4D_CKPT SOURCE_DIR
# A rank stopped (SIGSTOP) during checkpoint I/O: HDF5's collective calls
# block inside MPI-IO, outside wlb::comm's watchdog, so before the phase
# deadline the other rank hung there silently. With comm.timeout_s=5 the job
# must end non-zero within a bound, with a message naming the phase, the
# file and the stopped rank; `latest` and the previous checkpoint stay
# intact, no .tmp is left, and no wlb4d process of this test outlives the job
# (a stopped process never handles the abort's SIGTERM: it gets SIGKILL).
#   save: tp=2; WLB4D_FAULT=stall:...:phase=ckpt_save:signal=STOP stops world
#         rank 1 inside the step-10 write (after the collective file
#         creation); step 5 was written before.
#   load: a first run writes step 5; the second resumes (tp=2) and world
#         rank 1 stops itself (SIGSTOP) at fault point ckpt_load, inside the
#         load (WLB4D_FAULT=stall:...:phase=ckpt_load:signal=STOP): no race
#         between this script's signal and rank 0's deadline on a loaded machine.
set -u
source "$(dirname "$0")/lib.sh"
scenario=$1 mpiexec=$2 wlb4d=$3 prep=$4 ckpt=$5 src=$6
test_label+=" ($scenario)"
stopped_pid=
at_exit() {
  # Only this test's processes: their command line holds $work.
  for p in $(pgrep -f -- "$work/ck" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
}
scratch_dir ckstall
prep_tiny "$prep" "$src"
common=("$src/inputs/ci-tiny.ini" --parallel.tp=2 --checkpoint.dir="$work/ck" --checkpoint.at_end=false
        --comm.timeout_s=5 --log.csv_file=)
phase="checkpoint save" file=step_000010.h5
if [ "$scenario" = load ]; then
  phase="checkpoint load" file=step_000005.h5
  timeout -s KILL 120 "$mpiexec" -n 2 "$wlb4d" "${common[@]}" --train.steps=5 --checkpoint.every=5 > first.log 2>&1 \
    || { cat first.log; fail "the first run (writing step 5) failed"; }
  export WLB4D_FAULT=stall:rank=1:phase=ckpt_load:signal=STOP
  steps=10
else
  export WLB4D_FAULT=stall:rank=1:step=10:phase=ckpt_save:signal=STOP
  steps=12
fi
start=$(date +%s)
timeout -s KILL 100 "$mpiexec" -n 2 "$wlb4d" "${common[@]}" --train.steps=$steps --checkpoint.every=5 \
  --checkpoint.resume=auto > out.log 2>&1 &
job=$!
wait $job
rc=$?
elapsed=$(( $(date +%s) - start ))
cat out.log
[ "$rc" -eq 137 ] && fail "the job hung (killed after 100 s)"
[ "$rc" -ne 0 ] || fail "the job exited 0"
[ "$elapsed" -le 60 ] || fail "took $elapsed s to end"
if [ "$scenario" = save ]; then
  stopped_pid=$(grep -o "stalling at step 10 (fault point ckpt_save), pid [0-9]*" out.log | grep -o "[0-9]*$")
else
  stopped_pid=$(grep -o "stalling at fault point ckpt_load, pid [0-9]*" out.log | grep -o "[0-9]*$")
fi
[ -n "$stopped_pid" ] || fail "the fault was not injected"
grep -Eq "\[r0\] wlb4d: error: $phase of $work/ck/$file: no progress for [0-9]+ s \(comm.timeout_s=5\).* world rank 1 \(pid $stopped_pid, stopped" out.log \
  || fail "no message from rank 0 names the $phase of $file and world rank 1 (pid $stopped_pid) as stopped"
# No process of this job left: the stopped rank included.
for _ in $(seq 50); do
  left=$(pgrep -f -- "$work/ck" | tr '\n' ' ')
  [ -z "$left" ] && break
  sleep 0.2
done
[ -z "$left" ] || fail "wlb4d processes left behind after the abort: $left ($(ps -o pid=,stat=,args= -p ${left// /,} | cut -c1-120))"
expect_checkpoints_intact "$ckpt" "$work/ck" 5
echo "$test_label: ok (rc=$rc after ${elapsed} s)"
