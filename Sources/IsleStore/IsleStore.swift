public import Foundation
public import IsleCore
public import IsleDelivery

/// Everything the server keeps: the registry (apps, keys, installations, activities, channels) and
/// the delivery queue. Implementations: ``SQLiteStore`` (one file, the default; a temporary file in
/// unit tests) and ``PostgresStore`` (several servers on one database), behind the same protocols
/// and the same contract tests; their queue is ``QueueProcedure`` on each one's ``QueueDriver``. Consumers take the narrow repository they need (``APIKeyRepository``,
/// ``AppRepository``, …), not the whole store.
public typealias IsleStore = IsleRegistry & IsleQueue

/// Apps, keys, installations, activities and channels: every repository, with migrations and
/// retention.
///
/// Writes that depend on what is stored (`modifyActivity`, `modifyInstallation`,
/// `linkStartedActivity`) read and write in one transaction, so two of them never undo each other.
public protocol IsleRegistry: Pruning, AppRepository, APIKeyRepository, InstallationRepository, ActivityRepository, ChannelRepository, TopicRepository, RenewalRepository, DeliveryHistory,
    IdempotencyRepository, EventRepository, AuditRepository, OperatorPauseRepository, HistoryRepository {
    /// Creates the schema or brings an older one forward. A database written by a newer Isle
    /// (a schema version this binary does not know) is refused with `.refused`, and left as it is.
    func migrate() async throws
    /// The database's schema version beside the one this binary knows, without changing anything
    /// (`isle serve --check-config`).
    func schemaCheck() async throws -> SchemaCheck
    /// Runs `body` while the store's connections are up (PostgreSQL's pool); SQLite just runs it.
    func withRunning<T: Sendable>(_ body: () async throws -> T) async throws -> T
    /// Claims the database for one serving process; a second `isle serve` on it fails with a
    /// one-line reason. Release the hold when serving stops.
    func holdForServing() throws -> any ServingHold

}

/// Retention: what the store no longer keeps goes.
public protocol Pruning: Sendable {
    /// Deletes what retention no longer keeps — finished jobs, deliveries, priority-10 sends,
    /// idempotency records past their lifetime, activities that ended long ago (with their topics)
    /// and installations silent for long with no live activity — at most `limit` rows of each.
    /// Returns the rows deleted.
    @discardableResult
    func prune(now: Date, retention: Retention, limit: Int) async throws -> Int
}

/// An app by its bundle id (what a delivery reads of its app).
public protocol AppLookup: Sendable {
    func app(_ bundleID: String) async throws -> AppRecord?
}

/// A channel by its id (what a broadcast's delivery reads).
public protocol ChannelLookup: Sendable {
    func channel(id: String) async throws -> ChannelRecord?
}

/// The apps operators paused (what the engine holds back).
public protocol OperatorPauseReading: Sendable {
    func operatorPauses() async throws -> [OperatorPause]
}

/// Apps: their provider keys (sealed), schemas and ticket keys.
public protocol AppRepository: AppLookup {
    func upsertApp(_ app: AppRecord) async throws
    func apps() async throws -> [AppRecord]
    /// How many rows of each table belong to the app (``Schema/appRows``); changes nothing.
    func appRowCounts(_ bundleID: String) async throws -> [String: Int]
    /// Removes the app and every row that belongs to it, in one transaction: the rows removed per
    /// table, or nil when there is no such app.
    func removeApp(_ bundleID: String) async throws -> [String: Int]?
}

/// API keys, by the hash of their secret.
public protocol APIKeyRepository: Sendable {
    func insertAPIKey(_ key: APIKeyRecord) async throws
    func apiKey(secretHash: String) async throws -> APIKeyRecord?
    func revokeAPIKey(id: String, at: Date) async throws -> Bool
    /// The keys of one app (or of every app), oldest first: ids, scopes and dates, never secrets.
    func apiKeys(bundleID: String?) async throws -> [APIKeyRecord]

}

/// Installations of an app, namespaced per app.
public protocol InstallationRepository: Sendable {
    func upsertInstallation(_ installation: InstallationRecord) async throws
    /// Reads the installation (or `create`s it when there is none), lets `change` edit it and
    /// writes it back, in one transaction. `change` may throw to write nothing.
    /// With `idempotency`, its record (answer made from the written installation) commits in the
    /// same transaction; a live record with the same key makes it throw `.idempotencyKeyTaken`
    /// and write nothing. The same holds for every `idempotency:` parameter below.
    /// Installation ids are the app's own (namespaced per app): two apps may use the same id.
    func modifyInstallation(bundleID: String, id: String, create: @escaping @Sendable () -> InstallationRecord,
                            _ change: @escaping @Sendable (inout InstallationRecord) throws -> Void,
                            idempotency: IdempotentAnswer<InstallationRecord>?) async throws -> InstallationRecord
    func installation(bundleID: String, id: String) async throws -> InstallationRecord?
    /// The installations following `topic` for starts (their reported `topics`).
    func installations(bundleID: String, topic: String) async throws -> [InstallationRecord]
    func installations(bundleID: String, userID: String) async throws -> [InstallationRecord]

}

/// Activities: registered, started, looked up by id, key, token, installation or topic.
public protocol ActivityRepository: Sendable {
    /// Refuses (`.conflict`, nothing written) an activity whose `externalKey` is held by a live
    /// activity that is not on the same installation: checked in the insert's transaction, so two
    /// racing registrations cannot both take a key.
    func insertActivity(_ activity: ActivityRecord, idempotency: IdempotencyRecord?) async throws
    /// Read, `change`, write, in one transaction; nil when there is no such activity. With
    /// `reportedBy`, what the change tells the backend (``Events/activityChanged(from:to:by:)``)
    /// is written in the same transaction.
    func modifyActivity(id: String, _ change: @escaping @Sendable (inout ActivityRecord) throws -> Void,
                        idempotency: IdempotentAnswer<ActivityRecord>?, reportedBy: Events.Source?) async throws -> ActivityRecord?
    /// A push-started activity reports its update token: the `starting` activity with this key,
    /// type (and installation, when given) becomes active with the token, in one transaction.
    /// With several `starting` at once — a renewal's successor sent while its predecessor was
    /// never confirmed — the newest: the phone that hands a token over has the newest start at
    /// least (APNs delivers the successor's start; the predecessor's may never have shown), and
    /// the successor's link ends the predecessor.
    func linkStartedActivity(bundleID: String, externalKey: String, attributesType: String, installationID: String?, token: String, topics: [String],
                             idempotency: IdempotentAnswer<ActivityRecord>?) async throws -> ActivityRecord?
    func activity(id: String) async throws -> ActivityRecord?
    /// The activity as accepting a push needs it: without its attributes, content and topics
    /// (nil and empty), so a by-id update does not read and parse what it does not use.
    func activityForPush(id: String) async throws -> ActivityRecord?
    /// The newest activity with this backend key.
    func activity(bundleID: String, externalKey: String) async throws -> ActivityRecord?
    /// Every live activity with this backend key (one per device after a push-to-start to a user).
    func liveActivities(bundleID: String, externalKey: String) async throws -> [ActivityRecord]
    /// The app's activity holding this update token (tokens are looked up per app).
    func activity(bundleID: String, updateToken: String) async throws -> ActivityRecord?
    /// The live (starting or active) activities registered on an installation.
    func liveActivities(bundleID: String, installationID: String) async throws -> [ActivityRecord]
    /// How many live activities an installation has (its quota), without reading them.
    func liveActivityCount(bundleID: String, installationID: String) async throws -> Int
    /// Live activities following a topic.
    func activities(bundleID: String, topic: String) async throws -> [ActivityRecord]
    /// Live activities following a topic, as a fan-out needs them: without attributes, content and
    /// topics (a million followers are not parsed for an update that uses none of it).
    func pushTargets(bundleID: String, topic: String) async throws -> [ActivityRecord]
    /// The app's activities that match `query`, newest first (`startedAt`, then id), after its
    /// cursor, at most its limit: `GET /v1/activities` and the console's search.
    func findActivities(_ query: ActivityQuery) async throws -> [ActivityRecord]

}

/// Broadcast channels.
public protocol ChannelRepository: ChannelLookup {
    func insertChannel(_ channel: ChannelRecord, idempotency: IdempotencyRecord?) async throws
    func channels(bundleID: String) async throws -> [ChannelRecord]
    func deleteChannel(id: String, idempotency: IdempotencyRecord?) async throws

}

/// Topics opened as audiences and their broadcast channels, one per APNs environment
/// (docs/server.md, "Topics as audiences").
public protocol TopicRepository: Sendable {
    /// Opens a topic, or changes an open or ended one's settings (which opens it again).
    func putTopic(_ topic: TopicRecord, idempotency: IdempotencyRecord?) async throws
    func topic(bundleID: String, topic: String) async throws -> TopicRecord?
    /// The app's topics, by name.
    func topics(bundleID: String) async throws -> [TopicRecord]
    /// The topic's channels, one per environment at most.
    func topicChannels(bundleID: String, topic: String) async throws -> [TopicChannel]
    /// Stores `channel` as the topic's channel in `link.environment`, unless the topic has one
    /// there already (another request made it first): the one that stands is returned.
    func addTopicChannel(_ link: TopicChannel, channel: ChannelRecord) async throws -> TopicChannel
    /// The topic was pushed to: its channels were used now.
    /// The topic was pushed to at `at`; `content`, when given, is its latest content (nil keeps the one it has).
    func topicPushed(bundleID: String, topic: String, at: Date, content: JSONValue?) async throws
    /// Marks the topic ended (its channels close once nothing is queued for them).
    func endTopic(bundleID: String, topic: String, at: Date) async throws
    /// Forgets the topic; its channels stay until ``removeTopicChannel(channelID:)`` (closed at APNs first).
    func deleteTopic(bundleID: String, topic: String, idempotency: IdempotencyRecord?) async throws
    /// A closed topic channel goes, with its `channels` row.
    func removeTopicChannel(channelID: String) async throws
    /// The app's channels in an environment (its own and its topics'): Apple allows 10,000.
    func channelCount(bundleID: String, environment: PushEnvironment, defaultEnvironment: PushEnvironment) async throws -> Int
    /// Topic channels to close now: an ended topic's (or a forgotten one's) with nothing queued for
    /// it, and any with no broadcast for its topic's idle time and no live follower (an activity
    /// on it that takes pushes, started less than `lifetime` ago).
    func closableTopicChannels(now: Date, lifetime: TimeInterval, limit: Int) async throws -> [TopicChannel]
    /// The app's least recently used topic channel in `environment` with no live follower, to
    /// make room under the channel limit.
    func idlestTopicChannel(bundleID: String, environment: PushEnvironment, now: Date, lifetime: TimeInterval) async throws -> TopicChannel?
}

/// Activities renewed past the system's 8 hours (docs/server.md, "Activities that outlive 8 hours").
public protocol RenewalRepository: Sendable {
    /// Sets (or changes) the activity's renewal; its successor and predecessor links are kept.
    func putRenewal(_ r: RenewalRecord, idempotency: IdempotencyRecord?) async throws
    func renewal(activityID: String) async throws -> RenewalRecord?
    /// Stops renewing the activity (its successor, if started, is left as it is).
    func deleteRenewal(activityID: String, idempotency: IdempotencyRecord?) async throws
    /// Renewals due now: the activity takes pushes, its 8 hours (`lifetime`) end within `lead`,
    /// `renewUntil` is after that end, and it has no successor yet (or one whose start never got
    /// queued), oldest end first.
    func dueRenewals(now: Date, lifetime: TimeInterval, lead: TimeInterval, limit: Int) async throws -> [RenewalRecord]
    /// Names the successor unless one is named: the one that stands is returned.
    func setSuccessor(activityID: String, successorID: String) async throws -> String
}

/// What APNs answered, and the priority-10 sends the hourly budget counts.
public protocol DeliveryHistory: Sendable {
    func deliveries(activityID: String) async throws -> [DeliveryRecord]
    /// The newest `limit` deliveries of an activity older than delivery `before` (all when nil),
    /// oldest first, with their ids.
    func deliveries(activityID: String, before: Int64?, limit: Int) async throws -> [DeliveryRecord]
    func delivery(apnsID: APNsID) async throws -> DeliveryRecord?
    /// Priority-10 sends to an activity since a time (the hourly budget).
    func highPrioritySends(activityID: String, since: Date) async throws -> Int
    /// The app's activities with priority-10 sends since a time, most first, at most `limit`.
    func highPrioritySends(bundleID: String, since: Date, limit: Int) async throws -> [(activityID: String, count: Int)]
}

/// An app's events (docs/events.md) and the webhooks that receive them. Events are numbered in
/// commit order: a reader that asks for the events after the last `seq` it saw never misses one
/// committed later with a smaller number.
public protocol EventRepository: Sendable {
    /// Writes events that tell no stored fact of their own (an operator resumed an app).
    func appendEvents(_ events: [NewEvent]) async throws
    /// The app's events after `seq` (0: from the oldest kept), oldest first, at most `limit`.
    func events(bundleID: String, after seq: Int64, limit: Int) async throws -> [StoredEvent]
    /// The `seq` of the app's newest event (0: none yet).
    func lastEventSeq(bundleID: String) async throws -> Int64
    func insertWebhook(_ webhook: WebhookRecord) async throws
    func webhooks(bundleID: String) async throws -> [WebhookRecord]
    func allWebhooks() async throws -> [WebhookRecord]
    func webhook(id: String) async throws -> WebhookRecord?
    func deleteWebhook(id: String) async throws -> Bool
    /// Writes what a sender learned (cursor, counts, failures); false when the webhook is gone or
    /// its settings changed since it was read (its ``WebhookRecord/revision``). The cursor never
    /// moves back here.
    func saveWebhookProgress(_ webhook: WebhookRecord) async throws -> Bool
    /// Writes the webhook's settings (url, event types, disabled, secrets) and bumps its revision,
    /// if its revision is still the one in `webhook`; with `replayFrom`, its cursor moves there
    /// (back, to send again); `resetFailure` clears its failure (enabled again). `events` are
    /// written in the same transaction (`webhook.disabled`). False when gone or changed meanwhile.
    func changeWebhook(_ webhook: WebhookRecord, replayFrom: Int64?, resetFailure: Bool, events: [NewEvent]) async throws -> Bool
    /// Keeps a request to an endpoint in its log (the newest 100 per webhook are kept).
    func recordWebhookAttempt(_ attempt: WebhookAttempt) async throws
    /// The webhook's newest attempts first, at most `limit`.
    func webhookAttempts(webhookID: String, limit: Int) async throws -> [WebhookAttempt]
    /// Takes or renews, for `lease`, the right to send the webhook's events: one process at a time
    /// sends an endpoint's events, so they arrive in order. False while another process holds it.
    func holdWebhook(id: String, worker: String, now: Date, lease: TimeInterval) async throws -> Bool
    /// At a serving process's start, the holds no running process can still have (SQLite: all of
    /// them — one process serves the file, and its lock proves the last one gone; PostgreSQL: none,
    /// other instances may be sending). Answers how many.
    func releaseWebhookHoldsAtStart() async throws -> Int
}

/// Apps an operator paused by hand; each change writes its event (`app.paused`, `app.resumed`) in
/// the same transaction.
public protocol OperatorPauseRepository: OperatorPauseReading {
    /// Pauses the app (again: the newer reason); false when it was paused already.
    func pauseApp(_ pause: OperatorPause, event: NewEvent) async throws -> Bool
    /// Resumes the app; the pause it had, or nil when it was not paused (no event then).
    func resumeApp(bundleID: String, event: NewEvent) async throws -> OperatorPause?
}

/// Per-minute delivery counters (``HistoryPoint``).
public protocol HistoryRepository: Sendable {
    /// Adds the counts to what is stored for each app, minute and metric (several instances add up);
    /// an app no longer registered gets none (counted just before `isle app remove`).
    func addHistory(_ points: [HistoryPoint]) async throws
    /// The app's counters from `from` to `to`, summed per metric over buckets of `bucket` seconds
    /// (each point's `minute` is its bucket's start).
    func history(bundleID: String, from: Date, to: Date, bucket: TimeInterval) async throws -> [HistoryPoint]
}

/// What operators did in the console.
public protocol AuditRepository: Sendable {
    func appendAudit(_ entry: AuditEntry) async throws
    /// The app's newest entries older than entry `before` (all when nil), newest first.
    func auditLog(bundleID: String, before: Int64?, limit: Int) async throws -> [AuditEntry]
}

/// Idempotent answers, by app and `Idempotency-Key`.
public protocol IdempotencyRepository: Sendable {
    func idempotencyRecord(bundleID: String, key: String) async throws -> IdempotencyRecord?
}


/// The durable delivery queue, as its four kinds of consumer see it: the API queues work
/// (``JobIntake``), the engine delivers it (``JobDelivery``), operators act on it
/// (``JobOperations``), monitoring counts it (``JobCounts``). Every store offers all four through
/// ``QueueBackedStore``: ``QueueProcedure`` on the store's ``QueueDriver``.
public typealias IsleQueue = JobIntake & JobDelivery & JobOperations & JobCounts

/// What accepting requests do to the queue.
public protocol JobIntake: Sendable {
    /// Commits the jobs, the activities they start (push-to-start), and the idempotent answer in
    /// one transaction. A job due after `now` waits as `scheduled` and takes its place in its lane
    /// when it comes due.
    @discardableResult
    func enqueue(_ jobs: [NewPushJob], creating activities: [ActivityRecord], idempotency: IdempotencyRecord?, now: Date) async throws -> [Int64]
    /// The lane's waiting head may go now (e.g. the update token it waited for arrived).
    func wakeLane(activityID: String, now: Date) async throws
    /// Every waiting head of the app may go now (an operator resumed the app after a fix).
    func wakeApp(bundleID: String, now: Date) async throws
}

/// What the delivery engine does with the queue.
public protocol JobDelivery: Sendable {
    /// Claims due lane heads (at most one job per lane in flight, oldest first, skipping the apps
    /// in `excludingApps`) for `lease` seconds; coalesces superseded plain updates on the way. Each
    /// job's push timestamp (strictly increasing per lane) and apns-id are fixed at its first claim
    /// and reused on retries.
    func claim(limit: Int, now: Date, lease: TimeInterval, worker: String, excludingApps: Set<String>) async throws -> [ClaimedJob]
    /// Applies a worker's verdict on a claimed job, atomically (verdicts that arrive together share
    /// a transaction). False when the claim was lost (its lease ran out and it was claimed again).
    func complete(_ completion: JobCompletion) async throws -> Bool
    /// Applies a batch of verdicts in one transaction; one answer per verdict, in order.
    func complete(_ batch: [JobCompletion]) async throws -> [Bool]
    /// Claims whose lease ended before `now` become queued again, except the jobs in `keeping`
    /// (still being worked on in this process). Returns how many.
    func requeueExpiredClaims(now: Date, keeping: Set<Int64>) async throws -> Int
    /// At a serving process's start: claims no running process can finish come back. One process
    /// serves a SQLite file, so there every claim does; on PostgreSQL other instances may be
    /// sending, so only claims whose lease ran out do.
    func requeueClaimsAtStart(now: Date) async throws -> Int
    /// Calls `wake` whenever queued work is committed by any process sharing the store, until
    /// cancelled. Stores with one process return at once (the engine wakes itself).
    func listenForWork(_ wake: @escaping @Sendable () -> Void) async
    /// The earliest time a lane head (a retry, a budget or token wait) or a scheduled job of an
    /// app not in `excludingApps` comes due — at or before `now` when one is due already but was
    /// not claimed (its lane busy in another process); nil when nothing waits.
    func nextDue(after now: Date, excludingApps: Set<String>) async throws -> Date?
}

/// What an operator does with an app's queue (the console, `/v1/jobs`).
public protocol JobOperations: Sendable {
    func job(id: Int64) async throws -> PushJob?
    /// The app's unfinished jobs (scheduled, queued — due, or waiting for a retry — and in flight),
    /// of one activity when given, soonest first, at most `limit`: the operator's view of the queue.
    func openJobs(bundleID: String, activityID: String?, limit: Int) async throws -> [PushJob]
    /// An operator cancels a job that is not in flight (scheduled or queued): it becomes `dropped`
    /// with `reason`, and its lane's next job becomes the head. Returns the job as it was; nil
    /// when there is no such job of the app or it is in flight or finished (nothing changes).
    func cancelJob(id: Int64, bundleID: String, reason: String) async throws -> PushJob?
    /// An operator sends a queued job now instead of at its retry time. False when it is not queued.
    func retryJobNow(id: Int64, bundleID: String, now: Date) async throws -> Bool
    /// The activity's jobs that were never sent — superseded by newer content, or dropped
    /// (cancelled by an operator, past their time) — newest first, at most `limit`.
    func unsentJobs(activityID: String, limit: Int) async throws -> [PushJob]
    /// The activity's jobs that failed (APNs refused them, or they could not be sent before their
    /// deadline or while the activity was unreachable), newest first, at most `limit`.
    func failedJobs(activityID: String, limit: Int) async throws -> [PushJob]
    /// The app's jobs superseded and dropped, by state, among those accepted since `since` (the
    /// ones the delivery engine never saw, which its history does not count).
    func unsentJobCounts(bundleID: String, since: Date) async throws -> [PushJobState: Int]
}

/// What monitoring reads of the queue.
public protocol JobCounts: Sendable {
    /// Every job by state (a scan of the table: for tests and tools, not for monitoring).
    func jobCounts() async throws -> [PushJobState: Int]
    /// Scheduled, queued and claimed jobs only, counted along the partial indexes of open work:
    /// its cost grows with the queue, never with the history. For `/metrics`.
    func openJobCounts() async throws -> [PushJobState: Int]
    /// A cheap round trip to the database, for `/ready`.
    func ping() async throws
}

extension IsleRegistry {
    public func withRunning<T: Sendable>(_ body: () async throws -> T) async throws -> T { try await body() }
}

extension InstallationRepository {
    // The same write without an idempotency record.
    public func modifyInstallation(bundleID: String, id: String, create: @escaping @Sendable () -> InstallationRecord,
                                   _ change: @escaping @Sendable (inout InstallationRecord) throws -> Void) async throws -> InstallationRecord {
        try await modifyInstallation(bundleID: bundleID, id: id, create: create, change, idempotency: nil)
    }
}

extension ActivityRepository {
    /// Stores that keep records in memory have nothing to save: the whole record.
    public func activityForPush(id: String) async throws -> ActivityRecord? { try await activity(id: id) }
    public func pushTargets(bundleID: String, topic: String) async throws -> [ActivityRecord] { try await activities(bundleID: bundleID, topic: topic) }
    // The same writes without an idempotency record.
    public func insertActivity(_ activity: ActivityRecord) async throws { try await insertActivity(activity, idempotency: nil) }
    public func modifyActivity(id: String, _ change: @escaping @Sendable (inout ActivityRecord) throws -> Void) async throws -> ActivityRecord? {
        try await modifyActivity(id: id, change, idempotency: nil, reportedBy: nil)
    }
    public func modifyActivity(id: String, _ change: @escaping @Sendable (inout ActivityRecord) throws -> Void,
                               idempotency: IdempotentAnswer<ActivityRecord>?) async throws -> ActivityRecord? {
        try await modifyActivity(id: id, change, idempotency: idempotency, reportedBy: nil)
    }
    public func linkStartedActivity(bundleID: String, externalKey: String, attributesType: String, installationID: String?, token: String, topics: [String]) async throws -> ActivityRecord? {
        try await linkStartedActivity(bundleID: bundleID, externalKey: externalKey, attributesType: attributesType, installationID: installationID, token: token, topics: topics, idempotency: nil)
    }
}

extension ChannelRepository {
    public func insertChannel(_ channel: ChannelRecord) async throws { try await insertChannel(channel, idempotency: nil) }
    public func deleteChannel(id: String) async throws { try await deleteChannel(id: id, idempotency: nil) }
}

extension JobDelivery {
    public func listenForWork(_ wake: @escaping @Sendable () -> Void) async {}
    public func claim(limit: Int, now: Date, lease: TimeInterval, worker: String) async throws -> [ClaimedJob] {
        try await claim(limit: limit, now: now, lease: lease, worker: worker, excludingApps: [])
    }
}

extension JobIntake {
    @discardableResult
    public func enqueue(_ jobs: [NewPushJob], idempotency: IdempotencyRecord?, now: Date) async throws -> [Int64] {
        try await enqueue(jobs, creating: [], idempotency: idempotency, now: now)
    }
}

/// A store held by one serving process.
public protocol ServingHold: Sendable {
    func release()
}

extension ActivityLifecycle {
    /// ``ActivityLifecycle/pushChangesStates`` as an SQL list (`'starting', 'active'`): the live
    /// states in the stores' set-based writes and look-ups, from the one definition.
    static let pushChangesSQL = pushChangesStates.map { "'\($0.rawValue)'" }.joined(separator: ", ")
}


extension ActivityRepository {
    /// The app's newest activities (in any state, or in `state`), newest first, at most `limit`.
    public func recentActivities(bundleID: String, state: ActivityRecordState?, limit: Int) async throws -> [ActivityRecord] {
        try await findActivities(ActivityQuery(bundleID: bundleID, states: state.map { [$0] } ?? [], limit: limit))
    }

    /// The operator's search: the app's newest activities whose external key starts with
    /// `keyPrefix`, registered on `installationID`, on an installation of `userID`, in `state`
    /// (each nil: any), newest first, at most `limit`.
    public func findActivities(bundleID: String, keyPrefix: String?, installationID: String?, userID: String?, state: ActivityRecordState?, limit: Int) async throws -> [ActivityRecord] {
        try await findActivities(ActivityQuery(bundleID: bundleID, keyPrefix: keyPrefix, installationID: installationID, userID: userID, states: state.map { [$0] } ?? [], limit: limit))
    }
}
