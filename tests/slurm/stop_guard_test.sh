#!/usr/bin/env bash
# stop_guard_test.sh: tests/slurm/stop-slurm.sh never stops an instance it did
# not start. No Slurm needed: stand-in daemons (sleep processes whose command
# line names the folder's slurm.conf, as slurmd -f CONF does) in a scratch
# folder given as WLB4D_TEST_SLURM_DIR.
#   - the folder's owner record names another checkout: refused, rc 1, the
#     daemon keeps running;
#   - owner record of this checkout, but a pid file naming a process that is
#     not this folder's daemon (a reused pid): left alone;
#   - owner record of this checkout and its daemon: stopped.
# And start-slurm.sh's default folder differs between two checkouts.
set -u
here=$(cd "$(dirname "$0")" && pwd -P)
checkout=$(cd "$here/../.." && pwd -P)
d=$(mktemp -d /tmp/wlb4d-stopguard-XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$d" "$d.copy"' EXIT
fail() { echo "stop_guard_test: $*"; exit 1; }
mkdir -p "$d/run" "$d/etc"
daemon() {  # daemon PIDFILE ARGV0: a stand-in process, its pid in PIDFILE
  bash -c "exec -a '$2' sleep 300" &
  pids+=($!)
  echo $! > "$1"
}
daemon "$d/run/slurmd.pid" "slurmd -f $d/etc/slurm.conf"
mine=${pids[0]}
printf 'checkout=/somewhere/else\n' > "$d/owner"
out=$(WLB4D_TEST_SLURM_DIR=$d "$here/stop-slurm.sh" 2>&1); rc=$?
echo "$out"
[ "$rc" -ne 0 ] || fail "stop-slurm.sh stopped another checkout's instance (rc 0)"
echo "$out" | grep -q "was not started from this checkout" || fail "no message naming the owner"
kill -0 "$mine" 2>/dev/null || fail "another checkout's daemon was killed"
printf 'checkout=%s\n' "$checkout" > "$d/owner"
daemon "$d/run/slurmctld.pid" "sleep-not-slurmctld"
other=${pids[1]}
out=$(WLB4D_TEST_SLURM_DIR=$d "$here/stop-slurm.sh" 2>&1); rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "rc $rc stopping this checkout's instance"
for _ in $(seq 20); do kill -0 "$mine" 2>/dev/null || break; sleep 0.1; done
kill -0 "$mine" 2>/dev/null && fail "this checkout's daemon still runs"
kill -0 "$other" 2>/dev/null || fail "a process that is not this instance's slurmctld was killed"
echo "$out" | grep -q "is not this instance's slurmctld" || fail "no message about the foreign pid"
# Two checkouts, two folders.
a=$(unset WLB4D_TEST_SLURM_DIR; . "$here/slurm-dir.sh"; echo "$WLB4D_TEST_SLURM_DIR")
mkdir -p "$d.copy/tests" && cp -r "$here" "$d.copy/tests/"
b=$(unset WLB4D_TEST_SLURM_DIR; . "$d.copy/tests/slurm/slurm-dir.sh"; echo "$WLB4D_TEST_SLURM_DIR")
[ "$a" != "$b" ] && [ "$a" != /tmp/wlb4d-slurm ] || fail "checkouts share the folder $a"
echo "stop_guard_test: ok"
