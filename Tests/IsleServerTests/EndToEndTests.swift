import Foundation
import IsleCore
import IsleServer
import IsleSimulator
import IsleStore
import IsleDelivery
import IsleTesting
import Testing

@Suite("Isle server end to end with IsleSimulator", .serialized)
struct EndToEndTests {
    @Test("register → update → the simulated device shows the new content; the delivery is recorded")
    func registerAndUpdate() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-12345")
            let r = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: [
                "contentState": Pizza.state("Anne Johnson"), "alert": ["title": "Delivery Update", "body": "Your pizza order will arrive in 25 minutes"],
            ])
            #expect(r.status == 202)
            try await f.waitForDevice("Anne on the Lock Screen") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "Anne Johnson" }
            let shown = try #require(try f.deviceActivity(a.id))
            #expect(shown.lastAlert?.title == "Delivery Update")
            try await eventually("the delivery recorded") {
                try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["deliveries"]?.arrayValue?.first?["status"] == 200
            }
            let view = try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey)
            #expect(view.json["contentState"]?["driverName"] == "Anne Johnson")
            let delivery = try #require(view.json["deliveries"]?.arrayValue?.first)
            #expect(delivery["priority"] == 10)
            let apnsID = try #require(delivery["apnsID"]?.stringValue)
            #expect(try await f.call("GET", "/v1/deliveries/\(apnsID)", key: f.backendKey).json["status"] == 200)
            // The device logged the same apns-id.
            #expect(try f.sim.world.device(f.device).events.contains { $0.apnsID == apnsID && $0.outcome?.code == .applied })
        }
    }

    @Test("end with a final state and a dismissal date; nothing more is accepted")
    func endWithDismissal() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-1")
            let r = try await f.call("POST", "/v1/activities/by-key/order-1/end", key: f.backendKey, body: [
                "contentState": Pizza.state("Delivered"), "dismissalDate": .int(Int64(f.clock.now.addingTimeInterval(1800).timeIntervalSince1970)),
            ])
            #expect(r.status == 202)
            try await f.waitForDevice("ended on the device") { d in d.activities.first { $0.id == a.id }?.state == .ended }
            #expect(try f.deviceActivity(a.id)?.contentState["driverName"] == "Delivered")
            f.clock.advance(by: 1800)
            #expect(try f.deviceActivity(a.id)?.state == .dismissed)
            try await eventually("the server records the end") { try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["state"] == "ended" }
            let late = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Late")])
            #expect(late.status == 409 && late.json["error"]?["code"] == "activityNotLive")
        }
    }

    @Test("push-to-start, then updates with the token the device hands back")
    func pushToStart() async throws {
        try await ServerFixture.with { f in
            let app = try f.sim.world.app(Pizza.bundleID, on: f.device)
            let ptsToken = try #require(app.pushToStartTokens["PizzaDeliveryAttributes"])
            let registered = try await f.call("PUT", "/v1/installations/inst-1", key: f.deviceKey, body: [
                "pushToStartTokens": ["PizzaDeliveryAttributes": .string(ptsToken)], "widgetToken": .string(app.widgetPushToken!),
            ])
            #expect(registered.status == 200)
            let secret = try #require(registered.json["installationSecret"]?.stringValue)
            #expect(try await f.call("PUT", "/v1/installations/inst-1/user", key: f.backendKey, body: ["userID": "user-42"]).status == 200)
            let start = try await f.call("POST", "/v1/users/user-42/start", key: f.backendKey, body: [
                "attributesType": "PizzaDeliveryAttributes", "attributes": Pizza.attributes, "contentState": Pizza.state("Bill James"),
                "alert": ["title": "Order 12345", "body": "In the oven"], "externalKey": "order-12345",
            ])
            #expect(start.status == 202, "\(start.json.jsonString)")
            try await f.waitForDevice("the push-started activity") { d in d.activities.contains { $0.startedBy == .push } }
            let started = try #require(try f.sim.world.device(f.device).activities.first { $0.startedBy == .push })
            // The app hands its update token back, matched by the backend's key.
            // Someone else with the (public) device key cannot take it over by its key: without an
            // installation it is refused outright; on an installation of its own, without the
            // backend's ticket for the key.
            let thief = try await f.call("POST", "/v1/activities", key: f.deviceKey, body: [
                "attributesType": "PizzaDeliveryAttributes", "token": .string(String(repeating: "ee", count: 40)), "externalKey": "order-12345",
            ])
            #expect(thief.status == 400 && thief.json["error"]?["field"] == "installationID" && thief.json["error"]?["attributes"] == nil, "\(thief.json.jsonString)")
            let thief2 = try await f.register(["attributesType": "PizzaDeliveryAttributes", "token": .string(String(repeating: "ee", count: 40)), "externalKey": "order-12345"],
                                              installation: "thief", ticket: "")
            #expect(thief2.status == 403 && thief2.json["error"]?["code"] == "ticketRequired" && thief2.json["error"]?["field"] == "ticket", "\(thief2.json.jsonString)")
            let link = try await f.call("POST", "/v1/activities", key: f.deviceKey, body: [
                "attributesType": "PizzaDeliveryAttributes", "token": .string(try await f.sim.world.waitForPushToken(activityID: started.id, on: f.device)), "externalKey": "order-12345", "installationID": "inst-1",
            ], headers: [("Isle-Installation-Secret", secret)])
            #expect(link.status == 200, "\(link.json.jsonString)")
            #expect(link.json["state"] == "active")
            f.clock.advance(by: 5)
            #expect(try await f.call("POST", "/v1/activities/by-key/order-12345/update", key: f.backendKey, body: ["contentState": Pizza.state("Anne Johnson")]).status == 202)
            try await f.waitForDevice("the update on the push-started activity") { d in d.activities.first { $0.id == started.id }?.contentState["driverName"] == "Anne Johnson" }
            // And a widgets push reloads the widget.
            #expect(try await f.call("POST", "/v1/installations/inst-1/widgets/reload", key: f.backendKey).status == 202)
            try await f.waitForDevice("the widget reloaded") { d in d.apps[Pizza.bundleID]?.widgets.first?.reloadCount == 1 }
        }
    }

    @Test("topic fan-out to 1,000 activities")
    func fanOut() async throws {
        try await ServerFixture.with(configure: { $0.device.maximumActivitiesPerApp = 2000; $0.device.maximumActivitiesPerDevice = 2000 }) { f in
            var ids: [String] = []
            for i in 0..<1000 {
                let a = try f.sim.world.requestActivity(bundleID: Pizza.bundleID, on: f.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state("Bill"))
                // At most 20 live activities per installation (the quota): 50 installations.
                let r = try await f.register([
                    "attributesType": "PizzaDeliveryAttributes", "token": .string(try await f.sim.world.waitForPushToken(activityID: a.id, on: f.device)), "externalKey": .string("fan-\(i)"), "topics": ["match-7"],
                ], installation: "fan-\(i / 20)")
                #expect(r.status == 201)
                ids.append(a.id)
            }
            let r = try await f.call("POST", "/v1/topics/match-7/update", key: f.backendKey, body: ["contentState": Pizza.state("GOAL")])
            #expect(r.status == 202 && r.json["accepted"] == 1000)
            try await f.waitForDevice("all 1,000 updated", within: .seconds(120)) { d in d.activities.filter { $0.contentState["driverName"] == "GOAL" }.count == 1000 }
        }
    }

    @Test("a 410 retires the token: the activity is unreachable and nothing more is sent to it")
    func goneToken() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-410")
            try f.sim.world.userDismiss(activityID: a.id, on: f.device)
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Anyone?")]).status == 202)
            try await eventually("the activity marked unreachable") { try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["state"] == "unreachable" }
            let view = try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey)
            #expect(view.json["deliveries"]?.arrayValue?.first?["status"] == 410)
            #expect(view.json["stateReason"]?.stringValue?.contains("Unregistered") == true)
            let requests = f.sim.apns.requestLog.count
            let again = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Still?")])
            #expect(again.status == 409)
            #expect(f.sim.apns.requestLog.count == requests)
        }
    }

    @Test("a 503 burst delays but loses nothing")
    func burst() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "order-503")
            f.sim.apns.addFailure(FailureRule(status: 503, reason: "ServiceUnavailable", remaining: 3))
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("After the storm")]).status == 202)
            // Each retry waits (virtual) backoff; move time until it goes through.
            try await eventually(within: .seconds(30), "delivered after the burst") {
                if try f.deviceActivity(a.id)?.contentState["driverName"] == "After the storm" { return true }
                f.clock.advance(by: 2)
                return false
            }
            // The phone applies the push before the server has written APNs' answer: wait for the record.
            try await eventually(within: .seconds(10), "the delivery recorded") {
                try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["deliveries"]?.arrayValue?.count == 4
            }
            let deliveries = try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["deliveries"]?.arrayValue ?? []
            #expect(deliveries.map { $0["status"] } == [503, 503, 503, 200])
        }
    }

    @Test("crash mid-burst and restart: every accepted update reaches the device exactly once")
    func crashAndRestart() async throws {
        try await ServerFixture.with(configure: { $0.device.strictTimestamps = true; $0.device.hourlyBudget = 1000; $0.device.maximumActivitiesPerApp = 50; $0.device.maximumActivitiesPerDevice = 50 }) { f in
            var activities: [(SimulatedActivity, String)] = []
            for i in 0..<20 { activities.append(try await f.appStartsActivity(key: "crash-\(i)")) }
            // Slow APNs down so the crash lands while pushes are in flight.
            f.sim.apns.addFailure(FailureRule(status: nil, remaining: 30, latencyMilliseconds: 150))
            var accepted: [String: [String]] = [:]
            for round in 0..<3 {
                for (a, id) in activities {
                    let text = "r\(round)-\(a.id)"
                    let r = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: [
                        "contentState": Pizza.state(text), "alert": ["title": "Update", "body": .string(text)],
                    ])
                    #expect(r.status == 202)
                    accepted[a.id, default: []].append(text)
                }
            }
            await f.kill()  // mid-burst: jobs are claimed and in flight
            let counts = try await SQLiteStore(path: f.databasePath).jobCounts()
            #expect((counts[.claimed] ?? 0) + (counts[.queued] ?? 0) > 0, "the crash came after all the work: \(counts)")
            try await f.start()
            let expected = accepted.values.map(\.count).reduce(0, +)
            do {
                try await f.waitForDevice("every accepted update applied", within: .seconds(60)) { d in
                    d.events.filter { $0.outcome?.code == .applied }.count >= expected
                }
            } catch {
                let store = try SQLiteStore(path: f.databasePath)
                let events = try f.sim.world.device(f.device).events
                Issue.record("jobs: \(try await store.jobCounts()); device outcomes: \(Dictionary(grouping: events, by: { $0.outcome?.code.rawValue ?? "-" }).mapValues(\.count))")
                throw error
            }
            let events = try f.sim.world.device(f.device).events.filter { $0.outcome?.code == .applied }
            for (a, _) in activities {
                let applied = events.filter { $0.activityID == a.id }.compactMap(\.apnsID)
                #expect(applied.count == accepted[a.id]!.count, "activity \(a.id)")
                #expect(Set(applied).count == applied.count, "an update applied twice on \(a.id)")
                #expect(try f.deviceActivity(a.id)?.contentState["driverName"]?.stringValue == accepted[a.id]!.last)
            }
        }
    }
}

@Suite("Isle server API errors: a 4xx naming the field, never a 500", .serialized)
struct APIErrorTests {
    struct Case: Sendable, CustomTestStringConvertible {
        let method: String
        let path: String
        let key: String  // "backend", "device", "none", "bad"
        let body: String?
        let status: Int
        let field: String?
        var testDescription: String { "\(method) \(path) [\(key)] \(body ?? "") → \(status)" }
    }

    static let cases: [Case] = [
        Case(method: "POST", path: "/v1/activities/ID/update", key: "none", body: "{}", status: 401, field: nil),
        Case(method: "POST", path: "/v1/activities/ID/update", key: "bad", body: "{}", status: 401, field: nil),
        Case(method: "POST", path: "/v1/activities/ID/update", key: "device", body: "{}", status: 403, field: nil),
        Case(method: "POST", path: "/v1/activities", key: "backend", body: "{}", status: 403, field: nil),
        Case(method: "POST", path: "/v1/activities/ID/update", key: "backend", body: "{oops", status: 400, field: nil),
        Case(method: "POST", path: "/v1/activities/ID/update", key: "backend", body: "[1]", status: 400, field: nil),
        Case(method: "POST", path: "/v1/activities/ID/update", key: "backend", body: "{}", status: 400, field: "contentState"),
        Case(method: "POST", path: "/v1/activities/ID/update", key: "backend", body: #"{"contentState":{"driverName":"A"}}"#, status: 422, field: "contentState.deliveryTimer"),
        Case(method: "POST", path: "/v1/activities/ID/update", key: "backend", body: #"{"contentState":{"driverName":"A","deliveryTimer":["2026-01-01",1]}}"#, status: 422, field: "contentState.deliveryTimer[0]"),
        Case(method: "POST", path: "/v1/activities/ID/update", key: "backend", body: #"{"contentState":{"driverName":"A","deliveryTimer":[1,2]},"priority":7}"#, status: 400, field: "priority"),
        Case(method: "POST", path: "/v1/activities/ID/update", key: "backend", body: #"{"contentState":{"driverName":"A","deliveryTimer":[1,2]},"alert":{"title":"T"}}"#, status: 400, field: "alert.body"),
        Case(method: "POST", path: "/v1/activities/ID/update", key: "backend", body: #"{"contentState":{"driverName":"A","deliveryTimer":[1,2]},"staleDate":"tomorrow"}"#, status: 400, field: "staleDate"),
        Case(method: "POST", path: "/v1/activities/ID/update", key: "backend", body: #"{"contentState":{"driverName":"A","deliveryTimer":[1,2]},"staleDate":1767225600000}"#, status: 400, field: "staleDate"),
        Case(method: "POST", path: "/v1/activities/ID/update", key: "backend", body: #"{"contentState":{"driverName":"A","deliveryTimer":[1,2]},"dismissalDate":1767229200}"#, status: 400, field: "dismissalDate"),
        Case(method: "POST", path: "/v1/activities/ID/update", key: "backend", body: #"{"contentState":{"driverName":"A","deliveryTimer":[1,2]},"colour":"red"}"#, status: 400, field: "colour"),
        Case(method: "POST", path: "/v1/activities/ID/update", key: "backend", body: #"{"contentState":{"driverName":"\#(String(repeating: "x", count: 5000))","deliveryTimer":[1,2]}}"#, status: 422, field: nil),
        Case(method: "POST", path: "/v1/activities/nope/update", key: "backend", body: #"{"contentState":{}}"#, status: 404, field: nil),
        Case(method: "POST", path: "/v1/activities/by-key/nope/end", key: "backend", body: "{}", status: 404, field: nil),
        Case(method: "GET", path: "/v1/activities/nope", key: "backend", body: nil, status: 404, field: nil),
        Case(method: "GET", path: "/v1/deliveries/nope", key: "backend", body: nil, status: 404, field: nil),
        Case(method: "POST", path: "/v1/activities", key: "device", body: #"{"attributesType":"PizzaDeliveryAttributes"}"#, status: 400, field: "installationID"),
        Case(method: "POST", path: "/v1/activities", key: "device", body: #"{"attributesType":"PizzaDeliveryAttributes","installationID":"nope","colour":"red"}"#, status: 400, field: "colour"),
        Case(method: "POST", path: "/v1/activities", key: "device", body: #"{"attributesType":"PizzaDeliveryAttributes","token":"xyz"}"#, status: 400, field: "token"),
        Case(method: "POST", path: "/v1/activities", key: "device", body: #"{"attributesType":"Nope","token":"\#(String(repeating: "ab", count: 40))"}"#, status: 400, field: "installationID"),
        Case(method: "POST", path: "/v1/activities", key: "device", body: #"{"attributesType":"PizzaDeliveryAttributes","token":"TOKEN"}"#, status: 400, field: "installationID"),
        Case(method: "POST", path: "/v1/activities", key: "device", body: #"{"attributesType":"PizzaDeliveryAttributes","token":"TOKEN","installationID":"ghost"}"#, status: 404, field: "installationID"),
        Case(method: "POST", path: "/v1/activities", key: "device", body: #"{"attributesType":"PizzaDeliveryAttributes","token":"TOKEN","installationID":"fixture-phone"}"#, status: 403, field: "Isle-Installation-Secret"),
        Case(method: "POST", path: "/v1/activities", key: "device", body: #"{"attributesType":"PizzaDeliveryAttributes","token":"TOKEN","ticket":"x.y"}"#, status: 400, field: "installationID"),
        Case(method: "PUT", path: "/v1/activities/ID/key", key: "device", body: #"{"externalKey":"mine"}"#, status: 403, field: nil),
        Case(method: "PUT", path: "/v1/activities/ID/key", key: "backend", body: #"{}"#, status: 400, field: "externalKey"),
        Case(method: "PUT", path: "/v1/activities/ID/key", key: "backend", body: #"{"externalKey":7}"#, status: 400, field: "externalKey"),
        Case(method: "PUT", path: "/v1/activities/nope/key", key: "backend", body: #"{"externalKey":"x"}"#, status: 404, field: nil),
        Case(method: "PUT", path: "/v1/activities/ID/key", key: "backend", body: #"{"externalKey":"a\u0000b"}"#, status: 422, field: "externalKey"),
        Case(method: "POST", path: "/v1/activities/by-key/a%00b/update", key: "backend", body: "{}", status: 400, field: "key"),
        Case(method: "PUT", path: "/v1/installations/i1", key: "device", body: #"{"ticket":"not-a-jwt"}"#, status: 403, field: "ticket"),
        Case(method: "POST", path: "/v1/activities", key: "device", body: #"{"attributesType":"PizzaDeliveryAttributes","token":"\#(String(repeating: "ab", count: 40))","topics":"x"}"#, status: 400, field: "topics"),
        Case(method: "PUT", path: "/v1/installations/i1", key: "device", body: #"{"pushToStartTokens":{"PizzaDeliveryAttributes":"zz"}}"#, status: 400, field: "pushToStartTokens.PizzaDeliveryAttributes"),
        Case(method: "PUT", path: "/v1/installations/i1", key: "device", body: #"{"liveActivitiesEnabled":"yes"}"#, status: 400, field: "liveActivitiesEnabled"),
        Case(method: "PUT", path: "/v1/activities/ID/token", key: "device", body: "{}", status: 400, field: "token"),
        Case(method: "POST", path: "/v1/activities/ID/explode", key: "device", body: "{}", status: 404, field: nil),
        Case(method: "POST", path: "/v1/installations/nope/start", key: "backend", body: #"{"attributesType":"PizzaDeliveryAttributes","attributes":{"numberOfPizzas":1,"totalAmount":"x","orderNumber":"1"},"contentState":{"driverName":"A","deliveryTimer":[1,2]},"alert":{"title":"a","body":"b"}}"#, status: 404, field: nil),
        Case(method: "POST", path: "/v1/installations/nope/start", key: "backend", body: #"{"attributesType":"pizzaDeliveryAttributes","attributes":{},"contentState":{},"alert":{"title":"a","body":"b"}}"#, status: 404, field: "attributesType"),
        Case(method: "POST", path: "/v1/installations/nope/start", key: "backend", body: #"{"attributesType":"PizzaDeliveryAttributes","attributes":{},"contentState":{}}"#, status: 400, field: "alert"),
        Case(method: "POST", path: "/v1/users/nobody/start", key: "backend", body: #"{"attributesType":"PizzaDeliveryAttributes","attributes":{"numberOfPizzas":"3","totalAmount":"x","orderNumber":"1"},"contentState":{"driverName":"A","deliveryTimer":[1,2]},"alert":{"title":"a","body":"b"}}"#, status: 422, field: "attributes.numberOfPizzas"),
        Case(method: "POST", path: "/v1/installations/nope/widgets/reload", key: "backend", body: nil, status: 404, field: nil),
        Case(method: "GET", path: "/v1/nothing-here", key: "backend", body: nil, status: 404, field: nil),
        Case(method: "POST", path: "/v1/channels", key: "backend", body: #"{"storagePolicy":1e19}"#, status: 400, field: "storagePolicy"),
        Case(method: "POST", path: "/v1/channels", key: "backend", body: #"{"storagePolicy":-1e300}"#, status: 400, field: "storagePolicy"),
        Case(method: "GET", path: "/v1/app", key: "device", body: nil, status: 403, field: nil),
        Case(method: "DELETE", path: "/v1/app", key: "backend", body: nil, status: 405, field: nil),
        Case(method: "TRACE", path: "/health", key: "none", body: nil, status: 405, field: nil),
    ]

    @Test("each error path", arguments: cases)
    func errorPath(_ c: Case) async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "k")
            let key: String? = switch c.key {
            case "backend": f.backendKey
            case "device": f.deviceKey
            case "bad": "isle_backend_0000"
            default: nil
            }
            let body = c.body?.replacingOccurrences(of: "TOKEN", with: a.updateToken!)
            let r = try await f.call(c.method, c.path.replacingOccurrences(of: "ID", with: id), key: key, raw: body)
            #expect(r.status == c.status, "\(r.json.jsonString)")
            #expect(r.status < 500)
            if c.path != "/v1/nothing-here" { #expect(r.json["error"]?["message"]?.stringValue?.isEmpty == false, "\(r.json.jsonString)") }
            if let field = c.field { #expect(r.json["error"]?["field"]?.stringValue == field, "\(r.json.jsonString)") }
        }
    }

    @Test("Idempotency-Key: a repeat gets the first answer and queues nothing; another request with the key is refused")
    func idempotency() async throws {
        try await ServerFixture.with { f in
            let (_, id) = try await f.appStartsActivity(key: "k")
            let body: JSONValue = ["contentState": Pizza.state("Once")]
            let first = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: body, headers: [("Idempotency-Key", "abc")])
            let second = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: body, headers: [("Idempotency-Key", "abc")])
            #expect(first.status == 202 && second.status == 202)
            #expect(first.json["accepted"] == second.json["accepted"])
            let store = try SQLiteStore(path: f.databasePath)
            #expect(try await store.jobCounts().values.reduce(0, +) == 1)
            let other = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Twice")], headers: [("Idempotency-Key", "abc")])
            #expect(other.status == 409 && other.json["error"]?["code"] == "idempotencyKeyReused")
            // The replay is the whole first answer, job ids included.
            #expect(first.json["jobs"] != nil && first.json["jobs"] == second.json["jobs"], "\(first.json.jsonString) / \(second.json.jsonString)")
            // After 24 hours the key is free again.
            f.clock.advance(by: IdempotencyRecord.lifetime + 60)
            let (_, nextDay) = try await f.appStartsActivity(key: "next-day")
            let dayLater = try await f.call("POST", "/v1/activities/\(nextDay)/update", key: f.backendKey, body: ["contentState": Pizza.state("Next day")], headers: [("Idempotency-Key", "abc")])
            #expect(dayLater.status == 202 && dayLater.json["jobs"] != first.json["jobs"], "\(dayLater.json.jsonString)")
        }
    }

    @Test("Idempotency-Key: concurrent requests with one key queue once and all get that answer; device and backend keys do not share a key space")
    func idempotencyConcurrentAndScoped() async throws {
        try await ServerFixture.with { f in
            let (_, id) = try await f.appStartsActivity(key: "k")
            let body: JSONValue = ["contentState": Pizza.state("Together"), "alert": ["title": "T", "body": "B"]]
            let answers = try await withThrowingTaskGroup(of: ServerFixture.Answer.self) { group in
                for _ in 0..<16 {
                    group.addTask { try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: body, headers: [("Idempotency-Key", "race-1")]) }
                }
                return try await group.reduce(into: [ServerFixture.Answer]()) { $0.append($1) }
            }
            #expect(answers.allSatisfy { $0.status == 202 || ($0.status == 409 && $0.json["error"]?["code"] == "idempotencyKeyInUse") }, "\(answers.map(\.status))")
            let accepted = answers.filter { $0.status == 202 }
            #expect(!accepted.isEmpty && Set(accepted.map { $0.json["jobs"]?.jsonString ?? "-" }).count == 1, "\(accepted.map(\.json.jsonString))")
            let store = try SQLiteStore(path: f.databasePath)
            #expect(try await store.jobCounts().values.reduce(0, +) == 1, "one request's work, however many raced")

            // A device that uses the backend's next key does not take it.
            let squat = try await f.call("POST", "/v1/activities/\(id)/dismissed", key: f.deviceKey, body: [:], headers: [("Idempotency-Key", "backend-next")] + f.secretHeader())
            #expect(squat.status < 300, "\(squat.json.jsonString)")
            let (_, id2) = try await f.appStartsActivity(key: "k2")
            let backend = try await f.call("POST", "/v1/activities/\(id2)/update", key: f.backendKey, body: ["contentState": Pizza.state("Mine")], headers: [("Idempotency-Key", "backend-next")])
            #expect(backend.status == 202 && backend.json["jobs"] != nil, "\(backend.json.jsonString)")
        }
    }

    @Test("health, readiness, metrics and the OpenAPI document")
    func operations() async throws {
        try await ServerFixture.with { f in
            #expect(try await f.call("GET", "/health").json["status"] == "ok")
            #expect(try await f.call("GET", "/ready").json["status"] == "ready")
            let (a, id) = try await f.appStartsActivity(key: "metrics-1")
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("Counted")]).status == 202)
            try await f.waitForDevice("the update applied") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "Counted" }
            try await eventually("the delivery counted") { try await f.call("GET", "/metrics").json.stringValue?.contains("isle_time_in_queue_seconds_count 1") == true }
            let metrics = try await f.call("GET", "/metrics")
            let text = metrics.json.stringValue ?? ""
            #expect(metrics.status == 200)
            for expected in [#"isle_deliveries_total{app="com.example.pizza",outcome="sent"} 1"#, #"isle_apns_responses_total{app="com.example.pizza","#, #"status="200""#, #"reason="none""#,
                             "isle_apns_response_seconds_bucket{", "isle_time_in_queue_seconds_count 1", #"isle_api_write_seconds_bucket{status="2xx""#,
                             #"isle_jobs{state="queued"} 0"#, "# TYPE isle_apns_response_seconds histogram", "isle_oldest_due_push_age_seconds 0",
                             #"isle_apps_paused{cause="configuration"} 0"#, #"isle_build_info{version=""#, "isle_store_statements_total ",
                             "process_cpu_seconds_total ", "process_resident_memory_bytes ", "process_open_fds ", "process_max_fds ", "process_start_time_seconds "] {
                #expect(text.contains(expected), "missing \(expected) in:\n\(text)")
            }
            // Every family has one HELP and one TYPE line, before its samples (what promtool checks; CI runs promtool too).
            #expect(MetricsText.problems(text).isEmpty, "\(MetricsText.problems(text))")
            if ProcessInfo.processInfo.environment["ISLE_TEST_REQUIRE_PROMTOOL"] == "1" { #expect(MetricsText.promtool != nil, "promtool is not installed (.ci/run installs Debian's prometheus)") }
            if let promtool = MetricsText.promtool {
                let (status, output) = try MetricsText.run(promtool, ["check", "metrics"], input: text)
                #expect(status == 0 && output.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty, "promtool: \(output)")
            }
            // Labels never carry an id or a token.
            #expect(!text.contains(id) && !text.contains(a.updateToken!) && !text.contains("metrics-1"))
            let doc = try await f.call("GET", "/openapi.json")
            #expect(doc.json["openapi"] == "3.1.0")
            #expect(doc.json["paths"]?["/v1/activities/{activity}/update"] != nil)
        }
    }
}

/// Hostile input on every write route, with both keys: every answer is a 2xx (a mutation that
/// happens to be valid) or a 4xx in the error shape, never a 5xx, and the server stays up and
/// keeps working (issue: trust and hostile input). Seeded: ISLE_HOSTILE_SEED replays a run.
@Suite("Isle server: hostile input on every write route")
struct HostileInputTests {
    static let hostileValues: [String] = [
        "1e400", "-1e400", "1e19", "-1e19", "9223372036854775808", "-9223372036854775809", "18446744073709551616",
        "1.5", "-0.0", "0.000001", "-1", "2147483648", "1e-400",
        "\"\"", "\"\\ud800\"", "\"\\udc00x\"", "\"\\u0000\"", "\"\(String(repeating: "x", count: 70_000))\"",
        "null", "true", "[]", "{}", "[[[[[[[[[[]]]]]]]]]]", "{\"a\":{\"b\":{\"c\":[1e999]}}}",
    ]

    static let longID = String(repeating: "a", count: 5_000)

    @Test("every write route, both keys, hostile values in every field")
    func hostile() async throws {
        let seed = UInt64(ProcessInfo.processInfo.environment["ISLE_HOSTILE_SEED"] ?? "") ?? 20_261_123
        var random = SeededRandom(seed: seed)
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "hostile-1")
            try await f.installation("inst-1")
            let token = String(repeating: "ab", count: 40)
            let attributes = Pizza.attributes.jsonString
            let state = Pizza.state("A").jsonString
            // (method, path, a valid body) for every write route.
            let routes: [(String, String, String)] = [
                ("PUT", "/v1/installations/inst-1", #"{"ticket":"\#(f.ticket(user: "u1", installation: "inst-1"))","pushToStartTokens":{"PizzaDeliveryAttributes":"\#(token)"},"widgetToken":"\#(token)","liveActivitiesEnabled":true,"frequentPushesEnabled":false,"environment":"sandbox"}"#),
                ("PUT", "/v1/installations/inst-1/user", #"{"userID":"u1"}"#),
                ("POST", "/v1/activities", #"{"attributesType":"PizzaDeliveryAttributes","token":"\#(token)","externalKey":"o-1","installationID":"inst-1","topics":["t"],"relevanceScore":10,"ticket":"\#(f.ticket(key: "o-1"))"}"#),
                ("PUT", "/v1/activities/\(id)/key", #"{"externalKey":"bound-1"}"#),
                ("PUT", "/v1/activities/\(id)/token", #"{"token":"\#(token)"}"#),
                ("POST", "/v1/activities/\(id)/dismissed", "{}"),
                ("POST", "/v1/activities/\(id)/ended", "{}"),
                ("POST", "/v1/activities/\(id)/update", #"{"contentState":\#(state),"alert":{"title":"T","body":"B","sound":"default"},"priority":10,"staleDate":1767229200,"relevanceScore":50,"sendAt":1767225600}"#),
                ("POST", "/v1/activities/\(id)/end", #"{"contentState":\#(state),"dismissalDate":1767229200,"priority":5}"#),
                ("POST", "/v1/activities/by-key/hostile-1/update", #"{"contentState":\#(state),"priority":5}"#),
                ("POST", "/v1/activities/by-key/hostile-1/end", #"{"contentState":\#(state)}"#),
                ("POST", "/v1/topics/t/update", #"{"contentState":\#(state)}"#),
                ("POST", "/v1/topics/t/end", #"{"contentState":\#(state)}"#),
                ("POST", "/v1/installations/inst-1/start", #"{"attributesType":"PizzaDeliveryAttributes","attributes":\#(attributes),"contentState":\#(state),"alert":{"title":"a","body":"b"},"externalKey":"o-2"}"#),
                ("POST", "/v1/users/u1/start", #"{"attributesType":"PizzaDeliveryAttributes","attributes":\#(attributes),"contentState":\#(state),"alert":{"title":"a","body":"b"}}"#),
                ("POST", "/v1/installations/inst-1/widgets/reload", "{}"),
                ("POST", "/v1/channels", #"{"storagePolicy":0}"#),
                ("POST", "/v1/channels/ch-1/update", #"{"contentState":\#(state),"expiration":0}"#),
                ("DELETE", "/v1/channels/ch-1", ""),
                ("POST", "/v1/app/resume", "{}"),
            ]
            var requests: [(String, String, String)] = []
            for (method, path, body) in routes {
                requests.append((method, path, body))
                // Each top-level field, replaced by hostile values.
                if let object = try? JSONParser.parse(Array(body.utf8)).objectValue {
                    for field in object.keys.sorted() {
                        for _ in 0..<4 {
                            let value = Self.hostileValues[Int(random.next() % UInt64(Self.hostileValues.count))]
                            var fields = object.map { ($0.key, $0.value.jsonString) }
                            fields = fields.map { $0.0 == field ? ($0.0, value) : $0 }
                            requests.append((method, path, "{" + fields.map { "\"\($0.0)\":\($0.1)" }.joined(separator: ",") + "}"))
                        }
                    }
                }
                // Whole bodies that are not what any route takes.
                for body in ["", "{", "[1]", "\"s\"", "1e400", String(repeating: "[", count: 100_000), "{\"a\":\"\\ud800\"}",
                             "{\"x\":\"" + String(repeating: "y", count: 3_000_000) + "\"}", "{\"a\":1,\"a\":2}"] {
                    requests.append((method, path, body))
                }
                // Very long ids in the path.
                requests.append((method, path.replacingOccurrences(of: id, with: Self.longID).replacingOccurrences(of: "inst-1", with: Self.longID), body))
            }
            var fiveHundreds: [String] = []
            for (i, (method, path, body)) in requests.enumerated() {
                for key in [f.backendKey, f.deviceKey] {
                    // Device calls carry the installation's secret, so they reach the route's checks.
                    let secret = key != f.deviceKey ? [] : (path.contains("inst-1") || path == "/v1/activities") ? f.secretHeader("inst-1") : f.secretHeader()
                    let r = try await f.call(method, path, key: key, raw: body.isEmpty && method == "DELETE" ? nil : body, headers: secret)
                    if r.status >= 500 { fiveHundreds.append("#\(i) \(method) \(path.prefix(60)) \(body.prefix(80)) → \(r.status) \(r.json.jsonString.prefix(200))") }
                    if (400..<500).contains(r.status) {
                        #expect(r.json["error"]?["code"]?.stringValue?.isEmpty == false && r.json["error"]?["message"]?.stringValue?.isEmpty == false,
                                "#\(i) \(method) \(path.prefix(60)) \(body.prefix(80)) → \(r.status) \(r.json.jsonString.prefix(200))")
                    }
                }
            }
            #expect(fiveHundreds.isEmpty, "seed \(seed): \(fiveHundreds.prefix(5))")
            // Still up, and still doing its job.
            #expect(try await f.call("GET", "/health").status == 200)
            let (fresh, freshID) = try await f.appStartsActivity(key: "after-the-storm")
            let ok = try await f.call("POST", "/v1/activities/\(freshID)/update", key: f.backendKey, body: ["contentState": Pizza.state("Still here")])
            #expect(ok.status == 202, "\(ok.json.jsonString)")
            try await eventually("the update reached the phone") { try f.deviceActivity(fresh.id)?.contentState["driverName"] == "Still here" }
            #expect(requests.count > 300, "\(requests.count) requests")
            _ = a
        }
    }
}

/// Checks of the Prometheus text exposition (the rules `promtool check metrics` applies that matter
/// here: HELP and TYPE for every family, once, before its samples).
enum MetricsText {
    static func problems(_ text: String) -> [String] {
        var help: Set<String> = [], type: [String: String] = [:], problems: [String] = []
        for line in text.split(separator: "\n") {
            if line.hasPrefix("# HELP ") {
                let name = String(line.dropFirst(7).prefix { $0 != " " })
                if !help.insert(name).inserted { problems.append("HELP twice for \(name)") }
                if line.dropFirst(7 + name.count).trimmingCharacters(in: .whitespaces).isEmpty { problems.append("empty HELP for \(name)") }
            } else if line.hasPrefix("# TYPE ") {
                let parts = line.dropFirst(7).split(separator: " ")
                guard parts.count == 2 else { problems.append("bad TYPE line: \(line)"); continue }
                if type.updateValue(String(parts[1]), forKey: String(parts[0])) != nil { problems.append("TYPE twice for \(parts[0])") }
            } else if !line.hasPrefix("#"), !line.isEmpty {
                let sample = String(line.prefix { $0 != "{" && $0 != " " })
                let family = type[sample] != nil ? sample : ["_bucket", "_sum", "_count", "_total"].compactMap { s in sample.hasSuffix(s) ? String(sample.dropLast(s.count)) : nil }.first { type[$0] != nil } ?? sample
                if type[family] == nil { problems.append("no TYPE before \(sample)") }
                if !help.contains(family) { problems.append("no HELP for \(family)") }
            }
        }
        return problems
    }

    /// promtool, when installed (CI installs it: Debian's prometheus package).
    static let promtool: String? = ["/usr/bin/promtool", "/usr/local/bin/promtool"].first { FileManager.default.isExecutableFile(atPath: $0) }

    static func run(_ executable: String, _ arguments: [String], input: String) throws -> (Int32, String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        let stdin = Pipe(), stdout = Pipe()
        process.standardInput = stdin
        process.standardOutput = stdout
        process.standardError = stdout
        try process.run()
        stdin.fileHandleForWriting.write(Data(input.utf8))
        try stdin.fileHandleForWriting.close()
        let output = stdout.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: output, as: UTF8.self))
    }
}
