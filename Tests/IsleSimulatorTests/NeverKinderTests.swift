import Foundation
#if canImport(Glibc)
import Glibc
#endif
import IsleCore
import IsleSimulator
import IsleTesting
import Testing

/// "Never kinder than Apple" (docs/simulator.md): each point where the simulator was kinder than
/// APNs or the device, on the default configuration (the stricter reading), seeded.
@Suite("Simulator: never kinder than Apple")
struct NeverKinderTests {
    /// The defaults with a seed, and a budget high enough that priority 10 is never throttled
    /// (the budget is not what these tests are about).
    static func strict(seed: UInt64 = 7) -> SimulatorConfiguration {
        var c = SimulatorConfiguration()
        c.seed = seed
        c.hourlyBudget = 100_000
        c.perTokenLimit = 0
        c.tokensAtInstall = true
        c.lowPriorityDelay = 0
        c.lowPriorityDelayMaximum = nil
        return c
    }

    static let widget = SimulatedWidget.Configuration(kind: "favorite", source: .fixed(WidgetTimeline(entries: [.init(date: Pizza.t0, content: ["pizza": "A"])], policy: .never)))

    @Test("a widgets push is answered 200 at once and reloads the widget later, opportunistically")
    func widgetPushIsOpportunistic() async throws {
        let f = try DeviceFixture(configuration: Self.strict(), widgets: [Self.widget])
        try f.world.updateSettings(bundleID: Pizza.bundleID, on: f.device, foreground: false)
        let token = try #require(try f.world.app(Pizza.bundleID, on: f.device).widgetPushToken)
        let before = try f.world.screen(deviceID: f.device).widgets[0].reloadCount
        let r = await f.push(token, ["aps": ["content-changed": true]], type: "widgets")
        #expect(r.status == 200 && r.outcome?.code == .widgetPushPending)
        #expect(try f.world.screen(deviceID: f.device).widgets[0].reloadCount == before, "reloaded inside APNs' 200")
        try await f.world.advanceClock(by: 30)
        #expect(try f.world.screen(deviceID: f.device).widgets[0].reloadCount == before + 1)
        #expect(try f.world.device(f.device).events.contains { $0.outcome?.code == .widgetsReloaded && $0.apnsID != nil })
    }

    @Test("a widget's daily reload budget is drawn from 40 to 70 (WidgetKit), not always 70; the push past it is deferred")
    func widgetBudgetIsDrawn() async throws {
        var budgets: [Int] = []
        for seed in UInt64(1)...12 {
            let f = try DeviceFixture(configuration: Self.strict(seed: seed), widgets: [Self.widget])
            budgets.append(try #require(try f.world.app(Pizza.bundleID, on: f.device).widgets[0].dailyBudget))
        }
        #expect(budgets.allSatisfy { (40...70).contains($0) }, "\(budgets)")
        #expect(budgets.contains { $0 < 70 }, "every widget got 70: \(budgets)")
        var c = Self.strict(seed: 1)
        c.widgetPushDelayMaximum = 0
        let f = try DeviceFixture(configuration: c, widgets: [Self.widget])
        try f.world.updateSettings(bundleID: Pizza.bundleID, on: f.device, foreground: false)
        let budget = try #require(try f.world.app(Pizza.bundleID, on: f.device).widgets[0].dailyBudget)
        let token = try #require(try f.world.app(Pizza.bundleID, on: f.device).widgetPushToken)
        for _ in 0..<budget { #expect(await f.push(token, ["aps": ["content-changed": true]], type: "widgets").outcome?.code == .widgetsReloaded) }
        #expect(await f.push(token, ["aps": ["content-changed": true]], type: "widgets").outcome?.code == .widgetReloadDeferred)
    }

    @Test("many BadDeviceToken answers on one connection bring a GOAWAY: the client's next requests come on a new connection")
    func errorsCloseTheConnection() async throws {
        var c = IsleSim.Configuration()
        c.device = Self.strict()
        try await SimFixture.with(configuration: c) { f in
            let bad = String(repeating: "ab", count: 32)
            for _ in 0..<40 {
                // As any client must: a request the GOAWAY refused (never processed) is sent again.
                var answer: RawAPNs.Answer?
                for _ in 0..<3 where answer == nil { answer = try? await f.raw.send("/3/device/\(bad)", headers: f.headers(), body: Rules.validBody) }
                #expect(answer?.reason == "BadDeviceToken")
            }
            let connections = f.sim.apns.requestLog.filter { $0.reason == "BadDeviceToken" }.map(\.connectionID)
            let first = try #require(connections.first)
            // 4 points each, GOAWAY at 100: the 25th answer closes the connection.
            #expect(connections.prefix(25).allSatisfy { $0 == first })
            #expect(connections.dropFirst(25).allSatisfy { $0 != first }, "\(connections)")
            // 410 is not an error: a dismissed activity's token answered 410 many times closes nothing.
        }
    }

    @Test("opening connections too fast is a denial of service: past the limit they are closed at once, before TLS")
    func connectionStormIsRefused() async throws {
        var c = IsleSim.Configuration()
        c.device = Self.strict()
        // The default limit; a window no slower machine can outlast, so the burst counts as one.
        c.device.connectionRateWindow = 3600
        try await IsleSim.withRunning(configuration: c, clock: ManualWallClock(Pizza.t0)) { sim in
            let port = try #require(Int(sim.apnsURL.split(separator: ":").last!))
            var sockets: [Int32] = []
            defer { for s in sockets { close(s) } }
            var refused = 0
            for _ in 0..<(sim.world.configuration.connectionRateLimit + 20) {
                let s = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
                var addr = sockaddr_in()
                addr.sin_family = sa_family_t(AF_INET)
                addr.sin_port = in_port_t(UInt16(port).bigEndian)
                addr.sin_addr.s_addr = inet_addr("127.0.0.1")
                let ok = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(s, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
                #expect(ok == 0)
                sockets.append(s)
            }
            // The server accepts them when its event loop gets to them (later on a busy machine).
            try await eventually(within: .seconds(60), "the burst's last connections to be refused") { sim.apns.refusedConnections >= 20 }
            // An admitted connection waits for the client's TLS hello; a refused one is closed: as many
            // sockets see the server close as it refused, and they are past the limit's count.
            let closed = Locked(Set<Int32>())
            let limit = sim.world.configuration.connectionRateLimit
            let all = sockets
            try await eventually(within: .seconds(30), "the refused connections to be closed") {
                closed.withLock { c in
                    for s in all where !c.contains(s) {
                        var byte: UInt8 = 0
                        let n = recv(s, &byte, 1, Int32(MSG_DONTWAIT))
                        if n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) { c.insert(s) }
                    }
                    return c.count >= all.count - limit
                }
            }
            refused = closed.withLock { $0.count }
            #expect(refused == sockets.count - limit, "\(refused) of \(sockets.count) connections in a burst were closed; the limit is \(limit)")
            #expect(sim.apns.refusedConnections == refused)
        }
    }

    @Test("a broadcast with apns-expiration 0 is not stored for an offline subscriber, even on a channel that stores messages")
    func broadcastExpirationZero() async throws {
        let f = try DeviceFixture(configuration: Self.strict())
        guard case .created(let channel) = f.world.createChannel(bundleID: Pizza.bundleID, storagePolicy: 1) else { Issue.record("no channel"); return }
        let a = try f.world.requestActivity(bundleID: Pizza.bundleID, on: f.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                            contentState: Pizza.state(), pushType: .channel(channel))
        try await f.world.setOnline(f.device, false)
        let sent = f.world.broadcast(bundleID: Pizza.bundleID, channelID: channel, priority: 10, payload: Pizza.update(f.now, driver: "once"), requestID: "r1", expiration: 0)
        #expect(sent?.outcomes.map(\.code) == [.expiredWhileOffline])
        try await f.world.setOnline(f.device, true)
        #expect(try f.activity(a.id).contentState["driverName"] == "Bill James")
    }

    @Test("switching the Broadcast capability off deletes the app's channels for good: on again, they are gone")
    func capabilityOffDeletesChannels() async throws {
        let f = try DeviceFixture(configuration: Self.strict())
        guard case .created(let channel) = f.world.createChannel(bundleID: Pizza.bundleID, storagePolicy: 0) else { Issue.record("no channel"); return }
        #expect(f.world.setBroadcastCapability(bundleID: Pizza.bundleID, enabled: false) == 1)
        f.world.setBroadcastCapability(bundleID: Pizza.bundleID, enabled: true)
        #expect(f.world.readChannel(bundleID: Pizza.bundleID, id: channel) == .failure(400, "ChannelNotRegistered"))
        #expect(f.world.listChannels(bundleID: Pizza.bundleID) == .list([]))
        // A message APNs stored on a channel for an offline device goes with the channel.
        f.world.setBroadcastCapability(bundleID: Pizza.bundleID, enabled: true)
        guard case .created(let kept) = f.world.createChannel(bundleID: Pizza.bundleID, storagePolicy: 1) else { Issue.record("no channel"); return }
        let a = try f.world.requestActivity(bundleID: Pizza.bundleID, on: f.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                            contentState: Pizza.state(), pushType: .channel(kept))
        try await f.world.setOnline(f.device, false)
        _ = f.world.broadcast(bundleID: Pizza.bundleID, channelID: kept, priority: 10, payload: Pizza.update(f.now, driver: "stored"), requestID: "r1")
        #expect(try f.world.device(f.device).storedPushes.count == 1)
        f.world.setBroadcastCapability(bundleID: Pizza.bundleID, enabled: false)
        try await f.world.setOnline(f.device, true)
        #expect(try f.activity(a.id).contentState["driverName"] == "Bill James", "a deleted channel's stored message arrived")
    }

    @Test("tokens change by themselves at a seeded moment: an activity's within its life, a push-to-start token within a day; the old ones answer 410")
    func tokensRotate() async throws {
        let f = try DeviceFixture(configuration: Self.strict())
        let a = try await f.start()
        let old = try #require(a.updateToken)
        let oldStart = try #require(try f.world.app(Pizza.bundleID, on: f.device).pushToStartTokens["PizzaDeliveryAttributes"])
        try await f.world.advanceClock(by: 7 * 3600 + 60)
        let now = try f.activity(a.id)
        #expect(now.state == .active)
        let fresh = try #require(now.updateToken)
        #expect(fresh != old, "the activity's token never changed in 7 hours")
        #expect(await f.push(old, Pizza.update(f.now)).status == 410)
        #expect(await f.push(fresh, Pizza.update(f.now, driver: "New token"), priority: 10).outcome?.code == .applied)
        try await f.world.advanceClock(by: 17 * 3600)
        #expect(try f.world.app(Pizza.bundleID, on: f.device).pushToStartTokens["PizzaDeliveryAttributes"] != oldStart)
        #expect(await f.push(oldStart, ["aps": ["event": "start"]], priority: 10).status == 410)
        #expect(try f.world.device(f.device).events.contains { $0.message.contains("changed the activity's push token by itself") })
    }

    @Test("APNs may reorder pushes to one token: a held push is overtaken by a later one and then ignored as older")
    func reordering() async throws {
        let f = try DeviceFixture(configuration: Self.strict())
        let a = try await f.start()
        let token = try #require(a.updateToken)
        var outcomes: [PushOutcome.Code] = []
        for i in 1...100 {
            outcomes.append(await f.push(token, Pizza.update(f.now.addingTimeInterval(Double(i)), driver: "v\(i)"), priority: 10).outcome?.code ?? .notDelivered)
        }
        let held = outcomes.enumerated().filter { $0.element == .heldByAPNs }.map(\.offset)
        #expect(!held.isEmpty && held.count < 20, "held: \(held)")
        try await f.world.advanceClock(by: 3)
        let events = try f.world.device(f.device).events
        // Each held push that a later one overtook arrives afterwards and is ignored as older.
        #expect(events.contains { $0.outcome?.code == .olderTimestamp })
        // The last applied content is the newest, whatever the order (unless the newest was held and applied last).
        #expect(try f.activity(a.id).contentState["driverName"] == "v100")
    }

    @Test("priority 5 is in some cases not delivered at all: a seeded few are lost")
    func lowPriorityLoss() async throws {
        let f = try DeviceFixture(configuration: Self.strict())
        let a = try await f.start()
        var lost = 0
        for i in 1...200 {
            let r = await f.push(a.updateToken!, Pizza.update(f.now.addingTimeInterval(Double(i)), driver: "v\(i)"), priority: 5)
            if r.outcome?.code == .lostLowPriority { lost += 1 }
        }
        try await f.world.advanceClock(by: 5)
        #expect(lost > 0 && lost < 30, "lost \(lost) of 200")
        #expect(try f.world.device(f.device).events.filter { $0.outcome?.code == .lostLowPriority }.count == lost)
    }

    @Test("an offline device: APNs stores the latest push in most cases, and in a seeded few keeps the earlier one")
    func storedNotAlwaysNewest() async throws {
        let f = try DeviceFixture(configuration: Self.strict())
        let a = try await f.start()
        try await f.world.setOnline(f.device, false)
        var keptEarlier = 0
        for i in 1...100 {
            let r = await f.push(a.updateToken!, Pizza.update(f.now.addingTimeInterval(Double(i)), driver: "v\(i)"), priority: 10)
            if r.outcome?.sentence.contains("kept the push it already held") == true { keptEarlier += 1 }
        }
        #expect(keptEarlier > 0 && keptEarlier < 20, "kept the earlier one \(keptEarlier) times of 100")
    }
}
