#!/usr/bin/env bash
# deck_bounds_test.sh MPIEXEC WLB4D WLB4D_PLAN
# Deck files are bounded before they are read: a deck or include that is a
# device (/dev/zero, /dev/urandom), a FIFO, a symlink to a device or a 4 GB
# file is refused at once, on every rank, naming the file, the include chain
# and the rule (a regular file of at most 4 MiB) — never read until
# std::bad_alloc, never blocked on. Each case has a 20 s limit: a hang fails.
set -u
source "$(dirname "$0")/lib.sh"
mpiexec=$1 wlb4d=$2 plan=$3
scratch_dir deckbound
# A reader without the bound grows a string to the memory limit: keep that
# from taking the machine (4 GiB of address space is plenty for the fixed one).
ulimit -v 4194304 2>/dev/null || true
run() {  # run NP PROGRAM ARGS...: output in $out, status in $rc
  local np=$1; shift
  if [ "$np" = 0 ]; then
    run_timed 20 "$@"
  else
    run_timed 20 "$mpiexec" -n "$np" "$@"
  fi
  printf '%s\n' "$out" | tail -n 4
  [ "$rc" -eq 137 ] && fail "hung (killed after 20 s): $*"
  [ "$rc" -ne 0 ] || fail "accepted (rc 0): $*"
  return 0
}
expect() {  # expect COUNT REGEX: exactly COUNT output lines match (a deck
  local n  # error is said once, by rank 0, for all ranks)
  n=$(out_count -E -- "$2")
  [ "$n" -eq "$1" ] || fail "'$2' matched $n lines, expected $1"
}
rule='must be a regular file of at most 4 MiB'
printf 'include = /dev/zero\n[train]\nsteps = 1\n' > zero.ini
printf 'include = /dev/urandom\n' > urandom.ini
printf 'include = zero.ini\n' > outer.ini
truncate -s 4G big.ini                       # sparse: no disk used
printf 'include = big.ini\n' > usebig.ini
ln -s /dev/zero link.ini
mkfifo pipe.ini

run 2 "$wlb4d" zero.ini --check
expect 1 "\[r0\] wlb4d: deck error: deck file '/dev/zero' is a character device: .*$rule.*include chain: 'zero.ini' -> 'include = /dev/zero'"
run 1 "$wlb4d" urandom.ini --check
expect 1 "deck error: deck file '/dev/urandom' is a character device: .*$rule"
run 2 "$wlb4d" outer.ini --check
expect 1 "\[r0\] .*deck file '/dev/zero' is a character device.*include chain: 'outer.ini' -> 'zero.ini' -> 'include = /dev/zero'"
run 2 "$wlb4d" usebig.ini --check
expect 1 "\[r0\] .*deck file 'big.ini' is 4294967296 bytes: .*$rule \(4194304 bytes\).*include chain: 'usebig.ini' -> 'include = big.ini'"
run 2 "$wlb4d" link.ini --check
expect 1 "\[r0\] .*deck file 'link.ini' \(a symbolic link to '/dev/zero'\) is a character device: .*$rule"
run 1 "$wlb4d" pipe.ini --check
expect 1 "deck error: deck file 'pipe.ini' is a named pipe \(FIFO\): .*$rule"
# The planner reads decks with the same parser.
run 0 "$plan" zero.ini
expect 1 "deck file '/dev/zero' is a character device: .*$rule"
run 0 "$plan" big.ini
expect 1 "deck file 'big.ini' is 4294967296 bytes: .*$rule"
echo "$test_label: ok"
