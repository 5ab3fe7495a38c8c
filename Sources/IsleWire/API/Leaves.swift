import Foundation
public import IsleCore
public import IsleDelivery

/// The API's types (docs/server.md), from which the server reads requests, writes answers and
/// makes its OpenAPI document (`/openapi.json`): one definition of the wire.
public enum API {}

// MARK: Strings with rules

/// A string with bounds (counted in Unicode scalars, as JSON Schema's `maxLength` counts) and
/// perhaps a pattern. U+0000 is refused later, for the whole body (no store keeps it: a 422).
public protocol WireText: WireScalar, Hashable, CustomStringConvertible {
    static var minLength: Int { get }
    static var maxLength: Int { get }
    /// An anchored regular expression, as the document states it (checked by ``accepts(_:)``).
    static var pattern: String? { get }
    /// What the string is, for messages: “an attributes type name”.
    static var what: String { get }
    /// Whether `text` (already within bounds) keeps the pattern.
    static func accepts(_ text: String) -> Bool
    var text: String { get }
    init(unchecked text: String)
}

extension WireText {
    public static var minLength: Int { 1 }
    public static var pattern: String? { nil }
    public static func accepts(_ text: String) -> Bool { true }
    public static var wireSchema: JSONValue {
        var o: JSONObject = ["type": "string", "minLength": .int(minLength), "maxLength": .int(maxLength)]
        if let pattern { o["pattern"] = .string(pattern) }
        return .object(o)
    }
    public static var wirePlaceholder: Self { Self(unchecked: String(repeating: "a", count: minLength)) }
    public init(wire value: JSONValue, field: String) throws(WireDecodingError) {
        guard let s = value.stringValue else { throw WireDecodingError(field: field, reason: "\(field) must be a string: \(Self.what)") }
        let n = s.unicodeScalars.count
        guard n >= Self.minLength, n <= Self.maxLength else {
            throw WireDecodingError(field: field, reason: "\(field) must be \(Self.minLength) to \(Self.maxLength) characters (got \(n)): \(Self.what)")
        }
        guard Self.accepts(s) else { throw WireDecodingError(field: field, reason: "\(field) must be \(Self.what)") }
        self.init(unchecked: s)
    }
    public var wire: JSONValue { .string(text) }
    public var description: String { text }
}

/// Declares a ``WireText`` with its bounds.
public struct AttributesTypeName: WireText {
    public static let maxLength = 128
    public static let what = "the name of the app's ActivityAttributes type"
    public let text: String
    public init(unchecked text: String) { self.text = text }
}

public struct ExternalKey: WireText {
    public static let maxLength = 256
    public static let what = "the backend's key for the activity (an order or match id)"
    public let text: String
    public init(unchecked text: String) { self.text = text }
}

public struct Topic: WireText {
    public static let maxLength = 128
    public static let what = "a topic name"
    public let text: String
    public init(unchecked text: String) { self.text = text }
}

/// An id Isle or the app made: an installation's, an activity's, a channel's.
public struct RecordID: WireText {
    public static let maxLength = 128
    public static let what = "an id"
    public let text: String
    public init(unchecked text: String) { self.text = text }
}

public struct UserID: WireText {
    public static let maxLength = 256
    public static let what = "the backend's id for the person"
    public let text: String
    public init(unchecked text: String) { self.text = text }
}

/// An APNs token in hex (16 bytes or more, at most 512 hex digits), kept in lower case.
public struct HexToken: WireText {
    public static let minLength = 32
    public static let maxLength = 512
    public static let pattern: String? = "^([0-9a-fA-F]{2}){16,}$"
    public static let what = "an APNs token in hex (an even number of hex digits, 16 bytes or more)"
    public static func accepts(_ text: String) -> Bool {
        text.utf8.count % 2 == 0 && text.utf8.allSatisfy { ($0 >= 48 && $0 <= 57) || ($0 >= 65 && $0 <= 70) || ($0 >= 97 && $0 <= 102) }
    }
    public let text: String
    public init(unchecked text: String) { self.text = text.lowercased() }
    public static var wirePlaceholder: HexToken { HexToken(unchecked: String(repeating: "ab", count: 16)) }
}

/// A registration ticket: the ES256 JWT the backend signed (docs/security.md).
public struct Ticket: WireText {
    public static let maxLength = 4096
    public static let pattern: String? = "^[A-Za-z0-9_-]+\\.[A-Za-z0-9_-]+\\.[A-Za-z0-9_-]+$"
    public static let what = "the registration ticket your backend signed: a JWT (three base64url parts)"
    // The pattern is what a ticket looks like; any other text is verified, and refused by name
    // (403 invalidTicket), as a forged one is.
    public let text: String
    public init(unchecked text: String) { self.text = text }
    public static var wirePlaceholder: Ticket { Ticket(unchecked: "a.b.c") }
}

/// A webhook endpoint as the document states it (the server checks the rest: no user, no
/// fragment, a host its rules allow).
public struct WebhookURL: WireText {
    public static let maxLength = 512
    public static let pattern: String? = "^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~!$&'()*+,;=:@/-]*)?(\\?[A-Za-z0-9._~!$&'()*+,;=:@/?-]*)?$"
    public static let what = "an absolute http:// or https:// URL with a host, no user or password, no fragment, e.g. https://backend.example.com/isle-events"
    /// The document's pattern is the common shape; the server takes any absolute http(s) URL with
    /// a host and no user, password, fragment, space or control character, then applies its rules
    /// on hosts (a 422 naming which).
    public static func accepts(_ text: String) -> Bool {
        guard let url = URLComponents(string: text), let scheme = url.scheme?.lowercased(), scheme == "https" || scheme == "http",
              let host = url.host, !host.isEmpty, url.fragment == nil, url.user == nil, url.password == nil else { return false }
        return !text.unicodeScalars.contains { $0.properties.isWhitespace || $0.value < 0x20 || $0.value == 0x7f }
    }
    public let text: String
    public init(unchecked text: String) { self.text = text }
    public static var wirePlaceholder: WebhookURL { WebhookURL(unchecked: "https://example.com/") }
}

/// Where the event stream is: a `next` of `GET /v1/events`, or an event id (`evt_<n>`).
public struct EventCursor: WireText {
    public static let maxLength = 22
    public static let pattern: String? = "^(evt_)?[0-9]{1,18}$"
    public static let what = "a cursor: a next of GET /v1/events, or an event id (evt_<n>)"
    public static func accepts(_ text: String) -> Bool {
        let digits = text.hasPrefix("evt_") ? text.dropFirst(4) : Substring(text)
        return (1...18).contains(digits.count) && digits.utf8.allSatisfy { $0 >= 48 && $0 <= 57 }
    }
    public let text: String
    public init(unchecked text: String) { self.text = text }
    public static var wirePlaceholder: EventCursor { EventCursor(unchecked: "0") }
    /// The event sequence number it names.
    public var sequence: Int64 { Int64(text.hasPrefix("evt_") ? String(text.dropFirst(4)) : text) ?? 0 }
}

/// An event's id, `evt_<n>`.
public struct EventID: WireText {
    public static let minLength = 5
    public static let maxLength = 22
    public static let pattern: String? = "^evt_[0-9]{1,18}$"
    public static let what = "an event id (evt_<n>)"
    public static func accepts(_ text: String) -> Bool { text.hasPrefix("evt_") && EventCursor.accepts(text) }
    public let text: String
    public init(unchecked text: String) { self.text = text }
    public static var wirePlaceholder: EventID { EventID(unchecked: "evt_1") }
    public var sequence: Int64 { Int64(text.dropFirst(4)) ?? 0 }
}

// MARK: Lists and maps with rules

/// `topics`: at most 32 names.
public struct TopicList: WireScalar, Hashable {
    public static let maxItems = 32
    public var topics: [Topic]
    public init(_ topics: [Topic]) { self.topics = topics }
    public static var wireSchema: JSONValue { ["type": "array", "maxItems": .int(maxItems), "items": Topic.wireSchema] }
    public static var wirePlaceholder: TopicList { TopicList([]) }
    public init(wire value: JSONValue, field: String) throws(WireDecodingError) {
        guard let items = value.arrayValue else { throw WireDecodingError(field: field, reason: "\(field) must be an array of topic names") }
        guard items.count <= Self.maxItems else { throw WireDecodingError(field: field, reason: "\(field): at most \(Self.maxItems) topics") }
        var out: [Topic] = []
        for (i, item) in items.enumerated() { out.append(try Topic(wire: item, field: "\(field)[\(i)]")) }
        topics = out
    }
    public var wire: JSONValue { .array(topics.map(\.wire)) }
    public var names: [String] { topics.map(\.text) }
}

/// `pushToStartTokens`: attributes type → hex token, or null to forget it; at most 32 types.
public struct PushToStartTokens: WireScalar, Hashable {
    public static let maxTypes = 32
    public var tokens: [String: String?]
    public init(_ tokens: [String: String?]) { self.tokens = tokens }
    public static var wireSchema: JSONValue {
        ["type": "object", "maxProperties": .int(maxTypes), "propertyNames": ["minLength": 1, "maxLength": .int(AttributesTypeName.maxLength)],
         "additionalProperties": ["type": ["string", "null"], "pattern": .string(HexToken.pattern!), "minLength": 32, "maxLength": 512]]
    }
    public static var wirePlaceholder: PushToStartTokens { PushToStartTokens([:]) }
    public init(wire value: JSONValue, field: String) throws(WireDecodingError) {
        guard let o = value.objectValue else { throw WireDecodingError(field: field, reason: "\(field) must be an object: attributes type → hex token (or null to forget it)") }
        guard o.count <= Self.maxTypes else { throw WireDecodingError(field: field, reason: "\(field): at most \(Self.maxTypes) attributes types") }
        var out: [String: String?] = [:]
        for (type, v) in o {
            let name = "\(field).\(type.prefix(40))"
            _ = try AttributesTypeName(wire: .string(type), field: name)
            if v.isNull { out[type] = .some(nil); continue }
            out[type] = .some(try HexToken(wire: v, field: name).text)
        }
        tokens = out
    }
    public var wire: JSONValue { .object(JSONObject(tokens.sorted { $0.key < $1.key }.map { ($0.key, $0.value.map(JSONValue.string) ?? .null) })) }
}

/// A JSON object the app defines (attributes, content state): any object.
extension JSONObject: WireScalar {
    public static var wireSchema: JSONValue { ["type": "object"] }
    public static var wirePlaceholder: JSONObject { [:] }
    public init(wire value: JSONValue, field: String) throws(WireDecodingError) {
        guard let o = value.objectValue else { throw WireDecodingError(field: field, reason: "\(field) must be an object") }
        self = o
    }
    public var wire: JSONValue { .object(self) }
    public init(from decoder: any Decoder) throws {
        let value = try decoder.singleValueContainer().decode(JSONValue.self)
        try self.init(wire: value, field: WireField.name(decoder.codingPath))
    }
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(wire)
    }
}

// MARK: Numbers with rules

/// `priority`: 10 (send now), 5 (send when the device's power allows), or 1 (prioritize the
/// device's power, never wake it: broadcast channels only, as Apple allows).
public enum PriorityNumber: Int, WireScalar, CaseIterable {
    case powerConsiderate = 1
    case low = 5
    case high = 10
    public static var wireSchema: JSONValue { ["type": "integer", "enum": [1, 5, 10]] }
    public static var wirePlaceholder: PriorityNumber { .high }
    public init(wire value: JSONValue, field: String) throws(WireDecodingError) {
        guard let n = value.numberValue?.exactInt64Value, let p = PriorityNumber(rawValue: Int(n)) else {
            throw WireDecodingError(field: field, reason: "\(field) must be 10, 5 or 1 (1: broadcast channels only)")
        }
        self = p
    }
    public var wire: JSONValue { .int(rawValue) }
    public var priority: PushPriority {
        switch self {
        case .powerConsiderate: .powerConsiderate
        case .low: .low
        case .high: .high
        }
    }
}

/// A broadcast channel's storage policy: 0, no message stored; 1, the most recent stored.
public enum StoragePolicyNumber: Int, WireScalar, CaseIterable {
    case noMessageStored = 0
    case mostRecentMessageStored = 1
    public static var wireSchema: JSONValue { ["type": "integer", "enum": [0, 1]] }
    public static var wirePlaceholder: StoragePolicyNumber { .noMessageStored }
    public init(wire value: JSONValue, field: String) throws(WireDecodingError) {
        guard let n = value.numberValue?.exactInt64Value, let p = StoragePolicyNumber(rawValue: Int(n)) else {
            throw WireDecodingError(field: field, reason: "\(field) must be 0 (no message stored) or 1 (most recent stored)")
        }
        self = p
    }
    public var wire: JSONValue { .int(rawValue) }
}

/// A whole number of seconds within bounds.
public struct OverlapSeconds: WireScalar, Hashable {
    public static let maximum: Int64 = 604_800
    public var seconds: Int64
    public static var wireSchema: JSONValue { ["type": "integer", "minimum": 0, "maximum": .int(maximum)] }
    public static var wirePlaceholder: OverlapSeconds { OverlapSeconds(seconds: 0) }
    public init(seconds: Int64) { self.seconds = seconds }
    public init(wire value: JSONValue, field: String) throws(WireDecodingError) {
        guard let n = value.numberValue?.exactInt64Value, n >= 0, n <= Self.maximum else {
            throw WireDecodingError(field: field, reason: "\(field) must be a whole number of seconds from 0 to \(Self.maximum) (7 days)")
        }
        seconds = n
    }
    public var wire: JSONValue { .int(seconds) }
}

/// How long a topic's channel may go without a broadcast before it is closed: 1 minute to 30 days.
public struct IdleSeconds: WireScalar, Hashable {
    public static let minimum: Int64 = 60
    public static let maximum: Int64 = 2_592_000
    public var seconds: Int64
    public static var wireSchema: JSONValue { ["type": "integer", "minimum": .int(minimum), "maximum": .int(maximum)] }
    public static var wirePlaceholder: IdleSeconds { IdleSeconds(seconds: minimum) }
    public init(seconds: Int64) { self.seconds = seconds }
    public init(wire value: JSONValue, field: String) throws(WireDecodingError) {
        guard let n = value.numberValue?.exactInt64Value, n >= Self.minimum, n <= Self.maximum else {
            throw WireDecodingError(field: field, reason: "\(field) must be a whole number of seconds from \(Self.minimum) (1 minute) to \(Self.maximum) (30 days)")
        }
        seconds = n
    }
    public var wire: JSONValue { .int(seconds) }
}

// MARK: Vocabularies

/// The APNs environment a request names: `development` (the entitlement's name) is the sandbox.
public enum EnvironmentName: String, WireEnum {
    case sandbox, production, development
    public var environment: PushEnvironment { self == .production ? .production : .sandbox }
}

extension PushEnvironment: WireEnum {}
extension EventType: WireEnum {}
extension ActivityRecordState: WireEnum {}
extension BudgetScope: WireEnum {}

/// An alert's title or body: text, or a localized string of the app's (`loc-key`, `loc-args`).
public enum AlertText: WireScalar, Hashable {
    case text(String)
    case localized(key: String, args: [String]?)

    public static var wireSchema: JSONValue {
        ["oneOf": [["type": "string", "minLength": 1],
                   ["type": "object", "additionalProperties": false, "required": ["loc-key"],
                    "properties": ["loc-key": ["type": "string", "minLength": 1], "loc-args": ["type": "array", "items": ["type": "string"]]]]]]
    }
    public static var wirePlaceholder: AlertText { .text("x") }
    public init(wire value: JSONValue, field: String) throws(WireDecodingError) {
        switch value {
        case .string(let s) where !s.isEmpty: self = .text(s)
        case .object(let o) where !(o["loc-key"]?.stringValue ?? "").isEmpty:
            if let unknown = o.keys.first(where: { $0 != "loc-key" && $0 != "loc-args" }) {
                throw WireDecodingError(field: "\(field).\(unknown)", reason: "unknown key \(unknown) in \(field); use loc-key and loc-args")
            }
            var args: [String]?
            if let a = o["loc-args"] {
                guard let list = a.arrayValue, list.allSatisfy({ $0.stringValue != nil }) else {
                    throw WireDecodingError(field: "\(field).loc-args", reason: "loc-args must be an array of strings")
                }
                args = list.compactMap(\.stringValue)
            }
            self = .localized(key: o["loc-key"]!.stringValue!, args: args)
        default: throw WireDecodingError(field: field, reason: "\(field) is required: a string, or {\"loc-key\": …, \"loc-args\": […]}")
        }
    }
    public var wire: JSONValue {
        switch self {
        case .text(let s): return .string(s)
        case .localized(let key, let args):
            var o: JSONObject = ["loc-key": .string(key)]
            if let args { o["loc-args"] = .array(args.map(JSONValue.string)) }
            return .object(o)
        }
    }
}
