public import Foundation
public import IsleCore

/// A job handed to a worker, with the `timestamp` and `apns-id` fixed at its first claim (a retry
/// after a crash sends the very same push, so the device can tell it is a duplicate).
public struct ClaimedJob: Sendable, Hashable {
    public var job: PushJob
    public var timestamp: Int64
    public var apnsID: APNsID
    public var worker: String
    /// The activity as it was when claimed (nil for installation and channel jobs). Only for
    /// planning: completions patch what the push changed, never write this back.
    public var activity: ActivityRecord?
    /// The installation planning needs (see ``ClaimReads``), read in the claim's transaction.
    public var installation: InstallationRecord?
    /// Priority-10 pushes sent to the activity in the hour before the claim, when planning needs
    /// them (see ``ClaimReads``); 0 otherwise.
    public var highPrioritySends: Int
    /// Priority-10 pushes sent to every activity of the activity's installation (the app on that
    /// phone) in the hour before the claim, broadcasts to its channels included — the budget as a
    /// phone counts it (``BudgetScope/installation``); nil when the activity has no installation.
    public var installationHighPrioritySends: Int?
    /// Where the engine's record of priority-10 sends decided in memory stood when the claim read
    /// the counts above (``PriorityReservations/mark()``): what was decided after it is added.
    public var budgetReadMark: UInt64 = 0
    public init(job: PushJob, timestamp: Int64, apnsID: APNsID, worker: String, activity: ActivityRecord?,
                installation: InstallationRecord? = nil, highPrioritySends: Int = 0, installationHighPrioritySends: Int? = nil) {
        self.installationHighPrioritySends = installationHighPrioritySends
        self.job = job
        self.timestamp = timestamp
        self.apnsID = apnsID
        self.worker = worker
        self.activity = activity
        self.installation = installation
        self.highPrioritySends = highPrioritySends
    }
}

/// What a claim reads for planning besides the job and its activity, so a delivery makes no read
/// of its own between its claim and its send: the installation of a start or widgets push (its
/// tokens), the activity's installation for a priority-10 update (whether frequent pushes are
/// on), and that activity's priority-10 sends in the last hour (the budget, docs/protocol.md §4).
public struct ClaimReads: Sendable {
    /// The installation to read: (bundle id, installation id).
    public var installation: (bundleID: String, id: String)?
    /// The activity whose priority-10 sends since ``since`` to count.
    public var highPriorityActivity: String?
    /// The budget key of that activity's installation (``BudgetScope/installationKey(bundleID:installationID:)``).
    public var highPriorityInstallation: String?
    public var since: Date

    public init(_ job: PushJob, activity: ActivityRecord?, now: Date) {
        since = now.addingTimeInterval(-3600)
        if job.kind == .start || job.kind == .widgets || job.kind == .controls {
            installation = job.installationID.map { (job.bundleID, $0) }
        } else if job.kind != .broadcast, DeliveryPlanner.wantsHighPriority(job), let a = activity {
            installation = a.installationID.map { (a.bundleID, $0) }
            highPriorityActivity = a.id
            highPriorityInstallation = a.installationID.map { BudgetScope.installationKey(bundleID: a.bundleID, installationID: $0) }
        }
    }
}

extension ClaimedJob {
    /// A new apns-id for a job's first claim: a version 7 UUID (``APNsID/version7(now:using:)``),
    /// time-ordered so the deliveries index on it grows at its end. APNs takes any canonical UUID
    /// ("Sending notification requests to APNs", `apns-id`).
    public static func newAPNsID(now: Date) -> APNsID {
        var random = SystemRandomNumberGenerator()
        return APNsID.version7(now: now, using: &random)
    }

    /// A push's timestamp at its first claim: now in whole seconds, strictly after the last one
    /// sent to its activity and (a broadcast) its channel — the device drops an older one.
    public static func firstTimestamp(now: Date, afterActivity activityLast: Int64?, afterChannel channelLast: Int64?) -> Int64 {
        var ts = Int64(now.timeIntervalSince1970.rounded(.down))
        for last in [activityLast, channelLast].compactMap({ $0 }) where ts <= last { ts = last + 1 }
        return ts
    }
}

extension PushJob {
    /// The job as a claim leaves it: `worker`'s until `until`, one attempt more.
    public mutating func markClaimed(by worker: String, until: Date) {
        state = .claimed
        claimedBy = worker
        claimedUntil = until
        attempts += 1
    }
}

/// What a delivered (or refused) push changes in the activity's record. Each part is a targeted,
/// guarded write: content never reverts a state the device reported, an end never undoes a
/// dismissal, and a dead token retires the activity only while it still holds that token.
public struct ActivityPatch: Sendable, Hashable {
    public var content: JSONValue?
    public var relevanceScore: Double?
    /// Sets `staleDate` (nil clears it) when `setsStaleDate`.
    public var setsStaleDate = false
    public var staleDate: Date?
    public var end: End?
    public var unreachable: Unreachable?

    public struct End: Sendable, Hashable {
        public var at: Date
        public var dismissAt: Date?
        public var reason: String?
        public init(at: Date, dismissAt: Date? = nil, reason: String? = nil) {
            self.at = at
            self.dismissAt = dismissAt
            self.reason = reason
        }
    }

    public struct Unreachable: Sendable, Hashable {
        public var reason: String
        /// Only while the activity still holds this update token (nil: whatever it holds).
        public var ifToken: String?
        public init(reason: String, ifToken: String?) {
            self.reason = reason
            self.ifToken = ifToken
        }
    }

    public init(content: JSONValue? = nil, relevanceScore: Double? = nil, setsStaleDate: Bool = false, staleDate: Date? = nil, end: End? = nil, unreachable: Unreachable? = nil) {
        self.content = content
        self.relevanceScore = relevanceScore
        self.setsStaleDate = setsStaleDate
        self.staleDate = staleDate
        self.end = end
        self.unreachable = unreachable
    }
}

/// Tokens of an installation that APNs said are dead; each removed only if it is still the one held.
public struct InstallationPatch: Sendable, Hashable {
    public var bundleID: String
    public var installationID: String
    public var deadPushToStartToken: (type: String, token: String)?
    public var deadWidgetToken: String?
    public var deadControlsToken: String?
    public init(bundleID: String, installationID: String, deadPushToStartToken: (type: String, token: String)? = nil, deadWidgetToken: String? = nil,
                deadControlsToken: String? = nil) {
        self.bundleID = bundleID
        self.installationID = installationID
        self.deadPushToStartToken = deadPushToStartToken
        self.deadWidgetToken = deadWidgetToken
        self.deadControlsToken = deadControlsToken
    }
    /// Removes each dead token only if the installation still holds it (a new one may have arrived
    /// since the push); answers whether anything changed.
    public func apply(to i: inout InstallationRecord) -> Bool {
        var changed = false
        if let (type, token) = deadPushToStartToken, i.pushToStartTokens[type] == token {
            i.pushToStartTokens[type] = nil
            changed = true
        }
        if let w = deadWidgetToken, i.widgetToken == w {
            i.widgetToken = nil
            changed = true
        }
        if let c = deadControlsToken, i.controlsToken == c {
            i.controlsToken = nil
            changed = true
        }
        return changed
    }

    public static func == (a: Self, b: Self) -> Bool {
        a.bundleID == b.bundleID && a.installationID == b.installationID && a.deadPushToStartToken?.type == b.deadPushToStartToken?.type
            && a.deadPushToStartToken?.token == b.deadPushToStartToken?.token && a.deadWidgetToken == b.deadWidgetToken && a.deadControlsToken == b.deadControlsToken
    }
    public func hash(into h: inout Hasher) {
        h.combine(bundleID)
        h.combine(installationID)
        h.combine(deadPushToStartToken?.type)
        h.combine(deadPushToStartToken?.token)
        h.combine(deadWidgetToken)
        h.combine(deadControlsToken)
    }
}

/// A worker's verdict on a claimed job.
public struct JobCompletion: Sendable, Hashable {
    public enum Result: Sendable, Hashable {
        /// Done for good: `sent`, `failed` or `dropped`, with why.
        case finished(PushJobState, reason: String?)
        /// Back in its lane (still its head) until `at`.
        case retry(at: Date, reason: String)
        /// APNs said the activity's update token `token` is dead. If the device handed over a new
        /// token meanwhile, the job is sent again at once with the new one. If the activity still
        /// holds it, the activity becomes unreachable and the job waits until `graceUntil` for a
        /// rotated token that may still be on its way (registering one revives the activity).
        case deadToken(token: String, reason: String, graceUntil: Date)
    }

    public var claim: ClaimedJob
    public var result: Result
    public var delivery: DeliveryRecord?
    public var activity: ActivityPatch?
    public var installation: InstallationPatch?
    /// A priority-10 send to count against the activity's hourly budget.
    public var highPriorityAt: Date?
    /// Events the completion tells beyond its push's (``Events/of(_:_:)``): the app's circuit
    /// paused or resumed by this answer. Written in the completion's transaction.
    public var events: [NewEvent] = []
    /// When the worker came to its verdict (the engine's clock): a push that failed for good
    /// failed then. Nil: when APNs answered, or the job's `runAt` without an answer.
    public var at: Date?
    /// A `retry` because the activity had no update token when the worker read it: if the device
    /// handed one over since (read in the store's transaction), the job is due at once — the
    /// registration's wake found the job claimed and could not move it.
    public var dueNowIfTokenArrived = false

    /// A `deadToken` verdict, decided against the activity's update token as it is now (read in
    /// the store's transaction): the one rule every store applies. Other verdicts pass unchanged.
    public func resolvingDeadToken(currentToken: String?) -> (Result, ActivityPatch?) {
        if dueNowIfTokenArrived, case .retry = result, currentToken != nil {
            return (.retry(at: Date(timeIntervalSince1970: 0), reason: "the device handed over the activity's update token while the push was planned; sending now"), activity)
        }
        guard case .deadToken(let token, let reason, let grace) = result else { return (result, activity) }
        guard let current = currentToken else { return (.finished(.failed, reason: reason), activity) }
        if current == token {
            return (.retry(at: grace, reason: "\(reason); waiting briefly for a rotated token before giving up"), ActivityPatch(unreachable: .init(reason: reason, ifToken: token)))
        }
        return (.retry(at: Date(timeIntervalSince1970: 0), reason: "the update token changed while sending (\(reason)); sending again with the new token"), activity)
    }

    /// What completing the claim writes, given the activity's update token now (read only for a
    /// dead-token answer, or a wait for a token): every store writes exactly this, guarded by the claim (same worker,
    /// same attempt).
    public struct Writes: Sendable, Hashable {
        public enum JobWrite: Sendable, Hashable {
            /// Done for good: the job leaves its lane and the lane's next job becomes its head.
            case finish(PushJobState, reason: String?)
            /// Back in its lane, still its head, due at `at`.
            case requeue(at: Date, reason: String)
        }
        public var job: JobWrite
        public var delivery: DeliveryRecord?
        public var activity: ActivityPatch?
        public var installation: InstallationPatch?
        public var highPriorityAt: Date?
        /// The lane may go at once (a rotated token arrived during the send): wake the engines.
        public var wakesNow: Bool {
            if case .requeue(let at, _) = job { return at <= Date(timeIntervalSince1970: 1) }
            return false
        }
    }

    public func writes(currentToken: String?) -> Writes {
        let (result, patch) = resolvingDeadToken(currentToken: currentToken)
        let job: Writes.JobWrite = switch result {
        case .finished(let state, let reason): .finish(state, reason: reason)
        case .retry(let at, let reason): .requeue(at: at, reason: reason)
        // resolvingDeadToken always decides; kept total without a trap.
        case .deadToken(_, let reason, let grace): .requeue(at: grace, reason: reason)
        }
        return Writes(job: job, delivery: delivery, activity: patch, installation: installation, highPriorityAt: highPriorityAt)
    }

    public init(claim: ClaimedJob, result: Result, delivery: DeliveryRecord? = nil, activity: ActivityPatch? = nil, installation: InstallationPatch? = nil, highPriorityAt: Date? = nil) {
        self.claim = claim
        self.result = result
        self.delivery = delivery
        self.activity = activity
        self.installation = installation
        self.highPriorityAt = highPriorityAt
    }
}
