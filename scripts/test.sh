#!/usr/bin/env bash
# The test command: install dependencies, build, run the ctest suite (every
# label except gpu), then compile the GPU path if a CUDA toolkit with NCCL is
# installed (WLB4D_CUDA_COMPILE_CHECK=0 skips it). Exits non-zero on any
# failure or timeout.
#   scripts/test.sh                 # whole suite
#   CTEST_ARGS="-L unit" scripts/test.sh   # a subset
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
# One-node Slurm for the `slurm` ctest label (those tests skip if it cannot start).
if [ "${WLB4D_START_SLURM:-1}" = 1 ]; then
  tests/slurm/start-slurm.sh || echo "slurm: not started, slurm tests will skip"
fi
(cd "${BUILD_DIR:-build}" && ctest --output-on-failure -LE gpu -j "${CTEST_JOBS:-2}" ${CTEST_ARGS:-})
# The GPU path compiles wherever a CUDA toolkit with NCCL is installed (no GPU needed).
if [ "${WLB4D_CUDA_COMPILE_CHECK:-1}" = 1 ]; then
  scripts/check-cuda-build.sh
fi
