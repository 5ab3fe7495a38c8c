public import Foundation
public import IsleClient
public import IsleSimulator

/// IsleClient's view of a simulated iPhone: `SimulatedActivityKit` as a ``LiveActivityKit``, so
/// the SDK runs on Linux against the simulator exactly as it runs against ActivityKit.
public struct SimulatedLiveActivities<Attributes: Codable & Sendable, ContentState: Codable & Sendable & Equatable>: LiveActivityKit {
    public let kit: SimulatedActivityKit<Attributes, ContentState>

    public init(_ kit: SimulatedActivityKit<Attributes, ContentState>) { self.kit = kit }

    public struct Handle: LiveActivityHandle {
        public let handle: SimulatedActivityKit<Attributes, ContentState>.Handle
        public init(_ handle: SimulatedActivityKit<Attributes, ContentState>.Handle) { self.handle = handle }
        public var id: String { handle.id }
        public var pushToken: Data? { handle.pushToken }
        public var pushTokenUpdates: AsyncStream<Data> { handle.pushTokenUpdates }
        public var activityState: LiveActivityState { Self.state(handle.activityState) }
        public var activityStateUpdates: AsyncStream<LiveActivityState> { mapped(handle.activityStateUpdates, Self.state) }
        /// The activity's attributes, as the app's type.
        public var attributes: Attributes? { handle.attributes }

        static func state(_ s: SimulatedActivityState) -> LiveActivityState {
            switch s {
            case .pending: .pending
            case .active: .active
            case .stale: .stale
            case .ended: .ended
            case .dismissed: .dismissed
            }
        }
    }

    public var attributesType: String { kit.attributesType }
    public var activities: [Handle] { kit.activities.map(Handle.init) }
    public var activityUpdates: AsyncStream<Handle> { mapped(kit.activityUpdates, Handle.init) }
    public var pushToStartToken: Data? { kit.pushToStartToken }
    public var pushToStartTokenUpdates: AsyncStream<Data> { kit.pushToStartTokenUpdates }
    public var areActivitiesEnabled: Bool { kit.areActivitiesEnabled }
    public var activityEnablementUpdates: AsyncStream<Bool> { kit.activityEnablementUpdates }
    public var frequentPushesEnabled: Bool { kit.frequentPushesEnabled }
    public var frequentPushEnablementUpdates: AsyncStream<Bool> { kit.frequentPushEnablementUpdates }
}

/// A stream of `transform`ed values; ends when the source ends or the consumer goes away.
func mapped<T: Sendable, U: Sendable>(_ source: AsyncStream<T>, _ transform: @escaping @Sendable (T) -> U) -> AsyncStream<U> {
    AsyncStream { continuation in
        let task = Task {
            for await value in source { continuation.yield(transform(value)) }
            continuation.finish()
        }
        continuation.onTermination = { _ in task.cancel() }
    }
}
