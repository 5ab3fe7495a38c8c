public import Foundation
public import IsleDelivery

/// A database's side of the queue: transactions in which ``QueueProcedure`` runs, and the few
/// statements that stand alone (a sweep, a wake-up). SQL and row mapping only; every decision is
/// the procedure's. (The reads of ``IsleQueue`` — a job, open jobs, counts — are plain SQL too.)
public protocol QueueDriver: Sendable {
    associatedtype Transaction: QueueTransaction
    /// Runs `body` in one transaction (committed when it returns, rolled back when it throws).
    func queueTransaction<T: Sendable>(_ body: @escaping @Sendable (Transaction) async throws -> T) async throws -> T
    /// Claims whose lease ended before `before` become queued again (still their lanes' heads),
    /// except the jobs in `keeping`. Answers how many.
    func requeueClaims(before: Date, keeping: Set<Int64>) async throws -> Int
    /// Lane heads waiting for a later time may go now: of one lane, or of one app.
    func makeHeadsDue(lane: String?, bundleID: String?, now: Date) async throws
    /// The queued job of the app goes now; false when it is not queued.
    func makeDue(jobID: Int64, bundleID: String, now: Date) async throws -> Bool
    /// The earliest `run_at` of a lane head or a scheduled job of an app not in `excludingApps`.
    func nextDue(excludingApps: Set<String>) async throws -> Date?
}

/// Requests and completions waiting for the next transaction: accepting requests are
/// group-committed (one transaction, one run of the procedure, for every request that arrives
/// while another batch commits) and so are workers' completions.
public final class QueueBatches: Sendable {
    let enqueues = Batcher<QueueProcedure.EnqueueRequest, [Int64]>(maximumBatch: 256)
    let completions = Batcher<JobCompletion, Bool>(maximumBatch: 256)
    public init() {}
}

/// A store whose ``IsleQueue`` is ``QueueProcedure`` run on its own ``QueueDriver``: the queue
/// written once, for every store.
public protocol QueueBackedStore: IsleQueue, QueueDriver {
    var batches: QueueBatches { get }
    /// The store's failpoints (tests only): ``StoreFaults/Point/enqueue`` and ``StoreFaults/Point/complete``.
    var faults: StoreFaults { get }
}

extension QueueBackedStore {
    @discardableResult
    public func enqueue(_ jobs: [NewPushJob], creating activities: [ActivityRecord], idempotency: IdempotencyRecord?, now: Date) async throws -> [Int64] {
        try faults.check(.enqueue)
        return try await batches.enqueues.submit(.init(jobs: jobs, activities: activities, idempotency: idempotency, now: now)) { batch in
            try await Self.each(batch) { part in try await self.queueTransaction { tx in try await QueueProcedure.enqueue(tx, part) } }
        }
    }

    public func claim(limit: Int, now: Date, lease: TimeInterval, worker: String, excludingApps: Set<String>) async throws -> [ClaimedJob] {
        guard limit > 0 else { return [] }
        return try await queueTransaction { tx in
            try await QueueProcedure.claim(tx, limit: limit, now: now, lease: lease, worker: worker, excludingApps: excludingApps)
        }
    }

    public func complete(_ completion: JobCompletion) async throws -> Bool {
        try faults.check(.complete)
        return try await batches.completions.submit(completion) { batch in try await self.completeEach(batch) }
    }

    /// Several completions in one transaction (the engine's batch); one result per completion.
    public func complete(_ batch: [JobCompletion]) async throws -> [Bool] {
        try faults.check(.complete)
        return try await completeEach(batch).map { try $0.get() }
    }

    func completeEach(_ batch: [JobCompletion]) async throws -> [Result<Bool, any Error>] {
        try await Self.each(batch) { part in try await self.queueTransaction { tx in try await QueueProcedure.complete(tx, part) } }
    }

    public func cancelJob(id: Int64, bundleID: String, reason: String) async throws -> PushJob? {
        try await queueTransaction { tx in try await QueueProcedure.cancel(tx, id: id, bundleID: bundleID, reason: reason) }
    }

    public func requeueExpiredClaims(now: Date, keeping: Set<Int64>) async throws -> Int { try await requeueClaims(before: now, keeping: keeping) }
    public func nextDue(after now: Date, excludingApps: Set<String>) async throws -> Date? { try await nextDue(excludingApps: excludingApps) }
    public func wakeLane(activityID: String, now: Date) async throws {
        try await makeHeadsDue(lane: LanePlanner.lane(kind: .update, activityID: activityID, channelID: nil), bundleID: nil, now: now)
    }
    public func wakeApp(bundleID: String, now: Date) async throws { try await makeHeadsDue(lane: nil, bundleID: bundleID, now: now) }
    public func retryJobNow(id: Int64, bundleID: String, now: Date) async throws -> Bool { try await makeDue(jobID: id, bundleID: bundleID, now: now) }

    /// Runs a batch in one transaction; when it fails as a whole for a reason other than the
    /// database being away (an idempotency key or an external key taken by one request), each
    /// item runs alone, so one refused item fails only itself.
    static func each<Item: Sendable, Output: Sendable>(_ batch: [Item], _ run: @Sendable ([Item]) async throws -> [Output]) async throws -> [Result<Output, any Error>] {
        do {
            return try await run(batch).map { .success($0) }
        } catch let e as StoreError where e.code == .unavailable {
            throw e
        } catch where batch.count > 1 {
            var out: [Result<Output, any Error>] = []
            for item in batch {
                do { out.append(.success(try await run([item])[0])) } catch { out.append(.failure(error)) }
            }
            return out
        }
    }
}
