#!/usr/bin/env bash
# stop_signal_test.sh WLB4D WLB4D_PREP SOURCE_DIR [SCENARIO]
# A stop signal during start-up is a graceful stop: the handlers are
# installed first thing, the request is remembered through the Trainer's
# start-up, and the run stops after its first step with a checkpoint, exit 0.
# The signal is sent inside a window that fault injection holds open, not
# raced against a fast start-up (a fast machine calibrates in a few ms).
#   int (default), term, usr1: SIGINT / SIGTERM / SIGUSR1 during calibration
#             (balance.calibrate=true): rank 0 is held 3 s just before it
#             times the cost model (WLB4D_FAULT=delay:...:phase=calibrate).
#   int_load: SIGINT while the checkpoint is being loaded: a first run writes
#             step 3; the resumed run is held 3 s before it reads the file
#             (WLB4D_FAULT=delay:rank=0:phase=ckpt_load:seconds=3), the
#             signal comes in that window; it must load, run step 4, write
#             step 4 and exit 0.
set -u
source "$(dirname "$0")/lib.sh"
wlb4d=$1 prep=$2 src=$3 scenario=${4:-int}
test_label+=" ($scenario)"
pid=
at_exit() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; }
scratch_dir sigint
prep_tiny "$prep" "$src"
# From here on a failure also prints the run's log.
fail() { echo "$test_label: $*"; cat run.log; exit 1; }
export WLB4D_FAULT=delay:rank=0:phase=calibrate:seconds=3
sig=INT wait_for="WLB4D_FAULT: delaying at fault point calibrate" calibrate=true resume=never
case "$scenario" in
  term) sig=TERM ;;
  usr1) sig=USR1 ;;
  int_load)
    "$wlb4d" "$src/inputs/ci-tiny.ini" --train.steps=3 --checkpoint.dir=ck --checkpoint.at_end=true > first.log 2>&1 || { cat first.log; exit 1; }
    [ -f ck/step_000003.h5 ] || fail "the first run wrote no step-3 checkpoint"
    export WLB4D_FAULT=delay:rank=0:phase=ckpt_load:seconds=3
    wait_for="WLB4D_FAULT: delaying at fault point ckpt_load" calibrate=false resume=auto ;;
esac
"$wlb4d" "$src/inputs/ci-tiny.ini" --train.steps=500 --train.print_every=1 --balance.calibrate=$calibrate \
  --checkpoint.dir=ck --checkpoint.resume=$resume --checkpoint.at_end=false > run.log 2>&1 &
pid=$!
for _ in $(seq 1 200); do grep -qF "$wait_for" run.log && break; sleep 0.05; done
grep -qF "$wait_for" run.log || fail "no '$wait_for' line"
grep -Eq "step +1/500" run.log && fail "step 1 ran before the signal was sent (the test did not hit start-up)"
kill -$sig "$pid"
wait "$pid"; rc=$?; pid=
[ "$rc" -eq 0 ] || fail "exit code $rc after SIG$sig (expected a graceful stop, 0)"
grep -q "stop requested" run.log || fail "no 'stop requested' message"
case "$scenario" in
  int_load)
    grep -q "resum" run.log || fail "no resume message"
    grep -Eq "checkpoint .*step_000004\.h5 written" run.log || fail "no step-4 checkpoint (resumed at 3, one step)"
    grep -Eq "step +5/500" run.log && fail "ran past the first step after the resume" ;;
  *) grep -Eq "checkpoint .*step_0000[0-9]{2}\.h5 written" run.log || fail "no checkpoint written" ;;
esac
last=$(grep -Eo "step +[0-9]+/500" run.log | tail -1)
echo "$test_label: ok (stopped at '$last')"
