import Foundation
import IsleCore
import Testing

/// A stored or received `aps` read back as the typed payload: what a server stores for a queued
/// push (``LiveActivityPayload/apsWithoutTimestamp``) decodes to the payload it came from.
@Suite("Payload decoding")
struct PayloadDecodingTests {
    static let now = Date(timeIntervalSince1970: 1_767_225_600)

    /// A random payload of every shape the API builds: whole-second dates (APNs' form), plain or
    /// localized alerts, with or without sound, start fields.
    static func random(_ r: inout SeededRandom) -> LiveActivityPayload {
        func maybe<T>(_ make: () -> T) -> T? { Bool.random(using: &r) ? make() : nil }
        func text() -> AlertText {
            Bool.random(using: &r) ? .plain("t\(Int.random(in: 0..<100, using: &r))")
                : .localized(key: "K\(Int.random(in: 0..<9, using: &r))", arguments: (0..<Int.random(in: 0..<3, using: &r)).map { "a\($0)" })
        }
        let event = [LiveActivityEvent.start, .update, .end].randomElement(using: &r)!
        let seconds = { Date(timeIntervalSince1970: Double(1_767_225_600 + Int.random(in: 0..<86_400, using: &r))) }
        var p = LiveActivityPayload(event: event, timestamp: now)
        p.contentState = event == .end ? maybe { ["n": .int(Int64.random(in: 0..<9, using: &r))] } : ["n": .int(Int64.random(in: 0..<9, using: &r)), "s": "x"]
        p.staleDate = maybe(seconds)
        p.relevanceScore = maybe { Double(Int.random(in: 0..<100, using: &r)) / 4 }
        p.alert = maybe { LiveActivityAlert(title: text(), body: text(), sound: [nil, .default, .named("chime.caf")].randomElement(using: &r)!) }
        if event == .end { p.dismissalDate = maybe(seconds) }
        if event == .start {
            p.attributesType = "PizzaDeliveryAttributes"
            p.attributes = ["order": .int(Int64.random(in: 0..<1000, using: &r))]
            p.inputPushToken = Bool.random(using: &r)
            p.inputPushChannel = maybe { "ch\(Int.random(in: 0..<9, using: &r))" }
        }
        return p
    }

    @Test("round trip: a stored aps decodes to the payload it was encoded from", arguments: [1, 2, 3] as [UInt64])
    func roundTrip(seed: UInt64) throws {
        var r = SeededRandom(seed: seed)
        for _ in 0..<300 {
            let p = Self.random(&r)
            let stored = p.apsWithoutTimestamp
            #expect(stored[APSKey.timestamp] == nil)
            let back = try LiveActivityPayload(aps: stored, timestamp: Self.now)
            #expect(back == p, "seed \(seed)")
            // And through its compact text, as the store holds it.
            let text = JSONValue.object(stored).jsonBytes
            let parsed = try #require(try JSONParser.parse(text).objectValue)
            #expect(try LiveActivityPayload(aps: parsed, timestamp: Self.now) == p)
            // The wire form spliced from that text is the payload's own encoding.
            #expect(LiveActivityPayload.wireBytes(encodedAPS: text, timestamp: ActivityKitEncoding.unixSeconds(Self.now)) == p.encoded)
            #expect(LiveActivityPayload.wireSize(encodedAPSCount: text.count, timestamp: ActivityKitEncoding.unixSeconds(Self.now)) == p.encoded.count)
        }
    }

    @Test("an aps that is not a Live Activity payload names the key and what was expected")
    func errors() throws {
        func error(_ aps: JSONObject) -> PayloadDecodingError? {
            do { _ = try LiveActivityPayload(aps: aps, timestamp: Self.now); return nil } catch { return error }
        }
        #expect(error([:]) == PayloadDecodingError(field: "event", reason: "required: start, update or end"))
        #expect(error(["event": "begin"])?.field == "event")
        #expect(error(["event": "update", "stale-date": "soon"])?.field == "stale-date")
        #expect(error(["event": "update", "relevance-score": "high"])?.field == "relevance-score")
        #expect(error(["event": "update", "alert": ["title": "T"]])?.field == "alert.body")
        #expect(error(["event": "update", "alert": ["title": ["loc-args": []], "body": "B"]])?.field == "alert.title")
        #expect(error(["event": "update", "alert": ["title": ["loc-key": "K", "loc-args": [1]], "body": "B"]])?.field == "alert.title.loc-args")
        #expect(error(["event": "update", "alert": ["title": "T", "body": "B", "sound": 1]])?.field == "alert.sound")
        #expect(error(["event": "update", "custom": 1])?.field == "custom", "a key Isle would drop when it encodes the payload again")
        #expect(error(["event": "start", "attributes-type": 7])?.field == "attributes-type")
        // The timestamp, when present, is read; otherwise the one given stands in.
        #expect(try LiveActivityPayload(aps: ["event": "end", "timestamp": 1_767_225_700], timestamp: Self.now).timestamp == Date(timeIntervalSince1970: 1_767_225_700))
    }
}
