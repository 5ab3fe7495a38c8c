// ActivityKit exists on iOS only: Mac Catalyst can import the module, but every type in it is
// unavailable there, so the adapter is compiled out (Capabilities.current says no Live Activities).
#if canImport(ActivityKit) && os(iOS) && !targetEnvironment(macCatalyst)
public import ActivityKit
public import Foundation

// Apple's ActivityKit as a ``LiveActivityKit`` (Apple's "ActivityKit" documentation).
//
// Concurrency: ActivityKit's `Activity`, `ActivityAuthorizationInfo` and their update sequences are
// not `Sendable` (in the iOS 18 and iOS 26 SDKs alike), so none of them ever crosses an isolation
// domain here. A ``Handle`` is the activity's id; each read looks the activity up where it is used,
// and each update sequence is created and iterated inside the one task that forwards its values
// (`Data`, ids and states: all `Sendable`). The same shape as Airship's `LiveActivity`, which keeps
// the activity's id and finds the `Activity` again when it needs it.
//
// Availability: ActivityKit is iOS 16.1; what came later is behind `#available` where it is used
// (frequent pushes and `.stale` 16.2, push-to-start 17.2, broadcast channels 18). Proven with
// scripts/check-client-availability.sh (the SDK type-check, docs/client.md).

/// One `ActivityAttributes` type, through ActivityKit.
@available(iOS 16.1, *)
public struct ActivityKitAdapter<Attributes: ActivityAttributes>: LiveActivityKit {
    let names: ActivityNames<Attributes>

    public init() { names = ActivityNames() }

    /// Names each activity for the server as it is listed: the app's closures, called with the
    /// activity (on whatever task lists it; they must not reach into other state unguarded).
    public init(topics: (@Sendable (Activity<Attributes>) -> [String])? = nil, externalKey: (@Sendable (Activity<Attributes>) -> String?)? = nil,
                ticket: (@Sendable (Activity<Attributes>) -> String?)? = nil) {
        names = ActivityNames(topics: topics, externalKey: externalKey, ticket: ticket)
    }

    /// One activity, by its id (with the names the app gave it): ActivityKit's `Activity` is found
    /// again on each read.
    public struct Handle: LiveActivityHandle, SelfNamedHandle {
        public let id: String
        public let externalKey: String?
        public let topics: [String]
        public let ticket: String?

        public init(id: String, externalKey: String? = nil, topics: [String] = [], ticket: String? = nil) {
            self.id = id
            self.externalKey = externalKey
            self.topics = topics
            self.ticket = ticket
        }

        /// The activity, as ActivityKit lists it now; nil once it is gone (ended and dismissed).
        public var activity: Activity<Attributes>? { Activity<Attributes>.activities.first { $0.id == id } }
        public var attributesType: String { ActivityKitAdapter.typeName }
        public var pushToken: Data? { activity?.pushToken }
        public var activityState: LiveActivityState { activity.map { LiveActivityState($0.activityState) } ?? .dismissed }
        public var pushTokenUpdates: AsyncStream<Data> { forward(TokenPump<Attributes>(id: id)) }
        public var activityStateUpdates: AsyncStream<LiveActivityState> { forward(StatePump<Attributes>(id: id)) }
        /// Ends it with its last content: the `Activity` is looked up here, in this task, and never leaves it.
        public func end(dismissImmediately: Bool) async {
            guard let activity else { return }
            if #available(iOS 16.2, *) {
                await activity.end(nil, dismissalPolicy: dismissImmediately ? .immediate : .default)
            } else {
                await activity.end(using: nil, dismissalPolicy: dismissImmediately ? .immediate : .default)
            }
        }
    }

    static var typeName: String { String(describing: Attributes.self) }

    public var attributesType: String { Self.typeName }
    public var activities: [Handle] { Activity<Attributes>.activities.map { names.handle($0) } }
    public var activityUpdates: AsyncStream<Handle> { forward(ActivityPump(names: names)) }

    public var pushToStartToken: Data? {
        if #available(iOS 17.2, *) { return Activity<Attributes>.pushToStartToken }
        return nil
    }

    public var pushToStartTokenUpdates: AsyncStream<Data> { forward(PushToStartPump<Attributes>()) }
    public var areActivitiesEnabled: Bool { ActivityAuthorizationInfo().areActivitiesEnabled }
    public var activityEnablementUpdates: AsyncStream<Bool> { forward(EnablementPump()) }

    public var frequentPushesEnabled: Bool {
        if #available(iOS 16.2, *) { return ActivityAuthorizationInfo().frequentPushesEnabled }
        return false
    }

    public var frequentPushEnablementUpdates: AsyncStream<Bool> { forward(FrequentPushPump()) }
}

@available(iOS 16.2, *)
extension IsleClient {
    /// Starts an activity of `Attributes` that follows `topic`, in one call (docs/client.md,
    /// "Following a topic"): on iOS 18 and later on the topic's broadcast channel
    /// (`pushType: .channel(id)`) when the server has one for it, otherwise with a token; then
    /// tracks it under the topic. The backend's `POST /v1/topics/{topic}/update` reaches it either way.
    @MainActor
    public func follow<Attributes: ActivityAttributes>(topic: String, attributes: Attributes, content: ActivityContent<Attributes.ContentState>,
                                                       externalKey: String? = nil, ticket: String? = nil,
                                                       otherTopics: [String] = []) async throws -> Following<ActivityKitAdapter<Attributes>.Handle> {
        try await follow(topic: topic, externalKey: externalKey, ticket: ticket, otherTopics: otherTopics) { pushType in
            let activity: Activity<Attributes>
            switch pushType {
            case .channel(let id):
                if #available(iOS 18.0, *) {
                    activity = try Activity.request(attributes: attributes, content: content, pushType: .channel(id))
                } else {
                    activity = try Activity.request(attributes: attributes, content: content, pushType: .token)
                }
            case .token:
                activity = try Activity.request(attributes: attributes, content: content, pushType: .token)
            }
            return ActivityKitAdapter<Attributes>.Handle(id: activity.id, externalKey: externalKey, topics: [topic] + otherTopics, ticket: ticket)
        }
    }
}

/// The app's closures that name an activity for the server.
@available(iOS 16.1, *)
struct ActivityNames<Attributes: ActivityAttributes>: Sendable {
    var topics: (@Sendable (Activity<Attributes>) -> [String])?
    var externalKey: (@Sendable (Activity<Attributes>) -> String?)?
    var ticket: (@Sendable (Activity<Attributes>) -> String?)?

    func handle(_ activity: Activity<Attributes>) -> ActivityKitAdapter<Attributes>.Handle {
        .init(id: activity.id, externalKey: externalKey?(activity), topics: topics?(activity) ?? [], ticket: ticket?(activity))
    }
}

// Each of ActivityKit's update sequences, created and iterated inside the task that forwards it.

/// Feeds a stream from a task of its own; only the pump (a `Sendable` value) enters the task.
protocol Pump: Sendable {
    associatedtype Element: Sendable
    func run(_ out: AsyncStream<Element>.Continuation) async
}

/// The pump's stream: its task is cancelled when the stream's consumer goes away.
func forward<P: Pump>(_ pump: P) -> AsyncStream<P.Element> {
    AsyncStream { continuation in
        let task = Task {
            await pump.run(continuation)
            continuation.finish()
        }
        continuation.onTermination = { _ in task.cancel() }
    }
}

@available(iOS 16.1, *)
struct TokenPump<Attributes: ActivityAttributes>: Pump {
    let id: String
    func run(_ out: AsyncStream<Data>.Continuation) async {
        guard let activity = Activity<Attributes>.activities.first(where: { $0.id == id }) else { return }
        for await token in activity.pushTokenUpdates { out.yield(token) }
    }
}

@available(iOS 16.1, *)
struct StatePump<Attributes: ActivityAttributes>: Pump {
    let id: String
    func run(_ out: AsyncStream<LiveActivityState>.Continuation) async {
        guard let activity = Activity<Attributes>.activities.first(where: { $0.id == id }) else { return }
        for await state in activity.activityStateUpdates { out.yield(LiveActivityState(state)) }
    }
}

@available(iOS 16.1, *)
struct ActivityPump<Attributes: ActivityAttributes>: Pump {
    let names: ActivityNames<Attributes>
    func run(_ out: AsyncStream<ActivityKitAdapter<Attributes>.Handle>.Continuation) async {
        for await activity in Activity<Attributes>.activityUpdates { out.yield(names.handle(activity)) }
    }
}

@available(iOS 16.1, *)
struct PushToStartPump<Attributes: ActivityAttributes>: Pump {
    func run(_ out: AsyncStream<Data>.Continuation) async {
        guard #available(iOS 17.2, *) else { return }
        for await token in Activity<Attributes>.pushToStartTokenUpdates { out.yield(token) }
    }
}

@available(iOS 16.1, *)
struct EnablementPump: Pump {
    func run(_ out: AsyncStream<Bool>.Continuation) async {
        for await on in ActivityAuthorizationInfo().activityEnablementUpdates { out.yield(on) }
    }
}

@available(iOS 16.1, *)
struct FrequentPushPump: Pump {
    func run(_ out: AsyncStream<Bool>.Continuation) async {
        guard #available(iOS 16.2, *) else { return }
        for await on in ActivityAuthorizationInfo().frequentPushEnablementUpdates { out.yield(on) }
    }
}

extension IsleClient {
    /// Tracks every activity of `type`: `await isle.track(activitiesOf: PizzaDeliveryAttributes.self) { $0.attributes.orderNumber }`.
    /// The closures name each activity for the server when ActivityKit lists it.
    @available(iOS 16.1, *)
    public nonisolated func track<Attributes: ActivityAttributes>(activitiesOf type: Attributes.Type,
                                                                  topics: (@Sendable (Activity<Attributes>) -> [String])? = nil,
                                                                  ticket: (@Sendable (Activity<Attributes>) -> String?)? = nil,
                                                                  externalKey: @escaping @Sendable (Activity<Attributes>) -> String?) async {
        await track(selfNamed: ActivityKitAdapter<Attributes>(topics: topics, externalKey: externalKey, ticket: ticket))
    }

    /// Tracks one activity: `let activity = try Activity.request(…); await isle.track(activity, externalKey: order.id)`.
    @available(iOS 16.1, *)
    public nonisolated func track<Attributes: ActivityAttributes>(_ activity: Activity<Attributes>, topics: [String] = [], externalKey: String?, ticket: String? = nil) async {
        await track(activity: ActivityKitAdapter<Attributes>.Handle(id: activity.id), topics: topics, externalKey: externalKey, ticket: ticket)
    }

    /// Tracks one activity started on a broadcast channel (`pushType: .channel(channelID)`, iOS 18).
    @available(iOS 18.0, *)
    public nonisolated func track<Attributes: ActivityAttributes>(_ activity: Activity<Attributes>, channelID: String, topics: [String] = [], externalKey: String?, ticket: String? = nil) async {
        await track(activity: ActivityKitAdapter<Attributes>.Handle(id: activity.id), channelID: channelID, topics: topics, externalKey: externalKey, ticket: ticket)
    }
}

@available(iOS 16.1, *)
extension LiveActivityState {
    init(_ s: ActivityState) {
        switch s {
        case .active: self = .active
        case .ended: self = .ended
        case .dismissed: self = .dismissed
        default:
            // `.stale` is iOS 16.2; the iOS 26 SDK adds `.pending` (not yet shown).
            if #available(iOS 16.2, *), s == .stale { self = .stale } else { self = .pending }
        }
    }
}
#endif
