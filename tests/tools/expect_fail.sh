#!/usr/bin/env bash
# expect_fail.sh REGEX COUNT CMD...
# Passes when CMD exits non-zero and REGEX matches at least COUNT output lines
# (COUNT = number of ranks where every rank must say what went wrong), or
# exactly N lines with COUNT = =N (a deck error, which rank 0 says once for
# all ranks). With EXPECT_RC=R in the environment, CMD must also exit with R
# (e.g. 1, not 9: mpiexec's kill of ranks that ended without finalizing).
set -u
regex=$1; count=$2; shift 2
out=$("$@" 2>&1); rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 0 ]; then echo "expect_fail: command succeeded, expected a failure"; exit 1; fi
if [ -n "${EXPECT_RC:-}" ] && [ "$rc" -ne "$EXPECT_RC" ]; then
  echo "expect_fail: exit code $rc, expected $EXPECT_RC"; exit 1
fi
if printf '%s\n' "$out" | grep -q "BAD TERMINATION\|MPI_Abort"; then
  [ -n "${EXPECT_RC:-}" ] && { echo "expect_fail: an abort banner after our message"; exit 1; }
fi
n=$(printf '%s\n' "$out" | grep -E -c -- "$regex")
if [ "${count#=}" != "$count" ]; then
  if [ "$n" -ne "${count#=}" ]; then
    echo "expect_fail: '$regex' matched $n lines, expected exactly ${count#=}"; exit 1
  fi
elif [ "$n" -lt "$count" ]; then
  echo "expect_fail: '$regex' matched $n lines, expected >= $count"; exit 1
fi
echo "expect_fail: ok (rc=$rc, $n matching lines)"
