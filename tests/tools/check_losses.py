#!/usr/bin/env python3
"""Checks the per-step losses of a wlb4d timing CSV (log.csv_file).

  check_losses.py RUN.csv --expect EXPECTED.csv [--rtol 1e-5]
      EXPECTED.csv has lines "step,loss" (1-based steps); each must match.
  check_losses.py RUN.csv --falls 0.8
      the mean loss of the last 5 steps must be <= 0.8 x the first step's loss.
Every rank writes a row per step; all rows of a step must agree.
"""
import argparse, csv, sys

ap = argparse.ArgumentParser()
ap.add_argument("run")
ap.add_argument("--expect")
ap.add_argument("--rtol", type=float, default=1e-5)
ap.add_argument("--falls", type=float)
ap.add_argument("--against", help="another run's CSV: every step present in both must match to --rtol")
a = ap.parse_args()

loss = {}
with open(a.run) as f:
    for row in csv.DictReader(f):
        s = int(row["step"]) + 1
        v = float(row["loss"])
        if s in loss and abs(loss[s] - v) > 1e-6 * abs(v):
            sys.exit(f"step {s}: ranks disagree on the loss ({loss[s]} vs {v})")
        loss[s] = v
if not loss:
    sys.exit(f"{a.run}: no rows")
ok = True
if a.expect:
    with open(a.expect) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#") or line.startswith("step"):
                continue
            s, v = line.split(",")
            s, v = int(s), float(v)
            got = loss.get(s)
            good = got is not None and abs(got - v) <= a.rtol * abs(v)
            print(f"step {s}: expected {v:.7f} got {got} {'ok' if good else 'MISMATCH'}")
            ok &= good
if a.against:
    other = {}
    with open(a.against) as f:
        for row in csv.DictReader(f):
            other[int(row["step"]) + 1] = float(row["loss"])
    common = sorted(set(loss) & set(other))
    if not common:
        print("no common steps"); ok = False
    for s in common:
        good = abs(loss[s] - other[s]) <= a.rtol * abs(other[s])
        print(f"step {s}: {loss[s]:.9f} vs {other[s]:.9f} {'ok' if good else 'MISMATCH'}")
        ok &= good
if a.falls is not None:
    steps = sorted(loss)
    first = loss[steps[0]]
    last = sum(loss[s] for s in steps[-5:]) / len(steps[-5:])
    good = last <= a.falls * first
    print(f"loss {first:.4f} -> {last:.4f} (must be <= {a.falls} x first): {'ok' if good else 'FAIL'}")
    ok &= good
sys.exit(0 if ok else 1)
