#!/usr/bin/env python3
"""The start-up advice against tp > 1 on one small host (TP advice), through
wlb4d on 2 ranks: with parallel.tp=2 the warning appears exactly when this
host has fewer than 4 online cores per rank (train::kTpAdviceCoresPerRank,
computed here independently from os.sysconf), with dp=2 (tp=1) never; the
run itself succeeds either way (advice only).

  check_tp_advice.py MPIEXEC WLB4D DECK   (run where the deck's dataset is)
"""
import os
import subprocess
import sys

mpiexec, wlb4d, deck = sys.argv[1:4]
cores = os.sysconf("SC_NPROCESSORS_ONLN")
PATTERN = "tensor parallelism is not advised here"
fails = 0
for layout, expect in (("--parallel.tp=2", cores < 4 * 2), ("--parallel.dp=2", False)):
    cmd = [mpiexec, "-n", "2", wlb4d, deck, layout, "--train.steps=1", "--checkpoint.at_end=false",
           "--log.csv_file=", "--log.timing_file="]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    got = [ln for ln in out.splitlines() if PATTERN in ln]
    ok = r.returncode == 0 and bool(got) == expect and len(got) <= 1  # rank 0 only: one line
    print(f"{'ok' if ok else 'FAIL'}: {layout} on {cores} cores: warning {'expected' if expect else 'not expected'}, "
          f"{len(got)} line(s), exit {r.returncode}")
    for ln in got:
        print("  " + ln)
    if expect and got and "parallel.tp=2 with all 2 ranks on one host of" not in got[0]:
        print("FAIL: the warning does not name parallel.tp and the host's cores"); ok = False
    if not ok:
        print(out[-2000:])
        fails += 1
sys.exit(1 if fails else 0)
