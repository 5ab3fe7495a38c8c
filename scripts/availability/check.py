#!/usr/bin/env python3
"""Fails on any API a Swift package's code uses that is newer than its deployment targets, outside
a matching `@available` / `#available` scope (docs/client.md, "What the availability check reads").

Inputs:
  --index-dump FILE      occurrences from indexdump (file, line, column, roles, usr, name)
  --symbol-graphs DIR    swift-symbolgraph-extract output of the modules the package imports
  --sources DIR          the package's Sources directory
  --targets iOS=16.1,macOS=13.0,macCatalyst=16.1
  --apple-apis FILE      availability of the Apple-only frameworks' APIs the code uses, derived from
                         the code by scripts/availability/derive-apple-apis.sh (with an SDK copy), read
                         as text where the compiler cannot see (files for Apple platforms only), with a
                         fingerprint of that code: code changed since the list was derived fails
  --example DIR          an app's sources read as text too (Apple-only as a whole)

Two readings:
  1. Compiled code: every explicit reference the index recorded, looked up by USR in the symbol
     graphs (which carry Apple availability even on Linux).
  2. Code Linux cannot compile (`#if canImport(ActivityKit)` and the like): read as text, for the
     names in --apple-apis and for the names every one of whose declarations in the symbol graphs
     is newer than the targets (`Mutex`, `next(isolation:)`, ...).
Each use is judged on the platforms its `#if` block is compiled for (`#if os(macOS)` code against
macOS only), and deprecations are reported as Xcode's compiler would warn on them.
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
        self.blocks = []  # (start, end, {platforms the block is compiled for})
        self.find_blocks()
        self.imports = set(re.findall(r"^[ \t]*(?:@\w+\s+)*(?:(?:public|package|internal|fileprivate|private)\s+)?import\s+(?:(?:struct|class|enum|protocol|typealias|func|var|let)\s+)?(\w+)", self.code, re.M))
        self.only = None  # the platforms the whole file is for (an iPhone app's sources: iOS)

    def find_blocks(self):
        stack = []  # (start of the branch, platforms of the enclosing block, platforms no earlier branch took)
        everywhere = set(self.platforms)
        for m in re.finditer(r"^[ \t]*#(if|elseif|else|endif)\b(.*)$", self.code, re.M):
            kind, cond = m.group(1), m.group(2)
            if kind == "if":
                outer = stack[-1][3] if stack else everywhere
                here = outer & condition_platforms(cond, self.platforms)
                stack.append((m.end(), outer, outer - here, here))
            elif stack:
                start, outer, rest, here = stack.pop()
                self.blocks.append((start, m.start(), here))
                if kind == "elseif":
                    now = rest & condition_platforms(cond, self.platforms)
                    stack.append((m.end(), outer, rest - now, now))
                elif kind == "else":
                    stack.append((m.end(), outer, set(), rest))

    def platforms_at(self, offset):
        best = None
        for start, end, here in self.blocks:
            if start <= offset <= end and (best is None or start >= best[0]):
                best = (start, here)
        here = set(self.platforms) if best is None else best[1]
        return here if self.only is None else here & self.only

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
    ap.add_argument("--example", action="append", default=[])
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
    files = swift_files(sources_root)
    example_files = [f for d in args.example for f in swift_files(os.path.realpath(d))]
    parsed = {path: Source(path, platforms) for path in files + example_files}
    for path in example_files:
        parsed[path].only = {"iOS"}  # the example is an iPhone app (Live Activities)
    root_of = {path: sources_root for path in files} | {path: os.path.realpath(d) for d in args.example for path in swift_files(os.path.realpath(d))}
    problems = {}
    checked_refs = 0
    indexed_files = set()

    def report(path, offset, what, needs, deprecated=None):
        src = parsed[path]
        line, column = src.position(offset)
        rel = os.path.relpath(path, os.path.dirname(root_of[path]))
        key = "%s:%d:%d: %s" % (rel, line, column, what)
        compiled_for = src.platforms_at(offset)
        for platform in platforms:
            if platform not in compiled_for:
                continue  # this block is not compiled for that platform
            if deprecated and platform in deprecated and (deprecated[platform] is None or deprecated[platform] <= targets[platform]):
                problems.setdefault(key, []).append("is deprecated on %s%s" % (platform, "" if deprecated[platform] is None else " since %s" % show(deprecated[platform])))
            need = needs.get(platform)
            if need is None:
                continue
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
    apple, fingerprints = read_apple_apis(args.apple_apis)
    stale = []
    for path in sorted(parsed):
        rel = os.path.relpath(path, os.path.dirname(root_of[path]))
        regions = apple_only_code(parsed[path], whole=path in example_files)
        known = fingerprints.get(rel)
        if regions and known != fingerprint(parsed[path], regions):
            line = parsed[path].position(regions[0][0])[0]
            stale.append("%s:%d: Apple-only code %s since %s was derived: APIs it may use are unchecked here "
                         "(run scripts/availability/derive-apple-apis.sh with an SDK copy; docs/client.md)"
                         % (rel, line, "changed" if known else "added", os.path.basename(args.apple_apis)))
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
            for regex, title, needs, deprecated, modules in apple:
                if not modules & src.imports:
                    continue  # `.id` is ActivityKit's only where ActivityKit is imported
                for m in regex.finditer(chunk):
                    if declares(chunk, m.start()):
                        continue
                    report(path, a + m.start(), title, needs, deprecated)
            for regex, needs, title in newer_only:
                for m in regex.finditer(chunk):
                    report(path, a + m.start(), title, needs)

    for key in sorted(problems):
        print("%s %s, outside any @available/#available scope that guarantees it" % (key, "; ".join(problems[key])))
    allow_stale = os.environ.get("ISLE_AVAILABILITY_STALE") == "warn"
    for line in stale:
        print(("note: " if allow_stale else "") + line)
    print("check-client-availability: %d references to APIs with Apple availability in %d compiled files, %d lines read as text (code for Apple platforms only) "
          "against %d derived Apple APIs; targets %s: %d problem(s)%s" % (checked_refs, len(indexed_files), text_lines, len(apple),
          ", ".join("%s %s" % (k, show(v)) for k, v in targets.items()), len(problems),
          "" if not stale else ", %d file(s) of Apple-only code changed since the list was derived%s" % (len(stale), " (allowed: ISLE_AVAILABILITY_STALE=warn)" if allow_stale else "")))
    return 1 if problems or (stale and not allow_stale) else 0


def swift_files(root):
    return sorted(os.path.realpath(p) for p in glob.glob(os.path.join(root, "**", "*.swift"), recursive=True))


def read_apple_apis(path):
    """The derived list: (regex, title, {platform: version | 'unavailable'}, {platform: deprecated
    version | None}) rows, and {file: fingerprint of its Apple-only code}."""
    rows, fingerprints = [], {}
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            m = re.match(r"#\s*fingerprint\t(\S+)\t(\w+)$", line)
            if m:
                fingerprints[m.group(1)] = m.group(2)
                continue
            if not line.strip() or line.startswith("#"):
                continue
            pattern, title, modules, ios, catalyst, macos, deprecated = (line.split("\t") + [""] * 7)[:7]
            needs = {}
            for platform, v in (("iOS", ios), ("macCatalyst", catalyst), ("macOS", macos)):
                if v == "unavailable":
                    needs[platform] = "unavailable"
                elif v:
                    needs[platform] = version(v)
            dep = {}
            for part in filter(None, (p.strip() for p in deprecated.split(","))):
                name, _, v = part.partition(" ")
                dep[name] = version(v) if v else None
            rows.append((re.compile(pattern), title, needs, dep, set(modules.split(","))))
    return rows, fingerprints


def apple_only_code(src, whole=False):
    """The regions of a file that only Apple's compilers see (all of it for an app's sources)."""
    return [(0, len(src.code))] if whole else inactive_regions(src)


def fingerprint(src, regions):
    """A hash of the code in those regions, comments and spacing aside."""
    import hashlib
    h = hashlib.sha256()
    for a, b in regions:
        h.update(" ".join(src.code[a:b].split()).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


# Which of the declared platforms can import a module (`canImport`): ActivityKit imports on Mac
# Catalyst too (its types are unavailable there); AppKit only on macOS; FoundationNetworking is Linux's.
IMPORTS = {"ActivityKit": {"iOS", "macCatalyst"}, "UIKit": {"iOS", "macCatalyst"}, "AppKit": {"macOS"},
           "FoundationNetworking": set(), "Glibc": set(), "Musl": set(), "WinSDK": set(), "Android": set()}


def condition_platforms(condition, platforms):
    """The declared platforms for which an `#if` condition holds."""
    out = set()
    for p in platforms:
        def atom(m):
            kind, arg = m.group(1), m.group(2).split(",")[0].strip()
            if kind == "os":
                return str(arg == "iOS" and p in ("iOS", "macCatalyst") or arg == "macOS" and p == "macOS" or arg == "Darwin")
            if kind == "targetEnvironment":
                return str(arg == "macCatalyst" and p == "macCatalyst" or arg == "simulator" and p == "iOS")
            if kind == "canImport":
                return str(p in IMPORTS.get(arg, set(platforms)))
            if kind == "arch":
                return "True"
            return "True"  # compiler(…), swift(…), hasFeature(…), …
        expr = re.sub(r"\b(os|targetEnvironment|canImport|arch|compiler|swift|hasFeature|hasAttribute)\s*\(([^()]*)\)", atom, condition)
        expr = re.sub(r"\b(?!True\b|False\b)[A-Za-z_]\w*\b", "False", expr)  # custom flags (DEBUG, …): not set by a package's build
        expr = expr.replace("&&", " and ").replace("||", " or ").replace("!", " not ")
        try:
            if eval(expr, {"__builtins__": {}}, {}):
                out.add(p)
        except Exception:
            out.add(p)  # a condition this cannot read: judged on every platform
    return out


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
