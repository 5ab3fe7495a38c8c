public import IsleCore

/// Writes one of the API's `Encodable` types as the JSON the server answers with: every field is
/// written, an absent optional as `null` (the document lists it as required and nullable), so an
/// answer's shape never depends on its values.
public enum WireEncoder {
    public static func encode<T: Encodable>(_ value: T) -> JSONValue {
        if let scalar = value as? any WireScalar { return scalar.wire }
        let encoder = ValueEncoder(path: [], sparse: value is any WireSparse)
        do { try value.encode(to: encoder) } catch {
            // The API's types encode without throwing; a type that throws is a programming error.
            preconditionFailure("\(T.self) could not be encoded: \(error)")
        }
        return encoder.result
    }
}

/// A node being written: an object, an array or one value.
final class WireNode {
    enum Kind { case unset, value(JSONValue), object(JSONObject, [String: WireNode]), array([WireNode]) }
    var kind = Kind.unset

    var json: JSONValue {
        switch kind {
        case .unset: return .null
        case .value(let v): return v
        case .object(var o, let children):
            for (k, node) in children { o[k] = node.json }
            return .object(o)
        case .array(let nodes): return .array(nodes.map(\.json))
        }
    }
}

final class ValueEncoder: Encoder {
    let node = WireNode()
    let codingPath: [any CodingKey]
    /// Leaves out optional fields without a value (``WireSparse``) rather than writing null.
    let sparse: Bool
    var userInfo: [CodingUserInfoKey: Any] { [:] }
    init(path: [any CodingKey], sparse: Bool = false) {
        codingPath = path
        self.sparse = sparse
    }
    var result: JSONValue { node.json }

    static func json<T: Encodable>(_ value: T, path: [any CodingKey]) throws -> JSONValue {
        if let scalar = value as? any WireScalar { return scalar.wire }
        let e = ValueEncoder(path: path, sparse: value is any WireSparse)
        try value.encode(to: e)
        return e.result
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        if case .object = node.kind {} else { node.kind = .object(JSONObject(), [:]) }
        return KeyedEncodingContainer(Keyed<Key>(encoder: self))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        if case .array = node.kind {} else { node.kind = .array([]) }
        return Unkeyed(encoder: self)
    }

    func singleValueContainer() -> any SingleValueEncodingContainer { Single(encoder: self) }

    func set(_ key: String, _ value: JSONValue) {
        guard case .object(var o, let children) = node.kind else { return }
        node.kind = .unset
        o[key] = value
        node.kind = .object(o, children)
    }

    struct Keyed<Key: CodingKey>: KeyedEncodingContainerProtocol {
        let encoder: ValueEncoder
        var codingPath: [any CodingKey] { encoder.codingPath }

        mutating func encodeNil(forKey key: Key) throws { encoder.set(key.stringValue, .null) }
        mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
            encoder.set(key.stringValue, try ValueEncoder.json(value, path: codingPath + [key]))
        }
        // An absent optional is written as null: every field of an answer is always there.
        mutating func encodeIfPresent<T: Encodable>(_ value: T?, forKey key: Key) throws {
            if value == nil, encoder.sparse { return }
            encoder.set(key.stringValue, try value.map { try ValueEncoder.json($0, path: codingPath + [key]) } ?? .null)
        }
        mutating func encodeIfPresent(_ value: String?, forKey key: Key) throws { if value == nil, encoder.sparse { return }; encoder.set(key.stringValue, value.map(JSONValue.string) ?? .null) }
        mutating func encodeIfPresent(_ value: Bool?, forKey key: Key) throws { if value == nil, encoder.sparse { return }; encoder.set(key.stringValue, value.map(JSONValue.bool) ?? .null) }
        mutating func encodeIfPresent(_ value: Double?, forKey key: Key) throws { if value == nil, encoder.sparse { return }; encoder.set(key.stringValue, value.map(JSONValue.double) ?? .null) }
        mutating func encodeIfPresent(_ value: Float?, forKey key: Key) throws { if value == nil, encoder.sparse { return }; encoder.set(key.stringValue, value.map { .double(Double($0)) } ?? .null) }
        mutating func encodeIfPresent(_ value: Int?, forKey key: Key) throws { if value == nil, encoder.sparse { return }; encoder.set(key.stringValue, value.map { .int($0) } ?? .null) }
        mutating func encodeIfPresent(_ value: Int8?, forKey key: Key) throws { if value == nil, encoder.sparse { return }; encoder.set(key.stringValue, value.map { .int(Int64($0)) } ?? .null) }
        mutating func encodeIfPresent(_ value: Int16?, forKey key: Key) throws { if value == nil, encoder.sparse { return }; encoder.set(key.stringValue, value.map { .int(Int64($0)) } ?? .null) }
        mutating func encodeIfPresent(_ value: Int32?, forKey key: Key) throws { if value == nil, encoder.sparse { return }; encoder.set(key.stringValue, value.map { .int(Int64($0)) } ?? .null) }
        mutating func encodeIfPresent(_ value: Int64?, forKey key: Key) throws { if value == nil, encoder.sparse { return }; encoder.set(key.stringValue, value.map { .int($0) } ?? .null) }
        mutating func encodeIfPresent(_ value: UInt?, forKey key: Key) throws { if value == nil, encoder.sparse { return }; encoder.set(key.stringValue, value.map { .int(Int64($0)) } ?? .null) }
        mutating func encodeIfPresent(_ value: UInt8?, forKey key: Key) throws { if value == nil, encoder.sparse { return }; encoder.set(key.stringValue, value.map { .int(Int64($0)) } ?? .null) }
        mutating func encodeIfPresent(_ value: UInt16?, forKey key: Key) throws { if value == nil, encoder.sparse { return }; encoder.set(key.stringValue, value.map { .int(Int64($0)) } ?? .null) }
        mutating func encodeIfPresent(_ value: UInt32?, forKey key: Key) throws { if value == nil, encoder.sparse { return }; encoder.set(key.stringValue, value.map { .int(Int64($0)) } ?? .null) }
        mutating func encodeIfPresent(_ value: UInt64?, forKey key: Key) throws { if value == nil, encoder.sparse { return }; encoder.set(key.stringValue, value.map { .int(Int64($0)) } ?? .null) }

        mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
            let child = ValueEncoder(path: codingPath + [key])
            attach(child, key)
            return child.container(keyedBy: keyType)
        }
        mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
            let child = ValueEncoder(path: codingPath + [key])
            attach(child, key)
            return child.unkeyedContainer()
        }
        func attach(_ child: ValueEncoder, _ key: Key) {
            guard case .object(var o, var children) = encoder.node.kind else { return }
            o[key.stringValue] = .null  // keeps the key's place
            children[key.stringValue] = child.node
            encoder.node.kind = .object(o, children)
        }
        mutating func superEncoder() -> any Encoder { encoder }
        mutating func superEncoder(forKey key: Key) -> any Encoder {
            let child = ValueEncoder(path: codingPath + [key])
            attach(child, key)
            return child
        }
    }

    struct Unkeyed: UnkeyedEncodingContainer {
        let encoder: ValueEncoder
        var codingPath: [any CodingKey] { encoder.codingPath }
        var count: Int { if case .array(let a) = encoder.node.kind { a.count } else { 0 } }

        func append(_ node: WireNode) {
            guard case .array(var a) = encoder.node.kind else { return }
            encoder.node.kind = .unset
            a.append(node)
            encoder.node.kind = .array(a)
        }
        func leaf(_ v: JSONValue) -> WireNode { let n = WireNode(); n.kind = .value(v); return n }

        mutating func encodeNil() throws { append(leaf(.null)) }
        mutating func encode<T: Encodable>(_ value: T) throws { append(leaf(try ValueEncoder.json(value, path: codingPath))) }
        mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
            let child = ValueEncoder(path: codingPath)
            append(child.node)
            return child.container(keyedBy: keyType)
        }
        mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
            let child = ValueEncoder(path: codingPath)
            append(child.node)
            return child.unkeyedContainer()
        }
        mutating func superEncoder() -> any Encoder {
            let child = ValueEncoder(path: codingPath)
            append(child.node)
            return child
        }
    }

    struct Single: SingleValueEncodingContainer {
        let encoder: ValueEncoder
        var codingPath: [any CodingKey] { encoder.codingPath }
        mutating func encodeNil() throws { encoder.node.kind = .value(.null) }
        mutating func encode<T: Encodable>(_ value: T) throws { encoder.node.kind = .value(try ValueEncoder.json(value, path: codingPath)) }
    }
}
