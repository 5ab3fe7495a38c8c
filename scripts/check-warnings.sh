#!/usr/bin/env bash
# 0 compiler warnings in Isle's own targets: reads build logs (swift build, swift run, swift test
# output) and fails on any warning in a file under Sources/ or Tests/ of this repository (the
# dependencies' own warnings are theirs). A log only lists files compiled in that build, so CI reads
# the logs of a fresh clone's build, where every file is compiled once.
#   scripts/check-warnings.sh LOG...
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: $0 LOG..." >&2; exit 2; }
# The compiler prints absolute paths, the physical ones on a symlinked checkout: strip either.
logical=$PWD; physical=$(pwd -P)
found=$(cat "$@" | sed "s|^$logical/||; s|^$physical/||" | grep -E '^(Sources|Tests)/[^:]+:[0-9]+:[0-9]+: warning:' | sort -u || true)
compiled=$(cat "$@" | grep -cE '^\[[0-9]+/[0-9]+\] Compiling ' || true)
ours=$(cat "$@" | grep -cE "Compiling (Isle|isle)" || true)
# A log of a build that compiled nothing of Isle's proves nothing.
if [ "$ours" = 0 ]; then
  echo "check-warnings: the logs compiled none of Isle's targets (a build that had nothing to do?); nothing was checked" >&2
  exit 2
fi
if [ -n "$found" ]; then
  printf '%s\n' "$found"
  echo "check-warnings: $(printf '%s\n' "$found" | wc -l) warning(s) in Isle's own sources (above); fix them" >&2
  exit 1
fi
echo "check-warnings: 0 warnings in Isle's own sources ($ours of $compiled compile steps were Isle's)"
