import Foundation
import IsleCore
import IsleSimulator
import IsleTesting
import Testing

/// Priority 1 (`apns-priority: 1`, "prioritize the device's power, don't wake it"): Apple takes it
/// for broadcasts; a Live Activity push to a device token is sent at 10 or 5
/// (docs/server.md, "Priorities").
@Suite("Priority 1: a broadcast's, never a token's")
struct BroadcastPriorityTests {
    @Test("a channel update at priority 1 goes out at 1 and the phone applies it; to an activity's token, by id or key, priority 1 is a 422 naming the field")
    func priorityOne() async throws {
        try await ServerFixture.with { f in
            let (_, id) = try await f.appStartsActivity(key: "order-p1")
            for path in ["/v1/activities/\(id)/update", "/v1/activities/by-key/order-p1/update", "/v1/activities/\(id)/end"] {
                let refused = try await f.call("POST", path, key: f.backendKey, body: ["contentState": Pizza.state("x"), "priority": 1])
                #expect(refused.status == 422 && refused.json["error"]?["code"] == "priorityNotAllowed" && refused.json["error"]?["field"] == "priority", "\(path): \(refused.json.jsonString)")
            }
            let seven = try await f.call("POST", "/v1/activities/\(id)/update", key: f.backendKey, body: ["contentState": Pizza.state("x"), "priority": 7])
            #expect(seven.status == 400 && seven.json["error"]?["field"] == "priority", "\(seven.json.jsonString)")

            let created = try await f.call("POST", "/v1/channels", key: f.backendKey, body: ["storagePolicy": 0])
            let channel = try #require(created.json["id"]?.stringValue, "\(created.json.jsonString)")
            let a = try f.sim.world.requestActivity(bundleID: Pizza.bundleID, on: f.device, attributesType: "PizzaDeliveryAttributes", attributes: Pizza.attributes,
                                                   contentState: Pizza.state("Bill James"), pushType: .channel(channel))
            // A channel id is base64 (it may hold / and +): percent-encoded in the path.
            let sent = try await f.call("POST", "/v1/channels/\(channel.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)/update", key: f.backendKey, body: ["contentState": Pizza.state("quietly"), "priority": 1])
            #expect(sent.status == 202, "\(sent.json.jsonString)")
            try await eventually("the broadcast went out at priority 1 and APNs took it") {
                f.sim.apns.requestLog.contains { r in r.path.hasPrefix("/4/broadcasts") && r.status == 200 && r.headers.contains { $0 == ["apns-priority", "1"] } }
            }
            try await f.waitForDevice("the phone applies it") { d in d.activities.first { $0.id == a.id }?.contentState["driverName"] == "quietly" }
        }
    }
}
