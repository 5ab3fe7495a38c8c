import Foundation
import IsleCore
import IsleSimulator
import IsleTesting
import Testing

/// A start at a set time (a match's kick-off): push-to-start with `sendAt` waits, scheduled, and
/// starts the activity then; a `sendAt` past the job deadline is refused when accepted, never left
/// to give up when due (docs/server.md, "Scheduling").
@Suite("Scheduled starts and the limit on sendAt")
struct ScheduledStartTests {
    @Test("push-to-start with sendAt starts nothing before then and the activity at the time; sendAt past the job deadline is a 422 naming it, for starts, updates and broadcasts")
    func scheduledStart() async throws {
        try await ServerFixture.with { f in
            let app = try f.sim.world.app(Pizza.bundleID, on: f.device)
            let pts = try #require(app.pushToStartTokens["PizzaDeliveryAttributes"])
            #expect(try await f.call("PUT", "/v1/installations/inst-s", key: f.deviceKey, body: ["pushToStartTokens": ["PizzaDeliveryAttributes": .string(pts)]]).status == 200)
            let kickOff = Int64(f.clock.now.timeIntervalSince1970) + 3600
            let body: JSONValue = ["attributesType": "PizzaDeliveryAttributes", "attributes": Pizza.attributes, "contentState": Pizza.state("Kick-off"),
                                   "alert": ["title": "The match", "body": "Kick-off"], "externalKey": "match-1", "sendAt": .int(kickOff)]
            let start = try await f.call("POST", "/v1/installations/inst-s/start", key: f.backendKey, body: body)
            #expect(start.status == 202, "\(start.json.jsonString)")
            let jobs = try await f.call("GET", "/v1/jobs", key: f.backendKey).json["jobs"]?.arrayValue ?? []
            #expect(jobs.contains { $0["kind"] == "start" && $0["state"] == "scheduled" && $0["dueAt"] == .int(kickOff) }, "\(jobs)")
            f.clock.advance(by: 1800)
            #expect(try f.sim.world.device(f.device).activities.contains { $0.startedBy == .push } == false, "nothing starts before sendAt")
            let halfway = try await f.call("GET", "/v1/jobs", key: f.backendKey).json["jobs"]?.arrayValue ?? []
            #expect(halfway.contains { $0["kind"] == "start" && $0["state"] == "scheduled" }, "still scheduled halfway: \(halfway)")
            f.clock.advance(by: 1800)
            try await f.waitForDevice("the activity starts at the kick-off") { d in d.activities.contains { $0.startedBy == .push && $0.contentState["driverName"] == "Kick-off" } }

            // Past the job deadline (8 hours): refused now, naming the field, for every kind of push.
            let late = Int64(f.clock.now.timeIntervalSince1970) + 9 * 3600
            var tooLate = body.objectValue!
            tooLate["sendAt"] = .int(late)
            tooLate["externalKey"] = "match-2"
            let refused = try await f.call("POST", "/v1/installations/inst-s/start", key: f.backendKey, body: .object(tooLate))
            #expect(refused.status == 422 && refused.json["error"]?["code"] == "sendAtTooLate" && refused.json["error"]?["field"] == "sendAt", "\(refused.json.jsonString)")
            let update = try await f.call("POST", "/v1/activities/by-key/match-1/update", key: f.backendKey, body: ["contentState": Pizza.state("x"), "sendAt": .int(late)])
            #expect(update.status == 422 && update.json["error"]?["code"] == "sendAtTooLate", "\(update.json.jsonString)")
            let channel = try #require(try await f.call("POST", "/v1/channels", key: f.backendKey, body: [:]).json["id"]?.stringValue)
            // A channel id is base64 (it may hold / and +): percent-encoded in the path.
            let broadcast = try await f.call("POST", "/v1/channels/\(channel.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)/update", key: f.backendKey, body: ["contentState": Pizza.state("x"), "sendAt": .int(late)])
            #expect(broadcast.status == 422 && broadcast.json["error"]?["code"] == "sendAtTooLate", "\(broadcast.json.jsonString)")
        }
    }
}
