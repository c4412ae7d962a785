#!/usr/bin/env bash
# The test command, in parts (each timed; a summary says which ran, which
# skipped and why):
#   1. debian   install dependencies, build against Debian's Kokkos 3.4, run
#               the ctest suite (every label except gpu);
#   2. kokkos4  build against Kokkos 4 OpenMP from ../shared/vendor and rerun
#               the suite (minus slurm) there (scripts/check-kokkos4.sh);
#   3. cuda     compile the whole tree for CUDA against a CUDA Kokkos from
#               ../shared/vendor (scripts/check-cuda-build.sh);
#   4. bundle   pack the CUDA build into the GPU bundle (scripts/gpu-bundle.sh):
#               its closure check and the 64 MiB limit (skips without part 3).
# Parts 2-3 skip (and say so) without the vendor folder (WLB4D_VENDOR_DIR) or
# the CUDA toolkit; WLB4D_KOKKOS4_CHECK=0 / WLB4D_CUDA_COMPILE_CHECK=0 skip
# them on purpose. Built Kokkos prefixes are cached in WLB4D_DEPS_CACHE
# (default ~/.cache/wlb4d-deps). Exits non-zero on any failure or timeout.
#   scripts/test.sh                 # everything
#   CTEST_ARGS="-L unit" scripts/test.sh   # a subset (in parts 1 and 2)
set -euo pipefail
cd "$(dirname "$0")/.."
summary=()
logdir=$(mktemp -d)
part() {  # part NAME COMMAND...: runs it, records ran/skipped/FAILED and its time
  local name=$1 t0=$SECONDS rc=0
  shift
  echo "==== part $name: $*"
  "$@" 2>&1 | tee "$logdir/$name.log" || rc=${PIPESTATUS[0]}
  local dt=$((SECONDS - t0)) why
  if [ "$rc" != 0 ]; then
    summary+=("$(printf '%-8s FAILED (exit %s)  %4d s' "$name" "$rc" "$dt")")
  elif why=$(grep -m1 '^skipped: ' "$logdir/$name.log"); then
    summary+=("$(printf '%-8s skipped  %4d s  %s' "$name" "$dt" "${why#skipped: }")")
  else
    summary+=("$(printf '%-8s ran      %4d s' "$name" "$dt")")
  fi
  return "$rc"
}
print_summary() {
  echo "==== test.sh summary"
  printf '  %s\n' "${summary[@]}"
}
# Chained with &&: part() runs its command on the left of ||, where bash ignores set -e.
debian() {
  scripts/install-deps.sh --test-peers && scripts/build.sh || return 1
  # One-node Slurm for the `slurm` ctest label (those tests skip if it cannot start).
  if [ "${WLB4D_START_SLURM:-1}" = 1 ]; then
    tests/slurm/start-slurm.sh || echo "slurm: not started, slurm tests will skip"
  fi
  (cd "${BUILD_DIR:-build}" && ctest --output-on-failure -LE gpu -j "${CTEST_JOBS:-2}" ${CTEST_ARGS:-})
}
skip() { echo "skipped: $*"; }
trap 'print_summary; rm -rf "$logdir"' EXIT
part debian debian
if [ "${WLB4D_KOKKOS4_CHECK:-1}" = 1 ]; then
  part kokkos4 env -u BUILD_DIR scripts/check-kokkos4.sh
else
  part kokkos4 skip "WLB4D_KOKKOS4_CHECK=0"
fi
if [ "${WLB4D_CUDA_COMPILE_CHECK:-1}" = 1 ]; then
  part cuda env -u BUILD_DIR scripts/check-cuda-build.sh
else
  part cuda skip "WLB4D_CUDA_COMPILE_CHECK=0"
fi
if [ "${WLB4D_CUDA_COMPILE_CHECK:-1}" = 1 ] && [ -x build-cuda/app/wlb4d ]; then
  part bundle env -u BUILD_DIR CUDA_BUILD_DIR=build-cuda HOST_BUILD_DIR="${BUILD_DIR:-build}" \
    scripts/gpu-bundle.sh "${WLB4D_BUNDLE_OUT:-build-cuda/gpu-bundle}"
else
  part bundle skip "no CUDA build (part cuda skipped)"
fi
