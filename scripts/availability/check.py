#!/usr/bin/env python3
"""Fails on any API a Swift package's code uses that is newer than its deployment targets, outside
a matching `@available` / `#available` scope (docs/client.md, "What the availability check reads").

Inputs:
  --index-dump FILE      occurrences from indexdump (file, line, column, roles, usr, name)
  --symbol-graphs DIR    swift-symbolgraph-extract output of the modules the package imports
  --sources DIR          the package's Sources directory
  --targets iOS=16.1,macOS=13.0,macCatalyst=16.1
  --apple-apis FILE      availability of Apple-only frameworks' APIs, read as text where the
                         compiler cannot see (files for Apple platforms only)

Two readings:
  1. Compiled code: every explicit reference the index recorded, looked up by USR in the symbol
     graphs (which carry Apple availability even on Linux).
  2. Code Linux cannot compile (`#if canImport(ActivityKit)` and the like): read as text, for the
     names in --apple-apis and for the names every one of whose declarations in the symbol graphs
     is newer than the targets (`Mutex`, `next(isolation:)`, ...).
"""
import argparse
import glob
import json
import os
import re
import sys

# Words of the language: never an API name read as text.
KEYWORDS = {"true", "false", "self", "Self", "init", "deinit", "some", "any", "super", "Type", "Protocol", "where", "throws", "rethrows",
            "async", "await", "return", "static", "public", "private", "internal", "import", "while", "guard", "defer", "repeat", "break",
            "continue", "switch", "default", "catch", "inout", "operator", "subscript", "extension", "protocol", "struct", "class", "actor"}
IMPLICIT = 1 << 8
DECLARATION = 1 << 0
DEFINITION = 1 << 1


def version(text):
    parts = [int(p) for p in text.split(".")]
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts[:3])


def show(v):
    return ".".join(str(p) for p in (v[:2] if v[2] == 0 else v))


def introduced(entry):
    i = entry.get("introduced")
    if not i:
        return None
    return (i.get("major", 0), i.get("minor", 0), i.get("patch", 0))


def load_symbol_graphs(directory, platforms):
    """USR → {platform: version or 'unavailable'}; and simple name → list of such maps."""
    by_usr = {}
    by_name = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.symbols.json"))):
        with open(path) as f:
            graph = json.load(f)
        for symbol in graph.get("symbols", []):
            usr = symbol["identifier"]["precise"].split("::SYNTHESIZED::")[0]
            needs = {}
            for entry in symbol.get("availability", []):
                domain = entry.get("domain")
                if entry.get("isUnconditionallyUnavailable"):
                    if domain == "*":
                        for p in platforms:
                            needs[p] = "unavailable"
                    elif domain in platforms:
                        needs[domain] = "unavailable"
                    continue
                if domain in platforms and introduced(entry):
                    needs[domain] = introduced(entry)
            # Mac Catalyst follows iOS unless the symbol says otherwise.
            if "macCatalyst" in platforms and "macCatalyst" not in needs and "iOS" in needs:
                needs["macCatalyst"] = needs["iOS"]
            by_usr.setdefault(usr, needs)
            title = symbol["names"]["title"]
            by_name.setdefault(title, []).append(needs)
    return by_usr, by_name


class Source:
    """A Swift file with comments and string literals blanked (positions kept), and the scopes in
    which availability is known to be at least some version."""

    def __init__(self, path, platforms):
        with open(path, encoding="utf-8") as f:
            self.text = f.read()
        self.code = blank(self.text)
        self.line_starts = [0]
        for m in re.finditer("\n", self.text):
            self.line_starts.append(m.end())
        self.platforms = platforms
        self.scopes = []  # (start, end, {platform: version})
        self.find_scopes()

    def offset(self, line, column):
        return self.line_starts[line - 1] + column - 1 if 0 < line <= len(self.line_starts) else 0

    def position(self, offset):
        lo, hi = 0, len(self.line_starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.line_starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1, offset - self.line_starts[lo] + 1

    def matching(self, open_at):
        """Offset of the brace closing the one at open_at."""
        depth = 0
        for i in range(open_at, len(self.code)):
            c = self.code[i]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return i
        return len(self.code)

    def enclosing_end(self, offset):
        """End of the innermost block containing offset."""
        depth = 0
        for i in range(offset, len(self.code)):
            c = self.code[i]
            if c == "{":
                depth += 1
            elif c == "}":
                if depth == 0:
                    return i
                depth -= 1
        return len(self.code)

    def parse_spec(self, spec):
        """`iOS 17.2, macCatalyst 17.2, *` or `iOS, introduced: 17.2` → {platform: version}."""
        out = {}
        m = re.match(r"\s*(\w+)\s*,\s*introduced\s*:\s*([\d.]+)", spec)
        if m:
            if m.group(1) in self.platforms:
                out[m.group(1)] = version(m.group(2))
            return out
        for part in spec.split(","):
            m = re.match(r"\s*(\w+)\s+([\d.]+)\s*$", part)
            if m and m.group(1) in self.platforms:
                out[m.group(1)] = version(m.group(2))
        if "iOS" in out and "macCatalyst" in self.platforms and "macCatalyst" not in out:
            out["macCatalyst"] = out["iOS"]
        return out

    def find_scopes(self):
        code = self.code
        # `@available(...)` on a declaration: the declaration, to its closing brace (or its line).
        for m in re.finditer(r"@available\s*\(([^)]*)\)", code):
            spec = self.parse_spec(m.group(1))
            if not spec:
                continue
            start = m.start()
            i = m.end()
            depth = 0
            end = None
            while i < len(code):
                c = code[i]
                if c in "([":
                    depth += 1
                elif c in ")]":
                    depth -= 1
                elif c == "{" and depth == 0:
                    end = self.matching(i)
                    break
                elif c == "\n" and depth == 0:
                    # A declaration without a body ends with its line, unless the line only held
                    # attributes (the declaration follows on the next one).
                    line = code[code.rfind("\n", 0, i) + 1:i].strip()
                    if line and not re.fullmatch(r"(@\w+(\s*\([^)]*\))?\s*)+", line):
                        end = i
                        break
                i += 1
            self.scopes.append((start, end if end is not None else len(code), spec))
        # `if #available(...) {` and `guard #available(...) else { ... }` (then the rest of the block).
        for m in re.finditer(r"\b(if|guard|while)\b([^{]*?)#available\s*\(([^)]*)\)", code):
            spec = self.parse_spec(m.group(3))
            if not spec:
                continue
            brace = code.find("{", m.end())
            if brace < 0:
                continue
            if m.group(1) == "guard":
                else_end = self.matching(brace)
                self.scopes.append((else_end, self.enclosing_end(else_end + 1), spec))
            else:
                # The conditions after `#available` are refined by it too, then the body.
                self.scopes.append((m.end(), self.matching(brace), spec))

    def guaranteed(self, offset, platform):
        best = None
        for start, end, spec in self.scopes:
            if start <= offset <= end and platform in spec:
                if best is None or spec[platform] > best:
                    best = spec[platform]
        return best


def blank(text):
    """Comments and string literals replaced by spaces (newlines kept), so braces and names in
    them do not count. Handles //, nested /* */, "...", multi-line \"\"\" and raw #"..."#."""
    out = list(text)
    i, n = 0, len(text)

    def wipe(a, b):
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif text[i] == '"' or (text[i] == "#" and re.match(r'#+"', text[i:])):
            hashes = 0
            while text[i + hashes] == "#":
                hashes += 1
            start = i
            j = i + hashes
            triple = text.startswith('"""', j)
            close = ('"""' if triple else '"') + "#" * hashes
            j += 3 if triple else 1
            while j < n:
                if hashes == 0 and text[j] == "\\":
                    # An interpolation keeps its code: skip to its closing parenthesis.
                    if j + 1 < n and text[j + 1] == "(":
                        depth, k = 1, j + 2
                        while k < n and depth:
                            if text[k] == "(":
                                depth += 1
                            elif text[k] == ")":
                                depth -= 1
                            k += 1
                        j = k
                        continue
                    j += 2
                    continue
                if text.startswith(close, j):
                    j += len(close)
                    break
                if not triple and text[j] == "\n":
                    break
                j += 1
            wipe(start, j)
            i = j
        else:
            i += 1
    return "".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--index-dump", required=True)
    ap.add_argument("--symbol-graphs", required=True)
    ap.add_argument("--sources", required=True)
    ap.add_argument("--targets", required=True)
    ap.add_argument("--apple-apis", required=True)
    args = ap.parse_args()

    targets = {}
    for part in args.targets.split(","):
        platform, v = part.split("=")
        targets[platform] = version(v)
    platforms = list(targets)
    by_usr, by_name = load_symbol_graphs(args.symbol_graphs, platforms)
    if not by_usr:
        print("check-client-availability: no symbol graphs in %s" % args.symbol_graphs, file=sys.stderr)
        return 2

    sources_root = os.path.realpath(args.sources)
    files = sorted(os.path.realpath(p) for p in glob.glob(os.path.join(sources_root, "**", "*.swift"), recursive=True))
    parsed = {path: Source(path, platforms) for path in files}
    problems = {}
    checked_refs = 0
    indexed_files = set()

    def report(path, offset, what, needs):
        src = parsed[path]
        line, column = src.position(offset)
        for platform in platforms:
            need = needs.get(platform)
            if need is None:
                continue
            rel = os.path.relpath(path, os.path.dirname(sources_root))
            key = "%s:%d:%d: %s" % (rel, line, column, what)
            if need == "unavailable":
                problems.setdefault(key, []).append("is unavailable on %s" % platform)
                continue
            if need <= targets[platform]:
                continue
            have = src.guaranteed(offset, platform)
            if have is not None and have >= need:
                continue
            problems.setdefault(key, []).append("needs %s %s (deployment target %s)" % (platform, show(need), show(targets[platform])))

    # 1. The index: explicit references in compiled code.
    with open(args.index_dump, encoding="utf-8", errors="replace") as f:
        for row in f:
            parts = row.rstrip("\n").split("\t")
            if len(parts) < 6:
                continue
            path, line, column, roles, usr, name = parts[0], int(parts[1]), int(parts[2]), int(parts[3]), parts[4], parts[5]
            path = os.path.realpath(path)
            if path not in parsed:
                continue
            indexed_files.add(path)
            # Implicit references (a `for await` loop's `next`) are chosen by the compiler for the
            # deployment target; declarations are the package's own.
            if roles & (IMPLICIT | DECLARATION | DEFINITION):
                continue
            needs = by_usr.get(usr)
            if needs is None:
                continue
            checked_refs += 1
            report(path, parsed[path].offset(line, column), name, needs)

    # 2. Text the compiler did not see: Apple-only APIs, and names that exist only in newer systems.
    apple = []
    with open(args.apple_apis) as f:
        for row in f:
            row = row.strip()
            if not row or row.startswith("#"):
                continue
            pattern, platform, v, _source = (row.split("\t") + ["", "", "", ""])[:4]
            apple.append((re.compile(pattern), {platform: version(v)} | ({"macCatalyst": version(v)} if platform == "iOS" else {})))
    newer_only = []
    for title, entries in by_name.items():
        spans = [e.get("iOS") for e in entries]
        if not spans or any(s is None or (s != "unavailable" and s <= targets.get("iOS", (0, 0, 0))) for s in spans):
            continue
        if "iOS" not in targets or any(s == "unavailable" for s in spans):
            continue
        need = min(spans)
        m = re.match(r"(\w+)(\(([^)]*)\))?$", title)
        if not m or len(m.group(1)) < 4 or m.group(1) in KEYWORDS:
            continue
        labels = [l for l in (m.group(3) or "").split(":") if l]
        if m.group(2) is None:
            pattern = r"\b%s\b" % re.escape(m.group(1))
        elif labels and labels[0] != "_":
            pattern = r"\b%s\s*\(\s*%s\s*:" % (re.escape(m.group(1)), re.escape(labels[0]))
        else:
            continue  # `f(_:)`: too common a shape to read as text
        newer_only.append((re.compile(pattern), {"iOS": need, "macCatalyst": need}, title))
    text_lines = 0
    for path, src in parsed.items():
        inactive = inactive_regions(src)
        if not inactive and path in indexed_files:
            continue
        regions = inactive if path in indexed_files else [(0, len(src.code))]
        for a, b in regions:
            text_lines += src.code.count("\n", a, b)
            chunk = src.code[a:b]
            for regex, needs in apple:
                for m in regex.finditer(chunk):
                    if declares(chunk, m.start()):
                        continue
                    report(path, a + m.start(), m.group(0).strip(". ("), needs)
            for regex, needs, title in newer_only:
                for m in regex.finditer(chunk):
                    report(path, a + m.start(), title, needs)

    for key in sorted(problems):
        print("%s %s, outside any @available/#available scope that guarantees it" % (key, "; ".join(problems[key])))
    print("check-client-availability: %d references to APIs with Apple availability in %d compiled files, %d lines read as text (code for Apple platforms only); "
          "targets %s: %d problem(s)" % (checked_refs, len(indexed_files), text_lines, ", ".join("%s %s" % (k, show(v)) for k, v in targets.items()), len(problems)))
    return 1 if problems else 0


def declares(chunk, at):
    """Whether the name at `at` is being declared (`var pushToStartToken`), not used."""
    before = chunk[max(0, chunk.rfind("\n", 0, at)):at]
    return bool(re.search(r"\b(var|let|func|case|struct|class|enum|protocol|typealias)\s+$", before))


def inactive_regions(src):
    """Blocks under `#if canImport(<Apple framework>)` / `#if os(iOS)`-like conditions, which the
    Linux compiler skips: (start, end) offsets."""
    regions = []
    stack = []
    for m in re.finditer(r"^[ \t]*#(if|elseif|else|endif)\b(.*)$", src.code, re.M):
        kind, cond = m.group(1), m.group(2)
        if kind == "if":
            stack.append((m.end(), apple_only(cond)))
        elif kind in ("elseif", "else"):
            if stack:
                start, apple = stack.pop()
                if apple:
                    regions.append((start, m.start()))
                stack.append((m.end(), kind == "elseif" and apple_only(cond)))
        elif kind == "endif" and stack:
            start, apple = stack.pop()
            if apple:
                regions.append((start, m.start()))
    return regions


def apple_only(condition):
    return bool(re.search(r"canImport\((ActivityKit|UIKit|WidgetKit|Security|AppKit|SwiftUI)\)|os\((iOS|macOS|watchOS|tvOS|visionOS)\)|targetEnvironment\((simulator|macCatalyst)\)", condition))


if __name__ == "__main__":
    sys.exit(main())
