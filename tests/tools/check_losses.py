#!/usr/bin/env python3
"""Checks (or records) the per-step losses of a wlb4d timing CSV (log.csv_file).

  check_losses.py RUN.csv --expect REF.csv [--rtol R] [--from-step S]
      REF.csv has lines "step,loss" (1-based steps); each must match to the
      relative tolerance R. REF.csv may start with a header comment
      "# rtol=1e-5 ranks=2 [falls=0.8]" (inputs/ci-*.ref.csv): its rtol and
      falls are the defaults of --rtol and --falls. --from-step S checks only
      the reference steps >= S (a resumed run) and skips the falls check.
  check_losses.py RUN.csv --falls 0.8
      the mean loss of the last 5 steps must be <= 0.8 x the first step's loss.
  check_losses.py RUN.csv --against OTHER.csv [--rtol R]
      every step present in both runs must match to R.
  check_losses.py RUN.csv --record REF.csv [--ranks N] [--steps 1,10,20] [--also 11] [--note TEXT]
      (re)writes REF.csv from RUN.csv: keeps the header comment of an existing
      REF.csv (its ranks= set to N) or writes "# rtol=1e-5 ranks=N"; the steps
      are --steps, else those of the existing REF.csv, else 1, every 5th and
      the last; --also adds steps. An existing REF.csv that the run matches
      on the same steps to its rtol (same header) is left unchanged. Used by
      scripts/regen-references.sh.
Every rank writes a row per step; all rows of a step must agree.
"""
import argparse, csv, os, re, sys

ap = argparse.ArgumentParser()
ap.add_argument("run")
ap.add_argument("--expect")
ap.add_argument("--rtol", type=float, help="relative tolerance (default: the reference's rtol=, else 1e-5)")
ap.add_argument("--falls", type=float)
ap.add_argument("--from-step", type=int, default=0, help="check only reference steps >= this one")
ap.add_argument("--against", help="another run's CSV: every step present in both must match to --rtol")
ap.add_argument("--record", help="write this reference file from RUN.csv")
ap.add_argument("--ranks", type=int)
ap.add_argument("--steps", help="comma-separated steps to record")
ap.add_argument("--also", action="append", type=int, default=[], help="one more step to record")
ap.add_argument("--note", default="", help="second comment line of the recorded file")
a = ap.parse_args()


def read_run(path):
    loss, text = {}, {}
    with open(path) as f:
        for row in csv.DictReader(f):
            s = int(row["step"]) + 1
            v = float(row["loss"])
            if s in loss and abs(loss[s] - v) > 1e-6 * abs(v):
                sys.exit(f"{path}: step {s}: rows disagree on the loss ({loss[s]} vs {v})")
            loss[s], text[s] = v, row["loss"]
    if not loss:
        sys.exit(f"{path}: no rows")
    return loss, text


def read_ref(path):
    """(header dict, header line or None, [(step, loss)])"""
    header, hline, rows = {}, None, []
    with open(path) as f:
        for i, line in enumerate(f):
            line = line.strip()
            if i == 0 and line.startswith("#") and "=" in line:
                hline = line
                header = dict(re.findall(r"(\w+)=(\S+)", line))
                continue
            if not line or line.startswith("#") or line.startswith("step"):
                continue
            s, v = line.split(",")
            rows.append((int(s), float(v)))
    return header, hline, rows


loss, text = read_run(a.run)

if a.record:
    hline, old = None, []
    if os.path.exists(a.record):
        _, hline, old = read_ref(a.record)
    if hline is None:
        hline = "# rtol=1e-5 ranks=1"
    if a.ranks is not None:
        hline = re.sub(r"ranks=\S+", f"ranks={a.ranks}", hline) if "ranks=" in hline else f"{hline} ranks={a.ranks}"
    last = max(loss)
    if a.steps:
        steps = [int(s) for s in a.steps.split(",") if s]
    elif old:
        steps = [s for s, _ in old]
    else:
        steps = [1] + [s for s in range(5, last + 1, 5)] + [last]
    steps = sorted(set(steps) | set(a.also))
    missing = [s for s in steps if s not in loss]
    if missing:
        sys.exit(f"{a.run}: no loss for step(s) {missing} (the run has steps 1..{last})")
    # An unchanged build must not rewrite its references (a new date, other
    # digits): keep the file when it has these steps and the run matches
    # every one of them to the file's rtol.
    old_rtol = float(dict(re.findall(r"(\w+)=(\S+)", hline)).get("rtol", "1e-5"))
    old_hline = None
    if os.path.exists(a.record):
        _, old_hline, _ = read_ref(a.record)
    if old and [s for s, _ in old] == steps and old_hline == hline and all(
            abs(loss[s] - v) <= old_rtol * abs(v) for s, v in old):
        print(f"unchanged {a.record}: the run matches its {len(old)} steps to rtol {old_rtol:g}")
        sys.exit(0)
    with open(a.record, "w") as f:
        f.write(hline + "\n")
        if a.note:
            f.write("# " + a.note + "\n")
        for s in steps:
            f.write(f"{s},{text[s]}\n")
    print(f"wrote {a.record}: steps {','.join(map(str, steps))}")
    sys.exit(0)

ok = True
rtol = a.rtol
if a.expect:
    header, _, rows = read_ref(a.expect)
    if rtol is None and "rtol" in header:
        rtol = float(header["rtol"])
    if a.falls is None and "falls" in header and a.from_step <= 1:
        a.falls = float(header["falls"])
    if rtol is None:
        rtol = 1e-5
    checked = 0
    for s, v in rows:
        if s < a.from_step:
            continue
        got = loss.get(s)
        good = got is not None and abs(got - v) <= rtol * abs(v)
        print(f"step {s}: expected {v:.9f} got {got} (rtol {rtol:g}) {'ok' if good else 'MISMATCH'}")
        ok &= good
        checked += 1
    if not checked:
        print(f"{a.expect}: no reference step >= {a.from_step}")
        ok = False
if rtol is None:
    rtol = 1e-5
if a.against:
    other, _ = read_run(a.against)
    common = sorted(set(loss) & set(other))
    if not common:
        print("no common steps"); ok = False
    worst = 0.0
    for s in common:
        rel = abs(loss[s] - other[s]) / abs(other[s])
        worst = max(worst, rel)
        good = rel <= rtol
        print(f"step {s}: {loss[s]:.9f} vs {other[s]:.9f} {'ok' if good else 'MISMATCH'}")
        ok &= good
    if common:
        print(f"{len(common)} common steps, max relative difference {worst:.2e} (rtol {rtol:g})")
if a.falls is not None:
    steps = sorted(loss)
    first = loss[steps[0]]
    last = sum(loss[s] for s in steps[-5:]) / len(steps[-5:])
    good = last <= a.falls * first
    print(f"loss {first:.4f} -> {last:.4f} (must be <= {a.falls} x first): {'ok' if good else 'FAIL'}")
    ok &= good
sys.exit(0 if ok else 1)
