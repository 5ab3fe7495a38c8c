import ArgumentParser
import AsyncHTTPClient
import Foundation
import IsleCore
import IsleDelivery
import IsleStore
import IsleTesting
#if canImport(Glibc)
import Glibc
#endif

/// One topic followed by a million activities: how long `isle serve` takes to queue the fan-out
/// durably (the 202) and to deliver it, and its peak memory. The followers are written straight
/// into the SQLite file before the server starts (registering a million through the API is not
/// what this measures); the pushes go to a recording APNs sink in a child process (`isle-bench
/// sink`: HTTP/2 + TLS, a 200 for every push), not to `isle sim` — a million simulated activities
/// would make the simulator the ceiling.
struct MillionBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "million",
        abstract: "A topic followed by a million activities: the fan-out queued durably and delivered by isle serve to a recording APNs sink; isle serve's peak RSS.")

    @Option(help: "Activities following the topic.") var activities = 1_000_000
    @Option(help: "isle serve --concurrency (deliveries in flight).") var concurrency = 256
    @Option(help: "Give up waiting for the deliveries after this many seconds.") var maxSeconds: Double = 900

    func run() async throws {
        let isle = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("isle").path
        guard FileManager.default.isExecutableFile(atPath: isle) else { throw ValidationError("no isle binary beside isle-bench (swift build -c release)") }
        guard (1...2_000_000).contains(activities), (1...4096).contains(concurrency) else { throw ValidationError("--activities: 1 to 2,000,000; --concurrency: 1 to 4096") }
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("isle-million-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let sink = try Sink.startChild()
        defer { sink.stop() }

        var env = ProcessInfo.processInfo.environment
        for key in env.keys where key.hasPrefix("OTEL_") || key.hasPrefix("ISLE_") { env[key] = nil }
        env["ISLE_MASTER_KEY_FILE"] = dir + "/master.key"
        env["ISLE_DATABASE"] = dir + "/isle.sqlite"
        try Child.output(isle, ["master-key"], environment: env).write(toFile: dir + "/master.key", atomically: true, encoding: .utf8)
        chmod(dir + "/master.key", 0o600)
        let key = TestProviderKey()
        try key.privateKeyPEM.write(toFile: dir + "/AuthKey.p8", atomically: true, encoding: .utf8)
        _ = try Child.output(isle, ["app", "add", "--bundle-id", "com.example.scores", "--key", dir + "/AuthKey.p8", "--key-id", key.keyID, "--team-id", key.teamID], environment: env)
        let backend = try Child.output(isle, ["key", "create", "--bundle-id", "com.example.scores", "--scope", "backend"], environment: env)

        // The followers, 10,000 per transaction, each with a token of its own.
        let seeded = ContinuousClock.now
        do {
            let store = try SQLiteStore(path: dir + "/isle.sqlite")
            let now = Date()
            for start in stride(from: 0, to: activities, by: 10_000) {
                let records = (start..<min(activities, start + 10_000)).map { i in
                    ActivityRecord(id: "act_\(i)", bundleID: "com.example.scores", attributesType: "ScoreAttributes", state: .active,
                                   updateToken: String(repeating: "0", count: 48) + String(format: "%016x", i), startedAt: now, topics: ["match"])
                }
                _ = try await store.enqueue([], creating: records, idempotency: nil, now: now)
            }
        }
        print(String(format: "%d activities following one topic, written in %.1f s", activities, SplitBench.seconds(ContinuousClock.now - seeded)))

        let port = try freeLoopbackPort()
        let server = try Child.start(isle, ["serve", "--port", "\(port)", "--apns-url", sink.url, "--apns-ca-cert", sink.caPath, "--concurrency", "\(concurrency)",
                                            "--backend-rate", "off", "--device-rate", "off", "--installation-rate", "off", "--address-rate", "off", "--log-level", "error"],
                                     environment: env, log: dir + "/serve.log")
        defer { server.stop() }
        let http = HTTPClient(eventLoopGroupProvider: .singleton)
        do {
            let base = "http://127.0.0.1:\(port)"
            do { try await SplitBench.waitFor(http, base + "/health") } catch {
                throw ValidationError("isle serve did not start: \(((try? String(contentsOfFile: dir + "/serve.log", encoding: .utf8)) ?? "").suffix(1000))")
            }
            let cpu0 = try SplitBench.cpu(of: server.pid)
            let start = ContinuousClock.now
            let answer = try await SplitBench.json(http, "POST", base + "/v1/topics/match/update", key: backend,
                                                   body: ["contentState": ["home": 1, "away": 0], "alert": ["title": "Goal", "body": "1–0"], "priority": 5])
            let queued = ContinuousClock.now - start
            guard answer["accepted"] == .int(activities) else { throw ValidationError("the fan-out accepted \(answer["accepted"]?.jsonString ?? "nothing")") }
            var peak = Self.memory(server.pid).rss
            var sent = 0
            let deadline = ContinuousClock.now + .seconds(Int64(maxSeconds))
            while sent < activities, ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(500))
                sent = try await SplitBench.sent(http, base)
                peak = max(peak, Self.memory(server.pid).rss)
            }
            let delivered = ContinuousClock.now - start
            let cpu = try SplitBench.cpu(of: server.pid) - cpu0
            let memory = Self.memory(server.pid)
            print(String(format: "the fan-out: queued durably (202) in %.2f s; %d of %d delivered to the sink in %.1f s (%.0f/s)%@",
                         SplitBench.seconds(queued), sent, activities, SplitBench.seconds(delivered), Double(sent) / SplitBench.seconds(delivered),
                         sent < activities ? " — gave up waiting" : ""))
            print(String(format: "isle serve: peak RSS %.0f MiB (VmHWM; %.0f MiB seen while delivering); CPU %.1f s = %.0f µs per delivery",
                         Double(max(memory.peak, peak)) / 1_048_576, Double(peak) / 1_048_576, cpu, cpu * 1e6 / Double(max(1, sent))))
            try await http.shutdown()
        } catch {
            try? await http.shutdown()
            throw error
        }
    }

    /// The process's resident memory now and at its peak (`VmRSS`, `VmHWM`), in bytes.
    static func memory(_ pid: pid_t) -> (rss: Int, peak: Int) {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return (0, 0) }
        func kB(_ field: String) -> Int {
            guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix(field + ":") }) else { return 0 }
            return (Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "0") ?? 0) * 1024
        }
        return (kB("VmRSS"), kB("VmHWM"))
    }
}
