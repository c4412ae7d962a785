#!/usr/bin/env bash
# checkpoint_fs_test.sh SCENARIO MPIEXEC WLB4D WLB4D_PREP WLB4D_CKPT SOURCE_DIR
# Checkpoints on a file system that cannot take them: a small
# tmpfs (full disk) and a read-only tmpfs, 2 ranks (tp=2: two writer ranks).
#   full:      4 MiB tmpfs: the step-5 checkpoint fits, the step-10 one does
#              not; every rank says "no space left on device", the job exits
#              non-zero within the timeout, no .tmp is left, `latest` still
#              names step 5 and that checkpoint verifies.
#   readonly:  read-only checkpoint.dir: refused at start-up (before step 1)
#              on every rank with "is not writable".
#   fault:     no mount: WLB4D_FAULT=ckpt_write:rank=1:after_bytes=1000000
#              makes rank 1's writes fail as on a full disk in the middle of
#              the step-10 checkpoint (rank 1 writes about 0.7 MB per
#              checkpoint); the same checks as "full".
#   full1:     "full" on 1 rank (tp=1), 2700 KiB tmpfs: the failed write
#              must not leave a half-closed HDF5 file behind that
#              MPI_Finalize then closes and crashes in (H5F__close_cb,
#              rc 139 before the fix). WLB4D_FAULT=ckpt_free makes the
#              free-space checks (whose estimate is about twice the file)
#              pass, so the real write runs out of space mid-file.
#   fault1:    "fault" on 1 rank: WLB4D_FAULT=ckpt_write:rank=0 fails rank
#              0's writes past 2 MB (about 1.4 MB per checkpoint), the same
#              checks as full1 (never skipped).
#   full2:     "full" on tp=2 with WLB4D_FAULT=ckpt_free (the free-space
#              checks pass) and a 2700 KiB tmpfs: the step-10 write runs out
#              of space. Before the disk space was reserved up front, both
#              writers failed the same HDF5 call and then hung in the
#              collective close, silently, leaving the .tmp.
#   fullz:     full2 with dp=2 and parallel.zero=1 (moments sharded over DP).
#   nearly_full: no mount: WLB4D_FAULT=ckpt_free:bytes=100000 (statvfs as
#              on a nearly full disk): refused at start-up, before step 1,
#              on both ranks with "no space left on device for a checkpoint"
#              and both figures.
#   fault_async, full2_async: fault and full2 with checkpoint.async=true:
#              the step-10 checkpoint fails inside the writer thread; the
#              error reaches every rank's training thread (at the next step
#              or when the run waits for the writer) with the same checks.
# full/full1/full2/fullz/full2_async/readonly need root (mount); they exit 77 (ctest: skipped) where
# tmpfs cannot be mounted.
set -u
source "$(dirname "$0")/lib.sh"
scenario=$1 mpiexec=$2 wlb4d=$3 prep=$4 ckpt=$5 src=$6
test_label+=" ($scenario)"
scratch_dir fs
mnt=$work/mnt
at_exit() { umount "$mnt" 2>/dev/null; }
mkdir -p "$mnt"
opts="size=4m"
[ "$scenario" = full1 ] && opts="size=2700k"
case "$scenario" in full2|fullz|full2_async) opts="size=2700k" ;; esac
extra=
case "$scenario" in *_async) extra=--checkpoint.async=true ;; esac
[ "$scenario" = readonly ] && opts="ro,size=1m"
np=2 layout=--parallel.tp=2
case "$scenario" in *1) np=1 layout=--parallel.tp=1 ;; fullz) layout="--parallel.dp=2 --parallel.zero=1" ;; esac
if [ "$scenario" = fault ] || [ "$scenario" = fault_async ]; then
  export WLB4D_FAULT=ckpt_write:rank=1:after_bytes=1000000
elif [ "$scenario" = fault1 ]; then
  export WLB4D_FAULT=ckpt_write:rank=0:after_bytes=2000000
elif [ "$scenario" = nearly_full ]; then
  export WLB4D_FAULT=ckpt_free:bytes=100000
elif { [ "$scenario" = full1 ] || [ "$scenario" = full2 ] || [ "$scenario" = fullz ] || [ "$scenario" = full2_async ]; } && mount -t tmpfs -o "$opts" tmpfs "$mnt" 2>/dev/null; then
  export WLB4D_FAULT=ckpt_free:bytes=1000000000
elif ! mount -t tmpfs -o "$opts" tmpfs "$mnt" 2>/dev/null; then
  echo "$test_label: cannot mount a tmpfs here (needs root): skipped"; exit 77
fi
prep_tiny "$prep" "$src"
dir=$mnt/ck
[ "$scenario" = readonly ] && dir=$mnt
run_timed 120 "$mpiexec" -n $np "$wlb4d" "$src/inputs/ci-tiny.ini" $layout --train.steps=12 \
  --checkpoint.every=5 --checkpoint.at_end=false --checkpoint.dir="$dir" $extra
printf '%s\n' "$out"
expect_job_failed
[ "$rc" -ge 128 ] && fail "the job died of signal $((rc - 128)) (rc $rc) instead of exiting with an error"
out_has "H5F__close_cb\|Segmentation\|signal 11\|BAD TERMINATION" && fail "a crash was reported"
case "$scenario" in
  full|fault|full1|fault1|full2|fullz|fault_async|full2_async)
    [ -z "$extra" ] || out_has "asynchronous checkpoints" || fail "the run did not write asynchronously"
    n=$(out_count "\[r[01]\].*no space left on device")
    # Said once by rank 0 when every rank failed with the same text, else by each.
    [ "$n" -ge 1 ] || fail "no rank said 'no space left on device'"
    expect_checkpoints_intact "$ckpt" "$mnt/ck" 5
    [ "$elapsed" -le 60 ] || fail "took $elapsed s to fail"
    ;;
  nearly_full)
    n=$(out_count "\[r[01]\].*checkpoint.dir='$dir': no space left on device for a checkpoint: it needs about [0-9]* MiB, the file system has 0 MiB (97 KiB) free")
    [ "$n" -ge 1 ] || fail "no rank said 'no space left on device for a checkpoint' with both figures"
    expect_not_trained
    ;;
  readonly)
    n=$(out_count "\[r[01]\].*checkpoint.dir='$dir'.*not writable")
    [ "$n" -ge 1 ] || fail "no rank said 'not writable'"
    expect_not_trained
    ;;
esac
echo "$test_label: ok"
