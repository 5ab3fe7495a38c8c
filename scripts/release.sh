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
# The original is kept in a file of our own (mktemp, 0600), not at a fixed name in /tmp that another
# user could create first (a symlink, or a file they could rewrite before it is copied back).
VERSION_ORIG=$(mktemp)
cp "$VERSION_FILE" "$VERSION_ORIG"
trap 'cp -f "$VERSION_ORIG" "$VERSION_FILE"; rm -f "$VERSION_ORIG"' EXIT
sed -i "s/static let commit = .*/static let commit = \"commit $COMMIT\"/" "$VERSION_FILE"
# FoundationNetworking (pulled in by swift-http-types) links the system's libcurl dynamically
# (libcurl4-openssl-dev to build; libcurl4, on every Debian and Ubuntu server, to run).
swift build -c release --static-swift-stdlib --product isle --scratch-path .build-release
NAME="isle-$VERSION-linux-$(uname -m)"
rm -rf "dist/$NAME" "dist/$NAME.tar.gz"
# Every mode set explicitly, whatever the builder's umask: the installation steps copy them as they
# are. isle.json is 0600 because `isle serve --config` refuses a file others can read (it may hold
# the database's password); the binary, the unit and the README are public.
install -d -m 0755 "dist/$NAME"
install -m 0755 .build-release/release/isle "dist/$NAME/isle"
strip "dist/$NAME/isle" 2>/dev/null || true
install -m 0644 packaging/isle.service "dist/$NAME/isle.service"
install -m 0600 packaging/isle.json "dist/$NAME/isle.json"
printf 'Isle %s (commit %s)\nDocumentation: README.md and docs/ in the source repository.\nInstall: see isle.service.\n' "$VERSION" "$COMMIT" > "dist/$NAME/README.txt"
chmod 0644 "dist/$NAME/README.txt"
# Owned by root in the archive: root unpacking it (GNU tar keeps the archive's owners for root)
# must not get files that the builder's uid, perhaps another user on the server, could replace
# before they are installed.
tar -C dist --owner=0 --group=0 --numeric-owner -czf "dist/$NAME.tar.gz" "$NAME"
echo "dist/$NAME.tar.gz"
