/// The `aps` keys of a Live Activity push (docs/protocol.md §5.1), named once: code outside
/// IsleCore reads and writes a stored or planned `aps` through these, never by a string of its own.
public enum APSKey {
    public static let event = "event"
    public static let contentState = "content-state"
    public static let alert = "alert"
    public static let staleDate = "stale-date"
    public static let dismissalDate = "dismissal-date"
    public static let relevanceScore = "relevance-score"
    public static let attributesType = "attributes-type"
    public static let attributes = "attributes"
    public static let timestamp = "timestamp"
    public static let inputPushToken = "input-push-token"
    public static let inputPushChannel = "input-push-channel"
}

/// Typed reads of an `aps` dictionary, for ``JSONValue`` and ``JSONObject`` alike.
public protocol APSFields {
    func apsField(_ key: String) -> JSONValue?
}

extension APSFields {
    /// `start`, `update` or `end`.
    public var apsEvent: String? { apsField(APSKey.event)?.stringValue }
    public var apsContentState: JSONValue? { apsField(APSKey.contentState) }
    public var apsHasAlert: Bool { apsField(APSKey.alert) != nil }
    /// Unix seconds.
    public var apsStaleDate: Double? { apsField(APSKey.staleDate)?.numberValue?.doubleValue }
    /// Unix seconds.
    public var apsDismissalDate: Double? { apsField(APSKey.dismissalDate)?.numberValue?.doubleValue }
    public var apsRelevanceScore: Double? { apsField(APSKey.relevanceScore)?.numberValue?.doubleValue }
    /// The attributes type of a push-to-start.
    public var apsAttributesType: String? { apsField(APSKey.attributesType)?.stringValue }
}

extension JSONValue: APSFields {
    public func apsField(_ key: String) -> JSONValue? { self[key] }
    /// A whole push payload's `aps` dictionary (`{"aps": {…}, …}`).
    public var aps: JSONValue? { self["aps"] }
}

extension JSONObject: APSFields {
    public func apsField(_ key: String) -> JSONValue? { self[key] }
}
