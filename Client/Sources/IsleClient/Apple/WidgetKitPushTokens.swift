#if canImport(WidgetKit) && os(iOS)
public import Foundation
import WidgetKit

/// The widget push token from WidgetKit (`WidgetCenter.shared.currentPushInfo`, iOS 26; Apple's
/// "WidgetCenter.currentPushInfo" page): `await isle.trackWidgetPushToken(WidgetKitPushTokens())`.
/// On an older iOS it answers nil, so the call is safe everywhere. Cannot be compiled on Linux.
public struct WidgetKitPushTokens: WidgetPushTokenSource {
    public init() {}

    public func currentToken() async -> Data? {
        if #available(iOS 26.0, *) { return await WidgetCenter.shared.currentPushInfo?.token }
        return nil
    }
}
#endif
