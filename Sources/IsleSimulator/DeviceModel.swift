public import Foundation
public import IsleCore

/// `ActivityState` (docs/protocol.md §10.1).
public enum SimulatedActivityState: String, Sendable, Hashable, Codable {
    case pending, active, stale, ended, dismissed
    /// Still on the Lock Screen.
    public var isVisible: Bool { self != .dismissed }
    /// Still accepting updates.
    public var isOngoing: Bool { self == .active || self == .stale || self == .pending }
}

/// What the device did with one push: the answer to "APNs said 200, why didn't it change?"
/// (docs/protocol.md, Simulated device).
public struct PushOutcome: Sendable, Hashable, Codable {
    public enum Code: String, Sendable, Hashable, Codable, CaseIterable {
        case applied, started, ended
        /// Applied (or started, or ended), but with something that probably shows wrong: Unix time
        /// in a `Date` field (31 years late), a timestamp in milliseconds. The sentence says what.
        case flagged
        case olderTimestamp, activityEnded, decodingFailed, throttled, deferredLowPriority
        case startWithoutAlert, unknownAttributesType, limitReached, tooLarge, liveActivitiesDisabled
        case channelNotFound, widgetsReloaded, widgetReloadDeferred, noWidgets, controlsReloaded, notDelivered
        /// The device was offline: APNs stored the push (or, with `apns-expiration: 0`, did not).
        case storedWhileOffline, expiredWhileOffline
        /// The iOS version of the device does not have the feature the push needs.
        case unsupportedOnThisVersion
        /// More push-to-starts for one app on one device than the system lets through in a short
        /// time (``SimulatorConfiguration/pushToStartLimit``): APNs answered 200, nothing started.
        case pushToStartThrottled
        /// Priority 5, never delivered (``SimulatorConfiguration/lowPriorityLossProbability``).
        case lostLowPriority
        /// APNs holds the push a moment before it reaches the device; a later one may overtake it
        /// (``SimulatorConfiguration/reorderProbability``).
        case heldByAPNs
        /// A `widgets` push accepted; WidgetKit reloads later, opportunistically
        /// (``SimulatorConfiguration/widgetPushDelayMaximum``).
        case widgetPushPending
    }
    public var code: Code
    public var sentence: String
    public var field: String?
    public var expected: String?
    public var found: String?

    public init(_ code: Code, _ sentence: String, field: String? = nil, expected: String? = nil, found: String? = nil) {
        self.code = code
        self.sentence = sentence
        self.field = field
        self.expected = expected
        self.found = found
    }
}

extension PushOutcome: Error {}

/// One line of a device's event log.
public struct DeviceEvent: Sendable, Hashable, Codable {
    public enum Source: String, Sendable, Hashable, Codable { case push, app, user, system }
    public var time: Date
    public var source: Source
    public var activityID: String?
    public var apnsID: String?
    public var outcome: PushOutcome?
    public var message: String
    /// Its number in the device's log, in the order `GET /events` first saw it (nil until then):
    /// events logged at an earlier moment are sorted in by time, so a reader's place is kept by this.
    public var seq: Int? = nil
}

/// An alert as the person sees it, after localization.
/// ActivityKit's `AlertConfiguration`: what a scheduled activity shows when it starts. Apple makes
/// it mandatory for a scheduled request (`request(attributes:content:pushType:style:alertConfiguration:start:)`,
/// Apple's "Displaying live data with Live Activities").
public struct AlertConfiguration: Sendable, Hashable, Codable {
    public var title: String
    public var body: String
    public var sound: String?
    public init(title: String, body: String, sound: String? = nil) {
        self.title = title
        self.body = body
        self.sound = sound
    }
}

public struct ShownAlert: Sendable, Hashable, Codable {
    public var title: String
    public var body: String
    public var sound: String?
    public var at: Date
}

/// A Live Activity on the simulated device.
public struct SimulatedActivity: Sendable, Hashable, Codable {
    public var id: String
    public var bundleID: String
    public var attributesType: String
    public var attributes: JSONValue
    public var contentState: JSONValue
    public var staleDate: Date?
    public var relevanceScore: Double
    public var state: SimulatedActivityState
    public var startedAt: Date
    public var endedAt: Date?
    public var dismissedAt: Date?
    /// When an ended activity leaves the Lock Screen.
    public var scheduledDismissal: Date?
    public var lastTimestamp: Date?
    /// The per-activity update token (hex), if it has one.
    public var updateToken: String?
    /// ActivityKit hands the token out after `request` returns (on `pushTokenUpdates`), at this time.
    public var tokenDueAt: Date?
    /// A token the device will hand out once the user allows (push-to-start with withholding).
    public var withheldToken: String?
    /// The broadcast channel it is subscribed to.
    public var channelID: String?
    public var startedBy: DeviceEvent.Source
    public var lastAlert: ShownAlert?
    /// A push-started activity of a force-quit app: its update token waits until the app is opened.
    public var tokenWaitsForLaunch = false
    /// When APNs starts answering 410 for a dismissed activity's token (drawn once, from the seed).
    public var tokenInvalidAt: Date?
    /// A scheduled activity's alert configuration, shown when it starts (iOS 26).
    public var scheduledAlert: AlertConfiguration?
    /// `ActivityStyle`: a `transient` activity (iOS 18) shows only in the Dynamic Island's expanded
    /// presentation and ends when the person locks the device or leaves the app.
    public var style: ActivityStyle = .standard
    /// Times of priority-10 pushes counted against the hourly budget.
    var budgetLog: [Date] = []
    /// The newest throttled update, applied when budget frees.
    var deferred: PendingUpdate?
    /// Priority-5 updates waiting for their opportunistic delay.
    var lowPriorityQueue: [PendingUpdate] = []
}

/// ActivityKit's `ActivityStyle` (iOS 18): `standard`, or `transient` — "appear temporarily in the
/// extended presentation in the Dynamic Island" (Apple, "Displaying live data with Live Activities").
public enum ActivityStyle: String, Sendable, Hashable, Codable { case standard, transient }

/// An update (or end) the device has accepted but not yet applied.
struct PendingUpdate: Sendable, Hashable, Codable {
    var payload: JSONValue
    var applyAt: Date
    var apnsID: String?
    var receivedAt: Date
}

/// An installed app on a simulated device.
public struct SimulatedApp: Sendable, Hashable, Codable {
    public var bundleID: String
    public var environment: SimulatedEnvironment
    /// Registered attributes types and their schemas, by the Swift type name.
    public var schemas: [String: ActivitySchema]
    /// `NSSupportsLiveActivitiesFrequentUpdates` in Info.plist.
    public var declaresFrequentUpdates: Bool
    /// The user's Live Activities switch for this app.
    public var liveActivitiesEnabled: Bool
    /// The user's "More Frequent Updates" switch.
    public var frequentUpdatesEnabled: Bool
    /// Localizable.strings for alert keys: key → format with `%@` / `%n$@`.
    public var localization: [String: String]
    /// Push-to-start tokens by attributes type.
    public var pushToStartTokens: [String: String]
    /// WidgetKit push token (iOS 26), if the app has widgets configured for push.
    public var widgetPushToken: String?
    public var widgets: [SimulatedWidget]
    /// The kinds of the app's Control Center controls that reload by push (a `ControlPushHandler`, iOS 18).
    public var controls: [String] = []
    /// The first control's push token (see ``controlPushTokens``).
    public var controlsPushToken: String?
    /// WidgetKit's push token of each control (`ControlInfo.pushInfo`, iOS 18), by kind: a
    /// `controls` push to one reloads "the single control representing that given push token"
    /// (Apple, "Updating controls locally and remotely").
    public var controlPushTokens: [String: String] = [:]
    /// How many times `controls` pushes reloaded the app's controls (all together), and the last time.
    public var controlReloads = 0
    public var lastControlReload: Date?
    /// Reloads by push of each control, by kind.
    public var controlReloadsByKind: [String: Int] = [:]
    /// `supplementalActivityFamilies` of the app's Live Activity widget: `small` gives a custom
    /// layout on Apple Watch and in CarPlay, `medium` in StandBy.
    public var supplementalActivityFamilies: [String] = []
    /// Whether the app is in the foreground (its widget reloads are free then).
    public var isForeground: Bool
    /// When ActivityKit and WidgetKit hand out the app's push-to-start and widget push tokens
    /// (after install, never synchronously; nil once handed out).
    public var tokensDueAt: Date?
    /// The person force-quit the app (swiped it away): iOS does not launch it in the background
    /// until the person opens it again.
    public var isForceQuit = false
    /// The app's process is not running (the system terminated it, or it was never launched since
    /// install or reboot) — not force-quit: iOS may still launch it in the background.
    public var isTerminated = false
    /// The app's priority-10 pushes in the last hour (when the budget is the app's).
    var budgetLog: [Date] = []

    public var frequentUpdatesActive: Bool { declaresFrequentUpdates && frequentUpdatesEnabled }
}

