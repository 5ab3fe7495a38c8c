public import IsleCore

/// Reads a request body (already parsed, as ``JSONValue``) into one of the API's `Decodable` types,
/// strictly: a missing field, a value of the wrong kind or a field the type does not have is a
/// ``WireDecodingError`` naming the field (`alert.title`, `topics[2]`) and what was expected. An
/// optional field may be absent or `null`.
public enum WireDecoder {
    public static func decode<T: Decodable>(_ type: T.Type, from value: JSONValue) throws(WireDecodingError) -> T {
        do { return try ValueDecoder.read(type, value, field: "body", path: []) } catch let error as WireDecodingError { throw error } catch {
            throw WireDecodingError(field: "body", reason: "the body could not be read: \(error)")
        }
    }
}

/// The codec's `Decoder`: one per JSON value it reads into a type.
final class ValueDecoder: Decoder {
    let value: JSONValue
    let field: String
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }
    /// Keys a keyed container was asked about; nil: no keyed container was made.
    var asked: Set<String>?
    var askedAll = false

    init(_ value: JSONValue, field: String, path: [any CodingKey]) {
        self.value = value
        self.field = field
        self.codingPath = path
    }

    /// Reads `type` from `value` at `field`; an object read into a type must have no key it did not ask for.
    static func read<T: Decodable>(_ type: T.Type, _ value: JSONValue, field: String, path: [any CodingKey]) throws -> T {
        if let scalar = type as? any WireScalar.Type { return try scalar.init(wire: value, field: field) as! T }
        let decoder = ValueDecoder(value, field: field, path: path)
        let result = try T(from: decoder)
        if let asked = decoder.asked, !decoder.askedAll, let object = value.objectValue {
            for key in object.keys where !asked.contains(key) {
                let name = WireField.join(field, key)
                throw WireDecodingError(field: name, reason: "unknown field \(name); \(field == "body" ? "the body" : field) takes \(asked.sorted().joined(separator: ", "))")
            }
        }
        return result
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        guard let object = value.objectValue else {
            throw WireDecodingError(field: field, reason: value.isNull ? "\(field) is required: an object" : "\(field) must be an object, not \(value.kindName)")
        }
        if asked == nil { asked = [] }
        return KeyedDecodingContainer(Keyed<Key>(decoder: self, object: object))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        guard let array = value.arrayValue else {
            throw WireDecodingError(field: field, reason: value.isNull ? "\(field) is required: an array" : "\(field) must be an array, not \(value.kindName)")
        }
        return Unkeyed(decoder: self, array: array)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer { Single(decoder: self) }

    struct Keyed<Key: CodingKey>: KeyedDecodingContainerProtocol {
        let decoder: ValueDecoder
        let object: JSONObject
        var codingPath: [any CodingKey] { decoder.codingPath }
        var allKeys: [Key] {
            decoder.askedAll = true
            return object.keys.compactMap { Key(stringValue: $0) }
        }

        func contains(_ key: Key) -> Bool {
            decoder.asked?.insert(key.stringValue)
            return object[key.stringValue] != nil
        }

        func decodeNil(forKey key: Key) throws -> Bool {
            decoder.asked?.insert(key.stringValue)
            return object[key.stringValue]?.isNull ?? true
        }

        func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
            decoder.asked?.insert(key.stringValue)
            let name = WireField.join(decoder.field, key.stringValue)
            guard let v = object[key.stringValue], !(v.isNull && !(T.self is any WireNullable.Type)) else {
                throw WireDecodingError(field: name, reason: "\(name) is required: \(WireSchemas.expectation(T.self))")
            }
            return try ValueDecoder.read(type, v, field: name, path: codingPath + [key])
        }

        func decodeIfPresent<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T? {
            decoder.asked?.insert(key.stringValue)
            guard let v = object[key.stringValue] else { return nil }
            if v.isNull, !(T.self is any WireNullable.Type) { return nil }
            return try ValueDecoder.read(type, v, field: WireField.join(decoder.field, key.stringValue), path: codingPath + [key])
        }

        // The standard library's own overloads for these types would be chosen over the generic one.
        func decodeIfPresent(_ type: Bool.Type, forKey key: Key) throws -> Bool? { try decodeIfPresent(Wrapped<Bool>.self, forKey: key)?.value }
        func decodeIfPresent(_ type: String.Type, forKey key: Key) throws -> String? { try decodeIfPresent(Wrapped<String>.self, forKey: key)?.value }
        func decodeIfPresent(_ type: Double.Type, forKey key: Key) throws -> Double? { try decodeIfPresent(Wrapped<Double>.self, forKey: key)?.value }
        func decodeIfPresent(_ type: Float.Type, forKey key: Key) throws -> Float? { try decodeIfPresent(Wrapped<Float>.self, forKey: key)?.value }
        func decodeIfPresent(_ type: Int.Type, forKey key: Key) throws -> Int? { try decodeIfPresent(Wrapped<Int>.self, forKey: key)?.value }
        func decodeIfPresent(_ type: Int8.Type, forKey key: Key) throws -> Int8? { try decodeIfPresent(Wrapped<Int8>.self, forKey: key)?.value }
        func decodeIfPresent(_ type: Int16.Type, forKey key: Key) throws -> Int16? { try decodeIfPresent(Wrapped<Int16>.self, forKey: key)?.value }
        func decodeIfPresent(_ type: Int32.Type, forKey key: Key) throws -> Int32? { try decodeIfPresent(Wrapped<Int32>.self, forKey: key)?.value }
        func decodeIfPresent(_ type: Int64.Type, forKey key: Key) throws -> Int64? { try decodeIfPresent(Wrapped<Int64>.self, forKey: key)?.value }
        func decodeIfPresent(_ type: UInt.Type, forKey key: Key) throws -> UInt? { try decodeIfPresent(Wrapped<UInt>.self, forKey: key)?.value }
        func decodeIfPresent(_ type: UInt8.Type, forKey key: Key) throws -> UInt8? { try decodeIfPresent(Wrapped<UInt8>.self, forKey: key)?.value }
        func decodeIfPresent(_ type: UInt16.Type, forKey key: Key) throws -> UInt16? { try decodeIfPresent(Wrapped<UInt16>.self, forKey: key)?.value }
        func decodeIfPresent(_ type: UInt32.Type, forKey key: Key) throws -> UInt32? { try decodeIfPresent(Wrapped<UInt32>.self, forKey: key)?.value }
        func decodeIfPresent(_ type: UInt64.Type, forKey key: Key) throws -> UInt64? { try decodeIfPresent(Wrapped<UInt64>.self, forKey: key)?.value }

        func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
            try ValueDecoder(object[key.stringValue] ?? .null, field: WireField.join(decoder.field, key.stringValue), path: codingPath + [key]).container(keyedBy: type)
        }

        func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
            try ValueDecoder(object[key.stringValue] ?? .null, field: WireField.join(decoder.field, key.stringValue), path: codingPath + [key]).unkeyedContainer()
        }

        func superDecoder() throws -> any Decoder { decoder }
        func superDecoder(forKey key: Key) throws -> any Decoder {
            ValueDecoder(object[key.stringValue] ?? .null, field: WireField.join(decoder.field, key.stringValue), path: codingPath + [key])
        }
    }

    struct Unkeyed: UnkeyedDecodingContainer {
        let decoder: ValueDecoder
        let array: [JSONValue]
        var currentIndex = 0
        var codingPath: [any CodingKey] { decoder.codingPath }
        var count: Int? { array.count }
        var isAtEnd: Bool { currentIndex >= array.count }

        struct Index: CodingKey {
            var intValue: Int?
            var stringValue: String { "\(intValue!)" }
            init(_ i: Int) { intValue = i }
            init?(stringValue: String) { nil }
            init?(intValue: Int) { self.intValue = intValue }
        }

        mutating func next() throws -> (JSONValue, String, [any CodingKey]) {
            guard !isAtEnd else { throw WireDecodingError(field: decoder.field, reason: "\(decoder.field) has too few items") }
            defer { currentIndex += 1 }
            return (array[currentIndex], "\(decoder.field)[\(currentIndex)]", codingPath + [Index(currentIndex)])
        }

        mutating func decodeNil() throws -> Bool {
            guard !isAtEnd, array[currentIndex].isNull else { return false }
            currentIndex += 1
            return true
        }

        mutating func decode<T: Decodable>(_ type: T.Type) throws -> T {
            let (v, field, path) = try next()
            if v.isNull, !(T.self is any WireNullable.Type) { throw WireDecodingError(field: field, reason: "\(field) must be \(WireSchemas.expectation(T.self)), not null") }
            return try ValueDecoder.read(type, v, field: field, path: path)
        }

        mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
            let (v, field, path) = try next()
            return try ValueDecoder(v, field: field, path: path).container(keyedBy: type)
        }

        mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
            let (v, field, path) = try next()
            return try ValueDecoder(v, field: field, path: path).unkeyedContainer()
        }

        mutating func superDecoder() throws -> any Decoder {
            let (v, field, path) = try next()
            return ValueDecoder(v, field: field, path: path)
        }
    }

    struct Single: SingleValueDecodingContainer {
        let decoder: ValueDecoder
        var codingPath: [any CodingKey] { decoder.codingPath }
        func decodeNil() -> Bool { decoder.value.isNull }
        func decode<T: Decodable>(_ type: T.Type) throws -> T { try ValueDecoder.read(type, decoder.value, field: decoder.field, path: codingPath) }
    }
}

/// Routes a primitive through the generic path (the scalar reading and its messages).
struct Wrapped<T: Decodable>: Decodable {
    let value: T
    init(from decoder: any Decoder) throws { value = try decoder.singleValueContainer().decode(T.self) }
}

/// A type whose `null` means something of its own (``WireNullable``: “clear it”), so the decoder
/// hands it the `null` rather than treating the field as absent.
public protocol WireNullable {}

extension Optional: WireNullable {}

/// A field that may be left out (keep what is stored), `null` (clear it) or a value (set it):
/// declare it `WirePatch<T>?` — nil when absent.
public enum WirePatch<Value: Codable & Sendable>: Codable, Sendable, WireNullable {
    case clear
    case set(Value)

    public init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        self = c.decodeNil() ? .clear : .set(try c.decode(Value.self))
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        switch self {
        case .clear: try c.encodeNil()
        case .set(let v): try c.encode(v)
        }
    }

    public var value: Value? { if case .set(let v) = self { v } else { nil } }
}
