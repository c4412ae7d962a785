#!/usr/bin/env bash
# The attention kernel's two host paths through the main executable:
# runs DECK with WLB4D_ATTENTION_PATH=portable (the portable team kernel, the
# one CUDA runs) and =blas (tile products via the BLAS), checks that each run's
# start-up line names its path, and that the per-step losses of the two runs
# agree (check_losses.py --against, relative tolerance RTOL): the BLAS path
# against an independent implementation of the same attention. The OpenBLAS
# environment is left as the machine sets it (both runs use the same GEMM
# kernel elsewhere, so only the attention differs). A bad value must be refused.
# Exit 77 (skipped) in a build without the host BLAS path.
#   attention_path_test.sh WLB4D DECK PYTHON CHECK_LOSSES RTOL
set -euo pipefail
wlb4d=$1 deck=$2 py=$3 check=$4 rtol=$5
name=$(basename "$deck" .ini)
for path in portable blas; do
  WLB4D_ATTENTION_PATH=$path "$wlb4d" "$deck" --log.csv_file="attn-$path-$name.csv" \
    --checkpoint.dir="ck-attn-$path-$name" > "attn-$path-$name.log" 2>&1 || {
    cat "attn-$path-$name.log"; echo "attention_path_test: the $path run failed"; exit 1; }
  case $path in
    portable) want="attention: portable team kernel" ;;
    blas) want="attention: portable kernel, host BLAS path: tile products via the BLAS" ;;
  esac
  if grep -q "attention: portable team kernel on " "attn-$path-$name.log"; then
    echo "attention_path_test: skipped: this build has no host BLAS path (device build or no BLAS TPL)"; exit 77
  fi
  grep -q "$want" "attn-$path-$name.log" || {
    grep -i "attention:" "attn-$path-$name.log" || true
    echo "attention_path_test: WLB4D_ATTENTION_PATH=$path: no start-up line '$want'"; exit 1; }
done
"$py" "$check" "attn-blas-$name.csv" --against "attn-portable-$name.csv" --rtol "$rtol"
if WLB4D_ATTENTION_PATH=fast "$wlb4d" "$deck" --log.csv_file="attn-bad-$name.csv" \
     --checkpoint.dir="ck-attn-bad-$name" > "attn-bad-$name.log" 2>&1; then
  echo "attention_path_test: WLB4D_ATTENTION_PATH=fast was accepted"; exit 1
fi
grep -q "WLB4D_ATTENTION_PATH=fast: must be auto, portable or blas" "attn-bad-$name.log" || {
  tail -5 "attn-bad-$name.log"; echo "attention_path_test: no message naming WLB4D_ATTENTION_PATH"; exit 1; }
echo "attention_path_test: portable and blas paths agree to rtol $rtol on $name; a bad value is refused"
