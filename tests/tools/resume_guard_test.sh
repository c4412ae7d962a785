#!/usr/bin/env bash
# resume_guard_test.sh SCENARIO NPROCS MPIEXEC WLB4D WLB4D_PREP SOURCE_DIR
# checkpoint.resume against what an earlier run left, through wlb4d on NPROCS
# ranks (2: dp=2 under mpiexec). A first run writes ck/step_000005.h5,
# ck/step_000010.h5, ck/latest and the timing log t.h5 / t.csv; then:
#   devzero:  ck/latest is a symbolic link to /dev/zero: resume=auto reads it
#             bounded, says so and resumes from the newest step file that
#             verifies (step 10); the step files are untouched.
#   dir:      ck/latest is a directory: a run that writes checkpoints is
#             refused naming it, on every rank; one that writes none falls
#             back to step 10. The step files are untouched.
#   missing:  no ck/latest: resume=auto says so and resumes from step 10; with
#             step 10 damaged too it falls back to step 5 and, reaching step
#             10, keeps the damaged file aside instead of overwriting it.
#   never:    resume=never over the first run (checkpoint.overwrite=false) is
#             refused before training on every rank, naming the files and the
#             key; every file keeps its checksum. With
#             checkpoint.overwrite=true the run replaces them (warning).
# Every command runs under `timeout`: a hang is a failure.
set -u
source "$(dirname "$0")/lib.sh"
scenario=$1 np=$2 mpiexec=$3 wlb4d=$4 prep=$5 src=$6
test_label+=" ($scenario, $np ranks)"
scratch_dir resume-guard
prep_tiny "$prep" "$src"
launch=("$wlb4d")
[ "$np" -gt 1 ] && launch=("$mpiexec" -n "$np" "$wlb4d")
deck=("$src/inputs/ci-tiny.ini" --parallel.dp="$np" --train.print_every=1
      --checkpoint.at_end=false --log.timing_file=t.h5 --log.csv_file=t.csv)

ckdir=ck overwrite=false
# run TIMEOUT ARGS...: output in $out, status in $rc; a timeout fails the test.
run() {
  local t=$1; shift
  run_step "$t" "${launch[@]}" "${deck[@]}" --checkpoint.dir="$ckdir" --checkpoint.overwrite="$overwrite" "$@"
}
expect() {  # expect RC_WANTED REGEX: rc (0 or nonzero) and a matching line
  if [ "$1" = 0 ]; then [ "$rc" -eq 0 ] || fail "rc $rc, expected 0"; else [ "$rc" -ne 0 ] || fail "rc 0, expected a failure"; fi
  out_has -E -- "$2" || fail "no line matches '$2'"
}
every_rank() {  # every_rank REGEX: every rank refused: said once by rank 0 for all (the same text on every
  # rank), or by each rank when their texts differ
  local n
  n=$(out_count -E -- "\[r[0-9]+\] wlb4d: .*$1")
  [ "$n" -eq 1 ] || [ "$n" -eq "$np" ] || fail "'$1' printed by $n ranks, expected once (rank 0) or by all $np"
  [ "$n" -eq 1 ] && { out_has -E -- "\[r0\] wlb4d: .*$1" || fail "'$1' said once, but not by rank 0"; }
  return 0
}
# Checksums of the step files and `latest` (and, with "all", the timing log);
# not the lock file, whose holder line each run rewrites.
sums() {
  find ck -type f \( -name 'step_*' -o -name latest \) -print0 | sort -z | xargs -0 md5sum
  [ "${1:-}" = all ] && md5sum t.h5 t.csv
}

run 120 --train.steps=10 --checkpoint.every=5 --checkpoint.resume=never
expect 0 "step +10/10"
[ "$(cat ck/latest)" = "$(printf 'step_000010.h5\nstep_000005.h5')" ] || fail "latest is '$(cat ck/latest)'"
chosen="resuming from ck/step_000010.h5, the newest step file of ck that verifies"

case "$scenario" in
  devzero)
    rm ck/latest && ln -s /dev/zero ck/latest
    before=$(sums)
    run 120 --train.steps=12 --checkpoint.resume=auto
    expect 0 "ck/latest is a character device \(through a symbolic link\), not the list of checkpoints.*; $chosen"
    expect 0 "resumed from ck/step_000010.h5 at step 10"
    expect 0 "step +12/12"
    [ "$(sums)" = "$before" ] || fail "a step file changed"
    ;;
  dir)
    rm ck/latest && mkdir ck/latest
    before=$(sums)
    run 60 --train.steps=15 --checkpoint.every=5 --checkpoint.resume=auto
    expect 1 "ck/latest is a directory, not the list of checkpoints \(a regular file\): remove or rename it"
    every_rank "ck/latest is a directory"
    [ "$(sums)" = "$before" ] || fail "a step file changed"
    run 120 --train.steps=12 --checkpoint.every=0 --checkpoint.resume=auto
    expect 0 "ck/latest is a directory, not the list of checkpoints.*; $chosen"
    expect 0 "resumed from ck/step_000010.h5 at step 10"
    [ "$(sums)" = "$before" ] || fail "a step file changed"
    ;;
  missing)
    rm ck/latest
    before=$(sums)
    run 120 --train.steps=12 --checkpoint.resume=auto
    expect 0 "ck/latest is missing; $chosen"
    expect 0 "resumed from ck/step_000010.h5 at step 10"
    [ "$(sums)" = "$before" ] || fail "a step file changed"
    truncate -s 1000 ck/step_000010.h5
    damaged=$(md5sum < ck/step_000010.h5) five=$(md5sum < ck/step_000005.h5)
    run 120 --train.steps=12 --checkpoint.every=5 --checkpoint.resume=auto
    expect 0 "checkpoint ck/step_000010.h5 is unusable \(.*\); falling back to the previous checkpoint ck/step_000005.h5 \(a step file of ck that ck/latest does not list\)"
    expect 0 "ck/latest is missing; resuming from ck/step_000005.h5, the newest step file of ck that verifies"
    expect 0 "checkpoint ck/step_000010.h5 was not written by this run; it is kept as ck/step_000010.h5.replaced-[0-9]+"
    expect 0 "step +12/12"
    [ "$(md5sum < ck/step_000005.h5)" = "$five" ] || fail "step_000005.h5 changed"
    [ "$(cat ck/step_000010.h5.replaced-* | md5sum)" = "$damaged" ] || fail "the damaged step 10 was not kept aside"
    ;;
  never)
    before=$(sums all)
    run 60 --train.steps=10 --checkpoint.every=5 --checkpoint.resume=never
    expect 1 "checkpoint.resume=never starts this run at step 0, but checkpoint.dir='ck' holds an earlier run's checkpoints and an earlier run's timing log is there \(ck/latest, ck/step_000010.h5, ck/step_000005.h5, t.h5, t.csv\).*checkpoint.overwrite=true"
    # A deck error: every rank refuses, and rank 0 says it once for all.
    [ "$(out_count -E -- "wlb4d: deck error: checkpoint.resume=never starts this run at step 0")" -eq 1 ] \
      || fail "the deck error was not said exactly once"
    expect_not_trained
    [ "$(sums all)" = "$before" ] || fail "a file changed"
    # Another checkpoint.dir, the same timing log: still refused, naming the log.
    ckdir=ck2 run 60 --train.steps=10 --checkpoint.every=5 --checkpoint.resume=never
    expect 1 "an earlier run's timing log is there \(t.h5, t.csv\)"
    [ "$(sums all)" = "$before" ] || fail "a file changed"
    overwrite=true run 120 --train.steps=3 --checkpoint.every=5 --checkpoint.resume=never
    expect 0 "checkpoint.overwrite=true: .*removing ck/latest, ck/step_000010.h5, ck/step_000005.h5, t.h5, t.csv"
    expect 0 "step +3/3"
    [ ! -e ck/step_000010.h5 ] && [ ! -e ck/latest ] || fail "the earlier run's checkpoints are still there"
    [ "$(wc -l < t.csv)" -eq $((1 + 3 * np)) ] || fail "t.csv has $(wc -l < t.csv) lines, expected the new run's $((1 + 3 * np))"
    ;;
  *) fail "unknown scenario" ;;
esac
echo "$test_label: ok"
