import ArgumentParser
import Foundation
import IsleAPNs
import IsleCore
import IsleTesting
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

@main
struct IsleBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "isle-bench",
        abstract: "Isle's benchmarks. Build with -c release.",
        subcommands: [ClientBench.self, ServerBench.self, SplitBench.self, MillionBench.self, AudienceBench.self, DayBench.self, Sink.self]
    )
}

/// Process CPU time (user + system) in seconds.
func cpuSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6 + Double(usage.ru_stime.tv_sec) + Double(usage.ru_stime.tv_usec) / 1e6
}

/// A recording-free APNs sink over HTTP/2 + TLS, in its own process so the client's CPU can be
/// measured alone. Prints its URL and CA path, then serves until standard input closes.
struct Sink: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run an HTTP/2 + TLS sink on 127.0.0.1 (used by 'client' and 'million').")

    /// This executable's `sink` as a child process, once it printed where it listens.
    struct Running {
        let process: Process
        let input: Pipe
        let url: String
        let caPath: String
        func stop() {
            try? input.fileHandleForWriting.close()
            process.waitUntilExit()
        }
    }

    static func startChild() throws -> Running {
        let child = Process()
        child.executableURL = URL(fileURLWithPath: CommandLine.arguments[0])
        child.arguments = ["sink"]
        let toChild = Pipe()
        let fromChild = Pipe()
        child.standardInput = toChild
        child.standardOutput = fromChild
        try child.run()
        var url = ""
        var caPath = ""
        var buffer = Data()
        while url.isEmpty || caPath.isEmpty {
            let chunk = fromChild.fileHandleForReading.availableData
            if chunk.isEmpty {
                try? toChild.fileHandleForWriting.close()
                throw ValidationError("the sink process exited before it was ready")
            }
            buffer += chunk
            for line in String(decoding: buffer, as: UTF8.self).split(separator: "\n") {
                if line.hasPrefix("URL ") { url = String(line.dropFirst(4)) }
                if line.hasPrefix("CA ") { caPath = String(line.dropFirst(3)) }
            }
        }
        return Running(process: child, input: toChild, url: url, caPath: caPath)
    }

    func run() async throws {
        let sink = try await RecordingAPNsServer.bind(recordsRequests: false)
        let caPath = FileManager.default.temporaryDirectory.appendingPathComponent("isle-bench-ca-\(getpid()).pem").path
        try sink.caCertificatePEM.write(toFile: caPath, atomically: true, encoding: .utf8)
        FileHandle.standardOutput.write(Data("URL \(sink.baseURL)\nCA \(caPath)\n".utf8))
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await sink.run() }
            group.addTask {
                // Stop when the parent closes our standard input.
                _ = FileHandle.standardInput.readDataToEndOfFile()
            }
            _ = try await group.next()
            group.cancelAll()
        }
    }
}

struct ClientBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "client",
        abstract: "Pushes/s, latency and CPU of the IsleAPNs client's transports against a local HTTP/2 + TLS sink, next to h2load.")

    @Option(help: "Requests in flight, comma-separated.")
    var levels: String = "1,10,100,1000"
    @Option(help: "Requests per level (level 1 uses a fifth of this).")
    var requests: Int = 10_000
    @Option(help: "Stop a level after this many seconds.")
    var maxSeconds: Double = 60
    @Option(help: "Transports to measure, comma-separated: http2, async-http-client.")
    var transports: String = "http2,async-http-client"
    @Flag(help: "Do not run h2load even when it is installed.")
    var noH2load = false

    func run() async throws {
        let levelList = levels.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) }
        guard !levelList.isEmpty, levelList.allSatisfy({ $0 > 0 && $0 <= 5000 }) else { throw ValidationError("--levels: give numbers from 1 to 5000") }
        guard requests > 0, requests <= 1_000_000 else { throw ValidationError("--requests: 1 to 1,000,000") }
        var kinds: [APNsTransportKind] = []
        for name in transports.split(separator: ",") {
            guard let kind = APNsTransportKind(rawValue: name.trimmingCharacters(in: .whitespaces)) else {
                throw ValidationError("--transports: \"\(name)\" is not one of \(APNsTransportKind.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            kinds.append(kind)
        }

        // Start the sink as a child process.
        let sink = try Sink.startChild()
        defer { sink.stop() }
        let (url, caPath) = (sink.url, sink.caPath)

        let key = TestProviderKey()
        let credentials = try APNsCredentials(keyID: key.keyID, teamID: key.teamID, pem: key.privateKeyPEM)
        let ca = try String(contentsOfFile: caPath, encoding: .utf8)
        var logger = Logger(label: "isle.bench")
        logger.logLevel = .warning
        let token = try DeviceToken(hex: String(repeating: "ab", count: 32))
        let push = APNsPush.liveActivity(
            LiveActivityPayload(event: .update, timestamp: Date(), contentState: ["driverName": "Anne Johnson", "deliveryTimer": [788_918_400, 788_919_900]]),
            token: token, bundleID: "com.example.pizza")

        print("IsleAPNs client → HTTP/2 + TLS sink on loopback (separate process); \(ProcessInfo.processInfo.activeProcessorCount) cores")
        var rows: [(name: String, level: Int, result: LevelResult)] = []
        for kind in kinds {
            let client = try APNsClient(configuration: .init(environment: .custom(url: url, trustRootsPEM: ca), credentials: credentials, transport: kind), logger: logger)
            // Warm up: connections, TLS, caches and pools.
            _ = try await runLevel(client: client, push: push, concurrency: 50, count: 2_000, maxSeconds: 30)
            for level in levelList {
                let count = level == 1 ? max(1, requests / 5) : requests
                rows.append((kind.rawValue, level, try await runLevel(client: client, push: push, concurrency: level, count: count, maxSeconds: maxSeconds)))
            }
            try await client.shutdown()
        }
        var h2loadRate: [Int: Double] = [:]
        if !noH2load {
            if let h2load = H2Load.find() {
                let request = try APNsClient(configuration: .init(environment: .custom(url: url, trustRootsPEM: ca), credentials: credentials), logger: logger).request(for: push)
                for level in levelList {
                    let count = level == 1 ? max(1, requests / 5) : requests
                    if let rate = try H2Load.run(path: h2load, request: request, requests: count, inFlight: level) {
                        h2loadRate[level] = rate
                        rows.append(("h2load", level, LevelResult(done: count, seconds: Double(count) / rate, cpu: .nan, latenciesMS: [])))
                    }
                }
            } else {
                print("h2load is not installed (Debian: apt-get install nghttp2-client); rates are not compared with it")
            }
        }
        print("transport         | in flight | requests | pushes/s | of h2load | p50 ms | p90 ms | p99 ms | max ms | client CPU s / 10k pushes")
        for row in rows.sorted(by: { ($0.level, $0.name == "h2load" ? 1 : 0) < ($1.level, $1.name == "h2load" ? 1 : 0) }) {
            let r = row.result
            let rate = Double(r.done) / r.seconds
            let share = h2loadRate[row.level].map { String(format: "%8.0f%%", rate / $0 * 100) } ?? "        -"
            if row.name == "h2load" {
                print(String(format: "%@ | %9d | %8d | %8.0f | %@ |      - |      - |      - |      - | -", row.name.padding(toLength: 17, withPad: " ", startingAt: 0), row.level, r.done, rate, share))
            } else {
                print(String(format: "%@ | %9d | %8d | %8.0f | %@ | %6.2f | %6.2f | %6.2f | %6.2f | %.2f",
                             row.name.padding(toLength: 17, withPad: " ", startingAt: 0), row.level, r.done, rate, share, r.p(0.5), r.p(0.9), r.p(0.99), r.p(1.0), r.cpu / Double(r.done) * 10_000))
            }
        }
    }

    struct LevelResult {
        var done: Int
        var seconds: Double
        var cpu: Double
        var latenciesMS: [Double]
        func p(_ q: Double) -> Double { quantile(latenciesMS, q) }
    }

    func runLevel(client: APNsClient, push: APNsPush, concurrency: Int, count: Int, maxSeconds: Double) async throws -> LevelResult {
        let next = Counter()
        let deadline = ContinuousClock.now + .milliseconds(Int(maxSeconds * 1000))
        let cpu0 = cpuSeconds()
        let start = ContinuousClock.now
        let latencies = try await withThrowingTaskGroup(of: [Double].self) { group in
            for _ in 0..<concurrency {
                group.addTask {
                    var mine: [Double] = []
                    while next.take() < count, ContinuousClock.now < deadline {
                        let t0 = ContinuousClock.now
                        try await client.send(push)
                        let d = ContinuousClock.now - t0
                        mine.append(Double(d.components.seconds) * 1000 + Double(d.components.attoseconds) / 1e15)
                    }
                    return mine
                }
            }
            return try await group.reduce(into: [Double]()) { $0 += $1 }
        }
        let elapsed = ContinuousClock.now - start
        return LevelResult(done: latencies.count, seconds: Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18,
                           cpu: cpuSeconds() - cpu0, latenciesMS: latencies.sorted())
    }
}

/// nghttp2's h2load against the same sink with the same request (headers, JWT, body): what one
/// HTTP/2 connection can carry here, as the yardstick for the Swift transports.
enum H2Load {
    static func find() -> String? {
        for dir in (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":") {
            let path = "\(dir)/h2load"
            if FileManager.default.isExecutableFile(atPath: path) { return path }
        }
        return nil
    }

    /// Requests per second h2load reports, or nil when it fails.
    static func run(path: String, request: APNsTransportRequest, requests: Int, inFlight: Int) throws -> Double? {
        let body = FileManager.default.temporaryDirectory.appendingPathComponent("isle-bench-body-\(getpid()).json")
        try Data(request.body).write(to: body)
        defer { try? FileManager.default.removeItem(at: body) }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        var arguments = ["-n", "\(requests)", "-c", "1", "-m", "\(inFlight)", "-d", body.path]
        for (name, value) in request.headers where name != "content-length" { arguments += ["-H", "\(name): \(value)"] }
        arguments.append(request.url)
        process.arguments = arguments
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        try process.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let text = String(decoding: data, as: UTF8.self)
        // "finished in 2.61s, 19157.09 req/s, 1.44MB/s"
        guard let line = text.split(separator: "\n").first(where: { $0.contains("req/s") }),
              let field = line.split(separator: ",").first(where: { $0.contains("req/s") }),
              let rate = Double(field.replacingOccurrences(of: "req/s", with: "").trimmingCharacters(in: .whitespaces)),
              text.contains("\(requests) succeeded") else { return nil }
        return rate
    }
}

/// Hands out request numbers to the workers.
final class Counter: Sendable {
    private let value = Atomic<Int>(0)
    func take() -> Int { value.wrappingAdd(1, ordering: .relaxed).oldValue }
}

/// The value at quantile `q` of sorted samples (nearest rank); `q` is clamped to [0, 1], so no
/// input can make the index conversion trap. The one helper every benchmark uses.
func quantile(_ sorted: [Double], _ q: Double) -> Double {
    guard !sorted.isEmpty else { return 0 }
    let q = q.isFinite ? min(max(q, 0), 1) : 1
    return sorted[min(sorted.count - 1, max(0, Int(saturating: Double(sorted.count - 1) * q)))]
}
