import ArgumentParser
import AsyncHTTPClient
import Foundation
import Hummingbird
import IsleAPNs
import IsleCore
import IsleTesting
import Logging
import NIOCore
import Synchronization

/// `isle serve` and `isle sim` as separate processes, loaded from outside by `h2load --h1`
/// (Debian's nghttp2-client) as a backend would be: the server's CPU per accepted-and-delivered
/// update, per fan-out delivery and per bare `GET /health`, each from /proc/PID/stat in the same
/// run, so the ratios hold on a shared, noisy machine. docs/performance.md has the figures.
struct SplitBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "split",
        abstract: "Server CPU per update, per fan-out delivery and per bare request, with isle serve and isle sim as child processes and h2load as the backend.")

    @Option(help: "Bare GET /health requests (the floor).") var bare = 20_000
    @Option(help: "Update requests (each with an alert, so each is one delivery).") var updates = 20_000
    @Option(help: "Activities the updates are spread over.") var activities = 200
    @Option(help: "HTTP/1.1 connections h2load keeps open.") var clients = 32
    @Option(help: "Activities in the fan-out topic.") var fanOut = 2_000
    @Option(help: "Fan-out updates to that topic (each delivers --fan-out pushes).") var fanOutRounds = 5
    @Option(help: "Updates per second offered in the latency run (0: skip it).") var rate = 1_000
    @Option(help: "Seconds of the latency run.") var rateSeconds = 10
    @Option(help: "Also run everything on this PostgreSQL server (postgres://user@host:port/db; a new database per run) and compare.") var postgres: String?
    @Option(help: "Give up waiting for deliveries after this many seconds.") var maxSeconds: Double = 300
    @Option(help: "isle serve --concurrency (deliveries in flight; the server's default is 256).") var concurrency = 256
    @Option(name: .customLong("sim-option"), parsing: .singleValue, help: "One more argument for isle sim (repeat), e.g. --sim-option --lenient to compare the simulator without APNs' leeway.") var simOptions: [String] = []
    @Option(help: "Rounds the floor and the updates alternate over (each round: --bare/rounds requests, then --updates/rounds updates until delivered).") var rounds = 5
    @Option(help: "Pushes this process sends to isle sim through IsleAPNs' client, the same as the server's deliveries, for the push floor (0: skip it).") var pushFloor = 10_000
    @Flag(help: "Measure SQLite a second time with isle serve tracing every request, attempt and APNs request (OTLP/HTTP to a receiver in this process), and compare.") var tracing = false
    @Flag(help: "Count the server's SQL statements by kind (ISLE_STATEMENT_KINDS=1) and print each kind per accepted-and-delivered update and per fan-out delivery.") var statementKinds = false
    @Option(help: "Record the server with perf (perf record -a -F 499 -g, read back for its pid) during the fan-out into this file, and print each library's share of its samples and what that is per fan-out delivery.") var profileFanOut: String?

    @Option(help: "Record the server with perf (as --profile-fan-out) during each part of an update — the bare request, the update POST answered 404, the update accepted for later — into FILE.bare, FILE.404 and FILE.accept, and print each library's share per request of that part (read the symbols with perf report -i FILE.404 --pid PID).") var profileParts: String?

    func run() async throws {
        guard let h2load = Self.which("h2load") else { throw ValidationError("h2load is not installed (apt-get install -y nghttp2-client)") }
        let isle = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("isle").path
        guard FileManager.default.isExecutableFile(atPath: isle) else { throw ValidationError("no isle binary beside isle-bench (swift build -c release --product isle)") }
        guard (1...1_000_000).contains(updates), (1...1_000_000).contains(bare), (1...100).contains(rounds), rounds <= min(updates, bare), (1...10_000).contains(activities), (1...1000).contains(clients), (0...100_000).contains(fanOut) else {
            throw ValidationError("counts out of range")
        }
        print("isle serve and isle sim as child processes, h2load --h1 as the backend (\(ProcessInfo.processInfo.activeProcessorCount) cores); CPU from /proc/PID/stat")
        let sqlite = try await measure(isle: isle, h2load: h2load, database: nil)
        if tracing {
            let receiver = try await OTLPSink.start()
            let traced = try await measure(isle: isle, h2load: h2load, database: nil, traceTo: "http://127.0.0.1:\(receiver.port)/v1/traces")
            let spans = receiver.requests.withLock { $0 }
            try await receiver.stop()
            print(String(format: "Tracing on / off, server CPU: per accepted-and-delivered update %.0f / %.0f µs (%+.0f %%; %.1f× / %.1f× a bare request); per fan-out delivery %.0f / %.0f µs (%+.0f %%); %d OTLP exports received (%d bytes)",
                         traced.updateUS, sqlite.updateUS, 100 * (traced.updateUS / sqlite.updateUS - 1), traced.updateUS / traced.bareUS, sqlite.updateUS / sqlite.bareUS,
                         traced.fanUS, sqlite.fanUS, 100 * (traced.fanUS / sqlite.fanUS - 1), spans.count, spans.bytes))
        }
        if let postgres {
            let pg = try await measure(isle: isle, h2load: h2load, database: postgres)
            print(String(format: "PostgreSQL / SQLite, accepted-and-delivered updates per second: %.0f %%", 100 * pg.deliveredPerSecond / sqlite.deliveredPerSecond))
            // When both runs keep the machine's cores busy, the rate is the cores divided by the CPU
            // every process spends per update: PostgreSQL's server is on the same cores.
            let ratio = pg.everyProcessUS / sqlite.everyProcessUS
            print(String(format: "PostgreSQL / SQLite, CPU per update of every process of the run: %.2f× (%.0f / %.0f µs; cores busy %.2f / %.2f of %d): at this CPU per update, PostgreSQL's rate on these cores is at most %.0f %% of SQLite's; PostgreSQL's own server alone spends %.0f µs = %.0f %% of SQLite's every-process CPU per update",
                         ratio, pg.everyProcessUS, sqlite.everyProcessUS, pg.busyCores, sqlite.busyCores, ProcessInfo.processInfo.activeProcessorCount,
                         100 / ratio * min(1, sqlite.busyCores / max(pg.busyCores, 0.01)), pg.postgresUS, 100 * pg.postgresUS / sqlite.everyProcessUS))
        }
    }

    struct Figures {
        var deliveredPerSecond: Double
        /// CPU per accepted-and-delivered update of every process of the run (server, simulator,
        /// PostgreSQL's processes, h2load), and how many cores they kept busy meanwhile.
        var everyProcessUS: Double
        var busyCores: Double
        var postgresUS: Double
        var bareUS = 0.0
        var updateUS = 0.0
        var fanUS = 0.0
    }

    func measure(isle: String, h2load: String, database: String?, traceTo: String? = nil) async throws -> Figures {
        let http = HTTPClient(eventLoopGroupProvider: .singleton)
        do {
            let figures = try await measure(isle: isle, h2load: h2load, database: database, traceTo: traceTo, http: http)
            try await http.shutdown()
            return figures
        } catch {
            try? await http.shutdown()
            throw error
        }
    }

    func measure(isle: String, h2load: String, database: String?, traceTo: String?, http: HTTPClient) async throws -> Figures {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("isle-split-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let ports = try (0..<5).map { _ in try freeLoopbackPort() }
        let schema = #"{"attributesType":"ScoreAttributes","attributes":{"match":"string"},"contentState":{"home":"int","away":"int"}}"#
        try schema.write(toFile: dir + "/schema.json", atomically: true, encoding: .utf8)
        var children: [Child] = []
        defer { for c in children { c.stop() } }

        let sim = try Child.start(isle, ["sim", "--dir", dir + "/sim", "--apns-port", "\(ports[0])", "--broadcast-port", "\(ports[1])", "--management-port", "\(ports[2])",
                                         "--control-port", "\(ports[3])", "--device", "bench", "--app", "com.example.scores", "--schema", dir + "/schema.json",
                                         // Priority 5 applied at once: the run measures CPU, not the model's waits.
                                         "--low-priority-delay", "0", "--per-token-limit", "0",
                                         "--max-activities-per-app", "200000", "--max-activities-per-device", "200000", "--hourly-budget", "100000000"] + simOptions,
                                  log: dir + "/sim.log")
        children.append(sim)
        let control = "http://127.0.0.1:\(ports[3])"
        do { try await Self.waitFor(http, control + "/devices") } catch {
            throw ValidationError("isle sim did not start: \(((try? String(contentsOfFile: dir + "/sim.log", encoding: .utf8)) ?? "").suffix(1000))")
        }

        var env = ProcessInfo.processInfo.environment
        env["ISLE_MASTER_KEY_FILE"] = dir + "/master.key"
        if let database {
            env["ISLE_DATABASE"] = try await Self.newPostgresDatabase(database)
        } else {
            env["ISLE_DATABASE"] = dir + "/isle.sqlite"
        }
        for key in env.keys where key.hasPrefix("OTEL_") { env[key] = nil }
        env["ISLE_STATEMENT_KINDS"] = statementKinds ? "1" : nil
        if let traceTo {
            // Every span exported, none dropped: the whole cost of tracing every request.
            env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = traceTo
            env["OTEL_BSP_MAX_QUEUE_SIZE"] = "200000"
            env["OTEL_BSP_MAX_EXPORT_BATCH_SIZE"] = "4096"
            env["OTEL_BSP_SCHEDULE_DELAY"] = "200"
        }
        let (backend, device) = try Self.addApp(isle: isle, dir: dir, environment: env)
        let server = try Child.start(isle, ["serve", "--port", "\(ports[4])", "--apns-url", "https://127.0.0.1:\(ports[0])", "--apns-broadcast-url", "https://127.0.0.1:\(ports[1])",
                                            "--apns-management-url", "https://127.0.0.1:\(ports[2])", "--apns-ca-cert", dir + "/sim/ca.pem", "--concurrency", "\(concurrency)",
                                            "--backend-rate", "off", "--device-rate", "off", "--installation-rate", "off", "--address-rate", "off",
                                            "--max-live-activities-per-installation", "100000", "--max-new-installations-per-address", "0", "--max-new-activities-per-address", "0",
                                            "--log-level", "error"],
                                     environment: env, log: dir + "/serve.log")
        children.append(server)
        let base = "http://127.0.0.1:\(ports[4])"
        do { try await Self.waitFor(http, base + "/health") } catch {
            throw ValidationError("isle serve did not start: \(((try? String(contentsOfFile: dir + "/serve.log", encoding: .utf8)) ?? "").suffix(1000))")
        }

        // Activities: started on the simulated phone, registered through the API like an app would.
        let secret = try await Self.json(http, "PUT", base + "/v1/installations/bench-phone", key: device, body: ["liveActivitiesEnabled": true])["installationSecret"]?.stringValue ?? ""
        let ids = try await register(http, control: control, base: base, device: device, secret: secret, count: activities, topic: "scores").map(\.id)
        let fan = fanOut > 0 ? try await register(http, control: control, base: base, device: device, secret: secret, count: fanOut, topic: "fan") : []
        let fanIDs = fan.map(\.id)
        print("\(database == nil ? "SQLite" : "PostgreSQL"): \(ids.count) activities for updates, \(fanIDs.count) in the fan-out topic")

        // Warm up both processes (connections, caches, JIT-free but page-faulted code).
        _ = try Child.output(h2load, ["--h1", "-n", "2000", "-c", "\(clients)", base + "/health"])

        // 1 and 2, alternated over `rounds` rounds so both see the same moments of this shared
        // machine: the floor (bare requests) and updates with an alert to `activities` activities
        // (every accepted update is one delivery), each round's updates all delivered before the
        // next round's floor starts.
        let body = dir + "/update.json"
        try #"{"contentState":{"home":1,"away":0},"alert":{"title":"Goal","body":"1–0"},"priority":5}"#.write(toFile: body, atomically: true, encoding: .utf8)
        let uris = dir + "/uris.txt"
        try ids.map { "\(base)/v1/activities/\($0)/update" }.joined(separator: "\n").write(toFile: uris, atomically: true, encoding: .utf8)
        var bareSeconds = 0.0, updateSeconds = 0.0, simSeconds = 0.0, postgresSeconds = 0.0, loadSeconds = 0.0
        var acceptedIn = Duration.zero, deliveredIn = Duration.zero
        var roundRatios: [Double] = []
        var updateStatements = 0
        var updateKinds: [String: Int] = [:]
        for round in 0..<rounds {
            let bareCount = bare / rounds + (round < bare % rounds ? 1 : 0)
            let updateCount = updates / rounds + (round < updates % rounds ? 1 : 0)
            let bareCPU = try Self.cpu(of: server.pid)
            let bareRun = try Child.output(h2load, ["--h1", "-n", "\(bareCount)", "-c", "\(clients)", base + "/health"])
            let bareUsed = try Self.cpu(of: server.pid) - bareCPU
            guard Self.succeeded(bareRun) >= bareCount else { throw ValidationError("GET /health: \(Self.summary(bareRun))") }

            let sentBefore = try await Self.sent(http, base)
            let statementsBefore = try await Self.statements(http, base)
            let kindsBefore = statementKinds ? try await Self.statementKinds(http, base) : [:]
            let updateCPU = try Self.cpu(of: server.pid)
            let simCPU = try Self.cpu(of: sim.pid)
            let postgresCPU = Self.postgresCPU()
            let loadCPU = Self.waitedChildrenCPU()
            let started = ContinuousClock.now
            let updateRun = try Child.output(h2load, ["--h1", "-n", "\(updateCount)", "-c", "\(clients)", "-d", body, "-H", "authorization: Bearer \(backend)",
                                                      "-H", "content-type: application/json", "-i", uris])
            acceptedIn += ContinuousClock.now - started
            guard Self.succeeded(updateRun) == updateCount else { throw ValidationError("updates: \(Self.summary(updateRun))") }
            try await waitSent(http, base, sentBefore + updateCount)
            deliveredIn += ContinuousClock.now - started
            let updateUsed = try Self.cpu(of: server.pid) - updateCPU
            updateStatements += try await Self.statements(http, base) - statementsBefore
            if statementKinds { updateKinds.merge(Self.difference(try await Self.statementKinds(http, base), kindsBefore), uniquingKeysWith: +) }
            simSeconds += try Self.cpu(of: sim.pid) - simCPU
            postgresSeconds += Self.postgresCPU() - postgresCPU
            loadSeconds += Self.waitedChildrenCPU() - loadCPU
            bareSeconds += bareUsed
            updateSeconds += updateUsed
            roundRatios.append((updateUsed / Double(updateCount)) / (bareUsed / Double(bareCount)))
        }
        let bareUS = bareSeconds * 1e6 / Double(bare)
        let updateUS = updateSeconds * 1e6 / Double(updates)
        let simUS = simSeconds * 1e6 / Double(updates)
        let postgresUS = postgresSeconds * 1e6 / Double(updates)
        let loadUS = loadSeconds * 1e6 / Double(updates)
        let everyProcessUS = updateUS + simUS + postgresUS + loadUS
        let busyCores = everyProcessUS * Double(updates) / 1e6 / Self.seconds(deliveredIn)

        // The simulator's floor: its CPU per bare control-API request (GET /health), beside its CPU
        // per push above (each update is one push it receives and applies).
        let simBareCPU = try Self.cpu(of: sim.pid)
        let simBareRun = try Child.output(h2load, ["--h1", "-n", "\(bare / rounds)", "-c", "\(clients)", control + "/health"])
        guard Self.succeeded(simBareRun) >= bare / rounds else { throw ValidationError("simulator GET /health: \(Self.summary(simBareRun))") }
        let simBareUS = (try Self.cpu(of: sim.pid) - simBareCPU) * 1e6 / Double(bare / rounds)

        // Parts of an update, each beside a bare request measured just before it: the same POST to
        // an activity that does not exist (key check, body read and parse, one indexed read, a 404:
        // the request side without validation or a write), and the same update with sendAt four
        // hours ahead (within the job deadline; validated and committed durably as a scheduled job, never delivered in this run:
        // accepting alone). Delivering is what the update costs beyond accepting it.
        let partCount = max(1, updates / rounds)
        let missing = dir + "/missing.txt"
        try ids.map { "\(base)/v1/activities/act_missing-\($0.suffix(12))/update" }.joined(separator: "\n").write(toFile: missing, atomically: true, encoding: .utf8)
        let later = dir + "/later.json"
        try #"{"contentState":{"home":1,"away":0},"alert":{"title":"Goal","body":"1–0"},"priority":5,"sendAt":\#(Int(Date().timeIntervalSince1970) + 4 * 3600)}"#
            .write(toFile: later, atomically: true, encoding: .utf8)
        var partFloor = 0.0, notFoundUS = 0.0, acceptUS = 0.0
        var partProfiles: [(part: String, us: Double, shares: [(library: String, share: Double)])] = []
        do {
            // Each part under perf when asked (`--profile-parts`), its CPU measured the same way.
            let perf = profileParts == nil ? nil : Self.which("perf")
            if profileParts != nil, perf == nil { throw ValidationError("--profile-parts needs perf (apt-get install -y linux-perf)") }
            func part(_ name: String, _ run: () throws -> Void) async throws -> Double {
                var recorder: pid_t?
                if let perf, let file = profileParts {
                    recorder = try Self.spawnWithSignals(perf, ["record", "-a", "-F", "999", "-g", "-o", "\(file).\(name)"], log: dir + "/perf-\(name).log")
                    try await Task.sleep(for: .milliseconds(500))
                }
                let before = try Self.cpu(of: server.pid)
                do { try run() } catch {
                    if let recorder { Self.stopPerf(recorder) }
                    throw error
                }
                let us = (try Self.cpu(of: server.pid) - before) * 1e6 / Double(partCount)
                if let recorder, let perf, let file = profileParts {
                    Self.stopPerf(recorder)
                    partProfiles.append((name, us, try Self.librariesShare(perf: perf, file: "\(file).\(name)", pid: server.pid)))
                }
                return us
            }
            partFloor = try await part("bare") {
                let bareRun = try Child.output(h2load, ["--h1", "-n", "\(partCount)", "-c", "\(clients)", base + "/health"])
                guard Self.succeeded(bareRun) >= partCount else { throw ValidationError("GET /health: \(Self.summary(bareRun))") }
            }
            notFoundUS = try await part("404") {
                let missingRun = try Child.output(h2load, ["--h1", "-n", "\(partCount)", "-c", "\(clients)", "-d", body, "-H", "authorization: Bearer \(backend)",
                                                           "-H", "content-type: application/json", "-i", missing])
                guard Self.statusCount(missingRun, "4xx") == partCount else { throw ValidationError("updates to missing activities: \(Self.summary(missingRun))") }
            }
            acceptUS = try await part("accept") {
                let laterRun = try Child.output(h2load, ["--h1", "-n", "\(partCount)", "-c", "\(clients)", "-d", later, "-H", "authorization: Bearer \(backend)",
                                                         "-H", "content-type: application/json", "-i", uris])
                guard Self.succeeded(laterRun) == partCount else { throw ValidationError("scheduled updates: \(Self.summary(laterRun))") }
            }
        }

        // 3. Fan-out: one request, `fanOut` deliveries, `fanOutRounds` times.
        var fanUS = 0.0
        var fanSeconds = 0.0
        var fanStatements = 0
        var fanKinds: [String: Int] = [:]
        var fanProfile: [(library: String, share: Double)] = []
        // Stopped however this run ends: perf -a records the whole machine.
        let fanOutPerf = Mutex<pid_t?>(nil)
        defer { if let pid = fanOutPerf.withLock({ $0 }) { Self.stopPerf(pid) } }
        if fanOut > 0, fanOutRounds > 0 {
            var perfPID: pid_t?
            if let file = profileFanOut {
                guard let tool = Self.which("perf") else { throw ValidationError("--profile-fan-out needs perf (apt-get install -y linux-perf)") }
                // System-wide, read back for the server's pid: perf 6.1 attached with -p spins on the
                // descriptors of the server's threads that exit (Dispatch's come and go).
                perfPID = try Self.spawnWithSignals(tool, ["record", "-a", "-F", "499", "-g", "-o", file], log: dir + "/perf.log")
                fanOutPerf.withLock { $0 = perfPID }
                try await Task.sleep(for: .milliseconds(500))  // perf attaches before the first fan-out
            }
            let before = try Self.cpu(of: server.pid)
            let statementsBefore = try await Self.statements(http, base)
            let kindsBefore = statementKinds ? try await Self.statementKinds(http, base) : [:]
            let start = ContinuousClock.now
            for round in 0..<fanOutRounds {
                let sent = try await Self.sent(http, base)
                _ = try await Self.json(http, "POST", base + "/v1/topics/fan/update", key: backend,
                                        body: ["contentState": ["home": .int(Int64(round + 2)), "away": 0], "alert": ["title": "Goal", "body": "again"], "priority": 5])
                try await waitSent(http, base, sent + fanOut)
            }
            fanSeconds = Self.seconds(ContinuousClock.now - start)
            fanUS = (try Self.cpu(of: server.pid) - before) * 1e6 / Double(fanOut * fanOutRounds)
            fanStatements = try await Self.statements(http, base) - statementsBefore
            if statementKinds { fanKinds = Self.difference(try await Self.statementKinds(http, base), kindsBefore) }
            if let perfPID, let file = profileFanOut {
                Self.stopPerf(perfPID)
                fanOutPerf.withLock { $0 = nil }
                fanProfile = try Self.librariesShare(perf: Self.which("perf")!, file: file, pid: server.pid)
            }
        }

        // The push floor: what one delivery's push costs by itself, in the process that sends it —
        // IsleAPNs' client as the server uses it (NIO HTTP/2 transport, payloads not validated
        // again), to the same simulator and the same activities as the fan-out, the server's
        // concurrency in flight — beside the server's bare request of this run.
        var pushUS = Double.nan
        if pushFloor > 0, !fan.isEmpty {
            var logger = Logger(label: "isle.bench")
            logger.logLevel = .warning
            let credentials = try APNsCredentials(keyID: "SIMKEY0001", teamID: "SIMTEAM001", keyFile: dir + "/sim/AuthKey_SIMKEY0001.p8")
            let ca = try String(contentsOfFile: dir + "/sim/ca.pem", encoding: .utf8)
            let client = try APNsClient(configuration: .init(environment: .custom(url: "https://127.0.0.1:\(ports[0])", trustRootsPEM: ca), credentials: credentials,
                                                             validatesPayloads: false), logger: logger)
            let tokens = try fan.map { try DeviceToken(hex: $0.token) }
            func push(_ i: Int) -> APNsPush {
                .liveActivity(LiveActivityPayload(event: .update, timestamp: Date(), contentState: ["home": .int(Int64(i)), "away": 0],
                                                  alert: LiveActivityAlert(title: "Goal", body: "again")),
                              token: tokens[i % tokens.count], bundleID: "com.example.scores")
            }
            func burst(_ count: Int) async throws {
                let next = Counter()
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for _ in 0..<concurrency {
                        group.addTask {
                            while true {
                                let i = next.take()
                                guard i < count else { return }
                                _ = try await client.send(push(i))
                            }
                        }
                    }
                    try await group.waitForAll()
                }
            }
            try await burst(min(2_000, pushFloor))  // connections, TLS, the provider token
            let used0 = cpuSeconds()
            try await burst(pushFloor)
            pushUS = (cpuSeconds() - used0) * 1e6 / Double(pushFloor)
            try await client.shutdown()
        }

        // 4. Accept latency at a steady offered rate.
        var p99 = Double.nan, p50 = Double.nan
        if rate > 0 {
            let connections = max(1, min(clients, rate / 50))
            let log = dir + "/latency.log"
            let sent = try await Self.sent(http, base)
            let run = try Child.output(h2load, ["--h1", "-n", "\(rate * rateSeconds)", "-c", "\(connections)", "--rps", "\(max(1, rate / connections))", "-d", body,
                                               "-H", "authorization: Bearer \(backend)", "-H", "content-type: application/json", "--log-file", log, "-i", uris])
            guard Self.succeeded(run) == rate * rateSeconds else { throw ValidationError("latency run: \(Self.summary(run))") }
            let micros = (try String(contentsOfFile: log, encoding: .utf8)).split(separator: "\n").compactMap { line -> Double? in
                let f = line.split(separator: "\t")
                return f.count >= 3 ? Double(f[2]) : nil
            }.sorted()
            p50 = quantile(micros, 0.5) / 1000
            p99 = quantile(micros, 0.99) / 1000
            try await waitSent(http, base, sent + rate * rateSeconds)
        }

        let name = (database == nil ? "SQLite" : "PostgreSQL") + (traceTo == nil ? "" : " (tracing)")
        let deliveredPerSecond = Double(updates) / Self.seconds(deliveredIn)
        print(String(format: "%@ · floor: GET /health %.0f µs of server CPU per request", name, bareUS))
        print(String(format: "%@ · updates: %d accepted in %.2f s (%.0f/s), all delivered in %.2f s (%.0f/s); server CPU %.0f µs per accepted-and-delivered update = %.1f× a bare request (rounds %.1f–%.1f×; simulator %.0f µs)",
                     name, updates, Self.seconds(acceptedIn), Double(updates) / Self.seconds(acceptedIn), Self.seconds(deliveredIn), deliveredPerSecond, updateUS, updateUS / bareUS,
                     roundRatios.min() ?? 0, roundRatios.max() ?? 0, simUS))
        // Each /metrics read between them is one more statement or so (the open-job counts).
        print(String(format: "%@ · SQL statements: %.2f per accepted-and-delivered update (%d for %d)", name, Double(updateStatements) / Double(updates), updateStatements, updates))
        for (kind, n) in updateKinds.sorted(by: { $0.value > $1.value }) where n > 0 {
            print(String(format: "%@ · SQL per accepted-and-delivered update: %.3f  %@", name, Double(n) / Double(updates), kind))
        }
        print(String(format: "%@ · every process of the run, CPU per accepted-and-delivered update: isle serve %.0f + isle sim %.0f + PostgreSQL's processes %.0f + h2load %.0f = %.0f µs; %.2f of %d cores busy",
                     name, updateUS, simUS, postgresUS, loadUS, everyProcessUS, busyCores, ProcessInfo.processInfo.activeProcessorCount))
        print(String(format: "%@ · simulator: %.0f µs of its CPU per push received and applied, beside %.0f µs per bare control-API GET /health = %.1f×",
                     name, simUS, simBareUS, simUS / simBareUS))
        print(String(format: "%@ · parts (%d each, beside %.0f µs per bare request measured just before): the update POST answered 404 %.0f µs = %.1f×; accepted for later (validated, committed, not delivered) %.0f µs = %.1f×; so delivering ≈ %.0f µs = %.1f× of the update's",
                     name, partCount, partFloor, notFoundUS, notFoundUS / partFloor, acceptUS, acceptUS / partFloor, updateUS - acceptUS, (updateUS - acceptUS) / bareUS))
        for (part, us, shares) in partProfiles {
            for (library, share) in shares.prefix(8) {
                print(String(format: "%@ · %@ profile (pid %d): %@ %.1f %% of the server's samples = %.1f µs per request = %.2f× a bare request",
                             name, part, server.pid, library, 100 * share, share * us, share * us / partFloor))
            }
        }
        if fanOut > 0, fanOutRounds > 0 {
            print(String(format: "%@ · fan-out: %d × %d deliveries in %.2f s (%.0f/s); server CPU %.0f µs per fan-out delivery = %.1f× a bare request",
                         name, fanOutRounds, fanOut, fanSeconds, Double(fanOut * fanOutRounds) / fanSeconds, fanUS, fanUS / bareUS))
            print(String(format: "%@ · SQL statements: %.3f per fan-out delivery (%d for %d, the topic's look-up and the /metrics reads included)", name,
                         Double(fanStatements) / Double(fanOut * fanOutRounds), fanStatements, fanOut * fanOutRounds))
            for (kind, n) in fanKinds.sorted(by: { $0.value > $1.value }) where n > 0 {
                print(String(format: "%@ · SQL per fan-out delivery: %.4f  %@", name, Double(n) / Double(fanOut * fanOutRounds), kind))
            }
            for (library, share) in fanProfile.prefix(8) {
                print(String(format: "%@ · fan-out profile: %@ %.1f %% of the server's samples (its own code) = %.1f µs per fan-out delivery = %.2f× a bare request",
                             name, library, 100 * share, share * fanUS, share * fanUS / bareUS))
            }
        }
        if pushUS.isFinite {
            print(String(format: "%@ · push floor: %d pushes from this process through IsleAPNs' client to isle sim, %d in flight: %.0f µs of client CPU per push = %.1f× the server's bare request",
                         name, pushFloor, concurrency, pushUS, pushUS / bareUS))
        }
        if rate > 0 {
            print(String(format: "%@ · accept latency at %d updates/s offered for %d s: p50 %.2f ms, p99 %.2f ms", name, rate, rateSeconds, p50, p99))
        }
        return Figures(deliveredPerSecond: deliveredPerSecond, everyProcessUS: everyProcessUS, busyCores: busyCores, postgresUS: postgresUS, bareUS: bareUS, updateUS: updateUS, fanUS: fanUS)
    }

    /// Starts `count` activities on the simulated phone and registers each with the server.
    func register(_ http: HTTPClient, control: String, base: String, device: String, secret: String, count: Int, topic: String) async throws -> [(id: String, token: String)] {
        let next = Counter()
        return try await withThrowingTaskGroup(of: [(id: String, token: String)].self) { group in
            for _ in 0..<16 {
                group.addTask {
                    var mine: [(id: String, token: String)] = []
                    while true {
                        let i = next.take()
                        guard i < count else { return mine }
                        let started = try await Self.json(http, "POST", control + "/devices/device-1/apps/com.example.scores/activities", key: nil, body: [
                            "attributesType": "ScoreAttributes", "attributes": ["match": .string("\(topic)-\(i)")], "contentState": ["home": 0, "away": 0], "waitForPushToken": true])
                        guard let token = started["updateToken"]?.stringValue else { throw ValidationError("the simulator gave no token: \(started.jsonString)") }
                        let registered = try await Self.json(http, "POST", base + "/v1/activities", key: device, body: [
                            "attributesType": "ScoreAttributes", "token": .string(token), "installationID": "bench-phone", "topics": [.string(topic)]],
                                                             headers: [("Isle-Installation-Secret", secret)])
                        guard let id = registered["id"]?.stringValue else { throw ValidationError("registration: \(registered.jsonString)") }
                        mine.append((id, token))
                    }
                }
            }
            var all: [(id: String, token: String)] = []
            for try await ids in group { all += ids }
            return all
        }
    }

    func waitSent(_ http: HTTPClient, _ base: String, _ n: Int) async throws {
        let deadline = ContinuousClock.now + .seconds(Int64(maxSeconds))
        while ContinuousClock.now < deadline {
            if try await Self.sent(http, base) >= n { return }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw ValidationError("deliveries did not finish within \(maxSeconds) s")
    }

    /// Deliveries the server counted as sent (its Prometheus counters).
    static func sent(_ http: HTTPClient, _ base: String) async throws -> Int {
        try await counted(http, base) { $0.hasPrefix("isle_deliveries_total{") && $0.contains("outcome=\"sent\"") }
    }

    /// SQL statements the server sent to its database (`isle_store_statements_total`).
    static func statements(_ http: HTTPClient, _ base: String) async throws -> Int {
        try await counted(http, base) { $0.hasPrefix("isle_store_statements_total ") }
    }

    /// `isle_store_statements_by_kind_total` by kind (the server runs with ISLE_STATEMENT_KINDS=1).
    static func statementKinds(_ http: HTTPClient, _ base: String) async throws -> [String: Int] {
        let response = try await http.execute(HTTPClientRequest(url: base + "/metrics"), timeout: .seconds(30))
        let text = String(buffer: try await response.body.collect(upTo: 16 << 20))
        var kinds: [String: Int] = [:]
        let prefix = "isle_store_statements_by_kind_total{kind=\""
        for line in text.split(separator: "\n") where line.hasPrefix(prefix) {
            guard let close = line.range(of: "\"} ", options: .backwards) else { continue }
            let kind = String(line[line.index(line.startIndex, offsetBy: prefix.count)..<close.lowerBound])
            kinds[kind] = Int(line[close.upperBound...]) ?? 0
        }
        return kinds
    }

    static func difference(_ after: [String: Int], _ before: [String: Int]) -> [String: Int] {
        after.reduce(into: [:]) { $0[$1.key] = $1.value - (before[$1.key] ?? 0) }
    }

    /// The sum of the `/metrics` lines `matching`.
    static func counted(_ http: HTTPClient, _ base: String, matching: (Substring) -> Bool) async throws -> Int {
        let response = try await http.execute(HTTPClientRequest(url: base + "/metrics"), timeout: .seconds(30))
        let text = String(buffer: try await response.body.collect(upTo: 16 << 20))
        var total = 0
        for line in text.split(separator: "\n") where matching(line) {
            if let v = Double(line.split(separator: " ").last ?? "0"), v.isFinite, v >= 0, v < 1e15 { total += Int(v) }
        }
        return total
    }

    static func json(_ http: HTTPClient, _ method: String, _ url: String, key: String?, body: JSONValue, headers: [(String, String)] = []) async throws -> JSONValue {
        var r = HTTPClientRequest(url: url)
        r.method = .init(rawValue: method)
        if let key { r.headers.add(name: "authorization", value: "Bearer \(key)") }
        r.headers.add(name: "content-type", value: "application/json")
        for (k, v) in headers { r.headers.add(name: k, value: v) }
        r.body = .bytes(ByteBuffer(string: body.jsonString))
        let response = try await http.execute(r, timeout: .seconds(60))
        let bytes = Array(buffer: try await response.body.collect(upTo: 1 << 20))
        guard (200..<300).contains(Int(response.status.code)) else { throw ValidationError("\(method) \(url): \(response.status.code) \(String(decoding: bytes, as: UTF8.self))") }
        return bytes.isEmpty ? .object([:]) : try JSONParser.parse(bytes)
    }

    static func waitFor(_ http: HTTPClient, _ url: String) async throws {
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline {
            if let r = try? await http.execute(HTTPClientRequest(url: url), timeout: .seconds(2)), r.status.code < 500 { return }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw ValidationError("nothing answers at \(url)")
    }

    /// A new database on the PostgreSQL server, named for this run.
    static func newPostgresDatabase(_ url: String) async throws -> String {
        let name = "isle_split_\(UUID().uuidString.prefix(8).lowercased())"
        guard var components = URLComponents(string: url) else { throw ValidationError("--postgres: not a URL") }
        let psql = which("psql") ?? "/usr/bin/psql"
        _ = try Child.output(psql, [url, "-qc", "CREATE DATABASE \(name)"])
        components.path = "/" + name
        return components.string ?? url
    }

    /// Seconds of CPU (user + system) the process has used, from /proc/PID/stat.
    static func cpu(of pid: pid_t) throws -> Double {
        let text = try String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)
        // Fields after the command name (which may hold spaces) start after the last ')'.
        guard let close = text.lastIndex(of: ")") else { throw ValidationError("/proc/\(pid)/stat unreadable") }
        let fields = text[text.index(after: close)...].split(separator: " ")
        // utime and stime are fields 14 and 15 of the whole line: 12th and 13th after the name.
        guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { throw ValidationError("/proc/\(pid)/stat unreadable") }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// Seconds of CPU of every process named `postgres` on this machine (the cluster's server and
    /// its backends), with what its exited children used; 0 where PostgreSQL is not running. The
    /// benchmark's PostgreSQL is the only one on a test machine.
    static func postgresCPU() -> Double {
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc") else { return 0 }
        var ticks = 0.0
        for pid in entries where pid.allSatisfy(\.isNumber) {
            guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
                  let open = text.firstIndex(of: "("), let close = text.lastIndex(of: ")"),
                  text[text.index(after: open)..<close] == "postgres" else { continue }
            let fields = text[text.index(after: close)...].split(separator: " ")
            // utime, stime, cutime, cstime: fields 14–17 of the line, 12th–15th after the name.
            guard fields.count > 15 else { continue }
            ticks += fields[11...14].compactMap { Double($0) }.reduce(0, +)
        }
        return ticks / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// Seconds of CPU this process's finished (waited-for) children used: the h2load runs.
    static func waitedChildrenCPU() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_CHILDREN.rawValue, &usage)
        return Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6 + Double(usage.ru_stime.tv_sec) + Double(usage.ru_stime.tv_usec) / 1e6
    }

    /// "requests: … N succeeded" from h2load's summary.
    static func succeeded(_ output: String) -> Int {
        for line in output.split(separator: "\n") where line.hasPrefix("requests:") {
            let words = line.split(separator: " ")
            if let i = words.firstIndex(of: "succeeded,"), i > 0 { return Int(words[i - 1]) ?? 0 }
        }
        return 0
    }

    /// "status codes: A 2xx, B 3xx, C 4xx, D 5xx": the count of one class.
    static func statusCount(_ output: String, _ kind: String) -> Int {
        for line in output.split(separator: "\n") where line.hasPrefix("status codes:") {
            let words = line.replacingOccurrences(of: ",", with: "").split(separator: " ")
            if let i = words.firstIndex(where: { $0 == kind }), i > 0 { return Int(words[i - 1]) ?? 0 }
        }
        return 0
    }

    static func summary(_ output: String) -> String {
        output.split(separator: "\n").filter { $0.hasPrefix("requests:") || $0.hasPrefix("status codes:") }.joined(separator: "; ")
    }

    /// Each library's share of the samples of process `pid` in a perf recording, by where the
    /// sampled instruction was (its own code, not what it called; the kernel included), largest
    /// first. Counted from `perf script`: `perf report --pid` leaves the kernel's samples out.
    static func librariesShare(perf: String, file: String, pid: pid_t) throws -> [(library: String, share: Double)] {
        let samples = try Child.output(perf, ["script", "-i", file, "-F", "pid,ip,dso", "-G"])
        var counts: [String: Int] = [:]
        var total = 0
        for line in samples.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 3, Int32(fields[0]) == pid else { continue }
            let dso = fields[fields.count - 1].trimmingCharacters(in: CharacterSet(charactersIn: "()"))
            counts[URL(fileURLWithPath: dso).lastPathComponent, default: 0] += 1
            total += 1
        }
        guard total > 0 else { return [] }
        return counts.map { ($0.key, Double($0.value) / Double(total)) }.sorted { $0.1 > $1.1 }
    }

    static func stopPerf(_ pid: pid_t) {
        kill(pid, SIGINT)
        var status: Int32 = 0
        waitpid(pid, &status, 0)
    }

    /// Starts a program with no signal blocked, its output in `log`. Foundation's Process hands the
    /// child the calling thread's signal mask, in which a Swift task's thread blocks SIGINT,
    /// SIGTERM and SIGCHLD: perf would never stop.
    static func spawnWithSignals(_ path: String, _ arguments: [String], log: String) throws -> pid_t {
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var none = sigset_t()
        sigemptyset(&none)
        posix_spawnattr_setsigmask(&attributes, &none)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for s in [SIGINT, SIGTERM, SIGCHLD] { sigaddset(&defaults, s) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        var files = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&files)
        defer { posix_spawn_file_actions_destroy(&files) }
        posix_spawn_file_actions_addopen(&files, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_adddup2(&files, 1, 2)
        let argv: [UnsafeMutablePointer<CChar>?] = ([path] + arguments).map { strdup($0) } + [nil]
        defer { for a in argv { free(a) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, path, &files, &attributes, argv, environ)
        guard rc == 0 else { throw ValidationError("could not start \(path): error \(rc)") }
        return pid
    }

    static func which(_ name: String) -> String? {
        for dir in (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin").split(separator: ":") {
            let path = "\(dir)/\(name)"
            if FileManager.default.isExecutableFile(atPath: path) { return path }
        }
        return nil
    }


    /// `isle master-key`, `isle app add` (com.example.scores, the simulator's key in `dir/sim`, the
    /// schema in `dir`) and a backend and a device key, as an operator sets a server up.
    static func addApp(isle: String, dir: String, environment env: [String: String]) throws -> (backend: String, device: String) {
        let masterKey = try Child.output(isle, ["master-key"], environment: env)
        try masterKey.write(toFile: dir + "/master.key", atomically: true, encoding: .utf8)
        chmod(dir + "/master.key", 0o600)
        _ = try Child.output(isle, ["app", "add", "--bundle-id", "com.example.scores", "--key", dir + "/sim/AuthKey_SIMKEY0001.p8", "--key-id", "SIMKEY0001",
                                    "--team-id", "SIMTEAM001", "--schema", dir + "/schema.json"], environment: env)
        let backend = try Child.output(isle, ["key", "create", "--bundle-id", "com.example.scores", "--scope", "backend"], environment: env)
        let device = try Child.output(isle, ["key", "create", "--bundle-id", "com.example.scores", "--scope", "device"], environment: env)
        return (backend, device)
    }

    static func seconds(_ d: Duration) -> Double { Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18 }
}

/// A child process: started with its output in a file, stopped with SIGTERM (then SIGKILL).
struct Child {
    let process: Process
    var pid: pid_t { process.processIdentifier }

    static func start(_ executable: String, _ arguments: [String], environment: [String: String] = ProcessInfo.processInfo.environment, log: String) throws -> Child {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = arguments
        p.environment = environment
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: log))
        p.standardOutput = handle
        p.standardError = handle
        try p.run()
        return Child(process: p)
    }

    /// Runs to the end; its standard output, trimmed. Throws with what it printed when it fails.
    static func output(_ executable: String, _ arguments: [String], environment: [String: String] = ProcessInfo.processInfo.environment) throws -> String {
        let log = FileManager.default.temporaryDirectory.appendingPathComponent("isle-split-\(UUID().uuidString).out").path
        let errors = log + ".err"
        defer {
            try? FileManager.default.removeItem(atPath: log)
            try? FileManager.default.removeItem(atPath: errors)
        }
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = arguments
        p.environment = environment
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        _ = FileManager.default.createFile(atPath: errors, contents: nil)
        p.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: log))
        p.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: errors))
        try p.run()
        p.waitUntilExit()
        let out = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        guard p.terminationStatus == 0 else {
            let err = (try? String(contentsOfFile: errors, encoding: .utf8)) ?? ""
            throw ValidationError("\(URL(fileURLWithPath: executable).lastPathComponent) \(arguments.first ?? "") failed (\(p.terminationStatus)): \(err.suffix(500))\(out.suffix(500))")
        }
        return out.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func stop() {
        guard process.isRunning else { return }
        process.terminate()
        let deadline = Date().addingTimeInterval(10)
        while process.isRunning, Date() < deadline { usleep(20_000) }
        if process.isRunning { kill(pid, SIGKILL) }
    }
}

/// An OTLP/HTTP receiver for the tracing run: takes every export, answers 204, keeps only counts.
final class OTLPSink: Sendable {
    let requests = Mutex<(count: Int, bytes: Int)>((0, 0))
    let portBox = Mutex<Int?>(nil)
    let task = Mutex<Task<Void, any Error>?>(nil)
    var port: Int { portBox.withLock { $0 ?? 0 } }

    static func start() async throws -> OTLPSink {
        let sink = OTLPSink()
        let router = Router()
        router.post("v1/traces") { request, _ -> Response in
            let body = try await request.body.collect(upTo: 256 << 20)
            sink.requests.withLock {
                $0.count += 1
                $0.bytes += body.readableBytes
            }
            return Response(status: .noContent)
        }
        var logger = Logger(label: "isle.bench.otlp")
        logger.logLevel = .critical
        let app = Application(router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)),
                              onServerRunning: { channel in sink.portBox.withLock { $0 = channel.localAddress?.port } }, logger: logger)
        sink.task.withLock { $0 = Task { try await app.run() } }
        let deadline = ContinuousClock.now + .seconds(10)
        while sink.portBox.withLock({ $0 }) == nil {
            guard ContinuousClock.now < deadline else { throw ValidationError("the OTLP receiver did not start") }
            try await Task.sleep(for: .milliseconds(10))
        }
        return sink
    }

    func stop() async throws {
        let running = task.withLock { $0 }
        running?.cancel()
        _ = try? await running?.value
    }
}
