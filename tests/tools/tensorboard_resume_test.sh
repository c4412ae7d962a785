#!/usr/bin/env bash
# tensorboard_resume_test.sh WLB4D WLB4D_PREP SOURCE_DIR PYTHON
# TensorBoard scalars across a resume from an older checkpoint: a run of 6
# steps checkpointing at 3 and 6 is rewound to step 3 and resumed for 5
# steps. Each start writes its own event file; the second one's SessionLog
# START at step 4 makes TensorBoard drop the first start's steps 4-6, as the
# timing log drops their CSV rows. tensorboard_check.py merges the two files
# that way (a step 6 left over would fail it) and compares every scalar with
# the CSV.
set -u
source "$(dirname "$0")/lib.sh"
wlb4d=$1 prep=$2 src=$3 py=$4
scratch_dir tbresume
prep_tiny "$prep" "$src"
args=("$src/inputs/ci-tiny.ini" --data.train=tiny-train.h5 --checkpoint.every=3 --checkpoint.dir=ck
      --log.csv_file=r.csv --log.tensorboard_dir=tb)
run_step 100 "$wlb4d" "${args[@]}" --train.steps=6
[ "$rc" -eq 0 ] || fail "the first run failed (rc $rc)"
rm -f ck/step_000006.h5
echo step_000003.h5 > ck/latest
sleep 1  # the second event file's name (its start's Unix time) sorts after the first's
run_step 100 "$wlb4d" "${args[@]}" --train.steps=5 --checkpoint.resume=auto
[ "$rc" -eq 0 ] || fail "the resumed run failed (rc $rc)"
out_has "resumed from ck/step_000003.h5 at step 3" || fail "the second run did not resume from step 3"
"$py" "$src/tests/tools/tensorboard_check.py" tb r.csv --starts 2
rc=$?
[ "$rc" -eq 77 ] && exit 77
[ "$rc" -eq 0 ] || fail "the event files do not give the CSV's steps and values"
echo "$test_label: ok"
