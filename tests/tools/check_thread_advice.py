#!/usr/bin/env python3
"""The OMP_WAIT_POLICY warning (thread advice) through wlb4d: runs `wlb4d DECK ...`
(the remaining arguments, one rank) with 2 OpenMP/Kokkos threads and 2
OpenBLAS threads, OMP_WAIT_POLICY unset, then =passive, then with 1 OpenBLAS
thread. The warning must appear in the first run exactly when, read
independently of wlb4d, the build's Kokkos runs OpenMP (its start-up line says
"kokkos OpenMP") and the loaded OpenBLAS is a pthreads build (the library the
loader resolves lies under an openblas-pthread folder, or is libopenblasp);
the other two runs must never warn."""
import os, re, subprocess, sys

cmd = sys.argv[1:]
WARN = "OMP_WAIT_POLICY=passive in the environment of every rank"

def run(extra):
    env = dict(os.environ, OMP_NUM_THREADS="2", KOKKOS_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2")
    env.pop("OMP_WAIT_POLICY", None)
    env.update(extra)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        sys.exit(f"check_thread_advice: wlb4d exited {out.returncode}:\n{text[-2000:]}")
    return text

def pthreads_openblas(exe):
    try:
        ldd = subprocess.run(["ldd", exe], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return None
    for line in ldd.splitlines():
        m = re.search(r"(libopenblas\S*)\s+=>\s+(\S+)", line)
        if m:
            real = os.path.realpath(m.group(2))
            return "pthread" in real or os.path.basename(real).startswith("libopenblasp")
    return None  # not OpenBLAS (or static): expect no warning

text = run({})
openmp = re.search(r"\| kokkos OpenMP \|", text) is not None
blas2 = re.search(r"OpenBLAS core \S+ \([^)]+\), 2 threads", text) is not None
pth = pthreads_openblas(cmd[0])
want = bool(openmp and blas2 and pth)
got = WARN in text
print(f"check_thread_advice: kokkos OpenMP {openmp}, OpenBLAS at 2 threads {blas2}, pthreads OpenBLAS {pth}: "
      f"warning expected {want}, seen {got}")
if want != got:
    sys.exit("check_thread_advice: FAIL (unset OMP_WAIT_POLICY)\n" + text[-3000:])
for extra, what in (({"OMP_WAIT_POLICY": "passive"}, "OMP_WAIT_POLICY=passive"),
                    ({"OPENBLAS_NUM_THREADS": "1"}, "OPENBLAS_NUM_THREADS=1")):
    t = run(extra)
    if WARN in t:
        sys.exit(f"check_thread_advice: FAIL: warned under {what}\n" + t[-3000:])
    print(f"check_thread_advice: no warning under {what}")
print("check_thread_advice: ok")
