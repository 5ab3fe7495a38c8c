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
