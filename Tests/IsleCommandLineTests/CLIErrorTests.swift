import Foundation
@testable import IsleCommandLine
import IsleCore
import IsleTesting
import Testing

/// Each failure a new operator meets (issue 27) names the cause and the fix, and exits with the
/// status of its kind (README, "Exit statuses").
@Suite("isle: errors that name the cause and the fix", .serialized)
struct CLIErrorTests {
    @Test("without --ca-cert against a server with its own CA: a configuration error naming --ca-cert, not the Apple Developer account")
    func missingCACert() async throws {
        try await CLIHarness.with { h in
            let flags = h.flags.split(separator: "--ca-cert").first.map(Array.init) ?? []
            let r = await IsleCLI.capture(["push", "update", "--token", token, "--content-state", "{}"] + flags, now: now)
            #expect(r.status == ExitStatus.configuration, "\(r.err)")
            #expect(r.err.contains("--ca-cert") && r.err.contains("isle sim prints it") && !r.err.contains("Apple Developer account"), "\(r.err)")
            #expect(h.sink.requests.isEmpty)
        }
    }

    @Test("nothing listening: the URL and what to check, exit 69 (unavailable), no raw networking error")
    func connectionRefused() async throws {
        try await CLIHarness.with { h in
            let port = try freeLoopbackPort()
            var flags = h.flags
            if let i = flags.firstIndex(of: "--url") { flags[i + 1] = "https://127.0.0.1:\(port)" }
            let r = await IsleCLI.capture(["push", "update", "--token", token, "--content-state", "{}", "--timeout", "5"] + flags, now: now)
            #expect(r.status == ExitStatus.unavailable, "\(r.err)")
            #expect(r.err.contains("nothing answers at https://127.0.0.1:\(port)") && r.err.contains("is the server running"), "\(r.err)")
            #expect(r.err.split(separator: "\n").count == 1)
        }
    }

    @Test("a --key-id that is not the one in AuthKey_<ID>.p8: refused before anything is sent, exit 78")
    func keyIDMismatch() async throws {
        try await CLIHarness.with { h in
            let dir = FileManager.default.temporaryDirectory.appendingPathComponent("isle-keyid-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
            let named = dir.appendingPathComponent("AuthKey_ABCDE12345.p8").path
            try FileManager.default.copyItem(atPath: h.keyPath, toPath: named)
            var flags = h.flags
            if let i = flags.firstIndex(of: "--key") { flags[i + 1] = named }
            let r = await IsleCLI.capture(["push", "update", "--token", token, "--content-state", "{}"] + flags, now: now)
            #expect(r.status == ExitStatus.configuration)
            #expect(r.err.contains("--key-id \(h.key.keyID) does not match the key file AuthKey_ABCDE12345.p8") && r.err.contains("give --key-id ABCDE12345"), "\(r.err)")
            #expect(h.sink.requests.isEmpty)
        }
    }

    @Test("every missing credential named at once, exit 64 (usage)")
    func missingAtOnce() async {
        let r = await IsleCLI.capture(["push", "update", "--token", token, "--content-state", "{}", "--bundle-id", "com.example.pizza", "--sandbox"], environment: [:], now: now)
        #expect(r.status == ExitStatus.usage)
        #expect(r.err.contains("missing --key (") && r.err.contains("missing --key-id (") && r.err.contains("missing --team-id ("), "\(r.err)")
        #expect(r.err.split(separator: "\n").count == 1)
    }

    @Test("every missing required option of any command named at once, exit 64: app add, key create, db backup")
    func missingOptionsAtOnce() async {
        let add = await IsleCLI.capture(["app", "add"])
        #expect(add.status == ExitStatus.usage)
        // The key's three options are required together, and only for a new app (SetupCommandsTests).
        #expect(add.err.contains("'--bundle-id"), "\(add.err)")
        #expect(add.err.contains("see 'isle app add --help'") && add.err.split(separator: "\n").count == 1, "\(add.err)")
        let partial = await IsleCLI.capture(["app", "add", "--bundle-id", "com.example.pizza", "--team-id", "TEAM000001"])
        #expect(partial.status == ExitStatus.usage && partial.err.contains("--key and --key-id: a provider key is given with all three"), "\(partial.err)")
        let key = await IsleCLI.capture(["key", "create"])
        #expect(key.status == ExitStatus.usage && key.err.contains("'--bundle-id") && key.err.contains("'--scope"), "\(key.err)")
        let backup = await IsleCLI.capture(["db", "backup"])
        #expect(backup.status == ExitStatus.usage && backup.err.contains("'--database") && backup.err.contains("'--to"), "\(backup.err)")
        // After "--" (positional arguments only), each missing option is still named once.
        let dashes = await IsleCLI.capture(["app", "add", "--", "extra"])
        #expect(dashes.status == ExitStatus.usage, "\(dashes.err)")
        for option in ["--bundle-id", "--key-id", "--team-id"] {
            #expect(dashes.err.components(separatedBy: "'\(option)").count <= 2, "\(option) named twice: \(dashes.err)")
        }
        // One missing option reads as before.
        let one = await IsleCLI.capture(["key", "create", "--scope", "backend"])
        #expect(one.err.contains("Missing expected argument '--bundle-id"), "\(one.err)")
    }

    @Test("tracing is off unless an OTEL_* variable asks for it; OTEL_SDK_DISABLED and OTEL_TRACES_EXPORTER=none keep it off; an exporter other than otlp is refused")
    func tracingSwitch() throws {
        func on(_ environment: [String: String]) throws -> Bool { try ServeTracing.wanted(environment) }
        #expect(try !on([:]))
        #expect(try !on(["OTEL_SERVICE_NAME": "isle"]))
        #expect(try on(["OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"]))
        #expect(try on(["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"]))
        #expect(try on(["OTEL_TRACES_EXPORTER": "otlp"]))
        #expect(try !on(["OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"]))
        #expect(try !on(["OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"]))
        #expect(throws: CLIError.self) { try on(["OTEL_TRACES_EXPORTER": "zipkin"]) }
        #expect(throws: CLIError.self) { try on(["OTEL_TRACES_EXPORTER": "console"]) }
    }

    @Test("OTEL_* values swift-otel would trap on or silently ignore are refused, every one named at once, before the tracer is made")
    func tracingProblems() {
        #expect(ServeTracing.problems(["OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
                                       "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01", "OTEL_PROPAGATORS": "tracecontext",
                                       "OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer x,team=isle"]).isEmpty)
        let bad = ServeTracing.problems(["OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "notaurl", "OTEL_TRACES_SAMPLER": "xray",
                                         "OTEL_PROPAGATORS": "tracecontext,b3,baggage", "OTEL_BSP_MAX_QUEUE_SIZE": "-5", "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd",
                                         "OTEL_EXPORTER_OTLP_HEADERS": "secret-without-equals"])
        #expect(bad.count == 8, "\(bad)")
        for fragment in ["grpc", "notaurl", "xray", "b3", "baggage", "OTEL_BSP_MAX_QUEUE_SIZE", "zstd", "OTEL_EXPORTER_OTLP_HEADERS"] {
            #expect(bad.contains { $0.contains(fragment) }, "\(fragment): \(bad)")
        }
        #expect(!bad.joined().contains("secret-without-equals"), "a header's value is echoed")
        #expect(ServeTracing.problems(["OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "5"]).count == 1)
    }

    @Test("isle serve on a port in use: the port named, exit 78")
    func portInUse() async throws {
        try await CLIHarness.with { h in
            // The sink's own port is taken.
            let port = URLComponents(string: h.sink.baseURL)?.port ?? 0
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("isle-port-\(UUID().uuidString).sqlite").path
            let r = await IsleCLI.capture(["serve", "--database", path, "--port", "\(port)", "--host", "127.0.0.1"])
            #expect(r.status == ExitStatus.configuration, "\(r.err)")
            #expect(r.err.contains("port \(port) on 127.0.0.1 is in use") && r.err.contains("--port"), "\(r.err)")
        }
    }

    @Test("a mistaken command is a usage error (64); validate's findings stay 1")
    func usage() async {
        #expect(await IsleCLI.capture(["nonsense"]).status == ExitStatus.usage)
        #expect(await IsleCLI.capture(["push", "update", "--priority", "7"]).status == ExitStatus.usage)
    }
}
