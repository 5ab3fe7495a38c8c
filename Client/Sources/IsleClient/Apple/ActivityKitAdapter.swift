#if canImport(ActivityKit)
public import ActivityKit
public import Foundation

// Apple's ActivityKit as a ``LiveActivityKit`` (Apple's "ActivityKit" documentation). It cannot be
// compiled on the Linux machines Isle is built on, so it stays a thin mapping; everything else in
// the SDK runs against the simulator. Availability: ActivityKit itself is iOS 16.1; what came
// later is guarded where it is used (frequent pushes 16.2, push-to-start 17.2, broadcast
// channels 18), and scripts/check-client-availability.sh reads this file for it.

/// One `ActivityAttributes` type, through ActivityKit.
@available(iOS 16.1, macCatalyst 16.1, *)
public struct ActivityKitAdapter<Attributes: ActivityAttributes>: LiveActivityKit {
    public init() {}

    public struct Handle: LiveActivityHandle {
        public let activity: Activity<Attributes>
        public init(activity: Activity<Attributes>) { self.activity = activity }
        public var id: String { activity.id }
        public var attributesType: String { String(describing: Attributes.self) }
        public var pushToken: Data? { activity.pushToken }
        public var pushTokenUpdates: AsyncStream<Data> { stream(activity.pushTokenUpdates) }
        public var activityState: LiveActivityState { LiveActivityState(activity.activityState) }
        public var activityStateUpdates: AsyncStream<LiveActivityState> { stream(activity.activityStateUpdates.map { LiveActivityState($0) }) }
    }

    public var attributesType: String { String(describing: Attributes.self) }
    public var activities: [Handle] { Activity<Attributes>.activities.map(Handle.init) }
    public var activityUpdates: AsyncStream<Handle> { stream(Activity<Attributes>.activityUpdates.map(Handle.init)) }

    public var pushToStartToken: Data? {
        if #available(iOS 17.2, macCatalyst 17.2, *) { return Activity<Attributes>.pushToStartToken }
        return nil
    }

    public var pushToStartTokenUpdates: AsyncStream<Data> {
        if #available(iOS 17.2, macCatalyst 17.2, *) { return stream(Activity<Attributes>.pushToStartTokenUpdates) }
        return AsyncStream { $0.finish() }
    }

    public var areActivitiesEnabled: Bool { ActivityAuthorizationInfo().areActivitiesEnabled }
    public var activityEnablementUpdates: AsyncStream<Bool> { stream(ActivityAuthorizationInfo().activityEnablementUpdates) }

    public var frequentPushesEnabled: Bool {
        if #available(iOS 16.2, macCatalyst 16.2, *) { return ActivityAuthorizationInfo().frequentPushesEnabled }
        return false
    }

    public var frequentPushEnablementUpdates: AsyncStream<Bool> {
        if #available(iOS 16.2, macCatalyst 16.2, *) { return stream(ActivityAuthorizationInfo().frequentPushEnablementUpdates) }
        return AsyncStream { $0.finish() }
    }
}

@available(iOS 16.1, macCatalyst 16.1, *)
extension IsleClient {
    /// Tracks every activity of `type`: `await isle.track(activitiesOf: PizzaDeliveryAttributes.self) { $0.attributes.orderNumber }`.
    public func track<Attributes: ActivityAttributes>(activitiesOf type: Attributes.Type, topics: @escaping @Sendable (Activity<Attributes>) -> [String] = { _ in [] },
                                                      externalKey: @escaping @Sendable (Activity<Attributes>) -> String?,
                                                      ticket: @escaping @Sendable (Activity<Attributes>) -> String? = { _ in nil }) async {
        await track(ActivityKitAdapter<Attributes>(), topics: { topics($0.activity) }, externalKey: { externalKey($0.activity) }, ticket: { ticket($0.activity) })
    }

    /// Tracks one activity: `let activity = try Activity.request(…); await isle.track(activity, externalKey: order.id)`.
    public func track<Attributes: ActivityAttributes>(_ activity: Activity<Attributes>, topics: [String] = [], externalKey: String?, ticket: String? = nil) async {
        await track(activity: ActivityKitAdapter<Attributes>.Handle(activity: activity), topics: topics, externalKey: externalKey, ticket: ticket)
    }

    /// Tracks one activity started on a broadcast channel (`pushType: .channel(channelID)`, iOS 18).
    @available(iOS 18.0, macCatalyst 18.0, *)
    public func track<Attributes: ActivityAttributes>(_ activity: Activity<Attributes>, channelID: String, topics: [String] = [], externalKey: String?, ticket: String? = nil) async {
        await track(activity: ActivityKitAdapter<Attributes>.Handle(activity: activity), channelID: channelID, topics: topics, externalKey: externalKey, ticket: ticket)
    }
}

@available(iOS 16.1, macCatalyst 16.1, *)
extension LiveActivityState {
    init(_ s: ActivityState) {
        switch s {
        case .active: self = .active
        case .ended: self = .ended
        case .dismissed: self = .dismissed
        default:
            // `.stale` is iOS 16.2.
            if #available(iOS 16.2, macCatalyst 16.2, *), s == .stale { self = .stale } else { self = .pending }
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
