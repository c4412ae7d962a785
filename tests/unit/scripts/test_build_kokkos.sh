#!/usr/bin/env bash
# test_build_kokkos.sh BUILD_KOKKOS_SH: every skip exits 0, prints a last line
# "skipped: <why>" and writes <root>/<mode>.env with KOKKOS_STATUS=skipped.
set -euo pipefail
script=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
expect_skip() {  # expect_skip MODE WHY_REGEX [ENV...]
  local mode=$1 re=$2 out rc=0
  shift 2
  out=$(env "$@" bash "$script" "$mode" "$tmp/root" 2>&1) || rc=$?
  [ "$rc" = 0 ] || fail "$mode ($*): exit $rc: $out"
  tail -1 <<<"$out" | grep -qE "^skipped: .*$re" || fail "$mode ($*): last line not 'skipped: ...$re': $out"
  # shellcheck disable=SC1090
  (. "$tmp/root/$mode.env" && [ "$KOKKOS_STATUS" = skipped ] && [ -z "$KOKKOS_PREFIX" ]) ||
    fail "$mode ($*): $tmp/root/$mode.env does not say skipped: $(cat "$tmp/root/$mode.env")"
  echo "ok: $mode ($*) -> $(tail -1 <<<"$out")"
}
expect_skip host "no vendor folder" WLB4D_VENDOR_DIR="$tmp/none"
expect_skip cuda "no vendor folder" WLB4D_VENDOR_DIR="$tmp/none"
mkdir "$tmp/vendor"
expect_skip host "kokkos-4.6.01.tar.gz is missing" WLB4D_VENDOR_DIR="$tmp/vendor"
touch "$tmp/vendor/kokkos-develop-28848dfa.tar.gz" "$tmp/vendor/kokkos-kernels-4.7.00.tar.gz" \
      "$tmp/vendor/kokkos-develop-28848dfa-cuda13.patch"
expect_skip cuda "no CUDA toolkit" WLB4D_VENDOR_DIR="$tmp/vendor" CUDA_HOME="$tmp/no-cuda"
# Usage errors are errors, not skips.
if bash "$script" gpu "$tmp/root" >/dev/null 2>&1; then fail "an unknown mode must fail"; fi
echo "build_kokkos_skips: all ok"
