#!/usr/bin/env bash
# Runs a command that times the machine (the start-up cost-model calibration)
# and reruns it, at most TRIES times in all, while its output says the timing
# was judged degenerate because the node was busy ("the calibration is
# degenerate"): wlb4d then plans from FLOP counts, correctly, but the test
# wants the calibrated path. Before each rerun OUTPUT (the run's timing log)
# is removed. Prints every run's output; exits with the last run's status.
#   rerun_when_busy.sh TRIES OUTPUT COMMAND...
set -uo pipefail
tries=$1 output=$2
shift 2
for ((i = 1; i <= tries; ++i)); do
  out=$("$@" 2>&1)
  rc=$?
  printf '%s\n' "$out"
  grep -q 'the calibration is degenerate' <<<"$out" || exit "$rc"
  echo "rerun_when_busy: run $i of $tries: calibration degenerate (busy node)"
  rm -f "$output"
done
exit "$rc"
