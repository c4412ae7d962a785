#!/usr/bin/env bash
# Builds Kokkos + Kokkos Kernels (BLAS component only, ETI off) from the
# vendored sources (DESIGN §12; ../shared/vendor/README.md) into a cache prefix
# keyed by (source sha256s, patch sha256, host compiler version, CUDA version),
# and reuses that prefix when it is complete. CI and developers only: users
# keep Debian's or Spack's Kokkos.
#
#   scripts/build-kokkos.sh host PREFIX_ROOT   # Kokkos 4.6.01 Serial+OpenMP, KK with OpenBLAS
#   scripts/build-kokkos.sh cuda PREFIX_ROOT   # develop snapshot + CUDA 13 patch, HOPPER90,
#                                              # nvcc_wrapper, KK with cuBLAS
#
# Vendor folder: $WLB4D_VENDOR_DIR, else <repo>/../shared/vendor.
# CUDA toolkit:  $CUDA_HOME, else /usr/local/cuda.
#
# Result, for the caller: always exit 0 unless a build fails (then non-zero).
# The last line of stdout is one of
#   prefix: <dir>            (built or reused; pass it as CMAKE_PREFIX_PATH)
#   skipped: <reason>        (vendor folder, a source archive or the CUDA toolkit absent)
# and PREFIX_ROOT/<mode>.env is rewritten with shell assignments to source:
#   KOKKOS_STATUS=built|reused|skipped  KOKKOS_PREFIX=<dir or empty>  KOKKOS_REASON=<text>
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-}
root=${2:-}
if [ "$mode" != host ] && [ "$mode" != cuda ] || [ -z "$root" ]; then
  echo "usage: $0 host|cuda PREFIX_ROOT" >&2
  exit 2
fi
mkdir -p "$root"
root=$(cd "$root" && pwd)
vendor=${WLB4D_VENDOR_DIR:-$here/../shared/vendor}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
JOBS=${JOBS:-$(nproc)}
envfile=$root/$mode.env

finish() {  # finish STATUS PREFIX REASON
  printf 'KOKKOS_STATUS=%s\nKOKKOS_PREFIX=%q\nKOKKOS_REASON=%q\n' "$1" "$2" "$3" >"$envfile"
  if [ "$1" = skipped ]; then echo "skipped: $3"; else echo "prefix: $2"; fi
  exit 0
}

kk_src=kokkos-kernels-4.7.00.tar.gz
if [ "$mode" = host ]; then
  k_src=kokkos-4.6.01.tar.gz; patchf=
else
  k_src=kokkos-develop-28848dfa.tar.gz; patchf=kokkos-develop-28848dfa-cuda13.patch
fi
[ -d "$vendor" ] || finish skipped "" "build-kokkos $mode: no vendor folder at $vendor (set WLB4D_VENDOR_DIR)"
for f in "$k_src" "$kk_src" $patchf; do
  [ -f "$vendor/$f" ] || finish skipped "" "build-kokkos $mode: $vendor/$f is missing"
done
cuda_ver=none
if [ "$mode" = cuda ]; then
  [ -x "$CUDA_HOME/bin/nvcc" ] || finish skipped "" "build-kokkos cuda: no CUDA toolkit (no $CUDA_HOME/bin/nvcc; set CUDA_HOME)"
  cuda_ver=$("$CUDA_HOME/bin/nvcc" --version | grep -o 'V[0-9.]*' | tail -1)
fi
cxx=${CXX:-g++}
cxx_ver=$("$cxx" --version | head -1)

sha() { sha256sum "$1" | cut -c1-64; }
# Bump RECIPE whenever the configure options below change: it is part of the key.
RECIPE=2
key_text="mode=$mode
kokkos=$(sha "$vendor/$k_src")
kernels=$(sha "$vendor/$kk_src")
patch=$([ -n "$patchf" ] && sha "$vendor/$patchf" || echo none)
cxx=$cxx_ver
cuda=$cuda_ver
recipe=$RECIPE"
key=$(printf '%s' "$key_text" | sha256sum | cut -c1-16)
prefix=$root/$mode-$key
if [ -f "$prefix/.wlb4d-complete" ] && [ "$(cat "$prefix/.wlb4d-complete")" = "$key_text" ] &&
   [ -f "$prefix/lib/cmake/Kokkos/KokkosConfig.cmake" ]; then
  echo "build-kokkos $mode: reusing $prefix"
  finish reused "$prefix" ""
fi

echo "build-kokkos $mode: building into $prefix (key $key)"
t0=$SECONDS
rm -rf "$prefix"
work=$(mktemp -d "$root/.build-$mode.XXXXXX")
trap 'rm -rf "$work"' EXIT
tar -xzf "$vendor/$k_src" -C "$work"
tar -xzf "$vendor/$kk_src" -C "$work"
ksrc=$work/$(basename "$k_src" .tar.gz)
kksrc=$work/$(basename "$kk_src" .tar.gz)
[ -d "$ksrc/core" ] && [ -d "$kksrc/blas" ] || { echo "build-kokkos: unexpected archive layout in $work" >&2; exit 1; }
if [ -n "$patchf" ]; then
  (cd "$ksrc" && patch -p1 --quiet <"$vendor/$patchf")
fi
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
common=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib
        -DBUILD_SHARED_LIBS=ON -DCMAKE_CXX_STANDARD=17)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [ "$mode" = host ]; then
  kopts=(-DCMAKE_CXX_COMPILER="$cxx" "${launcher[@]}" -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_OPENMP=ON)
  kkopts=(-DCMAKE_CXX_COMPILER="$cxx" "${launcher[@]}" -DKokkosKernels_ENABLE_TPL_BLAS=ON
          -DBLAS_LIBRARIES=openblas -DBLAS_LIBRARY_DIRS=/usr/lib/x86_64-linux-gnu)
else
  export CUDA_ROOT=$CUDA_HOME PATH=$CUDA_HOME/bin:$PATH NVCC_WRAPPER_DEFAULT_COMPILER=$cxx
  # Build with the wrapper's final location: KokkosConfig records it as
  # Kokkos_CXX_COMPILER, and the project's compile lines are redirected to it.
  mkdir -p "$prefix/bin"
  cp "$ksrc/bin/nvcc_wrapper" "$prefix/bin/nvcc_wrapper"
  kopts=(-DCMAKE_CXX_COMPILER="$prefix/bin/nvcc_wrapper" -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_CUDA=ON
         -DKokkos_ARCH_HOPPER90=ON -DCUDAToolkit_ROOT="$CUDA_HOME")
  kkopts=(-DCMAKE_CXX_COMPILER="$prefix/bin/nvcc_wrapper" -DKokkosKernels_ENABLE_TPL_CUBLAS=ON
          -DCUDAToolkit_ROOT="$CUDA_HOME")
fi
cmake -S "$ksrc" -B "$work/build-k" "${gen[@]}" "${common[@]}" "${kopts[@]}" -DKokkos_ENABLE_TESTS=OFF \
      -DKokkos_ENABLE_EXAMPLES=OFF >"$work/k.configure.log" 2>&1 ||
  { tail -40 "$work/k.configure.log"; exit 1; }
cmake --build "$work/build-k" -j "$JOBS" >"$work/k.build.log" || { tail -40 "$work/k.build.log"; exit 1; }
cmake --install "$work/build-k" >/dev/null
echo "build-kokkos $mode: Kokkos installed ($((SECONDS - t0)) s)"
cmake -S "$kksrc" -B "$work/build-kk" "${gen[@]}" "${common[@]}" "${kkopts[@]}" -DKokkos_ROOT="$prefix" \
      -DKokkosKernels_ENABLE_ALL_COMPONENTS=OFF -DKokkosKernels_ENABLE_COMPONENT_BLAS=ON \
      -DKokkosKernels_ADD_DEFAULT_ETI=OFF -DKokkosKernels_ENABLE_TESTS=OFF -DKokkosKernels_ENABLE_EXAMPLES=OFF \
      >"$work/kk.configure.log" 2>&1 || { tail -40 "$work/kk.configure.log"; exit 1; }
cmake --build "$work/build-kk" -j "$JOBS" >"$work/kk.build.log" || { tail -40 "$work/kk.build.log"; exit 1; }
cmake --install "$work/build-kk" >/dev/null
printf '%s' "$key_text" >"$prefix/.wlb4d-complete"
echo "build-kokkos $mode: Kokkos Kernels installed ($((SECONDS - t0)) s in all)"
# Older complete prefixes of this mode are stale (another key); drop them.
for old in "$root/$mode"-*; do
  [ "$old" != "$prefix" ] && [ -f "$old/.wlb4d-complete" ] && rm -rf "$old"
done
finish built "$prefix" ""
