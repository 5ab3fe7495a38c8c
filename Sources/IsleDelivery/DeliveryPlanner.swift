public import Foundation
public import IsleCore

/// Whose priority-10 budget a push spends (docs/server.md, "The priority-10 budget"). Apple: "The
/// system allows for a certain budget of ActivityKit push notifications per hour", without saying
/// per what; a phone may count it per app, all the app's activities on it together (`isle sim` does
/// by default), so that is Isle's default too: a priority-10 alert Isle sends is then never
/// throttled by the phone.
public enum BudgetScope: String, Sendable, Hashable, CaseIterable, Codable {
    /// The app on one phone: every activity of the installation, and the broadcasts on its channels.
    /// An activity registered without an installation has a budget of its own.
    case installation
    /// Each activity its own budget (a kinder reading; `isle serve --budget-per activity`).
    case activity

    /// The key under which an installation's priority-10 sends are counted (beside each activity's id).
    public static func installationKey(bundleID: String, installationID: String) -> String {
        "inst:\(bundleID)/\(installationID)"
    }
}

/// Decides, for a claimed job and the records as they are now, what to send (payload, priority,
/// timestamp), what to drop and why, or that the job must wait (for a token). Pure: tested on a
/// manual clock in milliseconds; the engine fetches the records and performs the plan.
public struct DeliveryPlanner: Sendable {
    public var hourlyHighPriorityBudget: Int
    public var frequentHourlyHighPriorityBudget: Int
    /// Whose budget a priority-10 push spends: the installation's (default) or the activity's.
    public var budgetScope: BudgetScope = .installation
    /// How long after it was accepted a job can still matter (its retries stop then).
    public var jobDeadline: TimeInterval
    /// How long a job waits for a push-started activity's update token before looking again
    /// (registering the token wakes it at once).
    public var tokenWait: TimeInterval
    /// How long after a push-to-start went to APNs the phone has to hand over the started
    /// activity's update token (the system wakes the app for it at once) before a push waiting
    /// for that token is told as `push.waiting`: ActivityKit may have refused the start, or the
    /// phone is offline. The push keeps waiting until its deadline.
    public var startConfirmationWindow: TimeInterval = 10 * 60

    /// The reason of a push waiting for an update token past ``startConfirmationWindow``.
    public static let unconfirmedStartReason = "the phone has not confirmed the push-to-start"

    public init(hourlyHighPriorityBudget: Int = 15, frequentHourlyHighPriorityBudget: Int = 120, jobDeadline: TimeInterval = 8 * 3600, tokenWait: TimeInterval = 30) {
        self.hourlyHighPriorityBudget = hourlyHighPriorityBudget
        self.frequentHourlyHighPriorityBudget = frequentHourlyHighPriorityBudget
        self.jobDeadline = jobDeadline
        self.tokenWait = tokenWait
    }

    /// The system ends a Live Activity 8 hours after it started (docs/protocol.md §10.4).
    public static let activityLifetime: TimeInterval = 8 * 3600

    public enum Target: Sendable, Hashable {
        /// A `liveactivity` push to an activity's update token or a push-to-start token. Tokens
        /// are parsed once, when the app hands them over; the records hold ``DeviceToken/hex``.
        case liveActivity(token: DeviceToken)
        case widgets(token: DeviceToken)
        case controls(token: DeviceToken)
        case broadcast(channelID: String, storagePolicy: Int)
    }

    public struct Push: Sendable, Hashable {
        public var target: Target
        /// The exact bytes to send (empty for `widgets`, which has its own fixed body).
        public var payload: [UInt8]
        public var priority: PushPriority
        /// Priority 10 was asked for and the activity's hourly budget is spent.
        public var downgraded: Bool
        public var attributesType: String?
        /// What the activity's record becomes once APNs accepts the push.
        public var patch: ActivityPatch?
        /// The APNs environment of the token or channel (nil: the server's default).
        public var environment: PushEnvironment?
        /// `apns-expiration`: how long APNs may store the push for a device that is offline (nil:
        /// `0`, store nothing). Set by ``plan(_:)`` for every push by one rule (docs/server.md,
        /// "What each push carries"): APNs keeps a push exactly as long as Isle would still retry
        /// it — the plan's deadline — except a broadcast on a No-Message-Stored channel, which APNs
        /// takes only with `0`, and a Most-Recent-Message channel, which stores at most 8 hours.
        public var storeUntil: Date?
    }

    /// When a job can no longer matter, and why.
    public struct Deadline: Sendable, Hashable {
        public var at: Date
        public var why: String
        public init(at: Date, why: String) {
            self.at = at
            self.why = why
        }
    }

    public enum Plan: Sendable, Hashable {
        case send(Push, Deadline)
        /// Finished as `dropped`: sending is pointless (the activity ended, the channel is gone).
        case drop(String, ActivityPatch?)
        /// Finished as `failed`: it cannot be sent.
        case fail(String)
        /// Not now: look again at `until`.
        case wait(until: Date, String)
    }

    /// Everything the planner looks at.
    public struct Context: Sendable {
        public var job: ClaimedJob
        public var app: AppRecord
        /// The activity's current record (update, end, start).
        public var activity: ActivityRecord?
        /// The installation (start, widgets; and an activity's, for frequent updates).
        public var installation: InstallationRecord?
        public var channel: ChannelRecord?
        /// Priority-10 pushes sent to the activity in the last hour.
        public var highPriorityUsed: Int
        /// …and to its installation (all its activities and channels; nil: it has none).
        public var installationHighPriorityUsed: Int?
        public var now: Date
        public init(job: ClaimedJob, app: AppRecord, activity: ActivityRecord? = nil, installation: InstallationRecord? = nil, channel: ChannelRecord? = nil, highPriorityUsed: Int = 0,
                    installationHighPriorityUsed: Int? = nil, now: Date) {
            self.installationHighPriorityUsed = installationHighPriorityUsed
            self.job = job
            self.app = app
            self.activity = activity
            self.installation = installation
            self.channel = channel
            self.highPriorityUsed = highPriorityUsed
            self.now = now
        }
    }

    /// The caller asked for priority 10, or asked nothing and the push has an alert or is an end:
    /// priority 5 is "in some cases, not delivered" (Apple, `apns-priority`), and a lost end leaves
    /// the activity on the Lock Screen, showing what is over, until the system ends it hours later.
    public static func wantsHighPriority(_ job: PushJob) -> Bool {
        job.requestedPriority == .high || (job.requestedPriority == nil && (job.hasAlert || job.payload.event == .end))
    }

    public func deadline(_ job: PushJob, activity: ActivityRecord?) -> Deadline {
        var d = Deadline(at: job.createdAt.addingTimeInterval(jobDeadline), why: "the job's deadline (\(Self.hours(jobDeadline)) after it was accepted)")
        if let a = activity, job.kind != .widgets, job.kind != .controls {
            let end = a.startedAt.addingTimeInterval(Self.activityLifetime)
            if end < d.at { d = Deadline(at: end, why: "the activity's 8-hour life") }
        }
        if LanePlanner.isSupersedable(kind: job.kind, payload: job.payload), let at = job.payload.liveActivity?.staleDate {
            if at < d.at { d = Deadline(at: at, why: "the update's stale date") }
        }
        return d
    }

    /// The longest a Most-Recent-Message channel stores its message (Apple, "Sending broadcast
    /// push notification requests to APNs": at most 8 hours).
    public static let channelStorageLimit: TimeInterval = 8 * 3600

    public func plan(_ c: Context) -> Plan {
        let plan = planUnexpiring(c)
        guard case .send(var push, let d) = plan else { return plan }
        switch push.target {
        case .broadcast(_, let storagePolicy):
            push.storeUntil = storagePolicy == 0 ? nil : min(d.at, c.now.addingTimeInterval(Self.channelStorageLimit))
        case .liveActivity, .widgets, .controls:
            push.storeUntil = d.at
        }
        return .send(push, d)
    }

    func planUnexpiring(_ c: Context) -> Plan {
        let job = c.job.job
        switch job.kind {
        case .update, .end: return planActivityPush(c)
        case .start: return planStart(c)
        case .widgets:
            guard let i = c.installation, let token = i.widgetToken else { return .fail("the installation has no widget push token") }
            let d = deadline(job, activity: nil)
            guard c.now < d.at else { return .fail("gave up: \(d.why) passed") }
            return .send(Push(target: .widgets(token: DeviceToken(parsedHex: token)), payload: [], priority: .high, downgraded: false, environment: i.environment), d)
        case .controls:
            guard let i = c.installation, let token = i.controlsToken else { return .fail("the installation has no control push token") }
            let d = deadline(job, activity: nil)
            guard c.now < d.at else { return .fail("gave up: \(d.why) passed") }
            return .send(Push(target: .controls(token: DeviceToken(parsedHex: token)), payload: [], priority: .high, downgraded: false, environment: i.environment), d)
        case .broadcast:
            guard let channel = c.channel, channel.bundleID == job.bundleID else { return .drop("the channel no longer exists", nil) }
            let d = deadline(job, activity: nil)
            guard c.now < d.at else { return .fail("gave up: \(d.why) passed") }
            // Priority 1 (never wake the device) is a broadcast's alone, as Apple allows it.
            let priority: PushPriority = job.requestedPriority == .powerConsiderate ? .powerConsiderate : Self.wantsHighPriority(job) ? .high : .low
            let kind: PushJobKind = job.payload.event == .end ? .end : .update
            return .send(Push(target: .broadcast(channelID: channel.id, storagePolicy: channel.storagePolicy), payload: Self.payload(job, timestamp: c.job.timestamp),
                              priority: priority, downgraded: false, patch: Self.patch(job.payload, kind: kind, now: c.now), environment: channel.environment), d)
        }
    }

    func planActivityPush(_ c: Context) -> Plan {
        let job = c.job.job
        guard let a = c.activity else { return .drop("the activity no longer exists", nil) }
        // The server's record follows the device's rules: nothing after the end or past 8 hours.
        let lifeEnds = a.startedAt.addingTimeInterval(Self.activityLifetime)
        if a.state.acceptsPushes, c.now >= lifeEnds {
            return .drop("the activity passed its 8-hour life", ActivityPatch(end: .init(at: lifeEnds, reason: "the system ends a Live Activity after 8 hours")))
        }
        if a.state == .unreachable { return .fail("the activity is unreachable: \(a.stateReason ?? "its token is dead")") }
        guard a.state.acceptsPushes else { return .drop("the activity is \(a.state.rawValue)", nil) }
        let d = deadline(job, activity: a)
        guard c.now < d.at else { return .fail("gave up: \(d.why) passed before it could be delivered") }
        guard let token = a.updateToken else {
            let until = min(c.now.addingTimeInterval(tokenWait), d.at)
            // The start went to APNs a while ago (its timestamp is fixed when it is first sent) and
            // the app, which the system wakes to report the token, has not: say so, keep waiting.
            if a.state == .starting, let sent = a.lastTimestamp, c.now.timeIntervalSince1970 - Double(sent) >= startConfirmationWindow {
                let minutes = Int(((c.now.timeIntervalSince1970 - Double(sent)) / 60).rounded(.down))
                return .wait(until: until, "\(Self.unconfirmedStartReason) (its update token) \(minutes) min after it went to APNs: ActivityKit may have refused the start (the app's or the phone's limit of live activities, Live Activities turned off, a start without an alert) or the phone is offline; the push waits until \(d.why) (\(Int(d.at.timeIntervalSince1970)))")
            }
            return .wait(until: until, "waiting for the device to hand over the activity's update token")
        }
        var priority = PushPriority.low
        var downgraded = false
        if Self.wantsHighPriority(job) {
            let frequent = c.app.frequentUpdatesDeclared && (c.installation?.frequentPushesEnabled ?? false)
            let budget = frequent ? frequentHourlyHighPriorityBudget : hourlyHighPriorityBudget
            if budgetUsed(c) >= budget { downgraded = true } else { priority = .high }
        }
        return .send(Push(target: .liveActivity(token: DeviceToken(parsedHex: token)), payload: Self.payload(job, timestamp: c.job.timestamp), priority: priority, downgraded: downgraded,
                          attributesType: a.attributesType, patch: Self.patch(job.payload, kind: job.kind, now: c.now), environment: a.environment), d)
    }

    /// The priority-10 pushes the budget already counts, by ``budgetScope``. An installation's
    /// count keeps one in hand: APNs stores one push per app for a phone that is offline, and the
    /// phone counts it when it arrives — up to an hour after Isle counted it — so a phone that comes
    /// back may hold one more in its hour than Isle's window does (docs/server.md, "The
    /// priority-10 budget").
    public func budgetUsed(_ c: Context) -> Int {
        switch budgetScope {
        case .installation: c.installationHighPriorityUsed.map { $0 + 1 } ?? c.highPriorityUsed
        case .activity: c.highPriorityUsed
        }
    }

    func planStart(_ c: Context) -> Plan {
        let job = c.job.job
        guard let i = c.installation, let type = job.payload.liveActivity?.attributesType else { return .drop("the installation no longer exists", nil) }
        if let a = c.activity, a.state != .starting { return .drop("the activity is \(a.state.rawValue)", nil) }
        guard let token = i.pushToStartTokens[type] else { return .fail("the installation has no push-to-start token for \(type)") }
        let d = deadline(job, activity: c.activity)
        guard c.now < d.at else { return .fail("gave up: \(d.why) passed before it could be delivered") }
        return .send(Push(target: .liveActivity(token: DeviceToken(parsedHex: token)), payload: Self.payload(job, timestamp: c.job.timestamp), priority: .high, downgraded: false, attributesType: type, environment: i.environment), d)
    }

    /// What a delivered update or end changes in the server's record of the activity.
    public static func patch(_ payload: JobPayload, kind: PushJobKind, now: Date) -> ActivityPatch {
        var p = ActivityPatch()
        guard let push = payload.liveActivity else { return p }
        p.content = push.contentState
        p.relevanceScore = push.relevanceScore
        // An update without a stale date clears it on the device too (docs/protocol.md, ActivityKit).
        if kind == .update || push.contentState != nil {
            p.setsStaleDate = true
            p.staleDate = push.staleDate
        }
        if kind == .end {
            // The system caps a custom dismissal at 4 hours after the end (docs/protocol.md §5.4).
            let dismiss = push.dismissalDate.map { min($0, now.addingTimeInterval(4 * 3600)) }
            p.end = .init(at: now, dismissAt: dismiss)
        }
        return p
    }

    /// `{"aps": {…}}` with the push's timestamp, keys in Isle's wire order: the one place a
    /// stored job becomes bytes.
    public static func payload(_ job: PushJob, timestamp: Int64) -> [UInt8] {
        if let bytes = LiveActivityPayload.wireBytes(encodedAPS: job.encodedAPS, timestamp: timestamp) { return bytes }
        return LiveActivityPayload.wireBytes(aps: job.payload.liveActivity?.apsWithoutTimestamp ?? [:], timestamp: timestamp)
    }

    static func hours(_ t: TimeInterval) -> String {
        t.truncatingRemainder(dividingBy: 3600) == 0 ? "\(Int(t / 3600)) h" : "\(Int(t / 60)) min"
    }
}
