#!/usr/bin/env bash
# log_path_test.sh SCENARIO MPIEXEC WLB4D WLB4D_PREP SOURCE_DIR
# The timing log's files are checked at start-up (issue [N]), on 2 ranks,
# before calibration (balance.calibrate=true) and checkpoint load: every rank
# prints our message naming the key, the path and the cause; no HDF5-DIAG
# error stack; non-zero exit; training never starts.
#   nodir:    log.timing_file in a folder that does not exist
#   notdir:   log.csv_file under a regular file
#   readonly: log.timing_file in a read-only tmpfs (root; else 77: skipped)
set -u
scenario=$1 mpiexec=$2 wlb4d=$3 prep=$4 src=$5
work=$(mktemp -d /tmp/wlb4d-logpath-XXXXXX)
cleanup() { umount "$work/ro" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
cd "$work"
"$prep" --input "$src/tests/data/tiny.jsonl" --output tiny-train.h5 > /dev/null || exit 1
case "$scenario" in
  nodir) key=log.timing_file path=nodir/t.h5 want="folder 'nodir' does not exist" ;;
  notdir) : > afile; key=log.csv_file path=afile/t.csv want="'afile' is not a directory" ;;
  readonly)
    mkdir ro
    mount -t tmpfs -o ro,size=1m tmpfs ro 2>/dev/null || { echo "log_path_test: cannot mount a tmpfs (needs root): skipped"; exit 77; }
    key=log.timing_file path=ro/t.h5 want="folder 'ro' is not writable: Read-only file system" ;;
esac
out=$(timeout -s KILL 100 "$mpiexec" -n 2 "$wlb4d" "$src/inputs/ci-tiny.ini" --parallel.dp=2 --train.steps=3 \
      --balance.calibrate=true --checkpoint.at_end=false --$key=$path 2>&1)
rc=$?
printf '%s\n' "$out"
fail() { echo "log_path_test ($scenario): $*"; exit 1; }
[ "$rc" -eq 137 ] && fail "the job hung (killed after 100 s)"
[ "$rc" -ne 0 ] || fail "the job exited 0"
n=$(printf '%s\n' "$out" | grep -cF "$key='$path': $want")
[ "$n" -ge 2 ] || fail "\"$key='$path': $want\" from $n ranks, expected 2"
printf '%s\n' "$out" | grep -q "HDF5-DIAG" && fail "HDF5's raw error stack was printed"
printf '%s\n' "$out" | grep -q "calibrated" && fail "calibration ran before the check"
printf '%s\n' "$out" | grep -q "step *1/" && fail "training started before the check"
echo "log_path_test ($scenario): ok"
