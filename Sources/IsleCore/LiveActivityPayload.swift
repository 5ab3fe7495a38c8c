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
