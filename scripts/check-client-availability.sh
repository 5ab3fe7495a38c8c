#!/usr/bin/env bash
# Proves IsleClient (Sources/IsleClient, and the example app in Examples/PizzaApp) builds for the
# platforms Package.swift declares (iOS 16.1, Mac Catalyst 16.1, macOS 14), in two readings:
#
# 1. The SDK type-check (scripts/availability/sdk-typecheck.sh), when copies of Apple's SDK
#    interfaces are on this machine (ISLE_IOS_SDKS, default ~/.cache/isle-ios-sdk; docs/client.md
#    says how to get them): Xcode's compiler front end against Apple's own interfaces, for every
#    declared target on every SDK there. Any error or warning fails. Without an SDK it says so, and
#    does not pass for it.
# 2. The reading that needs no SDK: the client is built alone with an index store (every symbol it
#    references, by file and line), the modules it imports are read with swift-symbolgraph-extract
#    (Apple availability, on this toolchain too), and code Linux cannot compile (and the example
#    app) is read as text against scripts/availability/apple-apis.tsv: every ActivityKit, WidgetKit,
#    UIKit, AppKit, Foundation and Security API that code uses with a limit on a declared platform,
#    derived from the code with an SDK (scripts/availability/derive-apple-apis.sh; with an SDK this
#    script checks that the committed list is still what the code derives). Each use is judged on
#    the platforms its #if block is compiled for; deprecations count; Apple-only code changed since
#    the list was derived fails (its new APIs would be unread).
#
#   scripts/check-client-availability.sh [PACKAGE_DIR]     (default: the repository)
#   ISLE_REQUIRE_SDK=1: an absent SDK is a failure (exit 2) instead of a note.
# Exit 0: both readings pass; 1: each problem printed as file:line:column; 2: could not check.
set -euo pipefail
cd "$(dirname "$0")/.."
package="${1:-.}"
[ -f "$package/Package.swift" ] || { echo "check-client-availability: no Package.swift in $package" >&2; exit 2; }

sdk_rc=0
if [ "$package" = . ]; then
  bash scripts/availability/sdk-typecheck.sh || sdk_rc=$?
else
  bash scripts/availability/sdk-typecheck.sh "$package/Sources/IsleClient" "" || sdk_rc=$?
fi
# With an SDK, the list the SDK-free reading uses must be what the code derives today.
derive_rc=0
if [ "$sdk_rc" != 2 ] && [ "$package" = . ]; then
  bash scripts/availability/derive-apple-apis.sh --check || derive_rc=$?
fi
case "$sdk_rc" in
  0) echo "check-client-availability: SDK type-check passed (0 errors, 0 warnings)" ;;
  1) echo "check-client-availability: SDK type-check FAILED (above)" ;;
  *) if [ "${ISLE_REQUIRE_SDK:-0}" = 1 ]; then echo "check-client-availability: no SDK type-check, and ISLE_REQUIRE_SDK=1" >&2; exit 2; fi
     echo "check-client-availability: SDK type-check NOT RUN (no SDK copy, or it could not check): only the reading below vouches for Apple platforms" ;;
esac

# The SDK-free reading builds the client alone, as an app's package would hold it: a package of
# IsleClient only, with the root manifest's platforms (the root itself resolves every dependency).
example=()
[ -d "$package/Examples/PizzaApp" ] && example=(--example "$package/Examples/PizzaApp")
if [ "$package" = . ]; then
  alone="$(mktemp -d)"; trap 'rm -rf "$alone"' EXIT
  mkdir -p "$alone/Sources" && cp -R Sources/IsleClient "$alone/Sources/"
  python3 scripts/availability/client-manifest.py Package.swift > "$alone/Package.swift"
  package="$alone"
fi

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

# 1. The index: a fresh build of the client alone (a package of IsleClient only, as an app holds it: no other package is fetched).
rm -rf "$work/index" "$work/build"   # a full build, so every file is indexed
if ! swift build --package-path "$package" --target IsleClient --scratch-path "$work/build" -Xswiftc -index-store-path -Xswiftc "$work/index" >"$work/build.log" 2>&1; then
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
list_rc=0
python3 scripts/availability/check.py --index-dump "$work/occurrences.tsv" --symbol-graphs "$graphs" --sources "$package/Sources/IsleClient" \
  --targets "$targets" --apple-apis scripts/availability/apple-apis.tsv "${example[@]}" || list_rc=$?
[ "$sdk_rc" = 1 ] && exit 1
[ "$derive_rc" = 1 ] && exit 1
exit "$list_rc"
