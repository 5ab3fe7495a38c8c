import AsyncHTTPClient
import Foundation
import IsleClient
import IsleClientSimulator
import IsleCore
import IsleSimulator
import NIOCore
import NIOHTTP1

/// The scenario: the pizza-delivery story of WWDC23 10185. The app is Swift, as on a phone: it
/// calls ActivityKit (the simulator's `SimulatedActivityKit`) and IsleClient hands its tokens and
/// state to the server with the device key; the "backend" talks to the server's HTTP API with a
/// backend key; the server talks to the fake APNs over HTTP/2 + TLS. After each push the script reads what went over the wire (the
/// fake APNs' request log) and what the phone shows (the device's screen and event log) and checks
/// it against what the step should have reached.
actor Script {
    struct Endpoints: Sendable {
        var server: String
        var control: String
        var backendKey: String
        var deviceKey: String
        var widgetURL: String
        var keyID: String
        var teamID: String
        var publicKeyPEM: String
        /// The backend's registration ticket for an order key (what it hands the app with the order).
        var ticket: @Sendable (String) -> String?
    }

    let view: DemoView
    let options: Demo.Options
    let http: HTTPClient
    let e: Endpoints
    let favorite: FavoritePizza
    let waitForEnter: @Sendable () async -> Void
    /// The simulated phones, for the app's ActivityKit.
    let world: SimulatorWorld
    /// Where the app's IsleClient keeps its state between launches.
    let appStorage: String
    var app: DemoApp?
    /// The installation id the app's IsleClient chose.
    var installation = ""

    var device = ""
    var requestCursor = 0
    var eventCursor = 0
    var step = 0

    static let bundleID = Demo.bundleID
    static let type = "PizzaDeliveryAttributes"
    static let user = "user-1"

    init(view: DemoView, options: Demo.Options, http: HTTPClient, endpoints: Endpoints, favorite: FavoritePizza, world: SimulatorWorld, appStorage: String,
         waitForEnter: @escaping @Sendable () async -> Void) {
        self.world = world
        self.appStorage = appStorage
        self.view = view
        self.options = options
        self.http = http
        self.e = endpoints
        self.favorite = favorite
        self.waitForEnter = waitForEnter
    }

    // MARK: The story

    func play() async throws {
        try await setUp()
        try await step1()
        try await step2()
        try await step3()
        try await step4()
        try await step5()
        try await step6()
        try await step7()
        try await step8()
        await app?.stop()
        let metrics = try await call(.GET, e.server + "/metrics")
        try await showDeviceEvents()
        view.finish(steps: step, metrics: metrics.text)
    }

    /// The phone and its app, the provider key the fake APNs trusts. Not a numbered step.
    func setUp() async throws {
        view.heading(0, "Setting up: one simulated iPhone with the pizza app", now: try await now())
        _ = try await control(.POST, "/keys", ["keyID": .string(e.keyID), "teamID": .string(e.teamID), "publicKeyPEM": .string(e.publicKeyPEM)], expect: 201,
                              says: "the fake APNs trusts provider key \(e.keyID) of team \(e.teamID)", actor: "setup")
        let d = try await control(.POST, "/devices", ["name": "iPhone"], expect: 201, says: "a simulated iPhone", actor: "setup")
        device = d.json["id"]?.stringValue ?? ""
        let schema = try JSONParser.parse(Array(Demo.schemaText.utf8))
        _ = try await control(.POST, "/devices/\(device)/apps", ["bundleID": .string(Self.bundleID), "schemas": [schema], "widgets": [["kind": "favorite", "url": .string(e.widgetURL)]]],
                              expect: 201, says: "\(Self.bundleID) installed, with a \"favorite pizza\" widget", actor: "setup")
        _ = try await control(.POST, "/devices/\(device)/apps/\(Self.bundleID)/widgets/reload", [:], expect: 200, says: "the widget loads its first timeline")
        // The app launches: IsleClient registers the installation on its own (push-to-start token,
        // settings, environment) and tracks every pizza activity by its order number.
        let view = self.view
        guard let serverURL = URL(string: e.server) else { throw fail("a server URL", found: e.server) }
        let app = try await DemoApp(world: world, device: device, bundleID: Self.bundleID, serverURL: serverURL, deviceKey: e.deviceKey, storage: appStorage, ticket: e.ticket) { entry in
            view.sdk(report: entry.report, method: entry.method, path: entry.path, status: entry.status, outcome: entry.outcome)
        }
        self.app = app
        installation = await app.client.installationID
        view.activityKit("IsleClient(serverURL:deviceKey:ticket: { the backend's ticket for the order }) · track(activitiesOf: PizzaDeliveryAttributes.self) { $0.attributes.orderNumber } · trackWidgetPushToken(WidgetKitPushTokens())",
                         says: "the app launches and hands ActivityKit to IsleClient")
        _ = try await until("IsleClient registered the installation") { () async -> Bool? in await app.client.pendingReports == 0 ? true : nil }
        try await showScreen()
    }

    func step1() async throws {
        try await begin(1, "The app starts a Live Activity for order 12345")
        let t = try await now()
        let started = try activityKit { app in try app.startOrder("12345", pizzas: 3, total: "$42.00", driver: "Bill James", until: t.addingTimeInterval(25 * 60), now: t) }
        view.activityKit("Activity<PizzaDeliveryAttributes>.request(attributes:content:pushType: .token)", says: "starts a Live Activity for order 12345")
        try await registered(started.id, "12345")
        _ = try await backend(.PUT, "/v1/installations/\(installation)/user", ["userID": .string(Self.user)], expect: 200,
                              says: "binds the installation to its customer \(Self.user) (the device never says who it is)")
        let s = try await showScreen()
        try check(s.lockScreen.count == 1 && s.lockScreen.first?.driver == "Bill James", "the Lock Screen shows order 12345 with Bill James", found: s.summary)
        try check(s.dynamicIsland == .compact, "the Dynamic Island shows it compact", found: s.dynamicIsland.rawValue)
    }

    func step2() async throws {
        try await begin(2, "The backend sends ETA changes (priority 5), then an alerting update")
        try await advance(3 * 60, "the driver is on the way")
        var t = try await now()
        var r = try await backend(.POST, "/v1/activities/by-key/12345/update", ["contentState": Self.state("Bill James", t, t.addingTimeInterval(19 * 60))],
                                  says: "ETA: 19 minutes")
        try await delivered(r)
        try await advance(2 * 60, "traffic")
        t = try await now()
        r = try await backend(.POST, "/v1/activities/by-key/12345/update", ["contentState": Self.state("Bill James", t, t.addingTimeInterval(24 * 60))], says: "ETA: 24 minutes")
        let lows = try await delivered(r)
        try check(lows.allSatisfy { $0.priority == 5 }, "routine updates go out at priority 5", found: lows.map { "\($0.priority)" }.joined(separator: ", "))
        try await advance(60, "the order changes hands")
        t = try await now()
        r = try await backend(.POST, "/v1/activities/by-key/12345/update", [
            "contentState": Self.state("Anne Johnson", t, t.addingTimeInterval(25 * 60)),
            "alert": ["title": "Delivery Update", "body": "Your pizza order will arrive in 25 minutes", "sound": "default"],
        ], says: "alert \"Delivery Update\", driver Anne Johnson")
        let alerted = try await delivered(r)
        try check(alerted.first?.priority == 10, "an alert goes out at priority 10", found: alerted.map { "\($0.priority)" }.joined())
        let s = try await showScreen()
        try check(s.lockScreen.first?.driver == "Anne Johnson", "the Lock Screen shows Anne Johnson", found: s.summary)
        try check(s.lockScreen.first?.alertTitle == "Delivery Update", "the phone showed the alert \"Delivery Update\"", found: s.lockScreen.first?.alertTitle ?? "no alert")
        try check(s.dynamicIsland == .expanded, "the Dynamic Island expands for the alert", found: s.dynamicIsland.rawValue)
    }

    func step3() async throws {
        try await begin(3, "A burst of priority-10 updates exceeds the device's hourly budget")
        try await advance(60, "the driver is stuck in traffic; the backend asks for priority 10 on every update")
        let t = try await now()
        var wire: [WireRecord] = []
        let burst = 18
        view.request(actor: "backend", method: "POST", path: "/v1/activities/by-key/12345/update", status: 202,
                     says: "\(burst) updates, one after another, each asking for priority 10", channel: "isle")
        for i in 1...burst {
            let eta = t.addingTimeInterval(Double(25 * 60 - i * 20))
            let r = try await backend(.POST, "/v1/activities/by-key/12345/update", ["contentState": Self.state("Anne Johnson", t, eta), "priority": 10],
                                      says: "update \(i) of \(burst), priority 10 requested", compact: true)
            wire += try await delivered(r, compact: "\(i)/\(burst)")
        }
        let downgraded = wire.filter { $0.priority == 5 }.count
        let sentHigh = wire.filter { $0.priority == 10 }.count
        view.note("Isle sent \(sentHigh) at priority 10 and downgraded \(downgraded) to priority 5: with the alert, the app on this phone (all its activities together, as Isle counts the budget) had used its \(sentHigh + 1) priority-10 pushes for this hour.")
        try check(downgraded > 0, "the server downgraded the pushes beyond the budget", found: "\(downgraded) downgraded")
        let outcomes = wire.compactMap(\.outcome)
        try check(!outcomes.contains("throttled"), "the device throttled none of them", found: outcomes.joined(separator: ", "))
        let s = try await showScreen()
        let newest = Self.reference(t.addingTimeInterval(Double(25 * 60 - burst * 20)))
        try check(s.lockScreen.first?.deliveryEnd == newest, "the phone shows the newest content (the last ETA)", found: s.summary)
    }

    func step4() async throws {
        try await begin(4, "A stale date passes without updates")
        var t = try await now()
        let r = try await backend(.POST, "/v1/activities/by-key/12345/update", [
            "contentState": Self.state("Anne Johnson", t, t.addingTimeInterval(15 * 60)), "staleDate": .int(Int64(t.addingTimeInterval(10 * 60).timeIntervalSince1970)),
        ], says: "ETA 15 minutes, stale in 10 minutes unless updated")
        try await delivered(r)
        try await advance(15 * 60, "15 minutes pass: the driver's phone lost signal, no updates")
        var s = try await showScreen()
        try check(s.lockScreen.first?.isStale == true, "the activity shows as stale", found: s.summary)
        t = try await now()
        let again = try await backend(.POST, "/v1/activities/by-key/12345/update", ["contentState": Self.state("Anne Johnson", t, t.addingTimeInterval(3 * 60))],
                                      says: "the driver is back online: ETA 3 minutes")
        try await delivered(again)
        s = try await showScreen()
        try check(s.lockScreen.first?.isStale == false, "the next update clears the stale state", found: s.summary)
    }

    func step5() async throws {
        try await begin(5, "The order is delivered: end, dismissed 30 minutes later")
        try await advance(3 * 60, "the pizza arrives")
        let t = try await now()
        let r = try await backend(.POST, "/v1/activities/by-key/12345/end", [
            "contentState": Self.state("Anne Johnson", t, t), "dismissalDate": .int(Int64(t.addingTimeInterval(30 * 60).timeIntervalSince1970)),
        ], says: "end with the final state; dismissal date in 30 minutes")
        try await delivered(r)
        var s = try await showScreen()
        try check(s.lockScreen.first?.state == "ended", "the ended activity stays on the Lock Screen", found: s.summary)
        try check(s.dynamicIsland == .none, "the Dynamic Island is empty once the activity ended", found: s.dynamicIsland.rawValue)
        try await advance(30 * 60 + 1, "30 minutes pass")
        s = try await showScreen()
        try check(s.lockScreen.isEmpty, "the activity left the Lock Screen at its dismissal date", found: s.summary)
        // ActivityKit reported the dismissal to the app; IsleClient passed it on.
        _ = try await until("IsleClient reported the dismissal") { () async -> Bool? in await self.app?.client.pendingReports == 0 ? true : nil }
        let record = try await backend(.GET, "/v1/activities/by-key/12345", nil, expect: 200, says: "reads the order's activity")
        try check(record.json["state"]?.stringValue == "dismissed", "the server's record says dismissed (IsleClient reported it)", found: record.json["state"]?.jsonString ?? "nothing")
    }

    func step6() async throws {
        try await begin(6, "Two orders at once: started by the app and by push-to-start")
        try await advance(10 * 60, "a new order from the app")
        var t = try await now()
        let second = try activityKit { app in
            try app.startOrder("12346", pizzas: 1, total: "$14.00", driver: "Bill James", until: t.addingTimeInterval(30 * 60), now: t, relevance: 50)
        }
        view.activityKit("Activity<PizzaDeliveryAttributes>.request(attributes:content:pushType: .token), relevance 50", says: "starts a Live Activity for order 12346")
        try await registered(second.id, "12346")
        var s = try await showScreen()
        try check(s.dynamicIsland == .compact, "one live activity: the Dynamic Island is compact", found: s.dynamicIsland.rawValue)

        try await advance(60, "a second order, 12347, is placed on the website")
        t = try await now()
        let started = try await backend(.POST, "/v1/users/\(Self.user)/start", [
            "attributesType": .string(Self.type), "externalKey": "12347", "attributes": Self.attributes(order: "12347", pizzas: 2, total: "$28.00"),
            "contentState": Self.state("Bill James", t, t.addingTimeInterval(40 * 60)), "relevanceScore": 100,
            "alert": ["title": "Order 12347", "body": "Your second order is in the oven", "sound": "default"],
        ], says: "push-to-start order 12347 on the user's phone (relevance 100)")
        try await delivered(started)
        // The app, launched in the background, sees the new activity on activityUpdates and its
        // IsleClient hands the token over: the server links it to its `starting` record.
        let d = try await control(.GET, "/devices/\(device)")
        let pushed = d.json["activities"]?.arrayValue?.first { $0["attributes"]?["orderNumber"]?.stringValue == "12347" }
        guard let pushedID = pushed?["id"]?.stringValue else { throw fail("the push-started activity is on the phone", found: "no activity") }
        try await registered(pushedID, "12347")
        s = try await showScreen()
        try check(s.lockScreen.count == 2, "two activities on the Lock Screen", found: s.summary)
        try await advance(10, "the alert's expanded presentation ends")
        t = try await now()
        let update = try await backend(.POST, "/v1/activities/by-key/12347/update", ["contentState": Self.state("Bill James", t, t.addingTimeInterval(35 * 60))],
                                       says: "updates order 12347 with the token the app handed back")
        try await delivered(update)
        s = try await showScreen()
        try check(s.dynamicIsland == .minimal, "two live activities: the Dynamic Island goes minimal", found: s.dynamicIsland.rawValue)
        try check(s.lockScreen.map(\.order) == ["12347", "12346"], "the Lock Screen orders them by relevance score (100 before 50)", found: s.lockScreen.map(\.order).joined(separator: ", "))
        try check(s.lockScreen.first?.deliveryEnd == Self.reference(t.addingTimeInterval(35 * 60)), "order 12347 shows the update sent to its new token", found: s.summary)
    }

    func step7() async throws {
        try await begin(7, "The \"favorite pizza\" widget reloads on a widgets push")
        favorite.set("Diavola")
        view.note("The backend's favorite pizza is now Diavola (the widget's timeline source).")
        let r = try await backend(.POST, "/v1/installations/\(installation)/widgets/reload", [:], says: "reload the installation's widgets")
        let wire = try await delivered(r)
        try check(wire.first?.pushType == "widgets", "a widgets push went over the wire", found: wire.first?.pushType ?? "nothing")
        let s = try await until("the widget shows Diavola") { () async throws -> ScreenView? in
            let s = try await self.screen()
            return s.widgets.first?.pizza == "Diavola" ? s : nil
        }
        view.screen(s)
        try check(s.widgets.first?.pizza == "Diavola", "the widget shows its new timeline entry: Diavola", found: s.widgets.first?.pizza ?? "nothing")
    }

    /// Match night: two fans' phones, one on iOS 17 and one on iOS 18, follow a match with
    /// IsleClient's `follow(topic:)`; one backend call scores for both — a broadcast to the match's
    /// channel (iOS 18) and a push to the older phone's token (docs/server.md, "Topics as audiences").
    func step8() async throws {
        try await begin(8, "Match night: phones on iOS 17 and iOS 18 follow a match; one backend call scores for both")
        let topic = "match-night"
        _ = try await backend(.PUT, "/v1/topics/\(topic)", ["storagePolicy": 1], expect: 200,
                              says: "open the match as an audience: a broadcast channel for iOS 18 and later (made when the first fan asks), tokens before")
        let schemas = [try JSONParser.parse(Array(Demo.schemaText.utf8)), try JSONParser.parse(Array(Demo.matchSchemaText.utf8))]
        guard let serverURL = URL(string: e.server) else { throw fail("a server URL", found: e.server) }
        var fans: [(name: String, device: String, app: FanApp, following: Following<SimulatedLiveActivities<FanApp.MatchAttributes, FanApp.Score>.Handle>)] = []
        for (name, os, model) in [("Ana's iPhone", "17.5", "iPhone 14"), ("Ben's iPhone", "18.2", "iPhone 16")] {
            let d = try await control(.POST, "/devices", ["name": .string(name), "osVersion": .string(os), "model": .string(model)], expect: 201,
                                      says: "\(name), on iOS \(os)", actor: "setup")
            let id = d.json["id"]?.stringValue ?? ""
            _ = try await control(.POST, "/devices/\(id)/apps", ["bundleID": .string(Self.bundleID), "schemas": .array(schemas)], expect: 201,
                                  says: "the app installed on \(name)", actor: "setup")
            let view = self.view
            let app = try await FanApp(world: world, device: id, bundleID: Self.bundleID, serverURL: serverURL, deviceKey: e.deviceKey,
                                       storage: appStorage + "-\(id)", channels: (Int(os.split(separator: ".")[0]) ?? 0) >= 18) { entry in
                view.sdk(report: entry.report, method: entry.method, path: entry.path, status: entry.status, outcome: entry.outcome)
            }
            let following = try await app.follow(topic: topic, home: "Pizzeria FC", away: "Calzone United")
            switch following.pushType {
            case .channel(let channel): view.activityKit("isle.follow(topic: \"\(topic)\", …) → Activity.request(…, pushType: .channel(\"\(channel)\"))", says: "\(name) follows the match on its broadcast channel")
            case .token: view.activityKit("isle.follow(topic: \"\(topic)\", …) → Activity.request(…, pushType: .token)", says: "\(name) follows the match by token (no broadcast channels before iOS 18)")
            }
            fans.append((name, id, app, following))
        }
        try check(fans[0].following.pushType == .token, "the iOS 17 phone follows by token", found: "\(fans[0].following.pushType)")
        guard case .channel = fans[1].following.pushType else { throw fail("the iOS 18 phone follows on the match's channel", found: "\(fans[1].following.pushType) \(fans[1].following.tokenReason ?? "")") }
        view.check(ok: true, "the iOS 18 phone follows on the match's channel", found: nil)
        for fan in fans {
            _ = try await until("\(fan.name)'s app registered its activity") { () async -> Bool? in
                let id = await fan.app.client.serverID(of: fan.following.activity.id), pending = await fan.app.client.pendingReports
                return id != nil && pending == 0 ? true : nil
            }
        }
        // The channel's creation went to APNs' channel-management host as the first fan asked.
        requestCursor = try await requestLog().count
        let r = try await backend(.POST, "/v1/topics/\(topic)/update", ["contentState": ["home": 1, "away": 0], "alert": ["title": "Goal!", "body": "Pizzeria FC 1–0 Calzone United"]],
                                  says: "one call: the score")
        let audience = r.json["audience"]
        try check(audience == ["broadcasts": 1, "channelFollowers": 1, "tokenFollowers": 1], "one broadcast for the iOS 18 phone, one token push for the iOS 17 phone",
                  found: audience?.jsonString ?? r.text)
        let requests = try await until("the fake APNs receives the broadcast and the token push") { () async throws -> [WireRecord]? in
            let log = try await self.requestLog()
            return log.count - self.requestCursor >= 2 ? Array(log[self.requestCursor...]) : nil
        }
        requestCursor += requests.count
        for w in requests { view.wire(w, compact: nil) }
        try check(requests.allSatisfy { $0.status == 200 }, "APNs accepts both", found: requests.map { "\($0.status) \($0.reason ?? "")" }.joined(separator: ", "))
        for fan in fans {
            _ = try await until("\(fan.name) shows 1–0") { () async throws -> Bool? in
                let d = try await self.control(.GET, "/devices/\(fan.device)")
                let a = d.json["activities"]?.arrayValue?.first { $0["id"]?.stringValue == fan.following.activity.id }
                return a?["contentState"]?["home"] == 1 ? true : nil
            }
            view.check(ok: true, "\(fan.name) shows Pizzeria FC 1–0 Calzone United", found: nil)
            await fan.app.stop()
        }
    }

    // MARK: Steps, checks and time

    func begin(_ n: Int, _ title: String) async throws {
        if options.step, step > 0 {
            view.prompt()
            await waitForEnter()
        }
        step = n
        view.heading(n, title, now: try await now())
    }

    func fail(_ expectation: String, found: String) -> Demo.Failure {
        let f = Demo.Failure(step: step, expectation: expectation, found: found)
        view.check(ok: false, expectation, found: found)
        return f
    }

    func check(_ ok: Bool, _ expectation: String, found: String) throws {
        guard ok else { throw fail(expectation, found: found) }
        view.check(ok: true, expectation, found: nil)
    }

    func now() async throws -> Date {
        let c = try await control(.GET, "/clock")
        guard let unix = c.json["unix"]?.numberValue?.doubleValue else { throw fail("the simulator reports its clock", found: c.text) }
        return Date(timeIntervalSince1970: unix)
    }

    /// Moves virtual time forward through the control API, paced by `--speed` (virtual seconds
    /// per real second), and shows what the phone did meanwhile.
    func advance(_ seconds: TimeInterval, _ why: String) async throws {
        view.time(seconds, why)
        var left = seconds
        while left > 0 {
            let tick = min(left, 60)
            if options.speed.isFinite { try await Task.sleep(for: .milliseconds(Int((tick / options.speed * 1000).rounded()))) }
            _ = try await control(.POST, "/clock/advance", ["seconds": .double(tick)], expect: 200)
            left -= tick
        }
        try await showDeviceEvents()
    }

    func until<T: Sendable>(_ what: String, within: Duration = .seconds(20), _ probe: () async throws -> T?) async throws -> T {
        let deadline = ContinuousClock.now + within
        while true {
            if let v = try await probe() { return v }
            guard ContinuousClock.now < deadline else { throw fail(what, found: "not reached within \(within)") }
            try await Task.sleep(for: .milliseconds(10))
        }
    }

    // MARK: Deliveries

    /// Waits until the server has sent every push the request queued, then shows what went over
    /// the wire and what the phone did with it.
    @discardableResult
    func delivered(_ reply: Reply, compact: String? = nil) async throws -> [WireRecord] {
        let jobs = Set(reply.json["jobs"]?.arrayValue?.compactMap { $0.numberValue.map { Int64($0.doubleValue) } } ?? [])
        var activityIDs = reply.json["activityID"]?.stringValue.map { [$0] } ?? []
        activityIDs += reply.json["activities"]?.arrayValue?.compactMap { $0["activityID"]?.stringValue } ?? []
        let expected = max(jobs.count, activityIDs.count, 1)
        if !activityIDs.isEmpty {
            for id in activityIDs {
                _ = try await until("the server records the delivery for \(id)") { () async throws -> Bool? in
                    let a = try await self.call(.GET, self.e.server + "/v1/activities/\(id)", key: self.e.backendKey)
                    let ds = a.json["deliveries"]?.arrayValue ?? []
                    let done = jobs.isEmpty ? !ds.isEmpty : jobs.isSubset(of: Set(ds.compactMap { $0["jobID"]?.numberValue.map { Int64($0.doubleValue) } }))
                    return done ? true : nil
                }
            }
        }
        let requests = try await until("the fake APNs receives \(expected) push\(expected == 1 ? "" : "es")") { () async throws -> [WireRecord]? in
            let log = try await self.requestLog()
            return log.count - self.requestCursor >= expected ? Array(log[self.requestCursor...]) : nil
        }
        requestCursor += requests.count
        for w in requests { view.wire(w, compact: compact) }
        for w in requests where w.status != 200 {
            throw fail("APNs accepts the push", found: "\(w.status) \(w.reason ?? "")")
        }
        if compact == nil { try await showDeviceEvents(skippingPushes: true) } else { eventCursor = try await events().count }
        return requests
    }

    func requestLog() async throws -> [WireRecord] {
        let r = try await control(.GET, "/requests")
        return (r.json.arrayValue ?? []).map(WireRecord.init)
    }

    func events() async throws -> [JSONValue] {
        try await control(.GET, "/devices/\(device)/events").json.arrayValue ?? []
    }

    /// Device events the wire lines did not already show: what the app and the system did.
    func showDeviceEvents(skippingPushes: Bool = false) async throws {
        let all = try await events()
        guard all.count > eventCursor else { return }
        for ev in all[eventCursor...] where !(skippingPushes && ev["source"]?.stringValue == "push") {
            view.deviceEvent(source: ev["source"]?.stringValue ?? "", outcome: ev["outcome"]?["code"]?.stringValue, message: ev["message"]?.stringValue ?? "")
        }
        eventCursor = all.count
    }

    // MARK: Screen

    func screen() async throws -> ScreenView {
        ScreenView(try await control(.GET, "/devices/\(device)/screen").json)
    }

    @discardableResult
    func showScreen() async throws -> ScreenView {
        let s = try await screen()
        view.screen(s)
        return s
    }

    // MARK: HTTP

    struct Reply: Sendable {
        var status: Int
        var json: JSONValue
        var text: String
    }

    func call(_ method: HTTPMethod, _ url: String, key: String? = nil, body: JSONValue? = nil, idempotent: Bool = false, headers: [(String, String)] = []) async throws -> Reply {
        var request = HTTPClientRequest(url: url)
        request.method = method
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        if let key { request.headers.add(name: "Authorization", value: "Bearer \(key)") }
        if idempotent { request.headers.add(name: "Idempotency-Key", value: "demo-" + UUID().uuidString.lowercased()) }
        if let body {
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(bytes: body.jsonBytes))
        }
        let response = try await http.execute(request, timeout: .seconds(15))
        let bytes = try await response.body.collect(upTo: 32 << 20)
        let text = String(buffer: bytes)
        let json = bytes.readableBytes == 0 ? JSONValue.null : ((try? JSONParser.parse(Array(buffer: bytes))) ?? .null)
        return Reply(status: Int(response.status.code), json: json, text: text)
    }

    /// The simulator's control API: what the phone and its app do.
    func control(_ method: HTTPMethod, _ path: String, _ body: JSONValue? = nil, expect: Int = 200, says: String? = nil, actor: String = "app") async throws -> Reply {
        let r = try await call(method, e.control + path, body: body)
        if let says { view.request(actor: actor, method: method.rawValue, path: path, status: r.status, says: says, channel: "simulator") }
        guard r.status == expect else { throw fail("\(method.rawValue) \(path) answers \(expect)", found: "\(r.status) \(Self.errorText(r))") }
        if says != nil, !device.isEmpty { try await showDeviceEvents() }
        return r
    }

    /// Runs an ActivityKit call of the app's.
    func activityKit<T>(_ call: (DemoApp) throws -> T) throws -> T {
        guard let app else { throw fail("the app is running", found: "no app") }
        return try call(app)
    }

    /// Waits until the app's IsleClient has handed `activity`'s token to the server, and shows
    /// what the server now knows of the order.
    func registered(_ activity: String, _ order: String) async throws {
        guard let app else { throw fail("the app is running", found: "no app") }
        try await showDeviceEvents()
        _ = try await until("IsleClient registered order \(order) with the server") { () async -> Bool? in
            let id = await app.client.serverID(of: activity), pending = await app.client.pendingReports
            return id != nil && pending == 0 ? true : nil
        }
        let record = try await backend(.GET, "/v1/activities/by-key/\(order)", nil, expect: 200, says: "reads order \(order) by its own key", compact: true)
        try check(record.json["hasToken"] == true && record.json["state"] == "active", "the server holds order \(order)'s update token (active)",
                  found: "\(record.json["state"]?.jsonString ?? "nothing"), hasToken \(record.json["hasToken"]?.jsonString ?? "nothing")")
    }

    /// The server's API with the backend key: what the pizza shop's backend does.
    func backend(_ method: HTTPMethod, _ path: String, _ body: JSONValue?, expect: Int = 202, says: String, compact: Bool = false) async throws -> Reply {
        let r = try await call(method, e.server + path, key: e.backendKey, body: body, idempotent: method != .GET)
        if !compact { view.request(actor: "backend", method: method.rawValue, path: path, status: r.status, says: says, channel: "isle") }
        guard r.status == expect else { throw fail("\(method.rawValue) \(path) answers \(expect)", found: "\(r.status) \(Self.errorText(r))") }
        return r
    }

    static func errorText(_ r: Reply) -> String {
        if let m = r.json["error"]?["message"]?.stringValue { return m }
        return String(r.text.prefix(300))
    }

    // MARK: Content

    /// Seconds since 2001: how `JSONEncoder` encodes a `Date` in content-state.
    static func reference(_ d: Date) -> Int64 { Int64(d.timeIntervalSinceReferenceDate.rounded(.down)) }

    static func state(_ driver: String, _ from: Date, _ to: Date) -> JSONValue {
        ["driverName": .string(driver), "deliveryTimer": [.int(reference(from)), .int(reference(to))]]
    }

    static func attributes(order: String, pizzas: Int, total: String) -> JSONValue {
        ["numberOfPizzas": .int(pizzas), "totalAmount": .string(total), "orderNumber": .string(order)]
    }
}

/// One request the fake APNs received, as its request log reports it.
struct WireRecord: Sendable {
    var path: String
    var pushType: String
    var priority: Int
    var apnsID: String
    var status: Int
    var reason: String?
    var outcome: String?
    var sentence: String?
    /// The payload's `aps.event` (`start`, `update`, `end`), if any.
    var event: String?

    init(_ json: JSONValue) {
        path = json["path"]?.stringValue ?? ""
        var headers: [String: String] = [:]
        for pair in json["headers"]?.arrayValue ?? [] {
            if let p = pair.arrayValue, p.count == 2, let k = p[0].stringValue, let v = p[1].stringValue { headers[k.lowercased()] = v }
        }
        pushType = headers["apns-push-type"] ?? "?"
        priority = headers["apns-priority"].flatMap { Int($0) } ?? 10
        apnsID = json["apnsID"]?.stringValue ?? headers["apns-id"] ?? ""
        status = json["status"]?.numberValue.map { Int($0.doubleValue) } ?? 0
        reason = json["reason"]?.stringValue
        outcome = json["outcome"]?["code"]?.stringValue
        sentence = json["outcome"]?["sentence"]?.stringValue
        event = json["body"]?.stringValue.flatMap { try? JSONParser.parse(Array($0.utf8)) }?["aps"]?.objectValue
            .flatMap { try? LiveActivityPayload(aps: $0, timestamp: Date(timeIntervalSince1970: 0)) }?.event.rawValue
    }
}

/// What the phone shows, read from the control API's `/screen`.
struct ScreenView: Sendable {
    struct Item: Sendable {
        var order: String
        var pizzas: Int
        var total: String
        var driver: String
        var deliveryStart: Int64?
        var deliveryEnd: Int64?
        var state: String
        var isStale: Bool
        var relevance: Double
        var alertTitle: String?
    }
    struct Widget: Sendable {
        var kind: String
        var pizza: String?
        var reloads: Int
    }
    enum Island: String, Sendable { case none, compact, minimal, expanded }

    var time: Date
    var lockScreen: [Item]
    var dynamicIsland: Island
    var widgets: [Widget]

    init(_ json: JSONValue) {
        time = json["time"]?.stringValue.flatMap { ISO8601DateFormatter().date(from: $0) } ?? Date()
        lockScreen = (json["lockScreen"]?.arrayValue ?? []).map { i in
            let timer = i["contentState"]?["deliveryTimer"]?.arrayValue
            return Item(order: i["attributes"]?["orderNumber"]?.stringValue ?? "?", pizzas: i["attributes"]?["numberOfPizzas"]?.numberValue.map { Int($0.doubleValue) } ?? 0,
                        total: i["attributes"]?["totalAmount"]?.stringValue ?? "", driver: i["contentState"]?["driverName"]?.stringValue ?? "",
                        deliveryStart: timer?.first?.numberValue.map { Int64($0.doubleValue) }, deliveryEnd: timer?.last?.numberValue.map { Int64($0.doubleValue) },
                        state: i["state"]?.stringValue ?? "", isStale: i["isStale"]?.boolValue ?? false, relevance: i["relevanceScore"]?.numberValue?.doubleValue ?? 0,
                        alertTitle: i["lastAlert"]?["title"]?.stringValue)
        }
        dynamicIsland = json["dynamicIsland"]?.stringValue.flatMap(Island.init(rawValue:)) ?? .none
        widgets = (json["widgets"]?.arrayValue ?? []).map {
            Widget(kind: $0["kind"]?.stringValue ?? "", pizza: $0["entry"]?["content"]?["pizza"]?.stringValue, reloads: $0["reloadCount"]?.numberValue.map { Int($0.doubleValue) } ?? 0)
        }
    }

    var summary: String {
        lockScreen.isEmpty ? "an empty Lock Screen" : lockScreen.map { "\($0.order) \($0.state)\($0.isStale ? " (stale)" : "") \($0.driver)" }.joined(separator: "; ")
    }
}
