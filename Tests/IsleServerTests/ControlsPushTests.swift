import Foundation
import IsleCore
import IsleSimulator
import IsleTesting
import Testing

/// `controls` pushes (iOS 18, WidgetKit's `ControlPushHandler`): the app hands Isle its control
/// push token; the backend asks for a reload; the simulated phone reloads the app's Control Center
/// controls. A dead token is retired and told (docs/server.md, "Controls").
@Suite("Controls pushes: Control Center controls reloaded by the backend")
struct ControlsPushTests {
    @Test("the app reports its control push token; a reload reaches the phone as a controls push; without a token it is a 409; a dead token is retired with token.retired")
    func controlsReload() async throws {
        try await ServerFixture.with { f in
            // Before the app reports one: nothing to push to.
            _ = try await f.installation("phone-c")
            let none = try await f.call("POST", "/v1/installations/phone-c/controls/reload", key: f.backendKey)
            #expect(none.status == 409 && none.json["error"]?["code"] == "noControlsToken", "\(none.json.jsonString)")

            let token = try #require(try f.sim.world.app(Pizza.bundleID, on: f.device).controlsPushToken, "the simulated app has a control push token (iOS 18+)")
            let report = try await f.call("PUT", "/v1/installations/phone-c", key: f.deviceKey, body: ["controlsToken": .string(token)], headers: f.secretHeader("phone-c"))
            #expect(report.status == 200 && report.json["hasControlsToken"] == true, "\(report.json.jsonString)")
            let accepted = try await f.call("POST", "/v1/installations/phone-c/controls/reload", key: f.backendKey)
            #expect(accepted.status == 202 && accepted.json["accepted"] == 1 && accepted.json["jobs"]?.arrayValue?.count == 1, "\(accepted.json.jsonString)")
            try await f.waitForDevice("the phone reloaded the app's controls") { d in d.apps[Pizza.bundleID]?.controlReloads == 1 }
            // APNs logs the request once it answered, a moment after the phone applied it.
            try await eventually("APNs logged the controls push") { f.sim.apns.requestLog.contains { $0.headers.contains(["apns-push-type", "controls"]) } }
            let sent = try #require(f.sim.apns.requestLog.last { $0.headers.contains(["apns-push-type", "controls"]) })
            // The log shows a token's ends only.
            #expect(sent.path.hasPrefix("/3/device/\(token.prefix(6).lowercased())") && sent.path.hasSuffix(String(token.suffix(6)).lowercased()), "\(sent.path) for \(token.prefix(6))…")
            #expect(sent.status == 200 && sent.headers.contains(["apns-push-type", "controls"]) && sent.headers.contains(["apns-topic", "\(Pizza.bundleID).push-type.controls"]),
                    "\(sent.headers)")
            #expect(sent.outcome?.code == .controlsReloaded)

            // The person deletes the app: the token answers 410, Isle forgets it and tells the backend.
            try f.sim.world.uninstall(bundleID: Pizza.bundleID, on: f.device)
            #expect(try await f.call("POST", "/v1/installations/phone-c/controls/reload", key: f.backendKey).status == 202)
            try await eventually("the dead control push token is retired") {
                try await f.call("GET", "/v1/events?limit=1000", key: f.backendKey).json["events"]?.arrayValue?.contains {
                    $0["type"] == "token.retired" && $0["data"]?["token"] == "controls" && $0["installationID"] == "phone-c"
                } == true
            }
            let after = try await f.call("PUT", "/v1/installations/phone-c", key: f.deviceKey, body: [:], headers: f.secretHeader("phone-c"))
            #expect(after.json["hasControlsToken"] == false, "\(after.json.jsonString)")
            // Null forgets a token too.
            _ = try await f.call("PUT", "/v1/installations/phone-c", key: f.deviceKey, body: ["controlsToken": .string(token)], headers: f.secretHeader("phone-c"))
            let cleared = try await f.call("PUT", "/v1/installations/phone-c", key: f.deviceKey, body: ["controlsToken": nil], headers: f.secretHeader("phone-c"))
            #expect(cleared.json["hasControlsToken"] == false, "\(cleared.json.jsonString)")
        }
    }
}
