#!/usr/bin/env bash
# repeatable_plan_test.sh WLB4D WLB4D_PREP SOURCE_DIR SCENARIO [PYTHON]
# Same deck + seed + data -> same plan on any machine (DESIGN §3), checked
# through wlb4d on 1 rank with the wlb packer (outlier thresholds chosen with
# the cost model, so the plan follows it). The machine's load is injected
# deterministically: WLB4D_FAULT=calib_load scales one timed shape of the
# start-up calibration, as a background process would have slowed it.
#   default:    a deck that does not set balance.calibrate, run twice, once
#               under the injected load: the per-step losses and plan metrics
#               agree bit for bit (the default cost model is not timed).
#   calibrated: the control: with balance.calibrate=true the same two runs
#               plan differently (the load reaches the plan; opting in means
#               accepting that), and the constants are printed at start-up.
#   resume:     balance.calibrate=true, 20 steps with a checkpoint at step 10;
#               a resume from it under the injected load reuses the saved
#               constants and runs steps 10..19 bit for bit as the
#               uninterrupted run did.
#   degenerate: a calibration whose quadratic term fits to 0 ("breakpoint inf
#               tokens") is not planned with: a warning, the FLOP-count model,
#               the default run's plan bit for bit.
set -u
source "$(dirname "$0")/lib.sh"
wlb4d=$1 prep=$2 src=$3 scenario=$4 python=${5:-python3}
test_label+=" ($scenario)"
scratch_dir repeat
prep_tiny "$prep" "$src"
# No balance.calibrate and no cost_a/cost_b: the defaults decide.
cat > deck.ini <<'DECK'
[model]
layers = 2
d_model = 64
heads = 4
kv_heads = 2
ffn_hidden = 160
[parallel]
dp = 1
pp = 1
cp = 1
tp = 1
[data]
train = tiny-train.h5
[balance]
packer = wlb
max_tokens = 512
[train]
steps = 20
micro_batches = 4
max_seq_len = 256
seed = 2024
eval_every = 0
print_every = 10
[checkpoint]
at_end = false
resume = never
[log]
timing_file =
DECK
# One timed shape 3x slower: sample 8 is the longest micro-batch (512 tokens)
# as one document (calibrate_cost_model's order), the most attention-heavy
# shape; the fit's breakpoint falls from about 500 to about 60 tokens.
load=calib_load:sample=8:percent=300
# The same shape 10x faster: the timings no longer grow with the squared
# lengths, and the quadratic term fits to 0.
flat=calib_load:sample=8:percent=10
run() {  # run NAME FAULT ARGS...: wlb4d with log NAME.log and CSV NAME.csv
  local name=$1 fault=$2; shift 2
  WLB4D_FAULT=$fault "$wlb4d" deck.ini --log.csv_file="$name.csv" "$@" > "$name.log" 2>&1 ||
    { cat "$name.log"; fail "run $name failed"; }
}
same() { "$python" "$src/tests/tools/check_same_plan.py" "$@" || fail "plans differ: $*"; }
case "$scenario" in
  default)
    run plain ""
    run loaded "$load"
    same plain.csv loaded.csv
    grep -q "cost model from FLOP counts" plain.log || { cat plain.log; fail "no 'cost model from FLOP counts' line"; }
    grep -q "calibrated" loaded.log && { cat loaded.log; fail "the default run calibrated"; } ;;
  calibrated)
    run plain "" --balance.calibrate=true
    run loaded "$load" --balance.calibrate=true
    grep -q "cost model calibrated on this build's layer: a = " plain.log || { cat plain.log; fail "no calibration line"; }
    "$python" "$src/tests/tools/check_same_plan.py" plain.csv loaded.csv --expect-differ ||
      fail "the injected load did not reach a calibrated plan: the test cannot tell a timed plan from an untimed one" ;;
  resume)
    run whole "" --balance.calibrate=true --checkpoint.dir=ck --checkpoint.every=10 --checkpoint.keep=2
    [ -f ck/step_000010.h5 ] || fail "no step-10 checkpoint"
    run resumed "$load" --balance.calibrate=true --checkpoint.dir=ck --checkpoint.resume=ck/step_000010.h5 \
      --checkpoint.every=0
    same whole.csv resumed.csv --from-step 10
    want=$(grep -o "a = .* per layer" whole.log | head -1)
    got=$(grep -o "a = .* per layer" resumed.log | head -1)
    [ -n "$want" ] && [ "$want" = "$got" ] || fail "constants differ: '$want' vs '$got'"
    grep -q "cost model reused from ck/step_000010.h5 (calibrated at the run's first start)" resumed.log ||
      { cat resumed.log; fail "the resumed run did not reuse the checkpoint's calibration"; } ;;
  degenerate)
    run plain ""
    run flat "$flat" --balance.calibrate=true
    grep -q "warning: balance.calibrate=true: the calibration is degenerate (the quadratic (attention) term b = 0.000e+00" \
      flat.log || { cat flat.log; fail "no warning for a degenerate calibration"; }
    same plain.csv flat.csv ;;
  *) fail "unknown scenario" ;;
esac
echo "$test_label: ok"
