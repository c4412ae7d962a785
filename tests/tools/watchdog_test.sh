#!/usr/bin/env bash
# watchdog_test.sh SCENARIO MPIEXEC WLB4D WLB4D_PREP SOURCE_DIR
# A rank that stops making progress (WLB4D_FAULT=stall, as under SIGSTOP)
# must not hang the job (communication watchdog): with comm.timeout_s=5 a waiting rank's
# wait ends in a "communication timeout" naming the operation, the group and
# the ranks that did not arrive, and the job exits non-zero well within the
# ctest timeout.
#   collective: dp=2, rank 1 stalls: rank 0's collective names rank 1.
#   four:       dp=2 tp=2 (4 ranks), world rank 3 stalls: its TP partner
#               (world 2) names it; the DP ranks name the rank they wait
#               for; of the ranks named, the one that reports no timeout
#               itself is world rank 3 alone.
#   p2p:        pp=2, rank 1 stalls: rank 0's send/recv names its peer 1.
#   dp4:        dp=4, world rank 3 stalls: ranks 0-2 wait in the same DP
#               collective and answer each other's queries: a message names
#               rank 3 alone as not arrived and lists the others as waiting.
set -u
source "$(dirname "$0")/lib.sh"
scenario=$1 mpiexec=$2 wlb4d=$3 prep=$4 src=$5
test_label+=" ($scenario)"
scratch_dir watchdog
prep_tiny "$prep" "$src"
np=2 stalled=1
case "$scenario" in
  collective) layout="--parallel.dp=2" ;;
  four) np=4 stalled=3 layout="--parallel.dp=2 --parallel.tp=2" ;;
  p2p) layout="--parallel.pp=2" ;;
  dp4) np=4 stalled=3 layout="--parallel.dp=4" ;;
esac
WLB4D_FAULT=stall:rank=$stalled:step=2 run_timed 100 "$mpiexec" -n $np "$wlb4d" "$src/inputs/ci-tiny.ini" \
  $layout --train.steps=6 --checkpoint.at_end=false --comm.timeout_s=5
printf '%s\n' "$out"
expect_job_failed
out_has "WLB4D_FAULT: stalling at step 2" || fail "the fault was not injected"
timeouts=$(printf '%s\n' "$out" | grep -E "\[r[0-9]\].*communication timeout: [a-z_]+ on the (world|DP|DP×CP|PP|TP|CP) group .*comm.timeout_s=5")
[ -n "$timeouts" ] || fail "no rank reported the timeout with the operation and group"
case "$scenario" in
  p2p)
    printf '%s\n' "$timeouts" | grep -Eq "\[r0\].*communication timeout: (send|recv) on the PP group .*its peer, rank 1 \(world rank 1\) of the group, did not arrive" \
      || fail "rank 0 did not name its peer (world rank 1) as not arrived"
    ;;
  dp4)
    printf '%s\n' "$timeouts" | grep -Eq "rank 3 \(world rank 3\) of the group did not arrive .*; waiting: [0-2] \(world rank [0-2]\) in i?allreduce, [0-2] \(world rank [0-2]\) in i?allreduce\$" \
      || fail "no message names world rank 3 alone as not arrived and the two other ranks as waiting"
    ;;
  *)
    printf '%s\n' "$timeouts" | grep -Eq "rank [0-9] \(world rank $stalled\) of the group did not arrive" \
      || fail "no timeout message names world rank $stalled as not arrived"
    # The cause: the ranks named as not arrived that do not report a timeout
    # themselves (a rank waiting in another group is named by this group's
    # ranks, and names the one it waits for) must be the stalled rank alone.
    named=$(printf '%s\n' "$timeouts" | grep -Eo "ranks? [0-9, ()a-z]* of the group did not arrive" \
            | grep -Eo "world rank [0-9]+" | grep -Eo "[0-9]+" | sort -u)
    reporters=$(printf '%s\n' "$timeouts" | grep -Eo "^\[r[0-9]+\]" | grep -Eo "[0-9]+" | sort -u)
    cause=$(comm -23 <(printf '%s\n' "$named") <(printf '%s\n' "$reporters") | tr '\n' ' ')
    [ "$cause" = "$stalled " ] || fail "ranks named as not arrived without reporting a timeout: '$cause', expected '$stalled'"
    ;;
esac
echo "$test_label: ok (rc=$rc after ${elapsed} s)"
