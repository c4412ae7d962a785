#!/usr/bin/env bash
# Stops the test Slurm that tests/slurm/start-slurm.sh started from this
# checkout (slurmd, slurmctld, by their pid files in this checkout's folder,
# tests/slurm/slurm-dir.sh). It never stops an instance it did not start: the
# folder's `owner` record must name this checkout, and each pid must be a
# daemon running this folder's slurm.conf (not a reused pid). munged is left
# running (shared system service) unless --munge is given and start-slurm.sh
# started it; --purge also removes $WLB4D_TEST_SLURM_DIR.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/slurm-dir.sh"
DIR=$WLB4D_TEST_SLURM_DIR
CONF=$DIR/etc/slurm.conf
purge=0 munge=0
for a in "$@"; do
  case "$a" in
    --purge) purge=1 ;;
    --munge) munge=1 ;;
    *) echo "usage: $0 [--purge] [--munge]" >&2; exit 2 ;;
  esac
done
[ -d "$DIR" ] || { echo "stop-slurm: no test Slurm folder $DIR: nothing to stop"; exit 0; }
if ! grep -qxF "checkout=$WLB4D_CHECKOUT" "$WLB4D_SLURM_OWNER" 2>/dev/null; then
  echo "stop-slurm: $DIR was not started from this checkout ($WLB4D_CHECKOUT): its owner record" \
       "$WLB4D_SLURM_OWNER says '$(grep '^checkout=' "$WLB4D_SLURM_OWNER" 2>/dev/null || echo missing)'; not stopping it" >&2
  exit 1
fi
# stop_pid PIDFILE NAME [MATCH]: the process must still run MATCH (default "-f $CONF").
stop_pid() {
  [ -s "$1" ] || return 0
  local p; p=$(cat "$1")
  if kill -0 "$p" 2>/dev/null; then
    if ! tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "${3:--f $CONF}"; then
      echo "stop-slurm: pid $p of $1 is not this instance's $2 (pid reused?): left alone" >&2
      rm -f "$1"
      return 0
    fi
    kill "$p" 2>/dev/null
    for _ in $(seq 30); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null
    echo "stop-slurm: stopped $2 (pid $p)"
  fi
  rm -f "$1"
}
stop_pid "$DIR/run/slurmd.pid" slurmd
stop_pid "$DIR/run/slurmctld.pid" slurmctld
if [ "$munge" = 1 ]; then
  if grep -qx "munged=1" "$WLB4D_SLURM_OWNER"; then
    stop_pid /run/munge/munged.pid munged munged
  else
    echo "stop-slurm: munged was not started by start-slurm.sh from this checkout: left running"
  fi
fi
if [ "$purge" = 1 ]; then rm -rf "$DIR"; echo "stop-slurm: removed $DIR"; fi
exit 0
