#!/usr/bin/env python3
"""README's Data section, docs/data.md and the quickstart deck tell one story.

    check_readme_data.py WLB4D_PREP WLB4D REPO_ROOT

Runs every `wlb4d-prep` command of README.md's "## Data" section as written
(continuation lines joined; the program path replaced by WLB4D_PREP) in a
fresh directory that holds only a link to the repository's inputs/, as a new
clone would, and checks that
  - each command exits 0,
  - the files the commands write (--output, --val-output) are exactly the
    `[data] train` and `val` of inputs/quickstart.ini (as `wlb4d
    --print-config` reports them), so the section and the deck cannot drift,
  - those files exist afterwards and are HDF5 files.
Exit 1 naming README.md:line and what differs.
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def data_section_prep_commands(readme, section="## Data"):
    """(line, argv) of every wlb4d-prep command in fenced blocks of `section` (None: the whole file)."""
    out, in_section, fenced, pending, start = [], False, False, "", 0
    with open(readme, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if section is None:
                in_section = True
            elif line.startswith("## "):
                in_section = line.strip() == section
                continue
            if not in_section:
                continue
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if not fenced:
                continue
            text = line.rstrip("\n")
            if not pending:
                start = n
            if text.endswith("\\"):
                pending += text[:-1] + " "
                continue
            cmd, pending = (pending + text).split("#", 1)[0].strip(), ""
            if not cmd:
                continue
            argv = shlex.split(cmd)
            if argv and os.path.basename(argv[0]) == "wlb4d-prep":
                out.append((start, argv))
    return out


def option_values(argv, names):
    vals = []
    for i, a in enumerate(argv):
        for name in names:
            if a == name and i + 1 < len(argv):
                vals.append(argv[i + 1])
            elif a.startswith(name + "="):
                vals.append(a.split("=", 1)[1])
    return vals


def deck_data_paths(wlb4d, root):
    ini = subprocess.run([wlb4d, "inputs/quickstart.ini", "--print-config"], cwd=root, capture_output=True,
                         text=True, timeout=60)
    if ini.returncode != 0:
        sys.exit("check_readme_data: wlb4d --print-config failed: " + ini.stderr)
    section, keys = None, {}
    for line in ini.stdout.splitlines():
        m = re.match(r"^\[(\w+)\]", line)
        if m:
            section = m.group(1)
        elif section == "data" and "=" in line:
            k, v = (s.strip() for s in line.split("=", 1))
            keys[k] = v
    return {keys.get("train", ""), keys.get("val", "")} - {""}


def main():
    prep, wlb4d, root = (os.path.abspath(a) for a in sys.argv[1:4])
    readme = os.path.join(root, "README.md")
    cmds = data_section_prep_commands(readme)
    if not cmds:
        sys.exit("check_readme_data: README.md's '## Data' section has no wlb4d-prep command")
    want = deck_data_paths(wlb4d, root)
    # docs/data.md's quickstart datasets (the corpus split into train and
    # validation) tell the same story.
    docs = os.path.join(root, "docs", "data.md")
    for line, argv in data_section_prep_commands(docs, None):
        if any("sotu-embedded" in a for a in argv) and option_values(argv, ["--val-output"]):
            cmds.append((line, argv, "docs/data.md"))
    cmds = [c if len(c) == 3 else (c[0], c[1], "README.md") for c in cmds]
    errors = []
    with tempfile.TemporaryDirectory(prefix="wlb4d-readme-data-") as work:
        os.symlink(os.path.join(root, "inputs"), os.path.join(work, "inputs"))
        for line, argv, doc in cmds:
            got = set(option_values(argv, ["--output", "--val-output"]))
            if got != want:
                errors.append(f"{doc}:{line}: writes {sorted(got)}, the quickstart deck reads {sorted(want)}")
            r = subprocess.run([prep] + argv[1:], cwd=work, capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                errors.append(f"{doc}:{line}: exit {r.returncode} as written: {r.stderr.strip()}")
                continue
            for p in sorted(got):
                path = os.path.join(work, p)
                if not os.path.isfile(path):
                    errors.append(f"{doc}:{line}: {p} was not written")
                    continue
                with open(path, "rb") as f:
                    if f.read(8) != HDF5_SIGNATURE:
                        errors.append(f"{doc}:{line}: {p} is not an HDF5 file")
            print(f"{doc}:{line}: ran: {' '.join(shlex.quote(a) for a in argv)}")
    if errors:
        print("\n".join("check_readme_data: " + e for e in errors))
        return 1
    print(f"check_readme_data: {len(cmds)} wlb4d-prep command(s) write the quickstart deck's {sorted(want)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
