public import IsleCore
import Foundation

/// Words for a type's schema in the document: what it is, and what each field means.
public protocol WireDocumented {
    static var wireDescription: String? { get }
    /// Field name → what it means (and any rule the type cannot state).
    static var wireFields: [String: String] { get }
    /// Schema keywords for the type as a whole (a rule between fields: `anyOf`, `minProperties`).
    static var wireExtra: JSONObject { get }
    /// Schema keywords added to a field's (`minItems`).
    static var wireFieldExtras: [String: JSONObject] { get }
    /// Answer fields that are left out rather than written as null when they have no value.
    static var wireOmitted: Set<String> { get }
}

/// An answer whose fields without a value are left out, not written as null (an accepted push's
/// `jobs`, an event's data): in the document they are optional, not nullable.
public protocol WireSparse {}

extension WireDocumented {
    public static var wireDescription: String? { nil }
    public static var wireFields: [String: String] { [:] }
    public static var wireExtra: JSONObject { [:] }
    public static var wireFieldExtras: [String: JSONObject] { [:] }
    public static var wireOmitted: Set<String> { [] }
}

/// The JSON Schemas of the API's types, read off their `Decodable` conformances (OpenAPI 3.1):
/// a struct's fields, in order, with required ones (`decode`) told from optional ones
/// (`decodeIfPresent`); leaves state their own (``WireScalar``). Each struct becomes a component,
/// referred to by `$ref`.
///
/// An optional field of a request may be left out or `null`; an optional field of an answer is
/// always written (``WireEncoder``), as `null` when it has no value, so there it is required and
/// nullable.
public struct WireSchemas {
    public enum Direction: Sendable { case request, answer }

    /// Component name → schema, in the order they were first met.
    public private(set) var components = JSONObject()
    private var directions: [String: Direction] = [:]
    private var names: [ObjectIdentifier: String] = [:]

    public init() {}

    /// The schema of `type` as a field or body of `direction`: inline for leaves and collections,
    /// a `$ref` for structs.
    public mutating func schema(_ type: any Decodable.Type, _ direction: Direction) -> JSONValue {
        // A request may give a moment with a fraction; an answer always gives whole seconds.
        if type == Date.self, direction == .answer { return ["type": "integer", "description": "Unix time, seconds"] }
        if let scalar = type as? any WireScalar.Type { return scalar.wireSchema }
        if let optional = type as? any WireOptionalType.Type { return Self.nullable(schema(optional.wireWrapped, direction)) }
        if let patch = type as? any WirePatchType.Type { return Self.nullable(schema(patch.wireWrapped, direction)) }
        if let array = type as? any WireArrayType.Type { return ["type": "array", "items": schema(array.wireElement, direction)] }
        if let map = type as? any WireMapType.Type { return ["type": "object", "additionalProperties": schema(map.wireValue, direction)] }
        return .object(["$ref": .string("#/components/schemas/\(component(type, direction))")])
    }

    /// `schema` or `null`.
    public static func nullable(_ schema: JSONValue) -> JSONValue {
        guard var o = schema.objectValue else { return schema }
        if o.isEmpty { return schema }
        if case .string(let t)? = o["type"], o["enum"] == nil, o["const"] == nil, o["$ref"] == nil {
            o["type"] = [.string(t), "null"]
            return .object(o)
        }
        return ["anyOf": [schema, ["type": "null"]]]
    }

    /// What a value of `type` must be, in words (“a string”, “an object”).
    public static func expectation(_ type: any Decodable.Type) -> String {
        if let optional = type as? any WireOptionalType.Type { return expectation(optional.wireWrapped) }
        if let scalar = type as? any WireScalar.Type {
            if let e = scalar.wireSchema["enum"]?.arrayValue { return "one of \(e.compactMap(\.stringValue).joined(separator: ", "))" }
            switch scalar.wireSchema["type"]?.stringValue {
            case "string": return "a string"
            case "integer": return "a whole number"
            case "number": return type == Date.self ? "Unix seconds" : "a number"
            case "boolean": return "true or false"
            case "array": return "an array"
            case "object": return "an object"
            default: return "a JSON value"
            }
        }
        if type is any WireArrayType.Type { return "an array" }
        return "an object"
    }

    private mutating func component(_ type: any Decodable.Type, _ direction: Direction) -> String {
        // One component per type, named by the type: a type is either a request's or an answer's
        // (their optional fields differ), and two types never share a name.
        let id = ObjectIdentifier(type)
        let name = String(describing: type)
        if let known = names[id] {
            precondition(directions[known] == direction, "\(name) is used in a request and in an answer: give each its own type")
            return known
        }
        precondition(directions[name] == nil, "two API types are named \(name)")
        names[id] = name
        directions[name] = direction
        components[name] = ["type": "object"]  // a placeholder while its fields are read (a type may refer to itself)
        let recorder = Recorder()
        _ = try? type.init(from: RecordingDecoder(recorder))
        let docs = type as? any WireDocumented.Type
        let sparse = type is any WireSparse.Type
        var properties = JSONObject()
        var required: [JSONValue] = []
        for field in recorder.fields {
            var s = schema(field.type, direction)
            let omitted = !field.required && direction == .answer && (sparse || docs?.wireOmitted.contains(field.name) == true)
            if !field.required, !omitted { s = Self.nullable(s) }
            if var o = s.objectValue {
                for (k, v) in docs?.wireFieldExtras[field.name] ?? [:] { o[k] = v }
                if let words = docs?.wireFields[field.name] { o["description"] = .string(words) }
                s = .object(o)
            }
            properties[field.name] = s
            if field.required || (direction == .answer && !omitted) { required.append(.string(field.name)) }
        }
        var o: JSONObject = ["type": "object"]
        if let words = docs?.wireDescription { o["description"] = .string(words) }
        o["properties"] = .object(properties)
        if !required.isEmpty { o["required"] = .array(required) }
        o["additionalProperties"] = false
        for (k, v) in docs?.wireExtra ?? [:] { o[k] = v }
        components[name] = .object(o)
        return name
    }
}

// MARK: Reading a type's fields

final class Recorder {
    struct Field { var name: String; var type: any Decodable.Type; var required: Bool }
    var fields: [Field] = []
    func note(_ name: String, _ type: any Decodable.Type, required: Bool) {
        if !fields.contains(where: { $0.name == name }) { fields.append(Field(name: name, type: type, required: required)) }
    }
}

/// Hands every field a placeholder, noting what was asked.
struct RecordingDecoder: Decoder {
    let recorder: Recorder
    init(_ recorder: Recorder) { self.recorder = recorder }
    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }
    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> { KeyedDecodingContainer(Keyed<Key>(recorder: recorder)) }
    func unkeyedContainer() throws -> any UnkeyedDecodingContainer { throw WireDecodingError(field: "body", reason: "not recordable") }
    func singleValueContainer() throws -> any SingleValueDecodingContainer { throw WireDecodingError(field: "body", reason: "not recordable") }

    static func placeholder<T: Decodable>(_ type: T.Type) throws -> T {
        if let scalar = type as? any WireScalar.Type { return scalar.wirePlaceholder as! T }
        if let placeholder = type as? any WirePlaceholding.Type { return placeholder.wireEmpty as! T }
        return try T(from: RecordingDecoder(Recorder()))
    }

    struct Keyed<Key: CodingKey>: KeyedDecodingContainerProtocol {
        let recorder: Recorder
        var codingPath: [any CodingKey] { [] }
        var allKeys: [Key] { [] }
        func contains(_ key: Key) -> Bool { false }
        func decodeNil(forKey key: Key) throws -> Bool { true }
        func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
            recorder.note(key.stringValue, type, required: true)
            return try RecordingDecoder.placeholder(type)
        }
        func decodeIfPresent<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T? {
            recorder.note(key.stringValue, type, required: false)
            return nil
        }
        // The standard library's own overloads for these types would be chosen over the generic one.
        func decodeIfPresent(_ type: Bool.Type, forKey key: Key) throws -> Bool? { recorder.note(key.stringValue, type, required: false); return nil }
        func decodeIfPresent(_ type: String.Type, forKey key: Key) throws -> String? { recorder.note(key.stringValue, type, required: false); return nil }
        func decodeIfPresent(_ type: Double.Type, forKey key: Key) throws -> Double? { recorder.note(key.stringValue, type, required: false); return nil }
        func decodeIfPresent(_ type: Float.Type, forKey key: Key) throws -> Float? { recorder.note(key.stringValue, type, required: false); return nil }
        func decodeIfPresent(_ type: Int.Type, forKey key: Key) throws -> Int? { recorder.note(key.stringValue, type, required: false); return nil }
        func decodeIfPresent(_ type: Int8.Type, forKey key: Key) throws -> Int8? { recorder.note(key.stringValue, type, required: false); return nil }
        func decodeIfPresent(_ type: Int16.Type, forKey key: Key) throws -> Int16? { recorder.note(key.stringValue, type, required: false); return nil }
        func decodeIfPresent(_ type: Int32.Type, forKey key: Key) throws -> Int32? { recorder.note(key.stringValue, type, required: false); return nil }
        func decodeIfPresent(_ type: Int64.Type, forKey key: Key) throws -> Int64? { recorder.note(key.stringValue, type, required: false); return nil }
        func decodeIfPresent(_ type: UInt.Type, forKey key: Key) throws -> UInt? { recorder.note(key.stringValue, type, required: false); return nil }
        func decodeIfPresent(_ type: UInt8.Type, forKey key: Key) throws -> UInt8? { recorder.note(key.stringValue, type, required: false); return nil }
        func decodeIfPresent(_ type: UInt16.Type, forKey key: Key) throws -> UInt16? { recorder.note(key.stringValue, type, required: false); return nil }
        func decodeIfPresent(_ type: UInt32.Type, forKey key: Key) throws -> UInt32? { recorder.note(key.stringValue, type, required: false); return nil }
        func decodeIfPresent(_ type: UInt64.Type, forKey key: Key) throws -> UInt64? { recorder.note(key.stringValue, type, required: false); return nil }
        func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
            throw WireDecodingError(field: key.stringValue, reason: "not recordable")
        }
        func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer { throw WireDecodingError(field: key.stringValue, reason: "not recordable") }
        func superDecoder() throws -> any Decoder { RecordingDecoder(recorder) }
        func superDecoder(forKey key: Key) throws -> any Decoder { RecordingDecoder(Recorder()) }
    }
}

/// Collections and optionals, as the schema reader sees them.
protocol WirePlaceholding { static var wireEmpty: Self { get } }
protocol WireOptionalType { static var wireWrapped: any Decodable.Type { get } }
protocol WirePatchType { static var wireWrapped: any Decodable.Type { get } }
protocol WireArrayType { static var wireElement: any Decodable.Type { get } }
protocol WireMapType { static var wireValue: any Decodable.Type { get } }

extension Optional: WireOptionalType, WirePlaceholding where Wrapped: Decodable {
    static var wireWrapped: any Decodable.Type { Wrapped.self }
    static var wireEmpty: Optional<Wrapped> { nil }
}
extension WirePatch: WirePatchType, WirePlaceholding {
    static var wireWrapped: any Decodable.Type { Value.self }
    static var wireEmpty: WirePatch<Value> { .clear }
}
extension Array: WireArrayType, WirePlaceholding where Element: Decodable {
    static var wireElement: any Decodable.Type { Element.self }
    static var wireEmpty: [Element] { [] }
}
extension Dictionary: WireMapType, WirePlaceholding where Key == String, Value: Decodable {
    static var wireValue: any Decodable.Type { Value.self }
    static var wireEmpty: [String: Value] { [:] }
}
