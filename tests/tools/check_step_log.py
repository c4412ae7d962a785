#!/usr/bin/env python3
"""check_step_log.py — checks the step-line columns of a wlb4d timing CSV
(log.csv_file) against quantities recomputed here from the other columns.

Usage: check_step_log.py LOG.csv --ranks N --peak-tflops P

Per step (rows of every rank):
  tokens_seen  = running sum of the steps' tokens (a fresh run)
  t_total      = the step alone: >= Σ of its parts (plan .. optimizer; they are
                 timed inside it) and, on a step with evaluation, < Σ parts +
                 t_eval / 2 (evaluation is not part of it)
  elapsed      nondecreasing per rank, and >= Σ over steps so far of
               t_total + t_eval + t_checkpoint (all of it is inside elapsed)
  mfu          = gflops · 1e9 / ranks / (P · 1e12), or -1 when P = 0
  rss_mib      > 0
At least one step must have had an evaluation and one a checkpoint, so the
separation is exercised. Exit 0 when all hold, 1 with the failures listed.
"""
import argparse
import csv
import sys
from collections import defaultdict

PARTS = ["t_plan", "t_data", "t_forward", "t_backward", "t_p2p_wait", "t_tp_comm", "t_cp_comm",
         "t_dp_reduce", "t_optimizer"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--peak-tflops", type=float, required=True)
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    bad = []
    by_step = defaultdict(list)
    for r in rows:
        by_step[int(r["step"])].append(r)
    seen, evals, ckpts = 0, 0, 0
    inside = defaultdict(float)   # per rank: Σ t_total + t_eval + t_checkpoint so far
    last_elapsed = defaultdict(float)
    for s in sorted(by_step):
        rs = by_step[s]
        if len(rs) != a.ranks:
            bad.append(f"step {s}: {len(rs)} rows, expected {a.ranks}")
        seen += int(rs[0]["tokens"])
        for r in rs:
            k = int(r["rank"])
            parts = sum(r[p] for p in PARTS)
            if int(r["tokens_seen"]) != seen:
                bad.append(f"step {s} rank {k}: tokens_seen {int(r['tokens_seen'])} != running sum {seen}")
            if r["t_total"] < parts - 1e-6:
                bad.append(f"step {s} rank {k}: t_total {r['t_total']:.6f} < sum of its parts {parts:.6f}")
            if r["t_eval"] > 0:
                evals += 1
                if r["t_total"] >= parts + 0.5 * r["t_eval"]:
                    bad.append(f"step {s} rank {k}: t_total {r['t_total']:.6f} includes evaluation "
                               f"(parts {parts:.6f}, t_eval {r['t_eval']:.6f})")
            if r["t_checkpoint"] > 0:
                ckpts += 1
            inside[k] += r["t_total"] + r["t_eval"] + r["t_checkpoint"]
            if r["elapsed"] < last_elapsed[k] or r["elapsed"] < inside[k] - 1e-6:
                bad.append(f"step {s} rank {k}: elapsed {r['elapsed']:.6f} (previous {last_elapsed[k]:.6f}, "
                           f"timed parts so far {inside[k]:.6f})")
            last_elapsed[k] = r["elapsed"]
            want = r["gflops"] * 1e9 / a.ranks / (a.peak_tflops * 1e12) if a.peak_tflops > 0 else -1.0
            if abs(r["mfu"] - want) > 1e-9 * max(1.0, abs(want)):
                bad.append(f"step {s} rank {k}: mfu {r['mfu']} != {want}")
            if r["rss_mib"] <= 0:
                bad.append(f"step {s} rank {k}: rss_mib {r['rss_mib']}")
    if evals == 0:
        bad.append("no step with an evaluation (t_eval > 0)")
    if ckpts == 0:
        bad.append("no step with a checkpoint (t_checkpoint > 0)")
    for b in bad:
        print("check_step_log: " + b)
    print(f"check_step_log: {len(by_step)} steps, {evals} evaluated rows, {ckpts} checkpoint rows, "
          f"{len(bad)} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
