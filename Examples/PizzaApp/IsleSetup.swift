// The app: hand everything to Isle once, at launch.
import ActivityKit
import Foundation
import IsleClient

enum Isle {
    /// One client for the app's lifetime. The device key is public (it ships in every copy of the
    /// app); the installation's own secret stays on the device, in the Keychain. The APNs
    /// environment (sandbox for a debug build, production from TestFlight and the App Store) is
    /// read from the build and sent with every token.
    static let client: IsleClient = try! IsleClient(serverURL: URL(string: "https://isle.example.com")!, deviceKey: "isle_device_…")

    /// Call from `application(_:didFinishLaunchingWithOptions:)` or the App's `init`.
    static func start() {
        Task { await client.run() }
        Task {
            // Every activity of this type — started here or by a push-to-start — is named for the
            // backend by its order number: the backend updates "order-12345" without knowing tokens.
            await client.track(activitiesOf: PizzaDeliveryAttributes.self) { activity in
                "order-" + activity.attributes.orderNumber
            }
        }
    }
}
