import Foundation
import IsleCore
import IsleSimulator
import IsleStore
import IsleDelivery
import IsleTesting
import Testing

@Suite("Delivery engine policy", .serialized)
struct EnginePolicyTests {
    @Test("over the hourly budget, priority 10 is downgraded to 5 and the delivery says so")
    func budgetDowngrade() async throws {
        try await ServerFixture.with(configure: { $0.device.hourlyBudget = 100 }) { f in
            let (_, id) = try await f.appStartsActivity(key: "b")
            for i in 0..<16 {
                let r = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: [
                    "contentState": Pizza.state("d\(i)"), "alert": ["title": "Update", "body": .string("\(i)")],
                ])
                #expect(r.status == 202)
                f.clock.advance(by: 1)
            }
            try await eventually("16 deliveries") { (try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["deliveries"]?.arrayValue?.count ?? 0) == 16 }
            let deliveries = try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["deliveries"]!.arrayValue!
            // Per installation (the default) Isle keeps one of the 15 in hand (docs/server.md, "The
            // priority-10 budget"): 14 at priority 10, then 5.
            #expect(deliveries.prefix(14).allSatisfy { $0["priority"] == 10 && $0["downgraded"] == false })
            #expect(deliveries.suffix(2).allSatisfy { $0["priority"] == 5 && $0["downgraded"] == true })
        }
    }

    @Test("a request error (413) is never retried")
    func noRetryOnRequestError() async throws {
        try await ServerFixture.with { f in
            let (_, id) = try await f.appStartsActivity(key: "big")
            f.sim.apns.addFailure(FailureRule(status: 413, reason: "PayloadTooLarge", remaining: 5))
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("x")]).status == 202)
            try await eventually("the job failed") { try await SQLiteStore(path: f.databasePath).jobCounts()[.failed] == 1 }
            f.clock.advance(by: 3600)
            let deliveries = try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["deliveries"]?.arrayValue ?? []
            #expect(deliveries.map { $0["status"] } == [413])
            #expect(try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["state"] == "active")
        }
    }

    @Test("nothing is sent past the 8-hour life; the server's record ends it as the device does")
    func eightHours() async throws {
        try await ServerFixture.with { f in
            let (a, id) = try await f.appStartsActivity(key: "long")
            f.clock.advance(by: 8 * 3600)
            let before = f.sim.apns.requestLog.count
            #expect(try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("too late")]).status == 202)
            try await eventually("the server ended it") { try await f.call("GET", "/v1/activities/\(id)", key: f.backendKey).json["state"] == "ended" }
            #expect(f.sim.apns.requestLog.count == before)
            #expect(try f.deviceActivity(a.id)?.state == .ended)
            #expect(try await SQLiteStore(path: f.databasePath).jobCounts()[.dropped] == 1)
        }
    }
}

@Suite("Channels and broadcast through the server", .serialized)
struct ServerChannelTests {
    @Test("create a channel, subscribe an activity, broadcast an update, delete the channel")
    func broadcast() async throws {
        try await ServerFixture.with { f in
            let created = try await f.call("POST", "/v1/channels", key: f.backendKey, body: ["storagePolicy": 0])
            #expect(created.status == 201, "\(created.json.jsonString)")
            let channel = try #require(created.json["id"]?.stringValue)
            // Channel ids are base64: they may hold "/", "+" and "=", so paths carry them percent-encoded.
            let inPath = try #require(channel.addingPercentEncoding(withAllowedCharacters: .alphanumerics))
            guard case .found = f.sim.world.readChannel(bundleID: Pizza.bundleID, id: channel) else { Issue.record("APNs has no such channel"); return }
            let a = try f.sim.world.requestActivity(bundleID: Pizza.bundleID, on: f.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                                    contentState: Pizza.state("Bill"), pushType: .channel(channel))
            let reg = try await f.register(["attributesType": "PizzaDeliveryAttributes", "channelID": .string(channel)])
            #expect(reg.status == 201)
            let sent = try await f.call("POST", "/v1/channels/\(inPath)/update", key: f.backendKey, body: ["contentState": Pizza.state("Everyone"), "priority": 10])
            #expect(sent.status == 202, "\(sent.json.jsonString)")
            try await f.waitForDevice("the broadcast applied") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "Everyone" }
            // The server's record of the subscribed activity follows the broadcast, as the phone does.
            let isleID = try #require(reg.json["id"]?.stringValue)
            try await eventually("the record follows the broadcast") {
                try await f.call("GET", "/v1/activities/\(isleID)", key: f.backendKey).json["contentState"]?["driverName"] == "Everyone"
            }
            #expect(try await f.call("GET", "/v1/channels", key: f.backendKey).json.arrayValue?.count == 1)
            #expect(try await f.call("DELETE", "/v1/channels/\(inPath)", key: f.backendKey).status == 204)
            #expect(try await f.call("GET", "/v1/channels", key: f.backendKey).json.arrayValue?.isEmpty == true)
            let gone = try await f.call("POST", "/v1/channels/\(inPath)/update", key: f.backendKey, body: ["contentState": Pizza.state("x")])
            #expect(gone.status == 404)
            // A percent-encoded "/" reaches the handler as part of the id, not as a path separator.
            let slashed = try await f.call("POST", "/v1/channels/ab%2Fcd%2B%3D%3D/update", key: f.backendKey, body: ["contentState": Pizza.state("x")])
            #expect(slashed.status == 404 && slashed.json["error"]?["message"]?.stringValue?.contains("channel ab/cd+==") == true, "\(slashed.json.jsonString)")
            let bad = try await f.call("POST", "/v1/channels", key: f.backendKey, body: ["storagePolicy": 3])
            #expect(bad.status == 400 && bad.json["error"]?["field"] == "storagePolicy")
        }
    }
}
