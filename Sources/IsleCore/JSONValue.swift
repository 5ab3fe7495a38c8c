import Foundation

/// A JSON value that keeps what `JSONDecoder` cares about and what Isle must report on:
/// object key order (so the bytes Isle writes are stable), and the literal form of every number
/// (so `1`, `1.0` and `1e3` can be told apart, the way ActivityKit's decoder tells them apart).
public enum JSONValue: Sendable, Hashable {
    case null
    case bool(Bool)
    case number(JSONNumber)
    case string(String)
    case array([JSONValue])
    case object(JSONObject)

    public static func int(_ value: Int64) -> JSONValue { .number(JSONNumber(value)) }
    public static func int(_ value: Int) -> JSONValue { .number(JSONNumber(Int64(value))) }
    public static func double(_ value: Double) -> JSONValue { .number(JSONNumber(value)) }

    /// The name JSON gives this kind of value, as used in error messages ("found a string").
    public var kindName: String {
        switch self {
        case .null: "null"
        case .bool: "a boolean"
        case .number(let n): n.isIntegerLiteral ? "an integer" : "a number"
        case .string: "a string"
        case .array: "an array"
        case .object: "an object"
        }
    }

    /// A short rendering of the value for messages: `"abc"`, `12`, `[…2 items]`, `{…}`.
    public var briefDescription: String {
        switch self {
        case .null: return "null"
        case .bool(let b): return b ? "true" : "false"
        case .number(let n): return n.literal
        case .string(let s):
            let clipped = s.count > 40 ? String(s.prefix(40)) + "…" : s
            return "\"\(clipped)\""
        case .array(let a): return "an array of \(a.count)"
        case .object: return "an object"
        }
    }

    public var objectValue: JSONObject? { if case .object(let o) = self { o } else { nil } }
    public var arrayValue: [JSONValue]? { if case .array(let a) = self { a } else { nil } }
    public var stringValue: String? { if case .string(let s) = self { s } else { nil } }
    public var numberValue: JSONNumber? { if case .number(let n) = self { n } else { nil } }
    public var boolValue: Bool? { if case .bool(let b) = self { b } else { nil } }
    public var isNull: Bool { if case .null = self { true } else { false } }

    public subscript(key: String) -> JSONValue? { objectValue?[key] }
}

/// A JSON number, kept as its literal text.
///
/// Equality is numeric: `1`, `1.0` and `1e0` are equal values (JSON semantics), while
/// ``isIntegerLiteral`` still says how it was written.
public struct JSONNumber: Sendable, Hashable, CustomStringConvertible {
    /// The number as it appears in JSON text.
    public let literal: String

    public init(_ value: Int64) { literal = String(value) }

    /// Writes a `Double` the way `JSONEncoder` does: integral values without a fraction,
    /// everything else in Swift's shortest round-tripping form.
    public init(_ value: Double) {
        precondition(value.isFinite, "JSON cannot represent \(value)")
        if value == value.rounded(), abs(value) < 1e15 {
            literal = String(Int64(value))
        } else {
            literal = String(describing: value)
        }
    }

    /// `literal` must already be a valid JSON number; the parser guarantees it.
    init(validatedLiteral: String) { literal = validatedLiteral }

    /// True when written without a fraction or exponent (`12`, `-3`).
    public var isIntegerLiteral: Bool { !literal.contains(where: { $0 == "." || $0 == "e" || $0 == "E" }) }

    public var doubleValue: Double { Double(literal) ?? .nan }

    /// The value as `Int64` when the literal is an integer that fits.
    public var int64Value: Int64? { isIntegerLiteral ? Int64(literal) : nil }

    /// The value as an exact integer, when it is one whatever the notation (`5`, `5.0`, `5e0`),
    /// and fits `Int64`. This is what `JSONDecoder` accepts for an `Int` property.
    public var exactInt64Value: Int64? {
        if let i = int64Value { return i }
        if isIntegerLiteral { return nil }  // an integer literal that overflows Int64
        let d = doubleValue
        guard d.isFinite, d == d.rounded(), d >= -9.223372036854775808e18, d < 9.223372036854775808e18 else { return nil }
        return Int64(d)
    }

    public var description: String { literal }

    public static func == (lhs: JSONNumber, rhs: JSONNumber) -> Bool {
        if lhs.literal == rhs.literal { return true }
        if let l = lhs.int64Value, let r = rhs.int64Value { return l == r }
        return lhs.doubleValue == rhs.doubleValue
    }

    public func hash(into hasher: inout Hasher) { hasher.combine(doubleValue) }
}

/// A JSON object that remembers the order its keys were written in.
/// Equality ignores order (JSON semantics); serialization follows it.
public struct JSONObject: Sendable, Hashable, Sequence, ExpressibleByDictionaryLiteral {
    public private(set) var keys: [String] = []
    private var storage: [String: JSONValue] = [:]

    public init() {}

    public init(dictionaryLiteral elements: (String, JSONValue)...) {
        for (k, v) in elements { self[k] = v }
    }

    public init(_ pairs: [(String, JSONValue)]) {
        for (k, v) in pairs { self[k] = v }
    }

    public var count: Int { keys.count }
    public var isEmpty: Bool { keys.isEmpty }

    /// Setting a value keeps the key's first position; setting `nil` removes it.
    public subscript(key: String) -> JSONValue? {
        get { storage[key] }
        set {
            if let newValue {
                if storage.updateValue(newValue, forKey: key) == nil { keys.append(key) }
            } else if storage.removeValue(forKey: key) != nil {
                keys.removeAll { $0 == key }
            }
        }
    }

    public func makeIterator() -> AnyIterator<(key: String, value: JSONValue)> {
        var index = 0
        return AnyIterator {
            guard index < keys.count else { return nil }
            defer { index += 1 }
            let k = keys[index]
            return (k, storage[k]!)
        }
    }

    public static func == (lhs: JSONObject, rhs: JSONObject) -> Bool { lhs.storage == rhs.storage }
    public func hash(into hasher: inout Hasher) { hasher.combine(storage) }
}

extension JSONValue: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByFloatLiteral,
    ExpressibleByBooleanLiteral, ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral, ExpressibleByNilLiteral
{
    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int64) { self = .int(value) }
    public init(floatLiteral value: Double) { self = .double(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(arrayLiteral elements: JSONValue...) { self = .array(elements) }
    public init(dictionaryLiteral elements: (String, JSONValue)...) { self = .object(JSONObject(elements)) }
    public init(nilLiteral: ()) { self = .null }
}

// MARK: - Writing

extension JSONValue {
    /// Compact JSON text: no spaces, keys in their recorded order, `/` not escaped.
    public var jsonString: String { String(decoding: jsonBytes, as: UTF8.self) }

    /// Indented JSON text for people.
    public var prettyJSONString: String {
        var out: [UInt8] = []
        write(into: &out, pretty: true, indent: 0)
        return String(decoding: out, as: UTF8.self)
    }

    /// The exact bytes Isle sends: compact UTF-8.
    public var jsonBytes: [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(128)
        write(into: &out, pretty: false, indent: 0)
        return out
    }
    /// The size of ``jsonBytes``.
    public var encodedSize: Int { jsonBytes.count }

    // Written as UTF-8 bytes, a string's unescaped runs copied whole: text is built once, at the end.
    private func write(into out: inout [UInt8], pretty: Bool, indent: Int) {
        switch self {
        case .null: out.append(contentsOf: "null".utf8)
        case .bool(let b): out.append(contentsOf: (b ? "true" : "false").utf8)
        case .number(let n): out.append(contentsOf: n.literal.utf8)
        case .string(let s): Self.writeString(s, into: &out)
        case .array(let items):
            if items.isEmpty { out.append(contentsOf: "[]".utf8); return }
            out.append(UInt8(ascii: "["))
            for (i, item) in items.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                if pretty { Self.newline(&out, indent + 1) }
                item.write(into: &out, pretty: pretty, indent: indent + 1)
            }
            if pretty { Self.newline(&out, indent) }
            out.append(UInt8(ascii: "]"))
        case .object(let object):
            if object.isEmpty { out.append(contentsOf: "{}".utf8); return }
            out.append(UInt8(ascii: "{"))
            for (i, entry) in object.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                if pretty { Self.newline(&out, indent + 1) }
                Self.writeString(entry.key, into: &out)
                out.append(UInt8(ascii: ":"))
                if pretty { out.append(UInt8(ascii: " ")) }
                entry.value.write(into: &out, pretty: pretty, indent: indent + 1)
            }
            if pretty { Self.newline(&out, indent) }
            out.append(UInt8(ascii: "}"))
        }
    }

    private static func hexDigit(_ n: UInt8) -> UInt8 { n < 10 ? UInt8(ascii: "0") + n : UInt8(ascii: "a") + n - 10 }

    private static func newline(_ out: inout [UInt8], _ indent: Int) {
        out.append(UInt8(ascii: "\n"))
        out.append(contentsOf: repeatElement(UInt8(ascii: " "), count: 2 * indent))
    }

    static func writeString(_ s: String, into out: inout String) {
        var bytes: [UInt8] = []
        writeString(s, into: &bytes)
        out += String(decoding: bytes, as: UTF8.self)
    }

    /// A JSON string literal: `"` and `\` escaped, control characters as `\n` and the like or
    /// `\u00XX`; everything else (UTF-8 beyond ASCII included) as it is.
    static func writeString(_ s: String, into out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        var s = s
        s.withUTF8 { utf8 in
            var runStart = 0
            for (i, byte) in utf8.enumerated() where byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") {
                out.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[runStart..<i]))
                runStart = i + 1
                switch byte {
                case UInt8(ascii: "\""): out.append(contentsOf: #"\""#.utf8)
                case UInt8(ascii: "\\"): out.append(contentsOf: #"\\"#.utf8)
                case UInt8(ascii: "\n"): out.append(contentsOf: #"\n"#.utf8)
                case UInt8(ascii: "\r"): out.append(contentsOf: #"\r"#.utf8)
                case UInt8(ascii: "\t"): out.append(contentsOf: #"\t"#.utf8)
                case 0x08: out.append(contentsOf: #"\b"#.utf8)
                case 0x0C: out.append(contentsOf: #"\f"#.utf8)
                default:
                    out.append(contentsOf: #"\u00"#.utf8)
                    out.append(hexDigit(byte >> 4))
                    out.append(hexDigit(byte & 0xF))
                }
            }
            out.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[runStart...]))
        }
        out.append(UInt8(ascii: "\""))
    }
}
