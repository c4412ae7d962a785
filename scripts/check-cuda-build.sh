#!/usr/bin/env bash
# Compiles the WHOLE tree (library, apps, tests, bench) for the GPU
# (-DWLB4D_ENABLE_CUDA=ON) against a CUDA Kokkos + Kokkos Kernels (cuBLAS)
# built from the vendored sources by scripts/build-kokkos.sh (develop snapshot
# + CUDA 13 patch, Kokkos_ARCH_HOPPER90; DESIGN §12). Compile only: there is
# no GPU here, so nothing runs (a CUDA Kokkos cannot initialise without one).
# Fails on any compile error and on any warning located in the project's own
# files (lib/, app/, tests/, bench/).
#
# Skips (exit 0, a line starting with "skipped:") without nvcc + NCCL or
# without the vendor folder (WLB4D_VENDOR_DIR, else ../shared/vendor).
#   scripts/check-cuda-build.sh        # BUILD_DIR=build-cuda, cache WLB4D_DEPS_CACHE
#   KOKKOS_PREFIX=/opt/kokkos-cuda scripts/check-cuda-build.sh   # an existing CUDA Kokkos
#   WLB4D_CUDNN=auto scripts/check-cuda-build.sh   # also the cuDNN attention kernel when cuDNN is here
#
# WLB4D_CUDNN=OFF (default) | ON | auto: -DWLB4D_ENABLE_CUDNN (docs/gpu.md).
# ON and auto look for cudnn.h and libcudnn in $CUDNN_ROOT, else $CUDA_HOME
# (CUDA 13 ships cuDNN 9.19 here), and cudnn-frontend in $CUDNN_FRONTEND_DIR,
# else the vendor folder's cudnn-frontend-1.23.0.tar.gz (extracted once into
# BUILD_DIR/_deps); ON fails without them, auto configures without cuDNN and
# says why. The option is always passed, so switching it reconfigures
# BUILD_DIR (WLB4D_HAVE_CUDNN is a public define: most of the tree recompiles;
# give the cuDNN build its own BUILD_DIR to keep both).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
DEPS_CACHE=${WLB4D_DEPS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/wlb4d-deps}
JOBS=${JOBS:-$(nproc)}
if [ ! -x "$CUDA_HOME/bin/nvcc" ] || [ ! -f "$CUDA_HOME/include/nccl.h" ]; then
  echo "skipped: check-cuda-build: no CUDA toolkit with NCCL under $CUDA_HOME"
  exit 0
fi
if [ -z "${KOKKOS_PREFIX:-}" ]; then
  CUDA_HOME=$CUDA_HOME scripts/build-kokkos.sh cuda "$DEPS_CACHE"
  # shellcheck disable=SC1090
  . "$DEPS_CACHE/cuda.env"
  if [ "$KOKKOS_STATUS" = skipped ]; then
    echo "skipped: check-cuda-build: no CUDA Kokkos ($KOKKOS_REASON)"
    exit 0
  fi
fi
# ---- cuDNN (opt-in)
cudnn_mode=${WLB4D_CUDNN:-OFF}
cudnn_args=(-DWLB4D_ENABLE_CUDNN=OFF)
cudnn_note="without cuDNN"
case "$cudnn_mode" in
  OFF|off|0) ;;
  ON|on|1|auto)
    cudnn_root=${CUDNN_ROOT:-$CUDA_HOME}
    vendor=${WLB4D_VENDOR_DIR:-../shared/vendor}
    cfe=${CUDNN_FRONTEND_DIR:-}
    cfe_archive=$vendor/cudnn-frontend-1.23.0.tar.gz
    if [ -z "$cfe" ] && [ -f "$cfe_archive" ]; then
      cfe=$BUILD_DIR/_deps/cudnn-frontend-1.23.0/cudnn-frontend
      if [ ! -f "$cfe/include/cudnn_frontend.h" ]; then
        mkdir -p "$BUILD_DIR/_deps/cudnn-frontend-1.23.0"
        tar -C "$BUILD_DIR/_deps/cudnn-frontend-1.23.0" -xzf "$cfe_archive"
      fi
    fi
    missing=
    [ -f "$cudnn_root/include/cudnn.h" ] || missing="$missing cudnn.h under $cudnn_root/include;"
    compgen -G "$cudnn_root/lib*/libcudnn.so*" >/dev/null || missing="$missing libcudnn under $cudnn_root/lib*;"
    [ -n "$cfe" ] && [ -f "$cfe/include/cudnn_frontend.h" ] ||
      missing="$missing cudnn_frontend.h (CUDNN_FRONTEND_DIR, or $cfe_archive);"
    if [ -z "$missing" ]; then
      cfe=$(cd "$cfe" && pwd)
      cudnn_args=(-DWLB4D_ENABLE_CUDNN=ON -DCUDNN_ROOT="$cudnn_root" -DCUDNN_FRONTEND_DIR="$cfe")
      cudnn_ver=$(awk '/^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) / {v = v (v ? "." : "") $3} END {print v}' \
                    "$cudnn_root/include/cudnn_version.h" 2>/dev/null)
      cudnn_note="with cuDNN ${cudnn_ver:-?} ($cudnn_root) and cudnn-frontend ($cfe)"
    elif [ "$cudnn_mode" = auto ]; then
      echo "check-cuda-build: WLB4D_CUDNN=auto: building without cuDNN, missing:$missing"
    else
      echo "check-cuda-build: WLB4D_CUDNN=$cudnn_mode but missing:$missing" >&2
      exit 1
    fi
    ;;
  *) echo "check-cuda-build: WLB4D_CUDNN must be OFF, ON or auto, not '$cudnn_mode'" >&2; exit 2 ;;
esac
# No ccache launcher: Kokkos redirects each compile line to nvcc_wrapper
# (kokkos_launch_compiler) only when it starts with the C++ compiler itself;
# behind `ccache g++` it would silently compile for the host.
export PATH=$CUDA_HOME/bin:$PATH
mkdir -p "$BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DWLB4D_ENABLE_CUDA=ON -DWLB4D_ENABLE_BENCH=ON \
      -DWLB4D_NATIVE_ARCH=OFF -DCMAKE_CXX_COMPILER="${CXX:-g++}" \
      -DCMAKE_PREFIX_PATH="$KOKKOS_PREFIX" -DKokkos_ROOT="$KOKKOS_PREFIX" -DKokkosKernels_ROOT="$KOKKOS_PREFIX" \
      -DCUDAToolkit_ROOT="$CUDA_HOME" "${cudnn_args[@]}" ${CMAKE_ARGS:-} >"$BUILD_DIR/wlb4d-configure.log" 2>&1 ||
  { cat "$BUILD_DIR/wlb4d-configure.log"; exit 1; }
if grep -q "has no CUDA backend" "$BUILD_DIR/wlb4d-configure.log" ||
   ! grep -q "wlb4d: Kokkos .* devices: .*CUDA" "$BUILD_DIR/wlb4d-configure.log"; then
  grep "wlb4d:" "$BUILD_DIR/wlb4d-configure.log"
  echo "check-cuda-build: the Kokkos at $KOKKOS_PREFIX has no CUDA backend" >&2
  exit 1
fi
t0=$SECONDS
log=$BUILD_DIR/wlb4d-build.log
if ! cmake --build "$BUILD_DIR" -j "$JOBS" >"$log" 2>&1; then
  grep -E -B2 -A6 "error" "$log" | head -150
  echo "check-cuda-build: the CUDA compile failed (full log: $log)" >&2
  exit 1
fi
# Warnings of ours: gcc (file:line:col: warning:) and nvcc/cudafe (file(line): warning #...)
# located in the project's own files.
src=$(pwd)
ours=$(grep -E "^($src/)?(lib|app|tests|bench)/[^ ]*(:[0-9]+:[0-9]+: warning|\([0-9]+\): warning)" "$log" | sort -u || true)
if [ -n "$ours" ]; then
  echo "$ours"
  echo "check-cuda-build: $(wc -l <<<"$ours") warning(s) in the project's files (full log: $log)" >&2
  exit 1
fi
# The kernels really went through nvcc: the model library carries sm_90 device code.
# (grep without -q: an early exit would SIGPIPE objdump and fail the pipe under pipefail)
if ! objdump -h "$BUILD_DIR/lib/libwlb4d_model.a" 2>/dev/null | grep nv_fatbin >/dev/null; then
  echo "check-cuda-build: $BUILD_DIR/lib/libwlb4d_model.a has no device code (nv_fatbin): not compiled by nvcc" >&2
  exit 1
fi
ntargets=$(grep -cE "Linking CXX (executable|static library)" "$log" || true)
echo "check-cuda-build: whole tree compiled for CUDA (sm_90) against $(grep -m1 'wlb4d: Kokkos' "$BUILD_DIR/wlb4d-configure.log" | sed 's/.*wlb4d: //'),"
echo "  NCCL $(grep -m1 -E '^#define NCCL_VERSION_CODE' "$CUDA_HOME/include/nccl.h" | awk '{print $3}'), $cudnn_note,"
echo "  $ntargets targets linked, 0 warnings of ours, $((SECONDS - t0)) s"
