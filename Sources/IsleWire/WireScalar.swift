public import Foundation
public import IsleCore

/// Where a request body is wrong: the field (`alert.title`, `topics[2]`, or `body`) and what was
/// expected there, in words a backend developer can act on.
public struct WireDecodingError: Error, Sendable, CustomStringConvertible {
    public var field: String
    public var reason: String
    /// `invalidField`, or a more specific code a leaf type chose (`tooLarge`, …).
    public var code: String

    public init(field: String, reason: String, code: String = "invalidField") {
        self.field = field
        self.reason = reason
        self.code = code
    }

    public var description: String { reason }
}

/// A value the wire carries as one JSON value, which checks itself and states its own schema: the
/// leaves of the API's types (strings with bounds, tokens, dates, enums). The codecs
/// (``WireDecoder``, ``WireEncoder``) and the document (``WireSchemas``) go through these three
/// members; `Codable` is provided for other coders.
public protocol WireScalar: Codable, Sendable {
    /// The JSON Schema of the value (OpenAPI 3.1).
    static var wireSchema: JSONValue { get }
    /// Any valid value: what the schema recorder hands back while it reads a type's fields.
    static var wirePlaceholder: Self { get }
    /// Reads the value, or says what was wrong naming `field`.
    init(wire value: JSONValue, field: String) throws(WireDecodingError)
    /// The value as JSON.
    var wire: JSONValue { get }
}

extension WireScalar {
    public init(from decoder: any Decoder) throws {
        let value = try decoder.singleValueContainer().decode(JSONValue.self)
        try self.init(wire: value, field: WireField.name(decoder.codingPath))
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(wire)
    }
}

/// Field names as the API's errors give them.
public enum WireField {
    public static func name(_ path: [any CodingKey]) -> String {
        var out = ""
        for key in path {
            if let i = key.intValue { out += "[\(i)]" } else { out += out.isEmpty ? key.stringValue : ".\(key.stringValue)" }
        }
        return out.isEmpty ? "body" : out
    }

    static func join(_ field: String, _ key: String) -> String { field == "body" ? key : "\(field).\(key)" }
}

/// An enumeration carried as one of its names.
public protocol WireEnum: WireScalar, CaseIterable, RawRepresentable where RawValue == String {}

extension WireEnum {
    public static var wireSchema: JSONValue { ["type": "string", "enum": .array(allCases.map { .string($0.rawValue) })] }
    public static var wirePlaceholder: Self { allCases.first! }
    public init(wire value: JSONValue, field: String) throws(WireDecodingError) {
        guard let s = value.stringValue, let v = Self(rawValue: s) else {
            throw WireDecodingError(field: field, reason: "\(field) must be one of \(Self.allCases.map(\.rawValue).joined(separator: ", "))\(value.stringValue.map { "; got \"\($0.prefix(40))\"" } ?? "")")
        }
        self = v
    }
    public var wire: JSONValue { .string(rawValue) }
}

extension String: WireScalar {
    public static var wireSchema: JSONValue { ["type": "string"] }
    public static var wirePlaceholder: String { "x" }
    public init(wire value: JSONValue, field: String) throws(WireDecodingError) {
        guard let s = value.stringValue else { throw WireDecodingError(field: field, reason: "\(field) must be a string") }
        self = s
    }
    public var wire: JSONValue { .string(self) }
}

extension Bool: WireScalar {
    public static var wireSchema: JSONValue { ["type": "boolean"] }
    public static var wirePlaceholder: Bool { false }
    public init(wire value: JSONValue, field: String) throws(WireDecodingError) {
        guard let b = value.boolValue else { throw WireDecodingError(field: field, reason: "\(field) must be true or false") }
        self = b
    }
    public var wire: JSONValue { .bool(self) }
}

extension Int64: WireScalar {
    public static var wireSchema: JSONValue { ["type": "integer"] }
    public static var wirePlaceholder: Int64 { 0 }
    public init(wire value: JSONValue, field: String) throws(WireDecodingError) {
        guard let n = value.numberValue?.exactInt64Value else { throw WireDecodingError(field: field, reason: "\(field) must be a whole number") }
        self = n
    }
    public var wire: JSONValue { .int(self) }
}

extension Int: WireScalar {
    public static var wireSchema: JSONValue { ["type": "integer"] }
    public static var wirePlaceholder: Int { 0 }
    public init(wire value: JSONValue, field: String) throws(WireDecodingError) {
        guard let n = value.numberValue?.exactInt64Value, let i = Int(exactly: n) else { throw WireDecodingError(field: field, reason: "\(field) must be a whole number") }
        self = i
    }
    public var wire: JSONValue { .int(self) }
}

extension Double: WireScalar {
    public static var wireSchema: JSONValue { ["type": "number"] }
    public static var wirePlaceholder: Double { 0 }
    public init(wire value: JSONValue, field: String) throws(WireDecodingError) {
        guard let n = value.numberValue?.doubleValue, n.isFinite else { throw WireDecodingError(field: field, reason: "\(field) must be a number") }
        self = n
    }
    public var wire: JSONValue { .double(self) }
}

/// Any JSON: passed through as it is.
extension JSONValue: WireScalar {
    public static var wireSchema: JSONValue { [:] }
    public static var wirePlaceholder: JSONValue { .null }
    public init(wire value: JSONValue, field: String) throws(WireDecodingError) { self = value }
    public var wire: JSONValue { self }
}

/// A moment, on the wire as Unix time in seconds. Requests may give a fraction; answers give
/// whole seconds. Milliseconds (or any number outside 2001–5138) are refused, naming the field:
/// a date 31 years late is never taken silently.
extension Date: WireScalar {
    public static var wireSchema: JSONValue {
        ["type": "number", "exclusiveMinimum": 1_000_000_000, "exclusiveMaximum": 100_000_000_000, "description": "Unix time, seconds (e.g. 1790000000)"]
    }
    public static var wirePlaceholder: Date { Date(timeIntervalSince1970: 1_790_000_000) }
    public init(wire value: JSONValue, field: String) throws(WireDecodingError) {
        guard let d = value.numberValue?.doubleValue else { throw WireDecodingError(field: field, reason: "\(field) must be a number: Unix seconds (e.g. \(Int(Date().timeIntervalSince1970)))") }
        guard d > 1_000_000_000, d < 100_000_000_000 else {
            throw WireDecodingError(field: field, reason: "\(field) must be Unix seconds (e.g. \(Int(Date().timeIntervalSince1970)))")
        }
        self = Date(timeIntervalSince1970: d)
    }
    public var wire: JSONValue { .int(Int64(timeIntervalSince1970.rounded(.down))) }
}
