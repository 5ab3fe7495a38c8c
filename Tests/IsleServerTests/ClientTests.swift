import Foundation
import IsleClient
import IsleClientSimulator
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleTesting
import Testing

/// IsleClient end to end (issue 14): the app (IsleClient + SimulatedActivityKit) ↔ `isle serve` ↔
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

    static func client(_ f: ServerFixture, storage: String, port: Int? = nil) async throws -> IsleClient {
        let resolved: Int
        if let port { resolved = port } else { resolved = await f.server.port }
        var c = IsleClient.Configuration(serverURL: URL(string: "http://127.0.0.1:\(resolved)")!, deviceKey: f.deviceKey)
        c.firstRetry = 0.05
        c.maximumRetry = 0.5
        c.requestTimeout = 5
        return try IsleClient(configuration: c, storage: FileStorage(path: storage))
    }

    /// The app: the simulated phone's ActivityKit, an IsleClient sending and tracking it.
    static func app(_ f: ServerFixture) async throws -> (Kit, IsleClient, Task<Void, Never>) {
        let kit = Kit(world: f.sim.world, deviceID: f.device, bundleID: Pizza.bundleID, attributesType: "PizzaDeliveryAttributes")
        let client = try await client(f, storage: storagePath())
        let runner = Task { await client.run() }
        await client.track(SimulatedLiveActivities(kit)) { $0.attributes.map { "order-" + $0.orderNumber } }
        return (kit, client, runner)
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
            try await eventually("the push-to-start token reported") { try await store.installation(id: installation)?.pushToStartTokens["PizzaDeliveryAttributes"] == first }
            let rotated = try f.sim.world.rotatePushToStartToken(bundleID: Pizza.bundleID, attributesType: "PizzaDeliveryAttributes", on: f.device)
            try await eventually("the rotation reported") { try await store.installation(id: installation)?.pushToStartTokens["PizzaDeliveryAttributes"] == rotated }
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

    @Test("the server is down and the app restarts with reports unsent: they are sent once it is back, in order, the latest token winning")
    func outageAndRestart() async throws {
        // The server comes back on the port it first had (0 until then: any free one).
        let chosen = Locked(0)
        try await ServerFixture.with(server: { c in c.port = chosen.withLock { $0 } }) { f in
            let port = await f.server.port
            chosen.withLock { $0 = port }
            let kit = Kit(world: f.sim.world, deviceID: f.device, bundleID: Pizza.bundleID, attributesType: "PizzaDeliveryAttributes")
            let storage = Self.storagePath()
            let first = try await Self.client(f, storage: storage, port: port)
            let runner = Task { await first.run() }
            await first.track(SimulatedLiveActivities(kit)) { $0.attributes.map { "order-" + $0.orderNumber } }
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
