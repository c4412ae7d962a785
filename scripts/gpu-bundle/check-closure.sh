#!/usr/bin/env bash
# Closure check of a GPU bundle payload (scripts/gpu-bundle.sh; the CI test).
#   check-closure.sh PAYLOAD
# 1. Static: every DT_NEEDED of every ELF in bin/real, tests/real and lib/
#    (transitively) is a file in lib/ or lib/glibc/, or is one the target
#    provides (MANIFEST from_target: the driver's, the CUDA runtime's and cuDNN's).
# 2. Dynamic: `ldd` of every binary with only the bundle's lib/ on
#    LD_LIBRARY_PATH resolves every library into the bundle, except glibc
#    (which the wrapper replaces when the target's is older) and those the
#    target provides, which may be "not found" here.
# Prints one line per failure and exits 1 if there is any.
set -euo pipefail
P=$(cd "${1:?usage: check-closure.sh PAYLOAD}" && pwd)
# The same list as gpu-bundle.sh's target_re (without the vDSO).
target_re='^(libcuda\.so|libnvidia-|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so|libnvrtc|libcudnn)'
glibc_re='^(ld-linux-x86-64\.so|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libutil\.so|libmvec\.so)'
bad=0
elfs=()
for f in "$P"/bin/real/* "$P"/tests/real/* "$P"/lib/*.so* "$P"/lib/glibc/*; do
  [ -f "$f" ] && head -c4 "$f" | grep -q 'ELF' && elfs+=("$f")
done
for f in "${elfs[@]}"; do
  while read -r lib; do
    [[ "$lib" =~ $target_re ]] && continue
    if [ ! -e "$P/lib/$lib" ] && [ ! -e "$P/lib/glibc/$lib" ]; then
      echo "closure: ${f#"$P"/} needs $lib, which is not in the bundle"
      bad=1
    fi
  done < <(objdump -p "$f" 2>/dev/null | awk '$1 == "NEEDED" {print $2}')
done
n=0
for f in "$P"/bin/real/* "$P"/tests/real/*; do
  n=$((n + 1))
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    [[ "$name" =~ $target_re ]] && continue
    [[ "$name" =~ $glibc_re ]] && continue
    case "$path" in
      "$P"/lib/*) ;;
      *) echo "closure: ${f#"$P"/}: $name resolves to $path, outside the bundle"; bad=1 ;;
    esac
  done < <(env -i LD_LIBRARY_PATH="$P/lib" /usr/bin/ldd "$f" | sed 's/^[[:space:]]*//')
done
if [ "$bad" != 0 ]; then
  echo "closure: FAILED" >&2
  exit 1
fi
echo "closure: ${#elfs[@]} ELF files, $n executables: every library is in the bundle or provided by the target ($(sed -n 's/^from_target=//p' "$P/MANIFEST"))"
