#!/usr/bin/env bash
# sft_train_test.sh WLB4D_PREP WLB4D MPIEXEC SOURCE_DIR PYTHON
# Supervised fine-tuning through the executables (docs/data.md, "Fine-tuning
# data"): the example deck inputs/sft.ini on the data its header's command
# prepares, then layout equivalence with the loss mask against that 1-rank
# run (DESIGN §3: the same loss per step to 1e-5 relative):
#   - pp=2 x cp=2 x tp=2 (8 ranks): the mask follows the tokens through CP
#     sharding and the labels reach the last pipeline stage;
#   - dp=2 x cp=2 with disaggregated attention and per-document sharding (4 ranks);
#   - the fixed packer, whose cuts split records across micro-batches, on
#     1 rank and pp=2 x cp=2;
# and a step whose targets are all masked: loss 0, zero gradient, a warning
# that names the step, never NaN, and training goes on; a validation set
# without loss targets is refused naming data.val.
set -u
source "$(dirname "$0")/lib.sh"
prep=$(realpath "$1"); wlb4d=$(realpath "$2"); mpiexec=$3; src=$(realpath "$4"); python=$5
scratch_dir sft_train
check="$python $src/tests/tools/check_losses.py"
deck=$src/inputs/sft.ini

# run NAME NPROCS ARGS...: wlb4d on the deck, its CSV as NAME.csv, its own checkpoint directory.
run() {
  local name=$1 np=$2; shift 2
  local cmd=("$wlb4d" "$deck" --log.csv_file="$name.csv" --checkpoint.dir="ck-$name" --log.timing_file= "$@")
  [ "$np" -gt 1 ] && cmd=("$mpiexec" -n "$np" "${cmd[@]}")
  run_step 300 "${cmd[@]}"
  [ "$rc" -eq 0 ] || fail "$name: wlb4d exited $rc"
  printf '%s\n' "$out" | grep -Eqi '(loss|gnorm|val) -?nan' && fail "$name: NaN in the output"
  return 0
}

# The deck's header command, as written (paths under runs/sft/ of the current directory).
(cd "$src" && grep -q 'wlb4d-prep --sft --input inputs/corpus/sft-tiny.jsonl --output runs/sft/data/sft-train.h5' "$deck") ||
  fail "inputs/sft.ini no longer shows the prep command this test runs"
"$prep" --sft --input "$src/inputs/corpus/sft-tiny.jsonl" --output runs/sft/data/sft-train.h5 --val-fraction 0.1 \
  --val-output runs/sft/data/sft-val.h5 | tee prep.log || fail "prep failed"
grep -q 'train loss mask: [0-9]* of [0-9]* targets trained' prep.log || fail "prep printed no loss-mask line"

run one 1
$check one.csv --falls 0.8 || fail "the 1-rank SFT loss does not fall"
run pp2cp2tp2 8 --parallel.pp=2 --parallel.cp=2 --parallel.tp=2
$check pp2cp2tp2.csv --against one.csv --rtol 1e-5 || fail "pp=2 x cp=2 x tp=2 differs from 1 rank"
run dp2cp2 4 --parallel.dp=2 --parallel.cp=2 --balance.attention=disaggregated --balance.sharding=document
$check dp2cp2.csv --against one.csv --rtol 1e-5 || fail "dp=2 x cp=2 disaggregated differs from 1 rank"
run fixed1 1 --balance.packer=fixed --train.max_seq_len=128 --train.steps=15
run fixed4 4 --balance.packer=fixed --train.max_seq_len=128 --train.steps=15 --parallel.pp=2 --parallel.cp=2
$check fixed4.csv --against fixed1.csv --rtol 1e-5 || fail "fixed packer: pp=2 x cp=2 differs from 1 rank"

# A fully masked step: the first record's prompt fills the first two steps.
"$python" -c "
import json
recs = [{'prompt': 'Context: ' + 'the quick brown fox jumps over the lazy dog. ' * 8 + '\nQ: which animal?\nA: ',
         'response': 'the fox'}]
recs += [{'prompt': f'Q: {i} plus 1?\nA: ', 'response': str(i + 1)} for i in range(12)]
open('zero.jsonl', 'w').write(''.join(json.dumps(r) + '\n' for r in recs))" || fail "cannot write zero.jsonl"
"$prep" --sft --input zero.jsonl --output zero.h5 > /dev/null || fail "prep of zero.jsonl failed"
run zero 2 --data.train=zero.h5 --data.val= --data.shuffle=false --balance.packer=fixed --train.max_seq_len=64 \
  --train.micro_batches=2 --parallel.cp=2 --train.steps=5 --train.print_every=1 --checkpoint.at_end=false
printf '%s\n' "$out" | grep -q 'step 1: no loss targets' || fail "no warning for the zero-target step 1"
printf '%s\n' "$out" | grep -Eq 'step +1/5 .*loss 0\.0000 .*gnorm 0\.000' || fail "step 1 is not loss 0, gnorm 0"
printf '%s\n' "$out" | grep -Eq 'step +4/5 .*loss [1-9]' || fail "training did not go on after the zero-target steps"
# A validation set whose first eval_tokens hold only masked targets: refused
# at start-up naming data.val (a validation loss of 0/0 would be NaN).
run_step 120 "$wlb4d" "$deck" --data.train=zero.h5 --data.val=zero.h5 --train.eval_tokens=64 --data.shuffle=false \
  --log.timing_file= --checkpoint.dir=ck-val
[ "$rc" -ne 0 ] || fail "a validation set without loss targets was accepted"
printf '%s\n' "$out" | grep -q "data.val='zero.h5' gives no loss targets" || fail "no data.val message"
echo "$test_label: ok"
