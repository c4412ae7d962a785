#!/usr/bin/env python3
"""README.md and docs/*.md read as a user's documentation, not a development
log: no issue letters ("[V]", "issue Q"), no issue numbers, no first-person
measurement ("we measured", "on this machine", "this session").

Code (fenced blocks and `inline spans`) is left out: shapes such as
`[T][H][D]` are notation there.
    docs_wording_check.py SOURCE_DIR
Exits 1 listing each offending line (file:line: text)."""
import pathlib
import re
import sys

RULES = [
    (re.compile(r"\[[A-Z]\](?!\()"), "an issue letter"),
    (re.compile(r"\bissues? [A-Z]\b"), "an issue letter"),
    (re.compile(r"\bissues? \d+\b", re.I), "an issue number"),  # not "TE issue #1368": a peer's tracker
    (re.compile(r"\b(we|I) (measured|found|saw|tried)\b"), "first-person measurement"),
    (re.compile(r"\bon this (2-core )?machine\b|\bthis session\b|\bnot yet landed\b|\bhas not landed\b", re.I), "development-log wording"),
]


def prose_lines(text):
    """(line number, line with inline code removed) outside fenced blocks."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield n, re.sub(r"`[^`]*`", "", line)


def main():
    root = pathlib.Path(sys.argv[1])
    files = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    bad = []
    for f in files:
        for n, line in prose_lines(f.read_text(encoding="utf-8")):
            for rx, what in RULES:
                if rx.search(line):
                    bad.append(f"{f.relative_to(root)}:{n}: {what}: {line.strip()}")
    if bad:
        print("\n".join(bad))
        print(f"FAIL: {len(bad)} line(s) of development-log wording in README.md or docs/")
        return 1
    print(f"ok: {len(files)} files, no issue letters or development-log wording")
    return 0


if __name__ == "__main__":
    sys.exit(main())
