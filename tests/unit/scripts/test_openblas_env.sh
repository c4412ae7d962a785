#!/usr/bin/env bash
# scripts/openblas-env.sh (the BLAS kernel check): an unset OPENBLAS_CORETYPE gets the
# kernel of the (fixture) CPU's widest instruction set; a set value is never changed; the
# opt-out works. Each case runs in its own bash with a fixture cpuinfo; the
# test's own environment is not changed.
set -euo pipefail
env_sh=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma avx512f\n' > "$tmp/avx512"
printf 'processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n' > "$tmp/avx2"
printf 'processor\t: 0\nflags\t\t: fpu sse sse2 avx\n' > "$tmp/avx"
fail=0
check() {  # check NAME EXPECTED ENV-ASSIGNMENTS...
  local name=$1 want=$2
  shift 2
  local got
  got=$(env -u OPENBLAS_CORETYPE "$@" bash -c "set -euo pipefail; source '$env_sh' 2>/dev/null; echo \"\${OPENBLAS_CORETYPE:-unset}\"")
  if [ "$got" = "$want" ]; then echo "ok   $name: $got"; else echo "FAIL $name: got $got, want $want"; fail=1; fi
}
check "AVX-512 CPU, unset" SkylakeX WLB4D_CPUINFO="$tmp/avx512"
check "AVX2+FMA CPU, unset" Haswell WLB4D_CPUINFO="$tmp/avx2"
check "AVX-only CPU, unset: OpenBLAS's own choice" unset WLB4D_CPUINFO="$tmp/avx"
check "a set value is kept" Zen WLB4D_CPUINFO="$tmp/avx512" OPENBLAS_CORETYPE=Zen
check "opt-out" unset WLB4D_CPUINFO="$tmp/avx512" WLB4D_OPENBLAS_AUTO=0
check "no cpuinfo" unset WLB4D_CPUINFO="$tmp/none"
exit $fail
