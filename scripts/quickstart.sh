#!/usr/bin/env bash
# wlb4d quickstart on a fresh Debian 12 machine, offline:
#   1. install the Debian packages (only those missing),
#   2. configure and build (Release) the two programs it runs, wlb4d-prep and
#      wlb4d (scripts/build.sh or scripts/test.sh builds the rest: tests,
#      benchmarks, wlb4d-plan, wlb4d-ckpt, wlb4d-generate),
#   3. turn the embedded State of the Union corpus into HDF5 token datasets,
#   4. train the quickstart model (inputs/quickstart.ini) on the 4D grid
#      dp=2 x pp=2 x cp=2 (8 ranks, oversubscribed on a small machine) with the
#      wlb packer and adaptive CP sharding, and report train/val loss.
# Environment: RANKS (default 8) MPI ranks; extra arguments are deck overrides,
# e.g. one rank: `RANKS=1 scripts/quickstart.sh --parallel.dp=1 --parallel.pp=1 --parallel.cp=1`.
# A rerun starts over and keeps the earlier run: its checkpoints, timing log, plot
# and train.log move to runs/quickstart/previous/<date>/ first. Given
# --checkpoint.resume=auto, the run continues from the last checkpoint
# instead, and appends to the logs.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=openblas-env.sh
source scripts/openblas-env.sh   # OpenBLAS's kernel for the CPU's widest instruction set when OPENBLAS_CORETYPE is unset
RANKS=${RANKS:-8}
RUN=runs/quickstart
scripts/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
BIN=$BUILD_DIR/app
mkdir -p "$RUN/data"
if [ ! -x "$BIN/wlb4d" ] || [ ! -x "$BIN/wlb4d-prep" ]; then
  echo "quickstart: building wlb4d and wlb4d-prep (about 210 CPU-seconds the first time: 2 minutes on 2 idle cores; later runs rebuild only what changed)"
fi
# Configure once; later builds re-configure by themselves when a CMakeLists changes.
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} ${CMAKE_ARGS:-} > "$RUN/configure.log" 2>&1 \
    || { cat "$RUN/configure.log"; exit 1; }
fi
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" --target wlb4d wlb4d-prep
if [ ! -f "$RUN/data/sotu-train.h5" ] || [ inputs/corpus/sotu-embedded.jsonl.xz -nt "$RUN/data/sotu-train.h5" ]; then
  "$BIN/wlb4d-prep" --input inputs/corpus/sotu-embedded.jsonl.xz \
      --output "$RUN/data/sotu-train.h5" --val-fraction 0.1 --val-output "$RUN/data/sotu-val.h5"
fi
# A bad argument (a misspelt key) fails here, before the earlier run is moved aside.
"$BIN/wlb4d" inputs/quickstart.ini "$@" --check --check-ranks "$RANKS" > "$RUN/check.log" 2>&1 \
  || { cat "$RUN/check.log"; exit 2; }
tee_args=()
case " $* " in
  *" --checkpoint.resume="*) tee_args=(-a) ;;   # continue (auto) or as asked: keep the outputs, append
  *)
    old=()
    for f in "$RUN/checkpoints" "$RUN/timing.h5" "$RUN/timing.png" "$RUN/train.log"; do [ -e "$f" ] && old+=("$f"); done
    if [ "${#old[@]}" -gt 0 ]; then
      prev="$RUN/previous/$(date +%Y%m%d-%H%M%S)"
      mkdir -p "$prev"
      mv "${old[@]}" "$prev/"
      echo "quickstart: starting over; the earlier run's ${old[*]##*/} moved to $prev (delete it when done; --checkpoint.resume=auto continues a run instead)"
    fi ;;
esac
export OMP_NUM_THREADS=1 KOKKOS_NUM_THREADS=1
rc=0
mpiexec -n "$RANKS" "$BIN/wlb4d" inputs/quickstart.ini "$@" 2>&1 | tee "${tee_args[@]}" "$RUN/train.log" || rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { echo "quickstart: wlb4d failed (exit $rc); its output is in $RUN/train.log"; exit "$rc"; }
echo "quickstart: log in $RUN/train.log, timing table in $RUN/timing.h5, checkpoints in $RUN/checkpoints"
echo "quickstart: next: /usr/bin/python3 scripts/plot_timing.py $RUN/timing.h5 -o $RUN/timing.png"
