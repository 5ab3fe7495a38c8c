public import Foundation
public import IsleCore

/// Everything the server keeps. Implementations: ``SQLiteStore`` (one file, the default);
/// PostgreSQL comes next, behind the same protocol and the same contract tests.
///
/// The queue is durable by construction: ``enqueue(_:idempotency:)`` commits before the API
/// answers; ``claim(limit:now:lease:worker:)`` hands each due job to one worker (a single-writer
/// `UPDATE … RETURNING` here; `FOR UPDATE SKIP LOCKED` on PostgreSQL), one job per activity at a
/// time and in order; a claim whose lease runs out (a crashed worker) is claimed again.
public protocol IsleStore: Sendable {
    func migrate() async throws

    // Apps and keys
    func upsertApp(_ app: AppRecord) async throws
    func app(_ bundleID: String) async throws -> AppRecord?
    func apps() async throws -> [AppRecord]
    func insertAPIKey(_ key: APIKeyRecord) async throws
    func apiKey(secretHash: String) async throws -> APIKeyRecord?
    func revokeAPIKey(id: String, at: Date) async throws -> Bool

    // Installations
    func upsertInstallation(_ installation: InstallationRecord) async throws
    func installation(id: String) async throws -> InstallationRecord?
    func installations(bundleID: String, userID: String) async throws -> [InstallationRecord]

    // Activities
    func insertActivity(_ activity: ActivityRecord) async throws
    func updateActivity(_ activity: ActivityRecord) async throws
    func activity(id: String) async throws -> ActivityRecord?
    /// The newest activity with this backend key.
    func activity(bundleID: String, externalKey: String) async throws -> ActivityRecord?
    func activity(updateToken: String) async throws -> ActivityRecord?
    /// Live activities following a topic.
    func activities(bundleID: String, topic: String) async throws -> [ActivityRecord]

    // Queue
    /// Commits the jobs (and the idempotent answer, if any) in one transaction.
    @discardableResult
    func enqueue(_ jobs: [NewPushJob], idempotency: IdempotencyRecord?) async throws -> [Int64]
    /// Claims due jobs for `lease` seconds, atomically (as `FOR UPDATE SKIP LOCKED` would): at most
    /// one job per activity and per broadcast channel at a time, oldest first; a plain update
    /// superseded by newer content already due is marked superseded instead; each job's push
    /// timestamp (strictly increasing per activity and per channel) and apns-id are fixed at its
    /// first claim and reused on retries.
    func claim(limit: Int, now: Date, lease: TimeInterval, worker: String) async throws -> [ClaimedJob]
    /// Finishes a claimed job: its new state, the attempt, and the activity's new record, atomically.
    /// Returns false when the claim was lost (the lease ran out and another worker took it).
    func finish(_ job: ClaimedJob, state: PushJobState, error: String?, delivery: DeliveryRecord?, activity: ActivityRecord?, highPriorityAt: Date?) async throws -> Bool
    /// Puts a claimed job back for a retry at `runAt`.
    func retry(_ job: ClaimedJob, runAt: Date, error: String, delivery: DeliveryRecord?) async throws -> Bool
    /// Claims whose lease ended before `now` become queued again (a worker died). Returns how many.
    func requeueExpiredClaims(now: Date) async throws -> Int
    func job(id: Int64) async throws -> PushJob?
    func jobCounts() async throws -> [PushJobState: Int]
    /// Priority-10 sends to an activity since a time (the hourly budget).
    func highPrioritySends(activityID: String, since: Date) async throws -> Int

    // Channels
    func insertChannel(_ channel: ChannelRecord) async throws
    func channels(bundleID: String) async throws -> [ChannelRecord]
    func channel(id: String) async throws -> ChannelRecord?
    func deleteChannel(id: String) async throws

    // Reads
    func deliveries(activityID: String) async throws -> [DeliveryRecord]
    func delivery(apnsID: String) async throws -> DeliveryRecord?
    func idempotencyRecord(bundleID: String, key: String) async throws -> IdempotencyRecord?
    func saveIdempotencyRecord(_ record: IdempotencyRecord) async throws
}

/// A job handed to a worker, with the `timestamp` and `apns-id` fixed at its first claim (a retry
/// after a crash sends the very same push, so the device can tell it is a duplicate).
public struct ClaimedJob: Sendable, Hashable {
    public var job: PushJob
    public var timestamp: Int64
    public var apnsID: String
    public var worker: String
    /// The activity as it was when claimed (nil for installation jobs).
    public var activity: ActivityRecord?
}
