#!/usr/bin/env bash
# Checks that IsleClient (Client/) uses nothing newer than its deployment targets (Client/Package.swift:
# iOS 16.1, Mac Catalyst 16.1, macOS 13) outside a matching @available / #available scope, from this
# Linux machine: the client is built with an index store (every symbol it references, by file and
# line), the modules it imports are read with swift-symbolgraph-extract (which carries Apple
# availability on this toolchain), and code Linux cannot compile is read as text. docs/client.md
# lists what is checked and what is not.
#
#   scripts/check-client-availability.sh [PACKAGE_DIR]     (default: Client)
# Exit 0: nothing newer than the targets; 1: each problem printed as file:line:column; 2: could not check.
set -euo pipefail
cd "$(dirname "$0")/.."
package="${1:-Client}"
[ -f "$package/Package.swift" ] || { echo "check-client-availability: no Package.swift in $package" >&2; exit 2; }

toolchain="$(dirname "$(dirname "$(readlink -f "$(command -v swift)")")")"
work="${ISLE_AVAILABILITY_WORK:-${TMPDIR:-/tmp}/isle-availability}"
mkdir -p "$work"
triple="$(uname -m)-unknown-linux-gnu"

# The deployment targets, as Package.swift declares them: .iOS("16.1"), .macCatalyst("16.1"), .macOS(.v13).
targets="$(python3 - "$package/Package.swift" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
out = []
for platform, value in re.findall(r'\.(iOS|macOS|macCatalyst)\(\s*(?:"([\d.]+)"|\.v([\d_]+))\s*\)', text) and [(m[0], m[1] or m[2].replace("_", ".")) for m in re.findall(r'\.(iOS|macOS|macCatalyst)\(\s*(?:"([\d.]+)"|\.v([\d_]+))\s*\)', text)] or []:
    out.append("%s=%s" % (platform, value))
print(",".join(out))
PY
)"
[ -n "$targets" ] || { echo "check-client-availability: $package/Package.swift declares no iOS/macOS platforms" >&2; exit 2; }

# 1. The index: a fresh build of the package alone (no other package is fetched: it has none).
rm -rf "$work/index" "$work/build"   # a full build, so every file is indexed
if ! swift build --package-path "$package" --scratch-path "$work/build" -Xswiftc -index-store-path -Xswiftc "$work/index" >"$work/build.log" 2>&1; then
  cat "$work/build.log" >&2
  echo "check-client-availability: $package does not build" >&2
  exit 2
fi
# The client is a package an app adds on its own: building it must fetch nothing else.
if [ -n "$(ls -A "$work/build/checkouts" 2>/dev/null)" ]; then
  echo "check-client-availability: building $package fetched other packages: $(ls "$work/build/checkouts" | tr '\n' ' ')" >&2
  exit 1
fi
echo "check-client-availability: $package built alone, no other package fetched"
if [ ! -x "$work/indexdump" ] || [ scripts/availability/indexdump.c -nt "$work/indexdump" ]; then
  "$toolchain/bin/clang" -O1 -I"$toolchain/local/include" -o "$work/indexdump" scripts/availability/indexdump.c \
    -L"$toolchain/lib" -lIndexStore -Wl,-rpath,"$toolchain/lib"
fi
"$work/indexdump" "$work/index" > "$work/occurrences.tsv"

# 2. The symbol graphs of what the client can import here (kept between runs: they depend on the toolchain only).
graphs="$work/graphs-$(swift --version 2>/dev/null | head -1 | tr -cd '[:alnum:].-')"
if [ ! -f "$graphs/.done" ]; then
  rm -rf "$graphs" && mkdir -p "$graphs"
  for module in Swift _Concurrency _StringProcessing Synchronization Dispatch Foundation FoundationEssentials FoundationNetworking; do
    swift-symbolgraph-extract -module-name "$module" -target "$triple" -output-dir "$graphs" -minimum-access-level public >/dev/null 2>&1 \
      || echo "check-client-availability: no symbol graph for $module (not checked)" >&2
  done
  touch "$graphs/.done"
fi

# 3. The check.
python3 scripts/availability/check.py --index-dump "$work/occurrences.tsv" --symbol-graphs "$graphs" --sources "$package/Sources" \
  --targets "$targets" --apple-apis scripts/availability/apple-apis.tsv
