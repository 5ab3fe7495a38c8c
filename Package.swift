// swift-tools-version: 6.1
import PackageDescription

let swiftSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

/// A product of one of the server's dependencies: only with the Server trait on.
func server(_ product: String, _ package: String) -> Target.Dependency {
    .product(name: product, package: package, condition: .when(traits: ["Server"]))
}

let package = Package(
    name: "Isle",
    // The server needs macOS 14; IsleClient, the app side, iOS 16.1 (the first with Live Activities)
    // and Mac Catalyst 16.1 (no ActivityKit there: the adapter is compiled out). Linux has no floor.
    platforms: [.macOS(.v14), .iOS("16.1"), .macCatalyst("16.1")],
    products: [
        // What an app adds (docs/client.md): no dependency; an app's `.package(…, traits: [])` turns the
        // Server trait off, and SwiftPM then fetches none of the server's dependencies.
        .library(name: "IsleClient", targets: ["IsleClient"]),
        .library(name: "IsleCore", targets: ["IsleCore"]),
        .library(name: "IsleAPNs", targets: ["IsleAPNs"]),
        .library(name: "IsleTesting", targets: ["IsleTesting"]),
        .library(name: "IsleSimulator", targets: ["IsleSimulator"]),
        .library(name: "IsleClientSimulator", targets: ["IsleClientSimulator"]),
        .executable(name: "isle", targets: ["isle"]),
    ],
    // Everything but IsleClient and IsleCore needs the server's dependencies, which the Server trait
    // brings in. It is on by default, so `swift build`, `swift test` and `swift run isle demo` build
    // everything here; an app adds Isle with `traits: []` and resolves nothing else
    // (docs/client.md; scripts/check-client-package.sh runs that line).
    traits: [
        .trait(name: "Server", description: "The server, the simulator, the APNs client and the isle command, with their dependencies"),
        .default(enabledTraits: ["Server"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-crypto", from: "4.5.2"),
        .package(url: "https://github.com/apple/swift-certificates", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1", from: "1.7.4"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-http2", from: "1.46.0"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-nio-extras", from: "1.34.1"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-http-types", from: "1.8.0"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.2"),
        .package(url: "https://github.com/apple/swift-distributed-tracing", from: "1.7.3"),
        // Tracing's OTLP export; OTLP/HTTP only (the gRPC exporter's dependencies are not built).
        .package(url: "https://github.com/swift-otel/swift-otel", from: "1.6.0", traits: ["OTLPHTTP"]),
    ],
    targets: [
        // The app side (docs/client.md): Foundation and Apple's frameworks only, iOS 16.1+. Its
        // privacy manifest ships with it.
        .target(name: "IsleClient", resources: [.copy("PrivacyInfo.xcprivacy")], swiftSettings: swiftSettings),
        // Pure model and rules. Foundation only: no NIO, no database.
        .target(name: "IsleCore", swiftSettings: swiftSettings),
        // The delivery model and its pure rules: records and jobs, the lane rules, the planner, the
        // outcome resolver, the app circuit. IsleCore only: storage and HTTP depend on it, never the reverse.
        .target(name: "IsleDelivery", dependencies: ["IsleCore"], swiftSettings: swiftSettings),
        // The API's wire (docs/server.md): its request and answer types, a strict codec over JSONValue,
        // and the OpenAPI document made from those types. Foundation only: no NIO, no HTTP.
        .target(name: "IsleWire", dependencies: ["IsleCore", "IsleDelivery"], swiftSettings: swiftSettings),
        // A generic HTTP/2-over-TLS server (raw swift-nio-http2, APNs-style framing) and an
        // in-process certificate authority. Knows nothing of APNs; used by fakes and sinks.
        .target(
            name: "IsleHTTP2Server",
            dependencies: [
                server("NIOCore", "swift-nio"),
                server("NIOPosix", "swift-nio"),
                server("NIOHTTP2", "swift-nio-http2"),
                server("NIOSSL", "swift-nio-ssl"),
                server("X509", "swift-certificates"),
                server("SwiftASN1", "swift-asn1"),
                server("Crypto", "swift-crypto"),
                server("Logging", "swift-log"),
                server("ServiceLifecycle", "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        // The HTTP edge both of Isle's JSON APIs share (the server's and the simulator's control
        // API): one error envelope, body reading. No APNs, no store.
        .target(
            name: "IsleHTTPAPI",
            dependencies: [
                "IsleCore",
                server("Hummingbird", "hummingbird"),
                server("HTTPTypes", "swift-http-types"),
                server("NIOCore", "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        // The production APNs client: JWT provider tokens, device pushes, broadcast, channels.
        .target(
            name: "IsleAPNs",
            dependencies: [
                "IsleCore",
                server("AsyncHTTPClient", "async-http-client"),
                server("NIOCore", "swift-nio"),
                server("NIOSSL", "swift-nio-ssl"),
                server("NIOHTTP1", "swift-nio"),
                server("NIOPosix", "swift-nio"),
                server("NIOHTTP2", "swift-nio-http2"),
                server("NIOHPACK", "swift-nio-http2"),
                server("NIOTLS", "swift-nio"),
                server("Crypto", "swift-crypto"),
                server("Logging", "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // A strict fake APNs and simulated iPhones. Never imports IsleAPNs or the server: it parses
        // the wire on its own, so it is an independent check on them.
        .target(
            name: "IsleSimulator",
            dependencies: [
                "IsleCore", "IsleHTTP2Server", "IsleHTTPAPI",
                server("Hummingbird", "hummingbird"),
                server("Crypto", "swift-crypto"),
                server("Logging", "swift-log"),
                server("ServiceLifecycle", "swift-service-lifecycle"),
                server("AsyncHTTPClient", "async-http-client"),
            ],
            swiftSettings: swiftSettings
        ),
        // IsleClient against the simulated iPhone: SimulatedActivityKit as IsleClient's ActivityKit.
        .target(name: "IsleClientSimulator", dependencies: ["IsleClient", "IsleSimulator"], swiftSettings: swiftSettings),
        // Durable storage: apps, keys, installations, activities, the delivery queue.
        .target(
            name: "IsleStore",
            dependencies: [
                "IsleCore", "IsleDelivery", server("GRDB", "GRDB.swift"), server("Crypto", "swift-crypto"),
                server("PostgresNIO", "postgres-nio"), server("NIOSSL", "swift-nio-ssl"),
                server("Logging", "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // The Isle server: HTTP API and the delivery engine.
        .target(
            name: "IsleServer",
            dependencies: [
                "IsleCore", "IsleDelivery", "IsleAPNs", "IsleStore", "IsleHTTPAPI", "IsleWire",
                server("AsyncHTTPClient", "async-http-client"),
                server("NIOSSL", "swift-nio-ssl"),
                server("Hummingbird", "hummingbird"),
                server("HTTPTypes", "swift-http-types"),
                server("HummingbirdCore", "hummingbird"),
                server("NIOCore", "swift-nio"),
                server("NIOHTTPTypes", "swift-nio-extras"),
                server("Metrics", "swift-metrics"),
                server("Prometheus", "swift-prometheus"),
                server("Crypto", "swift-crypto"),
                server("Logging", "swift-log"),
                server("ServiceLifecycle", "swift-service-lifecycle"),
                server("Tracing", "swift-distributed-tracing"),
            ],
            swiftSettings: swiftSettings
        ),
        // `isle demo`: the whole system in one process, driven over HTTP like a real backend and app.
        .target(
            name: "IsleDemo",
            dependencies: [
                "IsleCore", "IsleDelivery", "IsleServer", "IsleStore", "IsleSimulator", "IsleClient", "IsleClientSimulator",
                server("AsyncHTTPClient", "async-http-client"),
                server("Hummingbird", "hummingbird"),
                server("ServiceLifecycle", "swift-service-lifecycle"),
                server("NIOCore", "swift-nio"),
                server("NIOHTTP1", "swift-nio"),
                server("Crypto", "swift-crypto"),
                server("Logging", "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // Test kit: a recording APNs sink over real HTTP/2 + TLS, manual clocks, fixtures.
        .target(
            name: "IsleTesting",
            dependencies: [
                "IsleCore", "IsleHTTP2Server",
                server("Crypto", "swift-crypto"),
                server("Logging", "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // The `isle` command's commands, as a library so they can be tested.
        .target(
            name: "IsleCommandLine",
            dependencies: [
                "IsleCore", "IsleDelivery", "IsleAPNs", "IsleSimulator", "IsleStore", "IsleServer", "IsleDemo", "IsleHTTP2Server", "IsleWire",
                server("ServiceLifecycle", "swift-service-lifecycle"),
                server("UnixSignals", "swift-service-lifecycle"),
                server("OTel", "swift-otel"),
                server("Tracing", "swift-distributed-tracing"),
                server("ArgumentParser", "swift-argument-parser"),
                server("Logging", "swift-log"),
                server("Crypto", "swift-crypto"),
            ],
            swiftSettings: swiftSettings
        ),
        .executableTarget(name: "isle", dependencies: ["IsleCommandLine"], swiftSettings: swiftSettings),
        .executableTarget(
            name: "isle-bench",
            dependencies: [
                "IsleCore", "IsleDelivery", "IsleAPNs", "IsleTesting", "IsleHTTP2Server", "IsleServer", "IsleStore", "IsleSimulator", "IsleClient", "IsleClientSimulator",
                server("AsyncHTTPClient", "async-http-client"),
                server("Hummingbird", "hummingbird"),
                server("ArgumentParser", "swift-argument-parser"),
                server("Logging", "swift-log"),
                server("Crypto", "swift-crypto"),
                server("ServiceLifecycle", "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        // IsleClient alone (the network scripted through URLProtocol): no server dependency, as an app holds it.
        .testTarget(name: "IsleClientTests", dependencies: ["IsleClient"], swiftSettings: swiftSettings),
        .testTarget(name: "IsleCoreTests", dependencies: ["IsleCore", "IsleTesting"], swiftSettings: swiftSettings),
        .testTarget(name: "IsleWireTests", dependencies: ["IsleWire", "IsleCore", "IsleDelivery"], swiftSettings: swiftSettings),
        .testTarget(
            name: "IsleAPNsTests",
            dependencies: [
                "IsleAPNs", "IsleCore", "IsleTesting", "IsleHTTP2Server", "IsleSimulator",
                server("Crypto", "swift-crypto"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "IsleSimulatorTests",
            dependencies: [
                "IsleSimulator", "IsleCore", "IsleTesting",
                server("AsyncHTTPClient", "async-http-client"),
                server("Hummingbird", "hummingbird"),
                server("Crypto", "swift-crypto"),
                server("NIOSSL", "swift-nio-ssl"),
                server("Logging", "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "IsleStoreTests",
            dependencies: ["IsleStore", "IsleDelivery", "IsleCore", "IsleTesting", server("GRDB", "GRDB.swift"), server("Logging", "swift-log")],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "IsleServerTests",
            dependencies: [
                "IsleServer", "IsleStore", "IsleDelivery", "IsleSimulator", "IsleCore", "IsleTesting", "IsleHTTP2Server", "IsleClient", "IsleClientSimulator", "IsleWire",
                server("AsyncHTTPClient", "async-http-client"),
                server("OTel", "swift-otel"),
                server("Tracing", "swift-distributed-tracing"),
                server("Hummingbird", "hummingbird"),
                server("NIOCore", "swift-nio"),
                server("NIOPosix", "swift-nio"),
                server("Crypto", "swift-crypto"),
                server("Logging", "swift-log"),
                server("ServiceLifecycle", "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "IsleCommandLineTests",
            dependencies: ["IsleCommandLine", "IsleCore", "IsleDelivery", "IsleTesting", "IsleHTTP2Server", "IsleSimulator", "IsleDemo", "IsleStore", "IsleServer", server("Logging", "swift-log")],
            swiftSettings: swiftSettings
        ),
    ],
    swiftLanguageModes: [.v6]
)
