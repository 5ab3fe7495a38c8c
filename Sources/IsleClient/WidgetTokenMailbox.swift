public import Foundation

/// Where a widget extension leaves the widget push token for its app (iOS 26).
///
/// WidgetKit hands the token to the widget extension (`WidgetPushHandler.pushTokenDidChange`), a
/// process of its own that the app may not hear from. The extension never sends it: one process
/// owns IsleClient's outbox (two writing one would lose or repeat reports). It posts the token here,
/// in the App Group's shared defaults, and the app reads it whenever it reads the widget token
/// (``IsleClient/trackWidgetPushToken(_:)``, then each time it comes to the foreground), so it
/// reaches the server on the app's next launch or foreground. See docs/client.md, "Widget push token".
///
/// In the extension: ``IsleWidgetPushHandler`` (one line), or `WidgetTokenMailbox(appGroup:).post(token)`.
/// In the app: `WidgetKitPushTokens(appGroup:)`, which reads WidgetKit first, then this mailbox.
public struct WidgetTokenMailbox: WidgetPushTokenSource {
    /// The App Group both targets belong to (`group.com.example.pizza`).
    public let appGroup: String
    static let key = "isle.widgetPushToken"

    public init(appGroup: String) { self.appGroup = appGroup }

    /// Leaves the token for the app (called in the widget extension). A token that is not 1 to 100
    /// bytes long is ignored: WidgetKit's are 32 to 100.
    public func post(_ token: Data) {
        guard (1...100).contains(token.count), let defaults = UserDefaults(suiteName: appGroup) else { return }
        defaults.set(token, forKey: Self.key)
    }

    /// The last token an extension posted, or nil.
    public func latest() -> Data? {
        guard let token = UserDefaults(suiteName: appGroup)?.data(forKey: Self.key), (1...100).contains(token.count) else { return nil }
        return token
    }

    public func currentToken() async -> Data? { latest() }
}
