#!/bin/sh
# The one command to run on a lent GPU machine: unpacks the bundle's payload
# next to this script (once) and runs its gpu-check.sh (scripts/gpu-bundle.sh).
#   ./gpu-check.sh [OUT_DIR]        # default OUT_DIR: ./results (table + CSV + logs)
set -e
here=$(cd "$(dirname "$0")" && pwd)
P=${WLB4D_BUNDLE_DIR:-$here/payload}
if [ ! -f "$P/MANIFEST" ]; then
  [ -f "$here/wlb4d-gpu.tar.xz" ] || { echo "gpu-check: neither $P nor $here/wlb4d-gpu.tar.xz" >&2; exit 1; }
  mkdir -p "$P"
  if ! xz -dc "$here/wlb4d-gpu.tar.xz" 2>/dev/null | tar -C "$P" -xf -; then
    # No xz(1): Python's lzma module reads it too.
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
      "$here/wlb4d-gpu.tar.xz" "$P"
  fi
fi
exec "$P/gpu-check.sh" "${1:-$here/results}"
