import Synchronization
public import IsleCore
public import IsleDelivery
public import Foundation

/// A stored row that does not decode (a state, kind or JSON column no version of Isle writes):
/// an error naming the table, the row and the column — never a default that would send, keep or
/// drop the wrong thing silently.
public struct BadRow: Error, CustomStringConvertible, Sendable {
    public var table: String
    public var id: String
    public var column: String
    public var found: String
    public init(table: String, id: String, column: String, found: String) {
        self.table = table
        self.id = id
        self.column = column
        self.found = found
    }
    public var description: String { "\(table) row \(id): column \(column) holds \(found.prefix(80)), which this version of Isle does not read" }

    /// `raw` as the enum `T`, or this error.
    public static func decode<T: RawRepresentable>(_ raw: String, as: T.Type, table: String, id: String, column: String) throws -> T where T.RawValue == String {
        guard let value = T(rawValue: raw) else { throw BadRow(table: table, id: id, column: column, found: "\"\(raw)\"") }
        return value
    }

    /// `text` as a JSON object of strings (an installation's push-to-start tokens), or this error.
    public static func stringMap(_ text: String, table: String, id: String, column: String) throws -> [String: String] {
        guard case .object(let object) = try json(text, table: table, id: id, column: column) else {
            throw BadRow(table: table, id: id, column: column, found: "JSON that is not an object")
        }
        var out: [String: String] = [:]
        for (k, v) in object {
            guard let s = v.stringValue else { throw BadRow(table: table, id: id, column: column, found: "a value for \"\(k)\" that is not a string") }
            out[k] = s
        }
        return out
    }

    /// A JSON array of strings (an installation's topics); nil or SQL NULL: none.
    public static func strings(_ text: String?, table: String, id: String, column: String) throws -> [String] {
        guard let text else { return [] }
        guard case .array(let items) = try json(text, table: table, id: id, column: column) else {
            throw BadRow(table: table, id: id, column: column, found: "JSON that is not an array")
        }
        return try items.map { v in
            guard let s = v.stringValue else { throw BadRow(table: table, id: id, column: column, found: "an item that is not a string") }
            return s
        }
    }

    /// `raw` as the integer-backed enum `T` (a priority), or this error.
    public static func decode<T: RawRepresentable>(_ raw: Int, as: T.Type, table: String, id: String, column: String) throws -> T where T.RawValue == Int {
        guard let value = T(rawValue: raw) else { throw BadRow(table: table, id: id, column: column, found: "\(raw)") }
        return value
    }

    /// `raw` as the integer-backed enum `T` when present (NULL is nil), or this error.
    public static func decode<T: RawRepresentable>(_ raw: Int?, as type: T.Type, table: String, id: String, column: String) throws -> T? where T.RawValue == Int {
        try raw.map { try decode($0, as: type, table: table, id: id, column: column) }
    }

    /// `raw` as the enum `T` when present (NULL is nil), or this error.
    public static func decode<T: RawRepresentable>(_ raw: String?, as type: T.Type, table: String, id: String, column: String) throws -> T? where T.RawValue == String {
        try raw.map { try decode($0, as: type, table: table, id: id, column: column) }
    }

    /// `text` parsed as JSON, or this error.
    public static func json(_ text: String, table: String, id: String, column: String) throws -> JSONValue {
        do { return try JSONParser.parse(text) } catch { throw BadRow(table: table, id: id, column: column, found: "text that is not JSON") }
    }

    /// A job's stored `aps` as its typed payload, or this error (naming what did not decode).
    public static func payload(_ text: String, kind: PushJobKind, acceptedAt: Date, id: String) throws -> JobPayload {
        let key = PayloadMemo.Key(kind: kind, text: text, acceptedAt: acceptedAt)
        if let known = PayloadMemo.shared.get(key) { return known }
        do {
            let payload = try JobPayload(kind: kind, encoded: text.utf8, acceptedAt: acceptedAt)
            PayloadMemo.shared.put(key, payload)
            return payload
        } catch {
            throw BadRow(table: "jobs", id: id, column: "aps", found: "a payload that does not decode (\(error))")
        }
    }
}

/// The payloads of jobs read back lately, by their stored text: a fan-out's jobs share one text
/// and one acceptance time, so a claim of 256 of them decodes it once, not 256 times (a decode is a
/// JSON parse and ``LiveActivityPayload``'s checks; a look-up hashes the text). A pure function's
/// results, so sharing them across stores and threads is safe; bounded, and emptied when full.
final class PayloadMemo: Sendable {
    struct Key: Hashable, Sendable {
        let kind: PushJobKind
        let text: String
        let acceptedAt: Date
    }
    static let shared = PayloadMemo(capacity: 64)
    private let entries = Mutex<[Key: JobPayload]>([:])
    let capacity: Int
    init(capacity: Int) { self.capacity = capacity }

    func get(_ key: Key) -> JobPayload? { entries.withLock { $0[key] } }
    func put(_ key: Key, _ payload: JobPayload) {
        entries.withLock {
            if $0.count >= capacity { $0.removeAll(keepingCapacity: true) }
            $0[key] = payload
        }
    }
}
