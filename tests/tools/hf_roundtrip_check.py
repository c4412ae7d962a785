#!/usr/bin/env python3
"""Hugging Face import and checkpoint.init_from through the executables.

  hf_roundtrip_check.py WLB4D WLB4D_PREP WLB4D_CKPT MPIEXEC SOURCE_DIR WORKDIR

1. wlb4d trains ci-tiny 8 steps with a padded vocabulary and writes a
   checkpoint; export-hf (fp32) -> import-hf --vocab-size (the padded rows
   come back as zeros) -> export-hf again: the two exports hold byte-identical
   tensors and the same config.json; import-hf prints the deck's [model].
2. The original checkpoint and the imported one each start a run
   (checkpoint.init_from, fresh optimizer, step 0): the losses of 6 steps are
   the same (the padding rows never reach the loss); the imported one on
   pp=2 x tp=2 (4 ranks) gives the 1-rank losses to 1e-5.
3. Bad input, each refused with a message naming the file and the field or
   tensor: a missing shard, a tensor of the wrong shape, an unknown dtype, a
   header that lies about its offsets, truncated data, an unsupported config
   field, a vocabulary smaller than config.json's; init_from together with
   resume=<path>; resuming a weights-only checkpoint.
"""
import argparse
import csv
import filecmp
import json
import os
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_llama_reference import read_safetensors  # noqa: E402

ap = argparse.ArgumentParser()
for name in ("wlb4d", "prep", "ckpt", "mpiexec", "src", "workdir"):
    ap.add_argument(name)
a = ap.parse_args()
deck = os.path.join(a.src, "inputs/ci-tiny.ini")


def run(cmd, ok=True):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if ok and r.returncode != 0:
        sys.exit(f"hf_roundtrip_check: failed (rc {r.returncode}): {' '.join(cmd)}\n{r.stdout}")
    return r


def fail(msg):
    sys.exit(f"hf_roundtrip_check: {msg}")


def losses(path):
    out = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            out[int(row["step"])] = float(row["loss"])
    return [out[k] for k in sorted(out)]


shutil.rmtree(a.workdir, ignore_errors=True)
os.makedirs(a.workdir)
os.chdir(a.workdir)
run([a.prep, "--input", os.path.join(a.src, "tests/data/tiny.jsonl"), "--output", "tiny-train.h5"])
PADDED = 300
run([a.wlb4d, deck, "--train.steps=8", f"--model.vocab_size={PADDED}", "--checkpoint.dir=ck",
     "--checkpoint.at_end=true"])

# 1. export -> import -> export
run([a.ckpt, "export-hf", "ck", "hf1", "--dtype", "fp32"])
out = run([a.ckpt, "import-hf", "hf1", "imported.h5", "--vocab-size", str(PADDED)]).stdout
print(out, end="")
for line in ["[model]", "layers = 2", "d_model = 64", "heads = 4", "kv_heads = 2", "ffn_hidden = 160",
             f"vocab_size = {PADDED}", "tokenizer bytes", f"{PADDED - 257} zero padding rows"]:
    if line not in out:
        fail(f"import-hf output lacks '{line}'")
verify = run([a.ckpt, "verify", "imported.h5"]).stdout
if "x 1 datasets" not in verify:
    fail(f"verify of the weights-only checkpoint: {verify}")
run([a.ckpt, "export-hf", "imported.h5", "hf2", "--dtype", "fp32"])
if json.load(open("hf1/config.json")) != json.load(open("hf2/config.json")):
    fail("config.json differs after export -> import -> export")
t1, _ = read_safetensors("hf1/model.safetensors")
t2, _ = read_safetensors("hf2/model.safetensors")
if set(t1) != set(t2) or any((t1[k] != t2[k]).any() for k in t1):
    fail("tensors differ after export -> import -> export")
if not filecmp.cmp("hf1/model.safetensors", "hf2/model.safetensors", shallow=False):
    fail("model.safetensors is not byte-identical after export -> import -> export")
if not filecmp.cmp("hf1/tokenizer.json", "hf2/tokenizer.json", shallow=False):
    fail("tokenizer.json differs after export -> import -> export")
print("hf_roundtrip_check: export -> import -> export: byte-identical weights, same config.json and tokenizer")

# 2. init_from: original vs imported, 1 rank and pp=2 x tp=2.
common = [deck, "--train.steps=6", "--train.print_every=1", f"--model.vocab_size={PADDED}",
          "--checkpoint.at_end=false", "--checkpoint.resume=never"]
run([a.wlb4d] + common + ["--checkpoint.init_from=ck/step_000008.h5", "--checkpoint.dir=ckA",
                          "--log.csv_file=a.csv"])
r = run([a.wlb4d] + common + ["--checkpoint.init_from=imported.h5", "--checkpoint.dir=ckB", "--log.csv_file=b.csv"])
if "initialised from imported.h5" not in r.stdout:
    fail("the init_from run does not say where its weights came from")
run([a.mpiexec, "-n", "4", a.wlb4d] + common + ["--parallel.pp=2", "--parallel.tp=2",
                                                 "--checkpoint.init_from=imported.h5", "--checkpoint.dir=ckC",
                                                 "--log.csv_file=c.csv"])
la, lb, lc = losses("a.csv"), losses("b.csv"), losses("c.csv")
if la != lb:
    fail(f"init_from the original {la} and the imported checkpoint {lb} give different losses")
if any(abs(x - y) > 1e-5 * abs(x) for x, y in zip(la, lc)) or len(lc) != len(la):
    fail(f"pp=2 x tp=2 from the imported checkpoint {lc} differs from 1 rank {la}")
run([a.wlb4d, deck, "--train.steps=1", f"--model.vocab_size={PADDED}", "--checkpoint.dir=ckD",
     "--checkpoint.at_end=false", "--checkpoint.resume=never", "--log.csv_file=d.csv"])
if abs(losses("d.csv")[0] - la[0]) < 1e-3:
    fail("the init_from run's first loss equals a fresh model's: the weights were not loaded")
print(f"hf_roundtrip_check: init_from original = init_from imported (1 rank) = pp=2 x tp=2: losses {la}")

# 3. Bad input.
def bad_copy(name):
    shutil.rmtree(name, ignore_errors=True)
    shutil.copytree("hf1", name)
    return name


def expect_refusal(cmd, pattern):
    for f in ("bad.h5", "bad.h5.tmp"):
        if os.path.exists(f):
            os.remove(f)
    r = run(cmd, ok=False)
    if r.returncode == 0 or pattern not in r.stdout:
        fail(f"{' '.join(cmd)}: rc {r.returncode}, expected an error with '{pattern}':\n{r.stdout}")
    if os.path.exists("bad.h5") or os.path.exists("bad.h5.tmp"):
        fail(f"{' '.join(cmd)}: a refused import left a checkpoint file behind")


def header_of(path):
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def rewrite(path, header, data):
    text = json.dumps(header).encode()
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + data)


imp = [a.ckpt, "import-hf"]
# a missing shard
d = "bad_shard"
run([a.ckpt, "export-hf", "ck", "sharded", "--dtype", "fp32", "--max-shard-size", "40KiB"])
shutil.rmtree(d, ignore_errors=True)
shutil.copytree("sharded", d)
os.remove(os.path.join(d, sorted(f for f in os.listdir(d) if f.startswith("model-"))[1]))
expect_refusal(imp + [d, "bad.h5"], "missing (named by model.safetensors.index.json)")
# wrong shape
d = bad_copy("bad_shapes")
h, data = header_of(f"{d}/model.safetensors")
h["model.norm.weight"]["shape"] = [2, 32]
rewrite(f"{d}/model.safetensors", h, data)
expect_refusal(imp + [d, "bad.h5"], "tensor 'model.norm.weight' has shape [2][32]")
# unknown dtype
d = bad_copy("bad_dtype")
h, data = header_of(f"{d}/model.safetensors")
h["model.norm.weight"]["dtype"] = "I32"
rewrite(f"{d}/model.safetensors", h, data)
expect_refusal(imp + [d, "bad.h5"], "model.norm.weight")
# offsets that lie
d = bad_copy("bad_offsets")
h, data = header_of(f"{d}/model.safetensors")
b, e = h["model.norm.weight"]["data_offsets"]
h["model.norm.weight"]["data_offsets"] = [b, e + 4]
rewrite(f"{d}/model.safetensors", h, data)
expect_refusal(imp + [d, "bad.h5"], "model.norm.weight")
# truncated data
d = bad_copy("bad_truncated")
blob = open(f"{d}/model.safetensors", "rb").read()
open(f"{d}/model.safetensors", "wb").write(blob[:-100])
expect_refusal(imp + [d, "bad.h5"], "model.safetensors")
# an unsupported config field
d = bad_copy("bad_config")
c = json.load(open(f"{d}/config.json"))
c["attention_bias"] = True
json.dump(c, open(f"{d}/config.json", "w"))
expect_refusal(imp + [d, "bad.h5"], "config.json: attention_bias = true is not supported")
c["attention_bias"] = False
c["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
json.dump(c, open(f"{d}/config.json", "w"))
expect_refusal(imp + [d, "bad.h5"], "config.json: rope_scaling")
# a vocabulary smaller than config.json's
expect_refusal(imp + ["hf1", "bad.h5", "--vocab-size", "100"], "--vocab-size 100 is smaller than")
# init_from with resume=<path>; resuming a weights-only checkpoint
r = run([a.wlb4d] + common[:-1] + ["--checkpoint.init_from=imported.h5", "--checkpoint.resume=ck/step_000008.h5"],
        ok=False)
if r.returncode == 0 or "checkpoint.init_from=imported.h5 and checkpoint.resume=ck/step_000008.h5 together" not in r.stdout:
    fail(f"init_from with resume=<path> was not refused:\n{r.stdout}")
r = run([a.wlb4d, deck, "--train.steps=2", f"--model.vocab_size={PADDED}", "--checkpoint.resume=imported.h5",
         "--checkpoint.dir=ckE"], ok=False)
if r.returncode == 0 or "weights-only checkpoint" not in r.stdout:
    fail(f"resuming a weights-only checkpoint was not refused:\n{r.stdout}")
print("hf_roundtrip_check: ok")
