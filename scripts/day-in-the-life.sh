#!/usr/bin/env bash
# A day in the life (docs/performance.md, "A day in the life"; docs/simulator.md): simulated phones
# on iOS 16.4, 17, 18 and 26 with IsleClient as their apps, the Isle server on a SQLite file and
# the simulator with its defaults — Apple's leeway on — on one virtual clock, for 24 virtual hours.
# It prints its figures and exits 1 if any promise broke. Loopback only; seeded (DAY_SEED).
# Usage: scripts/day-in-the-life.sh [extra isle-bench day options, e.g. --phones 2000 --realistic]
set -euo pipefail
cd "$(dirname "$0")/.."
swift build --product isle-bench >/dev/null
mkdir -p artifacts
.build/debug/isle-bench day --phones "${DAY_PHONES:-300}" --hours "${DAY_HOURS:-24}" --seed "${DAY_SEED:-1}" "$@" 2>artifacts/day-in-the-life.progress | tee artifacts/day-in-the-life.txt
