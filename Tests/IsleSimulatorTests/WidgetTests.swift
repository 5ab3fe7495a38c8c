import Foundation
import Hummingbird
import Logging
import IsleCore
import IsleSimulator
import IsleTesting
import Testing

@Suite("Simulated device: WidgetKit (docs/protocol.md, Simulated device · WidgetKit)")
struct WidgetTests {
    static func timeline(_ t: Date, _ names: [String], spacing: TimeInterval = 600, policy: WidgetTimeline.ReloadPolicy = .atEnd) -> WidgetTimeline {
        WidgetTimeline(entries: names.enumerated().map { .init(date: t.addingTimeInterval(Double($0.offset) * spacing), content: ["pizza": .string($0.element)]) }, policy: policy)
    }

    @Test("the shown entry is the last one whose date has passed")
    func shownEntry() async throws {
        let f = try DeviceFixture(widgets: [.init(kind: "favorite", source: .fixed(Self.timeline(Pizza.t0, ["A", "B", "C"], policy: .never)))])
        let token = try f.world.app(Pizza.bundleID, on: f.device).widgetPushToken!
        // Shown as soon as it is added (WidgetKit asks for a first timeline at once), before any reload.
        #expect(try f.world.screen(deviceID: f.device).widgets.first?.entry?.content["pizza"] == "A")
        #expect(try f.world.screen(deviceID: f.device).widgets.first?.reloadCount == 0)
        #expect(await f.push(token, ["aps": ["content-changed": true]], priority: 10, type: "widgets").outcome?.code == .widgetsReloaded)
        for (advance, expected) in [(0.0, "A"), (599, "A"), (1, "B"), (600, "C"), (3600, "C")] {
            f.clock.advance(by: advance)
            #expect(try f.world.screen(deviceID: f.device).widgets.first?.entry?.content["pizza"] == .string(expected))
        }
    }

    @Test("a provider's widget asks for its first timeline when added, without a push or the app, and without spending the budget")
    func firstTimelineWhenAdded() async throws {
        var c = SimulatorConfiguration.instant
        c.widgetDailyReloadBudget = 1
        let world = SimulatorWorld(configuration: c, clock: ManualWallClock(Pizza.t0))
        world.registerTimelineProvider("first") { now in WidgetTests.timeline(now, ["first"], policy: .never) }
        let device = world.createDevice(name: "iPhone")
        _ = try world.install(.init(bundleID: Pizza.bundleID, schemas: [], widgets: [.init(kind: "k", source: .provider("first"))]), on: device)
        try await world.advanceClock(by: 0.2)   // the next tick
        let widget = try #require(try world.screen(deviceID: device).widgets.first)
        #expect(widget.entry?.content["pizza"] == "first", "blank until a reload")
        // The first load was free: the one reload of the day is still there for a push.
        let token = try world.app(Pizza.bundleID, on: device).widgetPushToken!
        let pushed = await world.deliver(token: token, pushType: "widgets", topic: Pizza.bundleID + ".push-type.widgets", priority: 10, payload: ["aps": ["content-changed": true]], apnsID: "w1")
        #expect(pushed.outcome?.code == .widgetsReloaded, "\(pushed.outcome?.sentence ?? "")")
    }

    @Test("policies: atEnd reloads after the last entry; after(date) at the date; never waits for the app")
    func policies() async throws {
        let counter = Counter()
        let f = try DeviceFixture(widgets: [.init(kind: "live", source: .provider("live"))])
        f.world.registerTimelineProvider("live") { now in
            let n = counter.next()
            return WidgetTests.timeline(now, ["v\(n)a", "v\(n)b"], policy: n == 1 ? .atEnd : n == 2 ? .after(now.addingTimeInterval(3600)) : .never)
        }
        await f.world.reloadWidgets(deviceID: f.device, bundleID: Pizza.bundleID, kinds: nil, reason: .app)
        #expect(try f.world.screen(deviceID: f.device).widgets[0].entry?.content["pizza"] == "v1a")
        try await f.world.advanceClock(by: 600)  // last entry of timeline 1 → atEnd reload
        #expect(try f.world.screen(deviceID: f.device).widgets[0].entry?.content["pizza"] == "v2a")
        try await f.world.advanceClock(by: 3599)
        #expect(try f.world.screen(deviceID: f.device).widgets[0].entry?.content["pizza"] == "v2b")
        try await f.world.advanceClock(by: 1)  // after(+1 h)
        #expect(try f.world.screen(deviceID: f.device).widgets[0].entry?.content["pizza"] == "v3a")
        try await f.world.advanceClock(by: 86400)  // never
        #expect(try f.world.screen(deviceID: f.device).widgets[0].reloadCount == 3)
    }

    @Test("budget: 70 reloads per 24 h, then deferred until budget frees; the foreground app reloads for free")
    func budget() async throws {
        var c = SimulatorConfiguration.instant
        c.widgetDailyReloadBudget = 3
        let f = try DeviceFixture(configuration: c, widgets: [.init(kind: "favorite", source: .fixed(Self.timeline(Pizza.t0, ["A"], policy: .never)))])
        try f.world.updateSettings(bundleID: Pizza.bundleID, on: f.device, foreground: false)
        let token = try f.world.app(Pizza.bundleID, on: f.device).widgetPushToken!
        for _ in 0..<3 { #expect(await f.push(token, ["aps": ["content-changed": true]], type: "widgets").outcome?.code == .widgetsReloaded) }
        #expect(await f.push(token, ["aps": ["content-changed": true]], type: "widgets").outcome?.code == .widgetReloadDeferred)
        try f.world.updateSettings(bundleID: Pizza.bundleID, on: f.device, foreground: true)
        #expect(await f.world.reloadWidgets(deviceID: f.device, bundleID: Pizza.bundleID, kinds: nil, reason: .app).code == .widgetsReloaded)
        let view = try f.world.screen(deviceID: f.device).widgets[0]
        #expect(view.reloadCount == 4)
        #expect(view.pendingReload == nil)
    }

    @Test("a URL timeline source, fetched like a widget extension would")
    func urlSource() async throws {
        let router = Router()
        router.get("timeline") { _, _ in
            #"{"entries":[{"date":1767225600,"content":{"pizza":"From the server"}}],"policy":{"never":{}}}"#
        }
        try await Self.withTimelineServer(router) { f throws in
            let outcome = await f.world.reloadWidgets(deviceID: f.device, bundleID: Pizza.bundleID, kinds: ["server"], reason: .app)
            #expect(outcome.code == .widgetsReloaded)
            #expect(try f.world.screen(deviceID: f.device).widgets[0].entry?.content["pizza"] == "From the server")
        }
    }

    @Test("a URL timeline source that redirects is not followed: the reload fails naming the answer, and the other URL is never asked")
    func urlSourceRedirect() async throws {
        let router = Router()
        let followed = Counter()
        router.get("timeline") { _, _ in Response(status: .found, headers: [.location: "/elsewhere"]) }
        router.get("elsewhere") { _, _ in
            _ = followed.next()
            return #"{"entries":[{"date":1767225600,"content":{"pizza":"Redirected"}}],"policy":{"never":{}}}"#
        }
        try await Self.withTimelineServer(router) { f throws in
            let outcome = await f.world.reloadWidgets(deviceID: f.device, bundleID: Pizza.bundleID, kinds: ["server"], reason: .app)
            #expect(outcome.sentence.contains("1 failed to load"), "\(outcome.sentence)")
            let error = try f.world.app(Pizza.bundleID, on: f.device).widgets[0].lastError ?? ""
            #expect(error.contains("answered 302"), "\(error)")
            #expect(try f.world.screen(deviceID: f.device).widgets[0].entry?.content["pizza"] != "Redirected")
            #expect(followed.next() == 1, "the redirect's target was never requested")
        }
    }

    /// `router` served on 127.0.0.1 (port 0) while `body` runs with a device whose widget "server"
    /// loads its timeline from `/timeline` there.
    static func withTimelineServer(_ router: Router<BasicRequestContext>, _ body: (DeviceFixture) async throws -> Void) async throws {
        let port = ControlPortWaiter()
        var quiet = Logger(label: "timeline-server")
        quiet.logLevel = .critical
        let app = Application(router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)), onServerRunning: { port.set($0.localAddress!.port!) }, logger: quiet)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await app.runService() }
            let p = await port.wait()
            defer { group.cancelAll() }  // also when body throws: the server must stop for the group to end
            try await body(try DeviceFixture(widgets: [.init(kind: "server", source: .url("http://127.0.0.1:\(p)/timeline"))]))
        }
    }
}

final class Counter: Sendable {
    private let value = Mutex(0)
    func next() -> Int { value.withLock { $0 += 1; return $0 } }
}

import Synchronization

final class ControlPortWaiter: Sendable {
    private let stream: AsyncStream<Int>
    private let continuation: AsyncStream<Int>.Continuation
    init() { (stream, continuation) = AsyncStream.makeStream(of: Int.self) }
    func set(_ p: Int) { continuation.yield(p) }
    func wait() async -> Int {
        for await p in stream { return p }
        return 0
    }
}
