# shellcheck shell=bash
# Shared part of the shell tests in this folder, which run the executables end
# to end (a job that must fail, a file that must be refused) and check what
# they print. Sourced, not run: `source "$(dirname "$0")/lib.sh"` under bash.
# Functions:
#   fail MESSAGE...            print "<test_label>: MESSAGE", exit 1
#   need_h5py PYTHON           exit 77 (ctest: skipped) when PYTHON lacks h5py
#   scratch_dir NAME           make, enter and (at exit) remove the scratch dir
#   prep_tiny WLB4D_PREP SRC   write tiny-train.h5 from tests/data/tiny.jsonl
#   run_timed SECONDS CMD...   run CMD under a KILL timeout into out/rc/elapsed
#   run_step SECONDS CMD...    run_timed, print the output, fail on a hang
#   expect_job_failed          the job ended by itself, non-zero
#   out_has / out_count GREP_ARGS...   grep -q / grep -c over $out
#   expect_not_trained [WHAT]  no "step 1/" line: refused before training
#   expect_checkpoints_intact WLB4D_CKPT DIR STEP   no .tmp, latest, verify
# Variables (set here, read by the tests' own checks):
#   test_label  what every message of the test starts with
#   work        the scratch directory (scratch_dir)
#   out rc elapsed run_limit   the last command run by run_timed
#   at_exit     a function the test may define: runs at exit before the
#               scratch directory is removed (a mount, a background process)

# The script's name without .sh; a test with scenarios appends its scenario
# (test_label+=" ($scenario)") so that a failure names the case that failed.
test_label=$(basename "$0" .sh)

# fail MESSAGE...: prints "<test_label>: MESSAGE" and ends the test (exit 1).
fail() { echo "$test_label: $*"; exit 1; }

# need_h5py PYTHON: ends the test as skipped (exit 77, ctest's
# SKIP_RETURN_CODE) when PYTHON cannot import h5py: the tests that damage
# HDF5 files on purpose need it, the build does not.
need_h5py() {
  "$1" -c "import h5py" 2>/dev/null || { echo "$test_label: no h5py for $1: skipped"; exit 77; }
}

# scratch_dir NAME: makes /tmp/wlb4d-NAME-XXXXXX, sets $work to it and makes
# it the current directory; it is removed when the test exits, however it
# exits. A test that leaves more behind (a mount, a background process)
# defines at_exit, which runs first.
scratch_dir() {
  work=$(mktemp -d "/tmp/wlb4d-$1-XXXXXX") || fail "cannot make a scratch directory in /tmp"
  trap _lib_on_exit EXIT
  cd "$work" || fail "cannot enter $work"
}
_lib_on_exit() {
  if declare -F at_exit > /dev/null; then at_exit; fi
  rm -rf "$work"
}

# prep_tiny WLB4D_PREP SOURCE_DIR: writes tiny-train.h5 in the current
# directory from the repository's tests/data/tiny.jsonl, the small dataset
# that inputs/ci-tiny.ini trains on.
prep_tiny() {
  "$1" --input "$2/tests/data/tiny.jsonl" --output tiny-train.h5 > /dev/null || fail "prep failed"
}

# run_timed SECONDS CMD...: runs CMD under `timeout -s KILL SECONDS`, so that a
# hang ends as rc 137 instead of holding the test until ctest's own timeout.
# Sets out (stdout and stderr), rc (CMD's exit status), elapsed (wall
# seconds) and run_limit (SECONDS). Prints nothing and never fails: the
# caller decides what the output must say. Environment assignments in front
# of the call (VAR=value run_timed ...) reach CMD.
# shellcheck disable=SC2034  # out, rc, elapsed and run_limit are for the caller
run_timed() {
  local start
  run_limit=$1; shift
  start=$(date +%s)
  out=$(timeout -s KILL "$run_limit" "$@" 2>&1); rc=$?
  elapsed=$(( $(date +%s) - start ))
  return 0
}

# run_step SECONDS CMD...: run_timed, then prints the output (the log of the
# ctest run) and fails the test naming the command when it hung. The caller
# checks $rc and $out.
run_step() {
  run_timed "$@"
  printf '%s\n' "$out"
  [ "$rc" -eq 137 ] && fail "hung (killed after $run_limit s): ${*:2}"
  return 0
}

# expect_job_failed: the job of the last run_timed must have ended by itself
# (not killed by the timeout: a hang is the failure these tests look for)
# and with a non-zero status.
expect_job_failed() {
  [ "$rc" -eq 137 ] && fail "the job hung (killed after $run_limit s)"
  [ "$rc" -ne 0 ] || fail "the job exited 0"
}

# out_has GREP_ARGS...: true when a line of $out matches; the arguments go to
# `grep -q` as they are (a plain pattern is a basic regex; pass -E or -F for
# the others).
out_has() { printf '%s\n' "$out" | grep -q "$@"; }

# out_count GREP_ARGS...: prints how many lines of $out match (grep -c), e.g.
# how many ranks printed a message.
out_count() { printf '%s\n' "$out" | grep -c "$@"; }

# expect_not_trained [WHAT]: a run that had to be refused at start-up never
# printed the step line of step 1 (the check comes before training). WHAT,
# when given, starts the failure message.
# shellcheck disable=SC2120  # WHAT is optional
expect_not_trained() {
  out_has "step *1/" && fail "${1:+$1: }training started before the check"
  return 0
}

# expect_checkpoints_intact WLB4D_CKPT DIR STEP: after a job that failed
# while or after writing checkpoints, DIR holds no .tmp (a half-written
# file), `latest` names step STEP first, and that checkpoint verifies.
expect_checkpoints_intact() {
  local ckpt=$1 dir=$2 file
  file=$(printf 'step_%06d.h5' "$3")
  ls "$dir"/*.tmp > /dev/null 2>&1 && fail "a .tmp was left: $(ls "$dir")"
  [ "$(head -1 "$dir/latest")" = "$file" ] || fail "latest is '$(cat "$dir/latest")', expected $file first"
  "$ckpt" verify "$dir/$file" || fail "the step-$3 checkpoint does not verify"
}
