#if canImport(WidgetKit) && os(iOS)
public import Foundation
import WidgetKit

/// The widget push token from WidgetKit (`WidgetCenter.shared.currentPushInfo`, iOS 26; Apple's
/// "WidgetCenter.currentPushInfo" page): `await isle.trackWidgetPushToken(WidgetKitPushTokens())`.
/// On an older iOS it answers nil, so the call is safe everywhere.
///
/// Built with Xcode 16 (an iOS 18 SDK, whose WidgetKit has no `currentPushInfo`) it always answers
/// nil: the call is compiled only when the SDK's WidgetKit is the iOS 26 one (module version 600 and
/// up; iOS 18.6's is 537), a check of the SDK rather than of the compiler.
public struct WidgetKitPushTokens: WidgetPushTokenSource {
    public init() {}

    public func currentToken() async -> Data? {
        #if canImport(WidgetKit, _version: 600)
        if #available(iOS 26.0, *) { return await WidgetCenter.shared.currentPushInfo?.token }
        #endif
        return nil
    }
}
#endif
