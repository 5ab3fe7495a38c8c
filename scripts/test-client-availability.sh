#!/usr/bin/env bash
# Shows that scripts/check-client-availability.sh passes on the client and fails, naming the API and
# its iOS version, when an iOS 18 call is added without a guard — in compiled code (the index) and
# in code only Apple's compilers see (read as text); a guarded call passes. Run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export ISLE_AVAILABILITY_WORK="$work/check"
failures=0

expect() {  # expect <0|1> <text the output must hold or ""> <description> <package dir>
  local want="$1" needle="$2" what="$3" dir="$4" out rc=0
  out="$(bash scripts/check-client-availability.sh "$dir" 2>&1)" || rc=$?
  if [ "$rc" != "$want" ] || { [ -n "$needle" ] && ! grep -qF -- "$needle" <<<"$out"; }; then
    echo "FAIL: $what (exit $rc, wanted $want${needle:+ and \"$needle\"})"; echo "$out" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok: $what"; grep -F -- "${needle:-check-client-availability:}" <<<"$out" | head -2 | sed 's/^/    /'
  fi
}

# A copy of the client with one change: $1 = file under Sources/IsleClient, $2 = Swift appended to it,
# $3 = an import put first (optional).
variant() {
  local dir="$work/client-$RANDOM$RANDOM"
  mkdir -p "$dir" && cp -R Client/Package.swift Client/Sources "$dir/"
  if [ -n "${3:-}" ]; then printf '%s\n%s' "$3" "$(cat "$dir/Sources/IsleClient/$1")" > "$dir/Sources/IsleClient/$1"; fi
  printf '\n%s\n' "$2" >> "$dir/Sources/IsleClient/$1"
  echo "$dir"
}

expect 0 "0 problem(s)" "the client as it is" Client
expect 1 "Mutex" "an unguarded Mutex(0) (iOS 18) in compiled code is named" \
  "$(variant Outbox.swift 'func probeMutex() -> Int { let m = Mutex(0); return m.withLock { $0 } }' 'import Synchronization')"
expect 1 "next(isolation:) needs iOS 18" "an unguarded next(isolation:) (iOS 18) in compiled code is named" \
  "$(variant Sending.swift 'func probeNext() async -> Int? { var it = AsyncStream<Int> { $0.finish() }.makeAsyncIterator(); return await it.next(isolation: nil) }')"
expect 0 "0 problem(s)" "the same Mutex under @available(iOS 18.0, macCatalyst 18.0, macOS 15.0, *) passes" \
  "$(variant Outbox.swift '@available(iOS 18.0, macCatalyst 18.0, macOS 15.0, *) func probeMutex() -> Int { let m = Mutex(0); return m.withLock { $0 } }' 'import Synchronization')"
expect 0 "0 problem(s)" "the same next(isolation:) inside if #available(iOS 18.0, macCatalyst 18.0, macOS 15.0, *) passes" \
  "$(variant Sending.swift 'func probeNext() async -> Int? { if #available(iOS 18.0, macCatalyst 18.0, macOS 15.0, *) { var it = AsyncStream<Int> { $0.finish() }.makeAsyncIterator(); return await it.next(isolation: nil) }; return nil }')"
expect 1 "Mutex" "an unguarded Mutex in code only Apple's compilers see (read as text) is named" \
  "$(variant Apple/ActivityKitAdapter.swift '#if canImport(ActivityKit)
import Synchronization
let probe = Mutex(0)
#endif')"
expect 1 "pushToStartToken needs iOS 17.2" "push-to-start (iOS 17.2) outside #available in the ActivityKit adapter is named" \
  "$(variant Apple/ActivityKitAdapter.swift '#if canImport(ActivityKit)
@available(iOS 16.1, *)
func probe<A: ActivityAttributes>(_: A.Type) -> Data? { Activity<A>.pushToStartToken }
#endif')"

if [ "$failures" -gt 0 ]; then echo "test-client-availability: $failures failure(s)"; exit 1; fi
echo "test-client-availability: all passed"
