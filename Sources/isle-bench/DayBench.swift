import ArgumentParser
import AsyncHTTPClient
import Crypto
import Foundation
import IsleClient
import IsleClientSimulator
import IsleCore
import IsleDelivery
import IsleServer
import IsleSimulator
import IsleStore
import IsleTesting
import Logging
import NIOCore
import ServiceLifecycle
import Synchronization

/// A day in the life (docs/performance.md, "A day in the life"): simulated iPhones on iOS 16.4,
/// 17, 18 and 26 with IsleClient as their apps, the Isle server on a SQLite file, and the
/// simulator with its default leeway (reordering, priority 5 late or lost, tokens that change by
/// themselves, the budget per app, one stored push per app while offline), all on one virtual
/// clock, for `--hours` virtual hours: orders started by the app and by push-to-start, updates at
/// priority 5 and 10 with alerts, ends with dismissal dates, a match followed on its channel and
/// by tokens, orders renewed past 8 hours, widget pushes, phones offline for minutes to hours,
/// apps not running. Seeded: a run replays. It checks the server's promises and prints them as
/// figures; any broken one fails the run (exit 1).
struct DayBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "day",
        abstract: "A day in the life: simulated phones with IsleClient, the server and isle sim's default leeway on one virtual clock; checks and prints the server's promises.")

    @Option(help: "Simulated phones.") var phones = 300
    @Option(help: "Virtual hours.") var hours: Double = 24
    @Option(help: "Seeds every random choice (the scenario's and the simulator's).") var seed: UInt64 = 1
    @Option(help: "Virtual seconds per step; the checks run after each.") var step: Double = 60
    @Flag(help: "isle sim --realistic: priority 5 waits 1–60 s, tokens arrive 0.5 s after request.") var realistic = false
    @Option(help: "The server's budget scope (installation: its default; activity).") var budgetPer = "installation"
    @Option(help: "Orders a phone places in a day, on average.") var ordersPerPhone: Double = 2
    @Option(help: "Keep the run's directory (the server's SQLite file, the clients' storage) here.") var keep: String?

    func validate() throws {
        guard (1...20_000).contains(phones) else { throw ValidationError("--phones: 1 to 20000") }
        guard hours > 0, hours <= 72 else { throw ValidationError("--hours: above 0, at most 72") }
        guard step >= 5, step <= 300 else { throw ValidationError("--step: 5 to 300 virtual seconds") }
        guard BudgetScope(rawValue: budgetPer) != nil else { throw ValidationError("--budget-per: installation or activity") }
    }

    func run() async throws {
        let report = try await DayRun(options: self).run()
        print(report.text)
        if !report.violations.isEmpty {
            print("FAILED: \(report.violations.count) broken promise(s); the first ones:")
            for v in report.violations.prefix(20) { print("  - \(v)") }
            throw ExitCode(1)
        }
        print("PASSED: every promise kept.")
    }
}

// MARK: The app's types (what ActivityKit encodes)

struct OrderAttributes: Codable, Sendable {
    var numberOfPizzas: Int
    var totalAmount: String
    var orderNumber: String
}
struct OrderState: Codable, Sendable, Equatable {
    var driverName: String
    var deliveryTimer: ClosedRange<Date>
}
struct MatchAttributes: Codable, Sendable {
    var home: String
    var away: String
}
struct MatchState: Codable, Sendable, Equatable {
    var home: Int
    var away: Int
}

/// One run of the scenario.
/// Not Sendable: only `run()`'s task (the scenario's driver, strictly sequential) touches it; the
/// closures handed to the clients capture copies of what they read, never the run.
final class DayRun {
    let options: DayBench
    var random: SeededRandom
    let bundleID = "com.example.pizza"
    let orderType = "PizzaDeliveryAttributes"
    let matchType = "MatchAttributes"
    let topic = "cup-final"
    static let orderSchema = """
        { "attributesType": "PizzaDeliveryAttributes",
          "attributes": { "numberOfPizzas": "int", "totalAmount": "string", "orderNumber": "string" },
          "contentState": { "driverName": "string", "deliveryTimer": "dateRange" } }
        """
    static let matchSchema = """
        { "attributesType": "MatchAttributes", "attributes": { "home": "string", "away": "string" }, "contentState": { "home": "int", "away": "int" } }
        """

    init(options: DayBench) {
        self.options = options
        random = SeededRandom(seed: options.seed &* 0x9E37_79B9_7F4A_7C15 &+ 7)
    }

    struct Report {
        var text: String
        var violations: [String]
    }

    // MARK: The world as the backend and the checks know it

    /// A phone as the driver keeps it (touched by the driver task only, as ``DayRun``).
    final class Phone {
        let index: Int
        let device: String
        let os: String
        /// IsleClient's installation id (made at its first launch, kept in its storage).
        var installation: String
        let storage: String
        let lifecycle = SimulatedAppLifecycle(foreground: true)
        var client: IsleClient?
        var runner: Task<Void, Never>?
        var online = true
        var onlineSince: Date
        var runningSince: Date
        var followsMatch = false
        /// A shop's phone following many orders with frequent alerts: past the hourly budget.
        var busy = false
        init(index: Int, device: String, os: String, storage: String, now: Date) {
            self.index = index
            self.device = device
            self.os = os
            installation = "phone-\(index)"
            self.storage = storage
            onlineSince = now
            runningSince = now
        }
        var major: Int { Int(os.split(separator: ".")[0]) ?? 0 }
        var minor: Int { os.split(separator: ".").count > 1 ? Int(os.split(separator: ".")[1]) ?? 0 : 0 }
        var hasPushToStart: Bool { major > 17 || (major == 17 && minor >= 2) }
        var hasChannels: Bool { major >= 18 }
        var hasWidgetPushes: Bool { major >= 26 }
        var running: Bool { client != nil }
    }

    struct Order {
        let key: String
        let phone: Int
        var latest: JSONValue
        var lastUpdateAt: Date
        var lastWasHigh: Bool
        var nextUpdateAt: Date
        var endAt: Date
        var ended = false
        var renewed = false
        var byPush: Bool
        var placedAt: Date
        /// The job of the last update or end (its delivery says at which priority it went).
        var lastJob: Int64?
    }

    var phones: [Phone] = []
    var orders: [String: Order] = [:]
    var orderCount = 0
    /// Accepted jobs: what the backend asked, by job id.
    var accepted: [Int64: (kind: String, key: String, high: Bool, at: Date)] = [:]
    var violations: [String] = []
    var violationCounts: [String: Int] = [:]
    var figures: [String: Int] = [:]
    var handovers: [TimeInterval] = []
    var handoverOpen: [String: Date] = [:]
    var matchLatest: JSONValue?
    var matchLastHighAt: Date?
    var matchEnded = false
    var convergenceChecks = 0
    /// Match followers whose phone's log shows the leeway took a goal (phone, why).
    var leewayMatch = Set<String>()
    /// Orders whose last priority-10 push APNs stored for the offline phone and then replaced.
    var leewayOrders = Set<String>()

    /// Convergence breaks already told (key and the content it should show): one break, once.
    var toldConvergence = Set<String>()

    func violation(_ kind: String, _ text: String) {
        violationCounts[kind, default: 0] += 1
        if violations.count < 200 { violations.append("\(kind): \(text)") }
        if violations.count <= 20 { FileHandle.standardError.write(Data("broken: \(kind): \(text)\n".utf8)) }
    }

    // MARK: Running

    func run() async throws -> Report {
        let started = ContinuousClock.now
        var quiet = Logger(label: "isle.day")
        quiet.logLevel = .critical
        let t0 = Date(timeIntervalSince1970: 1_767_225_600)
        let clock = ManualWallClock(t0)
        var simulator = IsleSim.Configuration()
        simulator.device = options.realistic ? SimulatorConfiguration.realistic(seed: options.seed) : SimulatorConfiguration()
        simulator.device.seed = options.seed
        let dir = options.keep.map { URL(fileURLWithPath: $0) } ?? FileManager.default.temporaryDirectory.appendingPathComponent("isle-day-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { if options.keep == nil { try? FileManager.default.removeItem(at: dir) } }
        return try await IsleSim.withRunning(configuration: simulator, clock: clock, logger: quiet) { sim in
            let key = TestProviderKey()
            try sim.apns.register(RegisteredKey(keyID: key.keyID, teamID: key.teamID, publicKeyPEM: key.publicKeyPEM))
            let databasePath = dir.appendingPathComponent("isle.sqlite").path
            let store = try SQLiteStore(path: databasePath)
            try await store.migrate()
            let masterKey = MasterKey.generate()
            let ticketKey = P256.Signing.PrivateKey()
            try await store.upsertApp(AppRecord(bundleID: bundleID, teamID: key.teamID, keyID: key.keyID, keyPEM: masterKey.seal(key.privateKeyPEM, bundleID: bundleID),
                                                schemas: [try ActivitySchema(jsonText: Self.orderSchema), try ActivitySchema(jsonText: Self.matchSchema)], createdAt: t0,
                                                ticketKeys: [TicketKey(id: "tk_day", publicKeyPEM: ticketKey.publicKey.pemRepresentation, createdAt: t0)]))
            let backendKey = try await ServerSetup.createKey(store: store, bundleID: bundleID, scope: .backend).secret
            let deviceKey = try await ServerSetup.createKey(store: store, bundleID: bundleID, scope: .device).secret
            var c = ServerConfiguration()
            c.port = 0
            c.database = databasePath
            c.sendBothEnvironments(to: .custom(url: sim.apnsURL, broadcastURL: sim.broadcastURL, managementURL: sim.managementURL, trustRootsPEM: sim.caCertificatePEM))
            c.masterKey = masterKey
            c.randomSeed = options.seed
            c.budgetScope = BudgetScope(rawValue: options.budgetPer) ?? .installation
            // Every phone's app talks to the server from 127.0.0.1: the per-address limits are for
            // the internet, not for 300 phones behind one loopback address.
            c.deviceAddressLimit = .off
            // …and with one device key: thousands of apps launching in the same real second would
            // spend the key's burst (each app's IsleClient retries a 429; the run's own calls do not).
            c.rateLimits[.device] = RateLimit(perSecond: 100_000, burst: 200_000)
            c.deviceInstallationLimit = .off
            c.authFailureLimit = .off
            c.quotas.newInstallationsPerAddressPerHour = 0
            c.quotas.newActivitiesPerAddressPerHour = 0
            let server = IsleServerApp(configuration: c, store: store, clock: clock, logger: quiet)
            let group = ServiceGroup(configuration: .init(services: [server], gracefulShutdownSignals: [], logger: quiet))
            let serverTask = Task { try await group.run() }
            let http = HTTPClient(eventLoopGroupProvider: .singleton)
            let base = "http://127.0.0.1:\(await server.port())"
            let env = Env(sim: sim, clock: clock, store: store, http: http, base: base, backendKey: backendKey, deviceKey: deviceKey, ticketKey: ticketKey, dir: dir)
            do {
                try await scenario(env)
            } catch {
                for p in phones { await stop(p) }
                await group.triggerGracefulShutdown()
                _ = try? await serverTask.value
                try? await http.shutdown()
                throw error
            }
            for p in phones { await stop(p) }
            await group.triggerGracefulShutdown()
            _ = try? await serverTask.value
            try await http.shutdown()
            let seconds = Double((ContinuousClock.now - started).components.seconds)
            return Report(text: summary(seconds: seconds), violations: violations)
        }
    }

    struct Env: Sendable {
        let sim: IsleSim
        let clock: ManualWallClock
        let store: SQLiteStore
        let http: HTTPClient
        let base: String
        let backendKey: String
        let deviceKey: String
        let ticketKey: P256.Signing.PrivateKey
        let dir: URL
        var world: SimulatorWorld { sim.world }
    }

    // MARK: The scenario

    /// What happens when, drawn from the seed before the day starts.
    enum Happening {
        case order(phone: Int)
        case offline(phone: Int, minutes: Double)
        case terminate(phone: Int, minutes: Double)
        /// The person opens the app (it re-reads its tokens, as IsleClient does at each foreground entry).
        case open(phone: Int)
        case openMatch, matchUpdate(goal: Bool), endMatch
        case widgets
    }

    func scenario(_ env: Env) async throws {
        let t0 = env.clock.now
        let end = t0.addingTimeInterval(options.hours * 3600)
        let versions = ["16.4", "17.2", "17.5", "18.1", "18.4", "26.0", "26.1"]
        for i in 0..<options.phones {
            let os = versions[Int.random(in: 0..<versions.count, using: &random)]
            let device = try env.world.createDevice(name: "phone-\(i)", osVersion: os, model: "iPhone 15")
            var widgets: [SimulatedWidget.Configuration] = []
            if os.hasPrefix("26") { widgets = [.init(kind: "favorite", source: .fixed(WidgetTimeline(entries: [.init(date: t0, content: ["pizza": "Diavola"])], policy: .never)))] }
            _ = try env.world.install(.init(bundleID: bundleID, schemas: [try ActivitySchema(jsonText: Self.orderSchema), try ActivitySchema(jsonText: Self.matchSchema)], widgets: widgets), on: device)
            let p = Phone(index: i, device: device, os: os, storage: env.dir.appendingPathComponent("client-\(i).json").path, now: t0)
            phones.append(p)
            try await launch(p, env)
        }
        try await settle(env, within: .seconds(60))
        try await staleRegistrations(env)
        // The day's happenings, drawn up front.
        var plan: [(Date, Happening)] = []
        let day = options.hours * 3600
        for p in phones {
            p.busy = p.hasPushToStart && Double.random(in: 0..<1, using: &random) < 0.02
            let orders = Self.poisson((p.busy ? 30 : options.ordersPerPhone) * options.hours / 24, &random)
            for _ in 0..<orders { plan.append((t0.addingTimeInterval(Double.random(in: 600..<max(601, day - 3600), using: &random)), .order(phone: p.index))) }
            for _ in 0..<Self.poisson(2 * options.hours / 24, &random) {
                let minutes = exp(Double.random(in: log(5)...log(180), using: &random))
                plan.append((t0.addingTimeInterval(Double.random(in: 0..<day, using: &random)), .offline(phone: p.index, minutes: minutes)))
            }
            for _ in 0..<Self.poisson(1.5 * options.hours / 24, &random) {
                let minutes = exp(Double.random(in: log(10)...log(360), using: &random))
                plan.append((t0.addingTimeInterval(Double.random(in: 0..<day, using: &random)), .terminate(phone: p.index, minutes: minutes)))
            }
            for _ in 0..<Self.poisson(3 * options.hours / 24, &random) { plan.append((t0.addingTimeInterval(Double.random(in: 0..<day, using: &random)), .open(phone: p.index))) }
            p.followsMatch = Double.random(in: 0..<1, using: &random) < 0.3
        }
        let matchStart = t0.addingTimeInterval(min(day / 4, 2 * 3600))
        plan.append((matchStart, .openMatch))
        // A score: only goals are pushed (priority 10, with an alert), so a follower that was
        // offline at a goal has only APNs' stored message to catch up with.
        for _ in 0..<5 { plan.append((matchStart.addingTimeInterval(Double.random(in: 5 * 60...115 * 60, using: &random)), .matchUpdate(goal: true))) }
        plan.append((matchStart.addingTimeInterval(125 * 60), .endMatch))
        for h in stride(from: 1.0, to: options.hours, by: 2) { plan.append((t0.addingTimeInterval(h * 3600 + 90), .widgets)) }
        plan.sort { $0.0 < $1.0 }
        var next = 0
        var offlineUntil: [Int: Date] = [:]
        var terminatedUntil: [Int: Date] = [:]
        var stepNumber = 0
        while env.clock.now < end {
            let now = env.clock.now
            // Phones coming back, apps opened again.
            for (i, at) in offlineUntil where at <= now {
                try await env.world.setOnline(phones[i].device, true)
                phones[i].online = true
                phones[i].onlineSince = now
                offlineUntil[i] = nil
            }
            for (i, at) in terminatedUntil where at <= now {
                try await launch(phones[i], env)
                terminatedUntil[i] = nil
            }
            while next < plan.count, plan[next].0 <= now {
                let (_, h) = plan[next]
                next += 1
                switch h {
                case .order(let i): try await placeOrder(phones[i], env)
                case .offline(let i, let minutes):
                    guard phones[i].online else { continue }
                    try await env.world.setOnline(phones[i].device, false)
                    phones[i].online = false
                    offlineUntil[i] = now.addingTimeInterval(minutes * 60)
                case .terminate(let i, let minutes):
                    guard phones[i].running else { continue }
                    await stop(phones[i])
                    try env.world.updateSettings(bundleID: bundleID, on: phones[i].device, terminated: true)
                    terminatedUntil[i] = now.addingTimeInterval(minutes * 60)
                case .open(let i):
                    if phones[i].running {
                        phones[i].lifecycle.enterForeground()
                        try env.world.updateSettings(bundleID: bundleID, on: phones[i].device, foreground: true)
                    } else {
                        try await launch(phones[i], env)
                        terminatedUntil[i] = nil
                    }
                case .openMatch: try await openMatch(env)
                case .matchUpdate(let goal): try await matchUpdate(env, goal: goal)
                case .endMatch: try await endMatch(env)
                case .widgets: try await widgetPushes(env)
                }
            }
            try await updateOrders(env)
            try await settle(env)
            try await env.world.advanceClock(by: options.step)
            try await settle(env)
            try await check(env)
            noteAPNsOutcomes(env)
            stepNumber += 1
            if stepNumber % Int(3600 / options.step) == 0 {
                FileHandle.standardError.write(Data("hour \(Int(env.clock.now.timeIntervalSince(t0) / 3600)): \(orders.count) orders, \(accepted.count) pushes accepted, \(violations.count) violations\n".utf8))
            }
        }
        // The end of the day: every phone back online, every app open, time for the last pushes.
        for (i, _) in offlineUntil {
            try await env.world.setOnline(phones[i].device, true)
            phones[i].online = true
            phones[i].onlineSince = env.clock.now
        }
        for (i, _) in terminatedUntil { try await launch(phones[i], env) }
        for _ in 0..<10 {
            try await settle(env)
            try await env.world.advanceClock(by: 60)
        }
        try await settle(env, within: .seconds(60))
        try await check(env)
        noteAPNsOutcomes(env)
        try await compareRecords(env)
        // Then the night: no new work, 9 virtual hours, so every push still waiting (for a token
        // an app never handed over, for a retry) reaches its deadline and its outcome.
        for _ in 0..<(9 * 12) {
            try await env.world.advanceClock(by: 300)
            try await settle(env)
        }
        try await settle(env, within: .seconds(60))
        try await finalChecks(env)
    }

    /// The day starts with orders registered by builds that are gone (a reinstalled debug build,
    /// a restarted simulator): the server holds tokens no device has. The backend's first pushes of
    /// the day go to them, before any other push of the app was accepted.
    func staleRegistrations(_ env: Env) async throws {
        let now = env.clock.now
        for k in 0..<3 {
            let installation = "stale-build-\(k)"
            var r = HTTPClientRequest(url: env.base + "/v1/installations/\(installation)")
            r.method = .PUT
            r.headers.add(name: "authorization", value: "Bearer \(env.deviceKey)")
            r.body = .bytes(ByteBuffer(bytes: (["liveActivitiesEnabled": true] as JSONValue).jsonBytes))
            let made = try await env.http.execute(r, timeout: .seconds(30))
            let secret = (try? JSONParser.parse(Array(buffer: try await made.body.collect(upTo: 1 << 20))))?["installationSecret"]?.stringValue ?? ""
            let key = "order-stale-\(k)"
            let ticket = try RegistrationTicket(bundleID: bundleID, expires: now.addingTimeInterval(3600), externalKey: key).signed(with: env.ticketKey, keyID: "tk_day")
            var a = HTTPClientRequest(url: env.base + "/v1/activities")
            a.method = .POST
            a.headers.add(name: "authorization", value: "Bearer \(env.deviceKey)")
            a.headers.add(name: "Isle-Installation-Secret", value: secret)
            let token = (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255, using: &random)) }.joined()
            a.body = .bytes(ByteBuffer(bytes: (["attributesType": .string(orderType), "token": .string(token), "externalKey": .string(key), "installationID": .string(installation),
                                                "ticket": .string(ticket)] as JSONValue).jsonBytes))
            let registered = try await env.http.execute(a, timeout: .seconds(30))
            _ = try await registered.body.collect(upTo: 1 << 20)
            guard registered.status == .created || registered.status == .ok else { violation("setup", "a stale registration answered \(registered.status.code)"); continue }
            let (status, answer) = try await call(env, "POST", "/v1/activities/by-key/\(key)/update", ["contentState": Self.orderState("Nobody", now), "priority": 10])
            if status == 202 { noteAccepted(answer, kind: "update", key: key, high: true, at: now) }
            staleKeys.insert(key)
        }
    }
    var staleKeys = Set<String>()

    static func poisson(_ mean: Double, _ random: inout SeededRandom) -> Int {
        var k = 0
        var p = 1.0
        let l = exp(-mean)
        repeat {
            k += 1
            p *= Double.random(in: 0..<1, using: &random)
        } while p > l
        return k - 1
    }

    // MARK: The app

    func launch(_ p: Phone, _ env: Env) async throws {
        guard !p.running else { return }
        if (try? env.world.app(bundleID, on: p.device)) != nil, p.client != nil || FileManager.default.fileExists(atPath: p.storage) {
            try env.world.updateSettings(bundleID: bundleID, on: p.device, foreground: true)
        }
        var c = IsleClient.Configuration(serverURL: URL(string: env.base)!, deviceKey: env.deviceKey, environment: nil, lifecycle: p.lifecycle)
        c.firstRetry = 0.05
        c.maximumRetry = 1
        c.requestTimeout = 10
        let clock = env.clock
        c.now = { clock.now }
        c.capabilities = IsleClient.Capabilities(liveActivities: true, pushToStart: p.hasPushToStart, pushToStartUpdateToken: p.hasChannels, broadcastChannels: p.hasChannels,
                                                 widgetPushToken: p.hasWidgetPushes)
        let ticketKey = env.ticketKey
        let bundleID = self.bundleID
        c.ticket = { request in
            try RegistrationTicket(bundleID: bundleID, expires: clock.now.addingTimeInterval(86_400), externalKey: request.externalKey, installationID: request.installationID)
                .signed(with: ticketKey, keyID: "tk_day")
        }
        let client = try IsleClient(configuration: c, storage: FileStorage(path: p.storage))
        p.client = client
        p.installation = await client.installationID
        p.runner = Task { await client.run() }
        p.runningSince = env.clock.now
        let orders = SimulatedActivityKit<OrderAttributes, OrderState>(world: env.world, deviceID: p.device, bundleID: bundleID, attributesType: orderType)
        await client.track(SimulatedLiveActivities(orders), externalKey: { $0.attributes.map { "order-" + $0.orderNumber } })
        let world = env.world
        let device = p.device
        let match = SimulatedActivityKit<MatchAttributes, MatchState>(world: env.world, deviceID: p.device, bundleID: bundleID, attributesType: matchType)
        let topic = self.topic
        await client.track(SimulatedLiveActivities(match), topics: { _ in [topic] }, externalKey: { _ in nil },
                           channelID: { h in (try? world.device(device).activities.first { $0.id == h.id })?.channelID })
        if p.hasWidgetPushes { await client.trackWidgetPushToken(SimulatedWidgetPushTokens(world: env.world, deviceID: p.device, bundleID: bundleID)) }
    }

    func stop(_ p: Phone) async {
        guard let client = p.client else { return }
        await client.stop()
        p.runner?.cancel()
        p.client = nil
        p.runner = nil
    }

    // MARK: The backend

    func call(_ env: Env, _ method: String, _ path: String, _ body: JSONValue? = nil) async throws -> (Int, JSONValue) {
        var r = HTTPClientRequest(url: env.base + path)
        r.method = .init(rawValue: method)
        r.headers.add(name: "authorization", value: "Bearer \(env.backendKey)")
        if let body { r.body = .bytes(ByteBuffer(bytes: body.jsonBytes)) }
        let response = try await env.http.execute(r, timeout: .seconds(30))
        let bytes = try await response.body.collect(upTo: 16 << 20)
        let json = bytes.readableBytes == 0 ? JSONValue.null : ((try? JSONParser.parse(Array(buffer: bytes))) ?? .string(String(buffer: bytes)))
        return (Int(response.status.code), json)
    }

    @discardableResult
    func noteAccepted(_ answer: JSONValue, kind: String, key: String, high: Bool, at: Date) -> Int64? {
        var last: Int64?
        for j in answer["jobs"]?.arrayValue ?? [] {
            if let id = j.numberValue?.int64Value {
                accepted[id] = (kind, key, high, at)
                last = id
            }
        }
        return last
    }

    /// What the simulator's APNs did with each apns-id (its log is a window: read every step).
    var apnsOutcome: [String: PushOutcome.Code] = [:]
    func noteAPNsOutcomes(_ env: Env) {
        for r in env.sim.apns.requestLog {
            if let id = r.apnsID, let code = r.outcome?.code { apnsOutcome[id] = code }
        }
    }

    /// The phone's last word on a push, else APNs' (a push stored for an offline phone and then
    /// replaced by a later one to the app leaves no trace on the phone).
    func outcome(ofAPNsID id: String) -> PushOutcome.Code? { deviceOutcome[id] ?? apnsOutcome[id] }

    /// The server's events so far (read as a backend does, from its cursor): at which priority
    /// each push went.
    var eventCursor = "0"
    /// Activities the backend started by push-to-start: their key and when.
    var startedActivities: [String: (key: String, at: Date)] = [:]
    var sentPriority: [Int64: Int] = [:]
    /// Why each failed push failed (its push.failed event), and every job's events in order.
    var failedReasons: [Int64: String] = [:]
    var jobEvents: [Int64: [String]] = [:]
    func readEvents(_ env: Env) async throws {
        while true {
            let (_, page) = try await call(env, "GET", "/v1/events?limit=1000&after=\(eventCursor)")
            let got = page["events"]?.arrayValue ?? []
            for e in got where e["data"]?["kind"] == "start" {
                if let id = e["activityID"]?.stringValue, let (key, at) = startedActivities[id], let job = e["data"]?["jobID"]?.numberValue?.int64Value, accepted[job] == nil {
                    accepted[job] = ("start", key, true, at)
                }
            }
            for e in got {
                guard let job = e["data"]?["jobID"]?.numberValue?.int64Value, let type = e["type"]?.stringValue else { continue }
                jobEvents[job, default: []].append(type)
                if type == "push.failed" { failedReasons[job] = e["data"]?["reason"]?.stringValue ?? "" }
            }
            for e in got where e["type"] == "push.delivered" {
                if let job = e["data"]?["jobID"]?.numberValue?.int64Value, let p = e["data"]?["priority"]?.numberValue?.int64Value { sentPriority[job] = Int(p) }
                if let job = e["data"]?["jobID"]?.numberValue?.int64Value, let id = e["data"]?["apnsID"]?.stringValue { apnsIDs[job] = id }
            }
            guard got.count == 1000, let n = page["next"]?.stringValue else {
                if let n = page["next"]?.stringValue { eventCursor = n }
                return
            }
            eventCursor = n
        }
    }

    /// The delivery timer of content made at `now`: whole seconds, as the JSON form has them.
    static func timer(_ now: Date) -> ClosedRange<Date> {
        let ref = now.timeIntervalSinceReferenceDate.rounded()
        return Date(timeIntervalSinceReferenceDate: ref)...Date(timeIntervalSinceReferenceDate: ref + 1800)
    }

    static func orderState(_ driver: String, _ now: Date) -> JSONValue {
        let ref = now.timeIntervalSinceReferenceDate.rounded()
        return ["driverName": .string(driver), "deliveryTimer": [.int(Int64(ref)), .int(Int64(ref + 1800))]]
    }

    func placeOrder(_ p: Phone, _ env: Env) async throws {
        orderCount += 1
        let number = "\(orderCount)"
        let key = "order-" + number
        let now = env.clock.now
        let content = Self.orderState("Placed", now)
        let long = Double.random(in: 0..<1, using: &random) < 0.05 && p.hasPushToStart
        var byPush = p.hasPushToStart && Double.random(in: 0..<1, using: &random) < 0.5
        if byPush {
            // The backend starts it (push-to-start): needs the installation's push-to-start token.
            let (status, answer) = try await call(env, "POST", "/v1/installations/\(p.installation)/start", [
                "attributesType": .string(orderType), "externalKey": .string(key),
                "attributes": ["numberOfPizzas": 2, "totalAmount": "$31.00", "orderNumber": .string(number)],
                "contentState": content, "alert": ["title": .string("Order \(number)"), "body": "We got it"],
            ])
            if status == 202 {
                // A start's answer names the activity it made, not its job: the job is learnt from
                // the events about that activity (readEvents).
                for a in answer["activities"]?.arrayValue ?? [] { if let id = a["activityID"]?.stringValue { startedActivities[id] = (key, now) } }
            } else {
                figures["orders not push-started (no push-to-start token yet)", default: 0] += 1
                byPush = false
            }
        }
        if !byPush {
            // The person orders in the app: it is open.
            try await launch(p, env)
            let kit = SimulatedActivityKit<OrderAttributes, OrderState>(world: env.world, deviceID: p.device, bundleID: bundleID, attributesType: orderType)
            do {
                _ = try kit.request(attributes: OrderAttributes(numberOfPizzas: 2, totalAmount: "$31.00", orderNumber: number),
                                    content: OrderState(driverName: "Placed", deliveryTimer: Self.timer(now)))
            } catch {
                figures["orders refused by ActivityKit (limits)", default: 0] += 1
                return
            }
        }
        figures[byPush ? "orders started by push-to-start" : "orders started by the app", default: 0] += 1
        let life = long ? 14 * 3600.0 : p.busy ? Double.random(in: 60 * 60...180 * 60, using: &random) : Double.random(in: 20 * 60...100 * 60, using: &random)
        orders[key] = Order(key: key, phone: p.index, latest: content, lastUpdateAt: now, lastWasHigh: byPush, nextUpdateAt: now.addingTimeInterval(Double.random(in: 180...600, using: &random)),
                            endAt: now.addingTimeInterval(life), byPush: byPush, placedAt: now)
        if long { orders[key]!.renewed = true }
    }

    func updateOrders(_ env: Env) async throws {
        let now = env.clock.now
        for key in orders.keys.sorted() {
            guard var o = orders[key], !o.ended else { continue }
            // A renewal once the server knows the order (its registration may lag the order).
            if o.renewed, o.placedAt.addingTimeInterval(600) <= now, o.placedAt.addingTimeInterval(660) > now {
                let (status, answer) = try await call(env, "PUT", "/v1/activities/by-key/\(key)/renewal", [
                    "renewUntil": .int(Int64(o.endAt.timeIntervalSince1970)), "alert": ["title": "Still on it", "body": "Your order continues"],
                    "attributes": ["numberOfPizzas": 2, "totalAmount": "$31.00", "orderNumber": .string(String(key.dropFirst(6)))],
                ])
                figures[status == 200 ? "renewals set" : "renewals refused (\(status) \(answer["error"]?["code"]?.stringValue ?? ""))", default: 0] += 1
            }
            if o.endAt <= now {
                let content = Self.orderState("Delivered", now)
                let (status, answer) = try await call(env, "POST", "/v1/activities/by-key/\(key)/end", [
                    "contentState": content, "dismissalDate": .int(Int64(now.timeIntervalSince1970) + 900),
                ])
                o.ended = true
                // An end goes at priority 10 (docs/server.md, "What each push carries").
                record(&o, status: status, answer: answer, kind: "end", content: content, high: true, now: now)
                orders[key] = o
                continue
            }
            guard o.nextUpdateAt <= now else { continue }
            let busy = phones[o.phone].busy
            let high = Double.random(in: 0..<1, using: &random) < (busy ? 0.6 : 0.25)
            let content = Self.orderState("Stop \(Int(now.timeIntervalSince(o.placedAt) / 60)) min", now)
            var body: JSONObject = ["contentState": content]
            if high { body["alert"] = ["title": "Your order", "body": "On its way"] }
            let (status, answer) = try await call(env, "POST", "/v1/activities/by-key/\(key)/update", .object(body))
            o.nextUpdateAt = now.addingTimeInterval(o.renewed ? 1800 : busy ? Double.random(in: 60...240, using: &random) : Double.random(in: 180...720, using: &random))
            record(&o, status: status, answer: answer, kind: "update", content: content, high: high, now: now)
            orders[key] = o
        }
    }

    /// What the backend keeps of an update or end it asked for: the order's latest content, or why it was refused.
    func record(_ o: inout Order, status: Int, answer: JSONValue, kind: String, content: JSONValue, high: Bool, now: Date) {
        guard status == 202 else {
            figures["\(kind)s refused (\(status) \(answer["error"]?["code"]?.stringValue ?? ""))", default: 0] += 1
            return
        }
        o.lastJob = noteAccepted(answer, kind: kind, key: o.key, high: high, at: now)
        o.latest = content
        o.lastUpdateAt = now
        o.lastWasHigh = high
    }

    func openMatch(_ env: Env) async throws {
        let (status, _) = try await call(env, "PUT", "/v1/topics/\(topic)", ["storagePolicy": 1])
        guard status == 200 else { return violation("setup", "PUT /v1/topics answered \(status)") }
        for p in phones where p.followsMatch {
            try await launch(p, env)
            guard let client = p.client else { continue }
            let kit = SimulatedActivityKit<MatchAttributes, MatchState>(world: env.world, deviceID: p.device, bundleID: bundleID, attributesType: matchType)
            let topic = self.topic
            do {
                let following = try await client.follow(topic: topic, externalKey: nil, channels: p.hasChannels) { pushType in
                    let type: SimulatedActivityKit<MatchAttributes, MatchState>.PushType = switch pushType {
                    case .channel(let id): .channel(id)
                    case .token: .token
                    }
                    return SimulatedLiveActivities(kit).handle(try kit.request(attributes: MatchAttributes(home: "Reds", away: "Blues"), content: MatchState(home: 0, away: 0), pushType: type))
                }
                if case .channel = following.pushType { figures["match followers on the channel", default: 0] += 1 } else { figures["match followers by token", default: 0] += 1 }
            } catch {
                figures["match followers refused by ActivityKit", default: 0] += 1
            }
        }
        matchLatest = ["home": 0, "away": 0]
    }

    var matchScore = (0, 0)
    func matchUpdate(_ env: Env, goal: Bool) async throws {
        guard matchLatest != nil, !matchEnded else { return }
        if goal { matchScore.0 += 1 }
        let content: JSONValue = ["home": .int(Int64(matchScore.0)), "away": .int(Int64(matchScore.1))]
        var body: JSONObject = ["contentState": content]
        if goal { body["alert"] = ["title": "Goal", "body": "Reds score"] }
        let now = env.clock.now
        let (status, answer) = try await call(env, "POST", "/v1/topics/\(topic)/update", .object(body))
        guard status == 202 else { return violation("api", "topic update answered \(status): \(answer.jsonString)") }
        noteAccepted(answer, kind: "topic", key: topic, high: goal, at: now)
        matchLatest = content
        matchLastHighAt = goal ? now : nil
    }

    func endMatch(_ env: Env) async throws {
        guard matchLatest != nil else { return }
        let now = env.clock.now
        let content: JSONValue = ["home": .int(Int64(matchScore.0)), "away": .int(Int64(matchScore.1))]
        let (status, answer) = try await call(env, "POST", "/v1/topics/\(topic)/end", ["contentState": content, "dismissalDate": .int(Int64(now.timeIntervalSince1970) + 1800)])
        guard status == 202 else { return violation("api", "topic end answered \(status)") }
        noteAccepted(answer, kind: "topic-end", key: topic, high: false, at: now)
        matchEnded = true
    }

    func widgetPushes(_ env: Env) async throws {
        for p in phones where p.hasWidgetPushes {
            let (status, answer) = try await call(env, "POST", "/v1/installations/\(p.installation)/widgets/reload")
            if status == 202 { noteAccepted(answer, kind: "widgets", key: p.installation, high: false, at: env.clock.now) }
            let refusal = answer["error"]?["code"]?.stringValue ?? ""
            figures[status == 202 ? "widget pushes accepted" : refusal == "noWidgetToken" ? "widget pushes not sent: the app has not handed over a widget token yet (409)" : "widget pushes refused (\(status) \(refusal))", default: 0] += 1
        }
    }

    // MARK: Settling

    /// Waits (real time, bounded) until nothing is due at the server and every running app has sent
    /// what it had: what the virtual clock's step made happen has happened.
    func settle(_ env: Env, within: Duration = .seconds(10)) async throws {
        let deadline = ContinuousClock.now + within
        try await Task.sleep(for: .milliseconds(15))
        while ContinuousClock.now < deadline {
            let now = env.clock.now
            let due = try await env.store.nextDue(excludingApps: []).map { $0 <= now } ?? false
            let claimed = try await env.store.openJobCounts()[.claimed] ?? 0
            var pending = 0
            for p in phones { if let c = p.client { pending += await c.pendingReports } }
            if !due, claimed == 0, pending == 0 { return }
            try await Task.sleep(for: .milliseconds(10))
        }
    }

    // MARK: Checks

    func check(_ env: Env) async throws {
        let now = env.clock.now
        // Convergence: an order whose last update went at priority 10 a minute ago, on a phone
        // online for a minute, shows it — unless the server cannot reach it yet (no token: the
        // app has not run since a push-start or a rotation; it shows it within a minute of that).
        try await readEvents(env)
        noteAPNsOutcomes(env)
        for (key, o) in orders where !o.ended && o.lastWasHigh {
            let p = phones[o.phone]
            guard now.timeIntervalSince(o.lastUpdateAt) >= 60, p.online, now.timeIntervalSince(p.onlineSince) >= 60 else { continue }
            // Sent at priority 10: the promise holds. Sent at 5 (the budget spent, or not sent yet):
            // priority 5 may arrive late or never (Apple), so nothing is promised.
            if let job = o.lastJob, let priority = sentPriority[job], priority < 10 { continue }
            guard let shown = try env.world.device(p.device).activities.filter({ $0.attributesType == orderType && $0.attributes["orderNumber"]?.stringValue == String(key.dropFirst(6)) && $0.state.isOngoing }).max(by: { $0.startedAt < $1.startedAt }) else { continue }
            convergenceChecks += 1
            if shown.contentState != o.latest {
                // Apple's leeway: APNs stored the push while the phone was offline and a later push
                // to the app replaced it (APNs keeps one per app): the phone never saw it.
                if let job = o.lastJob, let id = apnsIDs[job], !(try env.world.device(p.device).events.contains { $0.apnsID == id }), let code = apnsOutcome[id], [.storedWhileOffline, .heldByAPNs].contains(code) {
                    leewayOrders.insert(key)
                    continue
                }
                // Apple's leeway again: APNs kept the push it already held for the offline phone
                // rather than this newer one ("in most cases" the latest is stored).
                if let job = o.lastJob, let id = apnsIDs[job],
                   try env.world.device(p.device).events.contains(where: { $0.apnsID == id && $0.outcome?.code == .expiredWhileOffline && $0.message.contains("kept the push it already held") }) {
                    leewayOrders.insert(key)
                    continue
                }
                // Reachable? The server's record must have a token since a minute.
                let (_, record) = try await call(env, "GET", "/v1/activities/by-key/\(key)?deliveries=1")
                if record["hasToken"] == .bool(true), record["state"] == "active", p.running && now.timeIntervalSince(p.runningSince) >= 60 || !o.byPush {
                    guard toldConvergence.insert("\(key) \(o.latest.jsonString)").inserted else { continue }
                    let log = try env.world.device(p.device).events.filter { $0.activityID == shown.id }.suffix(3).map { "\($0.outcome?.code.rawValue ?? "-"): \($0.message.prefix(160))" }
                    let all = try env.world.device(p.device).activities.filter { $0.attributesType == orderType && $0.attributes["orderNumber"]?.stringValue == String(key.dropFirst(6)) }
                        .map { "\($0.id.prefix(8)) \($0.state.rawValue) by \($0.startedBy.rawValue) token \($0.updateToken?.prefix(6) ?? "-") \($0.contentState["driverName"]?.stringValue ?? "")" }
                    violation("convergence", "\(key) on \(p.device) (iOS \(p.os)\(p.busy ? ", busy" : "")) shows \(shown.contentState.jsonString), the backend's latest (priority 10, \(Int(now.timeIntervalSince(o.lastUpdateAt))) s ago) is \(o.latest.jsonString); the phone's log ends \(log); on the phone: \(all); the server: \(record["id"]?.stringValue ?? "") \(record["state"]?.stringValue ?? "") \(record["contentState"]?["driverName"]?.stringValue ?? ""); its last push: job \(o.lastJob.map(String.init) ?? "-") at priority \(o.lastJob.flatMap { sentPriority[$0] }.map(String.init) ?? "?"), apns-id \(o.lastJob.flatMap { apnsIDs[$0] }?.prefix(8) ?? "-"), APNs \(o.lastJob.flatMap { apnsIDs[$0] }.flatMap { apnsOutcome[$0]?.rawValue } ?? "-"), on the phone \(o.lastJob.flatMap { apnsIDs[$0] }.map { id in (try? env.world.device(p.device).events.filter { $0.apnsID == id }.compactMap { $0.outcome?.code.rawValue }) ?? [] } ?? [])")
                } else {
                    figures["convergence checks waiting for the app to hand over a token", default: 0] += 1
                }
            }
        }
        if let latest = matchLatest, let at = matchLastHighAt, now.timeIntervalSince(at) >= 60 {
            for p in phones where p.followsMatch && p.online && now.timeIntervalSince(p.onlineSince) >= 60 {
                guard let shown = try env.world.device(p.device).activities.first(where: { $0.attributesType == matchType && $0.state.isOngoing }) else { continue }
                convergenceChecks += 1
                // By token, the server reaches it only with its current token: after a rotation the
                // app must run to hand it over (the channel needs no token).
                if shown.contentState != latest, shown.channelID != nil || (p.running && now.timeIntervalSince(p.runningSince) >= 60) {
                    // Apple's leeway, which no server can see: the phone's log says the goal never
                    // reached the activity (priority 5 lost; stored while offline, then replaced by a
                    // later push to the app — APNs keeps one per app).
                    let log = try env.world.device(p.device).events.filter { $0.activityID == shown.id && $0.outcome != nil }
                    let lastApplied = log.lastIndex { [.applied, .ended, .flagged, .started].contains($0.outcome!.code) } ?? -1
                    // A goal that came at priority 5 (the phone's budget spent: Isle downgraded it) is
                    // promised nothing either, as for orders.
                    // Or APNs stored the last push to its token while the phone was offline, and a later
                    // push to the app replaced it (one per app): no trace on the activity at all.
                    // (The server's record of the follower names its last push; APNs' log, what became of it.)
                    let events = try env.world.device(p.device).events
                    var replaced = false
                    if shown.channelID == nil {
                        let (_, records) = try await call(env, "GET", "/v1/activities?installationID=\(p.installation)&topic=\(topic)&limit=5")
                        if let id = records["activities"]?.arrayValue?.first?["id"]?.stringValue {
                            let (_, detail) = try await call(env, "GET", "/v1/activities/\(id)?deliveries=1")
                            if let last = detail["deliveries"]?.arrayValue?.first?["apnsID"]?.stringValue, let code = apnsOutcome[last] {
                                replaced = [.storedWhileOffline, .heldByAPNs].contains(code) && !events.contains { $0.apnsID == last && $0.outcome?.code != code }
                                    // …or APNs kept the older push it held for the offline phone's app
                                    // rather than this one ("in most cases" the latest), and a later
                                    // push to the app replaced that one.
                                    || code == .expiredWhileOffline && events.contains { $0.apnsID == last && $0.message.contains("kept the push it already held") }
                            }
                        }
                    }
                    // On the channel, a broadcast the phone throttled: its app had spent its hour.
                    // By token, a push APNs held (reordering) that never reached the activity after it:
                    // its token changed meanwhile (APNs had answered 200; the rotation's refresh
                    // brings the content once the app hands the new token over).
                    let excused: Set<PushOutcome.Code> = shown.channelID != nil ? [.lostLowPriority, .storedWhileOffline, .expiredWhileOffline, .deferredLowPriority, .throttled]
                        : [.lostLowPriority, .storedWhileOffline, .expiredWhileOffline, .deferredLowPriority, .heldByAPNs]
                    // (Not a push the server told APNs not to store: apns-expiration 0 is its choice.)
                    if let why = log.suffix(from: lastApplied + 1).last(where: { excused.contains($0.outcome!.code) && !$0.message.contains("apns-expiration 0") })?.outcome?.code {
                        leewayMatch.insert("\(p.device) \(why.rawValue)")
                    } else if replaced {
                        leewayMatch.insert("\(p.device) storedWhileOffline, then replaced")
                    } else {
                        guard toldConvergence.insert("match \(p.device) \(latest.jsonString)").inserted else { continue }
                    let matches = try env.world.device(p.device).activities.filter { $0.attributesType == matchType }
                        .map { "\($0.id.prefix(8)) \($0.state.rawValue) token \($0.updateToken?.prefix(6) ?? "-") \($0.contentState.jsonString)" }
                    let (_, records) = try await call(env, "GET", "/v1/activities?installationID=\(p.installation)&topic=\(topic)&limit=5")
                    let recordID = records["activities"]?.arrayValue?.first?["id"]?.stringValue ?? ""
                    let (_, detail) = try await call(env, "GET", "/v1/activities/\(recordID)?deliveries=3")
                    let pushes = (detail["deliveries"]?.arrayValue ?? []).compactMap { d -> String? in
                        guard let id = d["apnsID"]?.stringValue else { return nil }
                        let onPhone = events.filter { $0.apnsID == id }.map { "\($0.activityID?.prefix(8) ?? "-") \($0.outcome?.code.rawValue ?? "-")" }
                        return "\(id.prefix(8)) \(d["status"]?.numberValue.map { "\($0)" } ?? "?") p\(d["priority"]?.numberValue.map { "\($0)" } ?? "?") APNs \(apnsOutcome[id]?.rawValue ?? "-") phone \(onPhone)"
                    }
                    violation("convergence", "the match on \(p.device) (iOS \(p.os), \(shown.channelID == nil ? "token" : "channel")) shows \(shown.contentState.jsonString), the latest goal is \(latest.jsonString); the phone's log ends \(log.suffix(3).map { "\($0.outcome!.code.rawValue): \($0.message.prefix(140))" }); its match activities \(matches); the server's record \(recordID.prefix(12)) \(detail["state"]?.stringValue ?? "-") token \(detail["hasToken"]?.boolValue.map { "\($0)" } ?? "?"), its last pushes \(pushes)")
                    }
                }
            }
        }
        // At most one live activity per key, outside a renewal's handover.
        for p in phones {
            var live: [String: Int] = [:]
            for a in try env.world.device(p.device).activities where a.attributesType == orderType && a.state.isOngoing {
                live[a.attributes["orderNumber"]?.stringValue ?? "?", default: 0] += 1
            }
            for (number, n) in live {
                let key = "order-" + number
                if n > 1 {
                    if orders[key]?.renewed == true {
                        if handoverOpen[key] == nil { handoverOpen[key] = now }
                    } else {
                        violation("one live activity per key", "\(key) has \(n) live activities on \(p.device)")
                    }
                } else if let since = handoverOpen.removeValue(forKey: key) {
                    handovers.append(now.timeIntervalSince(since))
                }
            }
        }
    }

    func finalChecks(_ env: Env) async throws {
        // Every accepted push has its outcome: the events and the jobs' states, and what each phone did.
        var events: [JSONValue] = []
        var after = "0"
        while true {
            let (_, page) = try await call(env, "GET", "/v1/events?limit=1000&after=\(after)")
            let got = page["events"]?.arrayValue ?? []
            events += got
            guard !got.isEmpty, let n = page["next"]?.stringValue, n != after else { break }
            after = n
        }
        var ids = Set<String>()
        var perJob: [Int64: [String: Int]] = [:]
        var byType: [String: Int] = [:]
        for e in events {
            let id = e["id"]?.stringValue ?? ""
            if !ids.insert(id).inserted { violation("events exactly once", "event \(id) delivered twice") }
            let type = e["type"]?.stringValue ?? "?"
            byType[type, default: 0] += 1
            if type == "token.retired", let key = e["externalKey"]?.stringValue { tokenRetiredKeys.insert(key) }
            if let job = e["data"]?["jobID"]?.numberValue?.int64Value, type.hasPrefix("push.") {
                perJob[job, default: [:]][type, default: 0] += 1
                if type == "push.delivered", let id = e["data"]?["apnsID"]?.stringValue { apnsIDs[job] = id }
            }
        }
        var attempts: [Int64: Int64] = [:]
        for e in events where e["type"] == "push.delivered" || e["type"] == "push.failed" {
            if let job = e["data"]?["jobID"]?.numberValue?.int64Value { attempts[job] = e["data"]?["attempts"]?.numberValue?.int64Value ?? 0 }
        }
        var silent = 0
        for (job, n) in attempts where n >= 2 {
            // APNs answered it more than once: every answer before the last was one Isle retried.
            let types = perJob[job] ?? [:]
            // A dead token's wait for a rotated one is told by token.retired instead.
            if types["push.retrying"] == nil, !(accepted[job].map { tokenRetiredKeys.contains($0.key) } ?? false) {
                silent += 1
                if silent <= 5 { violation("nothing retried silently", "job \(job) (\(accepted[job].map { "\($0.kind) \($0.key)" } ?? "?")): APNs answered it \(n) times, no push.retrying event") }
            }
        }
        figures["pushes APNs answered more than once (retried, each told by push.retrying)"] = attempts.values.filter { $0 >= 2 }.count
        for (job, types) in perJob {
            if (types["push.delivered"] ?? 0) + (types["push.failed"] ?? 0) > 1 { violation("events exactly once", "job \(job) has \(types)") }
            if (types["push.retrying"] ?? 0) > 1 { violation("events exactly once", "job \(job) told retrying \(types["push.retrying"]!) times") }
        }
        // What the phones did with each apns-id.
        deviceOutcome = [:]
        var throttledHigh = 0
        var throttledBroadcasts = 0
        for p in phones {
            for e in try env.world.device(p.device).events {
                guard let id = e.apnsID, let code = e.outcome?.code else { continue }
                // The last word on a push: a deferral is followed by what happened to it.
                if code != .storedWhileOffline && code != .heldByAPNs && code != .deferredLowPriority || deviceOutcome[id] == nil { deviceOutcome[id] = code }
                if code == .throttled {
                    // A broadcast goes to every follower at one priority: a follower whose app spent
                    // its hour on pushes of its own may throttle it, which no server can prevent
                    // (docs/server.md, "The priority-10 budget"). Counted apart.
                    if let a = e.activityID, try env.world.device(p.device).activities.contains(where: { $0.id == a && $0.channelID != nil }) {
                        throttledBroadcasts += 1
                    } else {
                        throttledHigh += 1
                    }
                }
            }
        }
        var outcomes: [String: Int] = [:]
        var unaccounted: [Int64] = []
        for (job, a) in accepted.sorted(by: { $0.key < $1.key }) {
            let types = perJob[job] ?? [:]
            if types["push.failed"] != nil { outcomes["failed, with APNs' answer (push.failed)", default: 0] += 1; continue }
            if types["push.delivered"] != nil {
                let code = apnsIDs[job].flatMap(outcome(ofAPNsID:))
                let name = switch code {
                case .applied?, .started?, .ended?, .flagged?: "applied"
                case .olderTimestamp?: "superseded on the phone (an older timestamp arrived late)"
                case .lostLowPriority?: "lost at priority 5 (Apple's leeway)"
                case .expiredWhileOffline?: "missed while offline (APNs stores one push per app)"
                case .activityEnded?: "arrived after the activity ended"
                case .widgetsReloaded?, .widgetReloadDeferred?, .widgetPushPending?, .noWidgets?: "widgets: reloaded or deferred by WidgetKit's budget"
                case .throttled?: "throttled on the phone"
                case .pushToStartThrottled?, .limitReached?: "a push-to-start the phone refused (ActivityKit's limits; APNs answered 200)"
                case .storedWhileOffline?, .heldByAPNs?: "delivered (stored or held by APNs, then replaced by a later push to the app while offline)"
                case .some(let other): "delivered: \(other.rawValue)"
                case nil: a.kind.hasPrefix("topic") ? "delivered to the topic's channel" : "delivered (the phone kept no trace: stored, then replaced while offline)"
                }
                outcomes[name, default: 0] += 1
                continue
            }
            // The API lists unfinished jobs only; a finished one's state is read from the database.
            let stored = try await env.store.job(id: job)
            let state = stored?.state.rawValue ?? "unknown"
            switch state {
            case "superseded": outcomes["superseded in the queue by newer content", default: 0] += 1
            case "dropped": outcomes["dropped (the activity ended, the channel closed)", default: 0] += 1
            default:
                unaccounted.append(job)
                outcomes["unaccounted (\(state))", default: 0] += 1
                if unaccounted.count <= 3 { FileHandle.standardError.write(Data("unaccounted job \(job): \(state), \(stored?.lastError ?? "")\n".utf8)) }
            }
        }
        for job in unaccounted.prefix(10) { violation("every accepted push accounted for", "job \(job) (\(accepted[job]!.kind) \(accepted[job]!.key)) has no outcome") }
        figures["priority-10 pushes the phones throttled"] = throttledHigh
        if throttledBroadcasts > 0 { figures["priority-10 broadcasts throttled on a follower whose app had spent its hour (one priority for every follower)"] = throttledBroadcasts }
        if throttledHigh > 0 { violation("no priority-10 push throttled", "\(throttledHigh) pushes throttled on phones") }
        self.outcomes = outcomes
        self.eventCounts = byType
    }


    /// At the end of the day, before the night: the server's record of every order equals the
    /// phone's, state and content — except where the phone's log shows Apple's leeway took the push.
    func compareRecords(_ env: Env) async throws {
        try await readEvents(env)
        deviceOutcome = [:]
        for p in phones {
            for e in try env.world.device(p.device).events {
                guard let id = e.apnsID, let code = e.outcome?.code else { continue }
                if code != .storedWhileOffline && code != .heldByAPNs && code != .deferredLowPriority || deviceOutcome[id] == nil { deviceOutcome[id] = code }
            }
        }
        var compared = 0
        for key in staleKeys.sorted() {
            let (_, record) = try await call(env, "GET", "/v1/activities/by-key/\(key)?deliveries=1")
            figures["stale registrations: the server's record ends \(record["state"]?.stringValue ?? "?")", default: 0] += 1
        }
        for (key, o) in orders.sorted(by: { $0.key < $1.key }) {
            let p = phones[o.phone]
            let (status, record) = try await call(env, "GET", "/v1/activities/by-key/\(key)?deliveries=1")
            let ofKey = try env.world.device(p.device).activities.filter { $0.attributesType == orderType && $0.attributes["orderNumber"]?.stringValue == String(key.dropFirst(6)) }
            // The phone's activity the server's record is about: the one its last push reached (a
            // renewal's successor and its predecessor may have started on the phone at the same
            // moment, when it came back online), else the newest.
            let recordPush = record["deliveries"]?.arrayValue?.last?["apnsID"]?.stringValue
            let reached = try recordPush.flatMap { id in try env.world.device(p.device).events.last { $0.apnsID == id && $0.activityID != nil }?.activityID }
            let onPhone = ofKey.first { $0.id == reached } ?? ofKey.max { $0.startedAt < $1.startedAt }
            // What the phone did with the last push of this order that APNs accepted: Apple's
            // leeway, which no server can see, when it never reached the activity.
            let lastPush = accepted.filter { $0.value.key == key }.keys.sorted().last { apnsIDs[$0] != nil }
            let lastOutcome = lastPush.flatMap { apnsIDs[$0] }.flatMap(outcome(ofAPNsID:))
            // …and ActivityKit refusing a push-to-start APNs answered 200 (the app's live activities
            // at their limit, too many starts in a short time): the server cannot see that either.
            let leeway: Set<PushOutcome.Code> = [.lostLowPriority, .storedWhileOffline, .heldByAPNs, .expiredWhileOffline, .pushToStartThrottled, .limitReached]
            guard status == 200 else {
                if onPhone != nil { violation("records equal", "\(key): on the phone, unknown to the server (\(status))") }
                continue
            }
            guard let onPhone else {
                // Never on the phone: what became of its start decides.
                let start = accepted.filter { $0.value.key == key && $0.value.kind == "start" }.keys.sorted().last
                let startOutcome = start.flatMap { apnsIDs[$0] }.flatMap(outcome(ofAPNsID:))
                if let code = startOutcome ?? lastOutcome, leeway.contains(code) {
                    figures["orders whose record differs by Apple's leeway (\(code.rawValue))", default: 0] += 1
                } else if let start, let why = failedReasons[start], !(record["state"] == "active" || record["state"] == "starting") {
                    // The start failed and the backend was told (push.failed with why); the server's
                    // record is not live, and the phone has none: they agree.
                    figures["orders whose push-to-start failed, told by push.failed (\(why.prefix(60))…)", default: 0] += 1
                } else {
                    var trail: [String] = []
                    for job in accepted.filter({ $0.value.key == key }).keys.sorted() {
                        let id = apnsIDs[job]
                        var on: [String] = []
                        if let id { for q in phones where (try? env.world.device(q.device).events.contains { $0.apnsID == id }) == true { on.append(q.device) } }
                        trail.append("job \(job) \(accepted[job]!.kind) \(jobEvents[job] ?? []) \(failedReasons[job].map { "failed: \($0)" } ?? "") apns-id \(id?.prefix(8) ?? "-") APNs \(id.flatMap { apnsOutcome[$0]?.rawValue } ?? "-") phones \(on)")
                    }
                    violation("records equal", "\(key) of \(p.device) (installation \(p.installation.prefix(8)), by push \(o.byPush)): on the server (\(record["state"]?.stringValue ?? "?"): \(record["stateReason"]?.stringValue ?? ""), \(record["installationID"]?.stringValue?.prefix(8) ?? "-")), never on the phone; \(trail)")
                }
                continue
            }
            compared += 1
            let serverLive = record["state"] == "active" || record["state"] == "starting"
            var differs: String?
            if serverLive != onPhone.state.isOngoing {
                differs = "the server says \(record["state"]?.stringValue ?? "?"), the phone \(onPhone.state.rawValue)"
            } else if serverLive, record["contentState"] != onPhone.contentState {
                differs = "the server's content \(record["contentState"]?.jsonString ?? "null"), the phone's \(onPhone.contentState.jsonString)"
            }
            guard let differs else { continue }
            if let code = lastOutcome, leeway.contains(code) {
                figures["orders whose record differs by Apple's leeway (\(code.rawValue))", default: 0] += 1
            } else if record["state"] == "starting", record["hasToken"] != .bool(true), !onPhone.state.isOngoing {
                // The server's newest record of the key is a push-to-start (a renewal's successor)
                // the phone never confirmed: APNs took it, and it never started (stored while the
                // phone was offline and replaced, or refused by ActivityKit). The record says just
                // that — `starting`, waiting for a token (push.waiting tells pushes held for it).
                figures["orders whose newest push-to-start the phone never confirmed (the record waits, starting)", default: 0] += 1
            } else {
                let log = try env.world.device(p.device).events.filter { $0.activityID == onPhone.id }.suffix(4).map { "\($0.outcome?.code.rawValue ?? "-"): \($0.message.prefix(120))" }
                let id = lastPush.flatMap { apnsIDs[$0] } ?? ""
                let seen = env.sim.apns.requestLog.filter { $0.apnsID == id }.map { "\($0.path.prefix(20)) \($0.status) \($0.outcome?.code.rawValue ?? "-"): \($0.outcome?.sentence.prefix(200) ?? "")" }
                // The server record's own last push (a renewal's successor's start, say): what APNs and the phone did with it.
                let recordSeen = env.sim.apns.requestLog.filter { $0.apnsID == recordPush }.map { "\($0.path.prefix(20)) \($0.status) \($0.outcome?.code.rawValue ?? "-"): \($0.outcome?.sentence.prefix(200) ?? "")" }
                let recordOnPhone = try env.world.device(p.device).events.filter { $0.apnsID == recordPush }.map { "\($0.outcome?.code.rawValue ?? "-"): \($0.message.prefix(160))" }
                violation("records equal", "\(key): \(differs); the phone's last word on its last push: \(lastOutcome?.rawValue ?? "none"); APNs' log of it: \(seen); its log ends: \(log); the server's record \(record["id"]?.stringValue ?? "-") (\(record["state"]?.stringValue ?? "-"), started \(record["startedAt"]?.numberValue.map { "\($0)" } ?? "-"); on the phone \(onPhone.id.prefix(8)) started \(onPhone.startedAt.timeIntervalSince1970)): its last push \(recordPush?.prefix(8) ?? "-") at APNs \(recordSeen), on the phone \(recordOnPhone)")
            }
        }
        figures["orders compared at the end (server record = phone)"] = compared
    }

    var tokenRetiredKeys = Set<String>()
    var deviceOutcome: [String: PushOutcome.Code] = [:]
    var apnsIDs: [Int64: String] = [:]
    var outcomes: [String: Int] = [:]
    var eventCounts: [String: Int] = [:]

    func summary(seconds: Double) -> String {
        var lines: [String] = []
        let os = Dictionary(grouping: phones, by: { $0.os.split(separator: ".")[0] }).mapValues(\.count)
        lines.append("A day in the life: \(phones.count) phones (iOS \(os.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }.joined(separator: ", "))), \(Int(options.hours)) virtual hours in \(Int(seconds)) s, seed \(options.seed), isle sim \(options.realistic ? "--realistic" : "defaults (its leeway on)"), budget per \(options.budgetPer)")
        lines.append("orders: \(orders.count) (\(phones.filter(\.busy).count) busy phones: a shop's, many orders with frequent alerts); pushes accepted: \(accepted.count); convergence checks: \(convergenceChecks)")
        for (k, v) in figures.sorted(by: { $0.key < $1.key }) { lines.append("  \(k): \(v)") }
        lines.append("every accepted push, by outcome:")
        for (k, v) in outcomes.sorted(by: { $0.value > $1.value }) { lines.append("  \(k): \(v)") }
        lines.append("events: " + eventCounts.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))
        if !handovers.isEmpty {
            lines.append(String(format: "renewal handovers: %d, two live activities for at most %.0f virtual s (median %.0f)", handovers.count, handovers.max() ?? 0, handovers.sorted()[handovers.count / 2]))
        } else {
            lines.append("renewal handovers: none seen (two live activities never overlapped at a check)")
        }
        if !leewayOrders.isEmpty { lines.append("orders whose last priority-10 update the phone never got by Apple's leeway (APNs stores one push per app for an offline phone, and may keep an older one): \(leewayOrders.count)") }
        if !leewayMatch.isEmpty { lines.append("match followers that missed a goal by Apple's leeway (the phone's log says so): \(Set(leewayMatch.map { $0.split(separator: " ")[0] }).count)") }
        lines.append("promises broken: " + (violationCounts.isEmpty ? "none" : violationCounts.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")))
        return lines.joined(separator: "\n")
    }
}
