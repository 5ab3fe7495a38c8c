#!/usr/bin/env bash
# Builds the release tarball: an `isle` linked with the Swift standard library and Foundation
# statically (no Swift runtime needed on the target machine), with the systemd unit, an example
# config and the licence-free docs pointer. The commit is stamped into `isle --version`.
#   scripts/release.sh            # -> dist/isle-<version>-linux-<arch>.tar.gz
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$(sed -n 's/.*static let version = "\(.*\)"/\1/p' Sources/IsleCommandLine/Version.swift)
COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
VERSION_FILE=Sources/IsleCommandLine/Version.swift
cp "$VERSION_FILE" /tmp/isle-Version.swift.orig
trap 'cp -f /tmp/isle-Version.swift.orig "$VERSION_FILE"' EXIT
sed -i "s/static let commit = .*/static let commit = \"commit $COMMIT\"/" "$VERSION_FILE"
# FoundationNetworking (pulled in by swift-http-types) links the system's libcurl dynamically
# (libcurl4-openssl-dev to build; libcurl4, on every Debian and Ubuntu server, to run).
swift build --traits Server -c release --static-swift-stdlib --product isle --scratch-path .build-release
NAME="isle-$VERSION-linux-$(uname -m)"
rm -rf "dist/$NAME" "dist/$NAME.tar.gz"
mkdir -p "dist/$NAME"
cp .build-release/release/isle "dist/$NAME/isle"
strip "dist/$NAME/isle" 2>/dev/null || true
cp packaging/isle.service packaging/isle.json "dist/$NAME/"
printf 'Isle %s (commit %s)\nDocumentation: README.md and docs/ in the source repository.\nInstall: see isle.service.\n' "$VERSION" "$COMMIT" > "dist/$NAME/README.txt"
tar -C dist -czf "dist/$NAME.tar.gz" "$NAME"
echo "dist/$NAME.tar.gz"
