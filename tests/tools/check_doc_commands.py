#!/usr/bin/env python3
"""Every trainer command of README.md and docs/*.md must pass the trainer's own
deck and layout validation as written.

    check_doc_commands.py WLB4D_BINARY REPO_ROOT

Finds, in fenced code blocks and in inline `code` spans, every command line
that runs the trainer:
  - `build/app/wlb4d ...` or `wlb4d ...`            1 rank (an MPI singleton)
  - `mpiexec|mpirun|srun -n N ... wlb4d ...`          N ranks
  - `sbatch [-N n] [-n N] [--ntasks-per-node=t] slurm/<template> DECK args...`
        the rank count as the template's `#SBATCH` lines and the command's
        options give it (-n wins, else nodes x tasks-per-node); train-*.sbatch
        take `DECK overrides...` (train-gpu.sbatch adds --comm.backend=nccl, as
        its COMM_BACKEND default does), sweep.sbatch `DECK SWEEP_FILE overrides...`
        (every line of the sweep file is checked); other templates (no deck) skip.
and runs `WLB4D DECK overrides... --check --check-ranks N` from REPO_ROOT,
which must exit 0. A placeholder deck (an upper-case word such as DECK) is
skipped and reported. Also checks that README.md lists every layout rule
`wlb4d --help` prints. Exit 1 naming file:line and the trainer's message on
any failure.
"""
import glob
import os
import re
import shlex
import subprocess
import sys

TRAINER = re.compile(r"(^|/)wlb4d$")
ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$|<[^>]*>")
STARTERS = ("mpiexec", "mpirun", "srun", "sbatch")


def command_lines(path):
    """(line number, text) of every candidate command in a markdown file."""
    out = []
    fenced = False
    pending, start = "", 0
    with open(path, encoding="utf-8") as f:
        for no, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            if line.lstrip().startswith("```"):
                fenced = not fenced
                pending = ""
                continue
            if fenced:
                if not pending:
                    start = no
                if line.rstrip().endswith("\\"):
                    pending += line.rstrip()[:-1] + " "
                    continue
                out.append((start, pending + line))
                pending = ""
            else:
                for span in re.findall(r"`([^`]+)`", line):
                    out.append((no, span))
    return out


def tokens_of(text):
    try:
        toks = shlex.split(text, comments=True)
    except ValueError:
        return []
    while toks and ASSIGN.match(toks[0]):
        toks.pop(0)
    return toks


def sbatch_defaults(template):
    d = {}
    try:
        with open(template, encoding="utf-8") as f:
            for line in f:
                m = re.match(r"^#SBATCH\s+--([a-z-]+)(?:[= ](\S+))?", line)
                if m:
                    d[m.group(1)] = m.group(2)
    except OSError:
        pass
    return d


def opt_value(toks, i, short, long):
    """(value, tokens consumed) of option toks[i] if it is -X v, -Xv, --long=v or --long v."""
    t = toks[i]
    if t == short or t == "--" + long:
        return (toks[i + 1] if i + 1 < len(toks) else None), 2
    if short and t.startswith(short) and len(t) > len(short) and not t.startswith("--"):
        return t[len(short):], 1
    if t.startswith("--" + long + "="):
        return t.split("=", 1)[1], 1
    return None, 0


def checks_of(toks, repo):
    """[(ranks, deck, overrides)] for one command, or a string saying why it is skipped, or None."""
    if not toks:
        return None
    cmd = os.path.basename(toks[0])
    if TRAINER.search(toks[0]):
        return [(1, toks[1:])] if len(toks) > 1 else None  # a bare `wlb4d` is prose
    if cmd in ("mpiexec", "mpirun", "srun"):
        n, i = None, 1
        while i < len(toks) and not TRAINER.search(toks[i]):
            for short, long in (("-n", "ntasks"), ("-np", "np")):
                v, used = opt_value(toks, i, short, long)
                if used:
                    n = v
                    i += used - 1
                    break
            i += 1
        if i >= len(toks):
            return None  # launches something else (wlb4d-prep, a test, ...)
        if n is None:
            return "no -n rank count"
        return [(int(n), toks[i + 1:])]
    if cmd == "sbatch":
        opts, i = {}, 1
        while i < len(toks) and toks[i].startswith("-"):
            for short, long in (("-N", "nodes"), ("-n", "ntasks"), (None, "ntasks-per-node")):
                v, used = opt_value(toks, i, short, long)
                if used:
                    opts[long] = v
                    i += used - 1
                    break
            i += 1
        if i >= len(toks):
            return "no batch script"
        script, args = toks[i], toks[i + 1:]
        name = os.path.basename(script)
        tmpl = sbatch_defaults(os.path.join(repo, script))
        nodes = int(opts.get("nodes") or tmpl.get("nodes") or 1)
        per_node = opts.get("ntasks-per-node") or tmpl.get("ntasks-per-node")
        if opts.get("ntasks"):
            ranks = int(opts["ntasks"])
        elif per_node:
            ranks = nodes * int(per_node)
        elif tmpl.get("ntasks"):
            ranks = int(tmpl["ntasks"])
        else:
            ranks = nodes
        if name.startswith("train-") and args:
            extra = ["--comm.backend=nccl"] if name == "train-gpu.sbatch" else []
            return [(ranks, args + extra)]
        if name == "sweep.sbatch" and len(args) >= 2:
            deck, sweep, rest = args[0], args[1], args[2:]
            if PLACEHOLDER.search(sweep):
                return "placeholder sweep file " + sweep
            out = []
            with open(os.path.join(repo, sweep), encoding="utf-8") as f:
                for line in f:
                    line = line.split("#", 1)[0].strip()
                    if line:
                        out.append((ranks, [deck] + shlex.split(line) + rest))
            return out
        return "template %s takes no deck" % name
    return None


def main():
    wlb4d, repo = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    docs = [os.path.join(repo, "README.md")] + sorted(glob.glob(os.path.join(repo, "docs", "*.md")))
    failures, checked, skipped = [], 0, []
    for doc in docs:
        rel = os.path.relpath(doc, repo)
        for no, text in command_lines(doc):
            toks = tokens_of(text)
            if not toks or not (TRAINER.search(toks[0]) or os.path.basename(toks[0]) in STARTERS):
                continue
            checks = checks_of(toks, repo)
            if checks is None:
                continue
            if isinstance(checks, str):
                skipped.append("%s:%d: %s (%s)" % (rel, no, text.strip(), checks))
                continue
            for ranks, args in checks:
                deck = next((a for a in args if not a.startswith("-")), None)
                if deck and PLACEHOLDER.search(deck):
                    skipped.append("%s:%d: %s (placeholder deck %s)" % (rel, no, text.strip(), deck))
                    continue
                if "--check-ranks" in args or any(a.startswith("--check-ranks=") for a in args):
                    argv = [wlb4d] + args  # the command checks itself, for its own rank count
                else:
                    argv = [wlb4d] + args + ["--check", "--check-ranks", str(ranks)]
                r = subprocess.run(argv, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   universal_newlines=True, timeout=120)
                checked += 1
                tag = "ok  " if r.returncode == 0 else "FAIL"
                print("%s %s:%d (%d ranks): %s" % (tag, rel, no, ranks, " ".join(args)))
                if r.returncode != 0:
                    msg = r.stdout.strip().splitlines()
                    failures.append("%s:%d: `%s` fails the deck check on %d ranks: %s" %
                                    (rel, no, text.strip(), ranks, msg[-1] if msg else "rc %d" % r.returncode))
    for s in skipped:
        print("skip " + s)

    # README.md lists the layout rules that --help prints.
    help_text = subprocess.run([wlb4d, "--help"], cwd=repo, stdout=subprocess.PIPE,
                               universal_newlines=True).stdout
    rules = help_text.split("Layout rules (what must divide what):\n", 1)
    readme = " ".join(open(docs[0], encoding="utf-8").read().split())
    if len(rules) != 2:
        failures.append("wlb4d --help prints no 'Layout rules' section")
    else:
        for rule in rules[1].split("\n\n", 1)[0].splitlines():
            if " ".join(rule.split()) not in readme:
                failures.append("README.md does not list the layout rule '%s' (from wlb4d --help)" % rule.strip())

    print("checked %d commands, skipped %d" % (checked, len(skipped)))
    if checked < 5:
        failures.append("only %d commands found: the extraction is broken" % checked)
    for f in failures:
        print("check_doc_commands: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
