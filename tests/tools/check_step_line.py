#!/usr/bin/env python3
"""Runs wlb4d (1 rank) and checks its step and detail lines.

  check_step_line.py MODE WLB4D DECK [overrides...]

MODE:
  width        every step line is at most 175 characters from its timestamp on
               (an eval/ckpt/sample field, which a step shows only when it ran,
               not counted); the timestamp lies within the run's wall clock;
               'mem X%' is the detail line's 'mem N MiB' over this host's
               MemTotal (one rank), read here from /proc/meminfo.
  mfu-none     no plan.device, no log.peak_tflops: no MFU field, TFLOP/s/dev
               printed, start-up says MFU is not reported.
  mfu-h100-fp32, mfu-h100-bf16
               --plan.device=h100 (and --train.precision): MFU = TFLOP/s/dev /
               the H100 SXM datasheet peak typed here (fp32 67, bf16 1979/2).
  detail-0     --log.detail_every=0 given: no detail line.
  detail-4     --log.detail_every=4, print_every=1, 10 steps: detail lines at
               steps 1, 5, 9 and 10.
"""
import datetime
import re
import subprocess
import sys

mode, cmd = sys.argv[1], sys.argv[2:]
if mode == "mfu-h100-fp32":
    cmd += ["--plan.device=h100"]
elif mode == "mfu-h100-bf16":
    cmd += ["--plan.device=h100", "--train.precision=bf16"]
t0 = datetime.datetime.now().replace(microsecond=0)
run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=110)
t1 = datetime.datetime.now()
out = run.stdout
print(out)
if run.returncode != 0:
    sys.exit(f"check_step_line: wlb4d exited {run.returncode}")
TS = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]"
steps = [(m.group(0), m) for m in re.finditer(TS + r" step +(\d+)/(\d+) \|[^\n]*", out)]
details = [m for m in re.finditer(TS + r" detail +(\d+)/(\d+) \|[^\n]*", out)]
if not steps:
    sys.exit("check_step_line: no step line")
bad = []


def field(line, pattern):
    m = re.search(pattern, line)
    if not m:
        bad.append(f"no '{pattern}' in: {line}")
        return None
    return float(m.group(1))


if mode == "width":
    for line, m in steps:
        core = re.sub(r" \| (eval|ckpt|sample) \d+ ms", "", line)
        if len(core) > 175:
            bad.append(f"{len(core)} characters (> 175): {line}")
        ts = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
        if not (t0 <= ts <= t1):
            bad.append(f"timestamp {ts} outside the run ({t0} .. {t1})")
    mem_total = None
    for ln in open("/proc/meminfo"):
        if ln.startswith("MemTotal:"):
            mem_total = int(ln.split()[1]) * 1024
    last_step = steps[-1][0]
    last_detail = details[-1].group(0) if details else ""
    share = field(last_step, r"\| mem ([0-9.]+)% \|")
    mib = field(last_detail, r"\| mem (\d+) MiB of")
    if share is not None and mib is not None and mem_total:
        want = 100.0 * mib * 1048576 / mem_total
        # The detail's MiB is rounded to 1 MiB, the share to 0.1%.
        if abs(share - want) > 0.05 + 100.0 * 0.5 * 1048576 / mem_total:
            bad.append(f"mem {share}% but {mib} MiB of MemTotal {mem_total} B is {want:.3f}%")
elif mode.startswith("mfu-"):
    peak = {"mfu-h100-fp32": 67e12, "mfu-h100-bf16": 1979e12 / 2}.get(mode)
    if peak is None:
        if " MFU " in out.split("MFU not reported", 1)[-1] and any(" MFU " in l for l, _ in steps):
            bad.append("an MFU field without a peak")
        if "MFU not reported: no log.peak_tflops and no plan.device" not in out:
            bad.append("start-up does not say why there is no MFU")
        for line, _ in steps:
            field(line, r" ([0-9.e+-]+) TFLOP/s/dev")
    else:
        if "MFU against plan.device=h100" not in out:
            bad.append("start-up does not name plan.device=h100 as the MFU peak")
        for line, _ in steps:
            tf = field(line, r" ([0-9.e+-]+) TFLOP/s/dev")
            mfu = field(line, r" MFU ([0-9.e+-]+)%")
            if tf is not None and mfu is not None:
                want = 100.0 * tf * 1e12 / peak
                if abs(mfu / want - 1) > 0.015:  # both printed to 3 significant digits
                    bad.append(f"MFU {mfu}% but {tf} TFLOP/s over {peak:.4g} is {want:.4g}%")
elif mode.startswith("detail-"):
    got = [int(m.group(2)) for m in details]
    want = {"detail-0": [], "detail-4": [1, 5, 9, 10]}[mode]
    if got != want:
        bad.append(f"detail lines at steps {got}, want {want}")
    for m in details:
        if "compute min/mean/max" not in m.group(0) or "comm exposed/in flight" not in m.group(0):
            bad.append(f"detail line lacks the balance/communication fields: {m.group(0)}")
else:
    sys.exit(f"check_step_line: unknown mode {mode}")
if bad:
    sys.exit("check_step_line: " + "\n".join(bad))
print(f"check_step_line {mode}: OK ({len(steps)} step lines, {len(details)} detail lines)")
