#!/usr/bin/env python3
"""The straggler flag (log.straggler_factor) through mpiexec wlb4d.

  straggler_check.py --wlb4d BIN --mpiexec MPIEXEC --deck DECK --workdir DIR [--ranks N] [--slow R] [--steps K]

Runs DECK on N ranks at parallel.dp=N with log.straggler_factor=1.5 and
log.straggler_steps=K, world rank R slowed by WLB4D_FAULT=delay:rank=R:
phase=forward:ms=300 (every forward of every step sleeps 300 ms inside the
timed compute, a slow device). Checks
  * rank R is named by a warning with its grid coordinates at step K (the
    K-th consecutive slow step: within K steps), and on the step lines after;
  * no other rank is named;
  * the timing CSV agrees: rank R's forward+backward time is above 1.5x the
    median of the ranks in each of the first K steps (the reference the flag
    reads, recomputed here).
Exit 0 when all hold; prints one line per check.
"""
import argparse
import csv
import os
import re
import statistics
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wlb4d", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--deck", required=True)
    ap.add_argument("--workdir", default=".")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--slow", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=300)
    args = ap.parse_args()
    K, R = args.steps, args.slow
    env = dict(os.environ, WLB4D_FAULT=f"delay:rank={R}:phase=forward:ms=300")
    cmd = [args.mpiexec, "-n", str(args.ranks), args.wlb4d, args.deck, f"--parallel.dp={args.ranks}",
           "--parallel.pp=1", "--parallel.cp=1", "--parallel.tp=1", f"--train.steps={K + 2}",
           "--log.straggler_factor=1.5", f"--log.straggler_steps={K}", "--log.csv_file=straggler.csv",
           "--log.timing_file=", "--checkpoint.at_end=false", "--checkpoint.every=0", "--train.print_every=1"]
    p = subprocess.run(cmd, cwd=args.workdir, capture_output=True, text=True, timeout=args.timeout, env=env)
    log = p.stdout + p.stderr
    if p.returncode != 0:
        sys.exit(f"FAIL: exit {p.returncode}\n{log[-4000:]}")
    ok = True

    def check(cond, what):
        nonlocal ok
        print(("ok   " if cond else "FAIL ") + what)
        ok = ok and cond

    warns = re.findall(r"straggler: rank (\d+) \(dp=(\d+) pp=0 cp=0 tp=0\).*?for (\d+) consecutive steps \(step (\d+):",
                       log)
    check(any(int(w[0]) == R and int(w[1]) == R and int(w[3]) == K for w in warns),
          f"rank {R} (dp={R}) named at step {K} (warnings: {warns})")
    check(all(int(w[0]) == R for w in warns), "no other rank named")
    lines = [l for l in log.splitlines() if re.search(r"step +\d+/", l)]
    later = [l for l in lines if int(re.search(r"step +(\d+)/", l).group(1)) >= K]
    check(later and all(f"straggler r{R} " in l for l in later) and
          not any("straggler r" in l for l in lines if l not in later),
          f"the step lines from step {K} on name r{R}, the earlier ones nobody")
    t = {}
    with open(os.path.join(args.workdir, "straggler.csv"), newline="") as f:
        for row in csv.DictReader(f):
            t.setdefault(int(row["step"]), {})[int(row["rank"])] = float(row["t_forward"]) + float(row["t_backward"])
    ratios = [t[s][R] / statistics.median(t[s].values()) for s in range(K)]
    check(all(r > 1.5 for r in ratios), f"CSV: rank {R}'s compute / median in steps 1..{K}: "
          + ", ".join(f"{r:.1f}" for r in ratios))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
