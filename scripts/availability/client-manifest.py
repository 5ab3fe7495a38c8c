#!/usr/bin/env python3
"""Prints a manifest of IsleClient alone, with the platforms of the manifest given (the root's):
the package an app's build holds, for checks that build the client by itself."""
import re
import sys

text = open(sys.argv[1]).read()
platforms = re.search(r"platforms:\s*(\[[^\]]*\])", text).group(1)
print('''// swift-tools-version: 6.1
import PackageDescription
let package = Package(name: "IsleClient", platforms: %s,
    products: [.library(name: "IsleClient", targets: ["IsleClient"])],
    targets: [.target(name: "IsleClient", resources: [.copy("PrivacyInfo.xcprivacy")],
        swiftSettings: [.enableUpcomingFeature("ExistentialAny"), .enableUpcomingFeature("InternalImportsByDefault")])],
    swiftLanguageModes: [.v6])''' % platforms)
