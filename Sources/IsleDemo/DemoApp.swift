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
    /// `ticket`: the registration ticket the backend signed for an order key (the app gets it with
    /// the order), which lets IsleClient bind the activity to the order (docs/security.md).
    init(world: SimulatorWorld, device: String, bundleID: String, serverURL: URL, deviceKey: String, storage: String,
         ticket: @escaping @Sendable (String) -> String?, log: @escaping @Sendable (IsleClient.LogEntry) -> Void) async throws {
        kit = Kit(world: world, deviceID: device, bundleID: bundleID, attributesType: "PizzaDeliveryAttributes")
        var configuration = IsleClient.Configuration(serverURL: serverURL, deviceKey: deviceKey, environment: .sandbox)
        configuration.firstRetry = 0.1
        configuration.maximumRetry = 2
        configuration.requestTimeout = 10
        configuration.log = log
        let client = try IsleClient(configuration: configuration, storage: FileStorage(path: storage))
        self.client = client
        runner = Task { await client.run() }
        await client.track(SimulatedLiveActivities(kit), externalKey: { $0.attributes?.orderNumber }, ticket: { h in h.attributes.flatMap { ticket($0.orderNumber) } })
    }

    /// `Activity<PizzaDeliveryAttributes>.request(attributes:content:pushType: .token)`.
    func startOrder(_ order: String, pizzas: Int, total: String, driver: String, until end: Date, now: Date, relevance: Double = 0) throws -> Kit.Handle {
        try kit.request(attributes: PizzaDeliveryAttributes(numberOfPizzas: pizzas, totalAmount: total, orderNumber: order),
                        content: ContentState(driverName: driver, deliveryTimer: now...end), relevanceScore: relevance)
    }

    /// The widget push token WidgetKit hands the app (iOS 26), passed on to IsleClient.
    func reportWidgetToken(_ hex: String) async {
        guard let token = try? DeviceToken(hex: hex) else { return }
        await client.reportInstallation(widgetToken: Data(token.bytes))
    }

    func stop() async {
        await client.stop()
        runner.cancel()
    }
}
