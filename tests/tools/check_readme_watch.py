#!/usr/bin/env python3
"""README's "Watching a run" section, run as written where it can run.

    check_readme_watch.py SOURCE_DIR BUILD_DIR WORKDIR

Every command line of the section's ```bash blocks runs in order, with bash,
in WORKDIR, where `build`, `tests` and `inputs` stand for BUILD_DIR and the
repository's folders (the commands are written for the repository root
after scripts/build.sh), except the ones that need what this machine lacks:
`tensorboard` (a server, and the package), `nsys`/`nsys-ui` (a GPU build, a
GPU and Nsight Systems), reported as skipped. At least one command of each
kind must be there, and every runnable one must exit 0. Then the files the
section promises must be what it says: runs/watch/timing.trace.json checked
by chrome_trace_check.py against runs/watch/timing.h5's /trace, and
runs/watch/tb's event file by tensorboard_check.py against the CSV.
Exit 77 without h5py/numpy.
"""
import os
import re
import shutil
import subprocess
import sys

src, build, work = sys.argv[1:4]
try:
    import h5py  # noqa: F401
    import numpy  # noqa: F401
except ImportError:
    print("check_readme_watch: h5py/numpy not installed: skipped")
    sys.exit(77)
text = open(os.path.join(src, "README.md")).read()
m = re.search(r"^## Watching a run\n(.*?)(?=^## )", text, re.S | re.M)
if not m:
    sys.exit("check_readme_watch: README.md has no section '## Watching a run'")
blocks = re.findall(r"```bash\n(.*?)```", m.group(1), re.S)
lines = [l.strip() for b in blocks for l in b.splitlines() if l.strip() and not l.strip().startswith("#")]
NEEDS = {"tensorboard": "the tensorboard package", "nsys": "a GPU and Nsight Systems",
         "nsys-ui": "Nsight Systems' GUI"}

shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
os.symlink(os.path.abspath(build), os.path.join(work, "build"))
for d in ("tests", "inputs"):
    os.symlink(os.path.join(src, d), os.path.join(work, d))
ran, skipped = 0, set()
for line in lines:
    words = [w for w in line.split() if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w)]
    need = next((NEEDS[w] for w in words if w in NEEDS), None)
    if need:
        skipped.add(next(w for w in words if w in NEEDS))
        print(f"skipped (needs {need}): {line}")
        continue
    r = subprocess.run(["bash", "-c", line], cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       errors="replace")
    print(f"$ {line}\n{r.stdout[-1500:]}", end="")
    if r.returncode != 0:
        sys.exit(f"check_readme_watch: README command failed (rc {r.returncode}): {line}")
    ran += 1
# The tensorboard and Nsight commands live in docs/operations.md (blocks that
# doc_walk lists as needing those programs); this section must run here.
if not ran:
    sys.exit(f"check_readme_watch: expected runnable commands (ran {ran}, skipped {sorted(skipped)})")
tools = os.path.join(src, "tests", "tools")
w = os.path.join(work, "runs", "watch")
for cmd in ([sys.executable, os.path.join(tools, "chrome_trace_check.py"), os.path.join(w, "timing.trace.json"),
             os.path.join(w, "timing.h5"), "--expect", "F", "--expect", "optimizer"],
            [sys.executable, os.path.join(tools, "tensorboard_check.py"), os.path.join(w, "tb"),
             os.path.join(w, "timing.csv"), "--starts", "1"]):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(r.stdout, end="")
    if r.returncode != 0:
        sys.exit(f"check_readme_watch: {os.path.basename(cmd[1])} failed on the README run's files")
print(f"check_readme_watch: ok ({ran} commands run, {len(lines) - ran} skipped)")
