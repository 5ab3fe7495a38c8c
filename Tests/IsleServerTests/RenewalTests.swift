import Foundation
import IsleCore
import IsleSimulator
import IsleStore
import IsleTesting
import Testing

/// Activities that outlive 8 hours (docs/server.md): before the system's end a successor is
/// started by push-to-start with the activity's attributes and current content, under its key;
/// once its token is back the old one ends at once, and the backend's by-key updates reach the
/// successor without noticing. On the simulated clock.
@Suite("Activities that outlive 8 hours")
struct RenewalTests {
    @Test("a renewed activity keeps its key and state across the 8-hour end: the successor starts 30 minutes before, the old one ends when its token is back, the next by-key update reaches the successor")
    func renewal() async throws {
        try await ServerFixture.with(server: { $0.sweepInterval = .milliseconds(100) }) { f in
            let (first, firstID) = try await f.appStartsActivity(key: "flight-1", topics: ["flights"])
            let pts = try #require(try f.sim.world.app(Pizza.bundleID, on: f.device).pushToStartTokens["PizzaDeliveryAttributes"])
            #expect(try await f.call("PUT", "/v1/installations/fixture-phone", key: f.deviceKey, body: ["pushToStartTokens": ["PizzaDeliveryAttributes": .string(pts)]],
                                     headers: f.secretHeader()).status == 200)
            #expect(try await f.call("POST", "/v1/activities/by-key/flight-1/update", key: f.backendKey, body: ["contentState": Pizza.state("Over the Atlantic")]).status == 202)
            try await eventually("the update shown") { try f.deviceActivity(first.id)?.contentState["driverName"] == "Over the Atlantic" }
            // Bad requests are refused by name.
            let past = try await f.call("PUT", "/v1/activities/by-key/flight-1/renewal", key: f.backendKey,
                                        body: ["renewUntil": .int(Int64(f.clock.now.timeIntervalSince1970) - 1), "alert": ["title": "Still flying", "body": "Your flight continues"]])
            #expect(past.status == 422 && past.json["error"]?["field"] == "renewUntil", "\(past.json.jsonString)")
            let noAlert = try await f.call("PUT", "/v1/activities/by-key/flight-1/renewal", key: f.backendKey, body: ["renewUntil": .int(Int64(f.clock.now.timeIntervalSince1970) + 3600)])
            #expect(noAlert.status == 400 && noAlert.json["error"]?["field"] == "alert", "\(noAlert.json.jsonString)")
            let renew = try await f.call("PUT", "/v1/activities/by-key/flight-1/renewal", key: f.backendKey,
                                         body: ["renewUntil": .int(Int64(f.clock.now.timeIntervalSince1970) + 20 * 3600), "alert": ["title": "Still flying", "body": "Your flight continues"]])
            #expect(renew.status == 200 && renew.json["activityID"]?.stringValue == firstID && renew.json["successorID"] == .null, "\(renew.json.jsonString)")

            // 7 hours: nothing yet.
            let swept = f.server.app.renewalSweeps
            f.clock.advance(by: 7 * 3600)
            try await eventually("two renewal sweeps after the clock moved") { f.server.app.renewalSweeps >= swept + 2 }
            #expect(try f.sim.world.device(f.device).activities.filter { $0.startedBy == .push }.isEmpty, "no successor before the renewal's lead")
            // 7 h 31 min: the successor starts, with the old one's attributes and content.
            f.clock.advance(by: 31 * 60)
            try await f.waitForDevice("the successor starts") { d in d.activities.contains { $0.startedBy == .push && $0.state == .active } }
            let successor = try #require(try f.sim.world.device(f.device).activities.first { $0.startedBy == .push })
            #expect(successor.contentState["driverName"] == "Over the Atlantic" && successor.attributes == Pizza.attributes)
            #expect(successor.lastAlert?.title == "Still flying")
            // The app hands back its token (IsleClient does): linked by the key, and the old one ends at once.
            let token = try await f.sim.world.waitForPushToken(activityID: successor.id, on: f.device)
            let linked = try await f.register(["attributesType": "PizzaDeliveryAttributes", "token": .string(token), "externalKey": "flight-1"], ticket: "")
            #expect(linked.status == 200, "\(linked.json.jsonString)")
            let successorID = try #require(linked.json["id"]?.stringValue)
            #expect(successorID != firstID)
            try await eventually("the old activity ends, dismissed at once") {
                let old = try f.deviceActivity(first.id)
                return old == nil || old?.state == .dismissed || old?.state == .ended
            }
            try await eventually("the server records the old one's end") {
                let state = try await f.call("GET", "/v1/activities/\(firstID)", key: f.backendKey).json["state"]?.stringValue
                return state == "ended" || state == "dismissed"
            }
            let store = try SQLiteStore(path: f.databasePath)
            #expect(try await store.renewal(activityID: firstID)?.successorID == successorID)
            #expect(try await store.renewal(activityID: successorID)?.predecessorID == firstID)
            // Past the first one's 8 hours: the backend's next update by key reaches the successor.
            f.clock.advance(by: 45 * 60)
            let next = try await f.call("POST", "/v1/activities/by-key/flight-1/update", key: f.backendKey, body: ["contentState": Pizza.state("Descending")])
            #expect(next.status == 202 && next.json["activityID"]?.stringValue == successorID, "\(next.json.jsonString)")
            try await eventually("the successor shows it") { try f.deviceActivity(successor.id)?.contentState["driverName"] == "Descending" }
            let byKey = try await f.call("GET", "/v1/activities/by-key/flight-1", key: f.backendKey)
            #expect(byKey.json["id"]?.stringValue == successorID && byKey.json["topics"] == ["flights"], "\(byKey.json.jsonString)")
            // Stopped: no third one.
            #expect(try await f.call("DELETE", "/v1/activities/\(successorID)/renewal", key: f.backendKey).status == 204)
            let sweptLater = f.server.app.renewalSweeps
            f.clock.advance(by: 7 * 3600)
            try await eventually("two renewal sweeps after the clock moved") { f.server.app.renewalSweeps >= sweptLater + 2 }
            #expect(try f.sim.world.device(f.device).activities.filter { $0.startedBy == .push }.count == 1)
        }
    }

    @Test("a successor starts with the newest content the backend asked for: an update still waiting for the old activity's token (its app has not handed it over), not the content the old one last took; a scheduled update for later is not taken")
    func successorTakesQueuedContent() async throws {
        try await ServerFixture.with(server: { $0.sweepInterval = .milliseconds(100) }) { f in
            _ = try await f.installation("fixture-phone")
            let pts = try #require(try f.sim.world.app(Pizza.bundleID, on: f.device).pushToStartTokens["PizzaDeliveryAttributes"])
            #expect(try await f.call("PUT", "/v1/installations/fixture-phone", key: f.deviceKey, body: ["pushToStartTokens": ["PizzaDeliveryAttributes": .string(pts)]],
                                     headers: f.secretHeader()).status == 200)
            // The backend starts it by push; the app does not hand its token over (not woken yet), so the record waits, `starting`.
            let started = try await f.call("POST", "/v1/installations/fixture-phone/start", key: f.backendKey, body: [
                "attributesType": "PizzaDeliveryAttributes", "externalKey": "flight-2", "attributes": Pizza.attributes,
                "contentState": Pizza.state("Boarding"), "alert": ["title": "Flight 2", "body": "Boarding"],
            ])
            #expect(started.status == 202, "\(started.json.jsonString)")
            try await f.waitForDevice("the push-started activity") { d in d.activities.contains { $0.startedBy == .push } }
            #expect(try await f.call("POST", "/v1/activities/by-key/flight-2/update", key: f.backendKey, body: ["contentState": Pizza.state("Over the Atlantic")]).status == 202)
            let later = Int64(f.clock.now.timeIntervalSince1970) + 7 * 3600 + 45 * 60
            #expect(try await f.call("POST", "/v1/activities/by-key/flight-2/update", key: f.backendKey, body: ["contentState": Pizza.state("Landed"), "sendAt": .int(later)]).status == 202)
            #expect(try await f.call("PUT", "/v1/activities/by-key/flight-2/renewal", key: f.backendKey,
                                     body: ["renewUntil": .int(Int64(f.clock.now.timeIntervalSince1970) + 20 * 3600), "alert": ["title": "Still flying", "body": "Your flight continues"]]).status == 200)
            f.clock.advance(by: 7 * 3600 + 31 * 60)
            try await f.waitForDevice("the successor starts") { d in d.activities.filter { $0.startedBy == .push }.count == 2 }
            let successor = try #require(try f.sim.world.device(f.device).activities.filter { $0.startedBy == .push }.max { $0.startedAt < $1.startedAt })
            #expect(successor.contentState["driverName"] == "Over the Atlantic", "\(successor.contentState.jsonString)")
        }
    }

    @Test("with IsleClient on the phone: the app registers by token alone, the backend renews with the attributes; the successor appears, IsleClient hands back its token, the old one ends, and the next update by key reaches the successor")
    func renewalWithIsleClient() async throws {
        try await ServerFixture.with(server: { $0.sweepInterval = .milliseconds(100) }) { f in
            let (kit, client, runner) = try await ClientTests.app(f)
            let first = try kit.request(attributes: ClientTests.attributes, content: ClientTests.state)
            guard case .registered(let firstID) = await client.registration(of: first.id) else { Issue.record("not registered"); return }
            // IsleClient reported the push-to-start token with the installation.
            let store = try SQLiteStore(path: f.databasePath)
            let installation = await client.installationID
            try await eventually("the push-to-start token reported") { try await store.installation(bundleID: Pizza.bundleID, id: installation)?.pushToStartTokens.isEmpty == false }
            #expect(try await f.call("POST", "/v1/activities/by-key/order-12345/update", key: f.backendKey, body: ["contentState": Pizza.state("Over the Atlantic"), "priority": 10]).status == 202)
            let renew = try await f.call("PUT", "/v1/activities/by-key/order-12345/renewal", key: f.backendKey,
                                         body: ["renewUntil": .int(Int64(f.clock.now.timeIntervalSince1970) + 20 * 3600), "alert": ["title": "Still on its way", "body": "Your order continues"],
                                                "attributes": Pizza.attributes])
            #expect(renew.status == 200, "\(renew.json.jsonString)")
            f.clock.advance(by: 7 * 3600 + 31 * 60)
            // The successor appears; IsleClient registers its token under the key; the server links it.
            try await f.waitForDevice("the successor starts") { d in d.activities.contains { $0.startedBy == .push && $0.state == .active } }
            let successor = try #require(try f.sim.world.device(f.device).activities.first { $0.startedBy == .push })
            guard case .registered(let successorID) = await client.registration(of: successor.id) else { Issue.record("the successor was not registered"); return }
            #expect(successorID != firstID)
            try await eventually("the server ends the old one") {
                let state = try await f.call("GET", "/v1/activities/\(firstID)", key: f.backendKey).json["state"]?.stringValue
                return state == "ended" || state == "dismissed"
            }
            #expect(try f.deviceActivity(first.id).map { $0.state == .ended || $0.state == .dismissed } ?? true, "ended on the phone too")
            let next = try await f.call("POST", "/v1/activities/by-key/order-12345/update", key: f.backendKey, body: ["contentState": Pizza.state("Landing"), "priority": 10])
            #expect(next.json["activityID"]?.stringValue == successorID, "\(next.json.jsonString)")
            try await eventually("the successor shows it") { try f.deviceActivity(successor.id)?.contentState["driverName"] == "Landing" }
            await client.stop()
            runner.cancel()
        }
    }
}

