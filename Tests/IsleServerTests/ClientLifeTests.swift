import Foundation
import IsleClient
import IsleClientSimulator
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleTesting
import Testing

/// IsleClient in an app's real life (docs/client.md, "The app's life"): launched in the background
/// by a push-to-start, suspended when its background time ends, brought to the foreground, with
/// ActivityKit streams that stay silent, activities that end while it is closed, tickets fetched
/// from the backend, and the installation deleted at sign-out.
@Suite("IsleClient: the app's real life")
struct ClientLifeTests {
    typealias Attributes = ClientTests.PizzaAttributes
    typealias State = ClientTests.PizzaState
    typealias Kit = ClientTests.Kit
    static let type = "PizzaDeliveryAttributes"

    /// ActivityKit whose push-to-start token sequence never yields (it "may not yield on some
    /// launches", docs/client.md): only re-reading the token catches a rotation.
    struct SilentPushToStart: LiveActivityKit {
        let base: SimulatedLiveActivities<Attributes, State>
        var attributesType: String { base.attributesType }
        var activities: [SimulatedLiveActivities<Attributes, State>.Handle] { base.activities }
        var activityUpdates: AsyncStream<SimulatedLiveActivities<Attributes, State>.Handle> { base.activityUpdates }
        var pushToStartToken: Data? { base.pushToStartToken }
        var pushToStartTokenUpdates: AsyncStream<Data> { AsyncStream { _ in } }
        var areActivitiesEnabled: Bool { base.areActivitiesEnabled }
        var activityEnablementUpdates: AsyncStream<Bool> { base.activityEnablementUpdates }
        var frequentPushesEnabled: Bool { base.frequentPushesEnabled }
        var frequentPushEnablementUpdates: AsyncStream<Bool> { base.frequentPushEnablementUpdates }
    }

    static func client(_ f: ServerFixture, storage: String, port: Int? = nil, lifecycle: SimulatedAppLifecycle?,
                       ticket: (@Sendable (IsleClient.TicketRequest) async throws -> String?)? = nil) async throws -> IsleClient {
        let resolved: Int
        if let port { resolved = port } else { resolved = await f.server.port }
        var c = IsleClient.Configuration(serverURL: URL(string: "http://127.0.0.1:\(resolved)")!, deviceKey: f.deviceKey, environment: nil, ticket: ticket, lifecycle: lifecycle)
        c.firstRetry = 0.05
        c.maximumRetry = 0.4
        c.requestTimeout = 5
        c.backgroundWindow = 2
        return try IsleClient(configuration: c, storage: FileStorage(path: storage))
    }

    static func hex(_ data: Data?) -> String? { data.map { $0.map { String(format: "%02x", $0) }.joined() } }

    @Test("launched in the background by a push-to-start: the app holds background time until the new activity is registered, then gives it back")
    func backgroundPushToStart() async throws {
        try await ServerFixture.with { f in
            let kit = Kit(world: f.sim.world, deviceID: f.device, bundleID: Pizza.bundleID, attributesType: Self.type)
            let storage = ClientTests.storagePath()
            // A first launch, in the foreground, hands over the push-to-start token; then the person leaves and the app is terminated.
            let first = try await Self.client(f, storage: storage, lifecycle: SimulatedAppLifecycle(foreground: true))
            let firstRun = Task { await first.run() }
            await first.track(SimulatedLiveActivities(kit), externalKey: { $0.attributes.map { "order-" + $0.orderNumber } })
            try await eventually("everything sent") { await first.pendingReports == 0 }
            let installation = await first.installationID
            await first.stop()
            firstRun.cancel()
            let started = try await f.call("POST", "/v1/installations/\(installation)/start", key: f.backendKey, body: [
                "attributesType": .string(Self.type), "externalKey": "order-bg", "attributes": ["numberOfPizzas": 1, "totalAmount": "$9.00", "orderNumber": "bg"],
                "contentState": Pizza.state("Night Rider"), "alert": ["title": "Order bg", "body": "On its way"],
            ])
            #expect(started.status == 202, "\(started.json.jsonString)")
            try await f.waitForDevice("the push-started activity with its token") { d in d.activities.contains { $0.startedBy == .push && $0.updateToken != nil } }
            let onPhone = try #require(try f.sim.world.device(f.device).activities.first { $0.startedBy == .push })
            // iOS launches the app in the background to hand it the activity.
            let lifecycle = SimulatedAppLifecycle(foreground: false)
            let woken = try await Self.client(f, storage: storage, lifecycle: lifecycle)
            let run = Task { await woken.run() }
            await woken.track(SimulatedLiveActivities(kit), externalKey: { $0.attributes.map { "order-" + $0.orderNumber } })
            // Had the SDK asked for no background time, iOS would suspend the app right here, its report unsent.
            let unsent = await woken.pendingReports
            #expect(lifecycle.heldTasks == 1 || unsent == 0, "the app would be suspended with its registration unsent")
            try await eventually("the background time given back") { lifecycle.heldTasks == 0 }
            #expect(await woken.pendingReports == 0, "background time given back before the registration went through")
            let id = try #require(await woken.serverID(of: onPhone.id))
            let record = try #require(try await SQLiteStore(path: f.databasePath).activity(id: id))
            #expect(record.externalKey == "order-bg" && record.updateToken == onPhone.updateToken && record.installationID == installation)
            #expect(lifecycle.grantedTasks >= 1)
            await woken.stop()
            run.cancel()
        }
    }

    @Test("the background time runs out while the server is away: the SDK gives it back at once, and the next launch sends what was left")
    func backgroundTimeExpires() async throws {
        try await ClientTests.withRestartableServer { f, port in
            let kit = Kit(world: f.sim.world, deviceID: f.device, bundleID: Pizza.bundleID, attributesType: Self.type)
            let storage = ClientTests.storagePath()
            await f.stop()
            let lifecycle = SimulatedAppLifecycle(foreground: false)
            let client = try await Self.client(f, storage: storage, port: port, lifecycle: lifecycle)
            let run = Task { await client.run() }
            await client.track(SimulatedLiveActivities(kit), externalKey: { _ in nil })
            #expect(lifecycle.heldTasks == 1)
            lifecycle.expireBackgroundTime()
            try await eventually("the expired task ended") { lifecycle.heldTasks == 0 }
            #expect(await client.pendingReports > 0)
            // Suspended, then terminated by the system; the server comes back; the person opens the app.
            await client.stop()
            run.cancel()
            try await f.start()
            let next = try await Self.client(f, storage: storage, port: port, lifecycle: SimulatedAppLifecycle(foreground: true))
            let nextRun = Task { await next.run() }
            await next.track(SimulatedLiveActivities(kit), externalKey: { _ in nil })
            try await eventually("the installation registered") {
                let registered = await next.isInstallationRegistered, pending = await next.pendingReports
                return registered && pending == 0
            }
            await next.stop()
            nextRun.cancel()
        }
    }

    @Test("the push-to-start token rotates while its sequence stays silent: coming to the foreground re-reads it")
    func foregroundReread() async throws {
        try await ServerFixture.with { f in
            let kit = Kit(world: f.sim.world, deviceID: f.device, bundleID: Pizza.bundleID, attributesType: Self.type)
            let lifecycle = SimulatedAppLifecycle(foreground: true)
            let client = try await Self.client(f, storage: ClientTests.storagePath(), lifecycle: lifecycle)
            let run = Task { await client.run() }
            await client.track(SilentPushToStart(base: SimulatedLiveActivities(kit)), externalKey: { _ in nil })
            let installation = await client.installationID
            let store = try SQLiteStore(path: f.databasePath)
            let first = try #require(Self.hex(kit.pushToStartToken))
            try await eventually("the first token reported") { try await store.installation(bundleID: Pizza.bundleID, id: installation)?.pushToStartTokens[Self.type] == first }
            lifecycle.enterBackground()
            let rotated = try f.sim.world.rotatePushToStartToken(bundleID: Pizza.bundleID, attributesType: Self.type, on: f.device)
            try await eventually("nothing left to send") { await client.pendingReports == 0 }
            #expect(try await store.installation(bundleID: Pizza.bundleID, id: installation)?.pushToStartTokens[Self.type] == first, "the silent sequence told nobody")
            lifecycle.enterForeground()
            try await eventually("the rotated token reported after the foreground entry") { try await store.installation(bundleID: Pizza.bundleID, id: installation)?.pushToStartTokens[Self.type] == rotated }
            await client.stop()
            run.cancel()
        }
    }

    @Test("track(activity:) reads the state at once: an activity that ended while the app was closed is reported ended; tracking it twice is one tracking; untrack stops it")
    func trackReadsStateAtOnce() async throws {
        try await ServerFixture.with { f in
            let kit = Kit(world: f.sim.world, deviceID: f.device, bundleID: Pizza.bundleID, attributesType: Self.type)
            let storage = ClientTests.storagePath()
            let first = try await Self.client(f, storage: storage, lifecycle: nil)
            let run = Task { await first.run() }
            let activity = try kit.request(attributes: ClientTests.attributes, content: ClientTests.state)
            let handle = SimulatedLiveActivities(kit).handle(activity)
            await first.track(activity: handle, externalKey: nil)
            await first.track(activity: handle, externalKey: nil)
            let status = await first.registration(of: activity.id)
            guard case .registered(let id) = status else { Issue.record("registration: \(status)"); return }
            #expect(await first.isTracking(activityID: activity.id))
            await first.stop()
            run.cancel()
            // Closed; the activity ends (an App Intent, the system) before the app runs again.
            try activity.end(nil)
            let second = try await Self.client(f, storage: storage, lifecycle: nil)
            let again = Task { await second.run() }
            await second.track(activity: handle, externalKey: nil)
            try await eventually("the end reported") { try await ClientTests().serverActivity(f, id)?.state == .ended }
            try await eventually("nothing left") { await second.pendingReports == 0 }
            // Untracked: a rotation is no longer reported.
            await second.untrack(activityID: activity.id)
            #expect(await !second.isTracking(activityID: activity.id))
            let before = try await ClientTests().serverActivity(f, id)?.updateToken
            let tokenNow = try f.sim.world.device(f.device).activities.first { $0.id == activity.id }?.updateToken
            #expect(before == tokenNow)
            let requests = try await SQLiteStore(path: f.databasePath).recentActivities(bundleID: Pizza.bundleID, state: nil, limit: 10)
            #expect(requests.count == 1, "tracked twice, registered once")
            #expect(await second.refusedReports.isEmpty)
            await second.stop()
            again.cancel()
        }
    }

    @Test("the ticket provider is asked when the registration is sent, and again when the server finds the ticket expired; a refusal is a typed status")
    func ticketProviderAndStatus() async throws {
        try await ServerFixture.with { f in
            let kit = Kit(world: f.sim.world, deviceID: f.device, bundleID: Pizza.bundleID, attributesType: Self.type)
            let asked = Locked<[String]>([])
            let client = try await Self.client(f, storage: ClientTests.storagePath(), lifecycle: nil) { request in
                let n = asked.withLock { $0.append(request.externalKey); return $0.count }
                // The first ticket handed out is already expired (a stale cache in the backend), and
                // every one for order "nope" is.
                return f.ticket(key: request.externalKey, ttl: n == 1 || request.externalKey == "order-nope" ? -60 : 600)
            }
            let run = Task { await client.run() }
            await client.track(SimulatedLiveActivities(kit), externalKey: { $0.attributes.map { "order-" + $0.orderNumber } })
            let activity = try kit.request(attributes: ClientTests.attributes, content: ClientTests.state)
            guard case .registered(let id) = await client.registration(of: activity.id) else { Issue.record("not registered"); return }
            #expect(asked.withLock { $0 } == ["order-12345", "order-12345"])
            #expect(try await ClientTests().serverActivity(f, id)?.externalKey == "order-12345")
            // A key the backend will not vouch for: the server's refusal, typed.
            let other = try kit.request(attributes: Attributes(numberOfPizzas: 1, totalAmount: "$1.00", orderNumber: "nope"), content: ClientTests.state)
            asked.withLock { $0 = [] }
            let status = await client.registration(of: other.id)
            guard case .refused(let why) = status else { Issue.record("expected a refusal, got \(status)"); return }
            #expect(why.status == 403 && why.code == "ticketExpired", "\(why)")
            #expect(asked.withLock { $0 } == ["order-nope", "order-nope", "order-nope"], "fetched anew twice, then refused")
            #expect(await client.registrationStatus(of: "never-seen") == .unknown)
            await client.stop()
            run.cancel()
        }
    }

    @Test("deleting the installation: the server ends its activities and forgets its tokens and user; the client starts over as a new installation")
    func deleteInstallation() async throws {
        try await ServerFixture.with { f in
            let kit = Kit(world: f.sim.world, deviceID: f.device, bundleID: Pizza.bundleID, attributesType: Self.type)
            let client = try await Self.client(f, storage: ClientTests.storagePath(), lifecycle: nil)
            let run = Task { await client.run() }
            await client.track(SimulatedLiveActivities(kit), externalKey: { _ in nil })
            let activity = try kit.request(attributes: ClientTests.attributes, content: ClientTests.state)
            guard case .registered(let id) = await client.registration(of: activity.id) else { Issue.record("not registered"); return }
            let old = await client.installationID
            try await client.deleteInstallation()
            let store = try SQLiteStore(path: f.databasePath)
            let inst = try #require(try await store.installation(bundleID: Pizza.bundleID, id: old))
            #expect(inst.pushToStartTokens.isEmpty && inst.userID == nil && inst.widgetToken == nil)
            #expect(try await store.activity(id: id)?.state == .ended)
            #expect(await client.installationID != old)
            #expect(await client.registrationStatus(of: activity.id) == .unknown)
            // The old id takes no device call any more.
            let put = try await f.call("PUT", "/v1/installations/\(old)", key: f.deviceKey, body: [:])
            #expect(put.status == 403, "\(put.json.jsonString)")
            // The app tracks again after sign-in: a new installation, the activity registered anew.
            await client.track(SimulatedLiveActivities(kit), externalKey: { _ in nil })
            guard case .registered(let newID) = await client.registration(of: activity.id) else { Issue.record("not registered again"); return }
            #expect(newID != id)
            #expect(try await store.activity(id: newID)?.installationID == (await client.installationID))
            await client.stop()
            run.cancel()
        }
    }

    @Test("an activity on a broadcast channel (iOS 18) is registered with its channel, without a token")
    func channelActivity() async throws {
        try await ServerFixture.with { f in
            let created = try await f.call("POST", "/v1/channels", key: f.backendKey, body: ["storagePolicy": 0])
            #expect(created.status == 201 || created.status == 200, "\(created.json.jsonString)")
            let channel = try #require(created.json["id"]?.stringValue)
            let kit = Kit(world: f.sim.world, deviceID: f.device, bundleID: Pizza.bundleID, attributesType: Self.type)
            let client = try await Self.client(f, storage: ClientTests.storagePath(), lifecycle: nil)
            let run = Task { await client.run() }
            let activity = try kit.request(attributes: ClientTests.attributes, content: ClientTests.state, pushType: .channel(channel))
            await client.track(activity: SimulatedLiveActivities(kit).handle(activity), channelID: channel, externalKey: nil)
            let status = await client.registration(of: activity.id)
            guard case .registered(let id) = status else { Issue.record("\(status)"); return }
            let record = try #require(try await ClientTests().serverActivity(f, id))
            #expect(record.updateToken == nil)
            await client.stop()
            run.cancel()
        }
    }
}
