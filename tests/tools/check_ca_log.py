#!/usr/bin/env python3
"""check_ca_log.py — checks a disaggregated-attention run of wlb4d
(balance.attention=disaggregated) against the same deck run on one
rank with local attention, from their timing CSVs (log.csv_file).

Usage: check_ca_log.py CA.csv --ranks N LOCAL.csv [--rtol 1e-5]

  - the loss of every step equals the 1-rank local run's within rtol (relative):
    moving query blocks must not change the numbers beyond rounding;
  - every row of CA.csv: ca_bytes >= 0, 0 <= ca_exposed <= t_total,
    ca_cost_before, ca_cost_after >= 0; some step moved bytes (ca_bytes > 0);
  - per step: the attention cost is conserved (sum over ranks of
    ca_cost_after == of ca_cost_before); the group imbalance after the
    assignment (ca_imbalance) is not above the one before
    (ca_imbalance_before), and strictly below where bytes moved; both >= 1;
  - LOCAL.csv has all ca_* columns 0.
Exit 0 when all hold, 1 with the failures listed.
"""
import argparse
import csv
import sys
from collections import defaultdict

CA = ["ca_cost_before", "ca_cost_after", "ca_imbalance_before", "ca_imbalance", "ca_bytes", "ca_exposed"]


def read(path):
    with open(path, newline="") as f:
        r = csv.DictReader(f)
        missing = [c for c in CA + ["loss", "step", "rank", "t_total"] if c not in (r.fieldnames or [])]
        if missing:
            sys.exit(f"check_ca_log: {path} has no column(s) {', '.join(missing)}")
        return [{k: float(v) for k, v in row.items()} for row in r]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ca_csv")
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("local_csv")
    ap.add_argument("--rtol", type=float, default=1e-5)
    a = ap.parse_args()
    ca, loc = read(a.ca_csv), read(a.local_csv)
    bad = []
    steps = defaultdict(list)
    for r in ca:
        steps[int(r["step"])].append(r)
    ref = {int(r["step"]): r["loss"] for r in loc}
    if sorted(steps) != sorted(ref):
        bad.append(f"steps differ: {sorted(steps)} vs local {sorted(ref)}")
    moved = 0.0
    for s, rows in sorted(steps.items()):
        if len(rows) != a.ranks:
            bad.append(f"step {s}: {len(rows)} rows, expected {a.ranks}")
        if s in ref and abs(rows[0]["loss"] - ref[s]) > a.rtol * abs(ref[s]):
            bad.append(f"step {s}: loss {rows[0]['loss']:.8g}, 1-rank local {ref[s]:.8g}")
        for r in rows:
            w = f"step {s} rank {int(r['rank'])}"
            if r["ca_bytes"] < 0 or r["ca_cost_before"] < 0 or r["ca_cost_after"] < 0:
                bad.append(f"{w}: negative ca column")
            if not (0 <= r["ca_exposed"] <= r["t_total"] + 1e-6):
                bad.append(f"{w}: ca_exposed {r['ca_exposed']:.6g} not in [0, t_total {r['t_total']:.6g}]")
            if min(r["ca_imbalance"], r["ca_imbalance_before"]) < 1 - 1e-9:
                bad.append(f"{w}: ca_imbalance {r['ca_imbalance']:.6g} < 1")
        before, after = rows[0]["ca_imbalance_before"], rows[0]["ca_imbalance"]
        b = sum(r["ca_bytes"] for r in rows)
        moved += b
        tb, ta = sum(r["ca_cost_before"] for r in rows), sum(r["ca_cost_after"] for r in rows)
        if abs(tb - ta) > 1e-9 * max(tb, 1e-300):
            bad.append(f"step {s}: attention cost not conserved: {tb:.9g} s before, {ta:.9g} s after")
        if after > before * (1 + 1e-12):
            bad.append(f"step {s}: group imbalance {after:.6g} after the assignment > {before:.6g} before")
        if b > 0 and not after < before:
            bad.append(f"step {s}: {b:.0f} bytes moved but the group imbalance did not drop ({before:.6g})")
    if moved <= 0:
        bad.append("no step moved any query block (ca_bytes is 0 everywhere)")
    for r in loc:
        if any(r[c] != 0 for c in CA):
            bad.append(f"local run step {int(r['step'])}: ca_* columns are not 0")
    if bad:
        print("check_ca_log: FAILED\n  " + "\n  ".join(bad[:40]))
        return 1
    print(f"check_ca_log: OK ({len(steps)} steps x {a.ranks} ranks, {moved / 2 / 1048576:.2f} MiB moved, "
          f"losses equal the 1-rank local run within {a.rtol:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
