public import Foundation

/// Every number the simulated iPhone uses. These are Isle's **model** of ActivityKit and WidgetKit
/// (docs/protocol.md, "Simulated device"), not values Apple publishes; change any of them.
public struct SimulatorConfiguration: Sendable, Hashable, Codable {
    /// Priority-10 pushes per rolling hour (apps without frequent updates), counted per app.
    public var hourlyBudget = 15
    /// The budget is the app's, all its activities together: Apple says "a certain budget of
    /// ActivityKit push notifications per hour" without saying per what, so Isle takes the stricter
    /// reading (docs/simulator.md). Off: each activity has a budget of its own.
    public var budgetPerApp = true
    /// …when the app declares `NSSupportsLiveActivitiesFrequentUpdates` and the user has it on.
    public var frequentHourlyBudget = 120
    /// How long a priority-5 push waits before the device applies it (0 and no maximum: at once).
    /// Apple: priority 5 is "delivered opportunistically", with no figure. By default every one
    /// waits a seeded 0.5–3 s, so nothing that passes against the simulator depends on priority 5
    /// arriving at once (a phone never promises it); `--realistic` waits 1–60 s, and ``instant``
    /// (or `isle sim --low-priority-delay 0`) applies them at once (docs/simulator.md).
    public var lowPriorityDelay: TimeInterval = 0.5
    /// When set, each priority-5 push waits a random time between `lowPriorityDelay` and this,
    /// drawn from `seed` so a run can be replayed.
    public var lowPriorityDelayMaximum: TimeInterval? = 3
    /// Seeds every random choice of the device model (priority-5 delays).
    public var seed: UInt64 = 1
    /// How long after `Activity.request` returns ActivityKit hands the push token out on
    /// `pushTokenUpdates` (WWDC23: not available synchronously). Never synchronous, even at 0.
    public var pushTokenDelay: TimeInterval = 0
    /// How long APNs stores a push for an offline device when `apns-expiration` is absent.
    public var defaultStorageDuration: TimeInterval = 30 * 86400
    /// How long a channel with storage policy 1 keeps its most recent message.
    public var channelStorageDuration: TimeInterval = 8 * 3600
    /// Longest an activity stays active before the system ends it.
    public var maximumActiveDuration: TimeInterval = 8 * 3600
    /// Longest an ended activity stays on the Lock Screen.
    public var maximumEndedDuration: TimeInterval = 4 * 3600
    /// Concurrent activities per app (`targetMaximumExceeded`) and per device (`globalMaximumExceeded`).
    public var maximumActivitiesPerApp = 5
    public var maximumActivitiesPerDevice = 10
    /// Combined static + dynamic data (ActivityKit's 4 KB).
    public var maximumActivityDataSize = 4096
    /// Ignore (and flag) a push whose timestamp equals the last applied one.
    public var strictTimestamps = false
    /// Withhold the update token of a push-started activity until the user "allows".
    public var withholdUpdateTokenUntilAllowed = false
    /// How long an alerting update shows the expanded Dynamic Island.
    public var expandedPresentationDuration: TimeInterval = 5
    /// Widget reloads per widget per 24 h.
    public var widgetDailyReloadBudget = 70
    /// Widget entries closer than this are flagged.
    public var widgetMinimumEntrySpacing: TimeInterval = 300
    /// Push-to-starts one app may make on one device within ``pushToStartWindow``; later ones start
    /// nothing (APNs still answers 200). Apple publishes no figure; developers report that more
    /// than about ten in a short time do not start (Apple Developer Forums, thread 799505). Isle's
    /// assumption, stricter rather than kinder: 10 per rolling hour (docs/simulator.md). 0: no limit.
    public var pushToStartLimit = 10
    public var pushToStartWindow: TimeInterval = 3600

    /// Hand the push-to-start and widget push tokens out inside `install` (off: like ActivityKit
    /// and WidgetKit, a moment later — after ``pushTokenDelay``, on the next tick — so an app that
    /// reads `pushToStartToken` at launch without following `pushToStartTokenUpdates` misses it here
    /// as it would on a phone).
    public var tokensAtInstall = false

    /// A push-started activity of a force-quit app gets its update token only once the person opens
    /// the app (developers report it never arrives while the app stays quit, Apple Developer Forums;
    /// iOS does not launch a force-quit app in the background). Off: it arrives as for any app.
    public var forceQuitWithholdsToken = true
    /// The same for an app that is not running (terminated by the system, not force-quit):
    /// developers report its push-started activity's update token does not arrive either until
    /// the app runs again (Apple does not say). Off: iOS launches it in the background to hand it over.
    public var terminatedWithholdsToken = true
    /// After a dismissal APNs keeps accepting the activity's token (200, nothing shown) for a seeded
    /// random time up to this before it answers 410 — Apple documents no moment, and servers see
    /// both. 0: 410 at once.
    public var tokenInvalidationDelayMaximum: TimeInterval = 120
    /// APNs answers 429 `TooManyRequests` to "too many consecutive requests to the same device
    /// token" (Apple's "Handling notification responses from APNs"), with no figure: Isle's
    /// assumption is more than this many pushes to one token within ``perTokenWindow``. 0: no limit.
    public var perTokenLimit = 40
    public var perTokenWindow: TimeInterval = 10

    // MARK: Never kinder than Apple (docs/simulator.md, "Never kinder than Apple")
    // Each is seeded by ``seed``; each default is the stricter reading of what Apple documents.

    /// A `widgets` push is answered 200 at once and reloads the widgets a seeded 1 s to this later:
    /// Apple: the system "budgets WidgetKit push notifications and delivers them opportunistically"
    /// (WidgetKit, "Updating widgets with WidgetKit push notifications"). 0: inside the 200.
    public var widgetPushDelayMaximum: TimeInterval = 30
    /// Each widget's daily reload budget is drawn (seeded) from this to ``widgetDailyReloadBudget``:
    /// Apple: "a daily budget typically includes from 40 to 70 refreshes" for a widget the person
    /// views often (WidgetKit, "Keeping a widget up to date"). Equal to it: a fixed budget.
    public var widgetDailyReloadBudgetMinimum = 40
    /// APNs "disconnects connections with too many errors, sooner for some (e.g. BadDeviceToken)";
    /// 410 is not an error (Apple, "Handling notification responses from APNs"). Isle's assumption:
    /// error answers on one connection add up — each 4xx but 410 one point, `BadDeviceToken`
    /// ``badDeviceTokenErrorWeight`` — and the answer that reaches this many within
    /// ``connectionErrorWindow`` carries a GOAWAY. 0: never.
    public var connectionErrorLimit = 100
    public var badDeviceTokenErrorWeight = 4
    public var connectionErrorWindow: TimeInterval = 300
    /// Apple: repeatedly opening and closing connections may be treated as a denial of service and
    /// blocked for a while ("Sending notification requests to APNs"). Isle's assumption: more than
    /// this many new connections to the simulator's hosts within ``connectionRateWindow`` and the
    /// next ones are closed at once, until the window has fewer. 0: no limit.
    public var connectionRateLimit = 100
    public var connectionRateWindow: TimeInterval = 10
    /// An activity's push token "may change throughout its duration" (ActivityKit, `pushTokenUpdates`);
    /// a push-to-start token "may change over time" (`pushToStartTokenUpdates`). Isle's assumption:
    /// each activity's token changes once at a seeded moment this long after it was issued, each
    /// push-to-start and widget push token at a seeded moment ``pushToStartTokenRotation`` after.
    /// The old one answers 410 from then on. nil: tokens change only when asked (`…/rotate-token`).
    public var activityTokenRotation: ClosedRange<TimeInterval>? = 3600...(7 * 3600)
    public var pushToStartTokenRotation: ClosedRange<TimeInterval>? = 3600...(24 * 3600)
    /// "APNs may reorder notifications you send to the same device token" (Apple, "Sending
    /// notification requests to APNs"). This share of pushes to an online device's Live Activity
    /// tokens (seeded) is held a random 0.1 s to ``reorderDelayMaximum`` before it reaches the
    /// device, so a later push may overtake it. 0: every push in arrival order.
    public var reorderProbability = 0.05
    public var reorderDelayMaximum: TimeInterval = 2
    /// Priority 5: "in some cases, not delivered" (Apple, `apns-priority`). This share of
    /// priority-5 Live Activity pushes (seeded) is never applied (`lostLowPriority`). 0: none lost.
    public var lowPriorityLossProbability = 0.05
    /// For an offline device APNs keeps one notification per app — "in most cases" the latest
    /// (Apple, "Sending notification requests to APNs", Quality of Service). This share of
    /// replacements (seeded) keeps the earlier push instead. 0: always the newest.
    public var storedPushNotNewestProbability = 0.05

    /// Take a provider token whose `iat` is a string of digits or a fraction (kalyke-apns sends a
    /// string, pyapns-client a float, APNSwift sent a string until 2026). Apple documents a number
    /// of seconds, and its example is an integer; APNs appears to accept the others, unconfirmed.
    /// Off (the stricter reading): 403 `InvalidProviderToken`.
    public var acceptsLooseIssuedAt = false

    /// Which clock judges a provider token's age (its `iat` at most an hour old and not more than
    /// five minutes ahead: Apple, "Establishing a token-based connection to APNs").
    public enum ProviderTokenClock: String, Sendable, Hashable, Codable, CaseIterable {
        /// The simulator's clock alone, as APNs judges by its own. With a virtual clock, the
        /// right choice for a sender that follows it (`isle serve --clock-url`).
        case simulator
        /// The simulator's clock or real time: a token valid by either is taken. With a virtual
        /// clock a sender that signs with its own (real) clock, such as a person typing `isle push`,
        /// is never refused because the virtual clock stood still or was advanced; a sender that
        /// follows the virtual clock is judged by it. Not kinder than Apple: each token is one
        /// APNs would take in one of the two worlds (docs/simulator.md, "Provider tokens and the
        /// virtual clock"). With the system clock both are the same.
        case simulatorOrReal
    }
    /// `isle sim --virtual-clock` sets ``ProviderTokenClock/simulatorOrReal`` unless told
    /// otherwise (`--provider-token-clock virtual`).
    public var providerTokenClock: ProviderTokenClock = .simulator

    public init() {}

    /// Every "never kinder than Apple" choice off: widgets pushes reload inside the 200, a fixed
    /// widget budget, no GOAWAY for errors, no connection-rate limit, tokens that change only when
    /// asked, pushes in order, no priority-5 loss, the newest push stored — for tests of what a
    /// server sends rather than of how it copes with APNs' and the device's leeway.
    public mutating func disableLeeway() {
        widgetPushDelayMaximum = 0
        widgetDailyReloadBudgetMinimum = widgetDailyReloadBudget
        connectionErrorLimit = 0
        connectionRateLimit = 0
        activityTokenRotation = nil
        pushToStartTokenRotation = nil
        reorderProbability = 0
        lowPriorityLossProbability = 0
        storedPushNotNewestProbability = 0
    }

    /// The defaults, but priority 5 applied at once, the install's tokens handed out inside
    /// `install`, a dismissed activity's token answering 410 at once, no per-token limit and a
    /// priority-10 budget per activity (the server's own model): for tests of a server, which check
    /// what arrives rather than when.
    public static var instant: SimulatorConfiguration {
        var c = SimulatorConfiguration()
        c.lowPriorityDelay = 0
        c.lowPriorityDelayMaximum = nil
        c.tokensAtInstall = true
        c.tokenInvalidationDelayMaximum = 0
        c.perTokenLimit = 0
        c.budgetPerApp = false
        c.terminatedWithholdsToken = false
        c.disableLeeway()
        return c
    }

    /// Isle's "realistic" model: priority-5 pushes wait 1–60 s (Apple: "delivered opportunistically",
    /// no published figure), push tokens arrive 0.5 s after `request`.
    public static func realistic(seed: UInt64) -> SimulatorConfiguration {
        var c = SimulatorConfiguration()
        c.lowPriorityDelay = 1
        c.lowPriorityDelayMaximum = 60
        c.pushTokenDelay = 0.5
        c.seed = seed
        return c
    }
}

/// APNs environment of a token, an app, or the fake APNs.
public enum SimulatedEnvironment: String, Sendable, Hashable, Codable, CaseIterable {
    case sandbox, production
}
