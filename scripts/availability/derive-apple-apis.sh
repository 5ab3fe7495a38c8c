#!/usr/bin/env bash
# Derives scripts/availability/apple-apis.tsv from the code, with copies of Apple's SDK interfaces
# (the same ones scripts/availability/sdk-typecheck.sh uses; docs/client.md says how to get them):
# the client and the example are compiled for iOS (newest iPhoneOS SDK) and macOS (newest MacOSX
# SDK) with an index store, which names every API their Apple-only code references; the symbol
# graphs of ActivityKit, WidgetKit, UIKit, AppKit, Foundation and Security give each one's
# availability and deprecation. Nothing from the SDKs is written but API names and versions.
#
#   scripts/availability/derive-apple-apis.sh           rewrite the list
#   scripts/availability/derive-apple-apis.sh --check   fail (exit 1, with a diff) if the committed
#                                                        list is not what the code derives
# Exit 2: no SDK copy (nothing derived or checked).
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-}
CACHE=${ISLE_IOS_SDKS:-$HOME/.cache/isle-ios-sdk}
SWIFTC=$(command -v swiftc) || { echo "derive-apple-apis: no swiftc"; exit 2; }
LIB=$(dirname "$(dirname "$(readlink -f "$SWIFTC")")")/lib/swift
TOOLCHAIN=$(dirname "$(dirname "$(readlink -f "$(command -v swift)")")")
IOS_SDK=$(ls -d "$CACHE"/iPhoneOS*.sdk 2>/dev/null | sort -V -r | head -1)
MAC_SDK=$(ls -d "$CACHE"/MacOSX*.sdk 2>/dev/null | sort -V -r | head -1)
if [ -z "$IOS_SDK" ] || [ -z "$MAC_SDK" ]; then
  echo "derive-apple-apis: NOT RUN: it needs an iPhoneOS and a MacOSX SDK copy in $CACHE (docs/client.md: 'Proving it builds for iOS')"
  exit 2
fi
read -r IOS CATALYST MAC < <(python3 - Package.swift <<'PY'
import re, sys
t = open(sys.argv[1]).read()
f = {p: (a or b.replace("_", ".")) for p, a, b in re.findall(r"\.(iOS|macCatalyst|macOS)\(\s*(?:\"([\d.]+)\"|\.v([\d_]+))\s*\)", t)}
print(f.get("iOS", "-"), f.get("macCatalyst", f.get("iOS", "-")), f.get("macOS", "-"))
PY
)
WORK=$CACHE/.isle-typecheck/$("$SWIFTC" --version 2>&1 | head -1 | md5sum | cut -c1-8)
mkdir -p "$WORK/resource"
for d in clang apinotes host; do [ -e "$LIB/$d" ] && ln -sfn "$(readlink -f "$LIB/$d")" "$WORK/resource/$d"; done
OUT=$(mktemp -d); trap 'rm -rf "$OUT"' EXIT
INDEXDUMP=$WORK/indexdump
if [ ! -x "$INDEXDUMP" ] || [ scripts/availability/indexdump.c -nt "$INDEXDUMP" ]; then
  "$TOOLCHAIN/bin/clang" -O1 -I"$TOOLCHAIN/local/include" -o "$INDEXDUMP" scripts/availability/indexdump.c -L"$TOOLCHAIN/lib" -lIndexStore -Wl,-rpath,"$TOOLCHAIN/lib" || exit 2
fi
mapfile -t CLIENT < <(find "$PWD/Sources/IsleClient" -name '*.swift' | sort)
mapfile -t APP < <(find "$PWD/Examples/PizzaApp" -name '*.swift' | sort)
FLAGS=(-swift-version 6 -enable-upcoming-feature ExistentialAny -enable-upcoming-feature InternalImportsByDefault)

index() {  # label sdk triple modules... : the index store of the client (and, on iOS, the example); the symbol graphs
  local label=$1 sdk=$2 triple=$3; shift 3
  local common=(-target "$triple" -sdk "$sdk" -resource-dir "$WORK/resource" -module-cache-path "$WORK/modules")
  mkdir -p "$OUT/$label/objects" "$OUT/$label/graphs"
  # Compiled file by file (-c, no whole-module): the index store then holds every file's references.
  (cd "$OUT/$label/objects" && "$SWIFTC" -c -parse-as-library -module-name IsleClient -D SWIFT_PACKAGE "${FLAGS[@]}" "${common[@]}" \
     -emit-module -emit-module-path "$OUT/$label/objects/IsleClient.swiftmodule" \
     -index-store-path "$OUT/$label/index" -index-ignore-system-modules "${CLIENT[@]}") > "$OUT/$label/client.txt" 2>&1 \
    || { cat "$OUT/$label/client.txt"; echo "derive-apple-apis: the client does not compile for $triple (scripts/availability/sdk-typecheck.sh says why)"; exit 1; }
  if [[ "$triple" == *-ios* ]]; then
    (cd "$OUT/$label/objects" && "$SWIFTC" -c -parse-as-library -module-name PizzaApp "${FLAGS[@]}" "${common[@]}" -I "$OUT/$label/objects" \
       -index-store-path "$OUT/$label/index" -index-ignore-system-modules "${APP[@]}") > "$OUT/$label/app.txt" 2>&1 \
      || { cat "$OUT/$label/app.txt"; echo "derive-apple-apis: the example does not compile for $triple"; exit 1; }
  fi
  "$INDEXDUMP" "$OUT/$label/index" > "$OUT/$label.occurrences"
  local module
  for module in "$@"; do
    swift-symbolgraph-extract -module-name "$module" -target "$triple" -sdk "$sdk" -resource-dir "$WORK/resource" \
      -module-cache-path "$WORK/modules" -output-dir "$OUT/$label/graphs" -minimum-access-level public > "$OUT/$label/$module.graph.txt" 2>&1 \
      || { tail -3 "$OUT/$label/$module.graph.txt"; echo "derive-apple-apis: no symbol graph for $module ($triple)"; exit 2; }
  done
}
index ios "$IOS_SDK" "arm64-apple-ios$IOS" ActivityKit WidgetKit UIKit Foundation Security
index mac "$MAC_SDK" "arm64-apple-macos$MAC" AppKit WidgetKit Foundation Security

python3 scripts/availability/derive.py --occurrences "$OUT/ios.occurrences" "$OUT/mac.occurrences" --graphs "$OUT/ios/graphs" "$OUT/mac/graphs" \
  --sources Sources/IsleClient --example Examples/PizzaApp --sdks "$(basename "$IOS_SDK" .sdk) and $(basename "$MAC_SDK" .sdk)" \
  --targets "iOS=$IOS,macCatalyst=$CATALYST,macOS=$MAC" --out scripts/availability/apple-apis.tsv ${mode:+--check}
