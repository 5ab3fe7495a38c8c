import AsyncHTTPClient
import Foundation
import IsleCore
import IsleSimulator
import IsleTesting
import NIOCore
import Testing

/// The simulator as a script drives it: events found by apns-id, token, device and outcome, waited
/// for by long poll; a flagged push's own outcome.
@Suite("Simulator for scripts")
struct ScriptingTests {
    @Test("GET /events finds a push's event by apns-id, token, device and outcome, and only after the cursor")
    func eventFilters() async throws {
        try await SimFixture.with { f in
            let client = HTTPClient(eventLoopGroupProvider: .singleton)
            defer { Task { try? await client.shutdown() } }
            let control = Control(base: await f.sim.controlURL(), client: client)
            // A second phone with its own activity: its events must not leak into the first's filters.
            let other = f.sim.world.createDevice(name: "other")
            _ = try Pizza.install(f.sim.world, on: other)
            let a2 = try f.sim.world.requestActivity(bundleID: Pizza.bundleID, on: other, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes, contentState: Pizza.state())
            let token2 = try await f.sim.world.waitForPushToken(activityID: a2.id, on: other)
            let start = try await control.call("GET", "/events")
            let cursor = try #require(start.json["cursor"]?.stringValue)

            var h1 = f.headers()
            let id1 = h1.first { $0.0 == "apns-id" }!.1
            #expect(try await f.raw.send("/3/device/\(f.token)", headers: h1, body: Pizza.update(f.clock.now, driver: "One").jsonBytes).status == 200)
            h1 = f.headers()
            let id2 = h1.first { $0.0 == "apns-id" }!.1
            #expect(try await f.raw.send("/3/device/\(token2)", headers: h1, body: Pizza.update(f.clock.now, driver: "Two").jsonBytes).status == 200)
            // An older timestamp: ignored, an outcome of its own.
            let h3 = f.headers()
            let id3 = h3.first { $0.0 == "apns-id" }!.1
            #expect(try await f.raw.send("/3/device/\(f.token)", headers: h3, body: Pizza.update(f.clock.now.addingTimeInterval(-60)).jsonBytes).status == 200)

            let byID = try await control.call("GET", "/events?apnsID=\(id1.uppercased())")
            #expect(byID.json["events"]?.arrayValue?.map { $0["outcome"]?["code"]?.stringValue } == ["applied"])
            #expect(byID.json["events"]?.arrayValue?.first?["device"]?.stringValue == f.device)
            #expect(byID.json["events"]?.arrayValue?.first?["token"]?.stringValue == f.token)
            let byToken = try await control.call("GET", "/events?token=\(token2)&after=\(cursor)")
            #expect(byToken.json["events"]?.arrayValue?.map { $0["apnsID"]?.stringValue } == [id2])
            let byOutcome = try await control.call("GET", "/events?outcome=olderTimestamp,throttled&after=\(cursor)")
            #expect(byOutcome.json["events"]?.arrayValue?.map { $0["apnsID"]?.stringValue } == [id3])
            let byDevice = try await control.call("GET", "/events?device=\(other)&source=push&after=\(cursor)")
            #expect(byDevice.json["events"]?.arrayValue?.count == 1)
            // Past the cursor of the last answer: nothing again.
            let next = try #require(byOutcome.json["cursor"]?.stringValue)
            #expect(try await control.call("GET", "/events?outcome=olderTimestamp&after=\(next)").json["events"]?.arrayValue?.isEmpty == true)

            // An empty cursor (a simulator with no devices answers one) is the start.
            #expect(try await control.call("GET", "/events?after=&limit=1").status == 200)
            // Bad filters: 400 naming the parameter, never a 500.
            for (query, field) in [("outcome=nope", "outcome"), ("after=garbage", "after"), ("wait=99", "wait"), ("limit=0", "limit"), ("token=xyz", "token"),
                                   ("colour=red", "colour"), ("device=a&device=b", "device")] {
                let r = try await control.call("GET", "/events?\(query)")
                #expect(r.status == 400 && r.json["error"]?["field"]?.stringValue == field, "\(query): \(r.status) \(r.json)")
            }
        }
    }

    @Test("GET /events?wait= answers as soon as a matching event arrives (long poll), and empty with its cursor when the time is up")
    func longPoll() async throws {
        try await SimFixture.with { f in
            let client = HTTPClient(eventLoopGroupProvider: .singleton)
            defer { Task { try? await client.shutdown() } }
            let control = Control(base: await f.sim.controlURL(), client: client)
            let cursor = try #require(try await control.call("GET", "/events").json["cursor"]?.stringValue)
            let h = f.headers()
            let id = h.first { $0.0 == "apns-id" }!.1
            // The poll is made first and waits; the push comes while it waits.
            let started = ContinuousClock.now
            async let polled = control.call("GET", "/events?apnsID=\(id)&wait=30&after=\(cursor)")
            try await eventually("the poll is waiting") { f.sim.world.changes.subscriberCount >= 1 }
            #expect(try await f.raw.send("/3/device/\(f.token)", headers: h, body: Pizza.update(f.clock.now, driver: "Polled").jsonBytes).status == 200)
            let answer = try await polled
            #expect(answer.json["events"]?.arrayValue?.map { $0["outcome"]?["code"]?.stringValue } == ["applied"])
            #expect(ContinuousClock.now - started < .seconds(25), "the poll waited for its time instead of answering on the event")
            // Nothing matches: empty after the wait, with a cursor to continue from.
            let empty = try await control.call("GET", "/events?outcome=throttled&wait=0.3")
            #expect(empty.status == 200 && empty.json["events"]?.arrayValue?.isEmpty == true && empty.json["cursor"]?.stringValue?.isEmpty == false)
        }
    }

    @Test("a provider token whose iat is a string of digits or a fraction (kalyke-apns, pyapns-client) is refused by default and taken with acceptsLooseIssuedAt")
    func looseIssuedAt() async throws {
        for loose in [false, true] {
            var c = SimFixture.instant
            c.device.acceptsLooseIssuedAt = loose
            try await SimFixture.with(configuration: c) { f in
                let seconds = Int(f.clock.now.timeIntervalSince1970)
                for literal in ["\"\(seconds)\"", "\(seconds).25"] {
                    // A fresh client per token: a connection keeps its first token's binding.
                    let raw = try RawAPNs(sim: f.sim, key: f.raw.key, keyID: f.raw.keyID, teamID: f.raw.teamID, register: false)
                    defer { Task { try? await raw.shutdown() } }
                    var h = f.headers()
                    h = Rules.replacing(h, "authorization", "bearer \(raw.jwt(iat: f.clock.now, iatLiteral: literal))")
                    let answer = try await raw.send("/3/device/\(f.token)", headers: h, body: Pizza.update(f.clock.now).jsonBytes)
                    #expect(answer.status == (loose ? 200 : 403), "iat \(literal), loose \(loose): \(answer.status) \(answer.reason ?? "")")
                }
            }
        }
    }

    @Test("a long poll sees what happens with time alone: the system ending an activity at 8 hours")
    func longPollSeesTimeTransitions() async throws {
        try await SimFixture.with { f in
            let client = HTTPClient(eventLoopGroupProvider: .singleton)
            defer { Task { try? await client.shutdown() } }
            let control = Control(base: await f.sim.controlURL(), client: client)
            let cursor = try #require(try await control.call("GET", "/events").json["cursor"]?.stringValue)
            async let polled = control.call("GET", "/events?activity=\(f.activity.id)&source=system&wait=20&after=\(cursor)")
            try await eventually("the poll is waiting") { f.sim.world.changes.subscriberCount >= 1 }
            f.clock.advance(by: 8 * 3600 + 1)
            let answer = try await polled
            #expect(answer.json["events"]?.arrayValue?.contains { $0["message"]?.stringValue?.contains("8 hours") == true } == true, "\(answer.json)")
        }
    }

    @Test("the fake APNs forgets a connection's token history once the connection ends (a long run does not keep one entry per connection)")
    func connectionsAreForgotten() async throws {
        try await SimFixture.with { f in
            let raw = try RawAPNs(sim: f.sim, key: f.raw.key, keyID: f.raw.keyID, teamID: f.raw.teamID, register: false)
            #expect(try await raw.send("/3/device/\(f.token)", headers: f.headers(), body: Pizza.update(f.clock.now).jsonBytes).status == 200)
            let before = f.sim.apns.trackedConnections
            #expect(before >= 1)
            try await raw.shutdown()
            try await eventually("the closed connection to be forgotten") { f.sim.apns.trackedConnections < before }
        }
    }

    @Test("a push applied with Unix time in a Date field has an outcome of its own (flagged), not applied")
    func flaggedOutcome() async throws {
        try await SimFixture.with { f in
            var aps: JSONObject = ["timestamp": .int(Int64(f.clock.now.timeIntervalSince1970)), "event": "update"]
            aps["content-state"] = ["driverName": "Late", "deliveryTimer": [1_767_225_600, 1_767_227_400]]
            let answer = try await f.raw.send("/3/device/\(f.token)", headers: f.headers(), body: JSONValue.object(["aps": .object(aps)]).jsonBytes)
            #expect(answer.status == 200)
            let event = try #require(try f.sim.world.device(f.device).events.last { $0.source == .push })
            #expect(event.outcome?.code == .flagged)
            #expect(event.outcome?.sentence.hasPrefix("Applied") == true && event.outcome?.field?.hasPrefix("content-state.deliveryTimer") == true)
            #expect(answer.header("isle-sim-outcome")?.hasPrefix("flagged: Applied") == true)
        }
    }
}
