#!/usr/bin/env bash
# blend_test.sh MPIEXEC WLB4D WLB4D_PREP SOURCE_DIR PYTHON
# Shards and blends through wlb4d (docs/data.md "Shards and blends"):
#   - two sources: "web" (tests/data/tiny.jsonl) and "code" (the C++ of
#     lib/src/data cut into ~600-byte documents), code prepared by
#     wlb4d-prep as shards of 20 K tokens (2 threads) and as one file (1
#     thread); data.train = "0.7 web.h5 0.3 code-shard-*.h5";
#   - 8 steps on 1 rank with a checkpoint at step 4 (wlb4d-ckpt inspect
#     shows each source's position, verify accepts it): the step line shows
#     the tokens per source; the timing log's /sources table has a row per
#     source and step, the tokens drawn follow 0.7/0.3 within one document;
#   - resumed from step 4 on 2 ranks (dp=2, another layout): steps 5-8 have
#     the losses of the uninterrupted run (rtol 1e-5) and the same documents
#     per source (/sources' drawn tokens and documents equal, exactly);
#   - the shard set reads as the unsharded file: "0.7 web.h5 0.3
#     code-all.h5" gives the same losses bit for bit (with data.val = the
#     code shards' glob, evaluated at step 3);
#   - bad input, on 2 ranks, every rank naming the key or file and the rule:
#     a weight <= 0, a glob matching nothing, a source with another tokenizer.
set -u
source "$(dirname "$0")/lib.sh"
mpiexec=$1 wlb4d=$2 prep=$3 src=$4 py=$5
need_h5py "$py"
scratch_dir blend
"$py" - "$src" <<'PY' || fail "writing the corpora failed"
import json, sys, glob, os
src = sys.argv[1]
docs = []
for path in sorted(glob.glob(os.path.join(src, "lib/src/data/*.cpp"))):
    text = open(path, encoding="utf-8").read()
    cur = ""
    for line in text.splitlines(keepends=True):
        cur += line
        if len(cur) >= 600:
            docs.append(cur)
            cur = ""
    if cur.strip():
        docs.append(cur)
for name, part in (("code.jsonl", docs),):
    with open(name, "w") as f:
        for d in part:
            f.write(json.dumps({"text": d}) + "\n")
PY
"$prep" --input "$src/tests/data/tiny.jsonl" --output web.h5 > /dev/null || fail "prep web"
# The code source as shards of ~20 K tokens, written by 2 encoding threads,
# and as one file by 1 thread.
"$prep" --input code.jsonl --output code-shard.h5 --shard-tokens 20000 --threads 2 > prep.out || fail "prep code shards"
grep -E "train code-shard-\*.h5 \([0-9]+ shards\)" prep.out || fail "wlb4d-prep did not report the shards"
"$prep" --input code.jsonl --output code-all.h5 --threads 1 > /dev/null || fail "prep code-all"
"$prep" --input code.jsonl --output code-spm.h5 --tokenizer sentencepiece --vocab-size 400 > /dev/null ||
  fail "prep code-spm"
deck="$src/inputs/ci-tiny.ini"
blend="0.7 web.h5 0.3 code-shard-*.h5"
common=(--train.steps=8 --train.print_every=1 --checkpoint.keep=5)

run_step 180 "$wlb4d" "$deck" "${common[@]}" --checkpoint.every=4 --data.train="$blend" --checkpoint.dir=ck-a \
  --log.csv_file=a.csv --log.timing_file=a.h5
[ "$rc" -eq 0 ] || fail "the blend did not train"
out_has -E "data.train blends 2 sources: 1: 0.7 of the tokens, 20 documents \(web.h5\); 2: 0.3 of the tokens, [0-9]+ documents \(code-shard-\*.h5\)" ||
  fail "no start-up line naming the sources"
out_has -E "step +8/8 .*\| src [0-9.k]+/[0-9.k]+ \(drawn [0-9.]+/[0-9.]+%\)" || fail "no per-source tokens in the step line"

# The checkpoint holds every source's position (and its digest covers it).
ckpt="$(dirname "$wlb4d")/wlb4d-ckpt"
info=$("$ckpt" inspect ck-a/step_000004.h5) || fail "wlb4d-ckpt inspect failed"
printf '%s\n' "$info" | grep -E "data source 2 +epoch [0-9]+ position [0-9]+, drawn [0-9]+ tokens in [0-9]+ documents" ||
  fail "wlb4d-ckpt inspect shows no per-source position"
"$ckpt" verify ck-a/step_000004.h5 > /dev/null || fail "wlb4d-ckpt verify refused the blend's checkpoint"

run_step 180 "$mpiexec" -n 2 "$wlb4d" "$deck" "${common[@]}" --data.train="$blend" --checkpoint.dir=ck-a \
  --checkpoint.resume=ck-a/step_000004.h5 --parallel.dp=2 --log.csv_file=b.csv \
  --log.timing_file=b.h5
[ "$rc" -eq 0 ] || fail "the resume on dp=2 failed"
"$py" "$src/tests/tools/check_losses.py" b.csv --against a.csv --rtol 1e-5 || fail "resumed losses differ"

run_step 180 "$wlb4d" "$deck" --train.steps=3 --data.train="0.7 web.h5 0.3 code-all.h5" --checkpoint.dir=ck-c \
  --log.csv_file=c.csv --data.val="code-shard-*.h5" --train.eval_every=3 --train.eval_tokens=256
[ "$rc" -eq 0 ] || fail "the unsharded blend did not train"
out_has -E "step +3/3 .* val [0-9.]+" || fail "no validation loss from data.val = a glob of shards"
"$py" "$src/tests/tools/check_losses.py" c.csv --against a.csv --rtol 0 || fail "the shard set reads differently"

"$py" - <<'PY' || fail "the /sources tables"
import h5py, numpy as np
def rows(p):
    with h5py.File(p, "r") as f:
        return f["sources"][:]
a, b = rows("a.h5"), rows("b.h5")
assert len(a) == 16, f"a.h5: {len(a)} /sources rows, expected 8 steps x 2 sources"
last = a[a["step"] == 7]
drawn = last["drawn_tokens"].astype(float)
share = drawn[0] / drawn.sum()
with h5py.File("web.h5") as w, h5py.File("code-all.h5") as c:
    longest = max(np.diff(w["doc_offsets"][:]).max(), np.diff(c["doc_offsets"][:]).max())
assert abs(drawn[0] - 0.7 * drawn.sum()) <= longest, f"web drew {drawn[0]} of {drawn.sum()} tokens"
assert abs(last["weight"][0] - 0.7) < 1e-12
for step in range(4, 8):
    x, y = a[a["step"] == step], b[b["step"] == step]
    for k in ("tokens", "drawn_tokens", "drawn_docs"):
        assert (x[k] == y[k]).all(), f"step {step} {k}: {x[k]} uninterrupted, {y[k]} resumed"
print(f"blend: web share of drawn tokens {share:.4f} after 8 steps; resumed steps 5-8 drew the same documents")
PY

bad() {  # bad VALUE PATTERN WHAT
  run_step 60 "$mpiexec" -n 2 "$wlb4d" "$deck" --parallel.dp=2 --train.steps=1 --data.train="$1" --checkpoint.dir=ck-x
  [ "$rc" -ne 0 ] || fail "$3 trained (rc 0)"
  # A deck error is said once for all ranks (rank 0); a data error by every rank.
  [ "$(out_count -E -- "\[r[01]\].*$2")" -ge 1 ] || fail "$3: no rank named it"
  expect_not_trained "$3"
}
bad "0.7 web.h5 0 code-all.h5" "data.train=0.7 web.h5 0 code-all.h5 has weight '0' for source 2: a weight must be > 0" "a zero weight"
bad "0.7 web.h5 0.3 nothing-*.h5" "data.train: source 2: 'nothing-\*.h5' matches no file" "an empty glob"
bad "0.7 web.h5 0.3 code-spm.h5" "data.train: code-spm.h5: tokenizer 'sentencepiece' differs from web.h5's 'bytes'.*must share the tokenizer" \
  "another tokenizer"
echo "$test_label: ok"
