public import Foundation
import IsleCore

/// An API shaped like ActivityKit, for app-side code under test: the app's own `Codable`
/// `ActivityAttributes` and `ContentState` types, `request` / `update` / `end`, and the update
/// streams (`pushTokenUpdates`, `pushToStartTokenUpdates`, `activityStateUpdates`,
/// `contentUpdates`, `activityUpdates`, enablement and `frequentPushesEnabled`).
///
/// Content goes through `JSONEncoder`/`JSONDecoder` with default strategies, as on the device.
public struct SimulatedActivityKit<Attributes: Codable & Sendable, ContentState: Codable & Sendable & Equatable>: Sendable {
    public let world: SimulatorWorld
    public let deviceID: String
    public let bundleID: String
    /// The ActivityAttributes type name, as the device matches it.
    public let attributesType: String

    public init(world: SimulatorWorld, deviceID: String, bundleID: String, attributesType: String = String(describing: Attributes.self)) {
        self.world = world
        self.deviceID = deviceID
        self.bundleID = bundleID
        self.attributesType = attributesType
        // The device decodes pushed content with this type too, independently of the schema.
        world.registerContentDecoder(bundleID: bundleID, attributesType: attributesType) { json in
            do {
                _ = try JSONDecoder().decode(ContentState.self, from: Data(json.jsonBytes))
                return nil
            } catch let DecodingError.keyNotFound(key, context) {
                return "key \(Self.path(context.codingPath + [key])) not found"
            } catch let DecodingError.typeMismatch(type, context) {
                return "\(Self.path(context.codingPath)): expected \(type)"
            } catch let DecodingError.valueNotFound(type, context) {
                return "\(Self.path(context.codingPath)): expected \(type), found null"
            } catch let DecodingError.dataCorrupted(context) {
                return "\(Self.path(context.codingPath)): \(context.debugDescription)"
            } catch {
                return "\(error)"
            }
        }
    }

    static func path(_ keys: [any CodingKey]) -> String {
        keys.isEmpty ? "content-state" : "content-state." + keys.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }.joined(separator: ".")
    }

    public enum PushType: Sendable, Hashable {
        case token
        case channel(String)
    }

    /// `Activity.request(attributes:content:pushType:)`.
    /// `Activity.request(attributes:content:pushType:style:)`: `style: .transient` (iOS 18) shows
    /// only in the Dynamic Island's expanded presentation, and takes `pushType: nil`.
    public func request(attributes: Attributes, content: ContentState, staleDate: Date? = nil, relevanceScore: Double = 0, pushType: PushType? = .token,
                        style: ActivityStyle = .standard) throws -> Handle {
        let requestType: SimulatorWorld.RequestPushType = switch pushType {
        case nil: .none
        case .token?: .token
        case .channel(let id)?: .channel(id)
        }
        let a = try world.requestActivity(bundleID: bundleID, on: deviceID, attributesType: attributesType, attributes: try ActivityKitEncoding.jsonValue(of: attributes),
                                          contentState: try ActivityKitEncoding.jsonValue(of: content), staleDate: staleDate, relevanceScore: relevanceScore, pushType: requestType,
                                          style: style)
        return Handle(kit: self, id: a.id)
    }

    /// `Activity<Attributes>.activities`.
    public var activities: [Handle] {
        ((try? world.device(deviceID).activities) ?? []).filter { $0.bundleID == bundleID && $0.attributesType == attributesType }.map { Handle(kit: self, id: $0.id) }
    }

    /// `Activity<Attributes>.activityUpdates`: every activity as it appears (including push-started ones).
    public var activityUpdates: AsyncStream<Handle> {
        let kit = self
        let follower = ActivityFollower(changes: world.changes.subscribe(device: kit.deviceID), read: { kit.activities })
        return AsyncStream(unfolding: { await follower.next() })
    }

    /// `Activity<Attributes>.pushToStartToken`.
    public var pushToStartToken: Data? {
        (try? world.app(bundleID, on: deviceID).pushToStartTokens[attributesType]).flatMap { $0 }.map(Self.bytes)
    }

    /// `Activity<Attributes>.pushToStartTokenUpdates`.
    public var pushToStartTokenUpdates: AsyncStream<Data> { follow(world) { kit in kit.pushToStartToken } }

    /// `ActivityAuthorizationInfo().areActivitiesEnabled` and its updates.
    public var areActivitiesEnabled: Bool { (try? world.app(bundleID, on: deviceID).liveActivitiesEnabled) ?? false }
    public var activityEnablementUpdates: AsyncStream<Bool> { follow(world) { kit in kit.areActivitiesEnabled } }

    /// `ActivityAuthorizationInfo().frequentPushesEnabled` and its updates.
    public var frequentPushesEnabled: Bool { (try? world.app(bundleID, on: deviceID).frequentUpdatesActive) ?? false }
    public var frequentPushEnablementUpdates: AsyncStream<Bool> { follow(world) { kit in kit.frequentPushesEnabled } }

    static func bytes(_ hex: String) -> Data {
        var out = Data()
        var it = hex.utf8.makeIterator()
        while let h = it.next(), let l = it.next() { out.append(UInt8(String(decoding: [h, l], as: UTF8.self), radix: 16) ?? 0) }
        return out
    }

    /// One Live Activity, like `Activity<Attributes>`.
    public struct Handle: Sendable, Hashable {
        let kit: SimulatedActivityKit
        public let id: String

        public static func == (l: Handle, r: Handle) -> Bool { l.id == r.id }
        public func hash(into h: inout Hasher) { h.combine(id) }

        var record: SimulatedActivity? { try? kit.world.device(kit.deviceID).activities.first { $0.id == id } }

        public var activityState: SimulatedActivityState { record?.state ?? .dismissed }
        public var pushToken: Data? { record?.updateToken.map(SimulatedActivityKit.bytes) }
        /// The attributes, decoded with `JSONDecoder`'s defaults.
        public var attributes: Attributes? { record.flatMap { try? JSONDecoder().decode(Attributes.self, from: Data($0.attributes.jsonBytes)) } }
        /// The current content, decoded with `JSONDecoder`'s defaults (nil if it would not decode).
        public var content: ContentState? { record.flatMap { try? JSONDecoder().decode(ContentState.self, from: Data($0.contentState.jsonBytes)) } }

        public var pushTokenUpdates: AsyncStream<Data> { follow(kit.world) { [self] _ in pushToken } }
        public var activityStateUpdates: AsyncStream<SimulatedActivityState> { follow(kit.world) { [self] _ in activityState } }
        public var contentUpdates: AsyncStream<ContentState> { follow(kit.world) { [self] _ in content } }

        /// `activity.update(_:)` from the app.
        public func update(_ content: ContentState) throws {
            try kit.world.appUpdate(activityID: id, on: kit.deviceID, contentState: try ActivityKitEncoding.jsonValue(of: content))
        }

        /// `activity.end(_:dismissalPolicy:)`: `.default` or `.immediate`.
        public func end(_ content: ContentState?, dismissImmediately: Bool = false) throws {
            try kit.world.appUpdate(activityID: id, on: kit.deviceID, contentState: try content.map { try ActivityKitEncoding.jsonValue(of: $0) }, end: true, dismissImmediately: dismissImmediately)
        }

        func follow<T: Equatable & Sendable>(_ world: SimulatorWorld, _ read: @escaping @Sendable (SimulatedActivityKit) -> T?) -> AsyncStream<T> {
            kit.follow(world, read)
        }
    }

    /// Values of `read` as they change: the current one first (if any), then each new one.
    func follow<T: Equatable & Sendable>(_ world: SimulatorWorld, _ read: @escaping @Sendable (SimulatedActivityKit) -> T?) -> AsyncStream<T> {
        let follower = Follower(changes: world.changes.subscribe(device: deviceID), read: { read(self) })
        return AsyncStream(unfolding: { await follower.next() })
    }
}

/// Waits for the world's next change, one consumer at a time.
actor ChangeCursor {
    private var iterator: AsyncStream<Void>.Iterator
    init(_ changes: AsyncStream<Void>) { iterator = changes.makeAsyncIterator() }

    /// False when the feed has ended.
    func advance() async -> Bool {
        var it = iterator
        let next: Void? = await it.next(isolation: self)
        iterator = it
        return next != nil
    }
}

/// Reads a value after each change and hands out the distinct ones, the current one first.
actor Follower<T: Equatable & Sendable> {
    let cursor: ChangeCursor
    let read: @Sendable () -> T?
    var last: T?
    var started = false

    init(changes: AsyncStream<Void>, read: @escaping @Sendable () -> T?) {
        cursor = ChangeCursor(changes)
        self.read = read
    }

    func next() async -> T? {
        if !started {
            started = true
            if let v = read() {
                last = v
                return v
            }
        }
        while await cursor.advance() {
            if let v = read(), v != last {
                last = v
                return v
            }
        }
        return nil
    }
}

/// Hands out each activity of the kit once, as it appears.
actor ActivityFollower<Item: Sendable & Identifiable> where Item.ID == String {
    let cursor: ChangeCursor
    let read: @Sendable () -> [Item]
    var seen: Set<String> = []
    var pending: [Item] = []
    var started = false

    init(changes: AsyncStream<Void>, read: @escaping @Sendable () -> [Item]) {
        cursor = ChangeCursor(changes)
        self.read = read
    }

    func next() async -> Item? {
        while true {
            if !pending.isEmpty { return pending.removeFirst() }
            if started {
                guard await cursor.advance() else { return nil }
            }
            started = true
            for item in read() where seen.insert(item.id).inserted { pending.append(item) }
        }
    }
}

extension SimulatedActivityKit.Handle: Identifiable {}
