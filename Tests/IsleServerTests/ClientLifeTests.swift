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
        return try IsleClient(configuration: c, storage: ConformingStorage(path: storage))
    }

    /// Every push the server queued has had its outcome.
    static func queueDrained(_ f: ServerFixture) async throws {
        try await eventually(within: .seconds(30), "the server's queue drained") {
            try await SQLiteStore(path: f.databasePath).openJobCounts().values.reduce(0, +) == 0
        }
    }

    /// The fixture phone's ActivityKit for the pizza attributes.
    static func kit(_ f: ServerFixture) -> Kit { Kit(world: f.sim.world, deviceID: f.device, bundleID: Pizza.bundleID, attributesType: type) }

    /// A client launched and sending (`run()` in its own task).
    static func running(_ f: ServerFixture, storage: String = ClientTests.storagePath(), port: Int? = nil, lifecycle: SimulatedAppLifecycle?,
                        ticket: (@Sendable (IsleClient.TicketRequest) async throws -> String?)? = nil) async throws -> (IsleClient, Task<Void, Never>) {
        let client = try await client(f, storage: storage, port: port, lifecycle: lifecycle, ticket: ticket)
        return (client, Task { await client.run() })
    }

    static func hex(_ data: Data?) -> String? { data.map { $0.map { String(format: "%02x", $0) }.joined() } }

    @Test("launched in the background by a push-to-start: the app holds background time until the new activity is registered, then gives it back")
    func backgroundPushToStart() async throws {
        try await ServerFixture.with { f in
            let kit = Self.kit(f)
            let storage = ClientTests.storagePath()
            // A first launch, in the foreground, hands over the push-to-start token; then the person leaves and the app is terminated.
            let (first, firstRun) = try await Self.running(f, storage: storage, lifecycle: SimulatedAppLifecycle(foreground: true))
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
            let (woken, run) = try await Self.running(f, storage: storage, lifecycle: lifecycle)
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
            let kit = Self.kit(f)
            let storage = ClientTests.storagePath()
            await f.stop()
            let lifecycle = SimulatedAppLifecycle(foreground: false)
            let (client, run) = try await Self.running(f, storage: storage, port: port, lifecycle: lifecycle)
            await client.track(SimulatedLiveActivities(kit), externalKey: { _ in nil })
            #expect(lifecycle.heldTasks == 1)
            lifecycle.expireBackgroundTime()
            try await eventually("the expired task ended") { lifecycle.heldTasks == 0 }
            #expect(await client.pendingReports > 0)
            // Suspended, then terminated by the system; the server comes back; the person opens the app.
            await client.stop()
            run.cancel()
            try await f.start()
            let (next, nextRun) = try await Self.running(f, storage: storage, port: port, lifecycle: SimulatedAppLifecycle(foreground: true))
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
            let kit = Self.kit(f)
            let lifecycle = SimulatedAppLifecycle(foreground: true)
            let (client, run) = try await Self.running(f, storage: ClientTests.storagePath(), lifecycle: lifecycle)
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
            let kit = Self.kit(f)
            let storage = ClientTests.storagePath()
            let (first, run) = try await Self.running(f, storage: storage, lifecycle: nil)
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
            let (second, again) = try await Self.running(f, storage: storage, lifecycle: nil)
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
            let kit = Self.kit(f)
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
            let kit = Self.kit(f)
            let (client, run) = try await Self.running(f, storage: ClientTests.storagePath(), lifecycle: nil)
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
            let kit = Self.kit(f)
            let (client, run) = try await Self.running(f, storage: ClientTests.storagePath(), lifecycle: nil)
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

    /// Seeds: `ISLE_CLIENT_SEED` replays one; `ISLE_CLIENT_SEEDS=90` runs 90 from it (docs/client.md).
    static var seeds: [UInt64] {
        let env = ProcessInfo.processInfo.environment
        let first = env["ISLE_CLIENT_SEED"].flatMap(UInt64.init) ?? 20_261_125
        let count = env["ISLE_CLIENT_SEEDS"].flatMap(Int.init) ?? 2
        return (0..<UInt64(max(1, count))).map { first &+ $0 }
    }

    @Test("seeded random life: foreground and background launches, push-to-start while terminated, silent push-to-start sequences, rotations, ends and dismissals while closed, double tracking, server outages; the app never gives back background time owing a report, and the server ends in step with the phone",
          arguments: ClientLifeTests.seeds)
    func randomizedLife(seed: UInt64) async throws {
        var random = SeededRandom(seed: seed)
        try await ClientTests.withRestartableServer { f, port in
            let kit = Self.kit(f)
            let storage = ClientTests.storagePath()
            let key: @Sendable (SimulatedLiveActivities<Attributes, State>.Handle) -> String? = { $0.attributes.map { "order-" + $0.orderNumber } }
            // The backend signs a ticket for any order it is asked about (its own orders, here).
            let ticket: @Sendable (IsleClient.TicketRequest) async throws -> String? = { request in f.ticket(key: request.externalKey, ttl: 600) }
            var log: [String] = []
            var serverUp = true
            var app: (client: IsleClient, run: Task<Void, Never>, lifecycle: SimulatedAppLifecycle)?
            var installation: String?
            func context() -> String { "seed \(seed) (ISLE_CLIENT_SEED=\(seed) ISLE_CLIENT_SEEDS=1 replays it): \(log.joined(separator: ", "))" }

            func launch(foreground: Bool) async throws {
                let lifecycle = SimulatedAppLifecycle(foreground: foreground)
                let (client, run) = try await Self.running(f, storage: storage, port: port, lifecycle: lifecycle, ticket: ticket)
                // Half the launches see a push-to-start sequence that never yields.
                if random.next() % 2 == 0 {
                    await client.track(SilentPushToStart(base: SimulatedLiveActivities(kit)), externalKey: key)
                } else {
                    await client.track(SimulatedLiveActivities(kit), externalKey: key)
                }
                app = (client, run, lifecycle)
                installation = await client.installationID
            }
            func terminate() async {
                guard let a = app else { return }
                await a.client.stop()
                a.run.cancel()
                app = nil
            }
            /// The app in the background until iOS suspends it (here: terminates it). A background
            /// launch (`launchedInBackground`) saw everything it owes at `track`, so the check is
            /// strict: once it holds no background task, nothing may be owed while the server is up.
            /// An app sent to the background from the foreground may still be receiving ActivityKit
            /// updates, so there the SDK must send what it owes and then give its time back.
            func backgroundWake(launchedInBackground: Bool) async throws {
                guard let a = app, !a.lifecycle.isForeground else { return }
                if serverUp {
                    if launchedInBackground {
                        try await eventually(within: .seconds(20), "background time given back") { a.lifecycle.heldTasks == 0 }
                        let owed = await a.client.pendingReports
                        #expect(owed == 0, "suspended owing \(owed) report(s); \(context())")
                    } else {
                        try await eventually(within: .seconds(20), "reports sent and background time given back; \(context())") {
                            let owed = await a.client.pendingReports
                            return owed == 0 && a.lifecycle.heldTasks == 0
                        }
                    }
                } else {
                    a.lifecycle.expireBackgroundTime()
                    try await eventually(within: .seconds(20), "the expired background time given back") { a.lifecycle.heldTasks == 0 }
                }
                await terminate()
                log.append("suspended")
            }

            try await launch(foreground: true)
            log.append("launch")
            for step in 0..<30 {
                let live = kit.activities.filter { $0.activityState == .active }
                let ongoing = kit.activities.filter { $0.activityState != .dismissed }.count
                switch random.next() % 10 {
                case 0 where ongoing < 4 && app?.lifecycle.isForeground == true:
                    let a = try kit.request(attributes: Attributes(numberOfPizzas: 1, totalAmount: "$9.00", orderNumber: "r\(step)"), content: ClientTests.state)
                    log.append("start \(a.id.prefix(6))")
                    if random.next() % 3 == 0, let client = app?.client {
                        // The app also tracks it by hand: still one tracking, one registration.
                        await client.track(activity: SimulatedLiveActivities(kit).handle(a), externalKey: "order-r\(step)")
                        log.append("track twice")
                    }
                case 1 where ongoing < 4 && serverUp && installation != nil:
                    // The backend starts an order by push-to-start; the app may be terminated.
                    let n = "p\(step)"
                    let r = try await f.call("POST", "/v1/installations/\(installation!)/start", key: f.backendKey, body: [
                        "attributesType": .string(Self.type), "externalKey": .string("order-" + n), "attributes": ["numberOfPizzas": 1, "totalAmount": "$9.00", "orderNumber": .string(n)],
                        "contentState": Pizza.state("Bill James"), "alert": ["title": "Order", "body": "On its way"],
                    ])
                    log.append("push-to-start \(n) → \(r.status)")
                    if r.status == 202 {
                        // Sent to the token the server has (APNs may refuse an old one): wait for the outcome.
                        try await Self.queueDrained(f)
                        let started = try f.sim.world.device(f.device).activities.contains { $0.attributes["orderNumber"]?.stringValue == n }
                        if started {
                            try await f.waitForDevice("the push-started activity \(n)'s token") { d in d.activities.contains { $0.updateToken != nil && $0.attributes["orderNumber"]?.stringValue == n } }
                        }
                        log.append(started ? "started \(n)" : "\(n) not started")
                        if started && app == nil {
                            // iOS launches the app in the background to hand it the new activity.
                            try await launch(foreground: false)
                            log.append("background launch")
                            try await backgroundWake(launchedInBackground: true)
                        }
                    }
                case 2 where !live.isEmpty:
                    let a = live[Int(random.next() % UInt64(live.count))]
                    if a.pushToken != nil {
                        _ = try f.sim.world.rotateUpdateToken(activityID: a.id, on: f.device)
                        log.append("rotate \(a.id.prefix(6))")
                    }
                case 3:
                    _ = try f.sim.world.rotatePushToStartToken(bundleID: Pizza.bundleID, attributesType: Self.type, on: f.device)
                    log.append("push-to-start token rotated")
                case 4 where !live.isEmpty:
                    let a = live[Int(random.next() % UInt64(live.count))]
                    if app == nil || random.next() % 2 == 0 {
                        try a.end(nil)
                        log.append("ended \(a.id.prefix(6))\(app == nil ? " while closed" : "")")
                    } else {
                        try f.sim.world.userDismiss(activityID: a.id, on: f.device)
                        log.append("dismissed \(a.id.prefix(6))")
                    }
                case 5:
                    if serverUp { await f.stop() } else { try await f.start() }
                    serverUp.toggle()
                    log.append(serverUp ? "server up" : "server down")
                case 6 where app != nil:
                    if app!.lifecycle.isForeground {
                        app!.lifecycle.enterBackground()
                        log.append("to background")
                        try await backgroundWake(launchedInBackground: false)
                    } else {
                        app!.lifecycle.enterForeground()
                        log.append("to foreground")
                    }
                case 7 where app == nil:
                    try await launch(foreground: true)
                    log.append("launch")
                case 8 where app != nil:
                    await terminate()
                    log.append("terminated")
                default:
                    if let client = app?.client { _ = await client.flush() }
                    log.append("flush")
                }
            }
            // The end: the server is up, the person opens the app (the foreground entry re-reads everything).
            if !serverUp { try await f.start() }
            var told = -1
            if app == nil { try await launch(foreground: true) } else { told = app!.lifecycle.enterForeground() }
            let client = app!.client
            let inst = try #require(installation)
            let store = try SQLiteStore(path: f.databasePath)
            let world = f.sim.world, device = f.device
            // Everything sent, the foreground entry's re-read included, and every activity the phone
            // gave a token to registered (or refused) on the client.
            try await Self.queueDrained(f)
            let waitingFor = Locked("")
            do {
                try await eventually(within: .seconds(60), "everything sent") {
                    guard await client.pendingReports == 0 else { waitingFor.withLock { $0 = "reports to be sent" }; return false }
                    // Every activity on the phone has the token ActivityKit gives it (push-started ones a moment later).
                    guard try world.device(device).activities.allSatisfy({ $0.bundleID != Pizza.bundleID || $0.state != .active || $0.updateToken != nil }) else {
                        waitingFor.withLock { $0 = "the phone's tokens" }
                        return false
                    }
                    guard try await store.installation(bundleID: Pizza.bundleID, id: inst)?.pushToStartTokens[Self.type] == Self.hex(kit.pushToStartToken) else {
                        waitingFor.withLock { $0 = "the push-to-start token on the server" }
                        return false
                    }
                    for d in try world.device(device).activities where d.bundleID == Pizza.bundleID && d.updateToken != nil {
                        switch await client.registrationStatus(of: d.id) {
                        case .registered, .refused: continue
                        case let other:
                            waitingFor.withLock { $0 = "\(d.id) to be registered (\(other))" }
                            return false
                        }
                    }
                    return true
                }
            } catch {
                let refused = await client.refusedReports, pending = await client.pendingReports
                let server = try? await store.installation(bundleID: Pizza.bundleID, id: inst)?.pushToStartTokens[Self.type]
                Issue.record("still waiting for \(waitingFor.withLock { $0 }) after 60 s (pending \(pending), refused \(refused), server \(server.flatMap { $0 }?.prefix(8) ?? "none"), phone \(Self.hex(kit.pushToStartToken)?.prefix(8) ?? "none"), foreground observers \(told)); \(context())")
                throw error
            }
            let record = try await store.installation(bundleID: Pizza.bundleID, id: inst)
            #expect(record?.pushToStartTokens[Self.type] == Self.hex(kit.pushToStartToken), "push-to-start token out of step; \(context())")
            let records = try await store.recentActivities(bundleID: Pizza.bundleID, state: nil, limit: 500).filter { $0.installationID == inst && $0.updateToken != nil }
            let onPhone = try f.sim.world.device(f.device).activities.filter { $0.bundleID == Pizza.bundleID && $0.updateToken != nil }
            #expect(records.count == onPhone.count, "\(records.count) records for \(onPhone.count) activities; \(context())")
            for d in onPhone {
                let status = await client.registrationStatus(of: d.id)
                guard case .registered(let id) = status, let r = records.first(where: { $0.id == id }) else {
                    Issue.record("\(d.id) is \(status) on the client; \(context())")
                    continue
                }
                switch d.state {
                case .dismissed: #expect(r.state == .dismissed, "\(d.id) dismissed on the phone, \(r.state) on the server; \(context())")
                case .ended: #expect(r.state == .ended || r.state == .dismissed, "\(d.id) ended on the phone, \(r.state) on the server; \(context())")
                default: #expect(r.state == .active && r.updateToken == d.updateToken, "\(d.id): server \(r.state) with another token; \(context())")
                }
            }
            let refused = await client.refusedReports
            #expect(refused.isEmpty, "\(refused); \(context())")
            await terminate()
        }
    }
}
