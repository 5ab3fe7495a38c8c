#if canImport(ActivityKit)
import ActivityKit
import Foundation

/// Apple's ActivityKit as a ``LiveActivityKit``: one attributes type. Kept to a thin mapping (it
/// cannot be compiled on the Linux machines Isle is built on); everything else in the SDK is
/// exercised against the simulator.
@available(iOS 17.2, *)
public struct ActivityKitAdapter<Attributes: ActivityAttributes>: LiveActivityKit {
    public init() {}

    public struct Handle: LiveActivityHandle {
        public let activity: Activity<Attributes>
        public var id: String { activity.id }
        public var pushToken: Data? { activity.pushToken }
        public var pushTokenUpdates: AsyncStream<Data> { stream(activity.pushTokenUpdates) }
        public var activityState: LiveActivityState { LiveActivityState(activity.activityState) }
        public var activityStateUpdates: AsyncStream<LiveActivityState> { stream(activity.activityStateUpdates.map { LiveActivityState($0) }) }
    }

    public var attributesType: String { String(describing: Attributes.self) }
    public var activities: [Handle] { Activity<Attributes>.activities.map(Handle.init) }
    public var activityUpdates: AsyncStream<Handle> { stream(Activity<Attributes>.activityUpdates.map(Handle.init)) }
    public var pushToStartToken: Data? { Activity<Attributes>.pushToStartToken }
    public var pushToStartTokenUpdates: AsyncStream<Data> { stream(Activity<Attributes>.pushToStartTokenUpdates) }
    public var areActivitiesEnabled: Bool { ActivityAuthorizationInfo().areActivitiesEnabled }
    public var activityEnablementUpdates: AsyncStream<Bool> { stream(ActivityAuthorizationInfo().activityEnablementUpdates) }
    public var frequentPushesEnabled: Bool { ActivityAuthorizationInfo().frequentPushesEnabled }
    public var frequentPushEnablementUpdates: AsyncStream<Bool> { stream(ActivityAuthorizationInfo().frequentPushEnablementUpdates) }
}

@available(iOS 17.2, *)
extension IsleClient {
    /// Tracks every activity of `type`: `await isle.track(activitiesOf: PizzaDeliveryAttributes.self) { $0.attributes.orderNumber }`.
    public func track<Attributes: ActivityAttributes>(activitiesOf type: Attributes.Type, topics: @escaping @Sendable (Activity<Attributes>) -> [String] = { _ in [] },
                                                      externalKey: @escaping @Sendable (Activity<Attributes>) -> String?,
                                                      ticket: @escaping @Sendable (Activity<Attributes>) -> String? = { _ in nil }) {
        track(ActivityKitAdapter<Attributes>(), topics: { topics($0.activity) }, externalKey: { externalKey($0.activity) }, ticket: { ticket($0.activity) })
    }

    /// Tracks one activity: `let activity = try Activity.request(…); await isle.track(activity, externalKey: order.id, ticket: order.ticket)`
    /// (the ticket your backend signed for the key when it created the order).
    public func track<Attributes: ActivityAttributes>(_ activity: Activity<Attributes>, topics: [String] = [], externalKey: String?, ticket: String? = nil) {
        track(activity: ActivityKitAdapter<Attributes>.Handle(activity: activity), attributesType: String(describing: Attributes.self), topics: topics, externalKey: externalKey,
              ticket: ticket)
    }
}

@available(iOS 17.2, *)
extension LiveActivityState {
    init(_ s: ActivityState) {
        switch s {
        case .active: self = .active
        case .stale: self = .stale
        case .ended: self = .ended
        case .dismissed: self = .dismissed
        @unknown default: self = .pending
        }
    }
}

/// ActivityKit's sequences as `AsyncStream`s.
func stream<S: AsyncSequence & Sendable>(_ source: S) -> AsyncStream<S.Element> where S.Element: Sendable {
    AsyncStream { continuation in
        let task = Task {
            do { for try await value in source { continuation.yield(value) } } catch {}
            continuation.finish()
        }
        continuation.onTermination = { _ in task.cancel() }
    }
}
#endif
