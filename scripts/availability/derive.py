#!/usr/bin/env python3
"""Writes scripts/availability/apple-apis.tsv from the code (docs/client.md, "Proving it builds for
iOS"): every symbol of ActivityKit, WidgetKit, UIKit, AppKit, Foundation and Security that the
client's and the example's Apple-only code references (found by the SDK type-check's index store),
with its availability and deprecation on iOS, Mac Catalyst and macOS (read from the symbol graphs
of those SDK modules), as a pattern the SDK-free reading can find in the text, and a fingerprint of
each file's Apple-only code, so that code changed since is never passed unread.

  derive.py --occurrences FILE... --graphs DIR... --sources DIR --example DIR --sdks NAMES
            --targets iOS=16.1,... --out FILE [--check]
--check: compare with FILE instead of writing it (exit 1 and a diff when they differ).
"""
import argparse
import difflib
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check  # noqa: E402

MODULES = ("ActivityKit", "WidgetKit", "UIKit", "AppKit", "Foundation", "Security")
PLATFORMS = ("iOS", "macCatalyst", "macOS")
TYPE_KINDS = {"swift.class", "swift.struct", "swift.enum", "swift.protocol", "swift.typealias", "swift.associatedtype"}


def vtuple(d):
    return (d.get("major", 0), d.get("minor", 0), d.get("patch", 0)) if d else None


def load_graphs(directories):
    """USR → (module, title, kind, path, {platform: introduced | 'unavailable' | None}, {platform: deprecated | None}, parent USR)."""
    symbols, parents = {}, {}
    for directory in directories:
        for path in sorted(glob.glob(os.path.join(directory, "*.symbols.json"))):
            module = os.path.basename(path).split(".")[0].split("@")[0]
            if module not in MODULES:
                continue
            graph = json.load(open(path))
            for rel in graph.get("relationships", []):
                if rel.get("kind") in ("memberOf", "optionalRequirementOf", "requirementOf"):
                    parents.setdefault(rel["source"], rel["target"])
            for s in graph.get("symbols", []):
                usr = s["identifier"]["precise"]
                if usr in symbols and symbols[usr][4]:
                    continue
                introduced, deprecated = {}, {}
                for a in s.get("availability", []):
                    domains = PLATFORMS if a.get("domain") == "*" else (a.get("domain"),)
                    for d in domains:
                        if d not in PLATFORMS:
                            continue
                        if a.get("isUnconditionallyUnavailable") or a.get("obsoleted"):
                            introduced[d] = "unavailable"
                        elif a.get("introduced"):
                            introduced[d] = vtuple(a["introduced"])
                        if a.get("isUnconditionallyDeprecated"):
                            deprecated[d] = None
                        elif a.get("deprecated") and a["deprecated"].get("major", 0) < 1000:  # 100000: "to be deprecated", no warning yet
                            deprecated[d] = vtuple(a["deprecated"])
                symbols[usr] = (module, s["names"]["title"], s["kind"]["identifier"], s.get("pathComponents", []), introduced, deprecated)
    return symbols, parents


def effective(usr, symbols, parents):
    """A symbol's availability with what its enclosing types add (a member of an iOS 16.1 type)."""
    module, title, kind, path, introduced, deprecated = symbols[usr]
    introduced, deprecated = dict(introduced), dict(deprecated)
    seen, parent = {usr}, parents.get(usr)
    while parent in symbols and parent not in seen:
        seen.add(parent)
        for p, v in symbols[parent][4].items():
            if p not in introduced or (v == "unavailable") or (introduced[p] != "unavailable" and v > introduced[p]):
                introduced[p] = v
        for p, v in symbols[parent][5].items():
            deprecated.setdefault(p, v)
        parent = parents.get(parent)
    # Mac Catalyst follows iOS unless the symbol says otherwise.
    if "macCatalyst" not in introduced and "iOS" in introduced:
        introduced["macCatalyst"] = introduced["iOS"]
    if "macCatalyst" not in deprecated and "iOS" in deprecated:
        deprecated["macCatalyst"] = deprecated["iOS"]
    return introduced, deprecated


def pattern(title, kind, path, collisions=0):
    """How a use of the symbol reads in Swift text."""
    member = len(path) > 1
    m = re.match(r"^(\w+)(?:\((.*)\))?$", title)
    if not m:
        return None  # operators, subscripts
    name, labels = m.group(1), m.group(2)
    if kind in TYPE_KINDS:
        return r"\b%s\b" % re.escape(name)
    if labels is None:
        return (r"\.%s\b" if member else r"\b%s\b") % re.escape(name)
    if name == "init":
        if not member:
            return None
        name = path[-2]
    named = [l for l in labels.split(":") if l and l != "_"]
    if not named:
        return (r"\.%s\s*\(" if member and name == m.group(1) else r"\b%s\s*\(") % re.escape(name)
    first_named = labels.split(":")[0] != "_"
    # An unlabelled first argument: the call's first argument has no label (`end(nil, …)`, not `end(using: …)`).
    parts = [r"\b%s\s*\(" % re.escape(name) + ("" if first_named else r"(?!\s*[A-Za-z_]\w*\s*:)")]
    for i, label in enumerate(named[:1 + collisions]):
        parts.append((r"\s*" if i == 0 and first_named else r"[^()]*?\b") + r"%s\s*:" % re.escape(label))
    return "".join(parts)


def show(v):
    return "unavailable" if v == "unavailable" else "" if v is None else check.show(v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--occurrences", nargs="+", required=True)
    ap.add_argument("--graphs", nargs="+", required=True)
    ap.add_argument("--sources", required=True)
    ap.add_argument("--example", required=True)
    ap.add_argument("--sdks", required=True)
    ap.add_argument("--targets", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    targets = {p: check.version(v) for p, v in (part.split("=") for part in args.targets.split(","))}
    platforms = list(targets)
    symbols, parents = load_graphs(args.graphs)

    repo = os.path.dirname(os.path.realpath(args.sources))
    while not os.path.exists(os.path.join(repo, "Package.swift")) and repo != "/":
        repo = os.path.dirname(repo)
    files = {f: False for f in check.swift_files(os.path.realpath(args.sources))} | {f: True for f in check.swift_files(os.path.realpath(args.example))}
    parsed = {f: check.Source(f, platforms) for f in files}
    regions = {f: check.apple_only_code(parsed[f], whole=files[f]) for f in files}

    # Every explicit reference, in Apple-only code, to a symbol of those modules.
    used = {}
    for dump in args.occurrences:
        for row in open(dump, encoding="utf-8", errors="replace"):
            parts = row.rstrip("\n").split("\t")
            if len(parts) < 6:
                continue
            path, line, column, roles, usr = os.path.realpath(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), parts[4]
            if path not in files or roles & (check.IMPLICIT | check.DECLARATION | check.DEFINITION) or usr not in symbols:
                continue
            at = parsed[path].offset(line, column)
            if any(a <= at < b for a, b in regions[path]):
                used.setdefault(usr, set()).add("%s:%d" % (os.path.relpath(path, repo), line))

    rows = {}
    for usr in sorted(used):
        module, title, kind, path, _, _ = symbols[usr]
        introduced, deprecated = effective(usr, symbols, parents)
        # Only what can fail on a declared platform: newer than its floor, unavailable there, or deprecated.
        constrained = any(introduced.get(p) == "unavailable" or (isinstance(introduced.get(p), tuple) and introduced[p] > targets[p]) or p in deprecated
                          for p in platforms)
        if not constrained:
            continue
        rows.setdefault(pattern(title, kind, path), []).append((usr, module, title, kind, path, introduced, deprecated))
    lines = []
    for regex, entries in sorted(rows.items(), key=lambda r: (r[1][0][1], ".".join(r[1][0][4]))):
        if regex is None:
            continue
        # Overloads that read alike but differ: told apart by one more argument label.
        if len({(tuple(sorted(e[5].items(), key=str)), tuple(sorted(e[6].items(), key=str))) for e in entries}) > 1:
            for e in entries:
                lines.append((pattern(e[2], e[3], e[4], collisions=1) or regex, e))
        else:
            lines.append((regex, entries[0]))
    # What still reads alike (`.token` of PushType and of WidgetPushInfo): the text cannot tell them
    # apart, so the row asks only what every one of them asks (the SDK type-check tells them apart).
    merged = {}
    for regex, e in lines:
        merged.setdefault(regex, []).append(e)
    lines = []
    for regex, entries in merged.items():
        if len(entries) == 1:
            lines.append((regex, entries[0]))
            continue
        introduced, deprecated = {}, {}
        for p in PLATFORMS:
            values = [e[5].get(p) for e in entries]
            if all(v == "unavailable" for v in values):
                introduced[p] = "unavailable"
            elif all(isinstance(v, tuple) for v in values):
                introduced[p] = min(v for v in values)
            if all(p in e[6] for e in entries):
                deprecated[p] = max((e[6][p] for e in entries), key=lambda v: v or (0, 0, 0))
        first = entries[0]
        lines.append((regex, (first[0], ",".join(sorted({e[1] for e in entries})), " or ".join(sorted({".".join(e[4]) for e in entries})), first[3], [], introduced, deprecated)))
    lines.sort(key=lambda r: (r[1][1], r[1][2]))
    out = ["# Generated by scripts/availability/derive-apple-apis.sh from the code and %s: do not edit." % args.sdks,
           "# Every ActivityKit, WidgetKit, UIKit, AppKit, Foundation and Security API the Apple-only code of",
           "# Sources/IsleClient and Examples/PizzaApp uses that is newer than a declared floor, unavailable on a",
           "# declared platform, or deprecated. Read as text by scripts/availability/check.py where no SDK is.",
           "# regex\tsymbol\tmodule\tiOS\tmacCatalyst\tmacOS\tdeprecated"]
    for regex, (usr, module, title, kind, path, introduced, deprecated) in lines:
        dep = ", ".join(("%s %s" % (p, check.show(v))) if v else p for p, v in sorted(deprecated.items()) if p in PLATFORMS)
        out.append("\t".join([regex, ".".join(path) or title, module, show(introduced.get("iOS")), show(introduced.get("macCatalyst")), show(introduced.get("macOS")), dep]))
    out.append("# The Apple-only code these were derived from (check.py refuses a file whose code changed since):")
    for f in sorted(files):
        if regions[f]:
            root = os.path.realpath(args.example if files[f] else args.sources)
            out.append("# fingerprint\t%s\t%s" % (os.path.relpath(f, os.path.dirname(root)), check.fingerprint(parsed[f], regions[f])))
    text = "\n".join(out) + "\n"
    if args.check:
        old = open(args.out).read() if os.path.exists(args.out) else ""
        if old != text:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True), args.out + " (committed)", args.out + " (derived now)"))
            print("derive-apple-apis: %s is not what the code derives: run scripts/availability/derive-apple-apis.sh and commit it" % args.out)
            return 1
        print("derive-apple-apis: %s matches the code (%d APIs, %d files of Apple-only code)" % (args.out, len(lines), sum(1 for f in files if regions[f])))
        return 0
    open(args.out, "w").write(text)
    print("derive-apple-apis: wrote %s (%d APIs, %d files of Apple-only code)" % (args.out, len(lines), sum(1 for f in files if regions[f])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
