import Foundation
import IsleCore
import IsleDelivery
import IsleWire
import Testing

@Suite("The wire codec: requests read strictly, answers written whole")
struct WireCodecTests {
    static func parse(_ text: String) throws -> JSONValue { try JSONParser.parse(Array(text.utf8)) }

    static func refusal<T: Decodable>(_ type: T.Type, _ text: String) throws -> WireDecodingError? {
        do {
            _ = try WireDecoder.decode(type, from: try parse(text))
            return nil
        } catch let e as WireDecodingError { return e }
    }

    @Test("a request reads into its type; optional fields may be absent or null")
    func reads() throws {
        let u = try WireDecoder.decode(API.Update.self, from: try Self.parse(#"{"contentState":{"eta":5},"alert":{"title":"Hi","body":{"loc-key":"K","loc-args":["a"]}},"priority":10,"staleDate":1790000000.5,"sendAt":null}"#))
        #expect(u.contentState["eta"] == .int(5))
        #expect(u.alert?.title == .text("Hi"))
        #expect(u.alert?.body == .localized(key: "K", args: ["a"]))
        #expect(u.priority == .high)
        #expect(u.staleDate == Date(timeIntervalSince1970: 1_790_000_000.5))
        #expect(u.sendAt == nil)
    }

    @Test("each refusal names the field and what was expected", arguments: [
        (#"{}"#, "contentState", "contentState is required: an object"),
        (#"{"contentState":[]}"#, "contentState", "contentState must be an object"),
        (#"{"contentState":{},"colour":1}"#, "colour", "unknown field colour"),
        (#"{"contentState":{},"priority":7}"#, "priority", "priority must be 10, 5 or 1"),
        (#"{"contentState":{},"staleDate":1790000000000}"#, "staleDate", "staleDate must be Unix seconds"),
        (#"{"contentState":{},"alert":{"title":"a"}}"#, "alert.body", "alert.body is required"),
        (#"{"contentState":{},"alert":{"title":"a","body":"b","badge":1}}"#, "alert.badge", "unknown field alert.badge"),
        (#"{"contentState":{},"alert":{"title":{"loc-key":"k","x":1},"body":"b"}}"#, "alert.title.x", "unknown key x"),
        (#"{"contentState":{},"relevanceScore":"high"}"#, "relevanceScore", "relevanceScore must be a number"),
    ])
    func refusals(body: String, field: String, words: String) throws {
        let e = try #require(try Self.refusal(API.Update.self, body))
        #expect(e.field == field)
        #expect(e.reason.contains(words), "\(e.reason)")
    }

    @Test("strings keep their bounds and patterns; tokens are kept in lower case")
    func leaves() throws {
        let r = try WireDecoder.decode(API.ActivityRegistration.self, from: try Self.parse(#"{"attributesType":"T","installationID":"i","token":"ABCDEF0123456789ABCDEF0123456789","topics":["a","b"]}"#))
        #expect(r.token?.text == "abcdef0123456789abcdef0123456789")
        #expect(r.topics?.names == ["a", "b"])
        let long = String(repeating: "x", count: 129)
        #expect(try Self.refusal(API.ActivityRegistration.self, #"{"attributesType":"\#(long)","installationID":"i"}"#)?.field == "attributesType")
        #expect(try Self.refusal(API.ActivityRegistration.self, #"{"attributesType":"T","installationID":"i","token":"abc"}"#)?.field == "token")
        #expect(try Self.refusal(API.ActivityRegistration.self, #"{"attributesType":"T","installationID":"i","topics":["a",""]}"#)?.field == "topics[1]")
        let many = (0..<33).map { "\"t\($0)\"" }.joined(separator: ",")
        #expect(try Self.refusal(API.ActivityRegistration.self, #"{"attributesType":"T","installationID":"i","topics":[\#(many)]}"#)?.reason.contains("at most 32") == true)
        #expect(try Self.refusal(API.WebhookCreation.self, #"{"url":"ftp://x"}"#)?.field == "url")
        #expect(try Self.refusal(API.WebhookRedelivery.self, #"{"eventID":"42"}"#)?.field == "eventID")
        #expect(try WireDecoder.decode(API.WebhookReplay.self, from: try Self.parse(#"{"after":"evt_42"}"#)).after.sequence == 42)
    }

    @Test("a patch tells absent (keep) from null (clear) from a value (set)")
    func patches() throws {
        let keep = try WireDecoder.decode(API.InstallationReport.self, from: try Self.parse(#"{}"#))
        #expect(keep.widgetToken == nil)
        let clear = try WireDecoder.decode(API.InstallationReport.self, from: try Self.parse(#"{"widgetToken":null,"pushToStartTokens":{"A":null,"B":"00112233445566778899aabbccddeeff"}}"#))
        #expect(clear.widgetToken.map { if case .clear = $0 { true } else { false } } == true)
        #expect(clear.pushToStartTokens?.tokens["A"] == .some(nil))
        #expect(clear.pushToStartTokens?.tokens["B"] == .some("00112233445566778899aabbccddeeff"))
        let unbind = try WireDecoder.decode(API.UserBinding.self, from: try Self.parse(#"{"userID":null}"#))
        #expect(unbind.userID.value == nil)
        #expect(try Self.refusal(API.UserBinding.self, "{}")?.field == "userID")
    }

    @Test("answers write every field, null when it has none; sparse answers leave it out")
    func answers() throws {
        let a = API.Activity(id: "act_1", externalKey: nil, installationID: "i", attributesType: "T", attributes: nil, contentState: ["x": 1], state: .active, stateReason: nil,
                             hasToken: true, topics: [], relevanceScore: nil, staleDate: nil, startedAt: Date(timeIntervalSince1970: 1_790_000_000.7), endedAt: nil,
                             dismissedAt: nil, environment: .sandbox)
        let json = WireEncoder.encode(a)
        #expect(json["externalKey"] == .null)
        #expect(json["startedAt"] == .int(1_790_000_000))
        #expect(json["environment"] == "sandbox")
        #expect(json.objectValue?.keys.first == "id")
        let accepted = WireEncoder.encode(API.Accepted(accepted: 2))
        #expect(accepted == ["accepted": 2])
        let detail = WireEncoder.encode(API.ActivityDetail(activity: a, budget: API.Budget(per: .installation, used: 3, limit: 15), deliveries: [], moreDeliveries: nil))
        #expect(detail["id"] == "act_1")
        #expect(detail["budget"] == ["per": "installation", "used": 3, "limit": 15])
        #expect(detail["deliveries"] == [])
        #expect(detail["moreDeliveries"] == .null)
        // And back: an answer reads into its type.
        let back = try WireDecoder.decode(API.ActivityDetail.self, from: detail)
        #expect(back.activity.id == "act_1")
    }
}
