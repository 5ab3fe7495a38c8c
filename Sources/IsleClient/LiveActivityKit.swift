public import Foundation

/// An activity's state as ActivityKit reports it (`ActivityState`).
public enum LiveActivityState: String, Sendable, Hashable, Codable {
    case pending, active, stale, ended, dismissed
}

/// One Live Activity, shaped like ActivityKit's `Activity<Attributes>`: what the SDK reads and
/// observes. Conformances: Apple's ActivityKit (``ActivityKitAdapter``, on Apple platforms) and the
/// simulator's `SimulatedActivityKit` (the `IsleClientSimulator` module), so the SDK's logic runs
/// on Linux against a simulated iPhone.
public protocol LiveActivityHandle: Sendable {
    var id: String { get }
    /// Nil until ActivityKit hands it out (never synchronously after `request`).
    var pushToken: Data? { get }
    var pushTokenUpdates: AsyncStream<Data> { get }
    var activityState: LiveActivityState { get }
    var activityStateUpdates: AsyncStream<LiveActivityState> { get }
}

/// One `ActivityAttributes` type's static side of ActivityKit: its activities, the push-to-start
/// token, and the person's settings.
public protocol LiveActivityKit: Sendable {
    associatedtype Handle: LiveActivityHandle
    /// The Swift type name the server and APNs know it by (`attributes-type`).
    var attributesType: String { get }
    var activities: [Handle] { get }
    /// Every activity as it appears, including those started by push-to-start.
    var activityUpdates: AsyncStream<Handle> { get }
    var pushToStartToken: Data? { get }
    var pushToStartTokenUpdates: AsyncStream<Data> { get }
    var areActivitiesEnabled: Bool { get }
    var activityEnablementUpdates: AsyncStream<Bool> { get }
    var frequentPushesEnabled: Bool { get }
    var frequentPushEnablementUpdates: AsyncStream<Bool> { get }
}

extension Data {
    /// The token as APNs wants it: lowercase hex.
    var hex: String { map { String(format: "%02x", $0) }.joined() }
}
