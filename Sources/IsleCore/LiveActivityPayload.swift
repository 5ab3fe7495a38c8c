public import Foundation

/// The three ActivityKit events a `liveactivity` push can carry (docs/protocol.md §5.1).
public enum LiveActivityEvent: String, Sendable, CaseIterable, Codable {
    case start, update, end
}

/// The text of an alert's title or body: a plain string, or a localization key with arguments
/// that the device resolves in the app's `Localizable.strings` (docs/protocol.md §5.1).
public enum AlertText: Sendable, Hashable {
    case plain(String)
    case localized(key: String, arguments: [String])

    var jsonValue: JSONValue {
        switch self {
        case .plain(let text): .string(text)
        case .localized(let key, let arguments): ["loc-key": .string(key), "loc-args": .array(arguments.map(JSONValue.string))]
        }
    }
}

/// The alert sound: the system's default sound, or a named file in the app bundle.
public enum AlertSound: Sendable, Hashable {
    case `default`
    case named(String)

    var jsonValue: JSONValue {
        switch self {
        case .default: "default"
        case .named(let name): .string(name)
        }
    }
}

/// An alert configuration, as `AlertConfiguration` in ActivityKit: title, body, optional sound.
public struct LiveActivityAlert: Sendable, Hashable {
    public var title: AlertText
    public var body: AlertText
    public var sound: AlertSound?

    public init(title: AlertText, body: AlertText, sound: AlertSound? = nil) {
        self.title = title
        self.body = body
        self.sound = sound
    }

    public init(title: String, body: String, sound: AlertSound? = nil) {
        self.init(title: .plain(title), body: .plain(body), sound: sound)
    }

    public var jsonValue: JSONValue {
        var object: JSONObject = ["title": title.jsonValue, "body": body.jsonValue]
        if let sound { object["sound"] = sound.jsonValue }
        return .object(object)
    }
}

/// A Live Activity push payload: one `aps` dictionary for `start`, `update` or `end`.
///
/// `contentState` and `attributes` are JSON objects; build them from the app's own `Codable`
/// types with the generic factories (``start(attributes:contentState:timestamp:alert:staleDate:relevanceScore:inputPushToken:inputPushChannel:attributesType:)``
/// and friends), or pass raw JSON. The same payload serves token pushes and broadcast pushes
/// (`update` and `end` only).
public struct LiveActivityPayload: Sendable, Hashable {
    public var event: LiveActivityEvent
    /// When the data was generated. Sent as integer Unix seconds.
    public var timestamp: Date
    public var contentState: JSONValue?
    public var staleDate: Date?
    public var relevanceScore: Double?
    public var alert: LiveActivityAlert?
    /// `end` only: when the system removes the ended activity from the Lock Screen.
    public var dismissalDate: Date?
    /// `start` only: the `ActivityAttributes` type name, exactly as in Swift.
    public var attributesType: String?
    /// `start` only: the static attributes.
    public var attributes: JSONValue?
    /// `start` only (iOS 18+): ask the device for a new update token.
    public var inputPushToken: Bool
    /// `start` only (iOS 18+): subscribe the new activity to this broadcast channel.
    public var inputPushChannel: String?
    /// Keys beside `aps` (custom data for the app). APNs ignores custom keys inside `aps`.
    public var customKeys: JSONObject

    public init(
        event: LiveActivityEvent,
        timestamp: Date,
        contentState: JSONValue? = nil,
        staleDate: Date? = nil,
        relevanceScore: Double? = nil,
        alert: LiveActivityAlert? = nil,
        dismissalDate: Date? = nil,
        attributesType: String? = nil,
        attributes: JSONValue? = nil,
        inputPushToken: Bool = false,
        inputPushChannel: String? = nil,
        customKeys: JSONObject = [:]
    ) {
        self.event = event
        self.timestamp = timestamp
        self.contentState = contentState
        self.staleDate = staleDate
        self.relevanceScore = relevanceScore
        self.alert = alert
        self.dismissalDate = dismissalDate
        self.attributesType = attributesType
        self.attributes = attributes
        self.inputPushToken = inputPushToken
        self.inputPushChannel = inputPushChannel
        self.customKeys = customKeys
    }

    // MARK: Typed factories

    /// A push-to-start payload. `attributesType` defaults to the Swift name of `Attributes`,
    /// which is what the device matches against (case-sensitive).
    public static func start<Attributes: Encodable, ContentState: Encodable>(
        attributes: Attributes,
        contentState: ContentState,
        timestamp: Date,
        alert: LiveActivityAlert,
        staleDate: Date? = nil,
        relevanceScore: Double? = nil,
        inputPushToken: Bool = false,
        inputPushChannel: String? = nil,
        attributesType: String? = nil
    ) throws(PayloadEncodingError) -> LiveActivityPayload {
        LiveActivityPayload(
            event: .start, timestamp: timestamp,
            contentState: try ActivityKitEncoding.jsonValue(of: contentState),
            staleDate: staleDate, relevanceScore: relevanceScore, alert: alert,
            attributesType: attributesType ?? String(describing: Attributes.self),
            attributes: try ActivityKitEncoding.jsonValue(of: attributes),
            inputPushToken: inputPushToken, inputPushChannel: inputPushChannel
        )
    }

    public static func update<ContentState: Encodable>(
        contentState: ContentState,
        timestamp: Date,
        alert: LiveActivityAlert? = nil,
        staleDate: Date? = nil,
        relevanceScore: Double? = nil
    ) throws(PayloadEncodingError) -> LiveActivityPayload {
        LiveActivityPayload(
            event: .update, timestamp: timestamp,
            contentState: try ActivityKitEncoding.jsonValue(of: contentState),
            staleDate: staleDate, relevanceScore: relevanceScore, alert: alert
        )
    }

    /// An `end` payload; the final content state is optional (the activity then keeps showing
    /// its last content until dismissed).
    public static func end<ContentState: Encodable>(
        contentState: ContentState?,
        timestamp: Date,
        dismissalDate: Date? = nil,
        alert: LiveActivityAlert? = nil,
        staleDate: Date? = nil,
        relevanceScore: Double? = nil
    ) throws(PayloadEncodingError) -> LiveActivityPayload {
        LiveActivityPayload(
            event: .end, timestamp: timestamp,
            contentState: try contentState.map { (s) throws(PayloadEncodingError) in try ActivityKitEncoding.jsonValue(of: s) },
            staleDate: staleDate, relevanceScore: relevanceScore, alert: alert, dismissalDate: dismissalDate
        )
    }

    // MARK: Wire form

    /// Isle's wire order for `aps` keys: the one place it is defined (``jsonValue`` and the
    /// server's stored jobs both follow it). Keys not listed go last, in their own order.
    public static let apsKeyOrder = ["timestamp", "event", "content-state", "attributes-type", "attributes", "alert", "stale-date", "dismissal-date",
                                     "relevance-score", "input-push-token", "input-push-channel"]

    /// `{"aps": …}` from a stored `aps` object (without its timestamp) and the push's timestamp,
    /// keys in ``apsKeyOrder``.
    public static func wireBytes(aps: JSONObject, timestamp: Int64) -> [UInt8] {
        var all = aps
        all["timestamp"] = .int(timestamp)
        return JSONValue.object(["aps": .object(wireOrdered(all))]).jsonBytes
    }

    /// `aps`'s keys in ``apsKeyOrder``, others after them in their order: how a job's `aps` is
    /// stored once it is accepted, so sending it is ``wireBytes(encodedAPS:timestamp:)``.
    public static func wireOrdered(_ aps: JSONObject) -> JSONObject {
        var ordered = JSONObject()
        for k in apsKeyOrder { if let v = aps[k] { ordered[k] = v } }
        for (k, v) in aps where ordered[k] == nil { ordered[k] = v }
        return ordered
    }

    /// `{"aps": …}` from the compact JSON text of a stored `aps` object (without its timestamp,
    /// keys in ``apsKeyOrder``, as ``wireOrdered(_:)`` leaves them) and the push's timestamp, by
    /// splicing the timestamp in: the payload is encoded once, when it is accepted, and not
    /// serialized again for each send. Nil when `encodedAPS` is not such an object.
    public static func wireBytes(encodedAPS: some BidirectionalCollection<UInt8>, timestamp: Int64) -> [UInt8]? {
        guard encodedAPS.first == UInt8(ascii: "{"), encodedAPS.last == UInt8(ascii: "}") else { return nil }
        let inner = encodedAPS.dropFirst().dropLast()
        var out: [UInt8] = []
        out.reserveCapacity(encodedAPS.count + 40)
        out.append(contentsOf: #"{"aps":{"timestamp":"#.utf8)
        out.append(contentsOf: String(timestamp).utf8)
        if !inner.isEmpty {
            out.append(UInt8(ascii: ","))
            out.append(contentsOf: inner)
        }
        out.append(contentsOf: "}}".utf8)
        return out
    }

    /// The size of ``wireBytes(encodedAPS:timestamp:)`` for a stored `aps` of `encodedAPSCount`
    /// bytes, without building it.
    public static func wireSize(encodedAPSCount: Int, timestamp: Int64) -> Int {
        let inner = max(0, encodedAPSCount - 2)
        return #"{"aps":{"timestamp":"#.utf8.count + String(timestamp).utf8.count + (inner > 0 ? 1 + inner : 0) + 2
    }

    /// The payload as JSON, `aps` keys in a fixed order: timestamp, event, content-state,
    /// attributes-type, attributes, alert, stale-date, dismissal-date, relevance-score,
    /// input-push-token, input-push-channel.
    public var jsonValue: JSONValue {
        var aps = JSONObject()
        aps["timestamp"] = .int(ActivityKitEncoding.unixSeconds(timestamp))
        aps["event"] = .string(event.rawValue)
        if let contentState { aps["content-state"] = contentState }
        if let attributesType { aps["attributes-type"] = .string(attributesType) }
        if let attributes { aps["attributes"] = attributes }
        if let alert { aps["alert"] = alert.jsonValue }
        if let staleDate { aps["stale-date"] = .int(ActivityKitEncoding.unixSeconds(staleDate)) }
        if let dismissalDate { aps["dismissal-date"] = .int(ActivityKitEncoding.unixSeconds(dismissalDate)) }
        if let relevanceScore { aps["relevance-score"] = .double(relevanceScore) }
        if inputPushToken { aps["input-push-token"] = .int(1) }
        if let inputPushChannel { aps["input-push-channel"] = .string(inputPushChannel) }
        var root = JSONObject()
        root["aps"] = .object(aps)
        for (key, value) in customKeys where key != "aps" { root[key] = value }
        return .object(root)
    }

    /// The exact bytes put on the wire.
    public var encoded: [UInt8] { jsonValue.jsonBytes }
}

/// The `widgets` push payload that makes WidgetKit reload timelines (docs/protocol.md §9.1).
public struct WidgetPayload: Sendable, Hashable {
    public init() {}
    public var jsonValue: JSONValue { ["aps": ["content-changed": true]] }
    public var encoded: [UInt8] { jsonValue.jsonBytes }
}

/// A stored or received `aps` dictionary that is not a Live Activity payload Isle can read: which
/// key, and what was expected.
public struct PayloadDecodingError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The `aps` key at fault (`alert.title`, …), or nil for the whole dictionary.
    public let field: String?
    public let reason: String
    public init(field: String?, reason: String) {
        self.field = field
        self.reason = reason
    }
    public var description: String { field.map { "aps.\($0): \(reason)" } ?? reason }
}

extension AlertText {
    /// A title or body as it appears in `alert`: a string, or `{"loc-key": …, "loc-args": […]}`.
    public init(json: JSONValue, field: String) throws(PayloadDecodingError) {
        switch json {
        case .string(let text):
            self = .plain(text)
        case .object(let o):
            guard let key = o["loc-key"]?.stringValue else { throw PayloadDecodingError(field: field, reason: "expected a string or an object with loc-key") }
            var arguments: [String] = []
            if let args = o["loc-args"] {
                guard let array = args.arrayValue else { throw PayloadDecodingError(field: field + ".loc-args", reason: "expected an array of strings") }
                for a in array {
                    guard let s = a.stringValue else { throw PayloadDecodingError(field: field + ".loc-args", reason: "expected an array of strings") }
                    arguments.append(s)
                }
            }
            self = .localized(key: key, arguments: arguments)
        default:
            throw PayloadDecodingError(field: field, reason: "expected a string or an object with loc-key")
        }
    }
}

extension LiveActivityAlert {
    /// An `alert` dictionary: `title` and `body` (plain or localized), optional `sound`.
    public init(json: JSONValue) throws(PayloadDecodingError) {
        guard let o = json.objectValue else { throw PayloadDecodingError(field: "alert", reason: "expected an object with title and body") }
        guard let t = o["title"] else { throw PayloadDecodingError(field: "alert.title", reason: "required") }
        guard let b = o["body"] else { throw PayloadDecodingError(field: "alert.body", reason: "required") }
        let title = try AlertText(json: t, field: "alert.title")
        let body = try AlertText(json: b, field: "alert.body")
        var sound: AlertSound?
        switch o["sound"] {
        case nil: sound = nil
        case .string("default")?: sound = .default
        case .string(let name)?: sound = .named(name)
        default: throw PayloadDecodingError(field: "alert.sound", reason: "expected a string")
        }
        self.init(title: title, body: body, sound: sound)
    }
}

extension LiveActivityPayload {
    /// The payload an `aps` dictionary describes. `timestamp` is used when `aps` has none (a
    /// queued job's `aps` gets its timestamp when it is sent). Keys other than the ones
    /// ``apsKeyOrder`` names are refused: Isle would drop them when it encodes the payload again.
    public init(aps: JSONObject, timestamp fallback: Date) throws(PayloadDecodingError) {
        func seconds(_ key: String) throws(PayloadDecodingError) -> Date? {
            guard let v = aps[key] else { return nil }
            guard let n = v.numberValue?.doubleValue else { throw PayloadDecodingError(field: key, reason: "expected Unix seconds") }
            return Date(timeIntervalSince1970: n)
        }
        guard let e = aps[APSKey.event] else { throw PayloadDecodingError(field: APSKey.event, reason: "required: start, update or end") }
        guard let name = e.stringValue, let event = LiveActivityEvent(rawValue: name) else {
            throw PayloadDecodingError(field: APSKey.event, reason: "expected start, update or end")
        }
        if let unknown = aps.keys.first(where: { !Self.apsKeyOrder.contains($0) }) {
            throw PayloadDecodingError(field: unknown, reason: "not a key of a Live Activity's aps")
        }
        var attributesType: String?
        if let t = aps[APSKey.attributesType] {
            guard let s = t.stringValue else { throw PayloadDecodingError(field: APSKey.attributesType, reason: "expected a string") }
            attributesType = s
        }
        var relevance: Double?
        if let r = aps[APSKey.relevanceScore] {
            guard let d = r.numberValue?.doubleValue else { throw PayloadDecodingError(field: APSKey.relevanceScore, reason: "expected a number") }
            relevance = d
        }
        var inputPushToken = false
        switch aps[APSKey.inputPushToken] {
        case nil: break
        case .bool(let b)?: inputPushToken = b
        case let v?:
            guard let n = v.numberValue?.doubleValue else { throw PayloadDecodingError(field: APSKey.inputPushToken, reason: "expected 1") }
            inputPushToken = n != 0
        }
        var channel: String?
        if let c = aps[APSKey.inputPushChannel] {
            guard let s = c.stringValue else { throw PayloadDecodingError(field: APSKey.inputPushChannel, reason: "expected a string") }
            channel = s
        }
        self.init(event: event, timestamp: try seconds(APSKey.timestamp) ?? fallback, contentState: aps[APSKey.contentState],
                  staleDate: try seconds(APSKey.staleDate), relevanceScore: relevance, alert: try aps[APSKey.alert].map { (j) throws(PayloadDecodingError) in try LiveActivityAlert(json: j) },
                  dismissalDate: try seconds(APSKey.dismissalDate), attributesType: attributesType, attributes: aps[APSKey.attributes],
                  inputPushToken: inputPushToken, inputPushChannel: channel)
    }

    /// `aps` without its `timestamp`, keys in ``apsKeyOrder``: what a server stores for a push it
    /// will send later, adding the timestamp at the send (``wireBytes(encodedAPS:timestamp:)``).
    public var apsWithoutTimestamp: JSONObject {
        var aps = jsonValue["aps"]?.objectValue ?? [:]
        aps[APSKey.timestamp] = nil
        return aps
    }
}
