#!/usr/bin/env bash
# bench/hf_export_memory.sh [BUILD_DIR] [OUT_DIR]
# A GPT-2-small-sized model (inputs/bench-gpt2-small.ini: 12 layers, d_model
# 768, vocab_size 50304 padded over the bytes tokenizer's 257) trained
# STEPS (default 200) steps on the State of the Union corpus, then:
#   - export-hf (fp32 and bf16) and import-hf, each under /usr/bin/time -v:
#     peak RSS against the largest tensor (embed.weight, 50304 x 768 fp32),
#     which is what streaming tensor by tensor should cost;
#   - the independent reference (tests/tools/hf_llama_reference.py, float64
#     numpy) reads the fp32 export and computes wlb4d's validation loss.
# Prints one table. Training is the long part (about 3 s/step on 2 cores at
# 256 tokens per step); STEPS=20 for a quick look.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUT=${2:-runs/bench/hf-export}
STEPS=${STEPS:-200}
BIN=$BUILD/app
mkdir -p "$OUT"
if [ ! -f "$OUT/train.h5" ]; then
  "$BIN/wlb4d-prep" --input inputs/corpus/sotu-embedded.jsonl.xz --output "$OUT/train.h5" \
    --val-fraction 0.05 --val-output "$OUT/val.h5" > /dev/null
fi
rm -rf "$OUT/ck" "$OUT/hf32" "$OUT/hf16" "$OUT/imported.h5" "$OUT/run.csv"
"$BIN/wlb4d" inputs/bench-gpt2-small.ini --data.train="$OUT/train.h5" --data.val="$OUT/val.h5" \
  --train.steps="$STEPS" --train.micro_batches=1 --train.max_seq_len=256 --train.print_every=20 \
  --train.eval_every="$STEPS" --train.eval_tokens=256 --optim.lr=1e-3 --optim.warmup_steps=20 \
  --checkpoint.dir="$OUT/ck" --checkpoint.at_end=true --log.csv_file="$OUT/run.csv" | tail -3
peak() {  # peak RSS (MiB) of a command, from GNU time
  /usr/bin/time -v "$@" 2> "$OUT/time.txt" > /dev/null
  awk '/Maximum resident set size/ {printf "%.0f", $6 / 1024}' "$OUT/time.txt"
}
exp32=$(peak "$BIN/wlb4d-ckpt" export-hf "$OUT/ck" "$OUT/hf32" --dtype fp32)
exp16=$(peak "$BIN/wlb4d-ckpt" export-hf "$OUT/ck" "$OUT/hf16")
imp=$(peak "$BIN/wlb4d-ckpt" import-hf "$OUT/hf16" "$OUT/imported.h5" --vocab-size 50304)
ckpt_mib=$(du -m "$(ls "$OUT"/ck/step_*.h5 | tail -1)" | cut -f1)
/usr/bin/python3 - "$OUT" "$exp32" "$exp16" "$imp" "$ckpt_mib" <<'EOF'
import csv, os, sys
import h5py, numpy as np
sys.path.insert(0, "tests/tools")
from hf_llama_reference import HFLlama
out, exp32, exp16, imp, ckpt_mib = sys.argv[1], *map(int, sys.argv[2:])
val = [float(r["val_loss"]) for r in csv.DictReader(open(f"{out}/run.csv")) if r["val_loss"] not in ("", "nan")][-1]
ref = HFLlama(f"{out}/hf32")
with h5py.File(f"{out}/val.h5") as f:
    tok, off = f["tokens"][:].astype(np.int64), f["doc_offsets"][:].astype(np.int64)
total = count = 0
budget = 256  # one micro-batch of max_seq_len: the first 256 tokens of the first document
for d in range(len(off) - 1):
    if budget <= 0:
        break
    n = min(int(off[d + 1] - off[d]), budget, 256)
    s, c = ref.loss(tok[off[d]:off[d] + n])
    total, count, budget = total + s, count + c, budget - n
largest = 50304 * 768 * 4 / 2**20
print(f"GPT-2-small-sized model, checkpoint {ckpt_mib} MiB (weights + AdamW moments), largest tensor "
      f"embed.weight {largest:.0f} MiB fp32")
print(f"  peak RSS  export-hf fp32 {exp32} MiB | export-hf bf16 {exp16} MiB | import-hf {imp} MiB "
      f"({exp32 / largest:.1f} / {exp16 / largest:.1f} / {imp / largest:.1f} x the largest tensor)")
print(f"  validation loss  wlb4d {val:.6f} | independent reference on the fp32 export {total / count:.6f} "
      f"| relative difference {abs(val - total / count) / (total / count):.1e}")
EOF
