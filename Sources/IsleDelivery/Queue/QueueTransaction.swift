public import Foundation
public import IsleCore

/// What the queue's procedure (``QueueProcedure``) asks of a database inside one transaction: a
/// dozen set-based reads and writes, each one statement (or one per table) for a whole batch,
/// never one per job. A driver holds no rule of its own — no `if` about lanes, heads, superseding,
/// stamping or an activity's state: it moves rows (SQLite and PostgreSQL differ only in their SQL).
///
/// Everything a transaction reads or writes commits together or not at all.
public protocol QueueTransaction: Sendable {
    /// Waits for the lanes' locks, taken in one order (two transactions never deadlock). Held until
    /// the transaction ends. A store with one writer holds every lane already and does nothing.
    func lockLanes(_ lanes: [String]) async throws
    /// Takes the lanes' locks that are free, without waiting: the lanes now held (all of them on a
    /// store with one writer).
    func tryLockLanes(_ lanes: [String]) async throws -> Set<String>

    /// Each lane's unfinished jobs (queued or claimed) in lane order, at most `limit` per lane; an
    /// empty lane is left out.
    func laneWindows(_ lanes: [String], limit: Int) async throws -> [String: [LaneJob]]
    /// Due lane heads (`is_head`, queued, `run_at <= now`) of apps not in `excludingApps`, oldest
    /// first (`run_at`, then lane order), at most `limit`; rows another transaction holds are
    /// skipped, not waited for.
    func dueHeads(now: Date, limit: Int, excludingApps: Set<String>) async throws -> [StoredJob]
    /// Scheduled jobs whose time came (`run_at <= now`), oldest first, at most `limit`; rows
    /// another transaction holds are skipped.
    func dueScheduled(now: Date, limit: Int) async throws -> [ScheduledJob]
    /// The jobs with these ids (any state), in no particular order.
    func jobs(ids: [Int64]) async throws -> [StoredJob]
    /// The activities (without attributes, content and topics), by id.
    func activities(ids: [String]) async throws -> [String: ActivityRecord]
    /// The channels' last push timestamps (channels that have none are left out).
    func channelTimestamps(ids: [String]) async throws -> [String: Int64]
    /// The installations, by ``InstallationKey``.
    func installations(_ keys: [InstallationKey]) async throws -> [InstallationKey: InstallationRecord]
    /// Priority-10 sends to each activity since `since` (activities with none are left out).
    func highPrioritySends(activityIDs: [String], since: Date) async throws -> [String: Int]

    /// Inserts the rows in order: their ids, in the same order. Rows that are not `scheduled` take
    /// the next lane positions (`seq`), in row order.
    func insertJobs(_ rows: [NewJobRow]) async throws -> [Int64]
    /// Writes the parts of `writes` that are not empty, one statement each, in the order of
    /// ``QueueWrites``' fields. Answers the ids the guarded job writes reached.
    func apply(_ writes: QueueWrites) async throws -> Set<Int64>
}

/// An installation's key: installation ids are namespaced per app.
public struct InstallationKey: Sendable, Hashable {
    public var bundleID: String
    public var id: String
    public init(bundleID: String, id: String) {
        self.bundleID = bundleID
        self.id = id
    }
}

/// One unfinished job of a lane, as the procedure decides over it.
public struct LaneJob: Sendable, Hashable {
    public var id: Int64
    public var isHead: Bool
    public var claimed: Bool
    public var supersedable: Bool
    public var carriesContent: Bool
    public var runAt: Date
    public init(id: Int64, isHead: Bool, claimed: Bool, supersedable: Bool, carriesContent: Bool, runAt: Date) {
        self.id = id
        self.isHead = isHead
        self.claimed = claimed
        self.supersedable = supersedable
        self.carriesContent = carriesContent
        self.runAt = runAt
    }
}

/// A job row as a claim reads it: the job, or why its row does not decode (a row no version of Isle
/// wrote: the store's error names its table, row and column), with what its first claim fixed and
/// the flags stored when it was placed.
public struct StoredJob: Sendable {
    public var id: Int64
    public var lane: String?
    public var job: Result<PushJob, any Error>
    /// Fixed at the job's first claim (nil before it): the push's timestamp and apns-id.
    public var timestamp: Int64?
    public var apnsID: APNsID?
    /// Stored when the job was placed (``LanePlanner/isSupersedable(kind:payload:)``).
    public var supersedable: Bool
    public init(id: Int64, lane: String?, job: Result<PushJob, any Error>, timestamp: Int64?, apnsID: APNsID?, supersedable: Bool) {
        self.id = id
        self.lane = lane
        self.job = job
        self.timestamp = timestamp
        self.apnsID = apnsID
        self.supersedable = supersedable
    }
}

/// A scheduled job that came due, as promotion reads it.
public struct ScheduledJob: Sendable, Hashable {
    public var id: Int64
    public var lane: String?
    public var supersedable: Bool
    public var carriesContent: Bool
    public init(id: Int64, lane: String?, supersedable: Bool, carriesContent: Bool) {
        self.id = id
        self.lane = lane
        self.supersedable = supersedable
        self.carriesContent = carriesContent
    }
}

/// A job to insert, placed by the procedure.
public struct NewJobRow: Sendable, Hashable {
    public var job: NewPushJob
    public var lane: String?
    /// `scheduled`, `queued` or — made pointless by a later job of the same batch — `superseded`.
    public var state: PushJobState
    public var isHead: Bool
    public var supersedable: Bool
    public var carriesContent: Bool
    public var lastError: String?
    public var createdAt: Date
    public init(job: NewPushJob, lane: String?, state: PushJobState, isHead: Bool, supersedable: Bool, carriesContent: Bool, lastError: String?, createdAt: Date) {
        self.job = job
        self.lane = lane
        self.state = state
        self.isHead = isHead
        self.supersedable = supersedable
        self.carriesContent = carriesContent
        self.lastError = lastError
        self.createdAt = createdAt
    }
}

/// Everything one step of the procedure writes. A driver writes each non-empty part with one
/// statement (or one per table), in the order of these fields.
public struct QueueWrites: Sendable {
    /// Activities a push-to-start creates (with their topics).
    public var activities: [ActivityRecord] = []
    /// Scheduled jobs entering their lanes: in this order they take the next lane positions.
    public var promoted: [Promotion] = []
    /// Jobs that end before any send — superseded, dropped by an operator, failed as an unreadable
    /// row — guarded: only while still `scheduled` or `queued`.
    public var ended: [Ended] = []
    /// Jobs that become their lane's head.
    public var heads: [Int64] = []
    /// Last push timestamps fixed by first claims.
    public var activityTimestamps: [String: Int64] = [:]
    public var channelTimestamps: [String: Int64] = [:]
    /// Jobs handed to `claimWorker` until `claimUntil`, each with its timestamp and apns-id.
    public var claims: [ClaimStamp] = []
    public var claimWorker = ""
    public var claimUntil = Date(timeIntervalSince1970: 0)
    /// Completions' job writes, each guarded by its claim (same worker, same attempt).
    public var finished: [Finish] = []
    public var requeued: [Requeue] = []
    public var deliveries: [NewDelivery] = []
    /// What pushes changed in activities: content first, then ends and dead tokens.
    public var activityPatches: [ActivityPatchWrite] = []
    public var installations: [InstallationRecord] = []
    public var highPrioritySends: [HighPrioritySend] = []
    public var idempotency: [IdempotencyRecord] = []
    /// Written last: an activity's events follow the order of its writes.
    public var events: [NewEvent] = []
    /// Tells every process sharing the store that work is queued (PostgreSQL's NOTIFY).
    public var notify = false

    public init() {}

    public struct Promotion: Sendable, Hashable {
        public var id: Int64
        /// `queued`, or `superseded` by a later job promoted with it.
        public var state: PushJobState
        public var isHead: Bool
        public var lastError: String?
    }
    public struct Ended: Sendable, Hashable {
        public var id: Int64
        public var state: PushJobState
        public var reason: String
    }
    public struct ClaimStamp: Sendable, Hashable {
        public var id: Int64
        public var timestamp: Int64
        public var apnsID: APNsID
    }
    public struct Guard: Sendable, Hashable {
        public var id: Int64
        public var worker: String
        public var attempts: Int
    }
    public struct Finish: Sendable, Hashable {
        public var claim: Guard
        public var state: PushJobState
        public var reason: String?
        /// APNs' answer to this attempt's request, when it made one: counted in the job's
        /// `apns_requests` and kept as its last answer.
        public var answer: APNsAnswer?
    }
    public struct Requeue: Sendable, Hashable {
        public var claim: Guard
        public var at: Date
        public var reason: String
        public var answer: APNsAnswer?
    }
    public struct NewDelivery: Sendable, Hashable {
        public var record: DeliveryRecord
        public var bundleID: String
    }
    public struct ActivityPatchWrite: Sendable, Hashable {
        public enum Target: Sendable, Hashable {
            case activity(String)
            /// Every activity subscribed to the channel (a broadcast).
            case channel(String)
        }
        public var target: Target
        public var patch: ActivityPatch
    }
    public struct HighPrioritySend: Sendable, Hashable {
        /// An activity id, or an installation's budget key (``BudgetScope/installationKey(bundleID:installationID:)``).
        public var activityID: String
        public var at: Date
    }
    /// A priority-10 broadcast: one budget row for each installation with an unended activity on
    /// the channel (``BudgetScope/installationKey(bundleID:installationID:)``), written by one
    /// statement that selects them.
    public var highPriorityChannelSends: [HighPriorityChannelSend] = []
    public struct HighPriorityChannelSend: Sendable, Hashable {
        public var channelID: String
        public var at: Date
    }

    /// Nothing to write.
    public var isEmpty: Bool {
        activities.isEmpty && promoted.isEmpty && ended.isEmpty && heads.isEmpty && activityTimestamps.isEmpty && channelTimestamps.isEmpty && claims.isEmpty
            && finished.isEmpty && requeued.isEmpty && deliveries.isEmpty && activityPatches.isEmpty && installations.isEmpty && highPrioritySends.isEmpty && highPriorityChannelSends.isEmpty
            && idempotency.isEmpty && events.isEmpty && !notify
    }
}
