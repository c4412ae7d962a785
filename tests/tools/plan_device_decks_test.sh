#!/bin/sh
# The shipped H100 and H200 decks of the 7B-128K configuration differ only by
# what their device entries and links say:
#   plan_device_decks_test.sh WLB4D_PLAN INPUTS_DIR OUTDIR
#  1. their resolved decks (--print-config, includes applied) differ only in
#     plan.device and the inter-node link (plan.alpha_s, plan.beta_s_per_byte);
#  2. the H200 deck run with the H100 deck's device and link is the H100
#     deck's output, line for line (the tables, every number but plan_ms,
#     the planner's own wall time);
#  3. each deck's GEMM rate is its device's datasheet peak at the precision
#     trained (bf16: H100 SXM and H200 SXM 1979/2 TFLOP/s dense) x 0.65, and
#     the cost model's a equals 6 x (matmul parameters per layer) / tp / rate
#     computed here from the model shape (Llama2-7B, tp = 8);
#  4. under train.precision=fp32 the rate is the FP32 peak (67 TFLOP/s) x
#     0.65: a grows by 989.5/67;
#  5. the memory budget is the datasheet's 80 GB / 141 GB in GiB.
set -eu
plan=$1 in=$2 out=$3
mkdir -p "$out"
fail() { echo "plan_device_decks_test: $*" >&2; exit 1; }
h100=$in/plan-7b-128k.ini h200=$in/plan-7b-128k-h200.ini
"$plan" "$h100" --print-config >"$out/h100.ini"
"$plan" "$h200" --print-config >"$out/h200.ini"
# 1. Differing lines, by key.
keys=$(diff "$out/h100.ini" "$out/h200.ini" | sed -n 's/^[<>] \([a-z_0-9]*\) = .*/\1/p' | sort -u | tr '\n' ' ')
[ "$keys" = "alpha_s beta_s_per_byte device " ] ||
  fail "the resolved decks differ in '$keys' (want only: alpha_s beta_s_per_byte device)"
grep -qx 'device = h100' "$out/h100.ini" || fail "plan-7b-128k.ini does not name plan.device = h100"
grep -qx 'device = h200' "$out/h200.ini" || fail "plan-7b-128k-h200.ini does not name plan.device = h200"
grep -qx 'precision = bf16' "$out/h100.ini" || fail "plan-7b-128k.ini does not train bf16"
for k in flops_per_s flops_per_s_bf16 device_memory_gib; do
  grep -qx "$k = 0" "$out/h100.ini" || fail "plan-7b-128k.ini sets $k (the device table should give it)"
done
# 2. The H200 deck with the H100 device and link is the H100 deck.
a=$(sed -n 's/^alpha_s = //p' "$out/h100.ini") b=$(sed -n 's/^beta_s_per_byte = //p' "$out/h100.ini")
no_wall() { awk '$1 ~ /^(fixed|greedy|wlb)$/ && NF >= 13 { $12 = "-" } { print }'; }
"$plan" "$h100" --plan.steps=10 | tail -n +2 >"$out/h100.txt"
"$plan" "$h200" --plan.steps=10 --plan.device=h100 --plan.alpha_s="$a" --plan.beta_s_per_byte="$b" |
  tail -n +2 >"$out/h200-as-h100.txt"
no_wall <"$out/h100.txt" >"$out/h100.cmp"
no_wall <"$out/h200-as-h100.txt" >"$out/h200-as-h100.cmp"
cmp -s "$out/h100.cmp" "$out/h200-as-h100.cmp" || {
  diff "$out/h100.cmp" "$out/h200-as-h100.cmp" >&2 || true
  fail "the H200 deck with the H100 device and link does not reproduce the H100 deck's output"
}
"$plan" "$h200" --plan.steps=10 | tail -n +2 >"$out/h200.txt"
cat "$out/h100.txt" "$out/h200.txt"
# 3-5. Rates, a, memory against figures computed here.
"$plan" "$h100" --plan.steps=1 --train.precision=fp32 | tail -n +2 >"$out/h100-fp32.txt"
"${PYTHON:-/usr/bin/python3}" - "$out" <<'EOF'
import re, sys
d = sys.argv[1]
def fields(name):
    t = open(f"{d}/{name}").read()
    rate = float(re.search(r"GEMM rate ([0-9.e+-]+) FLOP/s", t).group(1))
    a = float(re.search(r"cost model per layer \(fwd\+bwd\): a = ([0-9.e+-]+) s/token", t).group(1))
    mem = float(re.search(r"; memory ([0-9.]+) GiB", t).group(1))
    peak = float(re.search(r": peak ([0-9.]+) TFLOP/s", t).group(1))
    return rate, a, mem, peak
p_layer = 4 * 4096 * 4096 + 3 * 4096 * 11008      # wq wk wv wo + gate up down (kv_heads = heads)
gib = 2 ** 30
want = {"h100.txt": (1979 / 2, 80), "h200.txt": (1979 / 2, 141), "h100-fp32.txt": (67, 80)}
bad = []
for name, (peak_tf, mem_gb) in want.items():
    rate, a, mem, peak = fields(name)
    exp_rate = peak_tf * 1e12 * 0.65
    exp_a = 6 * p_layer / 8 / exp_rate
    checks = [("peak", peak, peak_tf, 1e-3), ("rate", rate, exp_rate, 1e-3), ("a", a, exp_a, 2e-3),
              ("memory GiB", mem, mem_gb * 1e9 / gib, 1e-3)]
    for what, got, exp, tol in checks:
        if abs(got / exp - 1) > tol:
            bad.append(f"{name}: {what} {got:.6g}, want {exp:.6g}")
    print(f"{name}: peak {peak} TFLOP/s, rate {rate:.4g}, a {a:.4g} (want {exp_a:.4g}), memory {mem} GiB")
if bad:
    sys.exit("plan_device_decks_test: " + "; ".join(bad))
EOF
echo "plan_device_decks_test: OK"
