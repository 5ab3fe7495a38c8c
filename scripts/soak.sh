#!/usr/bin/env bash
# The randomized fault soak, longer and with any seed: the real server (SQLite) against the
# simulator, with 503s, 429s, latency, GOAWAY, token rotations mid-send, dismissals, bare ends and
# a hard restart; then every delivery invariant is checked (docs/server.md, "Delivery semantics").
#
#   scripts/soak.sh                       # a random seed, 120 s of operations
#   scripts/soak.sh --seed 42 --seconds 600 --activities 32
#   ISLE_SOAK_SEED=42 scripts/soak.sh     # replay a failure: the seed is printed first
set -euo pipefail
cd "$(dirname "$0")/.."

seed="${ISLE_SOAK_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}"
seconds="${ISLE_SOAK_SECONDS:-120}"
activities="${ISLE_SOAK_ACTIVITIES:-16}"
while [ $# -gt 0 ]; do
  case "$1" in
    --seed) seed="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --activities) activities="$2"; shift 2 ;;
    *) echo "soak.sh: unknown option $1 (use --seed N, --seconds N, --activities N)" >&2; exit 2 ;;
  esac
done
case "$seed$seconds$activities" in *[!0-9.]*) echo "soak.sh: --seed, --seconds and --activities take numbers" >&2; exit 2 ;; esac

echo "fault soak: seed $seed, $seconds s, $activities activities (replay: ISLE_SOAK_SEED=$seed $0 --seconds $seconds --activities $activities)"
ISLE_SOAK_SEED="$seed" ISLE_SOAK_SECONDS="$seconds" ISLE_SOAK_ACTIVITIES="$activities" \
  swift test --filter 'FaultSoakTests' 2>&1 | tee /tmp/isle-soak-"$seed".log | grep -E 'fault soak|✘|↳|Test run with' || true
if grep -q '✘' /tmp/isle-soak-"$seed".log || ! grep -q 'Test run with 1 test' /tmp/isle-soak-"$seed".log; then
  echo "fault soak FAILED with seed $seed (full log: /tmp/isle-soak-$seed.log)"
  exit 1
fi
echo "fault soak passed (seed $seed)"
