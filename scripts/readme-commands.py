#!/usr/bin/env python3
"""Prints the README's two commands, one a line, exactly as written: the first ```console block under
the heading "## Set up, see it work, run the tests" (set up + demo, then the tests). .ci/run runs what
this prints, so CI proves the README's own lines, not a copy of them."""
import sys

lines = open(sys.argv[1] if len(sys.argv) > 1 else "README.md", encoding="utf-8").read().splitlines()
try:
    start = next(i for i, l in enumerate(lines) if l.strip() == "## Set up, see it work, run the tests")
    fence = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```console"))
except StopIteration:
    sys.exit("readme-commands: no ```console block under '## Set up, see it work, run the tests'")
for line in lines[fence + 1:]:
    if line.startswith("```"):
        break
    if line.strip():
        print(line)
