// The app: hand everything to Isle once, at launch (docs/client.md).
import ActivityKit
import Foundation
import IsleClient
import UIKit

enum Isle {
    /// The system sends what the app could not finish before it was suspended, and relaunches it
    /// in the background with the answers (AppDelegate below hands it the system's handler).
    static let background = URLSessionBackgroundTransport(identifier: "com.example.pizza.isle")

    /// One client for the app's lifetime. The device key is public (it ships in every copy of the
    /// app); the installation's own secret stays on the device, in the Keychain (shared with the
    /// widget extension through the keychain access group both targets carry). The APNs
    /// environment (sandbox for a debug build, production from TestFlight and the App Store) is
    /// read from the build and sent with every token. The ticket provider asks the pizza backend
    /// for a registration ticket when an order's activity is registered: only then does the server
    /// bind the activity to the order, "12345" (docs/security.md). Nil only if the Keychain cannot be
    /// read at all: the app runs on without Isle rather than crash.
    static let client: IsleClient? = {
        guard let server = URL(string: "https://isle.example.com") else { return nil }
        var configuration = IsleClient.Configuration(serverURL: server, deviceKey: "isle_device_…")
        configuration.ticket = { request in
            try await PizzaBackend.shared.registrationTicket(for: request.externalKey, installation: request.installationID)
        }
        configuration.backgroundTransport = background
        do {
            return try IsleClient(configuration: configuration, storage: KeychainStorage(accessGroup: "TEAMID.com.example.pizza.shared"))
        } catch {
            print("Isle is off for this launch: \(error)")
            return nil
        }
    }()

    /// Call from `application(_:didFinishLaunchingWithOptions:)`. Also runs when iOS launches the
    /// app in the background to hand it an activity started by push-to-start: IsleClient keeps
    /// background time until the server has it.
    static func start() {
        guard let client else { return }
        Task { await client.run() }
        Task {
            // Every activity of this type — started here or by a push-to-start — is named for the
            // backend by its order number: the backend updates "12345" without knowing tokens.
            await client.track(activitiesOf: PizzaDeliveryAttributes.self) { activity in
                activity.attributes.orderNumber
            }
            // The widget push token (iOS 26; nothing on earlier systems): WidgetKit's, or the one the
            // widget extension left in the App Group (PizzaWidgetPushHandler, in the extension).
            await client.trackWidgetPushToken(WidgetKitPushTokens(appGroup: PizzaAppGroup.identifier))
        }
    }

    /// Sign-in: the backend's user ticket binds this installation to the person, so a
    /// push-to-start for the user reaches all their devices.
    static func signedIn(userTicket: String) async {
        await client?.reportUser(ticket: userTicket)
    }

    /// Sign-out: the server forgets this installation (its tokens, its user) and ends its activities.
    static func signOut() async throws {
        try await client?.deleteInstallation()
    }
}

final class AppDelegate: NSObject, UIApplicationDelegate {
    func application(_ application: UIApplication, didFinishLaunchingWithOptions launchOptions: [UIApplication.LaunchOptionsKey: Any]? = nil) -> Bool {
        Isle.start()
        return true
    }

    func application(_ application: UIApplication, handleEventsForBackgroundURLSession identifier: String, completionHandler: @escaping () -> Void) {
        // UIKit calls the handler on the main queue; the transport calls it there once the answers are in.
        nonisolated(unsafe) let done = completionHandler
        Isle.background.handleEvents(forBackgroundURLSession: identifier) { DispatchQueue.main.async { done() } }
    }
}

/// The app's own backend client (not part of Isle): it signs registration tickets with the ticket
/// key it registered with `isle app ticket-key create` (docs/security.md).
final class PizzaBackend: Sendable {
    static let shared = PizzaBackend()

    func registrationTicket(for orderKey: String, installation: String) async throws -> String? {
        guard let url = URL(string: "https://pizza.example.com/api/isle-ticket") else { return nil }
        var request = URLRequest(url: url)
        request.httpMethod = "POST"
        request.httpBody = try JSONEncoder().encode(["orderKey": orderKey, "installationID": installation])
        let (data, _) = try await URLSession.shared.data(for: request)
        return String(data: data, encoding: .utf8)
    }
}
