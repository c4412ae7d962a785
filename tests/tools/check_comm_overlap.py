#!/usr/bin/env python3
"""check_comm_overlap.py — checks the communication-overlap columns of a wlb4d
timing CSV (log.csv_file): dp_exposed, dp_in_flight, tp_exposed, tp_in_flight
(seconds per step and rank; io/timing_log.hpp).

Usage: check_comm_overlap.py LOG.csv --ranks N [--dp plain|buckets] [--tp overlap]

Every row:
  0 <= dp_exposed <= dp_in_flight, 0 <= tp_exposed <= tp_in_flight (waited
  time lies inside the time a collective was outstanding)
  dp_in_flight, tp_in_flight, dp_exposed + tp_exposed <= t_total (all inside the step)
  dp_exposed <= t_dp_reduce (the waits happen in the reduction phase)
  tp_exposed == t_tp_comm (the same measured waits)
--dp plain:    dp_in_flight > 0 and == dp_exposed (one blocking reduction)
--dp buckets:  dp_in_flight > dp_exposed (buckets started during the backward)
--tp overlap:  tp_in_flight > tp_exposed (dX reductions in flight during dW GEMMs)
Exit 0 when all hold, 1 with the failures listed.
"""
import argparse
import csv
import sys
from collections import Counter

COLS = ["dp_exposed", "dp_in_flight", "tp_exposed", "tp_in_flight"]
EPS = 1e-9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--dp", choices=["plain", "buckets"])
    ap.add_argument("--tp", choices=["overlap"])
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLS if c not in (reader.fieldnames or [])]
        if missing:
            print(f"check_comm_overlap: {a.csv} has no column(s) {', '.join(missing)}")
            return 1
        rows = [{k: float(v) for k, v in r.items()} for r in reader]
    bad = []
    per_step = Counter(int(r["step"]) for r in rows)
    for s, n in sorted(per_step.items()):
        if n != a.ranks:
            bad.append(f"step {s}: {n} rows, expected {a.ranks}")
    for r in rows:
        w = f"step {int(r['step'])} rank {int(r['rank'])}"
        dx, df, tx, tf, tot = r["dp_exposed"], r["dp_in_flight"], r["tp_exposed"], r["tp_in_flight"], r["t_total"]
        if not (0 <= dx <= df + EPS):
            bad.append(f"{w}: dp_exposed {dx:.6g} not in [0, dp_in_flight {df:.6g}]")
        if not (0 <= tx <= tf + EPS):
            bad.append(f"{w}: tp_exposed {tx:.6g} not in [0, tp_in_flight {tf:.6g}]")
        for name, v in (("dp_in_flight", df), ("tp_in_flight", tf), ("dp_exposed + tp_exposed", dx + tx)):
            if v > tot + 1e-6:
                bad.append(f"{w}: {name} {v:.6g} > t_total {tot:.6g}")
        if dx > r["t_dp_reduce"] + 1e-6:
            bad.append(f"{w}: dp_exposed {dx:.6g} > t_dp_reduce {r['t_dp_reduce']:.6g}")
        if abs(tx - r["t_tp_comm"]) > 1e-12 + 1e-9 * tx:
            bad.append(f"{w}: tp_exposed {tx:.6g} != t_tp_comm {r['t_tp_comm']:.6g}")
        if a.dp == "plain" and not (df > 0 and abs(df - dx) <= 1e-12 + 1e-9 * df):
            bad.append(f"{w}: unbucketed reduction: dp_in_flight {df:.6g} must equal dp_exposed {dx:.6g} > 0")
        if a.dp == "buckets" and not df > dx:
            bad.append(f"{w}: buckets: dp_in_flight {df:.6g} must exceed dp_exposed {dx:.6g}")
        if a.tp == "overlap" and not tf > tx:
            bad.append(f"{w}: TP overlap: tp_in_flight {tf:.6g} must exceed tp_exposed {tx:.6g}")
    for b in bad[:30]:
        print("check_comm_overlap: " + b)
    n = len(rows)
    mean = {c: sum(r[c] for r in rows) / max(n, 1) * 1e3 for c in COLS}
    print(f"check_comm_overlap: {len(per_step)} steps, {n} rows, mean ms: " +
          ", ".join(f"{c} {mean[c]:.3f}" for c in COLS) + f"; {len(bad)} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
