import Foundation
import IsleCommandLine
import IsleCore
import IsleSimulator
import IsleTesting
import Testing

/// A third-party client works against the simulator unchanged apart from host, port and CA:
/// curl with --http2 and a JWT from `isle jwt` (issue: IsleSimulator, Done when).
@Suite("curl against the simulator")
struct ThirdPartyClientTests {
    static var curl: String? {
        ["/usr/bin/curl", "/usr/local/bin/curl", "/bin/curl"].first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    @Test("curl --http2 with a JWT from isle jwt updates a simulated Live Activity")
    func curlPush() async throws {
        let curl = try #require(Self.curl, "curl is needed (.ci/run installs it)")
        try await IsleSim.withRunning(clock: SystemWallClock()) { sim in
            let key = TestProviderKey()
            try sim.apns.register(RegisteredKey(keyID: key.keyID, teamID: key.teamID, publicKeyPEM: key.publicKeyPEM))
            let keyPath = try key.writeP8()
            let caPath = (keyPath as NSString).deletingLastPathComponent + "/ca.pem"
            try sim.caCertificatePEM!.write(toFile: caPath, atomically: true, encoding: .utf8)
            let device = sim.world.createDevice(name: "iPhone")
            let schema = try ActivitySchema(jsonText: String(contentsOf: Readme.root.appendingPathComponent("Examples/PizzaDeliveryAttributes.schema.json"), encoding: .utf8))
            try sim.world.install(.init(bundleID: "com.example.pizza", schemas: [schema]), on: device)
            let activity = try sim.world.requestActivity(bundleID: "com.example.pizza", on: device, attributesType: "PizzaDeliveryAttributes",
                                                         attributes: ["numberOfPizzas": 3, "totalAmount": "$42.00", "orderNumber": "12345"],
                                                         contentState: ["driverName": "Bill James", "deliveryTimer": [788_918_400, 788_919_900]])
            let jwt = await IsleCLI.capture(["jwt", "--key", keyPath, "--key-id", key.keyID, "--team-id", key.teamID])
            #expect(jwt.status == 0)
            let body = #"{"aps":{"timestamp":\#(Int(Date().timeIntervalSince1970)),"event":"update","content-state":{"driverName":"Anne Johnson","deliveryTimer":[788918400,788919900]}}}"#
            let process = Process()
            process.executableURL = URL(fileURLWithPath: curl)
            process.arguments = ["--silent", "--show-error", "--http2", "--cacert", caPath, "--output", "/dev/null", "--write-out", "%{http_code} %{http_version}",
                                 "--header", "authorization: bearer \(jwt.out)", "--header", "apns-push-type: liveactivity",
                                 "--header", "apns-topic: com.example.pizza.push-type.liveactivity", "--header", "apns-priority: 10",
                                 "--data", body, "\(sim.apnsURL)/3/device/\(try await sim.world.waitForPushToken(activityID: activity.id, on: device))"]
            let out = Pipe()
            process.standardOutput = out
            try process.run()
            process.waitUntilExit()
            let answer = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            #expect(process.terminationStatus == 0)
            #expect(answer == "200 2")
            // Priority 10, on the simulator's defaults: APNs may hold it a moment (reordering), so wait as an app would.
            let world = sim.world
            try await eventually(within: .seconds(10), "the update on the Lock Screen") {
                try world.screen(deviceID: device).lockScreen.first?.contentState["driverName"] == "Anne Johnson"
            }
        }
    }
}
