#!/usr/bin/env bash
# Stops the test Slurm started by tests/slurm/start-slurm.sh (slurmd, slurmctld,
# by their pid files). munged is left running (shared system service) unless
# --munge is given; --purge also removes $WLB4D_TEST_SLURM_DIR.
set -uo pipefail
DIR=${WLB4D_TEST_SLURM_DIR:-/tmp/wlb4d-slurm}
purge=0 munge=0
for a in "$@"; do
  case "$a" in
    --purge) purge=1 ;;
    --munge) munge=1 ;;
    *) echo "usage: $0 [--purge] [--munge]" >&2; exit 2 ;;
  esac
done
stop_pid() {
  [ -s "$1" ] || return 0
  local p; p=$(cat "$1")
  if kill -0 "$p" 2>/dev/null; then
    kill "$p" 2>/dev/null
    for _ in $(seq 30); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null
    echo "stop-slurm: stopped $2 (pid $p)"
  fi
  rm -f "$1"
}
stop_pid "$DIR/run/slurmd.pid" slurmd
stop_pid "$DIR/run/slurmctld.pid" slurmctld
if [ "$munge" = 1 ]; then stop_pid /run/munge/munged.pid munged; fi
if [ "$purge" = 1 ]; then rm -rf "$DIR"; echo "stop-slurm: removed $DIR"; fi
exit 0
