#!/usr/bin/env python3
"""`wlb4d-ckpt export-hf` through the executables, checked by an independent
Llama (hf_llama_reference.py, float64 numpy from HF's conventions).

  hf_export_check.py WLB4D WLB4D_PREP WLB4D_CKPT SOURCE_DIR WORKDIR [--tokenizer bytes|sentencepiece|hf-bpe]

1. wlb4d-prep writes a training and a validation set of tests/data/tiny.jsonl;
   wlb4d trains ci-tiny for 12 steps with a padded vocabulary
   (model.vocab_size above the tokenizer's) and validates at its last step:
   that validation loss, in the timing CSV, is computed by wlb4d with the
   weights of the checkpoint written at the end.
2. export-hf --dtype fp32: config.json names the model; the reference reads
   the directory and computes the same validation loss (the first
   train.eval_tokens tokens of the validation documents, each document a
   sequence of its own, positions from 0, next-token targets inside it)
   within 1e-5 relative of wlb4d's.
3. export-hf (bf16) with a small --max-shard-size: several shards and an
   index; every tensor equals the fp32 export rounded to bf16 (nearest,
   ties to even, computed here) and the loss stays within bf16's error.
4. The tokenizer files: bytes: tokenizer.json's 256 base tokens are the
   bytes; sentencepiece: tokenizer.model is the dataset's model byte for byte;
   hf-bpe (a small Llama-3-style tokenizer.json written here, prepared with
   --eos-token <|eot_id|>, not the rule's <|end_of_text|>): tokenizer.json is
   that file byte for byte and tokenizer_config.json / config.json name the
   chosen EOS and the BOS; import-hf stores it back as hf-bpe with that EOS
   (tokenizer_config.json's), and wlb4d-generate encodes and decodes with it.
5. Refusals: a non-empty OUTDIR, --dtype fp8, a bad --max-shard-size, a
   missing checkpoint: non-zero exit, a message naming the thing.
"""
import argparse
import csv
import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_llama_reference import HFLlama, read_hf_weights  # noqa: E402

try:
    import h5py
except ImportError:
    print("hf_export_check: skipped: python3-h5py is not installed")
    sys.exit(77)

ap = argparse.ArgumentParser()
ap.add_argument("wlb4d")
ap.add_argument("prep")
ap.add_argument("ckpt")
ap.add_argument("src")
ap.add_argument("workdir")
ap.add_argument("--tokenizer", default="bytes")
a = ap.parse_args()

EVAL_TOKENS = 400  # <= max_seq_len below: one micro-batch, no document cut but the budget's


def run(cmd, expect_ok=True):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if expect_ok and r.returncode != 0:
        sys.exit(f"hf_export_check: failed (rc {r.returncode}): {' '.join(cmd)}\n{r.stdout}")
    return r


def fail(msg):
    sys.exit(f"hf_export_check ({a.tokenizer}): {msg}")


def bytes_to_unicode():
    """GPT-2's byte -> character table (openai/gpt-2 encoder.py), written out here again."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


# A Llama-3-shaped byte-level BPE: Split (Llama 3's pattern) + ByteLevel,
# ignore_merges, merges as pairs, the 256 bytes then a few English merges,
# three special tokens after a gap of unused ids.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
BPE_MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ o", "r e", "a n", "e s", "Ġ s", "Ġ w", "Ġ c",
              "e n", "a t", "Ġo f", "Ġ p", "i t", "o r", "Ġa n", "Ġan d", "Ġ f", "Ġ b", "e d", "a l", "i on", "Ġ in"]


def write_bpe_tokenizer(path):
    vocab = {c: b for b, c in bytes_to_unicode().items()}
    merges = []
    for m in BPE_MERGES:
        x, y = m.split(" ")
        vocab.setdefault(x + y, len(vocab))
        merges.append([x, y])
    added = [{"id": len(vocab) + 5 + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for i, c in enumerate(["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"])]
    t = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
         "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
             {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
             {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
         "post_processor": None,
         "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
         "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                   "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                   "vocab": vocab, "merges": merges}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(t, f, ensure_ascii=False)
    return {x["content"]: x["id"] for x in added}


shutil.rmtree(a.workdir, ignore_errors=True)
os.makedirs(a.workdir)
os.chdir(a.workdir)
prep = [a.prep, "--input", os.path.join(a.src, "tests/data/tiny.jsonl"), "--output", "train.h5",
        "--val-fraction", "0.25", "--val-output", "val.h5", "--tokenizer", a.tokenizer]
if a.tokenizer == "sentencepiece":
    prep += ["--vocab-size", "320"]
if a.tokenizer == "hf-bpe":
    specials = write_bpe_tokenizer("tok.json")
    prep[prep.index("hf-bpe")] = "tok.json"
    prep += ["--eos-token", "<|eot_id|>"]
    out = run(prep).stdout
    if f"tokenizer hf-bpe, vocab_size {specials['<|eot_id|>'] + 1}, eos_id {specials['<|eot_id|>']} (<|eot_id|>)" \
            not in out:
        fail(f"wlb4d-prep did not report the tokenizer and the named EOS:\n{out}")
else:
    run(prep)
with h5py.File("train.h5", "r") as f:
    data_vocab = int(f.attrs["vocab_size"])
padded = data_vocab + 43
run([a.wlb4d, os.path.join(a.src, "inputs/ci-tiny.ini"), "--data.train=train.h5", "--data.val=val.h5",
     "--train.steps=12", "--train.eval_every=12", f"--train.eval_tokens={EVAL_TOKENS}", "--train.max_seq_len=512",
     f"--model.vocab_size={padded}", "--checkpoint.dir=ck", "--checkpoint.at_end=true", "--log.csv_file=run.csv"])
wlb_val = None
with open("run.csv") as f:
    for row in csv.DictReader(f):
        if row["val_loss"] not in ("", "nan", "NaN", "-nan"):
            wlb_val = float(row["val_loss"])
if wlb_val is None:
    fail("no validation loss in run.csv")

# 2. fp32 export against the reference.
out = run([a.ckpt, "export-hf", "ck", "hf32", "--dtype", "fp32"]).stdout
print(out, end="")
if f"({padded - data_vocab} padding rows trimmed)" not in out:
    fail(f"the export did not report trimming {padded - data_vocab} padding rows")
cfg = json.load(open("hf32/config.json"))
want = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 160,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": data_vocab,
        "tie_word_embeddings": False, "torch_dtype": "float32", "max_position_embeddings": 512,
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
for k, v in want.items():
    if cfg.get(k) != v:
        fail(f"config.json: {k} = {cfg.get(k)!r}, expected {v!r}")
ref = HFLlama("hf32")
with h5py.File("val.h5", "r") as f:
    tokens = f["tokens"][:]
    offsets = f["doc_offsets"][:].astype(np.int64)
total, count, budget = 0.0, 0, EVAL_TOKENS
for d in range(len(offsets) - 1):
    if budget <= 0:
        break
    n = min(int(offsets[d + 1] - offsets[d]), budget)
    s, c = ref.loss(tokens[offsets[d]:offsets[d] + n].astype(np.int64))
    total, count, budget = total + s, count + c, budget - n
ref_val = total / count
rel = abs(ref_val - wlb_val) / abs(ref_val)
print(f"hf_export_check: validation loss over {count} targets: wlb4d {wlb_val:.9f}, "
      f"independent HF-convention reference (fp32 export, fp64 math) {ref_val:.9f}, relative difference {rel:.2e}")
if rel > 1e-5:
    fail(f"validation loss differs: wlb4d {wlb_val} vs reference {ref_val} (relative {rel:.2e} > 1e-5)")

# 3. bf16, sharded.
out = run([a.ckpt, "export-hf", "ck", "hf16", "--max-shard-size", "40KiB"]).stdout
print(out, end="")
index = json.load(open("hf16/model.safetensors.index.json"))
shards = sorted(set(index["weight_map"].values()))
if len(shards) < 3:
    fail(f"--max-shard-size 40KiB gave {len(shards)} shard(s)")
w32, w16 = read_hf_weights("hf32"), read_hf_weights("hf16")
if set(w32) != set(w16) or set(index["weight_map"]) != set(w32):
    fail("the bf16 export's tensors or index differ from the fp32 export's")
total_size = sum(v.size * 2 for v in w16.values())
if index["metadata"]["total_size"] != total_size:
    fail(f"index total_size {index['metadata']['total_size']} != {total_size} bytes of bf16 tensors")
for name, x in w32.items():
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16  # nearest, ties to even (no NaN here)
    expect = rounded.astype(np.uint32).view(np.float32).astype(np.float64)
    if not np.array_equal(expect, w16[name]):
        fail(f"{name}: the bf16 export is not the fp32 weights rounded to nearest-even")
print(f"hf_export_check: bf16 export in {len(shards)} shards equals the fp32 export rounded to bf16")

# 4. Tokenizer files.
if a.tokenizer == "bytes":
    tj = json.load(open("hf32/tokenizer.json"))
    vocab = tj["model"]["vocab"]
    if sorted(vocab.values()) != list(range(256)) or tj["added_tokens"][0]["id"] != 256:
        fail("tokenizer.json: the base vocabulary is not the 256 bytes plus EOS 256")
    if any(vocab[c] != b for b, c in bytes_to_unicode().items()):
        fail("tokenizer.json: the base vocabulary is not GPT-2's byte-to-unicode alphabet")
elif a.tokenizer == "hf-bpe":
    given = open("tok.json", "rb").read()
    with h5py.File("train.h5", "r") as f:
        if bytes(f["tokenizer/model"][:]) != given or f["tokenizer"].attrs["type"] not in ("hf-tokenizer-json",
                                                                                          b"hf-tokenizer-json"):
            fail("train.h5's /tokenizer/model is not tok.json byte for byte (type hf-tokenizer-json)")
    if open("hf32/tokenizer.json", "rb").read() != given:
        fail("the exported tokenizer.json is not the one the data was prepared with")
    tc = json.load(open("hf32/tokenizer_config.json"))
    eot, bot = specials["<|eot_id|>"], specials["<|begin_of_text|>"]
    if (tc.get("eos_token"), tc.get("bos_token"), tc.get("tokenizer_class")) != \
            ("<|eot_id|>", "<|begin_of_text|>", "PreTrainedTokenizerFast") or \
            (cfg["eos_token_id"], cfg["bos_token_id"]) != (eot, bot):
        fail(f"tokenizer_config.json / config.json special tokens: {tc}, eos id {cfg['eos_token_id']}, "
             f"bos id {cfg['bos_token_id']} (expected <|eot_id|> {eot}, <|begin_of_text|> {bot})")
    run([a.ckpt, "import-hf", "hf32", "imported.h5"])
    out = run([a.ckpt, "inspect", "imported.h5"]).stdout
    want = f"hf-bpe, vocab {data_vocab} (model rows {data_vocab}), eos {eot}, bos {bot}"
    if want not in out:
        fail(f"import-hf did not store the tokenizer as '{want}':\n{out}")
    gen = os.path.join(os.path.dirname(a.ckpt), "wlb4d-generate")
    out = run([gen, "ck", "--prompt", "The President and the", "--max-new-tokens", "8", "--greedy"]).stdout
    if not out.startswith("The President and the"):
        fail(f"wlb4d-generate did not continue the prompt with the checkpoint's hf-bpe tokenizer:\n{out}")
    print("hf_export_check: hf-bpe: tokenizer.json exported byte for byte, EOS <|eot_id|> named; "
          "import-hf stores it back; wlb4d-generate continues a text prompt")
else:
    with h5py.File("train.h5", "r") as f:
        model = bytes(f["tokenizer/model"][:])
    if open("hf32/tokenizer.model", "rb").read() != model:
        fail("tokenizer.model differs from the dataset's sentencepiece model")
    tc = json.load(open("hf32/tokenizer_config.json"))
    if tc.get("eos_token") != "</s>" or tc.get("bos_token") != "<s>" or cfg["eos_token_id"] != 2:
        fail(f"tokenizer_config.json / config.json special tokens: {tc}, eos id {cfg['eos_token_id']}")

# 5. Refusals.
for cmd, pattern in [
    ([a.ckpt, "export-hf", "ck", "hf32"], "hf32 is not empty"),
    ([a.ckpt, "export-hf", "ck", "x", "--dtype", "fp8"], "--dtype='fp8' is not bf16 or fp32"),
    ([a.ckpt, "export-hf", "ck", "x", "--max-shard-size", "5XB"], "--max-shard-size='5XB' is not a positive size"),
    ([a.ckpt, "export-hf", "nowhere.h5", "x"], "nowhere.h5"),
]:
    r = run(cmd, expect_ok=False)
    if r.returncode == 0 or pattern not in r.stdout:
        fail(f"{' '.join(cmd)}: rc {r.returncode}, expected an error naming '{pattern}':\n{r.stdout}")
if os.path.exists("x"):
    fail("a refused export left its OUTDIR behind")
print(f"hf_export_check ({a.tokenizer}): ok")
