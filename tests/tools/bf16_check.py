#!/usr/bin/env python3
"""train.precision = bf16 through the main executable (bf16 mixed precision).

  bf16_check.py --wlb4d BIN --deck DECK --workdir DIR [--steps N] [--every S]
                [--ranks R --mpiexec MPIEXEC] [--no-resume] [--concurrent]
                [--key=value ...]

Runs DECK for N steps in fp32 and in bf16 (checkpoint every S steps), then
  * bf16 really ran (its losses differ from fp32's) and the start-up line names
    the bf16 GEMM path;
  * step-1 loss: |bf16 - fp32| <= 1e-2 x fp32 (one forward: each GEMM adds a
    relative error of about 0.6 u, u = 2^-8, tests/unit/model/test_bf16.cpp);
  * last-step loss within 2% of fp32's (the issue's training criterion);
  * the step-S checkpoint records train_precision (the resume line names it);
  * resume bf16 -> bf16 from step S reproduces the uninterrupted bf16 run bit
    for bit (the copies are remade from the stored fp32 masters);
  * resume bf16 -> fp32 and fp32 -> bf16: steps S+1..N within 1e-2 relative of
    the uninterrupted run of the checkpoint's writer (only the GEMM rounding
    of the remaining steps differs).
Before it runs, the check removes what an earlier run of it (same deck and
step count) left in the workdir: <tag>-*.csv and ck-<tag>-* (tag
bf16check-<deck stem>-<steps>), so a CSV of an older build is never resumed onto.
--concurrent starts the fp32 and the bf16 run at once (two processes, one per
core; the 200-step check in scripts/test.sh) instead of one after the other.
Exit 0 when all hold; prints one line per check.
"""
import argparse
import csv
import os
import shutil
import subprocess
import sys
import time


def clear_outputs(workdir, tag):
    """Removes every file and checkpoint folder an earlier run of this check
    (same deck and step count) left in workdir: <tag>-*.csv and ck-<tag>-*.
    The resumed runs append to their CSV, so a stale one (another version's
    columns, or steps of another run) would be refused or mixed in; the
    uninterrupted runs' checkpoint.overwrite does not reach those files."""
    for name in os.listdir(workdir):
        path = os.path.join(workdir, name)
        if name.startswith(f"ck-{tag}-") and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif name.startswith(f"{tag}-") and name.endswith(".csv") and os.path.isfile(path):
            os.remove(path)


def losses(path):
    out = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if int(row.get("rank", 0)) != 0:
                continue
            out[int(row["step"])] = float(row["loss"])
    return out


def start(args, name, overrides):
    # This check's own CSV from an earlier ctest run in the same workdir is
    # replaced (checkpoint.overwrite), not refused as another run's outputs.
    cmd = [args.wlb4d, args.deck] + args.extra + overrides + ["--checkpoint.overwrite=true",
        f"--log.csv_file={name}.csv", "--log.timing_file=", f"--train.steps={args.steps}"]
    if args.ranks > 1:
        cmd = [args.mpiexec, "-n", str(args.ranks)] + cmd
    return subprocess.Popen(cmd, cwd=args.workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(args, name, p):
    try:
        log, _ = p.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        log, _ = p.communicate()
        sys.exit(f"FAIL {name}: no exit within {args.timeout} s\n{log[-4000:]}")
    if p.returncode != 0:
        sys.exit(f"FAIL {name}: exit {p.returncode}\n{log[-4000:]}")
    return losses(os.path.join(args.workdir, f"{name}.csv")), log


def run(args, name, overrides):
    return finish(args, name, start(args, name, overrides))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wlb4d", required=True)
    ap.add_argument("--deck", required=True)
    ap.add_argument("--workdir", default=".")
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--every", type=int, default=6)
    ap.add_argument("--final-rtol", type=float, default=0.02)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--no-resume", action="store_true")
    ap.add_argument("--concurrent", action="store_true")
    args, args.extra = ap.parse_known_args()  # the rest (--key=value) goes to wlb4d
    ok = True

    def check(cond, what):
        nonlocal ok
        print(("ok   " if cond else "FAIL ") + what)
        ok = ok and cond

    # Names carry the deck's stem and the step count: the ci-tiny, quickstart
    # and quickstart-200 checks share a workdir and run in parallel under ctest -j.
    tag = f"bf16check-{os.path.splitext(os.path.basename(args.deck))[0]}-{args.steps}"
    ck = {p: os.path.join(args.workdir, f"ck-{tag}-{p}") for p in ("fp32", "bf16")}
    clear_outputs(args.workdir, tag)
    runs = {}
    t0 = time.monotonic()
    for p in ("fp32", "bf16"):
        runs[p] = start(args, f"{tag}-{p}", [f"--train.precision={p}", f"--checkpoint.dir={ck[p]}",
                                                 f"--checkpoint.every={args.every}", "--checkpoint.keep=5",
                                                 "--checkpoint.resume=never"])
        if not args.concurrent:
            runs[p] = finish(args, f"{tag}-{p}", runs[p])
    if args.concurrent:
        runs = {p: finish(args, f"{tag}-{p}", q) for p, q in runs.items()}
    print(f"     fp32 and bf16 runs: {time.monotonic() - t0:.0f} s"
          + (" (concurrent)" if args.concurrent else " (one after the other)"))
    a, b = runs["fp32"][0], runs["bf16"][0]
    first, last = min(a), max(a)  # the CSV counts steps from 0
    check("bf16 GEMM:" in runs["bf16"][1] and "precision fp32" in runs["fp32"][1],
          "start-up lines name the precision and the bf16 GEMM path")
    check(any(a[s] != b[s] for s in a), "bf16 losses differ from fp32 (bf16 ran)")
    r1 = abs(b[first] - a[first]) / abs(a[first])
    check(r1 <= 1e-2, f"step 1: fp32 {a[first]:.6f} bf16 {b[first]:.6f} rel {r1:.2e} <= 1e-2")
    rl = abs(b[last] - a[last]) / abs(a[last])
    check(rl <= args.final_rtol,
          f"step {last + 1}: fp32 {a[last]:.6f} bf16 {b[last]:.6f} rel {rl:.2e} <= {args.final_rtol}")
    for s in sorted(a):
        if (s + 1) in (1, 50, 100, 200) or s == last:
            print(f"     step {s + 1:4d}: fp32 {a[s]:.6f} bf16 {b[s]:.6f}")
    if args.no_resume:
        return 0 if ok else 1
    S = args.every
    ckfile = lambda p: os.path.join(ck[p], f"step_{S:06d}.h5")
    for src, dst, exact in (("bf16", "bf16", True), ("bf16", "fp32", False), ("fp32", "bf16", False)):
        ref = runs[src][0]
        got, log = run(args, f"{tag}-{src}-to-{dst}",
                       [f"--train.precision={dst}", f"--checkpoint.resume={ckfile(src)}",
                        f"--checkpoint.dir={ck[src]}-{dst}", "--checkpoint.at_end=false"])
        check(f"precision {src}; continuing in {dst}" in log, f"resume {src} -> {dst}: the resume line names both")
        steps = sorted(got)  # 0-based: the step-S checkpoint resumes at index S (step S+1)
        check(steps == list(range(S, last + 1)), f"resume {src} -> {dst}: steps {S + 1}..{last + 1} ran")
        if exact:
            check(all(got[s] == ref[s] for s in steps), f"resume {src} -> {dst}: steps equal the uninterrupted run bit for bit")
        else:
            worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in steps)
            check(worst <= 1e-2, f"resume {src} -> {dst}: within {worst:.2e} <= 1e-2 of the uninterrupted {src} run")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
