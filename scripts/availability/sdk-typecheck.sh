#!/usr/bin/env bash
# Type-checks IsleClient (Sources/IsleClient) and the example app (Examples/PizzaApp) with this
# machine's Swift toolchain against copies of Apple's SDK interfaces (.swiftinterface files, headers,
# module maps), for every deployment target Package.swift declares: iOS on each iPhoneOS SDK, Mac
# Catalyst and macOS on each MacOSX SDK, and iOS once more as an app extension links it
# (-application-extension: only extension-safe APIs, so `UIApplication.shared` is an error), with the
# example's widget extension (Examples/PizzaApp/WidgetExtension and Shared). Nothing is linked or run: it shows what Xcode's compiler
# would say of types, availability, deprecations, Sendable and isolation (-emit-sil runs the
# diagnostics a build runs after type-checking). docs/client.md says how to get the SDK copies; they
# stay outside the repository (never commit them or anything from them).
#
#   scripts/availability/sdk-typecheck.sh [SOURCES_DIR [EXAMPLE_DIR]]
#     ISLE_IOS_SDKS=<dir>   where the SDK copies are (default ~/.cache/isle-ios-sdk)
#     ONLY=ios|mac          one kind of SDK only (the planted-mistake test uses it)
#     APPEX=1|0|only        iOS also as an app extension (default 1), not (0), or only that (only)
# Exit 0: no error and no warning in the checked sources; 1: each printed as file:line:col; 2: no SDK,
# or the compiler failed outside the sources (the SDK copy or the toolchain, not the client).
set -uo pipefail
cd "$(dirname "$0")/../.."
SRC=${1:-Sources/IsleClient}
EXAMPLE=${2-Examples/PizzaApp}
CACHE=${ISLE_IOS_SDKS:-$HOME/.cache/isle-ios-sdk}
SWIFTC=$(command -v swiftc) || { echo "sdk-typecheck: no swiftc"; exit 2; }
LIB=$(dirname "$(dirname "$(readlink -f "$SWIFTC")")")/lib/swift

read -r IOS CATALYST MAC < <(python3 - Package.swift <<'PY'
import re, sys
t = open(sys.argv[1]).read()
f = {p: (a or b.replace("_", ".")) for p, a, b in re.findall(r"\.(iOS|macCatalyst|macOS)\(\s*(?:\"([\d.]+)\"|\.v([\d_]+))\s*\)", t)}
print(f.get("iOS", "-"), f.get("macCatalyst", f.get("iOS", "-")), f.get("macOS", "-"))
PY
)
FLAGS=(-swift-version 6 -enable-upcoming-feature ExistentialAny -enable-upcoming-feature InternalImportsByDefault)

sdks() { ls -d "$CACHE"/$1*.sdk 2>/dev/null | sort -V -r; }
IOS_SDKS=$(sdks iPhoneOS); MAC_SDKS=$(sdks MacOSX)
case "${ONLY:-}" in ios) MAC_SDKS="" ;; mac) IOS_SDKS="" ;; esac
if [ -z "$IOS_SDKS$MAC_SDKS" ]; then
  echo "sdk-typecheck: NOT RUN: no iPhoneOS or MacOSX SDK copy in $CACHE (docs/client.md: 'Proving it builds for iOS')"
  exit 2
fi

# A resource directory with clang's headers and the compiler plugins but none of the toolchain's
# Linux modules (its Foundation would shadow the SDK's).
WORK=$CACHE/.isle-typecheck/$("$SWIFTC" --version 2>&1 | head -1 | md5sum | cut -c1-8)
mkdir -p "$WORK/resource"
for d in clang apinotes host; do [ -e "$LIB/$d" ] && ln -sfn "$(readlink -f "$LIB/$d")" "$WORK/resource/$d"; done
OUT=$(mktemp -d); trap 'rm -rf "$OUT"' EXIT
mapfile -t CLIENT < <(find "$SRC" -name '*.swift' | sort)
mapfile -t APP < <([ -n "$EXAMPLE" ] && find "$EXAMPLE" -name '*.swift' | sort)
# The widget extension's part of the example: its own target, extension-safe like the client it links.
mapfile -t APPEX_FILES < <([ -n "$EXAMPLE" ] && [ -d "$EXAMPLE/WidgetExtension" ] && find "$EXAMPLE/WidgetExtension" "$EXAMPLE/Shared" -name '*.swift' | sort)

errors=0; warnings=0; unchecked=0; summary=()
check() {  # label sdk triple [extra compiler arguments...]
  local label=$1 sdk=$2 triple=$3; shift 3
  local common=(-target "$triple" -sdk "$sdk" -resource-dir "$WORK/resource" -module-cache-path "$WORK/modules" "$@")
  local mod="$OUT/$label"; mkdir -p "$mod"
  # The client as one module (one frontend job, so one file's error does not hide another's), its
  # module emitted for the example; then the example app against it.
  "$SWIFTC" -emit-sil -o "$mod/client.sil" -wmo -parse-as-library -module-name IsleClient -D SWIFT_PACKAGE "${FLAGS[@]}" "${common[@]}" \
    -emit-module -emit-module-path "$mod/IsleClient.swiftmodule" "${CLIENT[@]}" > "$mod/client.txt" 2>&1
  local rc=$? app_rc=0
  : > "$mod/app.txt"
  # The example is an iPhone app (Live Activities): checked on the iOS targets only; as an app
  # extension, its widget extension's files.
  if [[ "$label" == *appex* ]]; then
    if [ ${#APPEX_FILES[@]} -gt 0 ] && [ -f "$mod/IsleClient.swiftmodule" ]; then
      "$SWIFTC" -emit-sil -o "$mod/app.sil" -wmo -parse-as-library -module-name PizzaWidgetExtension "${FLAGS[@]}" "${common[@]}" -I "$mod" "${APPEX_FILES[@]}" > "$mod/app.txt" 2>&1
      app_rc=$?
    fi
  elif [ ${#APP[@]} -gt 0 ] && [ -f "$mod/IsleClient.swiftmodule" ] && [[ "$triple" == *-ios* && "$triple" != *macabi ]]; then
    "$SWIFTC" -emit-sil -o "$mod/app.sil" -wmo -parse-as-library -module-name PizzaApp "${FLAGS[@]}" "${common[@]}" -I "$mod" "${APP[@]}" > "$mod/app.txt" 2>&1
    app_rc=$?
  fi
  local found; found=$(cat "$mod/client.txt" "$mod/app.txt" | sed "s|^$PWD/||" | grep -E '^[^ ]+\.swift:[0-9]+:[0-9]+: (error|warning):' | sort -u)
  local ours; ours=$(printf '%s\n' "$found" | grep -E "^($SRC|${EXAMPLE:-/nonexistent})/" || true)
  local e w; e=$(printf '%s\n' "$ours" | grep -c ': error:'); w=$(printf '%s\n' "$ours" | grep -c ': warning:')
  local other; other=$(cat "$mod/client.txt" "$mod/app.txt" | sed "s|^$PWD/||" | grep -E '^[^ |].*error:' | grep -vE "^($SRC|${EXAMPLE:-/nonexistent})/[^:]*:[0-9]+:[0-9]+: error:" | head -1)
  echo "== $label ($(basename "$sdk"), $triple): $e error(s), $w warning(s)"
  [ -n "$ours" ] && printf '%s\n' "$ours"
  if [ -n "$other" ] || { [ "$rc" != 0 ] && [ "$e" = 0 ]; } || { [ "$app_rc" != 0 ] && [ "$e" = 0 ]; }; then
    echo "   could not check: the compiler failed outside the sources: ${other:-exit $rc/$app_rc}"
    unchecked=1; return
  fi
  errors=$((errors + e)); warnings=$((warnings + w)); summary+=("$label $e/$w")
}

for sdk in $IOS_SDKS; do
  [ "$IOS" != - ] && [ "${APPEX:-1}" != only ] && check "ios$IOS-$(basename "$sdk" .sdk)" "$sdk" "arm64-apple-ios$IOS"
  # As a widget extension links it: Xcode compiles code an app extension links with -application-extension.
  [ "$IOS" != - ] && [ "${APPEX:-1}" != 0 ] && check "ios$IOS-appex-$(basename "$sdk" .sdk)" "$sdk" "arm64-apple-ios$IOS" -application-extension
done
for sdk in $MAC_SDKS; do
  if [ "$CATALYST" != - ] && [ -d "$sdk/System/iOSSupport/System/Library/Frameworks" ]; then
    check "catalyst$CATALYST-$(basename "$sdk" .sdk)" "$sdk" "arm64-apple-ios$CATALYST-macabi" \
      -Fsystem "$sdk/System/iOSSupport/System/Library/Frameworks" -I "$sdk/System/iOSSupport/usr/lib/swift"
  fi
  [ "$MAC" != - ] && check "macos$MAC-$(basename "$sdk" .sdk)" "$sdk" "arm64-apple-macos$MAC"
done
[ "$unchecked" = 1 ] && { echo "sdk-typecheck: could not check every target (above)"; exit 2; }
echo "sdk-typecheck: $errors error(s), $warnings warning(s) in $SRC${EXAMPLE:+ and $EXAMPLE} (${summary[*]}; errors/warnings)"
[ "$errors" = 0 ] && [ "$warnings" = 0 ]
