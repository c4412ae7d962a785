#!/usr/bin/env bash
# Builds the project against Kokkos 4.6.01 (Serial + OpenMP) + Kokkos Kernels
# 4.7.00 (OpenBLAS) made from the vendored sources by scripts/build-kokkos.sh
# (the cluster CPU configuration, DESIGN §12), then runs
#   1. the ctest suite minus `gpu` and `slurm` with OMP_NUM_THREADS=1, and
#      minus tests that the debian part runs and that exercise no kernel
#      beyond what shorter tests here do: the 200-step runs
#      reg_bf16_quickstart_200 and reg_guards_quiet_quickstart_200 (their
#      short versions run here), the documents' commands (doc_walk,
#      gpt2_blend_walk) and the tokenizer peer hf_bpe_peer (no Kokkos in it);
#      about 7 minutes of both cores. gpu_bundle_host runs here for its build
#      without benchmarks (WLB4D_ENABLE_BENCH=OFF); and
#   2. the kernel unit tests (model, attention, layers, optim) once more with
#      OMP_NUM_THREADS=2, so a race in a parallel_for/parallel_reduce shows.
# Skips (exit 0, a line starting with "skipped:") without the vendor folder
# (WLB4D_VENDOR_DIR, else ../shared/vendor).
#   scripts/check-kokkos4.sh          # BUILD_DIR=build-kk4, cache WLB4D_DEPS_CACHE
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-kk4}
DEPS_CACHE=${WLB4D_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/wlb4d-deps}
JOBS=${JOBS:-$(nproc)}
# The kernel tests: every unit test of model/ (layers, transformer, step_alloc,
# params), the attention kernel and the optimizer.
KERNEL_TESTS=${KERNEL_TESTS:-'^(test_model_|test_adamw|test_optim)'}
if [ -z "${KOKKOS_PREFIX:-}" ]; then
  scripts/build-kokkos.sh host "$DEPS_CACHE"
  # shellcheck disable=SC1090
  . "$DEPS_CACHE/host.env"
  if [ "$KOKKOS_STATUS" = skipped ]; then
    echo "skipped: check-kokkos4: no Kokkos 4 OpenMP ($KOKKOS_REASON)"
    exit 0
  fi
fi
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
mkdir -p "$BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DWLB4D_ENABLE_BENCH=OFF "${launcher[@]}" \
      -DCMAKE_PREFIX_PATH="$KOKKOS_PREFIX" -DKokkos_ROOT="$KOKKOS_PREFIX" -DKokkosKernels_ROOT="$KOKKOS_PREFIX" \
      ${CMAKE_ARGS:-} >"$BUILD_DIR/wlb4d-configure.log" 2>&1 || { cat "$BUILD_DIR/wlb4d-configure.log"; exit 1; }
grep "wlb4d: Kokkos" "$BUILD_DIR/wlb4d-configure.log"
if ! grep -q "wlb4d: Kokkos 4.* devices: .*OPENMP" "$BUILD_DIR/wlb4d-configure.log"; then
  echo "check-kokkos4: the Kokkos at $KOKKOS_PREFIX is not a Kokkos 4 with OpenMP" >&2
  exit 1
fi
cmake --build "$BUILD_DIR" -j "$JOBS" >"$BUILD_DIR/wlb4d-build.log" 2>&1 ||
  { grep -E -B2 -A6 "error" "$BUILD_DIR/wlb4d-build.log" | head -100; exit 1; }
# OMP_PROC_BIND=false: several ranks share the cores (mpiexec tests); binding
# every rank's threads from core 0 would serialise them.
export OMP_PROC_BIND=${OMP_PROC_BIND:-false}
cd "$BUILD_DIR"
skip_re='^(reg_bf16_quickstart_200|reg_guards_quiet_quickstart_200|doc_walk|gpt2_blend_walk|hf_bpe_peer)$'
echo "== Kokkos 4 OpenMP: ctest -LE 'gpu|slurm' -E '$skip_re', OMP_NUM_THREADS=1"
OMP_NUM_THREADS=1 ctest --output-on-failure -LE "gpu|slurm" -E "$skip_re" -j "${CTEST_JOBS:-2}" ${CTEST_ARGS:-}
echo "== Kokkos 4 OpenMP: kernel unit tests, OMP_NUM_THREADS=2"
OMP_NUM_THREADS=2 ctest --output-on-failure -L unit -R "$KERNEL_TESTS" -j 1
