#!/usr/bin/env python3
"""The README's walkthrough as a reader types it: every command of the ```console blocks from
"## Test without an iPhone" up to "### Topics as audiences", in order, one JSON object a line:
{"section", "command", "background"}. A command continued with a trailing backslash is one command;
lines that are only comments are skipped. "background" is "sim" or "serve" for the two commands
that keep running in their own terminal (the reader leaves them running and opens another).
scripts/try-readme-in-order.sh runs them as written."""
import json
import sys

lines = open(sys.argv[1] if len(sys.argv) > 1 else "README.md", encoding="utf-8").read().splitlines()
start = next(i for i, l in enumerate(lines) if l.strip() == "## Test without an iPhone")
end = next(i for i in range(start, len(lines)) if lines[i].startswith("### Topics as audiences"))
section, block, pending = None, False, ""
for line in lines[start:end]:
    if line.startswith("#") and not block:
        section = line.lstrip("#").strip()
        continue
    if line.startswith("```"):
        block = line.startswith("```console") and not block
        continue
    if not block:
        continue
    if not pending and (not line.strip() or line.lstrip().startswith("#")):
        continue
    if line.endswith("\\"):
        pending += line[:-1] + " "
        continue
    command = (pending + line).strip()
    pending = ""
    background = next((kind for kind in ("sim", "serve") if command.startswith("swift run isle %s " % kind)), None)
    print(json.dumps({"section": section, "command": command, "background": background}))
