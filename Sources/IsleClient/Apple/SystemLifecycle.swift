#if canImport(UIKit) && (os(iOS) || os(visionOS))
import Foundation
import UIKit

/// UIKit's app lifecycle as an ``AppLifecycle``: foreground entries from
/// `UIApplication.willEnterForegroundNotification`, background time from
/// `UIApplication.beginBackgroundTask(withName:expirationHandler:)` (Apple's "Extending your app's
/// background execution time"). Cannot be compiled on Linux; kept to these three calls.
///
/// App only: `UIApplication.shared` does not exist in an app extension, so neither does this type
/// there (a widget extension hands its push token over with ``WidgetTokenMailbox``; docs/client.md).
@available(iOSApplicationExtension, unavailable)
@available(macCatalystApplicationExtension, unavailable)
@available(visionOSApplicationExtension, unavailable)
public struct UIKitLifecycle: AppLifecycle {
    public init() {}

    public func foregroundEntries() -> AsyncStream<Void> {
        AsyncStream { continuation in
            let task = Task { @MainActor in
                for await _ in NotificationCenter.default.notifications(named: UIApplication.willEnterForegroundNotification) { continuation.yield() }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    public func beginBackgroundTask(name: String, expiration: @escaping @Sendable () -> Void) async -> BackgroundTaskID? {
        await MainActor.run {
            let id = UIApplication.shared.beginBackgroundTask(withName: name, expirationHandler: expiration)
            return id == .invalid ? nil : BackgroundTaskID(rawValue: id.rawValue)
        }
    }

    public func endBackgroundTask(_ id: BackgroundTaskID) async {
        await MainActor.run { UIApplication.shared.endBackgroundTask(UIBackgroundTaskIdentifier(rawValue: id.rawValue)) }
    }
}
#endif
