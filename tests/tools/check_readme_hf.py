#!/usr/bin/env python3
"""README's "Using a trained model" and "Starting from pretrained weights"
sections, run as written.

    check_readme_hf.py SOURCE_DIR BUILD_DIR MPIEXEC WORKDIR

Every line of the sections' ```bash blocks runs in order, with bash, in
WORKDIR, where `build`, `tests` and `inputs` stand for BUILD_DIR and the
repository's folders (the commands are written for the repository root after
scripts/build.sh); `mpiexec` is MPIEXEC. Each must exit 0; then the files the
text promises must exist: the HF directory (config.json, model.safetensors,
tokenizer.json), the imported checkpoint, wlb4d-generate's speed line and
the continued run's log line "initialised from".
"""
import os
import re
import shutil
import subprocess
import sys

src, build, mpiexec, work = sys.argv[1:5]
text = open(os.path.join(src, "README.md")).read()


def section(title):
    m = re.search(r"^## " + re.escape(title) + r"\n(.*?)(?=^## )", text, re.S | re.M)
    if not m:
        sys.exit(f"check_readme_hf: README.md has no section '## {title}'")
    blocks = re.findall(r"```bash\n(.*?)```", m.group(1), re.S)
    lines = [l for b in blocks for l in b.splitlines() if l.strip() and not l.lstrip().startswith("#")]
    if not lines:
        sys.exit(f"check_readme_hf: section '{title}' has no commands")
    return lines


shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
os.symlink(os.path.abspath(build), os.path.join(work, "build"))
for d in ("tests", "inputs"):
    os.symlink(os.path.join(src, d), os.path.join(work, d))
out = ""
for title in ("Using a trained model", "Starting from pretrained weights"):
    for line in section(title):
        cmd = re.sub(r"^mpiexec\b", mpiexec, line)
        r = subprocess.run(["bash", "-c", cmd], cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace")
        print(f"$ {line}\n{r.stdout[-2000:]}", end="")
        if r.returncode != 0:
            sys.exit(f"check_readme_hf: README command failed (rc {r.returncode}): {line}")
        out += r.stdout
for f in ("runs/hf-demo/hf/config.json", "runs/hf-demo/hf/model.safetensors", "runs/hf-demo/hf/tokenizer.json",
          "runs/hf-demo/imported.h5"):
    if not os.path.exists(os.path.join(work, f)):
        sys.exit(f"check_readme_hf: {f} was not written by the README's commands")
if not re.search(r"new tokens in [0-9.]+ s \([0-9.]+ tokens/s, KV cache\)", out):
    sys.exit("check_readme_hf: wlb4d-generate did not report its speed")
if "initialised from runs/hf-demo/imported.h5" not in out:
    sys.exit("check_readme_hf: the continued run did not start from the imported weights")
print("check_readme_hf: ok")
