import Foundation
import IsleClient
import IsleClientSimulator
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleDelivery
import IsleTesting
import Testing

/// One live activity per key on a device, and the widget token a widget extension was given
/// (docs/client.md, "One activity per key" and "Widget push token").
@Suite("IsleClient: one activity per key; the widget extension's token")
struct ClientKeyAndWidgetTests {
    typealias Kit = ClientTests.Kit
    typealias PizzaAttributes = ClientTests.PizzaAttributes

    static func client(_ f: ServerFixture, collapse: Bool) async throws -> (IsleClient, Task<Void, Never>) {
        var c = IsleClient.Configuration(serverURL: URL(string: "http://127.0.0.1:\(await f.server.port)")!, deviceKey: f.deviceKey, environment: nil)
        c.firstRetry = 0.05
        c.maximumRetry = 0.5
        c.requestTimeout = 5
        c.collapseActivitiesPerKey = collapse
        let client = try IsleClient(configuration: c, storage: FileStorage(path: ClientTests.storagePath()))
        return (client, Task { await client.run() })
    }

    @Test("a second activity for the same order ends the first, on the phone and on the server; the backend's by-key push reaches the new one alone")
    func collapsed() async throws {
        try await ServerFixture.with { f in
            let kit = ClientLifeTests.kit(f)
            let (client, runner) = try await Self.client(f, collapse: true)
            await client.track(SimulatedLiveActivities(kit), externalKey: { $0.attributes.map { "order-" + $0.orderNumber } }, ticket: ClientTests.tickets(f))
            // Another order's activity stays whatever happens to order 7's.
            let other = try kit.request(attributes: PizzaAttributes(numberOfPizzas: 1, totalAmount: "$5.00", orderNumber: "8"), content: ClientTests.state)
            let first = try kit.request(attributes: PizzaAttributes(numberOfPizzas: 1, totalAmount: "$9.00", orderNumber: "7"), content: ClientTests.state)
            try await eventually("both registered") { let a = await client.serverID(of: first.id); let b = await client.serverID(of: other.id); return a != nil && b != nil }
            let firstServerID = try #require(await client.serverID(of: first.id))
            let second = try kit.request(attributes: PizzaAttributes(numberOfPizzas: 2, totalAmount: "$18.00", orderNumber: "7"), content: ClientTests.state)
            try await eventually("the second registered") { await client.serverID(of: second.id) != nil }
            // The first is ended on the phone (dismissed at once) and on the server.
            try await eventually("the first gone from the phone") { try f.sim.world.device(f.device).activities.first { $0.id == first.id }.map { !$0.state.isVisible } ?? true }
            try await eventually("the first ended on the server") { try await SQLiteStore(path: f.databasePath).activity(id: firstServerID)?.state.acceptsPushes == false }
            let live = try await SQLiteStore(path: f.databasePath).liveActivities(bundleID: Pizza.bundleID, externalKey: "order-7")
            let secondServerID = await client.serverID(of: second.id)
            #expect(live.count == 1 && live.first?.id == secondServerID)
            #expect(try await f.call("POST", "/v1/activities/by-key/order-7/update", key: f.backendKey, body: ["contentState": Pizza.state("Dana")]).status == 202)
            try await f.waitForDevice("Dana on the second") { d in d.activities.first { $0.id == second.id }?.contentState["driverName"] == "Dana" }
            #expect(try f.sim.world.device(f.device).activities.first { $0.id == other.id }?.state.isOngoing == true)
            #expect(await client.refusedReports.isEmpty)
            await client.stop()
            await runner.value
        }
    }

    @Test("collapsing off: both activities of the key stay, and the by-key push reaches both")
    func notCollapsed() async throws {
        try await ServerFixture.with { f in
            let kit = ClientLifeTests.kit(f)
            let (client, runner) = try await Self.client(f, collapse: false)
            await client.track(SimulatedLiveActivities(kit), externalKey: { $0.attributes.map { "order-" + $0.orderNumber } }, ticket: ClientTests.tickets(f))
            let first = try kit.request(attributes: PizzaAttributes(numberOfPizzas: 1, totalAmount: "$9.00", orderNumber: "7"), content: ClientTests.state)
            try await eventually("the first registered") { await client.serverID(of: first.id) != nil }
            let second = try kit.request(attributes: PizzaAttributes(numberOfPizzas: 2, totalAmount: "$18.00", orderNumber: "7"), content: ClientTests.state)
            try await eventually("the second registered") { await client.serverID(of: second.id) != nil }
            #expect(try await SQLiteStore(path: f.databasePath).liveActivities(bundleID: Pizza.bundleID, externalKey: "order-7").count == 2)
            #expect(try await f.call("POST", "/v1/activities/by-key/order-7/update", key: f.backendKey, body: ["contentState": Pizza.state("Eve")]).status == 202)
            try await f.waitForDevice("Eve on both") { d in d.activities.filter { $0.contentState["driverName"] == "Eve" }.count == 2 }
            await client.stop()
            await runner.value
        }
    }

    @Test("the widget extension's token, left in the App Group's mailbox, reaches the server when the app comes to the foreground")
    func widgetTokenFromTheExtension() async throws {
        try await ServerFixture.with { f in
            let appGroup = "group.test.isle.\(UUID().uuidString)"
            let (client, runner) = try await Self.client(f, collapse: true)
            await client.trackWidgetPushToken(WidgetTokenMailbox(appGroup: appGroup))
            try await eventually("the installation registered") { let idle = await client.pendingReports == 0; let registered = await client.isInstallationRegistered; return idle && registered }
            let installation = await client.installationID
            #expect(try await SQLiteStore(path: f.databasePath).installation(bundleID: Pizza.bundleID, id: installation)?.widgetToken == nil)
            // The extension, a process of its own, posts what WidgetKit gave it; it sends nothing.
            let token = Data((0..<32).map { UInt8($0 * 7 % 256) })
            WidgetTokenMailbox(appGroup: appGroup).post(token)
            WidgetTokenMailbox(appGroup: appGroup).post(Data(count: 101))  // not a token: ignored
            #expect(WidgetTokenMailbox(appGroup: appGroup).latest() == token)
            await client.refresh()  // the app comes to the foreground
            let hex = token.map { String(format: "%02x", $0) }.joined()
            try await eventually("the widget token on the server") { try await SQLiteStore(path: f.databasePath).installation(bundleID: Pizza.bundleID, id: installation)?.widgetToken == hex }
            await client.stop()
            await runner.value
            UserDefaults(suiteName: appGroup)?.removePersistentDomain(forName: appGroup)
        }
    }
}
