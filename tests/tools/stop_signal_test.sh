#!/usr/bin/env bash
# stop_signal_test.sh WLB4D WLB4D_PREP SOURCE_DIR
# Ctrl-C (SIGINT) during start-up is a graceful stop (issue [N]): the
# handlers are installed first thing, the request is remembered through the
# Trainer's start-up (calibration), and the run stops after its first step
# with a checkpoint, exit 0.
set -u
wlb4d=$1 prep=$2 src=$3
work=$(mktemp -d /tmp/wlb4d-sigint-XXXXXX)
pid=
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"' EXIT
cd "$work"
"$prep" --input "$src/tests/data/tiny.jsonl" --output tiny-train.h5 > /dev/null || exit 1
fail() { echo "stop_signal_test: $*"; cat run.log; exit 1; }
"$wlb4d" "$src/inputs/ci-tiny.ini" --train.steps=500 --train.print_every=1 --balance.calibrate=true \
  --checkpoint.dir=ck --checkpoint.at_end=false > run.log 2>&1 &
pid=$!
for _ in $(seq 1 200); do grep -q "| deck " run.log && break; sleep 0.05; done
grep -q "| deck " run.log || fail "no start-up line"
kill -INT "$pid"
wait "$pid"; rc=$?; pid=
[ "$rc" -eq 0 ] || fail "exit code $rc after SIGINT (expected a graceful stop, 0)"
grep -q "stop requested" run.log || fail "no 'stop requested' message"
grep -Eq "checkpoint .*step_0000[0-9]{2}\.h5 written" run.log || fail "no checkpoint written"
last=$(grep -Eo "step +[0-9]+/500" run.log | tail -1)
echo "stop_signal_test: ok (stopped at '$last')"
