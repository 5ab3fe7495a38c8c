import Foundation
import IsleCommandLine
import IsleCore
import IsleDemo
import IsleSimulator
import Testing

/// `isle demo` is also a test of the whole system: the server over HTTP, the fake APNs over
/// HTTP/2 + TLS, the simulated iPhone's rules (issue: "exits non-zero if any step's expected
/// device state is not reached").
@Suite struct DemoTests {
    @Test func theDemoPlaysEveryStepAndExitsZero() async throws {
        let r = await IsleCLI.capture(["demo", "--json", "--speed", "1e9"])
        #expect(r.status == 0, "stderr: \(r.err)")
        let events = try r.out.split(separator: "\n").map { try JSONParser.parse(Array($0.utf8)) }
        let steps = events.filter { $0["type"] == "step" }.compactMap { $0["step"]?.numberValue?.doubleValue }
        #expect(steps == [0, 1, 2, 3, 4, 5, 6, 7, 8])
        let checks = events.filter { $0["type"] == "check" }
        #expect(checks.count >= 20)
        #expect(checks.allSatisfy { $0["ok"] == .bool(true) })
        // What went over the wire: a start by push-to-start, priority-10 pushes downgraded to 5 in
        // the burst, a widgets push — each answered 200 with a device outcome.
        let wire = events.filter { $0["type"] == "wire" }
        #expect(wire.contains { $0["event"] == "start" && $0["outcome"] == "started" })
        #expect(wire.contains { $0["pushType"] == "widgets" && $0["outcome"] == "widgetsReloaded" })
        #expect(wire.allSatisfy { $0["status"] == .int(200) })
        #expect(!wire.contains { $0["outcome"] == "throttled" })
        let screens = events.filter { $0["type"] == "screen" }
        #expect(screens.contains { $0["lockScreen"]?.arrayValue?.first?["isStale"] == .bool(true) })
        #expect(screens.last?["dynamicIsland"] == "minimal")
        #expect(events.last?["type"] == "done")
        // The budget is the phone's (every activity of the app counts, an end goes at 10, and Isle
        // keeps one of the 15 in hand): 4 in the burst, 2 later.
        #expect(events.last?["deliveries"]?["downgraded"] == .int(6))
        // Progress lines while the services start go to stderr, never into the JSON.
        #expect(r.err.contains("waiting for the server's HTTP API"))
    }

    @Test func aPhoneThatDisagreesMakesTheDemoFail() async throws {
        // A phone with a stricter budget than the server's throttles the burst in step 3.
        var options = Demo.Options()
        options.speed = .infinity
        options.json = true
        options.device.hourlyBudget = 5
        let demo = Demo(options: options, out: { _ in }, progress: { _ in })
        await #expect {
            try await demo.run()
        } throws: { error in
            guard let f = error as? Demo.Failure else { return false }
            return f.step == 3 && f.expectation.contains("throttled none") && f.found.contains("throttled")
        }
    }

    @Test func badSpeedIsOneLine() async {
        let r = await IsleCLI.capture(["demo", "--speed", "0"])
        #expect(r.status != 0)
        #expect(r.err.split(separator: "\n").count == 1)
        #expect(r.err.contains("--speed"))
    }
}
