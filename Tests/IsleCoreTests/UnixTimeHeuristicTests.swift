import Foundation
import IsleCore
import Testing

/// The "Unix time in a date field" warning (docs/payloads.md): only numbers that can be Unix
/// seconds (2008 to 2106) are called Unix time; Unix milliseconds are called milliseconds; a number
/// beyond both (`1e15`) is neither — no wrong "corrected" value is printed for it.
@Suite("Unix-time heuristic in date fields")
struct UnixTimeHeuristicTests {
    static let now = Date(timeIntervalSince1970: 1_767_225_600)
    static let schema = try! ActivitySchema(jsonText: """
        { "attributesType": "T", "attributes": {}, "contentState": { "eta": "date" } }
        """)

    static func kinds(_ eta: JSONValue) -> [SchemaNotice.Kind] {
        schema.contentState.decode(["eta": eta]).notices.map(\.kind)
    }

    static func issues(_ eta: String) -> [ValidationIssue] {
        let payload = #"{"aps":{"timestamp":1767225600,"event":"update","content-state":{"eta":\#(eta)}}}"#
        return PayloadValidator(options: .init(priority: .low, schema: schema, now: now)).validate(bytes: Array(payload.utf8)).issues
    }

    @Test("Unix seconds between 2008 and 2106 are Unix time; seconds since 2001 are not flagged")
    func plausibleSeconds() {
        #expect(Self.kinds(1_767_225_600) == [.unixTimeInDateField])
        #expect(Self.kinds(4_294_967_295) == [.unixTimeInDateField])
        #expect(Self.kinds(788_918_400) == [])
        let issue = Self.issues("1767225600").first { $0.code == .unixTimeInDateField }
        #expect(issue?.fix.contains("788918400") == true, "\(Self.issues("1767225600"))")
    }

    @Test("1e15 and other numbers past 2106 in seconds are not called Unix time")
    func notUnixTime() {
        for v in ["1e15", "1000000000000000", "4294967296", "100000000000", "1e300"] {
            let found = Self.issues(v)
            #expect(!found.contains { $0.code == .unixTimeInDateField }, "\(v): \(found)")
            #expect(!found.contains { $0.message.contains("looks like Unix time,") }, "\(v): \(found)")
        }
        #expect(Self.kinds(1e15) == [])
    }

    @Test("Unix milliseconds in a date field are reported as milliseconds, with the value in seconds since 2001")
    func milliseconds() throws {
        #expect(Self.kinds(1_767_225_600_000) == [.millisecondsInDateField])
        let found = Self.issues("1767225600000")
        #expect(!found.contains { $0.code == .unixTimeInDateField }, "\(found)")
        let issue = try #require(found.first { $0.code == .dateInMilliseconds }, "\(found)")
        #expect(issue.path == "$.aps.content-state.eta")
        #expect(issue.message.contains("milliseconds") && issue.fix.contains("Send 788918400"), "\(issue)")
    }
}
