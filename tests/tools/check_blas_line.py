#!/usr/bin/env python3
"""Runs `wlb4d DECK ...` (the remaining arguments) and checks its BLAS start-up
line (the BLAS kernel check) against an independent reading of the CPU: the SIMD level
from /proc/cpuinfo's flags, the kernel's level from OpenBLAS's core name, and
the warning present exactly when the kernel is below the CPU. When the
environment sets OPENBLAS_CORETYPE, the reported core must be that one. The
environment is passed through unchanged (tests never set OPENBLAS_CORETYPE)."""
import os, re, subprocess, sys

LEVEL = {"sse": 1, "avx": 2, "avx2": 3, "avx-512": 4}
CORES = {"skylakex": 4, "cooperlake": 4, "sapphirerapids": 4, "haswell": 3, "zen": 3, "excavator": 3,
         "sandybridge": 2, "bulldozer": 2, "piledriver": 2, "steamroller": 2, "prescott": 1, "core2": 1,
         "penryn": 1, "dunnington": 1, "nehalem": 1, "atom": 1, "opteron": 1, "barcelona": 1}

def cpu_level():
    try:
        flags = set()
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        return 0
    if "avx512f" in flags: return 4
    if "avx2" in flags and "fma" in flags: return 3
    if "avx" in flags: return 2
    return 1 if flags else 0

out = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120)
text = out.stdout + out.stderr
if out.returncode != 0:
    sys.exit(f"check_blas_line: wlb4d exited {out.returncode}:\n{text[-2000:]}")
m = re.search(r"OpenBLAS core (\S+) \(([^)]+)\), (\d+) threads?; CPU: ([A-Za-z0-9-]+)", text)
if not m:
    if re.search(r"BLAS: not OpenBLAS", text):
        print("check_blas_line: not OpenBLAS (nothing to check)"); sys.exit(0)
    sys.exit("check_blas_line: no BLAS start-up line in:\n" + text[-2000:])
core, klevel, threads, clevel = m.groups()
want_cpu = cpu_level()
if want_cpu and LEVEL.get(clevel.lower()) != want_cpu:
    sys.exit(f"check_blas_line: CPU reported as {clevel}, /proc/cpuinfo says level {want_cpu}")
env = os.environ.get("OPENBLAS_CORETYPE")
if env and core.lower() != env.lower():
    sys.exit(f"check_blas_line: OPENBLAS_CORETYPE={env} but the reported core is {core}")
k = CORES.get(core.lower())
warned = "OPENBLAS_CORETYPE=" in text and "kernel '" in text
if k is not None and want_cpu:
    if (k < want_cpu) != warned:
        sys.exit(f"check_blas_line: kernel {core} (level {k}) on CPU level {want_cpu}: warning {'present' if warned else 'missing'}")
print(f"check_blas_line: OpenBLAS core {core} ({klevel}), {threads} thread(s), CPU {clevel}, warning {'yes' if warned else 'no'}: consistent")
