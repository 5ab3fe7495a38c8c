#if canImport(WidgetKit) && os(iOS)
public import Foundation
#if canImport(WidgetKit, _version: 600)
public import WidgetKit
#else
import WidgetKit
#endif

/// The widget push token from WidgetKit (`WidgetCenter.shared.currentPushInfo`, iOS 26; Apple's
/// "WidgetCenter.currentPushInfo" page): `await isle.trackWidgetPushToken(WidgetKitPushTokens(appGroup: "group.…"))`.
/// With an App Group, a token only the widget extension was given (``IsleWidgetPushHandler``) is
/// read from ``WidgetTokenMailbox`` when WidgetKit has none for the app. On an older iOS it answers
/// nil, so the call is safe everywhere.
///
/// Built with Xcode 16 (an iOS 18 SDK, whose WidgetKit has no `currentPushInfo`) it answers only the
/// mailbox's token: the WidgetKit call is compiled only when the SDK's WidgetKit is the iOS 26 one
/// (module version 600 and up; iOS 18.6's is 537), a check of the SDK rather than of the compiler.
public struct WidgetKitPushTokens: WidgetPushTokenSource {
    public let mailbox: WidgetTokenMailbox?

    public init(appGroup: String? = nil) { mailbox = appGroup.map(WidgetTokenMailbox.init(appGroup:)) }

    public func currentToken() async -> Data? {
        #if canImport(WidgetKit, _version: 600)
        if #available(iOS 26.0, *), let token = await WidgetCenter.shared.currentPushInfo?.token { return token }
        #endif
        return mailbox?.latest()
    }
}

#if canImport(WidgetKit, _version: 600)
/// The widget extension's push handler (iOS 26): it leaves each new widget push token in the App
/// Group's ``WidgetTokenMailbox`` for the app, which sends it (the extension never does):
///
/// ```swift
/// struct PizzaWidgetPushHandler: IsleWidgetPushHandler { static let appGroup = "group.com.example.pizza" }
/// // in the widget's configuration: .pushHandler(PizzaWidgetPushHandler.self)
/// ```
@available(iOS 26.0, *)
public protocol IsleWidgetPushHandler: WidgetPushHandler {
    static var appGroup: String { get }
}

@available(iOS 26.0, *)
extension IsleWidgetPushHandler {
    public func pushTokenDidChange(_ pushInfo: WidgetPushInfo, widgets: [WidgetInfo]) {
        WidgetTokenMailbox(appGroup: Self.appGroup).post(pushInfo.token)
    }
}
#endif
#endif
