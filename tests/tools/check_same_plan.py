#!/usr/bin/env python3
"""check_same_plan.py A.csv B.csv [--from-step S] [--expect-differ]

Compares the plan-dependent columns of two wlb4d timing CSVs (log.csv_file)
bit for bit, as text (the CSV carries 17 significant digits, so equal text is
equal doubles): the loss, gradient norm and tokens of every step and rank, the
balance metrics of the plan (attention / CP imbalance, outlier delays) and the
latency imbalance (from the cost model). Wall-clock columns are ignored. Every step >= S present in A must be
present in B with the same values.

Exit 0 when all agree; 1 with the first differences listed. --expect-differ
inverts that: exit 0 when a column of the plan (not only the cost model's
latency imbalance) differs, 1 otherwise.
"""
import argparse, csv, sys

# What the plan decides (and the losses it leads to).
PLAN = ["loss", "grad_norm", "tokens", "local_tokens", "attn_imbalance", "cp_imbalance", "delay_mean", "delay_max",
        "tokens_seen"]
# Computed from the cost model itself: must agree too, but a difference here
# alone is not a different plan (--expect-differ ignores it).
MODEL = ["latency_imbalance"]

ap = argparse.ArgumentParser()
ap.add_argument("a")
ap.add_argument("b")
ap.add_argument("--from-step", type=int, default=0, help="compare the 0-based steps >= this one")
ap.add_argument("--expect-differ", action="store_true")
args = ap.parse_args()


def rows(path):
    out = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            if int(r["step"]) >= args.from_step:
                out[(int(r["step"]), int(r["rank"]))] = {k: r[k] for k in PLAN + MODEL}
    if not out:
        sys.exit(f"check_same_plan: {path}: no rows from step {args.from_step}")
    return out


a, b = rows(args.a), rows(args.b)
diffs = []
for key in sorted(a):
    if key not in b:
        diffs.append(f"step {key[0]} rank {key[1]}: in {args.a} only")
        continue
    for k in PLAN if args.expect_differ else PLAN + MODEL:
        if a[key][k] != b[key][k]:
            diffs.append(f"step {key[0]} rank {key[1]}: {k} {a[key][k]} vs {b[key][k]}")
if args.expect_differ:
    if diffs:
        print(f"check_same_plan: the runs planned differently, as expected ({len(diffs)} differences; first: {diffs[0]})")
        sys.exit(0)
    print(f"check_same_plan: {args.a} and {args.b} agree on all {len(a)} rows, but were expected to differ")
    sys.exit(1)
if diffs:
    print(f"check_same_plan: {args.a} and {args.b} differ ({len(diffs)} differences):")
    for d in diffs[:10]:
        print("  " + d)
    sys.exit(1)
print(f"check_same_plan: {len(a)} rows agree bit for bit")
