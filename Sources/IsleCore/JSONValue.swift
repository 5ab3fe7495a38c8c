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
    public var jsonString: String {
        var out = ""
        write(into: &out, pretty: false, indent: 0)
        return out
    }

    /// Indented JSON text for people.
    public var prettyJSONString: String {
        var out = ""
        write(into: &out, pretty: true, indent: 0)
        return out
    }

    /// The exact bytes Isle sends: compact UTF-8.
    public var jsonBytes: [UInt8] { Array(jsonString.utf8) }
    /// The size of ``jsonBytes``, without copying them.
    public var encodedSize: Int { jsonString.utf8.count }

    private func write(into out: inout String, pretty: Bool, indent: Int) {
        switch self {
        case .null: out += "null"
        case .bool(let b): out += b ? "true" : "false"
        case .number(let n): out += n.literal
        case .string(let s): Self.writeString(s, into: &out)
        case .array(let items):
            if items.isEmpty { out += "[]"; return }
            out += "["
            for (i, item) in items.enumerated() {
                if i > 0 { out += "," }
                if pretty { out += "\n" + String(repeating: "  ", count: indent + 1) }
                item.write(into: &out, pretty: pretty, indent: indent + 1)
            }
            if pretty { out += "\n" + String(repeating: "  ", count: indent) }
            out += "]"
        case .object(let object):
            if object.isEmpty { out += "{}"; return }
            out += "{"
            for (i, entry) in object.enumerated() {
                if i > 0 { out += "," }
                if pretty { out += "\n" + String(repeating: "  ", count: indent + 1) }
                Self.writeString(entry.key, into: &out)
                out += pretty ? ": " : ":"
                entry.value.write(into: &out, pretty: pretty, indent: indent + 1)
            }
            if pretty { out += "\n" + String(repeating: "  ", count: indent) }
            out += "}"
        }
    }

    static func writeString(_ s: String, into out: inout String) {
        out += "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case "\u{08}": out += "\\b"
            case "\u{0C}": out += "\\f"
            default:
                if scalar.value < 0x20 {
                    let hex = String(scalar.value, radix: 16)
                    out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        out += "\""
    }
}
