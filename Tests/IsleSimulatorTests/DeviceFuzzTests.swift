import Foundation
import IsleCore
import IsleSimulator
import IsleTesting
import Testing

/// The device model against seeded random payloads: numbers past every integer and Double's range,
/// negative and fractional times, deep nesting, wrong types in every field. Whatever arrives, the
/// simulator answers and keeps working (a trap would end the test process). ISLE_FUZZ_SEED replays
/// a run.
@Suite("Simulated device: seeded random payloads never stop it")
struct DeviceFuzzTests {
    /// JSON texts of hostile values, as a sender could put them on the wire.
    static let leaves: [String] = [
        "0", "-1", "1", "0.5", "-0.0", "1e308", "-1e308", "1e400", "-1e400", "1e-400", "4.9e-324",
        "9223372036854775807", "9223372036854775808", "-9223372036854775809", "18446744073709551616",
        "123456789012345678901234567890", "788918400", "1767225600", "4102444800000", "-62135596800",
        "true", "false", "null", "\"\"", "\"x\"", "\"2026-01-01T00:00:00Z\"", "\"\\u0000\"", "\"\\ud83d\\ude00\"",
        "[]", "{}", "[1e308,1e308]", "[788918400,1e308]", "[-1e308,1e308]", "[1e400,0]", "[788918400]",
        "[788918400,788919900,1]", "[\"a\",\"b\"]", "{\"driverName\":1}",
        String(repeating: "[", count: 300) + String(repeating: "]", count: 300),
        String(repeating: "{\"a\":", count: 200) + "1" + String(repeating: "}", count: 200),
        "\"" + String(repeating: "y", count: 5000) + "\"",
    ]

    static let apsKeys = ["timestamp", "event", "content-state", "stale-date", "dismissal-date", "relevance-score", "alert",
                          "attributes-type", "attributes", "input-push-token", "sound", "content-changed", "badge"]

    static func pick<T>(_ items: [T], _ r: inout SeededRandom) -> T { items[Int(r.next() % UInt64(items.count))] }

    /// A value for `key`: mostly a plausible shape with hostile leaves, sometimes anything.
    static func value(for key: String, now: Int, _ r: inout SeededRandom) -> String {
        if r.next() % 4 == 0 { return pick(leaves, &r) }
        switch key {
        case "timestamp": return r.next() % 2 == 0 ? String(now + Int(r.next() % 100)) : pick(leaves, &r)
        case "event": return pick(["\"update\"", "\"end\"", "\"start\"", "\"bogus\"", "1"], &r)
        case "content-state":
            let name = r.next() % 3 == 0 ? pick(leaves, &r) : "\"Anne\""
            let timer = r.next() % 2 == 0 ? "[\(pick(leaves, &r)),\(pick(leaves, &r))]" : pick(leaves, &r)
            return "{\"driverName\":\(name),\"deliveryTimer\":\(timer)}"
        case "alert":
            return pick(["{\"title\":\(pick(leaves, &r)),\"body\":\(pick(leaves, &r))}",
                         "{\"title\":{\"loc-key\":\(pick(leaves, &r)),\"loc-args\":\(pick(leaves, &r))},\"body\":\"b\"}", "\"plain\""], &r)
        case "attributes-type": return pick(["\"PizzaDeliveryAttributes\"", "\"Other\"", pick(leaves, &r)], &r)
        case "attributes": return "{\"numberOfPizzas\":\(pick(leaves, &r)),\"totalAmount\":\(pick(leaves, &r)),\"orderNumber\":\(pick(leaves, &r))}"
        default: return pick(leaves, &r)
        }
    }

    @Test("2,000 pushes of random shape and values: every one answered, the device still applies a good update after them")
    func randomPayloads() async throws {
        let seed = UInt64(ProcessInfo.processInfo.environment["ISLE_FUZZ_SEED"] ?? "") ?? 20_261_125
        var r = SeededRandom(seed: seed)
        let f = try DeviceFixture()
        var activity = try await f.start()
        var answered = 0
        for i in 0..<2_000 {
            let now = Int(f.now.timeIntervalSince1970)
            var fields: [String] = []
            for key in Self.apsKeys where r.next() % 3 != 0 || key == "event" || key == "timestamp" {
                fields.append("\"\(key)\":\(Self.value(for: key, now: now, &r))")
            }
            let text = "{\"aps\":{" + fields.joined(separator: ",") + "}}"
            guard let payload = try? JSONParser.parse(Array(text.utf8)) else { continue }  // the fake APNs answers 400 before the device
            let type = Self.pick(["liveactivity", "liveactivity", "liveactivity", "widgets"], &r)
            let token: String
            if type == "widgets" {
                token = try #require(try f.world.app(Pizza.bundleID, on: f.device).widgetPushToken ?? activity.updateToken)
            } else {
                token = activity.updateToken ?? ""
            }
            let result = await f.push(token, payload, priority: Self.pick([1, 5, 10], &r), type: type)
            #expect(result.status > 0, "seed \(seed) push \(i): \(text.prefix(300))")
            answered += 1
            // Time moves too: seconds, hours, now and then past the activity's lifetime.
            try await f.world.advanceClock(by: Self.pick([0, 1, 30, 3600, 13 * 3600], &r))
            if try f.activity(activity.id).state != .active || activity.updateToken == nil {
                activity = try await f.start()
            }
        }
        #expect(answered >= 800, "most payloads parse and reach the device")
        // Still working: a good update applies.
        let good = await f.push(activity.updateToken!, Pizza.update(f.now.addingTimeInterval(1_000), driver: "After the storm"))
        #expect(good.outcome?.code == .applied, "seed \(seed): \(good.outcome?.sentence ?? "no outcome")")
    }
}
