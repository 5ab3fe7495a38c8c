// swift-tools-version: 6.1
import PackageDescription

let swiftSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
]

let package = Package(
    name: "Isle",
    platforms: [.macOS(.v14)],
    products: [
        .library(name: "IsleCore", targets: ["IsleCore"]),
        .library(name: "IsleAPNs", targets: ["IsleAPNs"]),
        .library(name: "IsleTesting", targets: ["IsleTesting"]),
        .library(name: "IsleSimulator", targets: ["IsleSimulator"]),
        .library(name: "IsleClientSimulator", targets: ["IsleClientSimulator"]),
        .executable(name: "isle", targets: ["isle"]),
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
        // The app side: its own package (Client/, no dependencies), used here by path.
        .package(path: "Client"),
    ],
    targets: [
        // Pure model and rules. Foundation only: no NIO, no database.
        .target(name: "IsleCore", swiftSettings: swiftSettings),
        // The delivery model and its pure rules: records and jobs, the lane rules, the planner, the
        // outcome resolver, the app circuit. IsleCore only: storage and HTTP depend on it, never the reverse.
        .target(name: "IsleDelivery", dependencies: ["IsleCore"], swiftSettings: swiftSettings),
        // A generic HTTP/2-over-TLS server (raw swift-nio-http2, APNs-style framing) and an
        // in-process certificate authority. Knows nothing of APNs; used by fakes and sinks.
        .target(
            name: "IsleHTTP2Server",
            dependencies: [
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        // The HTTP edge both of Isle's JSON APIs share (the server's and the simulator's control
        // API): one error envelope, body reading. No APNs, no store.
        .target(
            name: "IsleHTTPAPI",
            dependencies: [
                "IsleCore",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: swiftSettings
        ),
        // The production APNs client: JWT provider tokens, device pushes, broadcast, channels.
        .target(
            name: "IsleAPNs",
            dependencies: [
                "IsleCore",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOHPACK", package: "swift-nio-http2"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // A strict fake APNs and simulated iPhones. Never imports IsleAPNs or the server: it parses
        // the wire on its own, so it is an independent check on them.
        .target(
            name: "IsleSimulator",
            dependencies: [
                "IsleCore", "IsleHTTP2Server", "IsleHTTPAPI",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
            ],
            swiftSettings: swiftSettings
        ),
        // IsleClient against the simulated iPhone: SimulatedActivityKit as IsleClient's ActivityKit.
        .target(name: "IsleClientSimulator", dependencies: [.product(name: "IsleClient", package: "Client"), "IsleSimulator"], swiftSettings: swiftSettings),
        // Durable storage: apps, keys, installations, activities, the delivery queue.
        .target(
            name: "IsleStore",
            dependencies: [
                "IsleCore", "IsleDelivery", .product(name: "GRDB", package: "GRDB.swift"), .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "PostgresNIO", package: "postgres-nio"), .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // The Isle server: HTTP API and the delivery engine.
        .target(
            name: "IsleServer",
            dependencies: [
                "IsleCore", "IsleDelivery", "IsleAPNs", "IsleStore", "IsleHTTPAPI",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
            ],
            resources: [.copy("openapi.json")],
            swiftSettings: swiftSettings
        ),
        // `isle demo`: the whole system in one process, driven over HTTP like a real backend and app.
        .target(
            name: "IsleDemo",
            dependencies: [
                "IsleCore", "IsleServer", "IsleStore", "IsleSimulator", .product(name: "IsleClient", package: "Client"), "IsleClientSimulator",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // Test kit: a recording APNs sink over real HTTP/2 + TLS, manual clocks, fixtures.
        .target(
            name: "IsleTesting",
            dependencies: [
                "IsleCore", "IsleHTTP2Server",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        // The `isle` command's commands, as a library so they can be tested.
        .target(
            name: "IsleCommandLine",
            dependencies: [
                "IsleCore", "IsleAPNs", "IsleSimulator", "IsleStore", "IsleServer", "IsleDemo",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "OTel", package: "swift-otel"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: swiftSettings
        ),
        .executableTarget(name: "isle", dependencies: ["IsleCommandLine"], swiftSettings: swiftSettings),
        .executableTarget(
            name: "isle-bench",
            dependencies: [
                "IsleCore", "IsleAPNs", "IsleTesting", "IsleHTTP2Server", "IsleServer", "IsleStore", "IsleSimulator",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(name: "IsleCoreTests", dependencies: ["IsleCore", "IsleTesting"], swiftSettings: swiftSettings),
        .testTarget(
            name: "IsleAPNsTests",
            dependencies: [
                "IsleAPNs", "IsleCore", "IsleTesting", "IsleHTTP2Server", "IsleSimulator",
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "IsleSimulatorTests",
            dependencies: [
                "IsleSimulator", "IsleCore", "IsleTesting",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "IsleStoreTests",
            dependencies: ["IsleStore", "IsleCore", "IsleTesting", .product(name: "GRDB", package: "GRDB.swift"), .product(name: "Logging", package: "swift-log")],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "IsleServerTests",
            dependencies: [
                "IsleServer", "IsleStore", "IsleSimulator", "IsleCore", "IsleTesting", "IsleHTTP2Server", .product(name: "IsleClient", package: "Client"), "IsleClientSimulator",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "OTel", package: "swift-otel"),
                .product(name: "Tracing", package: "swift-distributed-tracing"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: swiftSettings
        ),
        .testTarget(
            name: "IsleCommandLineTests",
            dependencies: ["IsleCommandLine", "IsleCore", "IsleTesting", "IsleHTTP2Server", "IsleSimulator", "IsleDemo", "IsleStore", "IsleServer", .product(name: "Logging", package: "swift-log")],
            swiftSettings: swiftSettings
        ),
    ],
    swiftLanguageModes: [.v6]
)
