#!/usr/bin/env bash
# wlb4d quickstart on a fresh Debian 12 machine, offline:
#   1. install the Debian packages (only those missing),
#   2. configure and build (Release),
#   3. turn the embedded State of the Union corpus into HDF5 token datasets,
#   4. train the quickstart model (inputs/quickstart.ini) on the 4D grid
#      dp=2 x pp=2 x cp=2 (8 ranks, oversubscribed on a small machine) with the
#      wlb packer and adaptive CP sharding, and report train/val loss.
# Environment: RANKS (default 8) MPI ranks; extra arguments are deck overrides,
# e.g. one rank: `RANKS=1 scripts/quickstart.sh --parallel.dp=1 --parallel.pp=1 --parallel.cp=1`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=openblas-env.sh
source scripts/openblas-env.sh   # the CPU's best OpenBLAS kernel when OPENBLAS_CORETYPE is unset
RANKS=${RANKS:-8}
RUN=runs/quickstart
scripts/install-deps.sh
scripts/build.sh
BIN=${BUILD_DIR:-build}/app
mkdir -p "$RUN/data"
if [ ! -f "$RUN/data/sotu-train.h5" ] || [ inputs/corpus/sotu-embedded.jsonl.xz -nt "$RUN/data/sotu-train.h5" ]; then
  "$BIN/wlb4d-prep" --input inputs/corpus/sotu-embedded.jsonl.xz \
      --output "$RUN/data/sotu-train.h5" --val-fraction 0.1 --val-output "$RUN/data/sotu-val.h5"
fi
rm -f "$RUN/timing.h5"
export OMP_NUM_THREADS=1 KOKKOS_NUM_THREADS=1
mpiexec -n "$RANKS" "$BIN/wlb4d" inputs/quickstart.ini "$@" 2>&1 | tee "$RUN/train.log"
echo "quickstart: log in $RUN/train.log, timing table in $RUN/timing.h5"
