#!/usr/bin/env python3
"""Every command of README.md and docs/*.md runs as written, in order.

    doc_walk.py REPO_ROOT BUILD_DIR WORK_DIR [--mpiexec MPIEXEC] [--only FILE]

A user copies commands from fenced code blocks. This walks the files as such
a user would: README.md first, then docs/*.md in name order, and runs every
line of every block fenced ```bash (a line ending in `\\` continues on the
next; `#` lines are comments) with bash, from a checkout-like WORK_DIR: the
repository's top-level entries linked in, `build` a link to BUILD_DIR, and a
fresh `runs/`. A command that exits non-zero (or runs past 900 s) fails the
walk, naming FILE:LINE and its output's tail.

A block whose fence names a kind after `bash` is not run here, and the
summary says so:
  ```bash setup     installs packages, configures or builds (scripts/test.sh,
                    which CI runs, does this), or rewrites tracked files
  ```bash cluster   needs Slurm or Spack (doc_commands_check still checks its
                    wlb4d and sbatch lines against the trainer's validation)
  ```bash gpu       needs a GPU
  ```bash bench     a benchmark: minutes, and figures rather than a check
  ```bash needs-X   needs the program X (e.g. needs-npm: fetches a package
                    through npm); run when X is on PATH, otherwise counted
                    as not run under 'bash needs-X' in the summary
Any other kind fails the walk, so a typo cannot hide a block.

Examples prepare their own data and write under runs/: after the walk,
WORK_DIR's top level must hold nothing new besides runs/ (a command that
writes into the repository root fails it).
Exit 0 when every command ran; 1 otherwise.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import time

KINDS_NOT_RUN = {"setup", "cluster", "gpu", "bench"}


def blocks(path):
    """(kind, [(line number, command)]) of every ```bash block of a file."""
    out = []
    kind, cmds, pending, start = None, [], "", 0
    for n, raw in enumerate(open(path, encoding="utf-8"), 1):
        line = raw.rstrip("\n")
        s = line.strip()
        if kind is None:
            m = re.match(r"^```bash(?:\s+(\S+))?\s*$", s)
            if m:
                kind, cmds = (m.group(1) or ""), []
            continue
        if s.startswith("```"):
            out.append((kind, cmds))
            kind = None
            continue
        if not pending and (not s or s.startswith("#")):
            continue
        if not pending:
            start = n
        if s.endswith("\\"):
            pending += s[:-1] + " "
            continue
        cmds.append((start, pending + s))
        pending = ""
    return out


def checkout(repo, build, work):
    """A fresh checkout-like WORK: the repository's top-level entries linked
    in, `build` a link to BUILD, an empty `runs/`."""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    for e in os.listdir(repo):
        if e in (".git", "build", "runs") or e.startswith("build-"):
            continue
        os.symlink(os.path.join(repo, e), os.path.join(work, e))
    os.symlink(build, os.path.join(work, "build"))
    os.makedirs(os.path.join(work, "runs"))


def run_command(cmd, work, mpiexec, env=None, timeout=900):
    """Runs one documented command as the walk does: (rc, output); `mpiexec`
    at the start of the line becomes MPIEXEC."""
    run = re.sub(r"^mpiexec\b", mpiexec, cmd)
    try:
        r = subprocess.run(["bash", "-c", run], cwd=work, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, errors="replace", timeout=timeout)
        return r.returncode, r.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return f"timeout ({timeout} s)", out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("build")
    ap.add_argument("work")
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--only", help="walk this file alone (a path relative to the repository)")
    a = ap.parse_args()
    repo, build, work = (os.path.abspath(p) for p in (a.repo, a.build, a.work))
    checkout(repo, build, work)
    before = set(os.listdir(work))

    files = [os.path.join(repo, "README.md")] + sorted(glob.glob(os.path.join(repo, "docs", "*.md")))
    if a.only:
        files = [os.path.join(repo, a.only)]
    env = dict(os.environ)
    failures, ran, not_run = [], 0, {}
    t_walk = time.time()
    for path in files:
        rel = os.path.relpath(path, repo)
        for kind, cmds in blocks(path):
            runnable = kind == ""
            if kind.startswith("needs-"):
                runnable = shutil.which(kind[len("needs-"):]) is not None
            elif kind and kind not in KINDS_NOT_RUN:
                failures.append(f"{rel}:{cmds[0][0] if cmds else '?'}: unknown block kind 'bash {kind}' "
                                f"(known: {', '.join(sorted(KINDS_NOT_RUN))}, needs-PROGRAM)")
                continue
            if not runnable:
                not_run[kind] = not_run.get(kind, 0) + len(cmds)
                continue
            for n, cmd in cmds:
                t0 = time.time()
                rc, text = run_command(cmd, work, a.mpiexec, env)
                dt = time.time() - t0
                ran += 1
                print(f"$ {cmd}    [{rel}:{n}, {dt:.1f} s, rc {rc}]", flush=True)
                if rc != 0:
                    tail = "\n".join(text.splitlines()[-25:])
                    print(tail)
                    failures.append(f"{rel}:{n}: exit {rc}: {cmd}\n{tail}")
    new = sorted(set(os.listdir(work)) - before)
    if new:
        failures.append("commands wrote into the repository root (examples must write under runs/): "
                        + ", ".join(new))
    print(f"doc_walk: {ran} commands run in {time.time() - t_walk:.0f} s; not run here: "
          + (", ".join(f"{v} in 'bash {k}' blocks" for k, v in sorted(not_run.items())) or "none"))
    if failures:
        print("doc_walk: FAILED\n" + "\n".join(failures), file=sys.stderr)
        sys.exit(1)
    print("doc_walk: ok")


if __name__ == "__main__":
    main()
