#!/usr/bin/env bash
# Fourteen planted mistakes, each added to a copy of IsleClient: scripts/check-client-availability.sh
# must fail on every one, naming the API and the line, where an SDK copy is present (the SDK
# type-check); where none is, on every one in Apple-only code as code changed since the derived list
# (naming the file and line), and on those the derived list can see by itself, naming the API. Then
# three cases of the SDK-free reading alone: #if blocks judged on their own platforms, and a
# deprecation. The client as it is must pass. Run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export ISLE_AVAILABILITY_WORK="$work/check"
failures=0; seen_by_list=0; planted=0; stale_refused=0
sdk=0; ls -d "${ISLE_IOS_SDKS:-$HOME/.cache/isle-ios-sdk}"/iPhoneOS*.sdk >/dev/null 2>&1 && sdk=1

# A copy of the client with one change: $1 file under Sources/IsleClient, $2 Swift appended, $3 an import put first.
variant() {
  local dir="$work/client-$RANDOM$RANDOM"
  mkdir -p "$dir/Sources" && cp -R Sources/IsleClient "$dir/Sources/"
  python3 scripts/availability/client-manifest.py Package.swift > "$dir/Package.swift"
  if [ -n "${3:-}" ]; then printf '%s\n%s' "$3" "$(cat "$dir/Sources/IsleClient/$1")" > "$dir/Sources/IsleClient/$1"; fi
  printf '\n%s\n' "$2" >> "$dir/Sources/IsleClient/$1"
  echo "$dir"
}

# plant <what> <API named in the output> <listed: 1 if the SDK-free reading must see it> <ios|mac> <file> <code> [import]
# "listed": the derived list (scripts/availability/apple-apis.tsv) holds the APIs the code uses today, so
# it sees a misuse of those (pushToStartToken, end(_:dismissalPolicy:), frequentPushesEnabled, currentPushInfo);
# an API the code does not use yet (Activity.content, .channel, UIKit's and AppKit's below) is
# not in it, and without an SDK the change is refused as Apple-only code the list was not derived from.
plant() {
  local what=$1 api=$2 listed=$3 kind=$4 file=$5 code=$6 imp=${7:-}
  planted=$((planted + 1))
  local dir; dir=$(variant "$file" "$code" "$imp")
  local line; line=$(( $(wc -l < "Sources/IsleClient/$file") + ${imp:+1} + 0 + 2 ))
  local out rc=0
  if [ "$sdk" = 1 ]; then
    # The extension check only for the plant that is about it (each check is a compile per SDK).
    local appex=0; [[ "$api" == *"application extensions"* ]] && appex=only
    out=$(ONLY=$kind APPEX=$appex bash scripts/availability/sdk-typecheck.sh "$dir/Sources/IsleClient" "" 2>&1) || rc=$?
    if [ "$rc" = 1 ] && grep -F -- "$api" <<<"$out" | grep -qE "$file:[0-9]+:"; then
      echo "ok (SDK): $what"; grep -F -- "$api" <<<"$out" | grep -E "$file:[0-9]+:" | head -1 | sed "s|$dir/||; s/^/    /"
    else
      echo "FAIL (SDK): $what (exit $rc, wanted 1 naming $api at $file)"; echo "$out" | tail -5 | sed 's/^/    /'; failures=$((failures + 1))
    fi
  fi
  # Without an SDK, Apple-only code changed since the list was derived never passes, whatever it uses:
  if [ "$file" != Outbox.swift ] && [ "$file" != Sending.swift ]; then
    rc=0; out=$(ISLE_IOS_SDKS="$work/no-sdk" bash scripts/check-client-availability.sh "$dir" 2>&1) || rc=$?
    if [ "$rc" = 1 ] && grep -qE "$file:[0-9]+: Apple-only code changed since" <<<"$out"; then stale_refused=$((stale_refused + 1))
    else echo "FAIL (list): $what passed as unchanged Apple-only code (exit $rc)"; echo "$out" | tail -3 | sed 's/^/    /'; failures=$((failures + 1)); fi
  fi
  # … and what the derived list sees by itself (the change allowed as if the list were re-derived):
  rc=0; out=$(ISLE_AVAILABILITY_STALE=warn ISLE_IOS_SDKS="$work/no-sdk" bash scripts/check-client-availability.sh "$dir" 2>&1) || rc=$?
  if [ "$rc" = 1 ] && grep -qF -- "$api" <<<"$out"; then
    seen_by_list=$((seen_by_list + 1)); echo "ok (list): $what"; grep -F -- "$api" <<<"$out" | head -1 | sed "s|$dir/||; s/^/    /"
  elif [ "$listed" = 1 ]; then
    echo "FAIL (list): $what (exit $rc, wanted 1 naming $api)"; echo "$out" | tail -4 | sed 's/^/    /'; failures=$((failures + 1))
  else
    echo "not seen without an SDK (as expected): $what"
  fi
}

# The client as it is passes both readings.
rc=0; out=$(bash scripts/check-client-availability.sh 2>&1) || rc=$?
if [ "$rc" = 0 ]; then echo "ok: the client and the example as they are"; else echo "FAIL: the client as it is (exit $rc)"; echo "$out" | tail -8; failures=$((failures + 1)); fi

AK='#if canImport(ActivityKit) && os(iOS) && !targetEnvironment(macCatalyst)
import ActivityKit'
plant "Mutex (iOS 18) in code Linux compiles" "Mutex" 1 ios Outbox.swift 'func probeMutex() -> Int { let m = Mutex(0); return m.withLock { $0 } }' 'import Synchronization'
plant "next(isolation:) (iOS 18) in code Linux compiles" "next(isolation:)" 1 ios Sending.swift 'func probeNext() async -> Int? { var it = AsyncStream<Int> { $0.finish() }.makeAsyncIterator(); return await it.next(isolation: nil) }'
plant "Mutex (iOS 18) in code only Apple's compilers see" "Mutex" 1 ios Apple/ActivityKitAdapter.swift "$AK
import Synchronization
@available(iOS 16.1, *) func probeMutex() -> Int { let m = Mutex(0); return m.withLock { \$0 } }
#endif"
plant "Activity.pushToStartToken (iOS 17.2) unguarded" "pushToStartToken" 1 ios Apple/ActivityKitAdapter.swift "$AK
@available(iOS 16.1, *) func probe<A: ActivityAttributes>(_: A.Type) -> Data? { Activity<A>.pushToStartToken }
#endif"
plant "Activity.content (iOS 16.2) under the 16.1 floor" "content" 0 ios Apple/ActivityKitAdapter.swift "$AK
@available(iOS 16.1, *) func probe<A: ActivityAttributes>(_ a: Activity<A>) -> Date? { a.content.staleDate }
#endif"
plant "end(_:dismissalPolicy:) (iOS 16.2) under the 16.1 floor" "end" 1 ios Apple/ActivityKitAdapter.swift "$AK
@available(iOS 16.1, *) func probe<A: ActivityAttributes>(_ a: Activity<A>) async { await a.end(nil, dismissalPolicy: .immediate) }
#endif"
plant "ActivityAuthorizationInfo.frequentPushesEnabled (iOS 16.2) unguarded" "frequentPushesEnabled" 1 ios Apple/ActivityKitAdapter.swift "$AK
@available(iOS 16.1, *) func probe() -> Bool { ActivityAuthorizationInfo().frequentPushesEnabled }
#endif"
plant "PushType.channel (iOS 18) unguarded" "channel" 0 ios Apple/ActivityKitAdapter.swift "$AK
@available(iOS 16.1, *) func probe() -> PushType { .channel(\"abc\") }
#endif"
plant "WidgetCenter.currentPushInfo (iOS 26) without #available" "currentPushInfo" 1 ios Apple/WidgetKitPushTokens.swift '#if canImport(WidgetKit, _version: 600) && os(iOS)
func probe() async -> Data? { await WidgetCenter.shared.currentPushInfo?.token }
#endif'
plant "UIKit: activateSceneSession(for:errorHandler:) (iOS 17) unguarded" "activateSceneSession" 0 ios Apple/SystemLifecycle.swift '#if canImport(UIKit) && os(iOS)
@MainActor func probe(_ r: UISceneSessionActivationRequest) { UIApplication.shared.activateSceneSession(for: r) { _ in } }
#endif'
# Extension-safe: a widget extension links IsleClient, so app-only API outside code marked
# @available(iOSApplicationExtension, unavailable) is an error there (the appex type-check).
plant "UIKit: UIApplication.shared where an app extension links the client" "unavailable in application extensions" 0 ios Apple/SystemLifecycle.swift '#if canImport(UIKit) && os(iOS)
@MainActor func probeShared() -> Bool { UIApplication.shared.isIdleTimerDisabled }
#endif'
plant "UIKit: UIApplication.keyWindow, deprecated in iOS 13" "keyWindow" 0 ios Apple/SystemLifecycle.swift '#if canImport(UIKit) && os(iOS)
@MainActor func probe() -> UIWindow? { UIApplication.shared.keyWindow }
#endif'
plant "AppKit: NSWindow.cascadingReferenceFrame (macOS 15) unguarded" "cascadingReferenceFrame" 0 mac Apple/KeychainStorage.swift '#if canImport(AppKit) && os(macOS)
import AppKit
@MainActor func probe(_ w: NSWindow) -> NSRect { w.cascadingReferenceFrame }
#endif'
plant "AppKit: NSWorkspace.launchApplication(_:), deprecated in macOS 11" "launchApplication" 0 mac Apple/KeychainStorage.swift '#if canImport(AppKit) && os(macOS)
import AppKit
func probe() -> Bool { NSWorkspace.shared.launchApplication("Safari") }
#endif'

# The SDK-free reading judges each #if block on its own platforms, and reports deprecations.
# list_only <what> <expected: pass|fail naming API> <api> <dir>
list_only() {
  local what=$1 want=$2 api=$3 dir=$4 rc=0 out
  out=$(ISLE_AVAILABILITY_STALE=warn ISLE_IOS_SDKS="$work/no-sdk" bash scripts/check-client-availability.sh "$dir" 2>&1) || rc=$?
  if { [ "$want" = pass ] && [ "$rc" = 0 ]; } || { [ "$want" = fail ] && [ "$rc" = 1 ] && grep -qF -- "$api" <<<"$out"; }; then
    echo "ok (list): $what"; [ "$want" = fail ] && grep -F -- "$api" <<<"$out" | head -1 | sed "s|$dir/||; s/^/    /"; true
  else
    echo "FAIL (list): $what (exit $rc, wanted $want)"; echo "$out" | tail -3 | sed 's/^/    /'; failures=$((failures + 1))
  fi
}
KC='#if os(iOS) && !targetEnvironment(macCatalyst) && canImport(ActivityKit)
import ActivityKit
@available(iOS 16.1, *) func probe<A: ActivityAttributes>(_: A.Type) -> Data? { if #available(iOS 17.2, *) { return Activity<A>.pushToStartToken }; return nil }
#endif'
list_only "an iPhone-only block inside code built for macOS and Mac Catalyst too is judged on iOS alone" pass "" "$(variant Apple/KeychainStorage.swift "$KC")"
list_only "the same block compiled for Mac Catalyst too: ActivityKit is unavailable there" fail "pushToStartToken is unavailable on macCatalyst" \
  "$(variant Apple/KeychainStorage.swift "${KC/ && !targetEnvironment(macCatalyst)/}")"
dir=$(variant Version.swift "")
mkdir -p "$dir/Examples" && cp -R Examples/PizzaApp "$dir/Examples/" && sed -i 's/\.iOS("16\.1")/.iOS("16.2")/; s/\.macCatalyst("16\.1")/.macCatalyst("16.2")/' "$dir/Package.swift"
list_only "the floor raised to iOS 16.2 under the example's request(attributes:contentState:pushType:): deprecated since 16.2" fail "is deprecated on iOS since 16.2" "$dir"

# A guarded use passes.
dir=$(variant Apple/ActivityKitAdapter.swift "$AK
@available(iOS 16.1, *) func probe<A: ActivityAttributes>(_: A.Type) -> Data? { if #available(iOS 17.2, *) { return Activity<A>.pushToStartToken }; return nil }
#endif")
rc=0; ISLE_AVAILABILITY_STALE=warn ISLE_IOS_SDKS="$work/no-sdk" bash scripts/check-client-availability.sh "$dir" >/dev/null 2>&1 || rc=$?
if [ "$rc" = 0 ]; then echo "ok: the same pushToStartToken inside #available(iOS 17.2, *) passes"; else echo "FAIL: a guarded use failed (exit $rc)"; failures=$((failures + 1)); fi

echo "test-client-availability: $planted planted mistakes; SDK type-check $([ "$sdk" = 1 ] && echo "caught every one it was given" || echo "NOT RUN (no SDK copy here)"); the SDK-free reading refused $stale_refused of the $((planted - 2)) in Apple-only code as changed since the list was derived, and its derived list saw $seen_by_list of $planted by itself"
if [ "$failures" -gt 0 ]; then echo "test-client-availability: $failures failure(s)"; exit 1; fi
echo "test-client-availability: all passed"
