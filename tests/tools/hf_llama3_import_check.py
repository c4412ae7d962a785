#!/usr/bin/env python3
"""A Llama-3.2-shaped Hugging Face model (GQA, tied embeddings, llama3 RoPE
scaling, bf16 weights), written with random weights by the independent
reference (hf_llama_reference.py), imported with `wlb4d-ckpt import-hf` and
trained by wlb4d on several layouts.

    hf_llama3_import_check.py WLB4D WLB4D_PREP WLB4D_CKPT MPIEXEC SOURCE_DIR WORKDIR

1. import-hf prints tie_embeddings = true and the llama3 rope keys; the
   checkpoint holds embed.weight and no lm_head.weight.
2. wlb4d's validation loss after one step of lr 1e-12 (the imported weights,
   unchanged to ~1e-12) equals the reference's loss on the same tokens
   within 1e-5 relative. The scaling matters here: original_max_position
   is 64, so every frequency band (kept, blended, divided) acts on these
   positions; the same run with the scaling switched off must differ.
3. Six steps of training from the import: 1 rank, pp=2 x tp=2 (the head on
   stage 2 is a replica of the embedding whose gradient is summed with stage
   1's) and pp=2 x dp=2 with ZeRO-1 and 1-MiB buckets give the same losses
   within 1e-5 relative.
4. A checkpoint written at step 3 on pp=2 x tp=2 resumes on 1 rank with the
   uninterrupted run's losses; it has no lm_head.weight.
5. export-hf of the import writes tie_word_embeddings true, the same
   rope_scaling, and no lm_head.weight.
"""
import csv
import json
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_llama_reference import HFLlama, read_safetensors, write_safetensors  # noqa: E402

try:
    import h5py
except ImportError:
    print("skipped: h5py is not installed")
    sys.exit(77)

wlb4d, prep, ckpt, mpiexec, src, work = sys.argv[1:7]
EVAL_TOKENS = 400
VOCAB = 257  # the bytes tokenizer's: wlb4d masks padding rows out of the softmax, HF does not
ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}


def run(cmd, ok=True):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if ok and r.returncode != 0:
        sys.exit(f"hf_llama3_import_check: failed (rc {r.returncode}): {' '.join(cmd)}\n{r.stdout}")
    return r


def fail(msg):
    sys.exit(f"hf_llama3_import_check: {msg}")


def column(path, name):
    out = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            if row[name] not in ("", "nan", "NaN", "-nan"):
                out[int(row["step"])] = float(row[name])
    return [out[k] for k in sorted(out)]


def bytes_to_unicode():
    """openai/gpt-2 encoder.py: the byte-level BPE alphabet."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
os.chdir(work)

# The random Llama-3.2-shaped model, as a user's HF directory.
rng = np.random.default_rng(3)
d, heads, kv, layers, ffn = 64, 4, 2, 2, 160
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": d, "intermediate_size": ffn,
       "num_attention_heads": heads, "num_key_value_heads": kv, "num_hidden_layers": layers, "head_dim": d // heads,
       "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": ROPE, "max_position_embeddings": 512,
       "vocab_size": VOCAB, "tie_word_embeddings": True, "bos_token_id": None, "eos_token_id": 256,
       "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16"}
os.makedirs("llama32")
json.dump(cfg, open("llama32/config.json", "w"), indent=2)
tensors = {"model.embed_tokens.weight": ("BF16", rng.normal(0, 0.1, (VOCAB, d)))}
for L in range(layers):
    p = f"model.layers.{L}."
    tensors[p + "input_layernorm.weight"] = ("BF16", 1 + 0.1 * rng.normal(size=d))
    tensors[p + "self_attn.q_proj.weight"] = ("BF16", rng.normal(0, 0.3, (d, d)))
    tensors[p + "self_attn.k_proj.weight"] = ("BF16", rng.normal(0, 0.3, (kv * d // heads, d)))
    tensors[p + "self_attn.v_proj.weight"] = ("BF16", rng.normal(0, 0.1, (kv * d // heads, d)))
    tensors[p + "self_attn.o_proj.weight"] = ("BF16", rng.normal(0, 0.1, (d, d)))
    tensors[p + "post_attention_layernorm.weight"] = ("BF16", 1 + 0.1 * rng.normal(size=d))
    tensors[p + "mlp.gate_proj.weight"] = ("BF16", rng.normal(0, 0.1, (ffn, d)))
    tensors[p + "mlp.up_proj.weight"] = ("BF16", rng.normal(0, 0.1, (ffn, d)))
    tensors[p + "mlp.down_proj.weight"] = ("BF16", rng.normal(0, 0.1, (d, ffn)))
tensors["model.norm.weight"] = ("BF16", 1 + 0.1 * rng.normal(size=d))
write_safetensors("llama32/model.safetensors", tensors, {"format": "pt"})
# wlb4d's bytes tokenizer as tokenizer.json (the import stores it).
alphabet = bytes_to_unicode()
tok = {"version": "1.0", "added_tokens": [{"id": 256, "content": "</s>", "special": True}],
       "model": {"type": "BPE", "vocab": {alphabet[b]: b for b in range(256)}, "merges": []}}
json.dump(tok, open("llama32/tokenizer.json", "w"))

# 1. Import.
out = run([ckpt, "import-hf", "llama32", "imported.h5"]).stdout
print(out, end="")
for line in ["tie_embeddings = true", "rope_scaling = llama3", "rope_factor = 32", "rope_low_freq_factor = 1",
             "rope_high_freq_factor = 4", "rope_original_max_position = 64", f"vocab_size = {VOCAB}",
             "rope_theta = 500000"]:
    if line not in out:
        fail(f"import-hf output lacks '{line}'")
with h5py.File("imported.h5", "r") as f:
    names = set(f["model"].keys())
if "embed.weight" not in names or "lm_head.weight" in names:
    fail(f"the tied import holds {sorted(names)}: expected embed.weight and no lm_head.weight")
model_keys = [l.strip() for l in out.split("[model]", 1)[1].splitlines() if " = " in l]
model_flags = ["--model." + k.replace(" = ", "=") for k in model_keys]

# 2. Validation loss against the reference.
run([prep, "--input", os.path.join(src, "tests/data/tiny.jsonl"), "--output", "train.h5", "--val-fraction", "0.25",
     "--val-output", "val.h5"])
deck = os.path.join(src, "inputs/ci-tiny.ini")
common = [deck, "--data.train=train.h5", "--train.max_seq_len=512", "--checkpoint.resume=never"]
base = common + model_flags


def val_run(extra, name, flags=model_flags):
    run([wlb4d] + common + flags + ["--data.val=val.h5", "--train.steps=1", "--train.eval_every=1",
                          f"--train.eval_tokens={EVAL_TOKENS}", "--optim.lr=1e-12", "--optim.min_lr=0",
                          f"--checkpoint.dir={name}", f"--log.csv_file={name}.csv"] + extra)
    return column(f"{name}.csv", "val_loss")[-1]


wlb_val = val_run(["--checkpoint.init_from=imported.h5"], "val")
ref = HFLlama("llama32")
with h5py.File("val.h5", "r") as f:
    tokens = f["tokens"][:].astype(np.int64)
    offsets = f["doc_offsets"][:].astype(np.int64)
total, count, budget = 0.0, 0, EVAL_TOKENS
for doc in range(len(offsets) - 1):
    if budget <= 0:
        break
    n = min(int(offsets[doc + 1] - offsets[doc]), budget)
    s, c = ref.loss(tokens[offsets[doc]:offsets[doc] + n])
    total, count, budget = total + s, count + c, budget - n
ref_val = total / count
rel = abs(wlb_val - ref_val) / abs(ref_val)
print(f"hf_llama3_import_check: validation loss over {count} targets: wlb4d {wlb_val:.9f}, reference {ref_val:.9f}, "
      f"relative difference {rel:.2e}")
if rel > 1e-5:
    fail(f"wlb4d's loss {wlb_val} differs from the reference's {ref_val} (relative {rel:.2e} > 1e-5)")
# The scaling must matter at these positions, or the check above proves nothing about it:
# the same weights imported without it give another loss.
shutil.copytree("llama32", "unscaled")
cfg_u = dict(cfg, rope_scaling=None)
json.dump(cfg_u, open("unscaled/config.json", "w"))
run([ckpt, "import-hf", "unscaled", "unscaled.h5"])
unscaled = val_run(["--checkpoint.init_from=unscaled.h5"], "val_unscaled",
                   [f for f in model_flags if not f.startswith("--model.rope_") or f.startswith("--model.rope_theta")])
if abs(unscaled - ref_val) / abs(ref_val) < 1e-4:
    fail(f"switching the llama3 scaling off leaves the loss at {unscaled}: the check does not see the scaling")

# 3. Layouts.
train = base + ["--train.steps=6", "--train.print_every=1", "--checkpoint.init_from=imported.h5",
                "--checkpoint.at_end=false"]
run([wlb4d] + train + ["--checkpoint.dir=l1", "--log.csv_file=l1.csv"])
run([mpiexec, "-n", "4", wlb4d] + train + ["--parallel.pp=2", "--parallel.tp=2", "--checkpoint.dir=l2",
                                            "--log.csv_file=l2.csv"])
run([mpiexec, "-n", "4", wlb4d] + train + ["--parallel.pp=2", "--parallel.dp=2", "--parallel.zero=1",
                                            "--comm.bucket_mib=0.05",
                                            "--checkpoint.dir=l3", "--log.csv_file=l3.csv"])
l1, l2, l3 = (column(f"{n}.csv", "loss") for n in ("l1", "l2", "l3"))


def close(a, b):
    return len(a) == len(b) == 6 and all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b))


if not close(l1, l2):
    fail(f"pp=2 x tp=2 losses {l2} differ from 1 rank's {l1}")
if not close(l1, l3):
    fail(f"pp=2 x dp=2 ZeRO-1 losses {l3} differ from 1 rank's {l1}")
if l1[-1] >= l1[0]:
    fail(f"the loss does not fall while training from the import: {l1}")
print(f"hf_llama3_import_check: 1 rank = pp=2 x tp=2 = pp=2 x dp=2 ZeRO-1 (buckets): {l1}")

# 4. Save on pp=2 x tp=2 at step 3, resume on 1 rank.
run([mpiexec, "-n", "4", wlb4d] + base + ["--train.steps=3", "--checkpoint.init_from=imported.h5",
                                           "--parallel.pp=2", "--parallel.tp=2", "--checkpoint.dir=r",
                                           "--checkpoint.at_end=true", "--log.csv_file=r1.csv"])
with h5py.File("r/step_000003.h5", "r") as f:
    if "lm_head.weight" in f["model"] or "embed.weight" not in f["optim/m"]:
        fail("the pp=2 checkpoint of the tied model has an lm_head.weight or lacks embed.weight's moments")
run([wlb4d] + base[:3] + model_flags + ["--train.steps=6", "--train.print_every=1", "--checkpoint.dir=r",
                                        "--checkpoint.resume=auto", "--checkpoint.at_end=false", "--log.csv_file=r2.csv"])
resumed = column("r1.csv", "loss") + column("r2.csv", "loss")
if not close(l1, resumed):
    fail(f"saved on pp=2 x tp=2 and resumed on 1 rank: {resumed}, uninterrupted: {l1}")
print("hf_llama3_import_check: saved on pp=2 x tp=2 at step 3, resumed on 1 rank: the same losses")

# 5. Export of the import.
run([ckpt, "export-hf", "imported.h5", "exported", "--dtype", "fp32"])
ec = json.load(open("exported/config.json"))
if ec.get("tie_word_embeddings") is not True or ec.get("rope_scaling") != ROPE:
    fail(f"export: tie_word_embeddings {ec.get('tie_word_embeddings')}, rope_scaling {ec.get('rope_scaling')}")
et, _ = read_safetensors("exported/model.safetensors")
if "lm_head.weight" in et:
    fail("export of a tied model wrote lm_head.weight")
src_t, _ = read_safetensors("llama32/model.safetensors")
if any((et[k] != src_t[k]).any() for k in src_t):
    fail("export of the import differs from the source weights")
print("hf_llama3_import_check: ok")
