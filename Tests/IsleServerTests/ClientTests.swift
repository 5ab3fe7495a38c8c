import Foundation
import IsleAPNs
import IsleClient
import IsleClientSimulator
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleDelivery
import IsleTesting
import Testing

/// IsleClient end to end (docs/client.md): the app (IsleClient + SimulatedActivityKit) ↔ `isle serve` ↔
/// fake APNs ↔ simulated iPhone, with no hand-written HTTP on the app side.
@Suite("IsleClient end to end")
struct ClientTests {
    struct PizzaAttributes: Codable, Sendable {
        var numberOfPizzas: Int
        var totalAmount: String
        var orderNumber: String
    }
    struct PizzaState: Codable, Sendable, Equatable {
        var driverName: String
        var deliveryTimer: ClosedRange<Date>
    }
    typealias Kit = SimulatedActivityKit<PizzaAttributes, PizzaState>

    static let attributes = PizzaAttributes(numberOfPizzas: 3, totalAmount: "$42.00", orderNumber: "12345")
    static let state = PizzaState(driverName: "Bill James", deliveryTimer: Pizza.t0...Pizza.t0.addingTimeInterval(1500))

    static func client(_ f: ServerFixture, storage: String, port: Int? = nil, environment: IsleClient.Environment? = nil) async throws -> IsleClient {
        let resolved: Int
        if let port { resolved = port } else { resolved = await f.server.port }
        var c = IsleClient.Configuration(serverURL: URL(string: "http://127.0.0.1:\(resolved)")!, deviceKey: f.deviceKey, environment: environment)
        c.firstRetry = 0.05
        c.maximumRetry = 0.5
        c.requestTimeout = 5
        return try IsleClient(configuration: c, storage: ConformingStorage(path: storage))
    }

    /// The backend's registration ticket for each order (what it hands the app with the order).
    static func tickets(_ f: ServerFixture) -> @Sendable (SimulatedLiveActivities<PizzaAttributes, PizzaState>.Handle) -> String? {
        { h in h.attributes.map { f.ticket(key: "order-" + $0.orderNumber, ttl: 86_400) } }
    }

    /// The app: the simulated phone's ActivityKit, an IsleClient sending and tracking it.
    static func app(_ f: ServerFixture, world: SimulatorWorld? = nil, device: String? = nil, environment: IsleClient.Environment? = nil) async throws -> (Kit, IsleClient, Task<Void, Never>) {
        let kit = Kit(world: world ?? f.sim.world, deviceID: device ?? f.device, bundleID: Pizza.bundleID, attributesType: "PizzaDeliveryAttributes")
        let client = try await client(f, storage: storagePath(), environment: environment)
        let runner = Task { await client.run() }
        await client.track(SimulatedLiveActivities(kit), externalKey: { $0.attributes.map { "order-" + $0.orderNumber } }, ticket: Self.tickets(f))
        return (kit, client, runner)
    }

    /// A fixture whose server, stopped with `kill()`, comes back on the port it first had (0 until
    /// then: any free one), so an app's configured URL stays right across the outage.
    static func withRestartableServer(_ body: (ServerFixture, Int) async throws -> Void) async throws {
        let chosen = Locked(0)
        try await ServerFixture.with(server: { c in c.port = chosen.withLock { $0 } }) { f in
            let port = await f.server.port
            chosen.withLock { $0 = port }
            try await body(f, port)
        }
    }

    static func storagePath() -> String { FileManager.default.temporaryDirectory.appendingPathComponent("isle-client-\(UUID().uuidString).json").path }

    func serverActivity(_ f: ServerFixture, _ id: String) async throws -> ActivityRecord? { try await SQLiteStore(path: f.databasePath).activity(id: id) }

    @Test("the app starts an activity and the backend's by-key update reaches the phone; a rotation is used, a dismissal stops pushes")
    func lifecycle() async throws {
        try await ServerFixture.with { f in
            let (kit, client, runner) = try await Self.app(f)
            let activity = try kit.request(attributes: Self.attributes, content: Self.state)
            try await eventually("the activity registered") { await client.serverID(of: activity.id) != nil }
            let id = try #require(await client.serverID(of: activity.id))
            #expect(try await serverActivity(f, id)?.updateToken == activity.pushToken?.map { String(format: "%02x", $0) }.joined())
            // The backend, by its own key.
            #expect(try await f.call("POST", "/v1/activities/by-key/order-12345/update", key: f.backendKey, body: ["contentState": Pizza.state("Anne Johnson")]).status == 202)
            try await f.waitForDevice("Anne") { d in d.activities.first { $0.id == activity.id }?.contentState["driverName"] == "Anne Johnson" }
            // ActivityKit rotates the token: the server gets it and uses only the new one.
            let rotated = try f.sim.world.rotateUpdateToken(activityID: activity.id, on: f.device)
            try await eventually("the rotation reported") { try await serverActivity(f, id)?.updateToken == rotated }
            #expect(try await f.call("POST", "/v1/activities/by-key/order-12345/update", key: f.backendKey, body: ["contentState": Pizza.state("Carol")]).status == 202)
            try await f.waitForDevice("Carol") { d in d.activities.first { $0.id == activity.id }?.contentState["driverName"] == "Carol" }
            // The person dismisses it: the server hears it and sends nothing more.
            try f.sim.world.userDismiss(activityID: activity.id, on: f.device)
            try await eventually("the dismissal reported") { try await serverActivity(f, id)?.state == .dismissed }
            #expect(try await f.call("POST", "/v1/activities/by-key/order-12345/update", key: f.backendKey, body: ["contentState": Pizza.state("Late")]).status == 409)
            #expect(await client.refusedReports.isEmpty)
            await client.stop()
            runner.cancel()
        }
    }

    @Test("a push-to-start token rotation reaches the server; a backend start works on the new token and the started activity is linked, not duplicated")
    func pushToStartRotation() async throws {
        try await ServerFixture.with { f in
            let (kit, client, runner) = try await Self.app(f)
            let installation = await client.installationID
            let store = try SQLiteStore(path: f.databasePath)
            let first = try #require(kit.pushToStartToken).map { String(format: "%02x", $0) }.joined()
            try await eventually("the push-to-start token reported") { try await store.installation(bundleID: Pizza.bundleID, id: installation)?.pushToStartTokens["PizzaDeliveryAttributes"] == first }
            let rotated = try f.sim.world.rotatePushToStartToken(bundleID: Pizza.bundleID, attributesType: "PizzaDeliveryAttributes", on: f.device)
            try await eventually("the rotation reported") { try await store.installation(bundleID: Pizza.bundleID, id: installation)?.pushToStartTokens["PizzaDeliveryAttributes"] == rotated }
            // The backend starts an order on this installation: it goes to the new token.
            let started = try await f.call("POST", "/v1/installations/\(installation)/start", key: f.backendKey, body: [
                "attributesType": "PizzaDeliveryAttributes", "externalKey": "order-777", "attributes": ["numberOfPizzas": 1, "totalAmount": "$9.00", "orderNumber": "777"],
                "contentState": Pizza.state("Bill James"), "alert": ["title": "Order 777", "body": "In the oven"],
            ])
            #expect(started.status == 202, "\(started.json.jsonString)")
            try await f.waitForDevice("the push-started activity") { d in d.activities.contains { $0.startedBy == .push } }
            let onPhone = try #require(try f.sim.world.device(f.device).activities.first { $0.startedBy == .push })
            // IsleClient sees it on activityUpdates and hands its token back: the server links the
            // `starting` record by key and installation, it does not register a second activity.
            try await eventually("the push-started activity linked") { await client.serverID(of: onPhone.id) != nil }
            let linked = try #require(await client.serverID(of: onPhone.id))
            let record = try #require(try await store.activity(id: linked))
            #expect(record.externalKey == "order-777" && record.state == .active && record.installationID == installation)
            #expect(try await store.liveActivities(bundleID: Pizza.bundleID, externalKey: "order-777").count == 1)
            #expect(await client.refusedReports.isEmpty)
            await client.stop()
            runner.cancel()
        }
    }

    @Test("one activity tracked on its own: registered under its key, its rotation used")
    func oneActivity() async throws {
        try await ServerFixture.with { f in
            let kit = Kit(world: f.sim.world, deviceID: f.device, bundleID: Pizza.bundleID, attributesType: "PizzaDeliveryAttributes")
            let client = try await Self.client(f, storage: Self.storagePath())
            let runner = Task { await client.run() }
            let activity = try kit.request(attributes: Self.attributes, content: Self.state)
            await client.track(activity: SimulatedLiveActivities(kit).handle(activity), externalKey: "order-solo",
                                 ticket: f.ticket(key: "order-solo", ttl: 86_400))
            try await eventually("the activity registered") { await client.serverID(of: activity.id) != nil }
            let rotated = try f.sim.world.rotateUpdateToken(activityID: activity.id, on: f.device)
            let id = try #require(await client.serverID(of: activity.id))
            try await eventually("the rotation reported") { try await serverActivity(f, id)?.updateToken == rotated }
            #expect(try await f.call("POST", "/v1/activities/by-key/order-solo/update", key: f.backendKey, body: ["contentState": Pizza.state("Solo")]).status == 202)
            try await f.waitForDevice("the update") { d in d.activities.first { $0.id == activity.id }?.contentState["driverName"] == "Solo" }
            await client.stop()
            runner.cancel()
        }
    }

    /// ActivityKit after a relaunch that lists none of the app's activities.
    struct NothingListed: LiveActivityKit {
        struct Handle: LiveActivityHandle {
            var id: String
            var attributesType: String { "PizzaDeliveryAttributes" }
            var pushToken: Data? { nil }
            var pushTokenUpdates: AsyncStream<Data> { AsyncStream { $0.finish() } }
            var activityState: LiveActivityState { .dismissed }
            var activityStateUpdates: AsyncStream<LiveActivityState> { AsyncStream { $0.finish() } }
        }
        var attributesType: String
        var activities: [Handle] { [] }
        var activityUpdates: AsyncStream<Handle> { AsyncStream { $0.finish() } }
        var pushToStartToken: Data? { nil }
        var pushToStartTokenUpdates: AsyncStream<Data> { AsyncStream { $0.finish() } }
        var areActivitiesEnabled: Bool { true }
        var activityEnablementUpdates: AsyncStream<Bool> { AsyncStream { $0.finish() } }
        var frequentPushesEnabled: Bool { false }
        var frequentPushEnablementUpdates: AsyncStream<Bool> { AsyncStream { $0.finish() } }
    }

    @Test("an activity dismissed while the app was not running (ActivityKit no longer lists it) is reported dismissed at the next launch, once")
    func dismissedWhileNotRunning() async throws {
        try await ServerFixture.with { f in
            let kit = Kit(world: f.sim.world, deviceID: f.device, bundleID: Pizza.bundleID, attributesType: "PizzaDeliveryAttributes")
            let storage = Self.storagePath()
            let first = try await Self.client(f, storage: storage)
            let runner = Task { await first.run() }
            await first.track(SimulatedLiveActivities(kit), externalKey: { $0.attributes.map { "order-" + $0.orderNumber } }, ticket: Self.tickets(f))
            let activity = try kit.request(attributes: Self.attributes, content: Self.state)
            try await eventually("the activity registered") { await first.serverID(of: activity.id) != nil }
            let id = try #require(await first.serverID(of: activity.id))
            await first.stop()
            runner.cancel()
            // Relaunched: the activity is gone from ActivityKit's list.
            let second = try await Self.client(f, storage: storage)
            let again = Task { await second.run() }
            await second.track(NothingListed(attributesType: "PizzaDeliveryAttributes")) { _ in nil }
            try await eventually("the dismissal reported") { try await serverActivity(f, id)?.state == .dismissed }
            try await eventually("nothing left to send") { await second.pendingReports == 0 }
            await second.stop()
            again.cancel()
            // A third launch has nothing more to say about it.
            let third = try await Self.client(f, storage: storage)
            await third.track(NothingListed(attributesType: "PizzaDeliveryAttributes")) { _ in nil }
            #expect(await third.pendingReports == 0)
            await third.stop()
        }
    }

    @Test("seeded random: starts, rotations, dismissals, server outages, 503s and app relaunches interleave; once all is sent the server is in step with the phone")
    func randomizedConvergence() async throws {
        let seed = ProcessInfo.processInfo.environment["ISLE_SEED"].flatMap(UInt64.init) ?? 20_261_123
        var random = SeededRandom(seed: seed)
        try await Self.withRestartableServer { f, port in
            // The server's store has failpoints (f.faults): its registry writes can be made to fail
            // (the API answers 503 with Retry-After, as when the database is away).
            let kit = Kit(world: f.sim.world, deviceID: f.device, bundleID: Pizza.bundleID, attributesType: "PizzaDeliveryAttributes")
            let storage = Self.storagePath()
            func launch() async throws -> (IsleClient, Task<Void, Never>) {
                let client = try await Self.client(f, storage: storage, port: port)
                let runner = Task { await client.run() }
                await client.track(SimulatedLiveActivities(kit), externalKey: { $0.attributes.map { "order-" + $0.orderNumber } }, ticket: Self.tickets(f))
                return (client, runner)
            }
            var (client, runner) = try await launch()
            var serverUp = true
            var log: [String] = []
            for step in 0..<40 {
                let live = kit.activities.filter { $0.activityState == .active }
                let ongoing = kit.activities.filter { $0.activityState != .dismissed }.count
                switch random.next() % 7 {
                case 0 where ongoing < 4, 1 where ongoing < 4:
                    let a = try kit.request(attributes: PizzaAttributes(numberOfPizzas: 1, totalAmount: "$9.00", orderNumber: "r\(step)"), content: Self.state)
                    log.append("start \(a.id)")
                case 1 where !live.isEmpty:
                    let a = live[Int(random.next() % UInt64(live.count))]
                    if a.pushToken != nil {
                        _ = try f.sim.world.rotateUpdateToken(activityID: a.id, on: f.device)
                        log.append("rotate \(a.id)")
                    }
                case 2 where !live.isEmpty:
                    let a = live[Int(random.next() % UInt64(live.count))]
                    try f.sim.world.userDismiss(activityID: a.id, on: f.device)
                    log.append("dismiss \(a.id)")
                case 3:
                    if serverUp { await f.stop() } else { try await f.start() }
                    serverUp.toggle()
                    log.append(serverUp ? "server up" : "server down")
                case 5:
                    // 503s: nothing written, or written and the answer lost.
                    let n = Int(1 + random.next() % 3)
                    let kind: StoreFaults.Point = random.next() % 2 == 0 ? .registry : .registryAfterCommit
                    f.faults.arm(kind, times: n)
                    log.append("\(n) \(kind) failures")
                case 4:
                    await client.stop()
                    runner.cancel()
                    (client, runner) = try await launch()
                    log.append("relaunch")
                default:
                    // Let what is queued go (or fail) before the next change.
                    _ = await client.flush()
                    log.append("flush")
                }
            }
            if !serverUp { try await f.start() }
            let last = client
            try await eventually(within: .seconds(60), "everything sent") { await last.pendingReports == 0 }
            let installation = await client.installationID
            let records = try await SQLiteStore(path: f.databasePath).recentActivities(bundleID: Pizza.bundleID, state: nil, limit: 500).filter { $0.installationID == installation }
            let onPhone = try f.sim.world.device(f.device).activities.filter { $0.bundleID == Pizza.bundleID && $0.updateToken != nil }
            let context = "seed \(seed) (ISLE_SEED=\(seed) replays it): \(log.joined(separator: ", "))"
            // One server record per activity that ever had a token, none for anything else.
            #expect(records.count == onPhone.count, "\(records.count) records for \(onPhone.count) activities; \(context)")
            for d in onPhone {
                let id = await client.serverID(of: d.id)
                let r = records.first { $0.id == id }
                #expect(r != nil, "\(d.id) not registered; \(context)")
                guard let r else { continue }
                #expect(records.filter { $0.externalKey == r.externalKey }.count == 1, "\(d.id) registered twice; \(context)")
                if d.state == .dismissed {
                    #expect(r.state == .dismissed, "\(d.id) dismissed on the phone, \(r.state) on the server; \(context)")
                } else {
                    #expect(r.state == .active && r.updateToken == d.updateToken, "\(d.id): server \(r.state) with another token; \(context)")
                }
            }
            let refused = await client.refusedReports
            #expect(refused.isEmpty, "\(refused); \(context)")
            await client.stop()
            runner.cancel()
        }
    }

    @Test("a sandbox (debug) and a production (TestFlight) installation of one app are served side by side, each push on its own APNs host")
    func sandboxAndProductionSideBySide() async throws {
        // Two fake APNs, one per environment, like Apple's two hosts: a token is known only to
        // its own (the other answers 400 BadDeviceToken), so a push sent to the wrong host would
        // never reach its phone.
        var productionConfiguration = IsleSim.Configuration()
        productionConfiguration.device = ServerFixture.device
        productionConfiguration.environment = .production
        productionConfiguration.singleHost = true
        try await IsleSim.withRunning(configuration: productionConfiguration, clock: ManualWallClock(Pizza.t0)) { production in
            let target = APNsEnvironment.custom(url: production.apnsURL, trustRootsPEM: production.caCertificatePEM)
            // The server's default stays sandbox: the production installation must say so itself.
            try await ServerFixture.with(server: { c in c.apnsTargets[.production] = target }) { f in
                let key = try #require(f.sim.apns.registeredKeys.first)
                try production.apns.register(key)
                let phone = production.world.createDevice(name: "Tester's iPhone")
                try production.world.install(.init(bundleID: Pizza.bundleID, environment: .production, schemas: [Pizza.schema]), on: phone)

                let (debugKit, debugClient, debugRunner) = try await Self.app(f, environment: .sandbox)
                let (storeKit, storeClient, storeRunner) = try await Self.app(f, world: production.world, device: phone, environment: .production)
                let store = try SQLiteStore(path: f.databasePath)
                let debugInstallation = await debugClient.installationID, storeInstallation = await storeClient.installationID
                try await eventually("both installations registered") {
                    let debug = try await store.installation(bundleID: Pizza.bundleID, id: debugInstallation), tester = try await store.installation(bundleID: Pizza.bundleID, id: storeInstallation)
                    return debug?.environment == .sandbox && tester?.environment == .production
                }

                // Each starts an order; the backend updates both by key.
                let debugActivity = try debugKit.request(attributes: PizzaAttributes(numberOfPizzas: 1, totalAmount: "$9.00", orderNumber: "dev"), content: Self.state)
                let storeActivity = try storeKit.request(attributes: PizzaAttributes(numberOfPizzas: 2, totalAmount: "$18.00", orderNumber: "prod"), content: Self.state)
                try await eventually("both activities registered") {
                    let debug = await debugClient.serverID(of: debugActivity.id), tester = await storeClient.serverID(of: storeActivity.id)
                    return debug != nil && tester != nil
                }
                let debugID = try #require(await debugClient.serverID(of: debugActivity.id))
                let storeID = try #require(await storeClient.serverID(of: storeActivity.id))
                let debugRecord = try #require(try await store.activity(id: debugID))
                let storeRecord = try #require(try await store.activity(id: storeID))
                #expect(debugRecord.environment == .sandbox && storeRecord.environment == .production)
                let debugView = try await f.call("GET", "/v1/activities/\(debugRecord.id)", key: f.backendKey)
                #expect(debugView.json["environment"]?.stringValue == "sandbox")
                for order in ["dev", "prod"] {
                    let r = try await f.call("POST", "/v1/activities/by-key/order-\(order)/update", key: f.backendKey, body: ["contentState": Pizza.state("Driver \(order)")])
                    #expect(r.status == 202, "\(r.json.jsonString)")
                }
                try await f.waitForDevice("the debug phone's update") { d in d.activities.first { $0.id == debugActivity.id }?.contentState["driverName"] == "Driver dev" }
                try await withDeadline(.seconds(20), "the TestFlight phone's update") {
                    let changes = production.world.changes.subscribe()
                    func arrived() throws -> Bool { try production.world.device(phone).activities.first { $0.id == storeActivity.id }?.contentState["driverName"] == "Driver prod" }
                    if try arrived() { return }
                    for await _ in changes where try arrived() { return }
                }
                // Each host saw only its own environment's tokens, and answered every push 200 (the
                // log shows a token's last 6 hex digits).
                @Sendable func tail(_ token: String?) -> String { "…" + String((token ?? "-").suffix(6)) }
                // The request log is written once the answer is sent, which may be just after the phone shows the push.
                try await eventually("both hosts logged their push") {
                    f.sim.apns.requestLog.contains { $0.path.hasSuffix(tail(debugRecord.updateToken)) } && production.apns.requestLog.contains { $0.path.hasSuffix(tail(storeRecord.updateToken)) }
                }
                let sandboxPushes = f.sim.apns.requestLog.filter { $0.path.hasPrefix("/3/device/") }
                let productionPushes = production.apns.requestLog.filter { $0.path.hasPrefix("/3/device/") }
                #expect(sandboxPushes.contains { $0.path.hasSuffix(tail(debugRecord.updateToken)) } && !sandboxPushes.contains { $0.path.hasSuffix(tail(storeRecord.updateToken)) })
                #expect(productionPushes.contains { $0.path.hasSuffix(tail(storeRecord.updateToken)) } && !productionPushes.contains { $0.path.hasSuffix(tail(debugRecord.updateToken)) })
                #expect((sandboxPushes + productionPushes).allSatisfy { $0.status == 200 }, "\((sandboxPushes + productionPushes).map { "\($0.status) \($0.reason ?? "")" })")

                // A push-to-start to the production installation goes to the production host too.
                try await eventually("the production push-to-start token reported") { try await store.installation(bundleID: Pizza.bundleID, id: storeInstallation)?.pushToStartTokens.isEmpty == false }
                let started = try await f.call("POST", "/v1/installations/\(storeInstallation)/start", key: f.backendKey, body: [
                    "attributesType": "PizzaDeliveryAttributes", "externalKey": "order-tf", "attributes": ["numberOfPizzas": 1, "totalAmount": "$9.00", "orderNumber": "tf"],
                    "contentState": Pizza.state("Bill James"), "alert": ["title": "Order tf", "body": "In the oven"],
                ])
                #expect(started.status == 202, "\(started.json.jsonString)")
                try await withDeadline(.seconds(20), "the push-started activity on the TestFlight phone") {
                    let changes = production.world.changes.subscribe()
                    if try production.world.device(phone).activities.contains(where: { $0.startedBy == .push }) { return }
                    for await _ in changes where try production.world.device(phone).activities.contains(where: { $0.startedBy == .push }) { return }
                }
                // A broadcast channel lives in one environment: created where it was asked for.
                let channel = try await f.call("POST", "/v1/channels", key: f.backendKey, body: ["storagePolicy": 0, "environment": "production"])
                #expect(channel.status == 201 && channel.json["environment"]?.stringValue == "production", "\(channel.json.jsonString)")
                #expect(production.apns.requestLog.contains { $0.method == "POST" && $0.path.contains("/channels") && $0.status == 201 })
                #expect(!f.sim.apns.requestLog.contains { $0.method == "POST" && $0.path.contains("/channels") })
                let refused = await debugClient.refusedReports + storeClient.refusedReports
                #expect(refused.isEmpty, "\(refused)")
                for c in [debugClient, storeClient] { await c.stop() }
                debugRunner.cancel()
                storeRunner.cancel()
            }
        }
    }

    @Test("the server is down and the app restarts with reports unsent: they are sent once it is back, in order, the latest token winning")
    func outageAndRestart() async throws {
        try await Self.withRestartableServer { f, port in
            let kit = Kit(world: f.sim.world, deviceID: f.device, bundleID: Pizza.bundleID, attributesType: "PizzaDeliveryAttributes")
            let storage = Self.storagePath()
            let first = try await Self.client(f, storage: storage, port: port)
            let runner = Task { await first.run() }
            await first.track(SimulatedLiveActivities(kit), externalKey: { $0.attributes.map { "order-" + $0.orderNumber } }, ticket: Self.tickets(f))
            try await eventually("the installation registered") { await first.pendingReports == 0 }
            await f.kill()
            // While the server is away: an activity, two rotations, then the person dismisses it.
            let activity = try kit.request(attributes: Self.attributes, content: Self.state)
            _ = try await f.sim.world.waitForPushToken(activityID: activity.id, on: f.device)
            _ = try f.sim.world.rotateUpdateToken(activityID: activity.id, on: f.device)
            let last = try f.sim.world.rotateUpdateToken(activityID: activity.id, on: f.device)
            try await eventually("the rotations queued") { await first.pendingReports >= 1 }
            try f.sim.world.userDismiss(activityID: activity.id, on: f.device)
            try await eventually("the dismissal queued") { await first.pendingReports >= 2 }
            // The app is killed with its reports unsent, and launched again.
            await first.stop()
            runner.cancel()
            let second = try await Self.client(f, storage: storage, port: port)
            #expect(await second.pendingReports >= 2)
            try await f.start()
            let again = Task { await second.run() }
            try await eventually("everything sent") { await second.pendingReports == 0 }
            let id = try #require(await second.serverID(of: activity.id))
            let record = try #require(try await serverActivity(f, id))
            #expect(record.updateToken == last, "the newest token, not a stale one")
            #expect(record.state == .dismissed)
            let refused = await second.refusedReports
            #expect(refused.isEmpty, "\(refused)")
            await second.stop()
            again.cancel()
        }
    }
}

@Suite("IsleClient environment")
struct ClientEnvironmentTests {
    /// A provisioning profile as Xcode embeds it: a signed envelope (binary) around an XML plist.
    static func profile(_ entitlements: String) -> Data {
        var d = Data([0x30, 0x82, 0x3c, 0x3f, 0x00, 0x06, 0x09, 0x2a])
        d.append(Data("""
            <?xml version="1.0" encoding="UTF-8"?>
            <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
            <plist version="1.0"><dict><key>AppIDName</key><string>Pizza</string>
            <key>Entitlements</key><dict>\(entitlements)<key>get-task-allow</key><true/></dict></dict></plist>
            """.utf8))
        d.append(Data([0xa0, 0x82, 0x0b, 0x00, 0x3c, 0x2f]))
        return d
    }

    @Test("the environment is read from the build's provisioning profile: development is the sandbox; no entitlement, no answer")
    func provisioningProfile() {
        #expect(IsleClient.Environment.fromProvisioningProfile(Self.profile("<key>aps-environment</key><string>development</string>")) == .sandbox)
        #expect(IsleClient.Environment.fromProvisioningProfile(Self.profile("<key>aps-environment</key><string>production</string>")) == .production)
        #expect(IsleClient.Environment.fromProvisioningProfile(Self.profile("<key>com.apple.developer.aps-environment</key><string>production</string>")) == .production)
        #expect(IsleClient.Environment.fromProvisioningProfile(Self.profile("")) == nil)
        #expect(IsleClient.Environment.fromProvisioningProfile(Data("not a profile".utf8)) == nil)
        #expect(IsleClient.Environment.fromProvisioningProfile(Data()) == nil)
        // Linux has no app bundle: the server's default applies.
        #expect(IsleClient.Environment.ofRunningBuild() == nil)
    }
}

@Suite("IsleClient storage")
struct ClientStorageTests {
    @Test("a file storage makes its directory on the first save, and reads back what it saved")
    func fileStorageMakesItsDirectory() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("isle-client-\(UUID().uuidString)/nested")
        let storage = FileStorage(path: dir.appendingPathComponent("state.json").path)
        #expect(try storage.load() == nil)
        try storage.save(Data("{}".utf8))
        #expect(try storage.load() == Data("{}".utf8))
    }

    @Test("state saved by an earlier SDK (fewer fields) still loads: the installation, its secret and the unsent reports survive an app update")
    func earlierStateLoads() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("isle-client-\(UUID().uuidString).json").path
        // What the first version wrote: no lastTokens.
        let earlier = """
            {"installationID":"inst-old","secret":"isle_inst_x","pushToStartTokens":{},"serverIDs":{"a1":"act_1"},"registered":["a1"],
             "outbox":[{"key":"k1","lane":"activity:a1","kind":{"state":{"local":"a1","report":"dismissed"}},"attempts":1,"notBefore":0}],"refused":[]}
            """
        try Data(earlier.utf8).write(to: URL(fileURLWithPath: path))
        let client = try IsleClient(configuration: .init(serverURL: URL(string: "http://127.0.0.1:1")!, deviceKey: "k", environment: nil), storage: FileStorage(path: path))
        #expect(await client.installationID == "inst-old")
        #expect(await client.pendingReports == 1)
        #expect(await client.serverID(of: "a1") == "act_1")
    }
}
