// The app: hand everything to Isle once, at launch (docs/client.md).
import ActivityKit
import Foundation
import IsleClient

enum Isle {
    /// One client for the app's lifetime. The device key is public (it ships in every copy of the
    /// app); the installation's own secret stays on the device, in the Keychain. The APNs
    /// environment (sandbox for a debug build, production from TestFlight and the App Store) is
    /// read from the build and sent with every token. The ticket provider asks the pizza backend
    /// for a registration ticket when an order's activity is registered: only then does the
    /// server bind the activity to "order-12345" (docs/security.md).
    static let client: IsleClient = try! IsleClient(serverURL: URL(string: "https://isle.example.com")!, deviceKey: "isle_device_…") { request in
        try await PizzaBackend.shared.registrationTicket(for: request.externalKey, installation: request.installationID)
    }

    /// Call from `application(_:didFinishLaunchingWithOptions:)` or the App's `init`. Also runs when
    /// iOS launches the app in the background to hand it an activity started by push-to-start:
    /// IsleClient keeps background time until the server has it.
    static func start() {
        Task { await client.run() }
        Task {
            // Every activity of this type — started here or by a push-to-start — is named for the
            // backend by its order number: the backend updates "order-12345" without knowing tokens.
            await client.track(activitiesOf: PizzaDeliveryAttributes.self) { activity in
                "order-" + activity.attributes.orderNumber
            }
            // The widget push token (iOS 26; nothing on earlier systems).
            await client.trackWidgetPushToken(WidgetKitPushTokens())
        }
    }

    /// Sign-out: the server forgets this installation (its tokens, its user) and ends its activities.
    static func signOut() async throws {
        try await client.deleteInstallation()
    }
}

/// The app's own backend client (not part of Isle): it signs registration tickets with the ticket
/// key it registered with `isle app ticket-key create` (docs/security.md).
final class PizzaBackend: Sendable {
    static let shared = PizzaBackend()

    func registrationTicket(for orderKey: String, installation: String) async throws -> String? {
        var request = URLRequest(url: URL(string: "https://pizza.example.com/api/isle-ticket")!)
        request.httpMethod = "POST"
        request.httpBody = try JSONEncoder().encode(["orderKey": orderKey, "installationID": installation])
        let (data, _) = try await URLSession.shared.data(for: request)
        return String(data: data, encoding: .utf8)
    }
}
