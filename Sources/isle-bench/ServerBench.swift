import ArgumentParser
import AsyncHTTPClient
import Foundation
import IsleAPNs
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleDelivery
import IsleTesting
import Logging
import NIOCore

/// The Isle server on a real SQLite file, delivering over HTTP/2 + TLS to IsleSimulator's fake
/// APNs, driven through its HTTP API — all in this process, on loopback.
struct ServerBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "server", abstract: "Accepted updates/s, deliveries/s, and fan-out time of the Isle server against the simulator.")

    @Option(help: "Update requests for the throughput run.") var updates = 20_000
    @Option(help: "Activities the updates are spread over.") var activities = 200
    @Option(help: "HTTP requests in flight against the API.") var clients = 32
    @Option(help: "Fan-out sizes, comma-separated.") var fanOut = "10000,100000"
    @Option(help: "Give up waiting for deliveries after this many seconds.") var maxSeconds: Double = 600
    @Option(help: "The server's APNs transport: http2 or async-http-client.") var apnsTransport = APNsTransportKind.default.rawValue
    @Flag(help: "Measure accepting alone: the app's deliveries are held (paused) during the run, so nothing else uses the CPU.") var acceptOnly = false
    @Option(help: "A PostgreSQL server (postgres://user@host:port/db) instead of a SQLite file: each run gets a new database on it.") var database: String?
    @Option(help: "Servers sharing the PostgreSQL database, in this process; the load is spread over them (needs --database).") var instances = 1

    func run() async throws {
        let sizes = fanOut.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) }
        guard updates > 0, updates <= 1_000_000, activities > 0, clients > 0, clients <= 1000, sizes.allSatisfy({ $0 > 0 && $0 <= 200_000 }) else {
            throw ValidationError("counts out of range (updates ≤ 1,000,000; fan-out ≤ 200,000; clients ≤ 1000)")
        }
        guard instances >= 1, instances <= 8, instances == 1 || database != nil else { throw ValidationError("--instances: 1 to 8, and more than 1 needs --database postgres://…") }
        let what = database.map { (try? PostgresSettings(url: $0))?.redacted ?? $0 }.map { "PostgreSQL \($0), \(instances) instance\(instances == 1 ? "" : "s")" } ?? "SQLite"
        print("Isle server (\(what), \(ProcessInfo.processInfo.activeProcessorCount) cores) → IsleSimulator fake APNs over HTTP/2 + TLS, all on loopback in one process")
        try await throughput()
        for n in sizes { try await fanOutRun(n) }
    }

    struct Rig {
        let sim: IsleSim
        let apps: [IsleServerApp]
        let store: any IsleStore
        let http: HTTPClient
        let bases: [String]
        let backendKey: String
        let devices: [String]
        var app: IsleServerApp { apps[0] }
    }

    /// The stores the run's servers use: one SQLite file, or one new PostgreSQL database with a
    /// store (connection pool) per instance.
    func makeStores(_ logger: Logger) async throws -> [any IsleStore] {
        guard let database else {
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("isle-bench-\(UUID().uuidString).sqlite").path
            return [try SQLiteStore(path: path)]
        }
        var settings = try await PostgresStore.createDatabase(on: try PostgresSettings(url: database), prefix: "isle_bench", logger: logger)
        settings.poolSize = max(settings.poolSize, 20)
        return (0..<instances).map { _ in PostgresStore(settings: settings, logger: logger) }
    }

    /// Runs `body` with every store's connections up.
    static func running<T: Sendable>(_ stores: ArraySlice<any IsleStore>, _ body: () async throws -> T) async throws -> T {
        guard let first = stores.first else { return try await body() }
        let rest = stores.dropFirst()
        return try await first.withRunning { try await running(rest, body) }
    }

    /// A fresh simulator + server; activities are spread 1,000 to a simulated device.
    func withRig(activityCount: Int, _ body: (Rig, [(deviceActivity: String, isleID: String)]) async throws -> Void) async throws {
        var simConfig = IsleSim.Configuration()
        simConfig.device = .instant   // the run measures throughput, not the model's priority-5 waits
        simConfig.device.maximumActivitiesPerApp = 1000
        simConfig.device.maximumActivitiesPerDevice = 1000
        simConfig.device.hourlyBudget = 1_000_000
        var quiet = Logger(label: "bench")
        quiet.logLevel = .critical
        try await IsleSim.withRunning(configuration: simConfig, clock: SystemWallClock(), logger: quiet) { sim in
            let key = TestProviderKey()
            try sim.apns.register(RegisteredKey(keyID: key.keyID, teamID: key.teamID, publicKeyPEM: key.publicKeyPEM))
            let schema = try ActivitySchema(jsonText: #"{"attributesType":"ScoreAttributes","attributes":{"match":"string"},"contentState":{"home":"int","away":"int"}}"#)
            let stores = try await makeStores(quiet)
            try await Self.running(stores[...]) {
            let store = stores[0]
            try await store.migrate()
            let masterKey = MasterKey.generate()
            try await store.upsertApp(AppRecord(bundleID: "com.example.scores", teamID: key.teamID, keyID: key.keyID, keyPEM: masterKey.seal(key.privateKeyPEM, bundleID: "com.example.scores"),
                                                schemas: [schema], createdAt: Date()))
            let backend = try await ServerSetup.createKey(store: store, bundleID: "com.example.scores", scope: .backend).secret
            var devices: [String] = []
            var pairs: [(String, String)] = []
            var started: [(device: String, activity: String)] = []
            for i in 0..<activityCount {
                if i % 1000 == 0 {
                    let d = sim.world.createDevice(name: "d\(i / 1000)")
                    try sim.world.install(.init(bundleID: "com.example.scores", schemas: [schema]), on: d)
                    devices.append(d)
                }
                let a = try sim.world.requestActivity(bundleID: "com.example.scores", on: devices.last!, attributesType: "ScoreAttributes", attributes: ["match": "7"], contentState: ["home": 0, "away": 0])
                started.append((devices.last!, a.id))
                pairs.append((a.id, "act_\(i)"))
            }
            // The tokens come after request returns, as on a device: hand them out, then read each phone once.
            await sim.world.tick()
            var tokens: [String: String] = [:]
            for d in devices { for a in try sim.world.device(d).activities { tokens[a.id] = a.updateToken } }
            let records = started.enumerated().map { i, s in
                ActivityRecord(id: "act_\(i)", bundleID: "com.example.scores", attributesType: "ScoreAttributes", state: .active, updateToken: tokens[s.activity], startedAt: Date(), topics: ["match-7"])
            }
            for start in stride(from: 0, to: records.count, by: 10_000) {
                _ = try await store.enqueue([], creating: Array(records[start..<min(records.count, start + 10_000)]), idempotency: nil, now: Date())
            }
            var c = ServerConfiguration()
            c.port = 0
            c.sendBothEnvironments(to: .custom(url: sim.apnsURL, broadcastURL: sim.broadcastURL, managementURL: sim.managementURL, trustRootsPEM: sim.caCertificatePEM))
            c.concurrency = 256
            c.masterKey = masterKey
            guard let transport = APNsTransportKind(rawValue: apnsTransport) else { throw ValidationError("--apns-transport: http2 or async-http-client") }
            c.apnsTransport = transport
            let config = c
            let apps = stores.map { IsleServerApp(configuration: config, store: $0, logger: quiet) }
            let tasks = apps.map { app in Task { try await app.run() } }
            var bases: [String] = []
            for app in apps { bases.append("http://127.0.0.1:\(await app.port())") }
            let http = HTTPClient(eventLoopGroupProvider: .singleton)
            let rig = Rig(sim: sim, apps: apps, store: store, http: http, bases: bases, backendKey: backend, devices: devices)
            do {
                try await body(rig, pairs)
            } catch {
                try? await http.shutdown()
                for t in tasks { t.cancel(); _ = try? await t.value }
                throw error
            }
            try await http.shutdown()
            for t in tasks { t.cancel(); _ = try? await t.value }
            }
        }
    }

    func post(_ rig: Rig, _ path: String, _ body: String, spread i: Int = 0) async throws -> Int {
        var r = HTTPClientRequest(url: rig.bases[i % rig.bases.count] + path)
        r.method = .POST
        r.headers.add(name: "authorization", value: "Bearer \(rig.backendKey)")
        r.body = .bytes(ByteBuffer(string: body))
        let response = try await rig.http.execute(r, timeout: .seconds(120))
        _ = try await response.body.collect(upTo: 1 << 20)
        return Int(response.status.code)
    }

    /// Waits until the engine has finished `n` jobs, polling its in-memory counters (a COUNT over
    /// the jobs table every few milliseconds would itself cost a core at 100,000 rows). Nothing is
    /// superseded in these runs (alerts; one update per activity), so sent + failed + dropped is
    /// every job finished.
    func waitSent(_ rig: Rig, _ n: Int) async throws -> Bool {
        let deadline = ContinuousClock.now + .seconds(Int64(maxSeconds))
        while ContinuousClock.now < deadline {
            let finished = rig.apps.reduce(0) { total, app in
                let c = app.engine.counters.snapshot
                return total + (c["sent"] ?? 0) + (c["failed"] ?? 0) + (c["dropped"] ?? 0)
            }
            if finished >= n {
                // The counters move as each send is answered; wait for the bookkeeping to commit
                // too, so the database's figures printed next are final.
                while ContinuousClock.now < deadline {
                    let counts = try await rig.store.jobCounts()
                    let open: [PushJobState] = [.scheduled, .queued, .claimed]
                    if open.allSatisfy({ (counts[$0] ?? 0) == 0 }) { return true }
                    try await Task.sleep(for: .milliseconds(database == nil ? 5 : 100))
                }
                return false
            }
            try await Task.sleep(for: .milliseconds(5))
        }
        return false
    }

    func throughput() async throws {
        try await withRig(activityCount: activities) { rig, pairs in
            if acceptOnly { for app in rig.apps { _ = app.engine.circuits.record("com.example.scores", .configuration("isle-bench --accept-only"), now: Date()) } }
            let next = Counter()
            let start = ContinuousClock.now
            // Each client keeps its own latencies (milliseconds), merged at the end.
            let latencies = try await withThrowingTaskGroup(of: [Double].self) { group in
                for _ in 0..<clients {
                    group.addTask {
                        var mine: [Double] = []
                        while true {
                            let i = next.take()
                            guard i < updates else { return mine }
                            let id = pairs[i % pairs.count].isleID
                            // Alerts are never coalesced, so every accepted update is delivered.
                            let sent = ContinuousClock.now
                            let status = try await post(rig, "/v1/activities/\(id)/update", #"{"contentState":{"home":\#(i),"away":0},"alert":{"title":"Goal","body":"\#(i)"},"priority":5}"#, spread: i)
                            mine.append(Self.s(ContinuousClock.now - sent) * 1000)
                            guard status == 202 else { throw ValidationError("update answered \(status)") }
                        }
                    }
                }
                var all: [Double] = []
                for try await l in group { all += l }
                return all.sorted()
            }
            let accepted = ContinuousClock.now - start
            if acceptOnly {
                print(String(format: "accepted updates, deliveries held: %d in %.2f s = %.0f/s (%d HTTP clients, %d activities); accept latency p50 %.2f ms, p99 %.2f ms, max %.2f ms",
                             updates, Self.s(accepted), Double(updates) / Self.s(accepted), clients, activities,
                             quantile(latencies, 0.5), quantile(latencies, 0.99), latencies.last ?? 0))
                return
            }
            let ok = try await waitSent(rig, updates)
            let delivered = ContinuousClock.now - start
            let counts = try await rig.store.jobCounts()
            print(String(format: "accepted updates: %d in %.2f s = %.0f/s (%d HTTP clients, %d activities); accept latency p50 %.2f ms, p99 %.2f ms, max %.2f ms",
                         updates, Self.s(accepted), Double(updates) / Self.s(accepted), clients, activities,
                         quantile(latencies, 0.5), quantile(latencies, 0.99), latencies.last ?? 0))
            print(String(format: "end-to-end deliveries to the fake APNs: %d sent in %.2f s = %.0f/s%@", counts[.sent] ?? 0, Self.s(delivered), Double(counts[.sent] ?? 0) / Self.s(delivered), ok ? "" : " (timed out)"))
        }
    }

    func fanOutRun(_ n: Int) async throws {
        try await withRig(activityCount: n) { rig, _ in
            let start = ContinuousClock.now
            let status = try await post(rig, "/v1/topics/match-7/update", #"{"contentState":{"home":1,"away":0}}"#)
            guard status == 202 else { throw ValidationError("fan-out answered \(status)") }
            let accepted = ContinuousClock.now - start
            let ok = try await waitSent(rig, n)
            let delivered = ContinuousClock.now - start
            print(String(format: "fan-out to %d activities: accepted (queued durably) in %.2f s; all delivered to the fake APNs in %.2f s (%.0f/s)%@",
                         n, Self.s(accepted), Self.s(delivered), Double(n) / Self.s(delivered), ok ? "" : " (timed out)"))
        }
    }

    static func s(_ d: Duration) -> Double { Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18 }
}
