import Foundation

/// Why a text is not JSON, and where: "expected ':' after an object key at line 1, column 14".
public struct JSONParseError: Error, Sendable, Equatable, CustomStringConvertible {
    public let reason: String
    public let offset: Int
    public let line: Int
    public let column: Int

    public var description: String { "\(reason) at line \(line), column \(column)" }
}

/// A strict RFC 8259 parser (the grammar `JSONDecoder` accepts), keeping key order, number
/// literals, and the paths of keys that appear twice in one object.
public struct JSONParser {
    public struct Result: Sendable {
        public var value: JSONValue
        /// JSON paths (`$.aps.alert`) of objects in which a key appeared more than once; the
        /// last occurrence wins, as in `JSONSerialization`.
        public var duplicateKeys: [String]
    }

    public static let maximumDepth = 512

    public static func parse(_ text: String) throws(JSONParseError) -> JSONValue {
        try parseWithDiagnostics(Array(text.utf8)).value
    }

    public static func parse(_ bytes: some Collection<UInt8>) throws(JSONParseError) -> JSONValue {
        try parseWithDiagnostics(Array(bytes)).value
    }

    public static func parseWithDiagnostics(_ bytes: [UInt8]) throws(JSONParseError) -> Result {
        var parser = Parser(bytes: bytes)
        parser.skipWhitespace()
        if parser.index == bytes.count { throw parser.error("the text is empty; expected a JSON value") }
        let value = try parser.parseValue(depth: 0)
        parser.skipWhitespace()
        if parser.index != bytes.count { throw parser.error("unexpected text after the JSON value") }
        return Result(value: value, duplicateKeys: parser.duplicates)
    }

    private struct Parser {
        let bytes: [UInt8]
        var index = 0
        var duplicates: [String] = []
        /// Where the parser is, as keys and indexes from the root; turned into a path string only
        /// when a duplicate key must be reported.
        var location: [PathStep] = []

        enum PathStep {
            case key(String)
            case index(Int)
        }

        func path(adding key: String) -> String {
            var path = "$"
            for step in location {
                switch step {
                case .key(let k): path = JSONPath.appending(k, to: path)
                case .index(let i): path = JSONPath.appending(index: i, to: path)
                }
            }
            return JSONPath.appending(key, to: path)
        }

        init(bytes: [UInt8]) { self.bytes = bytes }

        func error(_ reason: String, at position: Int? = nil) -> JSONParseError {
            let pos = min(position ?? index, bytes.count)
            var line = 1
            var lineStart = 0
            for i in 0..<pos where bytes[i] == UInt8(ascii: "\n") {
                line += 1
                lineStart = i + 1
            }
            // Count columns in characters, not bytes.
            let column = (String(decoding: bytes[lineStart..<pos], as: UTF8.self).count) + 1
            return JSONParseError(reason: reason, offset: pos, line: line, column: column)
        }

        mutating func skipWhitespace() {
            while index < bytes.count {
                switch bytes[index] {
                case 0x20, 0x09, 0x0A, 0x0D: index += 1
                default: return
                }
            }
        }

        func describeHere() -> String {
            guard index < bytes.count else { return "the end of the text" }
            let b = bytes[index]
            if b >= 0x21 && b < 0x7F { return "'\(Character(UnicodeScalar(b)))'" }
            return String(format: "byte 0x%02X", b)
        }

        mutating func parseValue(depth: Int) throws(JSONParseError) -> JSONValue {
            guard depth < JSONParser.maximumDepth else { throw error("nesting deeper than \(JSONParser.maximumDepth) levels") }
            skipWhitespace()
            guard index < bytes.count else { throw error("unexpected end of text; expected a value") }
            switch bytes[index] {
            case UInt8(ascii: "{"): return try parseObject(depth: depth)
            case UInt8(ascii: "["): return try parseArray(depth: depth)
            case UInt8(ascii: "\""): return .string(try parseString())
            case UInt8(ascii: "t"): try literal("true"); return .bool(true)
            case UInt8(ascii: "f"): try literal("false"); return .bool(false)
            case UInt8(ascii: "n"): try literal("null"); return .null
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number(try parseNumber())
            default:
                if bytes[index] == UInt8(ascii: "'") { throw error("strings must use double quotes, not single quotes") }
                throw error("unexpected \(describeHere()); expected a value")
            }
        }

        mutating func literal(_ word: String) throws(JSONParseError) {
            let w = Array(word.utf8)
            guard index + w.count <= bytes.count, Array(bytes[index..<index + w.count]) == w else {
                throw error("unexpected \(describeHere()); expected a value")
            }
            index += w.count
        }

        mutating func parseObject(depth: Int) throws(JSONParseError) -> JSONValue {
            index += 1
            var object = JSONObject()
            var reportedDuplicate = false
            skipWhitespace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "}") { index += 1; return .object(object) }
            while true {
                skipWhitespace()
                guard index < bytes.count else { throw error("unexpected end of text inside an object") }
                guard bytes[index] == UInt8(ascii: "\"") else {
                    if bytes[index] == UInt8(ascii: "'") { throw error("object keys must use double quotes, not single quotes") }
                    throw error("unexpected \(describeHere()); expected a quoted object key")
                }
                let key = try parseString()
                skipWhitespace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else {
                    throw error("expected ':' after the object key \"\(key)\"")
                }
                index += 1
                location.append(.key(key))
                let value = try parseValue(depth: depth + 1)
                location.removeLast()
                if object[key] != nil, !reportedDuplicate {
                    duplicates.append(path(adding: key))
                    reportedDuplicate = true
                }
                object[key] = value
                skipWhitespace()
                guard index < bytes.count else { throw error("unexpected end of text inside an object; expected ',' or '}'") }
                if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
                if bytes[index] == UInt8(ascii: "}") { index += 1; return .object(object) }
                throw error("unexpected \(describeHere()) after an object member; expected ',' or '}'")
            }
        }

        mutating func parseArray(depth: Int) throws(JSONParseError) -> JSONValue {
            index += 1
            var items: [JSONValue] = []
            skipWhitespace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "]") { index += 1; return .array(items) }
            while true {
                location.append(.index(items.count))
                items.append(try parseValue(depth: depth + 1))
                location.removeLast()
                skipWhitespace()
                guard index < bytes.count else { throw error("unexpected end of text inside an array; expected ',' or ']'") }
                if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
                if bytes[index] == UInt8(ascii: "]") { index += 1; return .array(items) }
                throw error("unexpected \(describeHere()) after an array element; expected ',' or ']'")
            }
        }

        mutating func parseNumber() throws(JSONParseError) -> JSONNumber {
            let start = index
            func isDigit(_ b: UInt8) -> Bool { b >= 0x30 && b <= 0x39 }
            if bytes[index] == UInt8(ascii: "-") { index += 1 }
            guard index < bytes.count, isDigit(bytes[index]) else { throw error("a '-' must be followed by a digit") }
            if bytes[index] == UInt8(ascii: "0") {
                index += 1
                if index < bytes.count, isDigit(bytes[index]) { throw error("numbers must not have leading zeros") }
            } else {
                while index < bytes.count, isDigit(bytes[index]) { index += 1 }
            }
            if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
                index += 1
                guard index < bytes.count, isDigit(bytes[index]) else { throw error("a '.' in a number must be followed by a digit") }
                while index < bytes.count, isDigit(bytes[index]) { index += 1 }
            }
            if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
                index += 1
                if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
                guard index < bytes.count, isDigit(bytes[index]) else { throw error("an exponent must have digits") }
                while index < bytes.count, isDigit(bytes[index]) { index += 1 }
            }
            let literal = String(decoding: bytes[start..<index], as: UTF8.self)
            guard Double(literal)?.isFinite ?? false else { throw error("the number \(literal) is out of range", at: start) }
            return JSONNumber(validatedLiteral: literal)
        }

        mutating func parseString() throws(JSONParseError) -> String {
            let start = index
            index += 1  // opening quote
            // Most strings have no escape: one validated copy of their bytes.
            var end = index
            while end < bytes.count, bytes[end] != UInt8(ascii: "\""), bytes[end] != UInt8(ascii: "\\"), bytes[end] >= 0x20 { end += 1 }
            if end < bytes.count, bytes[end] == UInt8(ascii: "\"") {
                guard let s = String(validating: bytes[index..<end], as: UTF8.self) else { throw error("invalid UTF-8 in a string", at: start) }
                index = end + 1
                return s
            }
            // Escapes: the bytes between them and each escape's UTF-8, validated once at the end (an
            // escape's bytes begin a scalar, so they cannot complete a run's broken sequence).
            var out: [UInt8] = []
            out.reserveCapacity(end - index + 16)
            while true {
                guard index < bytes.count else { throw error("unterminated string", at: start) }
                let b = bytes[index]
                if b == UInt8(ascii: "\"") {
                    index += 1
                    guard let s = String(validating: out, as: UTF8.self) else { throw error("invalid UTF-8 in a string", at: start) }
                    return s
                }
                if b < 0x20 { throw error("control character in a string; escape it (\\n, \\t, \\u00XX)") }
                if b == UInt8(ascii: "\\") {
                    index += 1
                    guard index < bytes.count else { throw error("unterminated escape in a string") }
                    let e = bytes[index]
                    index += 1
                    switch e {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(e)
                    case UInt8(ascii: "b"): out.append(0x08)
                    case UInt8(ascii: "f"): out.append(0x0C)
                    case UInt8(ascii: "n"): out.append(0x0A)
                    case UInt8(ascii: "r"): out.append(0x0D)
                    case UInt8(ascii: "t"): out.append(0x09)
                    case UInt8(ascii: "u"):
                        let unit = try hex4()
                        let scalar: UnicodeScalar
                        if (0xD800...0xDBFF).contains(unit) {
                            guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u") else {
                                throw error("unpaired UTF-16 surrogate \\u\(String(unit, radix: 16)) in a string")
                            }
                            index += 2
                            let low = try hex4()
                            guard (0xDC00...0xDFFF).contains(low) else { throw error("invalid UTF-16 low surrogate in a string") }
                            scalar = UnicodeScalar(0x10000 + ((UInt32(unit) - 0xD800) << 10) + (UInt32(low) - 0xDC00))!
                        } else if (0xDC00...0xDFFF).contains(unit) {
                            throw error("unpaired UTF-16 surrogate in a string")
                        } else {
                            scalar = UnicodeScalar(UInt32(unit))!
                        }
                        out.append(contentsOf: String(Character(scalar)).utf8)
                    default:
                        throw error("invalid escape '\\\(Character(UnicodeScalar(e)))' in a string", at: index - 2)
                    }
                    continue
                }
                out.append(b)
                index += 1
            }
        }

        mutating func hex4() throws(JSONParseError) -> UInt16 {
            guard index + 4 <= bytes.count, let v = UInt16(String(decoding: bytes[index..<index + 4], as: UTF8.self), radix: 16) else {
                throw error("\\u must be followed by four hex digits")
            }
            index += 4
            return v
        }
    }
}

/// JSON paths as Isle prints them: `$.aps.content-state.eta`, `$.aps.alert.title["loc-args"][0]`.
public enum JSONPath {
    public static func appending(_ key: String, to path: String) -> String {
        let plain = !key.isEmpty && key.allSatisfy { $0.isLetter || $0.isNumber || $0 == "_" || $0 == "-" }
        return plain ? "\(path).\(key)" : "\(path)[\(quoted(key))]"
    }

    public static func appending(index: Int, to path: String) -> String { "\(path)[\(index)]" }

    private static func quoted(_ key: String) -> String {
        var s = ""
        JSONValue.writeString(key, into: &s)
        return s
    }
}
