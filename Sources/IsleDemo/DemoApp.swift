import Foundation
import IsleCore
import IsleClient
import IsleClientSimulator
import IsleSimulator

/// The pizza app on the simulated iPhone, written as an iOS app is: ActivityKit (here the
/// simulator's `SimulatedActivityKit`, the same shape) starts activities, and IsleClient hands
/// every token, rotation, push-started activity and dismissal to the Isle server — no
/// hand-written HTTP on the app side.
final class DemoApp: Sendable {
    /// The app's `ActivityAttributes`, as in Apple's sample.
    struct PizzaDeliveryAttributes: Codable, Sendable {
        var numberOfPizzas: Int
        var totalAmount: String
        var orderNumber: String
    }
    /// Its `ContentState`: `JSONEncoder` turns the dates into seconds since 2001, as ActivityKit does.
    struct ContentState: Codable, Sendable, Equatable {
        var driverName: String
        var deliveryTimer: ClosedRange<Date>
    }
    typealias Kit = SimulatedActivityKit<PizzaDeliveryAttributes, ContentState>

    let kit: Kit
    let client: IsleClient
    let runner: Task<Void, Never>

    /// Launches the app: IsleClient restores its state (a file in the demo's directory; the
    /// Keychain on a phone), starts sending, and tracks every pizza activity by order number.
    /// `ticket`: the registration ticket the backend signs for an order key, which IsleClient asks
    /// for (its ticket provider) when it registers the order's activity, binding the activity to
    /// the order (docs/security.md).
    init(world: SimulatorWorld, device: String, bundleID: String, serverURL: URL, deviceKey: String, storage: String,
         ticket: @escaping @Sendable (String) -> String?, log: @escaping @Sendable (IsleClient.LogEntry) -> Void) async throws {
        kit = Kit(world: world, deviceID: device, bundleID: bundleID, attributesType: "PizzaDeliveryAttributes")
        var configuration = IsleClient.Configuration(serverURL: serverURL, deviceKey: deviceKey, environment: .sandbox)
        configuration.firstRetry = 0.1
        configuration.maximumRetry = 2
        configuration.requestTimeout = 10
        configuration.log = log
        configuration.ticket = { request in ticket(request.externalKey) }
        let client = try IsleClient(configuration: configuration, storage: FileStorage(path: storage))
        self.client = client
        runner = Task { await client.run() }
        await client.track(SimulatedLiveActivities(kit), externalKey: { $0.attributes?.orderNumber })
        // WidgetKit's widget push token (iOS 26), read now and at every foreground entry.
        await client.trackWidgetPushToken(SimulatedWidgetPushTokens(world: world, deviceID: device, bundleID: bundleID))
    }

    /// `Activity<PizzaDeliveryAttributes>.request(attributes:content:pushType: .token)`.
    func startOrder(_ order: String, pizzas: Int, total: String, driver: String, until end: Date, now: Date, relevance: Double = 0) throws -> Kit.Handle {
        try kit.request(attributes: PizzaDeliveryAttributes(numberOfPizzas: pizzas, totalAmount: total, orderNumber: order),
                        content: ContentState(driverName: driver, deliveryTimer: now...end), relevanceScore: relevance)
    }

    func stop() async {
        await client.stop()
        runner.cancel()
    }
}

/// A fan's phone at match night: the app's match activity, started with IsleClient's
/// `follow(topic:)` — on the match's broadcast channel on iOS 18 and later, with a token before.
final class FanApp: Sendable {
    /// The match's `ActivityAttributes`.
    struct MatchAttributes: Codable, Sendable {
        var home: String
        var away: String
    }
    /// Its `ContentState`: the score.
    struct Score: Codable, Sendable, Equatable {
        var home: Int
        var away: Int
    }
    typealias Kit = SimulatedActivityKit<MatchAttributes, Score>

    let kit: Kit
    let client: IsleClient
    let runner: Task<Void, Never>
    /// The phone runs iOS 18 or later (`IsleClient.Capabilities.current.broadcastChannels` on a phone).
    let channels: Bool

    init(world: SimulatorWorld, device: String, bundleID: String, serverURL: URL, deviceKey: String, storage: String, channels: Bool,
         log: @escaping @Sendable (IsleClient.LogEntry) -> Void) async throws {
        kit = Kit(world: world, deviceID: device, bundleID: bundleID, attributesType: "MatchAttributes")
        var configuration = IsleClient.Configuration(serverURL: serverURL, deviceKey: deviceKey, environment: .sandbox)
        configuration.firstRetry = 0.1
        configuration.maximumRetry = 2
        configuration.requestTimeout = 10
        configuration.log = log
        let client = try IsleClient(configuration: configuration, storage: FileStorage(path: storage))
        self.client = client
        self.channels = channels
        runner = Task { await client.run() }
    }

    /// `isle.follow(topic:attributes:content:)`, as the app calls it on a phone.
    @MainActor
    func follow(topic: String, home: String, away: String) async throws -> Following<SimulatedLiveActivities<MatchAttributes, Score>.Handle> {
        let kit = self.kit
        return try await client.follow(topic: topic, channels: channels) { pushType in
            let attributes = MatchAttributes(home: home, away: away)
            let handle = switch pushType {
            case .channel(let id): try kit.request(attributes: attributes, content: Score(home: 0, away: 0), pushType: .channel(id))
            case .token: try kit.request(attributes: attributes, content: Score(home: 0, away: 0), pushType: .token)
            }
            return SimulatedLiveActivities(kit).handle(handle)
        }
    }

    func stop() async {
        await client.stop()
        runner.cancel()
    }
}
