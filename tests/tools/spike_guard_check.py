#!/usr/bin/env python3
"""The loss-spike guard (train.skip_spike_z) through the main executable.

  spike_guard_check.py --wlb4d BIN --mpiexec MPIEXEC --deck DECK --workdir DIR [--steps N] [--spike S]

Injects a spike with WLB4D_FAULT=spike:step=S:scale=1000 (the step's loss and
loss gradient x1000, every rank) into DECK (1 rank as given) and runs:
  one     1 rank, a checkpoint after every step, TensorBoard scalars;
  four    dp=2 x pp=2 on 4 ranks through mpiexec, checkpoint at the end;
  resumed 1 rank, resumed from one's checkpoint of step S-3 (before the spike:
          the window comes from the checkpoint), to the end;
  after   1 rank, resumed from one's checkpoint of step S+1 (after the skip).
Checks
  * one skips exactly step S (timing CSV column skipped), counts 1 skipped
    step from then on, and names it on its step line; its TensorBoard
    guard/skipped_steps equals the CSV's (tests/tools/tensorboard_check.py);
  * an independent reference of the guard's rule (z of the loss and the grad
    norm against the previous `window` steps' values, population std, judged
    from `warmup` values on; computed here from the CSV's loss and grad_norm)
    gives the same skipped steps;
  * the skip left the model and its AdamW moments unchanged: one's
    checkpoints of steps S and S+1 hold bit-identical /model and /optim;
  * four skips the same step on every rank, its losses equal one's to 1e-5
    relative and its final weights one's to 1e-4 (the layout contract);
  * resumed reproduces one's losses, grad norms and skip bit for bit (the
    window and the count were restored), after continues the count.
Exit 0 when all hold; prints one line per check.
"""
import argparse
import csv
import math
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

Z, WINDOW, WARMUP = 6.0, 8, 6
LR = 3e-3  # optim.lr of inputs/ci-base.ini (passed explicitly below)


def run(args, name, extra, ranks=1, fault=True):
    cmd = ([args.mpiexec, "-n", str(ranks)] if ranks > 1 else []) + [
        args.wlb4d, args.deck, f"--train.steps={args.steps}", f"--log.csv_file={name}.csv", "--log.timing_file=",
        f"--train.skip_spike_z={Z}", f"--train.skip_spike_window={WINDOW}", f"--train.skip_spike_warmup={WARMUP}",
        f"--checkpoint.dir=ck-{name}", "--train.print_every=100", f"--optim.lr={LR}"] + extra
    env = dict(os.environ)
    if fault:
        env["WLB4D_FAULT"] = f"spike:step={args.spike}:scale=1000"
    p = subprocess.run(cmd, cwd=args.workdir, capture_output=True, text=True, timeout=args.timeout, env=env)
    log = p.stdout + p.stderr
    if p.returncode != 0:
        sys.exit(f"FAIL {name}: exit {p.returncode}\n{log[-4000:]}")
    rows = {}
    with open(os.path.join(args.workdir, f"{name}.csv"), newline="") as f:
        for row in csv.DictReader(f):
            rows.setdefault(int(row["step"]), []).append(row)
    return rows, log


def ck(args, name, step):
    return os.path.join(args.workdir, f"ck-{name}", f"step_{step:06d}.h5")


def datasets(path, groups=("model", "optim")):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(n, obj):
            if isinstance(obj, h5py.Dataset):
                out[n] = obj[()]
        for g in groups:
            if g in f:
                f[g].visititems(lambda n, o, g=g: visit(g + "/" + n, o))
    return out


def reference_skips(rows):
    """Steps the guard's rule skips, from the loss and grad norm of each step (rank 0's row)."""
    lw, gw, skips = [], [], []
    for s in sorted(rows):
        r = rows[s][0]
        loss, gn = float(r["loss"]), float(r["grad_norm"])

        def z(v, x):
            mean = sum(v) / len(v)
            sd = math.sqrt(sum((a - mean) ** 2 for a in v) / len(v))
            return (x - mean) / sd if sd > 0 else 0.0
        if len(lw) >= WARMUP and (z(lw, loss) > Z or z(gw, gn) > Z):
            skips.append(s)
        lw.append(loss)
        gw.append(gn)
        del lw[:-WINDOW], gw[:-WINDOW]
    return skips


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wlb4d", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--ckpt", help="wlb4d-ckpt: verify the checkpoints holding the guard state and inspect one")
    ap.add_argument("--deck", required=True)
    ap.add_argument("--workdir", default=".")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--spike", type=int, default=14, help="0-based step of the injected spike")
    ap.add_argument("--timeout", type=int, default=300)
    args = ap.parse_args()
    S = args.spike
    for n in ("one", "four", "resumed", "after"):
        shutil.rmtree(os.path.join(args.workdir, f"ck-{n}"), ignore_errors=True)
    ok = True

    def check(cond, what):
        nonlocal ok
        print(("ok   " if cond else "FAIL ") + what)
        ok = ok and cond

    common = ["--checkpoint.resume=never", "--checkpoint.overwrite=true", "--checkpoint.at_end=true"]
    tb = os.path.join(args.workdir, "tb-one")
    shutil.rmtree(tb, ignore_errors=True)
    one, log1 = run(args, "one", common + ["--checkpoint.every=1", f"--checkpoint.keep={args.steps}",
                                           f"--log.tensorboard_dir={tb}"])
    skipped = [s for s in sorted(one) if one[s][0]["skipped"] == "1"]
    check(skipped == [S], f"1 rank skips exactly step {S + 1} (skipped steps {[s + 1 for s in skipped]})")
    check(all(int(one[s][0]["skipped_steps"]) == (1 if s >= S else 0) for s in one),
          "skipped_steps counts 0 before the spike and 1 from it on")
    check(f"step {S + 1}: loss spike" in log1 and "SKIPPED (z loss" in log1, "the skip is named on the log and step line")
    t = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tensorboard_check.py"),
                        tb, os.path.join(args.workdir, "one.csv"), "--guard", "--expect-tag", "guard/skipped_steps"],
                       capture_output=True, text=True)
    check(t.returncode == 0, "TensorBoard shows guard/skipped_steps equal to the CSV's at every step"
          + ("" if t.returncode == 0 else "\n" + t.stdout[-2000:]))
    ref = reference_skips(one)
    check(ref == skipped, f"independent z-score reference skips the same steps ({[s + 1 for s in ref]})")
    a, b = datasets(ck(args, "one", S)), datasets(ck(args, "one", S + 1))
    same = a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    check(same and len(a) > 0, f"weights and moments after step {S + 1} equal those after step {S} bit for bit "
          f"({len(a)} datasets)")

    four, _ = run(args, "four", common + ["--parallel.dp=2", "--parallel.pp=2"], ranks=4)
    sk4 = {s: {r["skipped"] for r in four[s]} for s in four}
    check(all(len(four[s]) == 4 for s in four) and all(sk4[s] == ({"1"} if s == S else {"0"}) for s in four),
          "dp=2 x pp=2 skips the same step on all 4 ranks")
    wl = max(abs(float(four[s][0]["loss"]) - float(one[s][0]["loss"])) / abs(float(one[s][0]["loss"])) for s in one)
    check(wl <= 1e-5, f"dp=2 x pp=2 losses within {wl:.1e} <= 1e-5 of 1 rank")
    w1 = datasets(ck(args, "one", args.steps), ("model",))
    w4 = datasets(ck(args, "four", args.steps), ("model",))
    # The layout tests' rule (tests/mpi/train/test_train_equiv.cpp): 1e-4
    # relative, or 1e-3 of one step's largest Adam move (lr).
    atol = 1e-3 * LR
    werr = max(float(np.max(np.abs(w4[k].astype(np.float64) - w1[k]) / (1e-4 * np.abs(w1[k]) + atol)))
               for k in w1) if w1.keys() == w4.keys() else 2
    check(werr <= 1, f"dp=2 x pp=2 final weights within {werr:.2f} of the bound 1e-4 |w| + 1e-3 lr of 1 rank "
          f"({len(w1)} tensors)")

    if args.ckpt:
        paths = [ck(args, "one", S + 1), ck(args, "four", args.steps)]
        v = [subprocess.run([args.ckpt, "verify", p], capture_output=True, text=True).returncode for p in paths]
        ins = subprocess.run([args.ckpt, "inspect", paths[0]], capture_output=True, text=True).stdout
        check(v == [0, 0] and f"skipped steps    1 (loss-spike guard; window of {WINDOW} steps stored)" in ins,
              "wlb4d-ckpt verifies the checkpoints (digest over the guard state) and inspect shows the count")

    res, _ = run(args, "resumed", [f"--checkpoint.resume={ck(args, 'one', S - 3)}", "--checkpoint.at_end=false"])
    exact = all(res[s][0]["loss"] == one[s][0]["loss"] and res[s][0]["grad_norm"] == one[s][0]["grad_norm"] and
                res[s][0]["skipped"] == one[s][0]["skipped"] for s in res)
    check(exact and min(res) == S - 3 and len(res) == args.steps - S + 3,
          f"resumed from step {S - 3}: steps {S - 2}..{args.steps} and the skip equal the uninterrupted run bit for bit")
    aft, _ = run(args, "after", [f"--checkpoint.resume={ck(args, 'one', S + 1)}", "--checkpoint.at_end=false"],
                 fault=False)
    check(all(r["skipped_steps"] == "1" for s in aft for r in aft[s]) and
          all(aft[s][0]["loss"] == one[s][0]["loss"] for s in aft),
          f"resumed after the skip: the count stays 1 and the losses equal the uninterrupted run's")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
