// swift-tools-version: 6.0
// IsleClient: the app side of Isle (docs/client.md). Its own package with no dependencies, so an
// app that adds it resolves nothing else; Isle's main package uses it by path for the demo and tests.
import PackageDescription

let package = Package(
    name: "IsleClient",
    // iOS 16.1 is the first with Live Activities (ActivityKit); everything newer is guarded with
    // `#available` and checked by scripts/check-client-availability.sh.
    platforms: [.iOS("16.1"), .macCatalyst("16.1"), .macOS(.v13)],
    products: [
        .library(name: "IsleClient", targets: ["IsleClient"]),
    ],
    targets: [
        .target(
            name: "IsleClient",
            swiftSettings: [
                .enableUpcomingFeature("ExistentialAny"),
                .enableUpcomingFeature("InternalImportsByDefault"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
