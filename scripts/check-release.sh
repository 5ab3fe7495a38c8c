#!/usr/bin/env bash
# CI's release check: build the tarball, check the binary needs no Swift library (ldd), and run
# `isle --version` and `isle demo` from the unpacked tarball in an empty directory.
set -euo pipefail
cd "$(dirname "$0")/.."
TARBALL=$(bash scripts/release.sh | tail -1)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
tar -C "$WORK" -xzf "$TARBALL"
BIN=$(ls -d "$WORK"/isle-*/isle)
if ldd "$BIN" | grep -Ei 'libswift|libFoundation|libdispatch|libBlocksRuntime|not found'; then
  echo "release check: the binary needs libraries a machine without Swift lacks"; exit 1
fi
EMPTY=$(mktemp -d)
(cd "$EMPTY" && env -i PATH=/usr/bin:/bin HOME="$EMPTY" "$BIN" --version | grep -q "^isle .*(commit ") || { echo "release check: isle --version does not name its commit"; exit 1; }
(cd "$EMPTY" && env -i PATH=/usr/bin:/bin HOME="$EMPTY" "$BIN" demo > "$WORK/demo.log" 2>&1) || { tail -20 "$WORK/demo.log"; echo "release check: isle demo failed from the tarball"; exit 1; }
rm -rf "$EMPTY"
echo "release check: ok ($(basename "$TARBALL"), $(du -h "$BIN" | cut -f1), no Swift library needed, isle demo passed from the tarball)"
