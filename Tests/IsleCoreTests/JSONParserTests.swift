import IsleCore
import Testing

@Suite("JSON parser")
struct JSONParserTests {
    @Test("keeps key order and number literals")
    func orderAndLiterals() throws {
        let v = try JSONParser.parse(#"{"b":1,"a":1.0,"c":1e2,"d":-0.5}"#)
        #expect(v.objectValue?.keys == ["b", "a", "c", "d"])
        #expect(v.jsonString == #"{"b":1,"a":1.0,"c":1e2,"d":-0.5}"#)
        #expect(v["b"]?.numberValue?.isIntegerLiteral == true)
        #expect(v["a"]?.numberValue?.isIntegerLiteral == false)
        #expect(v["a"]?.numberValue?.exactInt64Value == 1)
        #expect(v["c"]?.numberValue?.exactInt64Value == 100)
        #expect(v["d"]?.numberValue?.exactInt64Value == nil)
        // Numeric equality, as JSON means it.
        #expect(try JSONParser.parse("1") == JSONParser.parse("1.0"))
    }

    @Test("strings: escapes, unicode, surrogate pairs")
    func strings() throws {
        let v = try JSONParser.parse(#"["a\"b\\c\/d\n\t\u00e9\ud83c\udf55", "🍕"]"#)
        #expect(v.arrayValue?[0].stringValue == "a\"b\\c/d\n\té🍕")
        #expect(v.arrayValue?[1].stringValue == "🍕")
        #expect(JSONValue.string("a\"\n\u{01}").jsonString == #""a\"\n\u0001""#)
    }

    @Test("reports duplicate keys with their path")
    func duplicates() throws {
        let r = try JSONParser.parseWithDiagnostics(Array(#"{"aps":{"event":"update","event":"end"}}"#.utf8))
        #expect(r.duplicateKeys == ["$.aps.event"])
        #expect(r.value["aps"]?["event"] == "end")
    }

    struct Bad: Sendable, CustomTestStringConvertible {
        let text: String
        let reason: String
        let line: Int
        let column: Int
        var testDescription: String { text }
    }

    @Test("rejects invalid JSON saying where and why", arguments: [
        Bad(text: "", reason: "empty", line: 1, column: 1),
        Bad(text: "{\"a\":1,}", reason: "expected a quoted object key", line: 1, column: 8),
        Bad(text: "{\"a\" 1}", reason: "expected ':'", line: 1, column: 6),
        Bad(text: "[1 2]", reason: "expected ',' or ']'", line: 1, column: 4),
        Bad(text: "{'a':1}", reason: "double quotes", line: 1, column: 2),
        Bad(text: "01", reason: "leading zeros", line: 1, column: 2),
        Bad(text: "1.", reason: "followed by a digit", line: 1, column: 3),
        Bad(text: "\"abc", reason: "unterminated string", line: 1, column: 1),
        Bad(text: "{\"a\":\n  tru}", reason: "expected a value", line: 2, column: 3),
        Bad(text: "{} x", reason: "unexpected text after", line: 1, column: 4),
        Bad(text: "\"\\x\"", reason: "invalid escape", line: 1, column: 2),
        Bad(text: "\"\\ud83c\"", reason: "surrogate", line: 1, column: 8),
        Bad(text: "1e999", reason: "out of range", line: 1, column: 1),
        Bad(text: "\"a\u{01}\"", reason: "control character", line: 1, column: 3),
    ])
    func invalid(_ bad: Bad) {
        do {
            _ = try JSONParser.parse(bad.text)
            Issue.record("parsed \(bad.text)")
        } catch {
            #expect(error.reason.contains(bad.reason), "\(error)")
            #expect(error.line == bad.line)
            #expect(error.column == bad.column)
        }
    }

    @Test("rejects nesting deeper than the limit")
    func depth() {
        let deep = String(repeating: "[", count: 600) + String(repeating: "]", count: 600)
        #expect(throws: JSONParseError.self) { try JSONParser.parse(deep) }
    }

    @Test("rejects invalid UTF-8")
    func invalidUTF8() {
        #expect(throws: JSONParseError.self) { try JSONParser.parse([0x22, 0xFF, 0x22]) }
    }

    @Test("strings of every kind survive writing and parsing, and Foundation reads what is written the same")
    func stringRoundTrip() throws {
        // Seeded: quotes, backslashes, every control character, `/`, ASCII, two-, three- and
        // four-byte UTF-8, in runs and alone, as keys and as values.
        var random = SeededRandom(seed: 0x150_1E)
        let pool: [Unicode.Scalar] = ["\"", "\\", "/", "a", "Z", " ", "\u{7F}", "é", "–", "€", "\u{FFFD}", "😀", "𝄞", "\u{2028}"]
            + (0..<0x20).map { Unicode.Scalar($0)! }
        for _ in 0..<2_000 {
            var scalars = String.UnicodeScalarView()
            for _ in 0..<Int.random(in: 0...24, using: &random) { scalars.append(pool.randomElement(using: &random)!) }
            let text = String(scalars)
            let value: JSONValue = ["k" + text: .string(text), "list": [.string(text), .string("")]]
            let written = value.jsonString
            #expect(try JSONParser.parse(written) == value, "\(written)")
            #expect(value.jsonBytes == Array(written.utf8))
            #expect(value.encodedSize == written.utf8.count)
            let foundation = try JSONSerialization.jsonObject(with: Data(written.utf8)) as? [String: Any]
            #expect(foundation?["k" + text] as? String == text)
            // Every control character is escaped; nothing else is.
            #expect(!written.utf8.contains { $0 < 0x20 })
        }
        // The escapes Isle writes, exactly.
        #expect(JSONValue.string("\"\\\n\r\t\u{08}\u{0C}\u{01}\u{1F}/é").jsonString == #""\"\\\n\r\t\b\f\u0001\u001f/é""#)
        #expect(JSONValue.object(["a": .array([1, "x"])]).prettyJSONString == "{\n  \"a\": [\n    1,\n    \"x\"\n  ]\n}")
    }

    @Test("writes doubles as JSONEncoder does")
    func doubles() throws {
        for d in [0.0, 1.0, 0.941, 0.23, -2.5, 788918400.0, 1e-5, 123456789.125] {
            let ours = JSONValue.double(d).jsonString
            let encoder = String(decoding: try JSONEncoder().encode([d]), as: UTF8.self).dropFirst().dropLast()
            #expect(ours == String(encoder), "\(d)")
        }
    }
}

import Foundation
