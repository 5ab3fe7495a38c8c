import Foundation
import IsleCore
import IsleDelivery
import IsleServer
import IsleSimulator
import IsleTesting
import Testing

/// The server's promises against the simulator with its defaults — Apple's leeway on, as a new
/// user runs `isle sim` (docs/simulator.md, "Never kinder than Apple"): the budget as a phone
/// counts it, and nothing retried in silence (docs/server.md).
@Suite("The server against the simulator's default leeway")
struct LeewayTests {
    /// Waits until the activity has `n` deliveries recorded.
    static func delivered(_ f: ServerFixture, _ id: String, _ n: Int) async throws -> [JSONValue] {
        try await eventually("\(n) deliveries to \(id)") {
            try await f.call("GET", "/v1/activities/\(id)?deliveries=1000", key: f.backendKey).json["deliveries"]?.arrayValue?.count ?? 0 >= n
        }
        return try await f.call("GET", "/v1/activities/\(id)?deliveries=1000", key: f.backendKey).json["deliveries"]?.arrayValue ?? []
    }

    @Test("the priority-10 budget is the app's on the phone: after 18 priority-10 updates to one order an alert to another goes at 5 and the phone never throttles it (per activity, the phone throttles it)",
          arguments: [BudgetScope.installation, .activity])
    func budgetPerPhone(scope: BudgetScope) async throws {
        // The simulator's defaults: the budget counted per app on the device (Apple's stricter reading).
        try await ServerFixture.with(configure: { $0.device = SimulatorConfiguration() }, server: { $0.budgetScope = scope }) { f in
            let (_, first) = try await f.appStartsActivity(key: "order-1")
            let (other, second) = try await f.appStartsActivity(key: "order-2")
            for n in 1...18 {
                let r = try await f.call("POST", "/v1/activities/\(first)/update", key: f.backendKey, body: ["contentState": Pizza.state("Stop \(n)"), "priority": 10])
                #expect(r.status == 202, "\(r.json.jsonString)")
                // One at a time, so none is superseded: 18 sends.
                _ = try await Self.delivered(f, first, n)
            }
            let sent = try await Self.delivered(f, first, 18)
            let atTen = sent.filter { $0["priority"] == 10 }.count
            #expect(atTen == 15 && sent.filter { $0["downgraded"] == true }.count == 3, "15 at priority 10, then the budget is spent: \(sent.map { $0["priority"] ?? .null })")
            let before = try await f.call("GET", "/v1/activities/\(second)", key: f.backendKey).json["budget"]
            #expect(before == (scope == .installation ? ["per": "installation", "used": 15, "limit": 15] : ["per": "activity", "used": 0, "limit": 15]), "\(before ?? .null)")

            let alert = try await f.call("POST", "/v1/activities/\(second)/update", key: f.backendKey, body: ["contentState": Pizza.state("At your door"), "alert": ["title": "Pizza", "body": "At your door"]])
            #expect(alert.status == 202)
            let d = try #require(try await Self.delivered(f, second, 1).first)
            f.clock.advance(by: 5)   // what APNs holds back and priority 5's wait come due
            try await eventually("the phone applied or judged the alert") {
                try f.sim.world.device(f.device).events.contains { $0.apnsID == d["apnsID"]?.stringValue && $0.outcome != nil && $0.outcome?.code != .deferredLowPriority }
            }
            let throttled = try f.sim.world.device(f.device).events.filter { $0.outcome?.code == .throttled }
            switch scope {
            case .installation:
                #expect(d["priority"] == 5 && d["downgraded"] == true, "\(d)")
                #expect(throttled.isEmpty, "the phone throttled nothing Isle sent: \(throttled.map(\.message))")
                #expect(try f.deviceActivity(other.id)?.contentState["driverName"] == "At your door")
            case .activity:
                // Isle's kinder count believes the budget untouched; the phone counts per app.
                #expect(d["priority"] == 10, "\(d)")
                #expect(throttled.contains { $0.apnsID == d["apnsID"]?.stringValue }, "the phone throttled the alert")
            }
            // The console shows the budget as it is counted.
            let cookie = try await ConsoleTests.signIn(f)
            let console = try await ConsoleTests.send(f, "GET", "/console/activities/\(second)", cookie: cookie).text
            #expect(console.contains(scope == .installation ? "the app on this phone" : "this activity alone"), "\(console)")
        }
    }
}
