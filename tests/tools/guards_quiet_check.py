#!/usr/bin/env python3
"""Neither guard fires on a healthy run, through the main executable.

  guards_quiet_check.py --wlb4d BIN --mpiexec MPIEXEC --deck DECK --workdir DIR --ranks N [--key=value ...]

Runs DECK on N ranks with the loss-spike guard (train.skip_spike_z=6, its
default window) and the straggler flag (log.straggler_factor=1.5,
log.straggler_steps=5) on, no fault injected, and checks
  * no step was skipped (timing CSV column skipped, and no "loss spike" line);
  * the guard's rule, recomputed here from the CSV's loss and grad_norm (an
    independent reference: z against the previous train.skip_spike_window
    values, judged from train.skip_spike_warmup on), stays below 6 too, and
    its largest z is printed (the margin the quickstart leaves);
  * no rank was named a straggler.
Extra --key=value arguments go to wlb4d (e.g. the data paths, the layout).
"""
import argparse
import csv
import math
import os
import subprocess
import sys

Z, WINDOW, WARMUP = 6.0, 64, 16


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wlb4d", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--deck", required=True)
    ap.add_argument("--workdir", default=".")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--name", default="guards-quiet")
    ap.add_argument("--timeout", type=int, default=1200)
    args, extra = ap.parse_known_args()
    csv_path = os.path.join(args.workdir, f"{args.name}.csv")
    if os.path.exists(csv_path):
        os.remove(csv_path)
    cmd = ([args.mpiexec, "-n", str(args.ranks)] if args.ranks > 1 else []) + [
        args.wlb4d, args.deck, f"--train.skip_spike_z={Z}", f"--train.skip_spike_window={WINDOW}",
        f"--train.skip_spike_warmup={WARMUP}", "--log.straggler_factor=1.5", "--log.straggler_steps=5",
        f"--log.csv_file={args.name}.csv", "--log.timing_file=", "--checkpoint.every=0",
        "--checkpoint.at_end=false", "--checkpoint.resume=never"] + extra
    p = subprocess.run(cmd, cwd=args.workdir, capture_output=True, text=True, timeout=args.timeout)
    log = p.stdout + p.stderr
    if p.returncode != 0:
        sys.exit(f"FAIL: exit {p.returncode}\n{log[-4000:]}")
    rows = {}
    with open(csv_path, newline="") as f:
        for r in csv.DictReader(f):
            if int(r["rank"]) == 0:
                rows[int(r["step"])] = r
    ok = True

    def check(cond, what):
        nonlocal ok
        print(("ok   " if cond else "FAIL ") + what)
        ok = ok and cond

    skipped = [s + 1 for s in sorted(rows) if rows[s]["skipped"] != "0"]
    check(not skipped and "loss spike" not in log, f"no update skipped in {len(rows)} steps (skipped: {skipped})")
    lw, gw, zmax = [], [], (0.0, 0.0, 0)

    def z(v, x):
        mean = sum(v) / len(v)
        sd = math.sqrt(sum((a - mean) ** 2 for a in v) / len(v))
        return (x - mean) / sd if sd > 0 else 0.0
    for s in sorted(rows):
        loss, gn = float(rows[s]["loss"]), float(rows[s]["grad_norm"])
        if len(lw) >= WARMUP:
            zl, zg = z(lw, loss), z(gw, gn)
            if max(zl, zg) > max(zmax[0], zmax[1]):
                zmax = (zl, zg, s + 1)
        lw.append(loss)
        gw.append(gn)
        del lw[:-WINDOW], gw[:-WINDOW]
    check(max(zmax[0], zmax[1]) < Z,
          f"reference z-scores stay below {Z}: largest at step {zmax[2]} (z loss {zmax[0]:.2f}, grad {zmax[1]:.2f})")
    named = [line for line in log.splitlines() if "straggler: rank" in line or "| straggler r" in line]
    check(not named, "no rank named a straggler" + ("" if not named else ": " + named[0][:300]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
