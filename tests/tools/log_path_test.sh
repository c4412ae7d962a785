#!/usr/bin/env bash
# log_path_test.sh SCENARIO MPIEXEC WLB4D WLB4D_PREP SOURCE_DIR
# The timing log's files are checked at start-up, on 2 ranks,
# before calibration (balance.calibrate=true) and checkpoint load: every rank
# prints our message naming the key, the path and the cause; no HDF5-DIAG
# error stack; non-zero exit; training never starts.
#   nodir:    log.timing_file in a folder that does not exist
#   notdir:   log.csv_file under a regular file
#   readonly: log.timing_file in a read-only tmpfs (root; else 77: skipped)
#   tb_notdir: log.tensorboard_dir under a regular file (the directory is
#             created when missing, so the cause is the file in the way)
#   tb_readonly: log.tensorboard_dir in a read-only tmpfs (root; else 77)
#   trace_json_nodir: log.trace_json (with log.trace_step) in a folder that
#             does not exist
set -u
source "$(dirname "$0")/lib.sh"
scenario=$1 mpiexec=$2 wlb4d=$3 prep=$4 src=$5
test_label+=" ($scenario)"
scratch_dir logpath
at_exit() { umount "$work/ro" 2>/dev/null; }
prep_tiny "$prep" "$src"
case "$scenario" in
  nodir) key=log.timing_file path=nodir/t.h5 want="folder 'nodir' does not exist" ;;
  notdir) : > afile; key=log.csv_file path=afile/t.csv want="'afile' is not a directory" ;;
  readonly)
    mkdir ro
    mount -t tmpfs -o ro,size=1m tmpfs ro 2>/dev/null || { echo "$test_label: cannot mount a tmpfs (needs root): skipped"; exit 77; }
    key=log.timing_file path=ro/t.h5 want="folder 'ro' is not writable: Read-only file system" ;;
  tb_notdir)
    : > afile; key=log.tensorboard_dir path=afile/tb
    want="must be a directory rank 0 can create and write: 'afile' is not a directory" ;;
  tb_readonly)
    mkdir ro
    mount -t tmpfs -o ro,size=1m tmpfs ro 2>/dev/null || { echo "$test_label: cannot mount a tmpfs (needs root): skipped"; exit 77; }
    key=log.tensorboard_dir path=ro/tb
    want="must be a directory rank 0 can create and write: cannot create directory 'ro/tb': Read-only file system" ;;
  trace_json_nodir)
    key=log.trace_json path=nodir/t.json want="folder 'nodir' does not exist"
    extra=--log.trace_step=2 ;;
esac
run_timed 100 "$mpiexec" -n 2 "$wlb4d" "$src/inputs/ci-tiny.ini" --parallel.dp=2 --train.steps=3 \
  --balance.calibrate=true --checkpoint.at_end=false --$key=$path ${extra:-}
printf '%s\n' "$out"
expect_job_failed
n=$(out_count -F "$key='$path': $want")
# Every rank meets the same path: said once by rank 0 (or by each, if the texts differ).
[ "$n" -ge 1 ] || fail "no rank said \"$key='$path': $want\""
out_has "HDF5-DIAG" && fail "HDF5's raw error stack was printed"
out_has "calibrated" && fail "calibration ran before the check"
expect_not_trained
echo "$test_label: ok"
