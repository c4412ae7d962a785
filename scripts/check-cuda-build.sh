#!/usr/bin/env bash
# Compiles the GPU path where a CUDA toolkit with NCCL is installed but no GPU
# or CUDA Kokkos is (CI; hpc-conventions §0.2): -DWLB4D_ENABLE_CUDA=ON builds
# the NCCL backend of wlb::comm against the toolkit's NCCL, the NCCL-attaching
# ProcessGrid::use_backend, the device-staging code paths and the gpu-labelled
# tests, with the host Kokkos. Then runs what can run without a GPU: the clear
# refusal of comm.backend=nccl on host memory. Skips (exit 0) without nvcc/NCCL.
#   scripts/check-cuda-build.sh          # BUILD_DIR=build-cuda
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$CUDA_HOME/bin/nvcc" ] || [ ! -f "$CUDA_HOME/include/nccl.h" ]; then
  echo "check-cuda-build: no CUDA toolkit with NCCL under $CUDA_HOME; skipped"
  exit 0
fi
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DWLB4D_ENABLE_CUDA=ON -DWLB4D_ENABLE_BENCH=OFF \
      -DCUDAToolkit_ROOT="$CUDA_HOME" ${CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" --target wlb4d test_comm_nccl test_comm_collectives
(cd "$BUILD_DIR" && ctest --output-on-failure -R "app_train_nccl_unavailable|test_comm_collectives")
echo "check-cuda-build: GPU path compiled with NCCL $(grep -m1 -E '^#define NCCL_VERSION_CODE' "$CUDA_HOME/include/nccl.h" | awk '{print $3}')"
