import Foundation
import IsleCore
import IsleWire
import Testing

/// Seeded mutations of valid bodies, for every request type the API takes: the decoder never traps,
/// every refusal names a field that is in the body or that the type has, and whatever it accepts
/// reads back the same once written (`ISLE_WIRE_SEED` replays a run).
@Suite("The wire codec under seeded mutations")
struct WireFuzzTests {
    static let seed = ProcessInfo.processInfo.environment["ISLE_WIRE_SEED"].flatMap(UInt64.init) ?? 20_261_128

    static let token = JSONValue.string(String(repeating: "ab", count: 32))
    static let alert: JSONValue = ["title": "Hi", "body": ["loc-key": "K", "loc-args": ["a"]], "sound": "default"]

    /// A valid body of each request type, every field given.
    /// Computed (a metatype list is not Sendable, so it cannot be a stored static).
    static var valid: [(String, any Decodable.Type, JSONValue)] { [
        ("InstallationReport", API.InstallationReport.self, ["pushToStartTokens": ["T": token, "U": nil], "widgetToken": token, "controlsToken": nil, "liveActivitiesEnabled": true,
                                                             "frequentPushesEnabled": false, "environment": "development", "ticket": "a.b.c"]),
        ("ActivityRegistration", API.ActivityRegistration.self, ["attributesType": "T", "token": token, "channelID": "c", "externalKey": "k", "topics": ["a", "b"],
                                                                 "attributes": ["n": 1], "contentState": ["s": "x"], "relevanceScore": 0.5, "environment": "sandbox",
                                                                 "ticket": "a.b.c", "installationID": "i"]),
        ("TokenReport", API.TokenReport.self, ["token": token]),
        ("UserBinding", API.UserBinding.self, ["userID": "u"]),
        ("KeyBinding", API.KeyBinding.self, ["externalKey": nil]),
        ("Update", API.Update.self, ["contentState": ["a": [1, 2]], "alert": alert, "staleDate": 1_790_000_000, "relevanceScore": 1, "priority": 5, "sendAt": 1_790_000_100.5]),
        ("End", API.End.self, ["contentState": nil, "alert": alert, "staleDate": 1_790_000_000, "dismissalDate": 1_790_000_500, "priority": 10]),
        ("Start", API.Start.self, ["attributesType": "T", "attributes": [:], "contentState": [:], "alert": ["title": "t", "body": "b"], "externalKey": "k", "topics": [],
                                   "sendAt": 1_790_000_000]),
        ("ChannelCreation", API.ChannelCreation.self, ["storagePolicy": 1, "environment": "production"]),
        ("WebhookCreation", API.WebhookCreation.self, ["url": "https://example.com/hook", "eventTypes": ["push.failed"]]),
        ("WebhookChange", API.WebhookChange.self, ["url": "http://127.0.0.1:8080/x", "eventTypes": nil, "enabled": false]),
        ("WebhookRotation", API.WebhookRotation.self, ["overlapSeconds": 60]),
        ("WebhookReplay", API.WebhookReplay.self, ["after": "evt_12"]),
        ("WebhookRedelivery", API.WebhookRedelivery.self, ["eventID": "evt_3"]),
    ] }

    static func randomValue(_ r: inout SeededRandom, depth: Int = 0) -> JSONValue {
        switch Int.random(in: 0..<(depth > 2 ? 6 : 8), using: &r) {
        case 0: return .null
        case 1: return .bool(Bool.random(using: &r))
        case 2: return .int(Int64.random(in: -3...3, using: &r) * [1, 1_000, 1_790_000_000, Int64.max / 4][Int.random(in: 0..<4, using: &r)])
        case 3: return .double([0.5, -1e300, 1e19, 1_790_000_000.25, 1e-9][Int.random(in: 0..<5, using: &r)])
        case 4: return .string(["", "x", "evt_1", "a.b.c", "sandbox", String(repeating: "é", count: 300), "https://example.com", "ab"][Int.random(in: 0..<8, using: &r)])
        case 5: return .string(String(repeating: "ab", count: Int.random(in: 0...300, using: &r)))
        case 6: return .array((0..<Int.random(in: 0...3, using: &r)).map { _ in randomValue(&r, depth: depth + 1) })
        default:
            var o = JSONObject()
            for _ in 0..<Int.random(in: 0...3, using: &r) { o[["a", "title", "loc-key", "body", "x"][Int.random(in: 0..<5, using: &r)]] = randomValue(&r, depth: depth + 1) }
            return .object(o)
        }
    }

    /// One mutation of `value`: a field removed, replaced, added, or a nested one changed.
    static func mutate(_ value: JSONValue, _ r: inout SeededRandom) -> JSONValue {
        guard var o = value.objectValue, !o.isEmpty else { return Bool.random(using: &r) ? randomValue(&r) : value }
        let key = o.keys[Int.random(in: 0..<o.keys.count, using: &r)]
        switch Int.random(in: 0..<4, using: &r) {
        case 0: o[key] = nil
        case 1: o[key] = randomValue(&r)
        case 2: o["unknown\(Int.random(in: 0..<3, using: &r))"] = randomValue(&r)
        default: o[key] = mutate(o[key]!, &r)
        }
        return .object(o)
    }

    static func fields(_ value: JSONValue, prefix: String = "") -> Set<String> {
        var out: Set<String> = []
        if let o = value.objectValue {
            for (k, v) in o {
                let name = prefix.isEmpty ? k : "\(prefix).\(k)"
                out.insert(name)
                out.formUnion(fields(v, prefix: name))
            }
        } else if let a = value.arrayValue {
            for (i, v) in a.enumerated() {
                let name = "\(prefix)[\(i)]"
                out.insert(name)
                out.formUnion(fields(v, prefix: name))
            }
        }
        return out
    }

    static func roundTrip<T: Decodable>(_ type: T.Type, _ body: JSONValue) throws -> (accepted: Bool, error: WireDecodingError?) {
        do {
            let value = try WireDecoder.decode(type, from: body)
            guard let encodable = value as? any Encodable else { return (true, nil) }
            let written = WireEncoder.encode(encodable)
            _ = try WireDecoder.decode(type, from: written)
            return (true, nil)
        } catch {
            return (false, error)
        }
    }

    @Test("every valid body reads, and reads back the same once written")
    func validBodies() throws {
        for (name, type, body) in Self.valid {
            let (accepted, error) = try Self.roundTrip(type, body)
            #expect(accepted, "\(name): \(error?.reason ?? "")")
        }
    }

    @Test("2,000 seeded mutations per type: no trap, every refusal names a field of the body or of the type, every acceptance round-trips")
    func mutations() throws {
        var r = SeededRandom(seed: Self.seed)
        var refused = 0, accepted = 0
        for (name, type, body) in Self.valid {
            let known = Self.fields(body)
            for i in 0..<2_000 {
                var mutated = body
                for _ in 0..<Int.random(in: 1...3, using: &r) { mutated = Self.mutate(mutated, &r) }
                let (ok, error) = try Self.roundTrip(type, mutated)
                if ok { accepted += 1; continue }
                refused += 1
                let e = try #require(error)
                #expect(!e.reason.isEmpty, "\(name) #\(i): an empty reason")
                let field = e.field
                let named = field == "body" || known.contains(field) || Self.fields(mutated).contains(field)
                    || known.contains(where: { field.hasPrefix($0 + ".") || field.hasPrefix($0 + "[") })
                #expect(named, "\(name) #\(i) (seed \(Self.seed)): the refusal names \(field), which is neither in the body nor the type's: \(e.reason); body \(mutated.jsonString)")
                #expect(e.reason.contains(field.split(separator: ".").last.map(String.init)?.split(separator: "[").first.map(String.init) ?? field) || field == "body",
                        "\(name) #\(i): the reason does not say which field: \(e.reason)")
            }
        }
        #expect(refused > 1_000 && accepted > 100, "refused \(refused), accepted \(accepted): the mutations exercise both ways")
    }
}
