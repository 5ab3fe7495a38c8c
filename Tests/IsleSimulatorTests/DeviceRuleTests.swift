import Foundation
import IsleCore
import IsleSimulator
import IsleTesting
import Testing

/// A world with one device and the pizza app, on a virtual clock; pushes are delivered the way
/// the fake APNs delivers them after its request checks.
struct DeviceFixture {
    let world: SimulatorWorld
    let clock: ManualWallClock
    let device: String

    init(configuration: SimulatorConfiguration = .instant, frequent: Bool = false, localization: [String: String] = [:], widgets: [SimulatedWidget.Configuration] = []) throws {
        clock = ManualWallClock(Pizza.t0)
        world = SimulatorWorld(configuration: configuration, clock: clock)
        device = world.createDevice(name: "iPhone")
        _ = try Pizza.install(world, on: device, frequent: frequent, localization: localization, widgets: widgets)
    }

    /// `Activity.request` alone (its token not awaited).
    func request(score: Double = 0) throws(SimulatorError) -> SimulatedActivity {
        try world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                  contentState: Pizza.state(), relevanceScore: score)
    }

    /// Starts an activity the way app code does: request, then await its push token.
    func start(score: Double = 0) async throws -> SimulatedActivity {
        let a = try world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                          contentState: Pizza.state(), relevanceScore: score)
        if world.configuration.pushTokenDelay > 0 { try await world.advanceClock(by: world.configuration.pushTokenDelay) }
        _ = try await world.waitForPushToken(activityID: a.id, on: device)
        return try activity(a.id)
    }

    @discardableResult
    func push(_ token: String, _ payload: JSONValue, priority: Int = 5, type: String = "liveactivity") async -> DeliveryResult {
        await world.deliver(token: token, pushType: type, topic: Pizza.bundleID + ".push-type.\(type)", priority: priority, payload: payload, apnsID: UUID().uuidString.lowercased())
    }

    func activity(_ id: String) throws -> SimulatedActivity { try world.device(device).activities.first { $0.id == id }! }
    var now: Date { clock.now }
}

@Suite("Simulated device: ActivityKit rules on a virtual clock (docs/protocol.md, Simulated device)")
struct DeviceRuleTests {
    @Test("an update is applied and shown")
    func applied() async throws {
        let f = try DeviceFixture()
        let a = try await f.start()
        let r = await f.push(a.updateToken!, Pizza.update(f.now, driver: "Anne Johnson"))
        #expect(r.status == 200 && r.outcome?.code == .applied)
        #expect(try f.activity(a.id).contentState["driverName"] == "Anne Johnson")
        #expect(try f.world.screen(deviceID: f.device).lockScreen.first?.contentState["driverName"] == "Anne Johnson")
    }

    @Test("ordering: an older timestamp is ignored, an equal one applied (or ignored when strict)")
    func ordering() async throws {
        let f = try DeviceFixture()
        let a = try await f.start()
        await f.push(a.updateToken!, Pizza.update(f.now.addingTimeInterval(10), driver: "B"))
        #expect(await f.push(a.updateToken!, Pizza.update(f.now.addingTimeInterval(5), driver: "A")).outcome?.code == .olderTimestamp)
        #expect(await f.push(a.updateToken!, Pizza.update(f.now.addingTimeInterval(10), driver: "C")).outcome?.code == .applied)
        #expect(try f.activity(a.id).contentState["driverName"] == "C")
        var strict = SimulatorConfiguration.instant
        strict.strictTimestamps = true
        let g = try DeviceFixture(configuration: strict)
        let b = try await g.start()
        await g.push(b.updateToken!, Pizza.update(g.now))
        #expect(await g.push(b.updateToken!, Pizza.update(g.now)).outcome?.code == .olderTimestamp)
    }

    @Test("content that does not decode is dropped with the field, the expectation and what was found")
    func decodingFailed() async throws {
        let f = try DeviceFixture()
        let a = try await f.start()
        let bad: JSONValue = ["aps": ["timestamp": .int(Int64(f.now.timeIntervalSince1970)), "event": "update", "content-state": ["driverName": 7, "deliveryTimer": [1, 2]]]]
        let r = await f.push(a.updateToken!, bad)
        #expect(r.status == 200)
        #expect(r.outcome?.code == .decodingFailed)
        #expect(r.outcome?.field == "content-state.driverName")
        #expect(r.outcome?.expected == "a string")
        #expect(r.outcome?.found == "an integer 7")
        #expect(try f.activity(a.id).contentState["driverName"] == "Bill James")
    }

    @Test("a Unix-time Date decodes 31 years late and is flagged")
    func unixTimeDate() async throws {
        let f = try DeviceFixture()
        let a = try await f.start()
        let payload: JSONValue = ["aps": ["timestamp": .int(Int64(f.now.timeIntervalSince1970)), "event": "update",
                                          "content-state": ["driverName": "Anne", "deliveryTimer": [1_767_225_600, 1_767_227_100]]]]
        let r = await f.push(a.updateToken!, payload)
        #expect(r.outcome?.code == .flagged, "applied, but with its own outcome")
        #expect(r.outcome?.sentence.contains("2057-01-01") == true)
        #expect(r.outcome?.sentence.contains("send 788918400") == true)
        #expect(r.outcome?.field == "content-state.deliveryTimer[0]")
    }

    @Test("a Date too large for any integer is flagged without stopping the simulator", arguments: [1e308, 9.3e18, -1e308])
    func hugeDate(_ huge: Double) async throws {
        let f = try DeviceFixture()
        let a = try await f.start()
        let payload: JSONValue = ["aps": ["timestamp": .int(Int64(f.now.timeIntervalSince1970)), "event": "update",
                                          "content-state": ["driverName": "Anne", "deliveryTimer": [.int(788_918_400), .double(huge)]]]]
        let r = await f.push(a.updateToken!, payload)
        #expect(r.outcome != nil)
        // Still answering pushes afterwards.
        let next = await f.push(a.updateToken!, ["aps": ["timestamp": .int(Int64(f.now.timeIntervalSince1970) + 1), "event": "update",
                                                         "content-state": ["driverName": "Bob", "deliveryTimer": [788_918_400, 788_919_900]]]])
        #expect(next.outcome?.code == .applied)
    }

    @Test("8 hours active, then the system ends it; 4 more hours on the Lock Screen; never past 12 h")
    func lifetime() async throws {
        let f = try DeviceFixture()
        let a = try await f.start()
        f.clock.advance(by: 8 * 3600 - 1)
        #expect(try f.activity(a.id).state == .active)
        f.clock.advance(by: 1)
        let ended = try f.activity(a.id)
        #expect(ended.state == .ended)
        #expect(ended.endedAt == Pizza.t0.addingTimeInterval(8 * 3600))
        #expect(try f.world.screen(deviceID: f.device).dynamicIsland == .none)
        #expect(try f.world.screen(deviceID: f.device).lockScreen.count == 1)
        #expect(await f.push(a.updateToken!, Pizza.update(f.now)).outcome?.code == .activityEnded)
        f.clock.advance(by: 4 * 3600)
        #expect(try f.activity(a.id).state == .dismissed)
        #expect(try f.activity(a.id).dismissedAt == Pizza.t0.addingTimeInterval(12 * 3600))
        #expect(try f.world.screen(deviceID: f.device).lockScreen.isEmpty)
        // Its token now answers 410 with the time it became invalid.
        let r = await f.push(a.updateToken!, Pizza.update(f.now))
        #expect(r.status == 410 && r.reason == "Unregistered" && r.invalidSince == Pizza.t0.addingTimeInterval(12 * 3600))
    }

    @Test("end: default dismissal after 4 h; a dismissal date within 4 h; a past date removes at once")
    func endAndDismissal() async throws {
        let cases: [(Double?, Double)] = [(nil, 14_400), (1800, 1800), (-60, 0), (21_600, 14_400)]
        for (dismissal, expected) in cases {
            let f = try DeviceFixture()
            let a = try await f.start()
            var aps: JSONObject = ["timestamp": .int(Int64(f.now.timeIntervalSince1970)), "event": "end", "content-state": Pizza.state("Delivered")]
            if let dismissal { aps["dismissal-date"] = .int(Int64(f.now.addingTimeInterval(dismissal).timeIntervalSince1970)) }
            #expect(await f.push(a.updateToken!, ["aps": .object(aps)]).outcome?.code == .ended)
            if expected == 0 {
                #expect(try f.activity(a.id).state == .dismissed)
                continue
            }
            #expect(try f.activity(a.id).state == .ended)
            #expect(try f.activity(a.id).contentState["driverName"] == "Delivered")
            f.clock.advance(by: expected - 1)
            #expect(try f.activity(a.id).state == .ended)
            f.clock.advance(by: 1)
            #expect(try f.activity(a.id).state == .dismissed, "dismissal \(String(describing: dismissal))")
        }
    }

    @Test("stale at the stale-date; an update with a later stale-date (or none) makes it active again")
    func stale() async throws {
        let f = try DeviceFixture()
        let a = try await f.start()
        await f.push(a.updateToken!, Pizza.update(f.now, extra: ["stale-date": .int(Int64(f.now.addingTimeInterval(600).timeIntervalSince1970))]))
        f.clock.advance(by: 599)
        #expect(try f.activity(a.id).state == .active)
        f.clock.advance(by: 1)
        #expect(try f.activity(a.id).state == .stale)
        #expect(try f.world.screen(deviceID: f.device).lockScreen.first?.isStale == true)
        let r = await f.push(a.updateToken!, Pizza.update(f.now))
        #expect(r.outcome?.sentence.contains("no longer stale") == true)
        #expect(try f.activity(a.id).state == .active)
    }

    @Test("budget: the 16th priority-10 push in an hour is deferred; the newest deferred content is applied when budget frees")
    func budget() async throws {
        let f = try DeviceFixture()
        let a = try await f.start()
        for i in 0..<15 {
            f.clock.advance(by: 60)
            #expect(await f.push(a.updateToken!, Pizza.update(f.now, driver: "d\(i)"), priority: 10).outcome?.code == .applied)
        }
        f.clock.advance(by: 60)
        #expect(await f.push(a.updateToken!, Pizza.update(f.now, driver: "sixteenth"), priority: 10).outcome?.code == .throttled)
        f.clock.advance(by: 60)
        #expect(await f.push(a.updateToken!, Pizza.update(f.now, driver: "seventeenth"), priority: 10).outcome?.code == .throttled)
        #expect(try f.activity(a.id).contentState["driverName"] == "d14")
        // Priority 5 never counts.
        #expect(await f.push(a.updateToken!, Pizza.update(f.now, driver: "low"), priority: 5).outcome?.code == .applied)
        // The first counted push (at +1 min) ages out at +61 min: the newest deferred content is applied, not older.
        f.clock.advance(by: 61 * 60 - 17 * 60)
        let state = try f.activity(a.id)
        #expect(state.contentState["driverName"] == "seventeenth")
        #expect(try f.world.device(f.device).events.contains { $0.outcome?.sentence.contains("deferred by the budget") == true })
    }

    @Test("frequent updates raise the budget; turning the setting off ends the app's activities")
    func frequent() async throws {
        let f = try DeviceFixture(frequent: true)
        let a = try await f.start()
        for i in 0..<30 {
            #expect(await f.push(a.updateToken!, Pizza.update(f.now.addingTimeInterval(Double(i)), driver: "d\(i)"), priority: 10).outcome?.code == .applied)
        }
        try f.world.updateSettings(bundleID: Pizza.bundleID, on: f.device, frequentUpdatesEnabled: false)
        #expect(try f.activity(a.id).state == .ended)
        #expect(try f.world.device(f.device).events.last?.message.contains("More Frequent Updates off") == true)
    }

    @Test("priority 5 is applied after the configured opportunistic delay")
    func lowPriorityDelay() async throws {
        var c = SimulatorConfiguration.instant
        c.lowPriorityDelay = 30
        let f = try DeviceFixture(configuration: c)
        let a = try await f.start()
        #expect(await f.push(a.updateToken!, Pizza.update(f.now, driver: "later"), priority: 5).outcome?.code == .deferredLowPriority)
        #expect(try f.activity(a.id).contentState["driverName"] == "Bill James")
        f.clock.advance(by: 30)
        #expect(try f.activity(a.id).contentState["driverName"] == "later")
    }

    @Test("by default priority 5 is never applied at once: each push waits a seeded 0.5–3 s, the same seed giving the same waits")
    func lowPriorityNeverInstantByDefault() async throws {
        func waits(seed: UInt64) async throws -> [TimeInterval] {
            var c = SimulatorConfiguration()
            c.seed = seed
            c.hourlyBudget = 1000
            let f = try DeviceFixture(configuration: c)
            let a = try await f.start()
            var out: [TimeInterval] = []
            for n in 0..<8 {
                let sent = f.clock.now
                let outcome = await f.push(a.updateToken!, Pizza.update(sent, driver: "driver \(n)"), priority: 5).outcome
                #expect(outcome?.code == .deferredLowPriority, "\(outcome?.sentence ?? "no outcome")")
                #expect(try f.activity(a.id).contentState["driverName"] != .string("driver \(n)"), "applied at once")
                // Step the clock until the device applies it.
                var waited: TimeInterval = 0
                while try f.activity(a.id).contentState["driverName"] != .string("driver \(n)"), waited < 10 {
                    f.clock.advance(by: 0.1)
                    waited += 0.1
                }
                out.append(waited)
                f.clock.advance(by: 5)
            }
            return out
        }
        let first = try await waits(seed: 7)
        #expect(first.allSatisfy { $0 >= 0.5 - 1e-9 && $0 <= 3.1 }, "\(first)")
        #expect(Set(first.map { ($0 * 10).rounded() }).count > 1, "the waits vary: \(first)")
        #expect(try await waits(seed: 7) == first, "the same seed replays the same waits")
    }

    @Test("the push-to-start and widget push tokens are not there when install returns: they come a moment later, on the update sequences")
    func installTokensComeLater() async throws {
        let world = SimulatorWorld(configuration: SimulatorConfiguration(), clock: ManualWallClock(Pizza.t0))
        let device = world.createDevice(name: "iPhone")
        let installed = try world.install(.init(bundleID: Pizza.bundleID, schemas: [Pizza.schema], widgets: [.init(kind: "k", source: .fixed(WidgetTimeline(entries: [], policy: .never)))]), on: device)
        #expect(installed.pushToStartTokens.isEmpty && installed.widgetPushToken == nil, "handed out synchronously")
        let p2s = try await world.waitForPushToStartToken(bundleID: Pizza.bundleID, attributesType: "PizzaDeliveryAttributes", on: device)
        let widget = try await world.waitForWidgetPushToken(bundleID: Pizza.bundleID, on: device)
        #expect(p2s.count == 80 && widget.count == 64)
        #expect(try world.device(device).events.contains { $0.message.contains("got its push-to-start token") })
    }

    @Test("a push-to-start to a force-quit (or, by default, not running) app starts the activity, but its update token comes only when the app is opened; a running background app gets it at once")
    func forceQuitWithholdsToken() async throws {
        let f = try DeviceFixture()
        let p2s = try f.world.app(Pizza.bundleID, on: f.device).pushToStartTokens["PizzaDeliveryAttributes"]!
        try f.world.updateSettings(bundleID: Pizza.bundleID, on: f.device, forceQuit: true)
        let started = await f.push(p2s, Self.startPayload(f.now), priority: 10)
        #expect(started.outcome?.code == .started && started.outcome?.sentence.contains("force-quit") == true, "\(started.outcome?.sentence ?? "")")
        let quit = try #require(try f.world.device(f.device).activities.first { $0.startedBy == .push })
        try await f.world.advanceClock(by: 60)
        #expect(try f.activity(quit.id).updateToken == nil, "a force-quit app's push-started activity got its token")
        do throws(SimulatorError) {
            _ = try await f.world.waitForPushToken(activityID: quit.id, on: f.device, timeout: .milliseconds(50))
            Issue.record("waitForPushToken answered for a force-quit app")
        } catch {
            #expect(error.message.contains("force-quit"), "\(error.message)")
        }
        // The person opens the app: the token comes, as it would on pushTokenUpdates at launch.
        try f.world.updateSettings(bundleID: Pizza.bundleID, on: f.device, foreground: true)
        let token = try await f.world.waitForPushToken(activityID: quit.id, on: f.device)
        #expect(token.count == 160)
        // Not running (terminated by the system): by default the same, until the app is opened.
        var c = SimulatorConfiguration.instant
        c.terminatedWithholdsToken = true
        let g = try DeviceFixture(configuration: c)
        let gp2s = try g.world.app(Pizza.bundleID, on: g.device).pushToStartTokens["PizzaDeliveryAttributes"]!
        try g.world.updateSettings(bundleID: Pizza.bundleID, on: g.device, terminated: true)
        _ = await g.push(gp2s, Self.startPayload(g.now), priority: 10)
        let waiting = try #require(try g.world.device(g.device).activities.first { $0.startedBy == .push })
        try await g.world.advanceClock(by: 60)
        #expect(try g.activity(waiting.id).updateToken == nil, "a terminated app's push-started activity got its token")
        try g.world.updateSettings(bundleID: Pizza.bundleID, on: g.device, foreground: true)
        #expect(try await g.world.waitForPushToken(activityID: waiting.id, on: g.device).count == 160)
        // In the background but running: iOS hands it over at once.
        try f.world.updateSettings(bundleID: Pizza.bundleID, on: f.device, foreground: false)
        f.clock.advance(by: 1)
        _ = await f.push(p2s, Self.startPayload(f.now), priority: 10)
        let closed = try #require(try f.world.device(f.device).activities.last { $0.startedBy == .push })
        #expect(closed.id != quit.id)
        #expect(try await f.world.waitForPushToken(activityID: closed.id, on: f.device).count == 160)
    }

    @Test("a dismissed activity's token is not refused at once: APNs answers 200 (nothing shown) for a seeded while, then 410 with the dismissal time")
    func dismissedTokenAnswersLater() async throws {
        func invalidAfter(seed: UInt64) async throws -> TimeInterval {
            var c = SimulatorConfiguration.instant
            c.tokenInvalidationDelayMaximum = 120
            c.seed = seed
            let f = try DeviceFixture(configuration: c)
            let a = try await f.start()
            let dismissedAt = f.now
            try f.world.userDismiss(activityID: a.id, on: f.device)
            var waited: TimeInterval = 0
            while true {
                let r = await f.push(a.updateToken!, Pizza.update(f.now, driver: "after"), priority: 5)
                if r.status == 410 {
                    #expect(r.invalidSince == dismissedAt)
                    return waited
                }
                #expect(r.status == 200 && r.outcome?.code == .notDelivered, "\(r.status) \(r.outcome?.sentence ?? "")")
                #expect(try f.activity(a.id).contentState["driverName"] != .string("after"))
                f.clock.advance(by: 5)
                waited += 5
                if waited > 200 { Issue.record("never 410"); return waited }
            }
        }
        let seeds: [UInt64] = [1, 2, 3, 4, 5, 6]
        var delays: [TimeInterval] = []
        for seed in seeds { delays.append(try await invalidAfter(seed: seed)) }
        #expect(delays.allSatisfy { $0 <= 125 }, "\(delays)")
        #expect(Set(delays).count > 1, "the moment varies with the seed: \(delays)")
        #expect(try await invalidAfter(seed: 3) == delays[2], "the same seed, the same moment")
    }

    @Test("hammering one token: past 40 pushes in 10 s APNs answers 429 TooManyRequests and nothing reaches the device; another token is not affected; the window frees")
    func tooManyRequestsPerToken() async throws {
        var c = SimulatorConfiguration.instant
        c.perTokenLimit = 40
        c.perTokenWindow = 10
        c.hourlyBudget = 1000
        let f = try DeviceFixture(configuration: c)
        let a = try await f.start()
        let b = try await f.start()
        for n in 0..<40 {
            #expect(await f.push(a.updateToken!, Pizza.update(f.now, driver: "n\(n)"), priority: 5).status == 200)
        }
        let refused = await f.push(a.updateToken!, Pizza.update(f.now, driver: "too many"), priority: 5)
        #expect(refused.status == 429 && refused.reason == "TooManyRequests", "\(refused.status) \(refused.reason ?? "")")
        #expect(try f.activity(a.id).contentState["driverName"] == .string("n39"))
        #expect(await f.push(b.updateToken!, Pizza.update(f.now, driver: "other"), priority: 5).status == 200)
        f.clock.advance(by: 10)
        #expect(await f.push(a.updateToken!, Pizza.update(f.now, driver: "later"), priority: 5).status == 200)
    }

    @Test("the priority-10 budget is the app's: 15 pushes an hour across all its activities, the 16th to any of them throttled; per activity only when asked")
    func budgetPerApp() async throws {
        func throttledAt(perApp: Bool) async throws -> Int? {
            var c = SimulatorConfiguration.instant
            c.budgetPerApp = perApp
            let f = try DeviceFixture(configuration: c)
            let a = try await f.start()
            let b = try await f.start()
            for n in 0..<20 {
                let target = n.isMultiple(of: 2) ? a : b
                f.clock.advance(by: 1)
                let r = await f.push(target.updateToken!, Pizza.update(f.now, driver: "n\(n)"), priority: 10)
                if r.outcome?.code == .throttled { return n + 1 }
            }
            return nil
        }
        #expect(try await throttledAt(perApp: true) == 16, "the 16th priority-10 push of the app within the hour")
        #expect(try await throttledAt(perApp: false) == nil, "per activity, 10 each stay within 15")
    }

    @Test("deleting the app: a live activity's token is accepted a while then refused (410), the push-to-start and widget tokens at once; nothing traps afterwards")
    func uninstall() async throws {
        var c = SimulatorConfiguration.instant
        c.tokenInvalidationDelayMaximum = 60
        let f = try DeviceFixture(configuration: c, widgets: [.init(kind: "k", source: .fixed(WidgetTimeline(entries: [], policy: .never)))])
        let a = try await f.start()
        let p2s = try f.world.app(Pizza.bundleID, on: f.device).pushToStartTokens["PizzaDeliveryAttributes"]!
        let widget = try f.world.app(Pizza.bundleID, on: f.device).widgetPushToken!
        try f.world.uninstall(bundleID: Pizza.bundleID, on: f.device)
        #expect(try f.world.screen(deviceID: f.device).lockScreen.isEmpty)
        #expect(try f.activity(a.id).state == .dismissed)
        #expect(await f.push(p2s, Self.startPayload(f.now)).status == 410)
        #expect(await f.push(widget, ["aps": ["content-changed": true]], priority: 10, type: "widgets").status == 410)
        // The live activity's token: APNs does not know at once.
        let soon = await f.push(a.updateToken!, Pizza.update(f.now), priority: 10)
        #expect(soon.status == 200 || soon.status == 410)
        f.clock.advance(by: 61)
        #expect(await f.push(a.updateToken!, Pizza.update(f.now), priority: 10).status == 410)
        // The app's own calls on what is gone answer, never trap.
        #expect(throws: SimulatorError.self) { try f.world.rotateUpdateToken(activityID: a.id, on: f.device) }
        #expect(throws: SimulatorError.self) { try f.world.appUpdate(activityID: a.id, on: f.device, contentState: Pizza.state()) }
        #expect(throws: SimulatorError.self) { try f.world.uninstall(bundleID: Pizza.bundleID, on: f.device) }
        // Installed again: a new start works.
        _ = try Pizza.install(f.world, on: f.device)
        #expect(try await f.start().state == .active)
    }

    @Test("limits: 5 activities per app, 10 per device; Live Activities off refuses")
    func limits() async throws {
        let f = try DeviceFixture()
        for _ in 0..<5 { _ = try await f.start() }
        #expect(throws: SimulatorError.self) { try f.request() }
        do throws(SimulatorError) { _ = try f.request() } catch { #expect(error.code == .targetMaximumExceeded) }
        var c = SimulatorConfiguration.instant
        c.maximumActivitiesPerDevice = 2
        let g = try DeviceFixture(configuration: c)
        _ = try await g.start()
        _ = try await g.start()
        do throws(SimulatorError) { _ = try g.request(); Issue.record("started") } catch { #expect(error.code == .globalMaximumExceeded) }
        let h = try DeviceFixture()
        try h.world.updateSettings(bundleID: Pizza.bundleID, on: h.device, liveActivitiesEnabled: false)
        do throws(SimulatorError) { _ = try h.request(); Issue.record("started") } catch { #expect(error.code == .denied) }
    }

    @Test("the user dismissing an activity: its token answers 410")
    func userDismissal() async throws {
        let f = try DeviceFixture()
        let a = try await f.start()
        try f.world.userDismiss(activityID: a.id, on: f.device)
        let r = await f.push(a.updateToken!, Pizza.update(f.now))
        #expect(r.status == 410 && r.reason == "Unregistered")
    }

    @Test("token rotation: the old token answers 410, the new one works")
    func rotation() async throws {
        let f = try DeviceFixture()
        let a = try await f.start()
        let new = try f.world.rotateUpdateToken(activityID: a.id, on: f.device)
        #expect(new != a.updateToken)
        #expect(await f.push(a.updateToken!, Pizza.update(f.now)).status == 410)
        #expect(await f.push(new, Pizza.update(f.now)).outcome?.code == .applied)
    }

    static func startPayload(_ t: Date, alert: Bool = true, type: String = "PizzaDeliveryAttributes", channel: String? = nil) -> JSONValue {
        var aps: JSONObject = ["timestamp": .int(Int64(t.timeIntervalSince1970)), "event": "start", "attributes-type": .string(type), "attributes": Pizza.attributes,
                               "content-state": Pizza.state(), "input-push-token": 1]
        if alert { aps["alert"] = ["title": ["loc-key": "ORDER_%@", "loc-args": ["12345"]], "body": "In the oven"] }
        if let channel { aps["input-push-channel"] = .string(channel) }
        return ["aps": .object(aps)]
    }

    @Test("push-to-start: starts, its update token follows; the alert is localized")
    func pushToStart() async throws {
        let f = try DeviceFixture(localization: ["ORDER_%@": "Order %@"])
        let token = try f.world.app(Pizza.bundleID, on: f.device).pushToStartTokens["PizzaDeliveryAttributes"]!
        let r = await f.push(token, Self.startPayload(f.now))
        #expect(r.outcome?.code == .started)
        let a = try #require(try f.world.device(f.device).activities.first)
        #expect(a.startedBy == .push)
        #expect(a.lastAlert?.title == "Order 12345")
        // Its update token follows the start (asked for with input-push-token).
        let updateToken = try await f.world.waitForPushToken(activityID: a.id, on: f.device)
        #expect(await f.push(updateToken, Pizza.update(f.now)).outcome?.code == .applied)
        // A rotated push-to-start token: the old one answers 410 from then on.
        let newToken = try f.world.rotatePushToStartToken(bundleID: Pizza.bundleID, attributesType: "PizzaDeliveryAttributes", on: f.device)
        #expect(await f.push(token, Self.startPayload(f.now)).status == 410)
        #expect(await f.push(newToken, Self.startPayload(f.now)).outcome?.code == .started)
    }

    @Test("push-to-start that APNs accepts and the device drops", arguments: [
        ("no alert", PushOutcome.Code.startWithoutAlert),
        ("wrong case in attributes-type", .unknownAttributesType),
        ("unknown channel", .channelNotFound),
    ])
    func droppedStarts(_ name: String, _ code: PushOutcome.Code) async throws {
        let f = try DeviceFixture()
        let token = try f.world.app(Pizza.bundleID, on: f.device).pushToStartTokens["PizzaDeliveryAttributes"]!
        let payload: JSONValue = switch name {
        case "no alert": Self.startPayload(f.now, alert: false)
        case "unknown channel": Self.startPayload(f.now, channel: "bm9wZQ==")
        default: Self.startPayload(f.now, type: "pizzaDeliveryAttributes")
        }
        let r = await f.push(token, payload)
        #expect(r.status == 200)
        #expect(r.outcome?.code == code)
        #expect(try f.world.device(f.device).activities.isEmpty)
    }

    @Test("push-to-start with the update token withheld until the person allows")
    func withheld() async throws {
        var c = SimulatorConfiguration.instant
        c.withholdUpdateTokenUntilAllowed = true
        let f = try DeviceFixture(configuration: c)
        let token = try f.world.app(Pizza.bundleID, on: f.device).pushToStartTokens["PizzaDeliveryAttributes"]!
        #expect(await f.push(token, Self.startPayload(f.now)).outcome?.code == .started)
        let a = try #require(try f.world.device(f.device).activities.first)
        #expect(a.updateToken == nil)
        let issued = try #require(try f.world.allowUpdates(activityID: a.id, on: f.device))
        #expect(await f.push(issued, Pizza.update(f.now)).outcome?.code == .applied)
    }

    @Test("broadcast: input-push-channel subscribes; a broadcast updates every subscriber")
    func channels() async throws {
        let f = try DeviceFixture()
        guard case .created(let channel) = f.world.createChannel(bundleID: Pizza.bundleID, storagePolicy: 0) else { Issue.record("no channel"); return }
        let token = try f.world.app(Pizza.bundleID, on: f.device).pushToStartTokens["PizzaDeliveryAttributes"]!
        #expect(await f.push(token, Self.startPayload(f.now, channel: channel)).outcome?.code == .started)
        let fromApp = try f.world.requestActivity(bundleID: Pizza.bundleID, on: f.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                                  contentState: Pizza.state(), pushType: .channel(channel))
        #expect(fromApp.updateToken == nil)
        let result = try #require(f.world.broadcast(bundleID: Pizza.bundleID, channelID: channel, priority: 10, payload: Pizza.update(f.now, driver: "Goal!"), requestID: "r1"))
        #expect(result.outcomes.map(\.code) == [.applied, .applied])
        #expect(try f.world.device(f.device).activities.allSatisfy { $0.contentState["driverName"] == "Goal!" })
    }

    @Test("Lock Screen orders by relevance then start; Dynamic Island compact → minimal → expanded on an alert")
    func presentations() async throws {
        let f = try DeviceFixture()
        let first = try await f.start(score: 10)
        #expect(try f.world.screen(deviceID: f.device).dynamicIsland == .compact)
        f.clock.advance(by: 60)
        let second = try await f.start(score: 50)
        f.clock.advance(by: 60)
        let third = try await f.start(score: 10)
        let screen = try f.world.screen(deviceID: f.device)
        #expect(screen.lockScreen.map(\.activityID) == [second.id, first.id, third.id])
        #expect(screen.dynamicIsland == .minimal)
        #expect(screen.islandActivities == [second.id, first.id])
        await f.push(third.updateToken!, Pizza.update(f.now, extra: ["alert": ["title": "Heads up", "body": "Driver nearby"]]), priority: 10)
        let alerted = try f.world.screen(deviceID: f.device)
        #expect(alerted.dynamicIsland == .expanded && alerted.islandActivities == [third.id])
        #expect(alerted.lockScreen.first { $0.activityID == third.id }?.lastAlert?.title == "Heads up")
        f.clock.advance(by: 5)
        #expect(try f.world.screen(deviceID: f.device).dynamicIsland == .minimal)
        // Ended activities leave the Dynamic Island at once.
        await f.push(second.updateToken!, ["aps": ["timestamp": .int(Int64(f.now.timeIntervalSince1970)), "event": "end"]])
        await f.push(third.updateToken!, ["aps": ["timestamp": .int(Int64(f.now.timeIntervalSince1970)), "event": "end"]])
        let after = try f.world.screen(deviceID: f.device)
        #expect(after.dynamicIsland == .compact && after.islandActivities == [first.id])
        #expect(after.lockScreen.count == 3)
    }

    @Test("every push leaves an outcome in the device's event log")
    func eventLog() async throws {
        let f = try DeviceFixture()
        let a = try await f.start()
        let id = UUID().uuidString.lowercased()
        _ = await f.world.deliver(token: a.updateToken!, pushType: "liveactivity", topic: Pizza.bundleID + ".push-type.liveactivity", priority: 5, payload: Pizza.update(f.now), apnsID: id)
        let event = try #require(try f.world.device(f.device).events.last)
        #expect(event.apnsID == id && event.outcome?.code == .applied && event.activityID == a.id)
    }
}

@Suite("Simulated device: scheduling and binding")
struct SchedulingTests {
    @Test("a scheduled activity is pending, counts toward the limit, and starts at its date")
    func pending() async throws {
        var c = SimulatorConfiguration.instant
        c.maximumActivitiesPerApp = 1
        let f = try DeviceFixture(configuration: c)
        let a = try f.world.requestActivity(bundleID: Pizza.bundleID, on: f.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                            contentState: Pizza.state(), start: f.now.addingTimeInterval(3600),
                                            alertConfiguration: AlertConfiguration(title: "Your table is ready", body: "Pizza at 8"))
        #expect(a.state == .pending)
        #expect(try f.world.screen(deviceID: f.device).lockScreen.isEmpty)
        #expect(throws: SimulatorError.self) { try f.request() }
        f.clock.advance(by: 3600)
        #expect(try f.activity(a.id).state == .active)
        // It starts with its alert configuration: the expanded presentation, then compact.
        let started = try f.world.screen(deviceID: f.device)
        let shown = try f.activity(a.id).lastAlert?.title
        #expect(started.dynamicIsland == .expanded && shown == "Your table is ready", "\(started.dynamicIsland)")
        f.clock.advance(by: 6)
        #expect(try f.world.screen(deviceID: f.device).dynamicIsland == .compact)
        // The 8 hours count from the start date.
        f.clock.advance(by: 8 * 3600 - 7)
        #expect(try f.activity(a.id).state == .active)
    }

    @Test("the simulator refuses non-loopback addresses unless asked")
    func loopbackOnly() async throws {
        var c = IsleSim.Configuration()
        c.host = "0.0.0.0"
        await #expect(throws: SimulatorError.self) { _ = try await IsleSim(configuration: c, clock: ManualWallClock(), logger: .init(label: "t")) }
        #expect(IsleSim.isLoopback("127.0.0.1") && IsleSim.isLoopback("::1") && !IsleSim.isLoopback("10.0.0.1"))
    }
}
