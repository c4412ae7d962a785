#!/usr/bin/env python3
"""Every pair of training features, through `wlb4d`, against the 1-rank run.

Features are where layouts meet: ZeRO-1 alone passed its tests and crashed as
soon as a gradient bucket was cut unevenly by a ZeRO range. This check runs
each pair of the features below on the smallest layout both need (dp, pp, cp,
tp each the larger of the two; 2 or 4 ranks), on a model large enough that
comm.bucket_mib cuts its gradients into several buckets of more than MPICH's
long-message size (512 KiB: the pairwise reduce-scatter), and compares the
per-step loss and global gradient norm of the timing CSV with those of the
1-rank run of the same numerics (fp32 or bf16):

  loss         rtol 1e-5 (fp32), 1e-4 (bf16, with or without bf16 gradient
               reduction; measured worst 1.7e-5, bf16 reduction on dp2 x cp2)
  grad norm    rtol 1e-4 (fp32; the parameters agree to ~1e-5 after a step),
               2^-8 = 3.9e-3 (bf16: its unit roundoff u; another layout splits
               the micro-batches and GEMMs differently, so other partial sums
               are rounded to bf16, which can move the norm by up to about u.
               Measured worst 2.9e-3 with OpenBLAS's Haswell kernel, where the
               host BLAS attention path runs, single-threaded as under ctest;
               2.3e-4 with the generic kernel and the portable attention path)

A pair that a rule of wlb4d forbids must be refused: non-zero exit with a
"deck error:" naming both keys, said once for every rank (REFUSED lists them with the rule).
A pair that sets one key two ways (zb1 and interleaved are both schedules;
full and selective are both recompute modes) is not a pair and is skipped.
Any other failure, a refusal not listed, or a listed refusal that runs, fails.

  feature_pairs_check.py --wlb4d EXE --mpiexec MPIEXEC --data tiny-train.h5 --deck inputs/ci-base.ini
                         [--only zero,buckets] [--steps 4] [--keep DIR]
Exit 0 when every pair passes; the table printed names each pair, its layout,
its result and its worst relative difference.
"""
import argparse
import csv
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

# name: (overrides, layout needs {dp, pp, cp, tp}, numerics)
FEATURES = {
    "zero": (["--parallel.zero=1"], {"dp": 2}, None),
    "buckets": (["--comm.bucket_mib=0.75"], {"dp": 2}, None),
    "sp": (["--parallel.sequence_parallel=true"], {"tp": 2}, None),
    "recompute_full": (["--model.recompute=full"], {}, None),
    "recompute_selective": (["--model.recompute=selective"], {}, None),
    "zb1": (["--parallel.schedule=zb1"], {"pp": 2}, None),
    "interleaved": (["--parallel.schedule=interleaved", "--parallel.virtual_stages=2"], {"pp": 2}, None),
    "bf16": (["--train.precision=bf16"], {}, "bf16"),
    "bf16_reduce": (["--train.precision=bf16", "--comm.grad_reduce_dtype=bf16"], {"dp": 2}, "bf16_reduce"),
    "disaggregated": (["--balance.attention=disaggregated"], {"dp": 2}, None),
    "cp_adaptive": (["--balance.sharding=adaptive"], {"cp": 2}, None),
}
# A lone feature with no layout of its own runs on dp=2 (a pair must be multi-rank).
DEFAULT_LAYOUT = {"dp": 2}
# Same key set two ways: not a combination.
SAME_KEY = [{"zb1", "interleaved"}, {"recompute_full", "recompute_selective"}]
# Pairs a rule forbids: the message wlb4d must print (a regex) on every rank.
REFUSED = {
    frozenset({"zero", "bf16_reduce"}): r"comm\.grad_reduce_dtype=bf16 needs parallel\.zero=0",
}
# The model: 4 layers (pp=2 x 2 virtual stages), d_model 128: ~0.8 M parameters,
# so buckets of 0.75 MiB (196608 fp32) give 4-5 buckets per rank above 512 KiB.
MODEL = ["--model.layers=4", "--model.d_model=128", "--model.heads=4", "--model.kv_heads=2",
         "--model.ffn_hidden=344"]
COMMON = ["--optim.eps=1e-6", "--balance.packer=fixed", "--balance.sharding=sequence", "--train.print_every=1",
          "--checkpoint.at_end=false", "--checkpoint.resume=never", "--log.timing_file="]
BF16_U = 2.0 ** -8  # bf16's unit roundoff (8 significand bits)
TOL = {None: (1e-5, 1e-4), "bf16": (1e-4, BF16_U), "bf16_reduce": (1e-4, BF16_U)}


def read_csv(path):
    """step -> (loss, grad_norm); every rank writes a row, all must agree on the loss."""
    out = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            s = int(row["step"])
            v = (float(row["loss"]), float(row["grad_norm"]))
            if s in out and out[s][0] != v[0]:
                raise ValueError(f"{path}: ranks disagree on the loss of step {s}: {out[s][0]} vs {v[0]}")
            out[s] = v
    return out


def run(a, name, ranks, overrides, workdir):
    csv_path = os.path.join(workdir, name + ".csv")
    if os.path.exists(csv_path):
        os.remove(csv_path)
    cmd = [a.mpiexec, "-n", str(ranks), a.wlb4d, a.deck, f"--data.train={a.data}", f"--train.steps={a.steps}",
           f"--log.csv_file={csv_path}", f"--checkpoint.dir={os.path.join(workdir, name + '.ckpt')}"]
    # One value per key, the last given winning (the pair's features override COMMON).
    merged = {}
    for o in MODEL + COMMON + overrides:
        k, v = o.split("=", 1)
        merged.pop(k, None)
        merged[k] = v
    cmd += [f"{k}={v}" for k, v in merged.items()]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=a.timeout)
        rc, text = p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        rc, text = "timeout", (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    return rc, text, csv_path, time.time() - t0, cmd


def layout_of(feats):
    lay = {"dp": 1, "pp": 1, "cp": 1, "tp": 1}
    for f in feats:
        for k, v in FEATURES[f][1].items():
            lay[k] = max(lay[k], v)
    if all(v == 1 for v in lay.values()):
        lay.update(DEFAULT_LAYOUT)
    return lay


def numerics_of(feats):
    kinds = {FEATURES[f][2] for f in feats} - {None}
    return "bf16_reduce" if "bf16_reduce" in kinds else ("bf16" if "bf16" in kinds else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wlb4d", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--data", required=True, help="token dataset (wlb4d-prep output)")
    ap.add_argument("--deck", required=True, help="base deck (inputs/ci-base.ini)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--timeout", type=int, default=120, help="seconds per run (a timeout is a failure)")
    ap.add_argument("--only", default="", help="comma-separated features: only pairs within them")
    ap.add_argument("--keep", help="work in this directory and keep it")
    a = ap.parse_args()
    a.wlb4d, a.data, a.deck = (os.path.abspath(x) for x in (a.wlb4d, a.data, a.deck))
    names = [f for f in FEATURES if not a.only or f in a.only.split(",")]
    workdir = a.keep or tempfile.mkdtemp(prefix="wlb4d-pairs-")
    os.makedirs(workdir, exist_ok=True)

    refs = {}
    for kind, ov in ((None, []), ("bf16", ["--train.precision=bf16"])):
        rc, text, path, dt, _ = run(a, "ref-" + (kind or "fp32"), 1, ov, workdir)
        if rc != 0:
            print(text)
            print(f"FAIL: the 1-rank reference ({kind or 'fp32'}) exited {rc}")
            return 1
        refs[kind] = read_csv(path)
        print(f"reference {kind or 'fp32'}: 1 rank, {dt:.1f} s, losses "
              + " ".join(f"{refs[kind][s][0]:.6f}" for s in sorted(refs[kind])))
    refs["bf16_reduce"] = refs["bf16"]

    failures, rows = [], []
    for f1, f2 in itertools.combinations(names, 2):
        pair = {f1, f2}
        tag = f"{f1}+{f2}"
        if pair in SAME_KEY:
            rows.append((tag, "-", "skipped (one key set two ways)", ""))
            continue
        lay = layout_of(pair)
        ranks = lay["dp"] * lay["pp"] * lay["cp"] * lay["tp"]
        ov = [f"--parallel.{k}={v}" for k, v in lay.items()]
        for f in (f1, f2):
            ov += FEATURES[f][0]
        rc, text, path, dt, cmd = run(a, tag, ranks, ov, workdir)
        lay_s = "dp{dp} pp{pp} cp{cp} tp{tp}".format(**lay)
        rule = REFUSED.get(frozenset(pair))
        if rule:
            # Every rank refuses; the message is said once, by rank 0, for all.
            said = len(re.findall(r"deck error: .*" + rule, text))
            ok = rc == 2 and said == 1
            rows.append((tag, lay_s, f"refused ({dt:.1f} s)" if ok else f"NOT REFUSED rc={rc}", ""))
            if not ok:
                failures.append((tag, f"expected exit 2 and one refusal matching '{rule}' for all {ranks} ranks; "
                                      f"rc={rc}, said {said} times", text, cmd))
            continue
        if rc != 0:
            rows.append((tag, lay_s, f"FAILED rc={rc} ({dt:.1f} s)", ""))
            failures.append((tag, f"exited {rc}", text, cmd))
            continue
        got, ref = read_csv(path), refs[numerics_of(pair)]
        tl, tg = TOL[numerics_of(pair)]
        worst_l = worst_g = 0.0
        bad = []
        for s in sorted(ref):
            if s not in got:
                bad.append(f"step {s} missing")
                continue
            dl = abs(got[s][0] - ref[s][0]) / abs(ref[s][0])
            dg = abs(got[s][1] - ref[s][1]) / max(abs(ref[s][1]), 1e-30)
            worst_l, worst_g = max(worst_l, dl), max(worst_g, dg)
            if dl > tl:
                bad.append(f"step {s} loss {got[s][0]:.8f} vs 1 rank {ref[s][0]:.8f} (rel {dl:.1e} > {tl:g})")
            if dg > tg:
                bad.append(f"step {s} grad norm {got[s][1]:.8f} vs 1 rank {ref[s][1]:.8f} (rel {dg:.1e} > {tg:g})")
        rows.append((tag, lay_s, ("ok" if not bad else "MISMATCH") + f" ({dt:.1f} s)",
                     f"loss {worst_l:.1e}, grad norm {worst_g:.1e}"))
        if bad:
            failures.append((tag, "; ".join(bad), "", cmd))

    w = max(len(r[0]) for r in rows) if rows else 10
    for tag, lay, res, diff in rows:
        print(f"{tag:<{w}}  {lay:<16} {res:<34} {diff}")
    for tag, why, text, cmd in failures:
        print(f"\nFAIL {tag}: {why}\n  command: {' '.join(cmd)}")
        if text:
            print("  output (last 15 lines):\n    " + "\n    ".join(text.strip().splitlines()[-15:]))
    n_run = sum(1 for r in rows if not r[2].startswith("skipped"))
    print(f"\n{n_run - len(failures)}/{n_run} pairs pass ({len(rows) - n_run} skipped: one key set two ways)")
    if not a.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
