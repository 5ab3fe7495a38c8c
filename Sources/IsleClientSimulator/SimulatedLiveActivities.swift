public import Foundation
import Synchronization
public import IsleClient
public import IsleSimulator
import IsleCore

/// IsleClient's view of a simulated iPhone: `SimulatedActivityKit` as a ``LiveActivityKit``, so
/// the SDK runs on Linux against the simulator exactly as it runs against ActivityKit.
public struct SimulatedLiveActivities<Attributes: Codable & Sendable, ContentState: Codable & Sendable & Equatable>: LiveActivityKit {
    public let kit: SimulatedActivityKit<Attributes, ContentState>

    public init(_ kit: SimulatedActivityKit<Attributes, ContentState>) { self.kit = kit }

    public struct Handle: LiveActivityHandle {
        public let handle: SimulatedActivityKit<Attributes, ContentState>.Handle
        public let attributesType: String
        /// `kit`: the simulated ActivityKit the handle came from (its attributes type is the handle's).
        public init(_ handle: SimulatedActivityKit<Attributes, ContentState>.Handle, of kit: SimulatedActivityKit<Attributes, ContentState>) {
            self.handle = handle
            self.attributesType = kit.attributesType
        }
        public var id: String { handle.id }
        public var pushToken: Data? { handle.pushToken }
        public var pushTokenUpdates: AsyncStream<Data> { handle.pushTokenUpdates }
        public var activityState: LiveActivityState { Self.state(handle.activityState) }
        public var activityStateUpdates: AsyncStream<LiveActivityState> { mapped(handle.activityStateUpdates, Self.state) }
        /// The activity's attributes, as the app's type.
        public var attributes: Attributes? { handle.attributes }
        public func end(dismissImmediately: Bool) async { try? handle.end(nil, dismissImmediately: dismissImmediately) }

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
    public var activities: [Handle] { kit.activities.map { Handle($0, of: kit) } }
    public var activityUpdates: AsyncStream<Handle> {
        let kit = self.kit
        return mapped(kit.activityUpdates) { Handle($0, of: kit) }
    }
    /// One activity of this kit, for ``IsleClient/track(activity:topics:externalKey:ticket:)``.
    public func handle(_ activity: SimulatedActivityKit<Attributes, ContentState>.Handle) -> Handle { Handle(activity, of: kit) }
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

/// The simulated phone's widget push token (WidgetKit's `currentPushInfo`, iOS 26) for
/// ``IsleClient/trackWidgetPushToken(_:)``.
public struct SimulatedWidgetPushTokens: WidgetPushTokenSource {
    public let world: SimulatorWorld
    public let deviceID: String
    public let bundleID: String
    public init(world: SimulatorWorld, deviceID: String, bundleID: String) {
        self.world = world
        self.deviceID = deviceID
        self.bundleID = bundleID
    }
    public func currentToken() async -> Data? {
        guard let hex = (try? world.app(bundleID, on: deviceID))?.widgetPushToken, let token = try? DeviceToken(hex: hex) else { return nil }
        return Data(token.bytes)
    }
}

/// An app's life as iOS runs it, for tests of code that uses IsleClient (docs/client.md):
/// foreground entries, and background tasks the way UIKit grants them. An app in the background
/// holding no background task would be suspended at once (``isSuspendable``): a test suspends
/// it then (stops its client) and checks that nothing was left unsent.
public final class SimulatedAppLifecycle: AppLifecycle, Sendable {
    private struct State {
        var foreground: Bool
        var held: [Int: @Sendable () -> Void] = [:]
        var nextID = 1
        var entries: [UUID: AsyncStream<Void>.Continuation] = [:]
        var grants = 0
        /// Whether the system still grants background time (false: `beginBackgroundTask` answers nil).
        var granting = true
    }
    private let state: Mutex<State>

    public init(foreground: Bool) { state = Mutex(State(foreground: foreground)) }

    /// Background tasks held now.
    public var heldTasks: Int { state.withLock { $0.held.count } }
    /// Background tasks granted so far.
    public var grantedTasks: Int { state.withLock { $0.grants } }
    public var isForeground: Bool { state.withLock { $0.foreground } }
    /// The app is in the background with no background task: iOS would suspend it now.
    public var isSuspendable: Bool { state.withLock { !$0.foreground && $0.held.isEmpty } }

    /// The person opens the app: `willEnterForeground`. Answers how many observers were told.
    @discardableResult
    public func enterForeground() -> Int {
        let streams: [AsyncStream<Void>.Continuation] = state.withLock { s in
            s.foreground = true
            s.granting = true
            return Array(s.entries.values)
        }
        var told = 0
        for c in streams {
            if case .enqueued = c.yield() { told += 1 }
        }
        return told
    }

    /// The person leaves the app.
    public func enterBackground() { state.withLock { $0.foreground = false } }

    /// The background time is up: every holder's expiration handler runs (UIKit's rule), and
    /// no new task is granted until the app is in the foreground again.
    public func expireBackgroundTime() {
        let handlers: [@Sendable () -> Void] = state.withLock { s in
            s.granting = false
            return Array(s.held.values)
        }
        for h in handlers { h() }
    }

    public func foregroundEntries() -> AsyncStream<Void> {
        let (stream, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        let key = UUID()
        state.withLock { $0.entries[key] = continuation }
        continuation.onTermination = { [weak self] _ in self?.state.withLock { _ = $0.entries.removeValue(forKey: key) } }
        return stream
    }

    public func beginBackgroundTask(name: String, expiration: @escaping @Sendable () -> Void) async -> BackgroundTaskID? {
        state.withLock { s in
            guard s.granting else { return nil }
            let id = s.nextID
            s.nextID += 1
            s.grants += 1
            s.held[id] = expiration
            return BackgroundTaskID(rawValue: id)
        }
    }

    public func endBackgroundTask(_ id: BackgroundTaskID) async {
        state.withLock { _ = $0.held.removeValue(forKey: id.rawValue) }
    }
}
