#!/usr/bin/env python3
"""check_regions.py — the trainer's Kokkos Tools regions, as recorded by
tests/tools/region_recorder.cpp (a stand-in for kokkos-tools' nvtx-connector:
the same push/pop calls become NVTX ranges in Nsight Systems).

Usage: check_regions.py LOG_PREFIX --steps N --micro-batches M
                        [--evals E] [--checkpoints C] [--samples S]

Reads the one file LOG_PREFIX.<pid> (one rank) whose lines are the paths of
the wlb4d regions open at each push ("wlb4d:step/wlb4d:plan") and checks:
  - no UNBALANCED line (every push popped, never a pop too many);
  - N "wlb4d:step" regions, and inside each step, in this order, exactly one
    plan, data, forward_backward, dp_reduce, optimizer (per step, counted);
  - inside forward_backward: M forward (wlb4d:F) and M backward (wlb4d:B)
    actions per step, nothing else than pipeline actions;
  - E "wlb4d:step/wlb4d:eval" regions (evaluation runs in the step), C
    top-level "wlb4d:checkpoint" and S top-level "wlb4d:sample" regions;
  - no other wlb4d region at the top level.
Exit 0 when all hold, 1 with the failures.
"""
import argparse
import glob
import sys
from collections import Counter


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prefix")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--micro-batches", type=int, required=True)
    ap.add_argument("--evals", type=int, default=0)
    ap.add_argument("--checkpoints", type=int, default=0)
    ap.add_argument("--samples", type=int, default=0)
    a = ap.parse_args()
    files = glob.glob(a.prefix + ".*")
    if len(files) != 1:
        print(f"check_regions: {len(files)} files {a.prefix}.<pid>, expected 1 (was the tool loaded?)")
        return 1
    lines = open(files[0]).read().split("\n")
    lines = [x for x in lines if x]
    bad = [x for x in lines if x.startswith("UNBALANCED")]
    n = Counter(lines)
    step, fb = "wlb4d:step", "wlb4d:step/wlb4d:forward_backward"
    want = {step: a.steps, "wlb4d:step/wlb4d:eval": a.evals, "wlb4d:checkpoint": a.checkpoints,
            "wlb4d:sample": a.samples, fb + "/wlb4d:F": a.steps * a.micro_batches,
            fb + "/wlb4d:B": a.steps * a.micro_batches}
    for p in ("plan", "data", "forward_backward", "dp_reduce", "optimizer"):
        want[f"{step}/wlb4d:{p}"] = a.steps
    for path, k in want.items():
        if n[path] != k:
            bad.append(f"{path}: {n[path]} regions, expected {k}")
    # Order of the phases inside every step.
    order, seen = ["plan", "data", "forward_backward", "dp_reduce", "optimizer"], []
    for x in lines + [step]:
        if x == step:
            if seen and seen != order:
                bad.append(f"phases of a step in the order {seen}")
            seen = []
        elif x.count("/") == 1 and x.startswith(step + "/") and x.split("/")[1][6:] in order:
            seen.append(x.split("/")[1][6:])
    for x in n:
        if x.startswith(fb + "/") and x.split("/")[2] not in ("wlb4d:F", "wlb4d:B", "wlb4d:W", "wlb4d:SendAct",
                                                             "wlb4d:RecvAct", "wlb4d:SendGrad", "wlb4d:RecvGrad"):
            bad.append(f"{x}: not a pipeline action inside forward_backward")
        if "/" not in x and x not in (step, "wlb4d:checkpoint", "wlb4d:sample") and not x.startswith("UNBALANCED"):
            bad.append(f"{x}: unexpected top-level region")
    for b in bad:
        print("check_regions: " + b)
    print(f"check_regions: {len(lines)} wlb4d regions, {len(bad)} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
