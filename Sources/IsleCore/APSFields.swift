/// The `aps` keys of a Live Activity push (docs/protocol.md §5.1), named once. Outside IsleCore a
/// push is a typed ``LiveActivityPayload`` (``LiveActivityPayload/init(aps:timestamp:)`` reads one).
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
