public import Foundation

/// An activity's state as ActivityKit reports it (`ActivityState`).
public enum LiveActivityState: String, Sendable, Hashable, Codable {
    case pending, active, stale, ended, dismissed
}

/// One Live Activity, shaped like ActivityKit's `Activity<Attributes>`: what the SDK reads and
/// observes. Conformances: Apple's ActivityKit (``ActivityKitAdapter``, on Apple platforms) and the
/// simulator's `SimulatedActivityKit` (the `IsleClientSimulator` module of Isle's main package), so
/// the SDK's logic runs on Linux against a simulated iPhone.
public protocol LiveActivityHandle: Sendable {
    var id: String { get }
    /// The `ActivityAttributes` type's name, as APNs and the server know it (`attributes-type`):
    /// taken from the type (`String(describing: Attributes.self)`), never typed by hand.
    var attributesType: String { get }
    /// Nil until ActivityKit hands it out (never synchronously after `request`), and always for
    /// an activity started with a broadcast channel.
    var pushToken: Data? { get }
    /// Only new values: ActivityKit's sequence does not start with the current token, so the SDK
    /// also reads ``pushToken`` when it starts tracking and when the app comes to the foreground.
    var pushTokenUpdates: AsyncStream<Data> { get }
    var activityState: LiveActivityState { get }
    var activityStateUpdates: AsyncStream<LiveActivityState> { get }
    /// Ends the activity on the phone (ActivityKit's `end(_:dismissalPolicy:)` with its last
    /// content), at once when `dismissImmediately`. Used to keep one activity per key
    /// (``IsleClient/Configuration/collapseActivitiesPerKey``); a handle that cannot end does nothing.
    func end(dismissImmediately: Bool) async
}

extension LiveActivityHandle {
    public func end(dismissImmediately: Bool) async {}
}

extension LiveActivityState {
    /// Showing (or about to): not ended or dismissed.
    public var isLive: Bool { self == .pending || self == .active || self == .stale }
}

/// A handle that carries the names the app gave its activity (the ActivityKit adapter works them
/// out from the app's closures as it lists each activity, where the `Activity` is at hand).
protocol SelfNamedHandle: LiveActivityHandle {
    var externalKey: String? { get }
    var topics: [String] { get }
    var ticket: String? { get }
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
    /// Nil below iOS 17.2 (no push-to-start) and until ActivityKit generated it.
    var pushToStartToken: Data? { get }
    /// May stay silent on some launches (docs/client.md): the SDK re-reads ``pushToStartToken``
    /// whenever the app comes to the foreground.
    var pushToStartTokenUpdates: AsyncStream<Data> { get }
    var areActivitiesEnabled: Bool { get }
    var activityEnablementUpdates: AsyncStream<Bool> { get }
    var frequentPushesEnabled: Bool { get }
    var frequentPushEnablementUpdates: AsyncStream<Bool> { get }
}

/// Where the device's widget push token comes from (WidgetKit's `WidgetCenter.currentPushInfo`,
/// iOS 26): read when tracking starts and each time the app comes to the foreground.
public protocol WidgetPushTokenSource: Sendable {
    /// Nil until WidgetKit generated it, or when no widget is configured for push.
    func currentToken() async -> Data?
}

/// The app's life as the system runs it: when it comes to the foreground, and background time to
/// finish sending (UIKit's `beginBackgroundTask`). ``IsleClient/Configuration/lifecycle`` is the
/// system's on iOS (``UIKitLifecycle``); tests give a simulated one.
public protocol AppLifecycle: Sendable {
    /// One value each time the app comes to the foreground.
    func foregroundEntries() -> AsyncStream<Void>
    /// Asks for time to finish work should the app go to (or be launched in) the background;
    /// nil when the system gives none. `expiration` is called when the time is up: the SDK then
    /// ends the task at once (its reports are already saved; the next launch sends them).
    func beginBackgroundTask(name: String, expiration: @escaping @Sendable () -> Void) async -> BackgroundTaskID?
    func endBackgroundTask(_ id: BackgroundTaskID) async
}

/// A background task the system granted (UIKit's `UIBackgroundTaskIdentifier`).
public struct BackgroundTaskID: Sendable, Hashable {
    public let rawValue: Int
    public init(rawValue: Int) { self.rawValue = rawValue }
}

extension Data {
    /// The token as APNs wants it: lowercase hex.
    var hex: String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(count * 2)
        for byte in self {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: out, as: UTF8.self)
    }
}
