#!/usr/bin/env bash
# The GPU bundle's machinery, tested on the CPU: a bundle of
# the host build (WLB4D_BUNDLE_KIND=host) must pass its closure check and run
# its gpu-check.sh in an empty environment through the bundled loader and
# glibc, reproducing the CPU reference losses; and the checks must catch a
# library missing from the bundle and a loss off the reference.
#   test_gpu_bundle.sh SCRIPTS_DIR HOST_BUILD_DIR
set -euo pipefail
S=$1
B=$(cd "$2" && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
WLB4D_BUNDLE_KIND=host WLB4D_BUNDLE_COMPRESS=none MAX_MIB=4096 HOST_BUILD_DIR=$B "$S/gpu-bundle.sh" "$W/b" >"$W/make.log" 2>&1 ||
  { cat "$W/make.log"; echo "FAIL: gpu-bundle.sh (host kind)"; exit 1; }
grep '^closure:' "$W/make.log"
P=$W/b/payload
# Runs from the bundle alone: no LD_LIBRARY_PATH, PATH without the build, loader forced.
if ! env -i PATH=/usr/bin:/bin HOME="$W" WLB4D_BUNDLE_LOADER=1 WLB4D_CHECK_QUICK=1 "$W/b/gpu-check.sh" "$W/r" >"$W/check.log" 2>&1; then
  cat "$W/check.log"; echo "FAIL: the bundle's gpu-check.sh"; exit 1
fi
grep -q 'tiny: 10 of 10 steps within 1e-5' "$W/check.log" && grep -q 'quickstart: 10 of 10 steps within 1e-5' "$W/check.log" &&
  grep -q 'quickstart_bf16: 10 of 10 steps within 1e-3' "$W/check.log" &&
  grep -q 'tiny-2ranks_pp: 10 of 10 steps within 1e-5' "$W/check.log" &&
  grep -q 'tiny-2ranks_cp: 10 of 10 steps within 1e-5' "$W/check.log" ||
  { cat "$W/check.log"; echo "FAIL: equivalence lines missing"; exit 1; }
maps=$(WLB4D_BUNDLE_LOADER=1 "$P/bin/run" /bin/cat /proc/self/maps)
grep -q "$P/lib/glibc/libc.so.6" <<<"$maps" || { echo "FAIL: the loader path did not use the bundled glibc"; exit 1; }
echo "ok: host bundle runs its check from the bundle alone"
# The MFU peaks gpu-check.sh reads: the device table through the bundle's
# wlb4d-plan --devices, matched by the names nvidia-smi prints.
for pair in "NVIDIA H100 80GB HBM3:h100" "NVIDIA H100 PCIe:h100-pcie" "NVIDIA H200:h200" "NVIDIA A100-SXM4-80GB:a100" \
            "NVIDIA A100-SXM4-40GB:a100-40gb"; do
  row=$(WLB4D_BUNDLE_LOADER=1 "$P/bin/wlb4d-plan" --devices "${pair%%:*}" | tail -n +2)
  [ "${row%%,*}" = "${pair##*:}" ] || { echo "FAIL: wlb4d-plan --devices '${pair%%:*}' gave '$row', not ${pair##*:}"; exit 1; }
done
if "$P/bin/wlb4d-plan" --devices "Tesla V100-SXM2-16GB" >/dev/null 2>&1; then
  echo "FAIL: a device outside the table matched"; exit 1
fi
echo "ok: the bundle's device table matches H100, H200 and A100 names"
# The long-document benchmark's inputs: bench-1b-8k's dataset has 1 M tokens
# in documents whose lengths come from the bundled ProLong sample (the last
# one cut to fit), and the attention benchmark runs from the bundle on them.
# Each comes from the host build's bench/ (dataset_scale, attention_bench): a
# build configured with WLB4D_ENABLE_BENCH=OFF has neither, and the bundler
# must then say that the dataset is missing and bundle no bench.
[ -f "$P/inputs/bench-1b-8k.ini" ] && [ -f "$P/inputs/dist/dist_prolong.json" ] ||
  { echo "FAIL: bench-1b-8k.ini or dist/dist_prolong.json missing from the bundle"; exit 1; }
if [ ! -x "$B/bench/dataset_scale" ]; then
  grep -q 'no data/prolong-8k.h5' "$W/make.log" ||
    { cat "$W/make.log"; echo "FAIL: the bundler did not say that bench-1b-8k's dataset is missing"; exit 1; }
  echo "skip: $B has no bench/dataset_scale (WLB4D_ENABLE_BENCH=OFF): no long-document dataset to check"
elif /usr/bin/python3 -c 'import h5py' 2>/dev/null; then
  /usr/bin/python3 - "$P/data/prolong-8k.h5" "$P/inputs/dist/dist_prolong.json" <<'PY' || exit 1
import h5py, json, sys
import numpy as np
sample = set(json.load(open(sys.argv[2])))
with h5py.File(sys.argv[1], "r") as f:
    off = np.asarray(f["doc_offsets"][:], dtype=np.int64)
    n = int(f["tokens"].shape[0])
lens = np.diff(off)
bad = [int(x) for x in lens[:-1] if int(x) not in sample]
if n != 1_000_000 or off[-1] != n or bad or len(lens) < 100:
    print(f"FAIL: prolong-8k.h5: {n} tokens, {len(lens)} documents, lengths outside the sample: {bad[:5]}")
    sys.exit(1)
print(f"ok: prolong-8k.h5: {len(lens)} documents, {n} tokens, every length but the last from the ProLong sample")
PY
  [ -f "$P/data/peer-1b-8k.npz" ] || { echo "FAIL: no data/peer-1b-8k.npz beside prolong-8k.h5"; exit 1; }
fi
if [ ! -x "$B/bench/attention_bench" ]; then
  [ ! -e "$P/bin/real/attention_bench" ] || { echo "FAIL: attention_bench bundled without a host attention_bench"; exit 1; }
  echo "skip: $B has no bench/attention_bench (WLB4D_ENABLE_BENCH=OFF)"
else
  [ -x "$P/bin/real/attention_bench" ] || { echo "FAIL: attention_bench is not in the bundle"; exit 1; }
  out=$(cd "$W" && env -i PATH=/usr/bin:/bin WLB4D_BENCH_LENGTHS="$P/inputs/dist/dist_prolong.json" WLB4D_PEAK_TFLOPS=1 \
        "$P/bin/attention_bench" --benchmark_filter='BM_attention_lengths/T:1024' --benchmark_min_time=0.01 2>&1) ||
    { echo "$out"; echo "FAIL: the bundle's attention_bench"; exit 1; }
  grep -qE 'BM_attention_lengths/T:1024/Hq:4/Hkv:2/D:64/cudnn:0.*TFLOPs=.*peak_share=.*portable' <<<"$out" ||
    { echo "$out"; echo "FAIL: no portable row with TFLOPs and peak_share"; exit 1; }
  echo "ok: the bundle's attention_bench times the portable kernel on ProLong-length documents"
fi
# The libraries left to the target are the same in the bundler and the closure check (cuDNN included).
re_bundle=$(sed -n "s/^target_re='\(.*\)|linux-vdso)'$/\1)/p" "$S/gpu-bundle.sh")
re_closure=$(sed -n "s/^target_re='\(.*\)'$/\1/p" "$S/gpu-bundle/check-closure.sh")
[ -n "$re_bundle" ] && [ "$re_bundle" = "$re_closure" ] ||
  { echo "FAIL: target_re differs: gpu-bundle.sh '$re_bundle', check-closure.sh '$re_closure'"; exit 1; }
grep -q 'libcudnn' <<<"$re_closure" || { echo "FAIL: libcudnn is not left to the target"; exit 1; }
echo "ok: the bundler and the closure check leave the same libraries (cuDNN among them) to the target"
# A loss off the reference is caught.
cp "$P/ref/quickstart.csv" "$W/ref.bak"
awk -F, 'BEGIN{OFS=","} NR==3 {for (i=1;i<=NF;i++) if (h[i]=="loss") $i=$i*1.0001} NR==1 {for (i=1;i<=NF;i++) h[i]=$i} {print}' \
  "$W/ref.bak" >"$P/ref/quickstart.csv"
if env -i PATH=/usr/bin:/bin HOME="$W" WLB4D_CHECK_QUICK=1 "$W/b/gpu-check.sh" "$W/r2" >"$W/check2.log" 2>&1; then
  cat "$W/check2.log"; echo "FAIL: a reference loss off by 1e-4 passed"; exit 1
fi
grep -q 'FAILED: equivalence quickstart' "$W/check2.log" || { cat "$W/check2.log"; echo "FAIL: no equivalence failure named"; exit 1; }
cp "$W/ref.bak" "$P/ref/quickstart.csv"
echo "ok: a loss 1e-4 off the CPU reference fails the check"
# A library missing from the bundle is caught, by name.
rm "$P"/lib/libhdf5*.so*
if bash "$S/gpu-bundle/check-closure.sh" "$P" >"$W/closure.log" 2>&1; then
  cat "$W/closure.log"; echo "FAIL: closure check passed without HDF5"; exit 1
fi
grep -q 'needs libhdf5.*not in the bundle' "$W/closure.log" || { cat "$W/closure.log"; echo "FAIL: missing HDF5 not named"; exit 1; }
echo "ok: a library missing from the bundle is named"
