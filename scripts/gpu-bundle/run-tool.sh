#!/bin/sh
# Wrapper of the GPU bundle (scripts/gpu-bundle.sh): bin/wlb4d, bin/mpiexec, ...
# and tests/test_* are links to this file; it runs bin/real/NAME or
# tests/real/NAME with the bundle's libraries. `bin/run EXE ARGS` runs any ELF.
#   LD_LIBRARY_PATH = lib/ : $WLB4D_CUDA_LIBS (set by gpu-check.sh) : the caller's
# When the target's glibc is older than MANIFEST's glibc_required (or
# WLB4D_BUNDLE_LOADER=1), the program is started through the bundled loader
# with the bundled glibc, since Debian 12's libstdc++ and binaries need 2.36.
set -e
self=$0
case "$self" in */*) ;; *) self=$(command -v -- "$self") ;; esac
here=$(cd "$(dirname "$self")" && pwd)
B=$(cd "$here/.." && pwd)
name=$(basename "$self")
if [ "$name" = run ]; then
  exe=$1
  shift
else
  exe=$here/real/$name
fi
[ -x "$exe" ] || { echo "bundle: no executable $exe" >&2; exit 127; }
libs=$B/lib${WLB4D_CUDA_LIBS:+:$WLB4D_CUDA_LIBS}
# hydra finds hydra_pmi_proxy on PATH: the bundle's wrapper first.
PATH=$B/bin:$PATH
export PATH
need=$(sed -n 's/^glibc_required=//p' "$B/MANIFEST")
have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
old_glibc=0
if [ -n "$need" ]; then
  if [ -z "$have" ] || [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
    old_glibc=1
  fi
fi
if [ "${WLB4D_BUNDLE_LOADER:-0}" = 1 ] || [ "$old_glibc" = 1 ]; then
  # --argv0 keeps argv[0] the wrapper's name (glibc >= 2.33 loader: ours is 2.36).
  exec "$B/lib/glibc/ld-linux-x86-64.so.2" --library-path "$B/lib/glibc:$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    --argv0 "$self" "$exe" "$@"
fi
LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
exec "$exe" "$@"
