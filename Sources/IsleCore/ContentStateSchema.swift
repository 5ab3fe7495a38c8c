import Foundation

/// The type of one field in a content-state or attributes schema (docs/protocol.md, Isle's decisions,
/// Content-state schema).
public indirect enum SchemaType: Sendable, Hashable, CustomStringConvertible {
    case string, int, double, bool
    /// A Swift `Date`: a number of seconds since 2001-01-01 under default strategies.
    case date
    /// A Swift `ClosedRange<Date>`: `[lower, upper]` with lower ≤ upper.
    case dateRange
    /// A `String`-backed enum: its raw values, case-sensitive.
    case enumeration([String])
    case array(SchemaType)
    case object(ObjectSchema)
    case optional(SchemaType)

    public var isOptional: Bool { if case .optional = self { true } else { false } }
    public var unwrapped: SchemaType { if case .optional(let t) = self { t.unwrapped } else { self } }

    public var description: String {
        switch self {
        case .string: "string"
        case .int: "int"
        case .double: "double"
        case .bool: "bool"
        case .date: "date"
        case .dateRange: "dateRange"
        case .enumeration(let values): "enum[\(values.joined(separator: ", "))]"
        case .array(let t): "array<\(t)>"
        case .object: "object"
        case .optional(let t): "\(t)?"
        }
    }

    /// What JSON a value of this type looks like, for messages.
    public var expectation: String {
        switch self {
        case .string: "a string"
        case .int: "an integer"
        case .double: "a number"
        case .bool: "true or false"
        case .date: "a number of seconds since 2001-01-01 (Swift Date)"
        case .dateRange: "an array [lower, upper] of two dates (seconds since 2001-01-01)"
        case .enumeration(let values): "one of \(values.map { "\"\($0)\"" }.joined(separator: ", "))"
        case .array(let t): "an array of \(t.expectation)"
        case .object: "an object"
        case .optional(let t): "\(t.expectation), or null"
        }
    }
}

/// An object's fields in declaration order.
public struct ObjectSchema: Sendable, Hashable {
    public var fields: [(name: String, type: SchemaType)] {
        get { names.map { ($0, types[$0]!) } }
        set {
            names = newValue.map(\.name)
            types = Dictionary(newValue.map { ($0.name, $0.type) }, uniquingKeysWith: { _, b in b })
        }
    }
    private var names: [String] = []
    private var types: [String: SchemaType] = [:]

    public init(_ fields: [(String, SchemaType)] = []) { self.fields = fields.map { (name: $0.0, type: $0.1) } }

    public subscript(name: String) -> SchemaType? { types[name] }

    public static func == (l: ObjectSchema, r: ObjectSchema) -> Bool { l.names == r.names && l.types == r.types }
    public func hash(into h: inout Hasher) { h.combine(names); h.combine(types) }
}

/// An app's schema for one `ActivityAttributes` type: its static attributes and its `ContentState`.
public struct ActivitySchema: Sendable, Hashable {
    public var attributesType: String
    public var attributes: ObjectSchema
    public var contentState: ObjectSchema

    public init(attributesType: String, attributes: ObjectSchema, contentState: ObjectSchema) {
        self.attributesType = attributesType
        self.attributes = attributes
        self.contentState = contentState
    }
}

public struct SchemaFormatError: Error, Sendable, Equatable, CustomStringConvertible {
    public let path: String
    public let reason: String
    public var description: String { "\(path): \(reason)" }
}

// MARK: - Reading and writing the schema file format

extension ActivitySchema {
    /// Reads the JSON schema format of docs/protocol.md, Isle's decisions.
    public init(json: JSONValue) throws(SchemaFormatError) {
        guard let root = json.objectValue else { throw SchemaFormatError(path: "$", reason: "a schema must be a JSON object") }
        guard let name = root["attributesType"]?.stringValue, !name.isEmpty else {
            throw SchemaFormatError(path: "$.attributesType", reason: "expected the ActivityAttributes type name as a non-empty string")
        }
        for key in root.keys where !["attributesType", "attributes", "contentState"].contains(key) {
            throw SchemaFormatError(path: JSONPath.appending(key, to: "$"), reason: "unknown key; a schema has attributesType, attributes and contentState")
        }
        guard let cs = root["contentState"] else {
            throw SchemaFormatError(path: "$.contentState", reason: "missing; expected an object of field name → type")
        }
        self.init(
            attributesType: name,
            attributes: try Self.objectSchema(root["attributes"] ?? .object([:]), path: "$.attributes"),
            contentState: try Self.objectSchema(cs, path: "$.contentState")
        )
    }

    public init(jsonText: String) throws(SchemaFormatError) {
        let value: JSONValue
        do { value = try JSONParser.parse(jsonText) } catch {
            throw SchemaFormatError(path: "$", reason: "not valid JSON: \(error)")
        }
        try self.init(json: value)
    }

    static func objectSchema(_ value: JSONValue, path: String) throws(SchemaFormatError) -> ObjectSchema {
        guard let object = value.objectValue else { throw SchemaFormatError(path: path, reason: "expected an object of field name → type") }
        var fields: [(String, SchemaType)] = []
        for (name, typeValue) in object {
            fields.append((name, try fieldType(typeValue, path: JSONPath.appending(name, to: path))))
        }
        return ObjectSchema(fields)
    }

    static func fieldType(_ value: JSONValue, path: String) throws(SchemaFormatError) -> SchemaType {
        switch value {
        case .string(let text):
            var name = text.trimmingWhitespace()
            var optional = false
            if name.hasSuffix("?") { optional = true; name.removeLast() }
            let base: SchemaType
            switch name {
            case "string": base = .string
            case "int": base = .int
            case "double": base = .double
            case "bool": base = .bool
            case "date": base = .date
            case "dateRange": base = .dateRange
            default:
                throw SchemaFormatError(path: path, reason: "unknown type \"\(text)\"; expected string, int, double, bool, date, dateRange (optional with a trailing ?), or an object {\"enum\"|\"array\"|\"object\": …}")
            }
            return optional ? .optional(base) : base
        case .object(let object):
            let optional: Bool
            switch object["optional"] {
            case nil: optional = false
            case .bool(let b)?: optional = b
            default: throw SchemaFormatError(path: JSONPath.appending("optional", to: path), reason: "expected true or false")
            }
            let kinds = object.keys.filter { $0 != "optional" }
            guard kinds.count == 1, let kind = kinds.first else {
                throw SchemaFormatError(path: path, reason: "expected exactly one of \"enum\", \"array\" or \"object\" (and optionally \"optional\")")
            }
            let inner = object[kind]!
            let innerPath = JSONPath.appending(kind, to: path)
            let base: SchemaType
            switch kind {
            case "enum":
                guard let values = inner.arrayValue, !values.isEmpty else {
                    throw SchemaFormatError(path: innerPath, reason: "expected a non-empty array of raw value strings")
                }
                var raws: [String] = []
                for (i, v) in values.enumerated() {
                    guard let s = v.stringValue else {
                        throw SchemaFormatError(path: JSONPath.appending(index: i, to: innerPath), reason: "enum raw values must be strings")
                    }
                    raws.append(s)
                }
                base = .enumeration(raws)
            case "array": base = .array(try fieldType(inner, path: innerPath))
            case "object": base = .object(try objectSchema(inner, path: innerPath))
            default:
                throw SchemaFormatError(path: path, reason: "unknown type kind \"\(kind)\"; expected \"enum\", \"array\" or \"object\"")
            }
            return optional ? .optional(base) : base
        default:
            throw SchemaFormatError(path: path, reason: "expected a type name string or an object, found \(value.kindName)")
        }
    }

    /// The schema in its file format.
    public var jsonValue: JSONValue {
        ["attributesType": .string(attributesType), "attributes": Self.json(attributes), "contentState": Self.json(contentState)]
    }

    static func json(_ object: ObjectSchema) -> JSONValue {
        .object(JSONObject(object.fields.map { ($0.name, json($0.type)) }))
    }

    static func json(_ type: SchemaType) -> JSONValue {
        switch type {
        case .string, .int, .double, .bool, .date, .dateRange:
            return .string(type.description)
        case .enumeration(let values):
            return ["enum": .array(values.map(JSONValue.string))]
        case .array(let t):
            return ["array": json(t)]
        case .object(let o):
            return ["object": json(o)]
        case .optional(let t):
            switch t {
            case .string, .int, .double, .bool, .date, .dateRange:
                return .string(t.description + "?")
            default:
                guard case .object(var o) = json(t) else { return json(t) }
                o["optional"] = true
                return .object(o)
            }
        }
    }
}

// MARK: - Decoding a JSON value against a schema

/// Something that makes `JSONDecoder` (default strategies) refuse a value.
public struct SchemaMismatch: Sendable, Hashable, CustomStringConvertible {
    public let path: String
    /// What the schema wanted, e.g. "an integer".
    public let expected: String
    /// What was there, e.g. "a string \"12\"" or "nothing (the key is missing)".
    public let found: String

    public var description: String { "\(path): expected \(expected), found \(found)" }
}

/// Something that decodes, but probably not into what the sender meant.
public struct SchemaNotice: Sendable, Hashable {
    public enum Kind: String, Sendable, Hashable {
        /// A number in a date field that looks like Unix time (shown ~31 years late).
        case unixTimeInDateField
        /// A number in a date field that looks like Unix time in milliseconds (JavaScript's
        /// `Date.now()`): shown tens of thousands of years late.
        case millisecondsInDateField
        /// An ISO-8601 string in a date field (fails to decode).
        case isoStringInDateField
        /// A `null` value (reported to break decoding on devices even for optionals).
        case nullValue
    }
    public let kind: Kind
    public let path: String
    public let value: JSONValue
}

public struct SchemaDecodingResult: Sendable {
    public var mismatches: [SchemaMismatch] = []
    public var notices: [SchemaNotice] = []
    /// True when `JSONDecoder` would decode the value.
    public var decodes: Bool { mismatches.isEmpty }
}

extension ObjectSchema {
    /// Judges `value` exactly as `JSONDecoder` with default strategies would decode it into the
    /// Swift type this schema describes: a missing non-optional key fails, unknown keys are
    /// ignored, `null` decodes only into optionals, an integer decodes into `double`, a number
    /// with a fraction does not decode into `int`, enum raw values are case-sensitive, a date
    /// range needs lower ≤ upper. Every mismatch is collected (not just the first), with its path.
    public func decode(_ value: JSONValue, path: String = "$") -> SchemaDecodingResult {
        var result = SchemaDecodingResult()
        SchemaType.object(self).check(value, path: path, into: &result)
        return result
    }
}

/// Unix time after 2008 written where a `Date` (seconds since 2001) is expected
/// (docs/protocol.md, Validation: "> 1.2·10⁹").
public let unixTimeHeuristicThreshold: Double = 1.2e9

/// Where the Unix-time heuristic stops: 2³² seconds (2106-02-07). A larger number is not a Unix
/// time anyone sends — calling `1e15` "Unix time" and printing a "corrected" value for it would be
/// wrong advice — so it is either milliseconds (``unixMillisecondsHeuristicRange``) or left alone.
public let unixTimeHeuristicUpperBound: Double = 4_294_967_296

/// Unix time in milliseconds (2008 to 2106) written where a `Date` is expected: the same window as
/// the seconds heuristic, times 1000.
public let unixMillisecondsHeuristicRange: Range<Double> = (unixTimeHeuristicThreshold * 1000)..<(unixTimeHeuristicUpperBound * 1000)

extension SchemaType {
    func check(_ value: JSONValue, path: String, into result: inout SchemaDecodingResult) {
        func mismatch(_ found: String? = nil) {
            result.mismatches.append(SchemaMismatch(path: path, expected: expectation, found: found ?? Self.describeFound(value)))
        }
        if case .null = value {
            if isOptional {
                result.notices.append(SchemaNotice(kind: .nullValue, path: path, value: value))
            } else {
                mismatch("null")
            }
            return
        }
        switch self {
        case .optional(let inner):
            inner.check(value, path: path, into: &result)
        case .string:
            if value.stringValue == nil { mismatch() }
        case .bool:
            if value.boolValue == nil { mismatch() }
        case .int:
            guard let n = value.numberValue else { return mismatch() }
            if n.exactInt64Value == nil { mismatch() }
        case .double:
            if value.numberValue == nil { mismatch() }
        case .date:
            guard let n = value.numberValue else {
                if let s = value.stringValue, Self.looksLikeISO8601(s) {
                    result.notices.append(SchemaNotice(kind: .isoStringInDateField, path: path, value: value))
                }
                return mismatch()
            }
            let v = n.doubleValue
            if v > unixTimeHeuristicThreshold, v < unixTimeHeuristicUpperBound {
                result.notices.append(SchemaNotice(kind: .unixTimeInDateField, path: path, value: value))
            } else if unixMillisecondsHeuristicRange.contains(v) {
                result.notices.append(SchemaNotice(kind: .millisecondsInDateField, path: path, value: value))
            }
        case .dateRange:
            guard let items = value.arrayValue else { return mismatch() }
            guard items.count >= 2 else {
                return mismatch("an array of \(items.count) element\(items.count == 1 ? "" : "s")")
            }
            let before = result.mismatches.count
            SchemaType.date.check(items[0], path: JSONPath.appending(index: 0, to: path), into: &result)
            SchemaType.date.check(items[1], path: JSONPath.appending(index: 1, to: path), into: &result)
            if result.mismatches.count == before, let lo = items[0].numberValue?.doubleValue, let hi = items[1].numberValue?.doubleValue, lo > hi {
                result.mismatches.append(SchemaMismatch(path: path, expected: "lower bound ≤ upper bound", found: "[\(items[0].briefDescription), \(items[1].briefDescription)]"))
            }
        case .enumeration(let raws):
            guard let s = value.stringValue else { return mismatch() }
            if !raws.contains(s) {
                let hint = raws.first { $0.lowercased() == s.lowercased() }.map { " (raw values are case-sensitive: did you mean \"\($0)\"?)" } ?? ""
                mismatch("\"\(s)\"\(hint)")
            }
        case .array(let element):
            guard let items = value.arrayValue else { return mismatch() }
            for (i, item) in items.enumerated() {
                element.check(item, path: JSONPath.appending(index: i, to: path), into: &result)
            }
        case .object(let schema):
            guard let object = value.objectValue else { return mismatch() }
            for (name, type) in schema.fields {
                let fieldPath = JSONPath.appending(name, to: path)
                guard let fieldValue = object[name] else {
                    if !type.isOptional {
                        result.mismatches.append(SchemaMismatch(path: fieldPath, expected: type.expectation, found: "nothing (the key is missing)"))
                    }
                    continue
                }
                type.check(fieldValue, path: fieldPath, into: &result)
            }
        }
    }

    static func describeFound(_ value: JSONValue) -> String {
        switch value {
        case .null, .object: value.kindName
        case .array(let a): "an array of \(a.count)"
        default: "\(value.kindName) \(value.briefDescription)"
        }
    }

    static func looksLikeISO8601(_ s: String) -> Bool {
        let chars = Array(s)
        guard chars.count >= 10 else { return false }
        return chars[0...3].allSatisfy(\.isNumber) && chars[4] == "-" && chars[5...6].allSatisfy(\.isNumber) && chars[7] == "-"
    }
}
