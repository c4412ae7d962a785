#!/usr/bin/env bash
# GPU check in one go: builds wlb4d with the GPU path
# (-DWLB4D_ENABLE_CUDA=ON: Kokkos CUDA space, cuBLAS through KokkosKernels,
# NCCL collectives), runs the tests labelled `gpu` plus the kernel and trainer
# tests on the device, then trains the benchmark deck on 1 GPU (and on dp=2
# over NCCL when there are 2+ GPUs) and prints tokens/s and achieved TFLOP/s.
#
# Run on a GPU node (cluster: `srun -N1 --gpus-per-node=2 scripts/gpu-check.sh`,
# after `spack env activate .` with the +cuda Kokkos of spack.yaml), or on a
# lent GPU machine. Needs a CUDA-enabled Kokkos (KOKKOS_PREFIX, Kokkos_DIR /
# CMAKE_PREFIX_PATH, or the vendored sources through scripts/build-kokkos.sh);
# refuses to run on a host-only Kokkos, where "GPU" results would be CPU ones.
#
#   scripts/gpu-check.sh                       # build-gpu/, all checks
#   BUILD_DIR=b DECK=inputs/bench-quickstart.ini STEPS=6 scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-gpu}
DECK=${DECK:-inputs/bench-gpt2-small.ini}
STEPS=${STEPS:-6}
OUT=${OUT:-runs/gpu-check}
MPIEXEC=${MPIEXEC:-mpiexec}

command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "gpu-check: no GPU visible (nvidia-smi)"; exit 1; }
NGPU=$(nvidia-smi -L | grep -c '^GPU' || true)

# A CUDA Kokkos: KOKKOS_PREFIX, else whatever CMAKE_ARGS/Kokkos_DIR/Spack give,
# else one built from the vendored sources (scripts/build-kokkos.sh cuda;
# needs ../shared/vendor or WLB4D_VENDOR_DIR, about 4 minutes on 2 cores).
if [ -z "${KOKKOS_PREFIX:-}" ] && [ -z "${Kokkos_DIR:-}${Kokkos_ROOT:-}${SPACK_ENV:-}" ]; then
  DEPS_CACHE=${WLB4D_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/wlb4d-deps}
  scripts/build-kokkos.sh cuda "$DEPS_CACHE" || exit 1
  . "$DEPS_CACHE/cuda.env"
  [ "$KOKKOS_STATUS" = skipped ] && KOKKOS_PREFIX=
fi
kk_args=()
[ -n "${KOKKOS_PREFIX:-}" ] && kk_args=(-DCMAKE_PREFIX_PATH="$KOKKOS_PREFIX" -DKokkos_ROOT="$KOKKOS_PREFIX"
                                        -DKokkosKernels_ROOT="$KOKKOS_PREFIX")
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DWLB4D_ENABLE_CUDA=ON -DWLB4D_NATIVE_ARCH=OFF \
      -DWLB4D_ENABLE_BENCH=ON "${kk_args[@]}" ${CMAKE_ARGS:-} | tee "$BUILD_DIR.configure.log"
if grep -q "has no CUDA backend" "$BUILD_DIR.configure.log"; then
  echo "gpu-check: the Kokkos found has no CUDA backend; point Kokkos_DIR at a +cuda Kokkos (spack.yaml)"
  exit 1
fi
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}"

echo "== ctest: gpu label, then kernels and trainer on the device"
(cd "$BUILD_DIR" && ctest --output-on-failure -L gpu)
(cd "$BUILD_DIR" && ctest --output-on-failure -L unit -R "layers|attention|transformer|adamw|step_alloc")

echo "== training throughput ($DECK, $STEPS steps)"
mkdir -p "$OUT/data"
[ -f "$OUT/data/sotu-train.h5" ] ||
  "$BUILD_DIR/app/wlb4d-prep" --input inputs/corpus/sotu-embedded.jsonl.xz --output "$OUT/data/sotu-train.h5" >/dev/null
run() {  # run NAME RANKS ARGS...
  local name=$1 ranks=$2; shift 2
  KOKKOS_DEVICE_ID=0 "$MPIEXEC" -n "$ranks" "$BUILD_DIR/app/wlb4d" "$DECK" --data.train="$OUT/data/sotu-train.h5" \
    --train.steps="$STEPS" --log.csv_file= --log.timing_file="$OUT/$name.h5" "$@" 2>&1 | tee "$OUT/$name.log"
}
rm -f "$OUT"/*.h5
run gpu1 1 --comm.backend=nccl
if [ "$NGPU" -ge 2 ]; then
  # One rank per GPU: Kokkos picks the device from the node-local rank.
  "$MPIEXEC" -n 2 sh -c 'KOKKOS_DEVICE_ID=${MPI_LOCALRANKID:-${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-0}}} exec "$@"' _ \
    "$BUILD_DIR/app/wlb4d" "$DECK" --data.train="$OUT/data/sotu-train.h5" --train.steps="$STEPS" --parallel.dp=2 \
    --comm.backend=nccl --log.csv_file= --log.timing_file="$OUT/gpu2-dp2.h5" 2>&1 | tee "$OUT/gpu2-dp2.log"
fi
echo "== summary (steady state: last step line of each run)"
for f in "$OUT"/gpu*.log; do
  line=$(grep -E 'step +[0-9]+/' "$f" | tail -1)
  tok=$(sed -E 's/.*\| ([0-9.]+) tok\/s\/dev.*/\1/' <<<"$line")
  tfl=$(sed -E 's/.* ([0-9.e+-]+) TFLOP\/s\/dev.*/\1/' <<<"$line")
  printf '%-10s %10s tokens/s/GPU %10.2f TFLOP/s/GPU (model FLOP, model::model_flops)\n' \
    "$(basename "$f" .log)" "$tok" "$(awk -v g="$tfl" 'BEGIN{print g + 0}')"
done
