#!/usr/bin/env bash
# checkpoint_integrity_test.sh SCENARIO WLB4D WLB4D_PREP WLB4D_CKPT SOURCE_DIR PYTHON
# Checkpoint integrity: damaged and mismatched checkpoints through the executables.
# A real run (inputs/ci-tiny.ini, 1 rank) writes step 5 and step 10; step 10
# is then changed with h5py:
#   shape:    /model/final_norm.weight recreated with dimension 2^61+1 (as a
#             bit flip in an unchecksummed header would make it): verify,
#             inspect and an explicit resume fail fast naming the dataset;
#             resume=auto falls back to step 5 (listed in `latest`).
#   digest:   one element of /model/layers.0.attn.wq rewritten (HDF5
#             recomputes its Fletcher32): verify and an explicit resume report
#             the content digest mismatch naming the file; resume=auto falls
#             back to step 5; the intact step 5 verifies with its digest.
#   identity: resuming step 10 with another model.rope_theta / model.norm_eps
#             is refused naming the key and both values.
#   done:     resuming step 10 with train.steps=5 says the run is already
#             complete with the step-10 loss the first run printed, rc 0.
#   timing:   resuming step 5 (older than the last logged step 10) with a
#             timing log and CSV: each step appears once in /steps and in the
#             CSV, steps 6-10 with the second run's values (its printed
#             losses), /restarts has both starts.
# Every command runs under `timeout`: a hang is a failure.
set -u
source "$(dirname "$0")/lib.sh"
scenario=$1 wlb4d=$2 prep=$3 ckpt=$4 src=$5 py=$6
test_label+=" ($scenario)"
need_h5py "$py"
scratch_dir integrity
prep_tiny "$prep" "$src"
deck="$src/inputs/ci-tiny.ini"
common=(--checkpoint.every=5 --checkpoint.at_end=false --checkpoint.dir=ck)
first=$(timeout -s KILL 120 "$wlb4d" "$deck" --train.steps=10 --train.print_every=1 "${common[@]}" 2>&1) ||
  { printf '%s\n' "$first"; fail "the first run failed"; }
[ "$(cat ck/latest)" = "$(printf 'step_000010.h5\nstep_000005.h5')" ] || fail "latest is '$(cat ck/latest)'"

expect() {  # expect RC_WANTED REGEX: rc (0 or nonzero) and a matching line
  if [ "$1" = 0 ]; then [ "$rc" -eq 0 ] || fail "rc $rc, expected 0"; else [ "$rc" -ne 0 ] || fail "rc 0, expected a failure"; fi
  out_has -E -- "$2" || fail "no line matches '$2'"
}
fell_back() {
  run_step 120 "$wlb4d" "$deck" --train.steps=12 --checkpoint.resume=auto "${common[@]}"
  expect 0 "checkpoint ck/step_000010.h5 is unusable \(.*$1.*\); falling back to the previous checkpoint ck/step_000005.h5"
  expect 0 "resumed from ck/step_000005.h5 at step 5"
  expect 0 "step +12/12"
}

case "$scenario" in
  shape)
    "$py" - <<'EOF' || fail "h5py patch failed"
import h5py
with h5py.File("ck/step_000010.h5", "r+") as f:
    n = "/model/final_norm.weight"
    del f[n]
    f.create_dataset(n, shape=(2**61 + 1,), chunks=(64,), dtype="f4")
EOF
    msg="checkpoint ck/step_000010.h5: /model/final_norm.weight has shape \[2305843009213693953\] but the checkpoint's model record implies \[64\]"
    run_step 20 "$ckpt" verify ck/step_000010.h5; expect 1 "$msg"
    run_step 20 "$ckpt" inspect ck/step_000010.h5; expect 1 "$msg"
    run_step 60 "$wlb4d" "$deck" --train.steps=12 --checkpoint.resume=ck/step_000010.h5 "${common[@]}"; expect 1 "$msg"
    fell_back "final_norm.weight has shape \[2305843009213693953\]"
    ;;
  digest)
    "$py" - <<'EOF' || fail "h5py patch failed"
import h5py
with h5py.File("ck/step_000010.h5", "r+") as f:
    d = f["/model/layers.0.attn.wq"]
    d[3, 5] = d[3, 5] + 1e-3
EOF
    msg="checkpoint ck/step_000010.h5: content digest mismatch"
    run_step 20 "$ckpt" verify ck/step_000010.h5; expect 1 "$msg"
    run_step 20 "$ckpt" verify ck/step_000005.h5; expect 0 "step_000005.h5: OK .*content digest 0x[0-9a-f]{16} matches"
    run_step 60 "$wlb4d" "$deck" --train.steps=12 --checkpoint.resume=ck/step_000010.h5 "${common[@]}"; expect 1 "$msg"
    fell_back "content digest mismatch"
    ;;
  identity)
    run_step 60 "$wlb4d" "$deck" --train.steps=12 --checkpoint.resume=ck/step_000010.h5 --model.rope_theta=5000 "${common[@]}"
    expect 1 "step_000010.h5: was written for another model: model.rope_theta: the checkpoint has 10000, the deck 5000"
    run_step 60 "$wlb4d" "$deck" --train.steps=12 --checkpoint.resume=auto --model.norm_eps=1e-6 "${common[@]}"
    expect 1 "model.norm_eps: the checkpoint has 1e-05, the deck 1e-06"
    run_step 20 "$ckpt" inspect ck/step_000010.h5; expect 0 "model identity +rope_theta=10000 norm_eps=1e-05"
    ;;
  done)
    loss=$(printf '%s\n' "$first" | sed -n 's/.*step *10\/10 |\( [0-9:]* |\)\{0,1\} loss \([0-9.]*\).*/\2/p')
    [ -n "$loss" ] || fail "no step-10 loss in the first run's output"
    run_step 60 "$wlb4d" "$deck" --train.steps=5 --checkpoint.resume=auto "${common[@]}"
    expect 0 "run already complete: checkpoint ck/step_000010.h5 is at step 10 .*train.steps=5; last loss $loss"
    run_step 60 "$wlb4d" "$deck" --train.steps=10 --checkpoint.resume=auto "${common[@]}"
    expect 0 "run already complete: .*last loss $loss"
    run_step 20 "$ckpt" inspect ck/step_000010.h5; expect 0 "last loss +[0-9.]+ \(training loss of step 10\)"
    stored=$(printf '%s\n' "$out" | sed -n 's/^last loss *\([0-9.]*\) .*/\1/p')
    [ "$(printf '%.4f' "$stored")" = "$loss" ] || fail "inspect's last loss $stored is not the printed $loss"
    ;;
  timing)
    tl=(--log.timing_file=t.h5 --log.csv_file=t.csv --train.print_every=1)
    rm -rf ck
    run_step 120 "$wlb4d" "$deck" --train.steps=10 "${common[@]}" "${tl[@]}"; expect 0 "step +10/10"
    run_step 120 "$wlb4d" "$deck" --train.steps=10 --checkpoint.resume=ck/step_000005.h5 "${common[@]}" "${tl[@]}"
    expect 0 "timing log t.h5: 5 rows with step >= 5 \(run again by this start\) dropped"
    expect 0 "step +10/10"
    printf '%s\n' "$out" | sed -n 's/.*step *\([0-9]*\)\/10 |\( [0-9:]* |\)\{0,1\} loss \([0-9.]*\).*/\1 \3/p' > second.txt
    "$py" - <<'EOF' || fail "the timing log is wrong"
import csv, h5py, sys
with h5py.File("t.h5", "r") as f:
    steps, restarts = f["/steps"][...], f["/restarts"][...]
rows = list(csv.DictReader(open("t.csv")))
ok = True
def check(what, cond):
    global ok
    if not cond: print("timing log:", what); ok = False
check("/steps steps %s" % list(steps["step"]), list(steps["step"]) == list(range(10)))
check("CSV steps %s" % [r["step"] for r in rows], [int(r["step"]) for r in rows] == list(range(10)))
check("/restarts steps %s" % list(restarts["step"]), list(restarts["step"]) == [0, 5])
check("CSV loss != HDF5 loss", all(float(r["loss"]) == l for r, l in zip(rows, steps["loss"])))
n = 0
for line in open("second.txt"):
    s, loss = line.split()
    n += 1
    check("step %s: logged loss %.4f, the second run printed %s" % (s, steps["loss"][int(s) - 1], loss),
          "%.4f" % steps["loss"][int(s) - 1] == loss)
check("the second run printed %d steps, expected 5" % n, n == 5)
sys.exit(0 if ok else 1)
EOF
    ;;
  *) fail "unknown scenario" ;;
esac
echo "$test_label: ok"
