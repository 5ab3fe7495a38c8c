import Crypto
import Foundation
import IsleCore
import IsleSimulator
import IsleTesting
import Testing

/// Issue 12, "a test that passes here must not fail on an iPhone": one test per place where the
/// simulator was kinder than a device or APNs (or simply wrong), each failing on the old model.
/// The rules and their sources are listed in docs/simulator.md.
@Suite("Simulator fidelity: what an iPhone and APNs really do")
struct FidelityTests {
    typealias Kit = SimulatedActivityKit<PizzaDeliveryAttributes, PizzaDeliveryAttributes.ContentState>
    static let attributes = PizzaDeliveryAttributes(numberOfPizzas: 3, totalAmount: "$42.00", orderNumber: "12345")
    static let state = PizzaDeliveryAttributes.ContentState(driverName: "Bill James", deliveryTimer: Pizza.t0...Pizza.t0.addingTimeInterval(1500))

    // 1. docs/protocol.md §10.6: the token is "not available synchronously right after request".
    @Test("1 · the push token is not there when request returns; it arrives on pushTokenUpdates")
    func tokenArrivesLater() async throws {
        var c = SimulatorConfiguration.instant
        c.pushTokenDelay = 2
        let f = try DeviceFixture(configuration: c)
        let kit = Kit(world: f.world, deviceID: f.device, bundleID: Pizza.bundleID)
        let activity = try kit.request(attributes: Self.attributes, content: Self.state)
        #expect(activity.pushToken == nil, "ActivityKit has no token synchronously after request")
        let tokens = activity.pushTokenUpdates
        try await f.world.advanceClock(by: 1)
        #expect(activity.pushToken == nil)
        try await f.world.advanceClock(by: 1)
        #expect(try await nextValue(of: tokens, "the push token").count == 80)
        #expect(try f.world.device(f.device).events.contains { $0.message.contains("pushTokenUpdates") })
        // Even with no delay, request's own answer never carries it.
        let g = try DeviceFixture()
        let a = try g.world.requestActivity(bundleID: Pizza.bundleID, on: g.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state())
        #expect(a.updateToken == nil && a.tokenDueAt != nil)
        #expect(try await g.world.waitForPushToken(activityID: a.id, on: g.device).count == 160)
    }

    // 2. docs/protocol.md §6: iOS 18+ "input-push-token": 1 → "start and receive a new update push token".
    @Test("iOS versions: 16.0 cannot start a Live Activity (16.1 can); a scheduled start needs iOS 26")
    func versionGates() async throws {
        let f = try DeviceFixture()
        for (version, starts) in [("16.0", false), ("16.1", true)] {
            let device = try f.world.createDevice(name: version, osVersion: version, model: "iPhone 14")
            _ = try Pizza.install(f.world, on: device)
            do {
                _ = try f.world.requestActivity(bundleID: Pizza.bundleID, on: device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state())
                #expect(starts, "iOS \(version) started a Live Activity")
            } catch {
                #expect(!starts && error.code == .unsupported && error.message.contains("16.1"), "iOS \(version): \(error.message)")
            }
        }
        let ios18 = try f.world.createDevice(name: "18", osVersion: "18.4", model: "iPhone 16 Pro")
        _ = try Pizza.install(f.world, on: ios18)
        #expect(throws: SimulatorError.self) {
            try f.world.requestActivity(bundleID: Pizza.bundleID, on: ios18, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state(),
                                        start: f.now.addingTimeInterval(600), alertConfiguration: AlertConfiguration(title: "Soon", body: "Pizza"))
        }
        // iOS 26 schedules it, with the alert configuration Apple makes mandatory for a scheduled
        // start; without one the request fails naming it.
        do {
            _ = try f.world.requestActivity(bundleID: Pizza.bundleID, on: f.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                            contentState: Pizza.state(), start: f.now.addingTimeInterval(600))
            Issue.record("a scheduled start without an alert configuration was accepted")
        } catch {
            #expect(error.code == .invalidArgument && error.field == "alertConfiguration", "\(error.message)")
        }
        let scheduled = try f.world.requestActivity(bundleID: Pizza.bundleID, on: f.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                                    contentState: Pizza.state(), start: f.now.addingTimeInterval(600),
                                                    alertConfiguration: AlertConfiguration(title: "Your order is next", body: "Pizza in 10 minutes"))
        #expect(scheduled.state == .pending && scheduled.lastAlert == nil)
        f.clock.advance(by: 600)
        let started = try #require(try f.world.device(f.device).activities.first { $0.id == scheduled.id })
        #expect(started.state == .active && started.lastAlert?.title == "Your order is next", "the scheduled activity starts with its alert")
    }

    @Test("push-to-start budget: 15 starts in 15 seconds, the first 10 start and the rest do not (APNs 200); an hour later it starts again; 0 lifts the limit")
    func pushToStartBudget() async throws {
        var c = SimulatorConfiguration.instant
        c.maximumActivitiesPerApp = 100
        c.maximumActivitiesPerDevice = 100
        for limit in [10, 0] {
            c.pushToStartLimit = limit
            let f = try DeviceFixture(configuration: c)
            let pts = try f.world.app(Pizza.bundleID, on: f.device).pushToStartTokens["PizzaDeliveryAttributes"]!
            var codes: [PushOutcome.Code] = []
            for i in 0..<15 {
                let r = await f.push(pts, DeviceRuleTests.startPayload(f.now), priority: 10)
                #expect(r.status == 200)
                codes.append(r.outcome?.code ?? .notDelivered)
                if i < 14 { try await f.world.advanceClock(by: 1) }
            }
            if limit == 0 {
                #expect(codes.allSatisfy { $0 == .started }, "\(codes)")
                continue
            }
            #expect(codes.prefix(10).allSatisfy { $0 == .started } && codes.suffix(5).allSatisfy { $0 == .pushToStartThrottled }, "\(codes)")
            #expect(try f.world.device(f.device).activities.count == 10)
            try await f.world.advanceClock(by: 3600)
            #expect(await f.push(pts, DeviceRuleTests.startPayload(f.now), priority: 10).outcome?.code == .started)
        }
    }

    @Test("2 · a push-to-start without input-push-token gets no update token on iOS 18+; with it, or before 18, it does")
    func inputPushToken() async throws {
        let f = try DeviceFixture()
        let pts = try f.world.app(Pizza.bundleID, on: f.device).pushToStartTokens["PizzaDeliveryAttributes"]!
        var start = DeviceRuleTests.startPayload(f.now)
        start = Self.removing("input-push-token", from: start)
        let r = await f.push(pts, start, priority: 10)
        #expect(r.outcome?.code == .started)
        #expect(r.outcome?.sentence.contains("input-push-token") == true, "\(r.outcome?.sentence ?? "")")
        let started = try #require(try f.world.device(f.device).activities.first)
        await #expect(throws: SimulatorError.self) { try await f.world.waitForPushToken(activityID: started.id, on: f.device) }
        // Asked for: the token follows.
        let second = await f.push(pts, DeviceRuleTests.startPayload(f.now.addingTimeInterval(1)), priority: 10)
        #expect(second.outcome?.code == .started)
        let asked = try #require(try f.world.device(f.device).activities.last)
        #expect(try await f.world.waitForPushToken(activityID: asked.id, on: f.device).count == 160)
        // iOS 17.2 knows no input-push-token: a push-started activity always gets one.
        let old = try f.world.createDevice(name: "old", osVersion: "17.2", model: "iPhone 15")
        _ = try Pizza.install(f.world, on: old)
        let oldPTS = try f.world.app(Pizza.bundleID, on: old).pushToStartTokens["PizzaDeliveryAttributes"]!
        #expect(await f.push(oldPTS, start, priority: 10).outcome?.code == .started)
        let oldActivity = try #require(try f.world.device(old).activities.first)
        #expect(try await f.world.waitForPushToken(activityID: oldActivity.id, on: old).count == 160)
    }

    // 3. docs/protocol.md §2 (apns-expiration, apns-collapse-id), §7.2 (storage policy), §11 (one stored per app).
    @Test("3 · an offline device gets, when back, only the last stored push within apns-expiration; 0 is not stored")
    func offlineStorage() async throws {
        let f = try DeviceFixture()
        let a = try await f.start()
        try await f.world.setOnline(f.device, false)
        let notStored = await f.world.deliver(token: a.updateToken!, pushType: "liveactivity", topic: Pizza.bundleID + ".push-type.liveactivity", priority: 10,
                                               payload: Pizza.update(f.now, driver: "never"), apnsID: "00000000-0000-0000-0000-000000000001", expiration: 0)
        #expect(notStored.status == 200 && notStored.outcome?.code == .expiredWhileOffline)
        for (i, driver) in ["first", "second", "third"].enumerated() {
            let r = await f.world.deliver(token: a.updateToken!, pushType: "liveactivity", topic: Pizza.bundleID + ".push-type.liveactivity", priority: 10,
                                          payload: Pizza.update(f.now.addingTimeInterval(Double(i)), driver: driver), apnsID: "00000000-0000-0000-0000-00000000001\(i)",
                                          collapseID: "eta")
            #expect(r.status == 200 && r.outcome?.code == .storedWhileOffline)
        }
        #expect(try f.activity(a.id).contentState["driverName"] == "Bill James", "nothing reaches an offline device")
        #expect(try f.world.device(f.device).storedPushes.count == 1, "APNs keeps one per app")
        try await f.world.setOnline(f.device, true)
        #expect(try f.activity(a.id).contentState["driverName"] == "third")
        let applied = try f.world.device(f.device).events.filter { $0.outcome?.code == .applied }
        #expect(applied.count == 1, "only the last stored push is delivered")
        // A stored push whose expiration passes while offline is missed.
        try await f.world.setOnline(f.device, false)
        let soon = Int64(f.now.timeIntervalSince1970) + 60
        _ = await f.world.deliver(token: a.updateToken!, pushType: "liveactivity", topic: Pizza.bundleID + ".push-type.liveactivity", priority: 10,
                                  payload: Pizza.update(f.now.addingTimeInterval(10), driver: "late"), apnsID: "00000000-0000-0000-0000-000000000020", expiration: soon)
        try await f.world.advanceClock(by: 120)
        try await f.world.setOnline(f.device, true)
        #expect(try f.activity(a.id).contentState["driverName"] == "third")
        #expect(try f.world.device(f.device).events.last { $0.outcome?.code == .expiredWhileOffline }?.message.contains("Missed") == true)
    }

    @Test("3 · two activities of one app updated while the phone is offline: APNs keeps one push per app, so only the newest arrives")
    func offlineStoragePerApp() async throws {
        let f = try DeviceFixture()
        let a = try await f.start()
        let b = try await f.start()
        try await f.world.setOnline(f.device, false)
        let first = await f.push(a.updateToken!, Pizza.update(f.now, driver: "to A"), priority: 10)
        #expect(first.outcome?.code == .storedWhileOffline)
        let second = await f.push(b.updateToken!, Pizza.update(f.now.addingTimeInterval(1), driver: "to B"), priority: 10)
        #expect(second.outcome?.sentence.contains("sent to another of its tokens") == true, "\(second.outcome?.sentence ?? "")")
        #expect(try f.world.device(f.device).storedPushes.count == 1)
        try await f.world.setOnline(f.device, true)
        #expect(try f.activity(b.id).contentState["driverName"] == "to B")
        #expect(try f.activity(a.id).contentState["driverName"] == "Bill James", "A's update was replaced by B's while offline")
    }

    @Test("3 · a broadcast channel's storage policy decides what an offline subscriber gets: 1 keeps the latest up to 8 h, 0 nothing")
    func channelStorage() async throws {
        let f = try DeviceFixture()
        guard case .created(let keeping) = f.world.createChannel(bundleID: Pizza.bundleID, storagePolicy: 1),
              case .created(let none) = f.world.createChannel(bundleID: Pizza.bundleID, storagePolicy: 0) else { Issue.record("channels not created"); return }
        let kept = try f.world.requestActivity(bundleID: Pizza.bundleID, on: f.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                               contentState: Pizza.state(), pushType: .channel(keeping))
        let lost = try f.world.requestActivity(bundleID: Pizza.bundleID, on: f.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                               contentState: Pizza.state(), pushType: .channel(none))
        try await f.world.setOnline(f.device, false)
        _ = f.world.broadcast(bundleID: Pizza.bundleID, channelID: keeping, priority: 10, payload: Pizza.update(f.now, driver: "one"), requestID: "r1")
        _ = f.world.broadcast(bundleID: Pizza.bundleID, channelID: keeping, priority: 10, payload: Pizza.update(f.now.addingTimeInterval(1), driver: "two"), requestID: "r2")
        let missed = f.world.broadcast(bundleID: Pizza.bundleID, channelID: none, priority: 10, payload: Pizza.update(f.now, driver: "gone"), requestID: "r3")
        #expect(missed?.outcomes.map(\.code) == [.expiredWhileOffline])
        try await f.world.setOnline(f.device, true)
        #expect(try f.activity(kept.id).contentState["driverName"] == "two")
        #expect(try f.activity(lost.id).contentState["driverName"] == "Bill James")
        // Policy 1 keeps a message 8 hours at most.
        try await f.world.setOnline(f.device, false)
        _ = f.world.broadcast(bundleID: Pizza.bundleID, channelID: keeping, priority: 10, payload: Pizza.update(f.now.addingTimeInterval(2), driver: "stale news"), requestID: "r4")
        try await f.world.advanceClock(by: 7 * 3600)
        try await f.world.setOnline(f.device, true)
        #expect(try f.activity(kept.id).contentState["driverName"] == "stale news", "within 8 h")
        try await f.world.setOnline(f.device, false)
        _ = f.world.broadcast(bundleID: Pizza.bundleID, channelID: keeping, priority: 10, payload: Pizza.update(f.now.addingTimeInterval(3), driver: "too old"), requestID: "r5")
        try await f.world.advanceClock(by: 8 * 3600 + 1)
        try await f.world.setOnline(f.device, true)
        #expect(try f.world.device(f.device).activities.first { $0.id == kept.id }?.contentState["driverName"] != "too old")
    }

    @Test("3 · realistic mode: priority 5 waits a seeded random 1–60 s; the same seed replays the same delays")
    func realisticLowPriority() async throws {
        func delays(seed: UInt64) async throws -> [String] {
            let f = try DeviceFixture(configuration: .realistic(seed: seed))
            let a = try await f.start()
            var out: [String] = []
            for i in 0..<5 {
                let r = await f.push(a.updateToken!, Pizza.update(f.now.addingTimeInterval(Double(i)), driver: "d\(i)"), priority: 5)
                #expect(r.outcome?.code == .deferredLowPriority)
                out.append(r.outcome?.sentence ?? "")
            }
            return out
        }
        let first = try await delays(seed: 7)
        #expect(try await delays(seed: 7) == first)
        #expect(try await delays(seed: 8) != first)
    }

    // 4. docs/protocol.md §7.4: a non-2xx broadcast is not delivered.
    @Test("4 · a broadcast APNs rejects reaches no subscriber")
    func rejectedBroadcast() async throws {
        try await SimFixture.with { f in
            let id = try await Rules.withChannel(f, policy: 0)
            let a = try f.sim.world.requestActivity(bundleID: Pizza.bundleID, on: f.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                                    contentState: Pizza.state(), pushType: .channel(id))
            let body = Array(Pizza.update(f.clock.now, driver: "Rejected").jsonBytes)
            let r = try await f.raw.send("/4/broadcasts/apps/\(Pizza.bundleID)", headers: Rules.bheaders(f, [("apns-channel-id", id), ("apns-expiration", "1767229200")]), body: body)
            #expect(r.status == 400 && r.reason == "BadExpirationDate")
            let shown = try #require(try f.sim.world.device(f.device).activities.first { $0.id == a.id })
            #expect(shown.contentState["driverName"] == "Bill James", "nothing may reach a device for a non-2xx answer")
        }
    }

    // 5. docs/protocol.md §10.5: request "only in the foreground (else ActivityAuthorizationError.visibility)".
    @Test("5 · Activity.request from the background throws visibility")
    func backgroundRequest() async throws {
        let f = try DeviceFixture()
        try f.world.updateSettings(bundleID: Pizza.bundleID, on: f.device, foreground: false)
        let kit = Kit(world: f.world, deviceID: f.device, bundleID: Pizza.bundleID)
        #expect(throws: SimulatorError.self) { _ = try kit.request(attributes: Self.attributes, content: Self.state) }
        do {
            _ = try f.world.requestActivity(bundleID: Pizza.bundleID, on: f.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state())
        } catch {
            #expect(error.code == .visibility && error.message.contains("foreground"))
        }
        #expect(try f.world.device(f.device).activities.isEmpty)
        // A push-to-start still works from the background.
        let pts = try f.world.app(Pizza.bundleID, on: f.device).pushToStartTokens["PizzaDeliveryAttributes"]!
        #expect(await f.push(pts, DeviceRuleTests.startPayload(f.now), priority: 10).outcome?.code == .started)
    }

    // 6. docs/protocol.md, WidgetKit: reloads "per policy", also in real time.
    @Test("6 · in real time, a timeline's after(date) policy reloads by itself")
    func realTimePolicyReload() async throws {
        try await IsleSim.withRunning(clock: SystemWallClock()) { sim in
            // Each load asks to be reloaded 0.3 s later, as a widget extension's provider would.
            sim.world.registerTimelineProvider("score") { now in
                WidgetTimeline(entries: [.init(date: now, content: ["score": 1])], policy: .after(now.addingTimeInterval(0.3)))
            }
            let device = sim.world.createDevice(name: "iPhone")
            _ = try Pizza.install(sim.world, on: device, widgets: [.init(kind: "score", source: .provider("score"))])
            await sim.world.reloadWidgets(deviceID: device, bundleID: Pizza.bundleID, kinds: nil, reason: .app)
            #expect(try sim.world.device(device).apps[Pizza.bundleID]!.widgets[0].reloadCount == 1)
            let world = sim.world
            try await withDeadline(.seconds(10), "the policy reload") {
                let changes = world.changes.subscribe()
                if try world.device(device).apps[Pizza.bundleID]!.widgets[0].reloadCount >= 2 { return }
                for await _ in changes where try world.device(device).apps[Pizza.bundleID]!.widgets[0].reloadCount >= 2 { return }
            }
            #expect(try sim.world.device(device).events.contains { $0.outcome?.sentence.contains("(policy)") == true })
        }
    }

    // 7. docs/protocol.md §9.1: a widgets push body is {"aps":{"content-changed":true}}.
    @Test("7 · a widgets push reloads only with content-changed: true, and says why not otherwise")
    func widgetsBody() async throws {
        let timeline = WidgetTimeline(entries: [.init(date: Pizza.t0, content: ["score": 1])], policy: .never)
        let f = try DeviceFixture(widgets: [.init(kind: "score", source: .fixed(timeline))])
        let token = try #require(try f.world.app(Pizza.bundleID, on: f.device).widgetPushToken)
        let wrong = await f.push(token, ["aps": ["content-available": 1]], type: "widgets")
        #expect(wrong.status == 200 && wrong.outcome?.code == .notDelivered && wrong.outcome?.field == "aps.content-changed")
        #expect(try f.world.device(f.device).apps[Pizza.bundleID]!.widgets[0].reloadCount == 0)
        let right = await f.push(token, ["aps": ["content-changed": true]], type: "widgets")
        #expect(right.outcome?.code == .widgetsReloaded)
    }

    // 9. Numbers: docs/protocol.md §5.1 says "number"; docs/simulator.md, "Numbers".
    @Test("9 · aps dates: 1767225600.0 is an integer, a fraction is taken (and warned about by the validator), milliseconds are flagged")
    func numbers() async throws {
        let f = try DeviceFixture()
        let a = try await f.start()
        let t = Int64(f.now.timeIntervalSince1970)
        let fractional = try JSONParser.parse(#"{"aps":{"timestamp":\#(t).5,"event":"update","content-state":{"driverName":"Half","deliveryTimer":[788918400,788919900]},"stale-date":\#(t + 600).25}}"#)
        let r = await f.push(a.updateToken!, fractional)
        #expect(r.outcome?.code == .applied, "\(r.outcome?.sentence ?? "")")
        #expect(try f.activity(a.id).staleDate == Date(timeIntervalSince1970: Double(t + 600) + 0.25), "a fractional stale-date is kept, not cleared")
        let integral = try JSONParser.parse(#"{"aps":{"timestamp":\#(t + 1).0,"event":"update","content-state":{"driverName":"Whole","deliveryTimer":[788918400,788919900]}}}"#)
        #expect(await f.push(a.updateToken!, integral).outcome?.code == .applied)
        // The validator agrees with the device.
        let v = PayloadValidator(options: .init(now: f.now))
        #expect(v.validate(bytes: integral.jsonBytes).issues.isEmpty, "\(v.validate(bytes: integral.jsonBytes).issues)")
        let warned = v.validate(bytes: fractional.jsonBytes)
        #expect(warned.isValid && warned.issues.contains { $0.code == .fractionalSeconds })
        // A number beyond any date is refused by the validator and ignored as older-than by nothing:
        // neither traps (1e30 does not fit Int64).
        let huge = try JSONParser.parse(#"{"aps":{"timestamp":1e30,"event":"update","content-state":{"driverName":"Far","deliveryTimer":[788918400,788919900]}}}"#)
        #expect(v.validate(bytes: huge.jsonBytes).errors.contains { $0.code == .timestampNotInteger })
        #expect(await f.push(a.updateToken!, huge).outcome != nil)
        #expect(await f.push(a.updateToken!, Pizza.update(f.now.addingTimeInterval(5))).outcome?.code == .olderTimestamp)
        // A start in milliseconds starts, and says what will go wrong next.
        let pts = try f.world.app(Pizza.bundleID, on: f.device).pushToStartTokens["PizzaDeliveryAttributes"]!
        var start = DeviceRuleTests.startPayload(f.now)
        if case .object(var root) = start, case .object(var aps)? = root["aps"] {
            aps["timestamp"] = .int(t * 1000)
            root["aps"] = .object(aps)
            start = .object(root)
        }
        let ms = await f.push(pts, start, priority: 10)
        #expect(ms.outcome?.code == .flagged && ms.outcome?.sentence.contains("milliseconds") == true)
    }

    // 10. docs/protocol.md §6 (17.2), §7 (18), §9.1 (26), §10.7 (banner without a Dynamic Island).
    @Test("10 · iOS versions gate push-to-start, channels and widget pushes; without a Dynamic Island an alert is a banner")
    func versionsAndModels() async throws {
        let f = try DeviceFixture()
        let old = try f.world.createDevice(name: "16", osVersion: "17.1", model: "iPhone 15 Pro")
        let widgets: [SimulatedWidget.Configuration] = [.init(kind: "score", source: .fixed(WidgetTimeline(entries: [], policy: .never)))]
        let app = try Pizza.install(f.world, on: old, widgets: widgets)
        #expect(app.pushToStartTokens.isEmpty && app.widgetPushToken == nil)
        guard case .created(let channel) = f.world.createChannel(bundleID: Pizza.bundleID, storagePolicy: 0) else { Issue.record("no channel"); return }
        do {
            _ = try f.world.requestActivity(bundleID: Pizza.bundleID, on: old, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state(),
                                            pushType: .channel(channel))
            Issue.record("a channel activity started on iOS 17")
        } catch {
            #expect(error.code == .unsupported && error.message.contains("iOS 18"))
        }
        let s172 = try f.world.createDevice(name: "17.2", osVersion: "17.2", model: "iPhone 15")
        #expect(try Pizza.install(f.world, on: s172, widgets: widgets).pushToStartTokens.count == 1)
        #expect(try f.world.app(Pizza.bundleID, on: s172).widgetPushToken == nil, "widget pushes need iOS 26")
        #expect(throws: SimulatorError.self) { try f.world.createDevice(name: "x", osVersion: "twenty", model: "iPhone") }
        // An iPhone 13 has no Dynamic Island: the alert shows as a banner.
        let se = try f.world.createDevice(name: "13", osVersion: "18.0", model: "iPhone 13")
        _ = try Pizza.install(f.world, on: se)
        let a = try f.world.requestActivity(bundleID: Pizza.bundleID, on: se, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state())
        let token = try await f.world.waitForPushToken(activityID: a.id, on: se)
        _ = await f.push(token, Pizza.update(f.now, extra: ["alert": ["title": "Delivery", "body": "Soon"]]), priority: 10)
        let screen = try f.world.screen(deviceID: se)
        #expect(screen.dynamicIsland == .none && screen.banner?.alert.title == "Delivery")
        #expect(try f.world.screen(deviceID: f.device).banner == nil)
    }

    @Test("also · rotated push-to-start and widget tokens answer 410; the app's end with .after(date) stays until then")
    func rotationsAndAfterDismissal() async throws {
        let timeline = WidgetTimeline(entries: [], policy: .never)
        let f = try DeviceFixture(widgets: [.init(kind: "score", source: .fixed(timeline))])
        let oldPTS = try f.world.app(Pizza.bundleID, on: f.device).pushToStartTokens["PizzaDeliveryAttributes"]!
        _ = try f.world.rotatePushToStartToken(bundleID: Pizza.bundleID, attributesType: "PizzaDeliveryAttributes", on: f.device)
        let r = await f.push(oldPTS, DeviceRuleTests.startPayload(f.now), priority: 10)
        #expect(r.status == 410 && r.reason == "Unregistered")
        let oldWidget = try #require(try f.world.app(Pizza.bundleID, on: f.device).widgetPushToken)
        let newWidget = try f.world.rotateWidgetPushToken(bundleID: Pizza.bundleID, on: f.device)
        #expect(newWidget != oldWidget)
        #expect(await f.push(oldWidget, ["aps": ["content-changed": true]], type: "widgets").status == 410)
        #expect(await f.push(newWidget, ["aps": ["content-changed": true]], type: "widgets").status == 200)
        let a = try await f.start()
        try f.world.appUpdate(activityID: a.id, on: f.device, contentState: nil, end: true, dismissAt: f.now.addingTimeInterval(600))
        try await f.world.advanceClock(by: 599)
        #expect(try f.activity(a.id).state == .ended)
        try await f.world.advanceClock(by: 2)
        #expect(try f.activity(a.id).state == .dismissed)
    }

    @Test("also · widget timeline entries closer than 5 minutes are flagged")
    func entrySpacing() async throws {
        let timeline = WidgetTimeline(entries: [.init(date: Pizza.t0, content: ["n": 1]), .init(date: Pizza.t0.addingTimeInterval(60), content: ["n": 2])], policy: .never)
        let f = try DeviceFixture(widgets: [.init(kind: "score", source: .fixed(timeline))])
        let o = await f.world.reloadWidgets(deviceID: f.device, bundleID: Pizza.bundleID, kinds: nil, reason: .app)
        #expect(o.code == .widgetsReloaded && o.sentence.contains("60 s apart"))
    }

    /// A ContentState whose Swift type needs a key the registered schema does not know.
    struct StricterState: Codable, Sendable, Equatable {
        var driverName: String
        var deliveryTimer: ClosedRange<Date>
        var eta: Int
    }

    // Independence: the device decodes with the app's own type too (docs/simulator.md).
    @Test("independence · content the schema accepts but the app's JSONDecoder refuses is dropped with the reason, not applied")
    func independentDecode() async throws {
        let f = try DeviceFixture()
        let kit = SimulatedActivityKit<PizzaDeliveryAttributes, StricterState>(world: f.world, deviceID: f.device, bundleID: Pizza.bundleID, attributesType: "PizzaDeliveryAttributes")
        let handle = try kit.request(attributes: Self.attributes, content: StricterState(driverName: "Bill James", deliveryTimer: Pizza.t0...Pizza.t0.addingTimeInterval(60), eta: 5))
        let token = try await f.world.waitForPushToken(activityID: handle.id, on: f.device)
        let r = await f.push(token, Pizza.update(f.now, driver: "No ETA"))
        #expect(r.outcome?.code == .decodingFailed && r.outcome?.sentence.contains("eta") == true, "\(r.outcome?.sentence ?? "")")
        #expect(handle.content?.driverName == "Bill James")
        #expect(try f.world.device(f.device).events.last { $0.apnsID != nil }?.outcome?.code == .decodingFailed)
    }

    static func removing(_ key: String, from payload: JSONValue) -> JSONValue {
        guard case .object(var root) = payload, case .object(var aps)? = root["aps"] else { return payload }
        aps[key] = nil
        root["aps"] = .object(aps)
        return .object(root)
    }
}

/// Point 8: keys, hosts and connections as APNs has them (docs/protocol.md §1.1, §1.3, §1.4, §7).
@Suite("Simulator fidelity: the fake APNs' hosts, keys and connections")
struct FakeAPNsFidelityTests {
    @Test("8 · device pushes, broadcasts and channel management are served on their own hosts; a client that mixes them gets 404 BadPath")
    func separateHosts() async throws {
        try await SimFixture.with { f in
            #expect(Set([f.sim.apnsURL, f.sim.broadcastURL, f.sim.managementURL]).count == 3)
            let auth = [("authorization", "bearer \(f.raw.jwt(iat: f.clock.now))")]
            let body = Array(#"{"message-storage-policy":0,"push-type":"LiveActivity"}"#.utf8)
            let onDeviceHost = try await f.raw.send("POST", "/1/apps/\(Pizza.bundleID)/channels", headers: auth, body: body, host: f.sim.apnsURL)
            #expect(onDeviceHost.status == 404 && onDeviceHost.reason == "BadPath")
            let created = try await f.raw.send("POST", "/1/apps/\(Pizza.bundleID)/channels", headers: auth, body: body)
            #expect(created.status == 201)
            let channel = try #require(created.header("apns-channel-id"))
            let push = Array(Pizza.update(f.clock.now).jsonBytes)
            let broadcastOnDevice = try await f.raw.send("POST", "/4/broadcasts/apps/\(Pizza.bundleID)", headers: Rules.bheaders(f, [("apns-channel-id", channel)]), body: push,
                                                         host: f.sim.apnsURL)
            #expect(broadcastOnDevice.status == 404)
            #expect(try await f.raw.send("POST", "/4/broadcasts/apps/\(Pizza.bundleID)", headers: Rules.bheaders(f, [("apns-channel-id", channel)]), body: push).status == 200)
            let deviceOnBroadcast = try await f.raw.send("POST", "/3/device/\(f.token)", headers: f.headers(), body: push, host: f.sim.broadcastURL)
            #expect(deviceOnBroadcast.status == 404)
        }
    }

    @Test("8 · a key pushes only to its bundles: TopicDisallowed for a device push, TopicMismatch for channels")
    func keyBoundToBundles() async throws {
        try await SimFixture.with { f in
            let other = try RawAPNs(sim: f.sim, keyID: "KEY0000002", teamID: "TEAM000001", register: false)
            try f.sim.apns.register(RegisteredKey(keyID: other.keyID, teamID: other.teamID, publicKeyPEM: other.key.publicKey.pemRepresentation, bundleIDs: ["com.example.other"]))
            let push = Array(Pizza.update(f.clock.now).jsonBytes)
            let h = f.headers(jwt: other.jwt(iat: f.clock.now))
            let device = try await other.send("/3/device/\(f.token)", headers: h, body: push)
            #expect(device.status == 400 && device.reason == "TopicDisallowed")
            let channels = try await other.send("POST", "/1/apps/\(Pizza.bundleID)/channels", headers: [("authorization", "bearer \(other.jwt(iat: f.clock.now))")],
                                                body: Array(#"{"message-storage-policy":0,"push-type":"LiveActivity"}"#.utf8))
            #expect(channels.status == 403 && channels.reason == "TopicMismatch")
            try await other.shutdown()
        }
    }

    @Test("8 · one connection, one key: a second, topic-specific key of the team is UnrelatedKeyIdInToken")
    func unrelatedKey() async throws {
        try await SimFixture.with { f in
            let push = Array(Pizza.update(f.clock.now).jsonBytes)
            #expect(try await f.raw.send("/3/device/\(f.token)", headers: f.headers(), body: push).status == 200)
            let second = P256.Signing.PrivateKey()
            try f.sim.apns.register(RegisteredKey(keyID: "KEY0000003", teamID: f.raw.teamID, publicKeyPEM: second.publicKey.pemRepresentation, bundleIDs: [Pizza.bundleID]))
            let h = f.headers(jwt: f.raw.jwt(iat: f.clock.now, kid: "KEY0000003", signer: second))
            let r = try await f.raw.send("/3/device/\(f.token)", headers: h, body: push)
            #expect(r.status == 403 && r.reason == "UnrelatedKeyIdInToken")
        }
    }

    @Test("8 · after TooManyProviderTokenUpdates the connection is unusable until 20 minutes have passed")
    func unusableAfter429() async throws {
        try await SimFixture.with { f in
            let push = Array(Pizza.update(f.clock.now).jsonBytes)
            let first = f.raw.jwt(iat: f.clock.now)
            func send(_ jwt: String) async throws -> RawAPNs.Answer {
                try await f.raw.send("/3/device/\(f.token)", headers: f.headers(jwt: jwt), body: push)
            }
            #expect(try await send(first).status == 200)
            f.clock.advance(by: 60)
            #expect(try await send(f.raw.jwt(iat: f.clock.now)).status == 429)
            // Even the token that worked a minute ago: the connection is unusable for now.
            let again = try await send(first)
            #expect(again.status == 429 && again.reason == "TooManyProviderTokenUpdates")
            f.clock.advance(by: 19 * 60)
            #expect(try await send(first).status == 200)
        }
    }

    @Test("8 · one stream until a valid provider token: nothing runs beside the first request until it is validated")
    func oneStreamFirst() async throws {
        try await SimFixture.with { f in
            f.sim.apns.addFailure(FailureRule(token: nil, status: nil, remaining: 12, latencyMilliseconds: 30))
            let push = Array(Pizza.update(f.clock.now).jsonBytes)
            try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<12 { group.addTask { try await f.raw.send("/3/device/\(f.token)", headers: f.headers(), body: push).status } }
                for try await status in group { #expect(status == 200) }
            }
            let log = f.sim.apns.requestLog
            #expect(log.filter { !$0.afterValidToken }.allSatisfy { $0.concurrentStreams == 1 }, "\(log.map { ($0.connectionID, $0.concurrentStreams, $0.afterValidToken) })")
            #expect(log.map(\.concurrentStreams).max() ?? 0 > 1, "the limit is raised once a valid token was seen")
        }
    }
}
