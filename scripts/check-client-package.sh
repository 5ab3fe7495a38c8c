#!/usr/bin/env bash
# An app adds IsleClient like any SDK: by the repository's URL and a version, with the line
# docs/client.md gives (`traits: []`: the default Server trait off). A consumer package (an app's
# manifest, in a temporary folder) holds exactly that line — read from docs/client.md, only its URL
# pointed at a clone of this repository tagged with the version in Sources/IsleClient/Version.swift
# — resolves it, builds against IsleClient, and must have fetched nothing but Isle: none of the
# server's dependencies. Run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
version=$(sed -nE 's/.*static let version = "([0-9.]+)".*/\1/p' Sources/IsleClient/Version.swift)
[ -n "$version" ] || { echo "check-client-package: no version in Sources/IsleClient/Version.swift" >&2; exit 2; }
grep -q "^## $version" CHANGELOG.md || { echo "check-client-package: CHANGELOG.md has no release notes for $version" >&2; exit 1; }

# The repository as a remote would serve it: the committed tree (with this working tree's changes,
# so the check runs before a commit too), tagged.
mkdir -p "$work/isle"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
  | tar --null -T - -cf - | tar -C "$work/isle" -xf -
git -C "$work/isle" init -q
git -C "$work/isle" add -A >/dev/null
git -C "$work/isle" -c user.email=ci@isle.invalid -c user.name=ci commit -qm "release $version" --allow-empty
git -C "$work/isle" tag "$version"

# The line an app writes, as docs/client.md writes it.
line=$(grep -m1 -oE '\.package\(url: "https://github.com/<owner>/isle"[^)]*\)' docs/client.md) \
  || { echo "check-client-package: docs/client.md has no .package(url: \"https://github.com/<owner>/isle\" …) line" >&2; exit 1; }
line=${line//https:\/\/github.com\/<owner>\/isle/file://$work/isle}
echo "check-client-package: the consumer's line (docs/client.md): ${line/file:\/\/$work\/isle/https://github.com/<owner>/isle}"

mkdir -p "$work/app/Sources/PizzaApp"
cat > "$work/app/Package.swift" <<SWIFT
// swift-tools-version: 6.1
import PackageDescription
let package = Package(
    name: "PizzaApp",
    platforms: [.iOS("16.1"), .macOS(.v14)],
    dependencies: [$line],
    targets: [.executableTarget(name: "PizzaApp", dependencies: [.product(name: "IsleClient", package: "isle")])]
)
SWIFT
cat > "$work/app/Sources/PizzaApp/main.swift" <<'SWIFT'
import Foundation
import IsleClient

let configuration = IsleClient.Configuration(serverURL: URL(string: "http://127.0.0.1:1")!, deviceKey: "isle_device_example")
let client = try IsleClient(configuration: configuration, storage: FileStorage(path: NSTemporaryDirectory() + "/isle-consumer.json"))
print("IsleClient \(IsleClient.version): installation \(await client.installationID)")
SWIFT
(cd "$work/app" && swift package resolve >"$work/resolve.log" 2>&1) || { cat "$work/resolve.log"; echo "check-client-package: the consumer did not resolve" >&2; exit 1; }
fetched=$(ls "$work/app/.build/checkouts")
pins=$(python3 -c 'import json,sys; print(" ".join(p["identity"] for p in json.load(open(sys.argv[1]))["pins"]))' "$work/app/Package.resolved")
if [ "$fetched" != isle ] || [ "$pins" != isle ]; then
  echo "check-client-package: adding IsleClient fetched more than Isle: checkouts [$(echo $fetched)], pins [$pins]" >&2
  exit 1
fi
(cd "$work/app" && swift build >"$work/build.log" 2>&1) || { tail -20 "$work/build.log"; echo "check-client-package: the consumer did not build" >&2; exit 1; }
out=$("$work/app/.build/debug/PizzaApp")
echo "check-client-package: a consumer added Isle $version by URL and version, fetched nothing else (checkouts: $fetched), built and ran: $out"
