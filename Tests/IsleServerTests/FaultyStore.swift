import Foundation
import IsleCore
import IsleStore
import IsleDelivery
import Synchronization

/// A real store with scriptable write failures, for the paths that only show when the database
/// does not cooperate: the engine's bookkeeping retried in process, the API's 503.
final class FaultyStore: IsleStore {
    let base: any IsleStore
    /// Failures still to inject, by operation.
    let failures = Mutex<[String: Int]>([:])
    let injected = Mutex(0)

    init(_ base: any IsleStore) { self.base = base }

    func fail(_ operation: String, times: Int) { failures.withLock { $0[operation, default: 0] += times } }

    /// After the write committed: the caller gets an error although the work is done — a lost
    /// answer, as when the connection drops after the commit.
    private func checkAfter(_ operation: String) throws { try check(operation + "-after") }

    private func take(_ operation: String) -> Bool {
        let hit = failures.withLock { f -> Bool in
            guard let n = f[operation], n > 0 else { return false }
            f[operation] = n - 1
            return true
        }
        if hit { injected.withLock { $0 += 1 } }
        return hit
    }

    private func check(_ operation: String) throws {
        let fail = failures.withLock { f -> Bool in
            guard let n = f[operation], n > 0 else { return false }
            f[operation] = n - 1
            return true
        }
        if fail {
            injected.withLock { $0 += 1 }
            throw StoreError(.unavailable, "injected: the disk is full")
        }
    }

    // The faults
    func enqueue(_ jobs: [NewPushJob], creating activities: [ActivityRecord], idempotency: IdempotencyRecord?, now: Date) async throws -> [Int64] {
        try check("enqueue")
        return try await base.enqueue(jobs, creating: activities, idempotency: idempotency, now: now)
    }
    func complete(_ completion: JobCompletion) async throws -> Bool {
        try check("complete")
        return try await base.complete(completion)
    }
    func complete(_ batch: [JobCompletion]) async throws -> [Bool] {
        try check("complete")
        return try await base.complete(batch)
    }

    // Everything else as the real store does it
    func migrate() async throws { try await base.migrate() }
    func holdForServing() throws -> any ServingHold { try base.holdForServing() }
    func upsertApp(_ app: AppRecord) async throws { try await base.upsertApp(app) }
    func app(_ bundleID: String) async throws -> AppRecord? { try await base.app(bundleID) }
    func apps() async throws -> [AppRecord] { try await base.apps() }
    func appRowCounts(_ bundleID: String) async throws -> [String: Int] { try await base.appRowCounts(bundleID) }
    func removeApp(_ bundleID: String) async throws -> [String: Int]? { try await base.removeApp(bundleID) }
    func insertAPIKey(_ key: APIKeyRecord) async throws { try await base.insertAPIKey(key) }
    func apiKey(secretHash: String) async throws -> APIKeyRecord? { try await base.apiKey(secretHash: secretHash) }
    func apiKeys(bundleID: String?) async throws -> [APIKeyRecord] { try await base.apiKeys(bundleID: bundleID) }
    func revokeAPIKey(id: String, at: Date) async throws -> Bool { try await base.revokeAPIKey(id: id, at: at) }
    func upsertInstallation(_ installation: InstallationRecord) async throws { try await base.upsertInstallation(installation) }
    func modifyInstallation(bundleID: String, id: String, create: @escaping @Sendable () -> InstallationRecord,
                            _ change: @escaping @Sendable (inout InstallationRecord) throws -> Void, idempotency: IdempotentAnswer<InstallationRecord>?) async throws -> InstallationRecord {
        try check("registry")
        let written = try await base.modifyInstallation(bundleID: bundleID, id: id, create: create, change, idempotency: idempotency)
        try checkAfter("registry")
        return written
    }
    /// Answers "no such installation" while `installation-missing` faults are left: a server that
    /// answers 404 for a row it has, then 200.
    func installation(bundleID: String, id: String) async throws -> InstallationRecord? {
        if take("installation-missing") { return nil }
        return try await base.installation(bundleID: bundleID, id: id)
    }
    func installations(bundleID: String, userID: String) async throws -> [InstallationRecord] { try await base.installations(bundleID: bundleID, userID: userID) }
    // Registry writes (device reports) fail as "registry" (nothing written) or "registry-after"
    // (written, then the error: the answer is lost).
    func insertActivity(_ activity: ActivityRecord, idempotency: IdempotencyRecord?) async throws {
        try check("registry")
        try await base.insertActivity(activity, idempotency: idempotency)
        try checkAfter("registry")
    }
    func modifyActivity(id: String, _ change: @escaping @Sendable (inout ActivityRecord) throws -> Void, idempotency: IdempotentAnswer<ActivityRecord>?,
                        reportedBy: Events.Source?) async throws -> ActivityRecord? {
        try check("registry")
        let written = try await base.modifyActivity(id: id, change, idempotency: idempotency, reportedBy: reportedBy)
        try checkAfter("registry")
        return written
    }
    func linkStartedActivity(bundleID: String, externalKey: String, attributesType: String, installationID: String?, token: String, topics: [String],
                             idempotency: IdempotentAnswer<ActivityRecord>?) async throws -> ActivityRecord? {
        try await base.linkStartedActivity(bundleID: bundleID, externalKey: externalKey, attributesType: attributesType, installationID: installationID, token: token, topics: topics,
                                           idempotency: idempotency)
    }
    /// Likewise `activity-missing`.
    func activity(id: String) async throws -> ActivityRecord? {
        if take("activity-missing") { return nil }
        return try await base.activity(id: id)
    }
    func activity(bundleID: String, externalKey: String) async throws -> ActivityRecord? { try await base.activity(bundleID: bundleID, externalKey: externalKey) }
    func liveActivities(bundleID: String, externalKey: String) async throws -> [ActivityRecord] { try await base.liveActivities(bundleID: bundleID, externalKey: externalKey) }
    func activity(bundleID: String, updateToken: String) async throws -> ActivityRecord? { try await base.activity(bundleID: bundleID, updateToken: updateToken) }
    func liveActivities(bundleID: String, installationID: String) async throws -> [ActivityRecord] { try await base.liveActivities(bundleID: bundleID, installationID: installationID) }
    func liveActivityCount(bundleID: String, installationID: String) async throws -> Int { try await base.liveActivityCount(bundleID: bundleID, installationID: installationID) }
    func activities(bundleID: String, topic: String) async throws -> [ActivityRecord] { try await base.activities(bundleID: bundleID, topic: topic) }
    func recentActivities(bundleID: String, state: ActivityRecordState?, limit: Int) async throws -> [ActivityRecord] {
        try await base.recentActivities(bundleID: bundleID, state: state, limit: limit)
    }
    func insertChannel(_ channel: ChannelRecord, idempotency: IdempotencyRecord?) async throws { try await base.insertChannel(channel, idempotency: idempotency) }
    func channels(bundleID: String) async throws -> [ChannelRecord] { try await base.channels(bundleID: bundleID) }
    func channel(id: String) async throws -> ChannelRecord? { try await base.channel(id: id) }
    func deleteChannel(id: String, idempotency: IdempotencyRecord?) async throws { try await base.deleteChannel(id: id, idempotency: idempotency) }
    func deliveries(activityID: String) async throws -> [DeliveryRecord] { try await base.deliveries(activityID: activityID) }
    func delivery(apnsID: APNsID) async throws -> DeliveryRecord? { try await base.delivery(apnsID: apnsID) }
    func idempotencyRecord(bundleID: String, key: String) async throws -> IdempotencyRecord? { try await base.idempotencyRecord(bundleID: bundleID, key: key) }
    func openJobCounts() async throws -> [PushJobState: Int] { try await base.openJobCounts() }
    func ping() async throws { try await base.ping() }
    func deliveries(activityID: String, before: Int64?, limit: Int) async throws -> [DeliveryRecord] { try await base.deliveries(activityID: activityID, before: before, limit: limit) }
    func prune(now: Date, retention: Retention, limit: Int) async throws -> Int { try check("prune"); return try await base.prune(now: now, retention: retention, limit: limit) }
    func highPrioritySends(activityID: String, since: Date) async throws -> Int { try await base.highPrioritySends(activityID: activityID, since: since) }
    func claim(limit: Int, now: Date, lease: TimeInterval, worker: String, excludingApps: Set<String>) async throws -> [ClaimedJob] {
        try await base.claim(limit: limit, now: now, lease: lease, worker: worker, excludingApps: excludingApps)
    }
    func requeueExpiredClaims(now: Date, keeping: Set<Int64>) async throws -> Int { try await base.requeueExpiredClaims(now: now, keeping: keeping) }
    func requeueClaimsAtStart(now: Date) async throws -> Int { try await base.requeueClaimsAtStart(now: now) }
    func nextDue(after now: Date, excludingApps: Set<String>) async throws -> Date? { try await base.nextDue(after: now, excludingApps: excludingApps) }
    func wakeLane(activityID: String, now: Date) async throws { try await base.wakeLane(activityID: activityID, now: now) }
    func wakeApp(bundleID: String, now: Date) async throws { try await base.wakeApp(bundleID: bundleID, now: now) }
    func job(id: Int64) async throws -> PushJob? { try await base.job(id: id) }
    func jobCounts() async throws -> [PushJobState: Int] { try await base.jobCounts() }
    func openJobs(bundleID: String, activityID: String?, limit: Int) async throws -> [PushJob] { try await base.openJobs(bundleID: bundleID, activityID: activityID, limit: limit) }
    func cancelJob(id: Int64, bundleID: String, reason: String) async throws -> PushJob? { try await base.cancelJob(id: id, bundleID: bundleID, reason: reason) }
    func retryJobNow(id: Int64, bundleID: String, now: Date) async throws -> Bool { try await base.retryJobNow(id: id, bundleID: bundleID, now: now) }
    func appendAudit(_ entry: AuditEntry) async throws { try await base.appendAudit(entry) }
    func auditLog(bundleID: String, before: Int64?, limit: Int) async throws -> [AuditEntry] { try await base.auditLog(bundleID: bundleID, before: before, limit: limit) }
    func pauseApp(_ pause: OperatorPause, event: NewEvent) async throws -> Bool { try await base.pauseApp(pause, event: event) }
    func resumeApp(bundleID: String, event: NewEvent) async throws -> OperatorPause? { try await base.resumeApp(bundleID: bundleID, event: event) }
    func operatorPauses() async throws -> [OperatorPause] { try await base.operatorPauses() }
    func addHistory(_ points: [HistoryPoint]) async throws { try await base.addHistory(points) }
    func history(bundleID: String, from: Date, to: Date, bucket: TimeInterval) async throws -> [HistoryPoint] {
        try await base.history(bundleID: bundleID, from: from, to: to, bucket: bucket)
    }
    func highPrioritySends(bundleID: String, since: Date, limit: Int) async throws -> [(activityID: String, count: Int)] {
        try await base.highPrioritySends(bundleID: bundleID, since: since, limit: limit)
    }
    func findActivities(bundleID: String, keyPrefix: String?, installationID: String?, userID: String?, state: ActivityRecordState?, limit: Int) async throws -> [ActivityRecord] {
        try await base.findActivities(bundleID: bundleID, keyPrefix: keyPrefix, installationID: installationID, userID: userID, state: state, limit: limit)
    }
    // Events and webhooks pass through.
    func appendEvents(_ events: [NewEvent]) async throws { try await base.appendEvents(events) }
    func events(bundleID: String, after seq: Int64, limit: Int) async throws -> [StoredEvent] { try await base.events(bundleID: bundleID, after: seq, limit: limit) }
    func lastEventSeq(bundleID: String) async throws -> Int64 { try await base.lastEventSeq(bundleID: bundleID) }
    func insertWebhook(_ webhook: WebhookRecord) async throws { try await base.insertWebhook(webhook) }
    func webhooks(bundleID: String) async throws -> [WebhookRecord] { try await base.webhooks(bundleID: bundleID) }
    func allWebhooks() async throws -> [WebhookRecord] { try await base.allWebhooks() }
    func webhook(id: String) async throws -> WebhookRecord? { try await base.webhook(id: id) }
    func deleteWebhook(id: String) async throws -> Bool { try await base.deleteWebhook(id: id) }
    func saveWebhookProgress(_ webhook: WebhookRecord) async throws -> Bool { try await base.saveWebhookProgress(webhook) }
    func holdWebhook(id: String, worker: String, now: Date, lease: TimeInterval) async throws -> Bool {
        try await base.holdWebhook(id: id, worker: worker, now: now, lease: lease)
    }
}

extension ServerFixture {
    /// Restarts the fixture's server on a ``FaultyStore`` over its SQLite file and returns it.
    func restartOnFaultyStore() async throws -> FaultyStore {
        await kill()
        let made = Mutex<FaultyStore?>(nil)
        wrapStore.withLock { $0 = { sqlite in let s = FaultyStore(sqlite); made.withLock { $0 = s }; return s } }
        try await start()
        guard let store = made.withLock({ $0 }) else { throw StoreError(.unavailable, "the server did not open its store") }
        return store
    }
}
