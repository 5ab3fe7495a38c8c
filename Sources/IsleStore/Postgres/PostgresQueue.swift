import IsleCore
public import Foundation
public import IsleDelivery
import Logging
import PostgresNIO

// The durable queue on PostgreSQL: ``QueueProcedure`` decides, this driver moves rows. Lanes are
// kept safe across processes by advisory locks (``PostgresStore/laneLock(_:)``) and due rows are
// taken `FOR UPDATE SKIP LOCKED`. Every read and write is one statement for a whole batch, prepared
// once per connection (``PG``'s statements at the end; PreparedStatements.swift) unless it is rare.

/// One PostgreSQL transaction as the queue's procedure sees it: SQL and row mapping only.
public struct PostgresQueueTransaction: QueueTransaction {
    let conn: PostgresConnection
    let logger: Logger

    /// Text arrays carry NULL as this character (no value Isle writes contains it).
    static let none = "\u{1}"

    // MARK: Locks

    /// As ``PostgresStore/lockLanes(_:_:logger:)``, prepared.
    public func lockLanes(_ lanes: [String]) async throws {
        let keys = Array(Set(lanes.map(PostgresStore.laneLock))).sorted()
        guard !keys.isEmpty else { return }
        try await conn.rows(PG.LockLanes.self, [.ints(keys)], logger: logger)
    }

    public func tryLockLanes(_ lanes: [String]) async throws -> Set<String> {
        guard !lanes.isEmpty else { return [] }
        let keys = Array(Set(lanes.map(PostgresStore.laneLock))).sorted()
        var held = Set<Int64>()
        for r in try await conn.rows(PG.TryLockLanes.self, [.ints(keys)], logger: logger) where try r.bool("ok") {
            held.insert(try r.int("k"))
        }
        return Set(lanes.filter { held.contains(PostgresStore.laneLock($0)) })
    }

    // MARK: Reads

    public func laneWindows(_ lanes: [String], limit: Int) async throws -> [String: [LaneJob]] {
        guard !lanes.isEmpty else { return [:] }
        var windows: [String: [LaneJob]] = [:]
        for r in try await conn.rows(PG.LaneWindows.self, [.texts(Array(Set(lanes)).sorted()), .int(limit)], logger: logger) {
            windows[try r.string("lane"), default: []].append(LaneJob(
                id: try r.int("id"), isHead: try r.bool("is_head"), claimed: try r.string("state") == "claimed", supersedable: try r.bool("supersedable"),
                carriesContent: try r.bool("carries_content"), runAt: try r.date("run_at")))
        }
        return windows
    }

    public func dueHeads(now: Date, limit: Int, excludingApps: Set<String>) async throws -> [StoredJob] {
        try await conn.rows(PG.DueHeads.self, [.date(now), .texts(excludingApps.sorted()), .int(limit)], logger: logger).map(Self.stored)
    }

    public func dueScheduled(now: Date, limit: Int) async throws -> [ScheduledJob] {
        try await conn.rows(PG.DueScheduled.self, [.date(now), .int(limit)], logger: logger).map { r in
            ScheduledJob(id: try r.int("id"), lane: try r.optionalString("lane"), supersedable: try r.bool("supersedable"), carriesContent: try r.bool("carries_content"))
        }
    }

    public func jobs(ids: [Int64]) async throws -> [StoredJob] {
        guard !ids.isEmpty else { return [] }
        return try await conn.rows(PG.JobsByID.self, [.ints(ids)], logger: logger).map(Self.stored)
    }

    /// A job row; one no version of Isle wrote is kept as the reason it does not decode.
    static func stored(_ r: PGRow) throws -> StoredJob {
        let job: Result<PushJob, any Error>
        do { job = .success(try PostgresStore.job(r)) } catch let bad as BadRow { job = .failure(bad) }
        return StoredJob(id: try r.int("id"), lane: try r.optionalString("lane"), job: job, timestamp: try r.optionalInt("push_timestamp"),
                         apnsID: try r.optionalString("apns_id").flatMap { APNsID($0) }, supersedable: try r.bool("supersedable"))
    }

    public func activities(ids: [String]) async throws -> [String: ActivityRecord] {
        var out: [String: ActivityRecord] = [:]
        for r in try await conn.rows(PG.ActivitiesByID.self, [.texts(ids)], logger: logger) {
            let a = try PostgresStore.activity(r, topics: [], payloads: false)
            out[a.id] = a
        }
        return out
    }

    public func channelTimestamps(ids: [String]) async throws -> [String: Int64] {
        var out: [String: Int64] = [:]
        for r in try await conn.rows(PG.ChannelTimestamps.self, [.texts(ids)], logger: logger) {
            if let t = try r.optionalInt("last_timestamp") { out[try r.string("id")] = t }
        }
        return out
    }

    public func installations(_ keys: [InstallationKey]) async throws -> [InstallationKey: InstallationRecord] {
        var out: [InstallationKey: InstallationRecord] = [:]
        for r in try await conn.rows(PG.InstallationsByKey.self, [.texts(keys.map(\.bundleID)), .texts(keys.map(\.id))], logger: logger) {
            let i = try PostgresStore.installation(r)
            out[InstallationKey(bundleID: i.bundleID, id: i.id)] = i
        }
        return out
    }

    public func highPrioritySends(activityIDs: [String], since: Date) async throws -> [String: Int] {
        var out: [String: Int] = [:]
        for r in try await conn.rows(PG.HighPrioritySends.self, [.texts(activityIDs), .date(since)], logger: logger) {
            out[try r.string("activity_id")] = Int(try r.int("n"))
        }
        return out
    }

    // MARK: Writes

    /// A statement per 10,000 rows. Ids and lane positions are drawn in row order (`nextval` in the
    /// target list runs after the sort), so the sorted ids are the rows' ids.
    public func insertJobs(_ rows: [NewJobRow]) async throws -> [Int64] {
        var ids: [Int64] = []
        let none = Self.none
        for start in stride(from: 0, to: rows.count, by: 10_000) {
            let chunk = Array(rows[start..<min(rows.count, start + 10_000)])
            let inserted = try await conn.rows(PG.InsertJobs.self, [
                .texts(chunk.map(\.job.bundleID)), .texts(chunk.map(\.job.kind.rawValue)), .texts(chunk.map { $0.job.activityID ?? none }),
                .texts(chunk.map { $0.job.installationID ?? none }), .texts(chunk.map { $0.job.channelID ?? none }), .texts(chunk.map(\.job.apsText)),
                .bools(chunk.map(\.job.hasAlert)), .ints(chunk.map { Int64($0.job.requestedPriority?.rawValue ?? -1) }), .dates(chunk.map(\.job.runAt)),
                .dates(chunk.map(\.createdAt)), .texts(chunk.map { $0.lane ?? none }), .texts(chunk.map(\.state.rawValue)), .bools(chunk.map(\.isHead)),
                .bools(chunk.map(\.supersedable)), .bools(chunk.map(\.carriesContent)), .texts(chunk.map { $0.job.traceParent ?? none }),
                .texts(chunk.map { $0.lastError ?? none })], logger: logger)
            let sorted = try inserted.map { try $0.int("id") }.sorted()
            guard sorted.count == chunk.count else { throw StoreError(.unavailable, "PostgreSQL inserted \(sorted.count) of \(chunk.count) jobs") }
            ids += sorted
        }
        return ids
    }

    public func apply(_ w: QueueWrites) async throws -> Set<Int64> {
        let none = Self.none
        var written = Set<Int64>()
        // Activities a push-to-start creates (rare: one statement each, with its topics).
        for a in w.activities { try await PostgresStore.insertActivity(conn, a, logger: logger) }
        if !w.promoted.isEmpty {
            // Lane positions drawn in array order: `nextval` in the target list runs after the sort.
            let p = w.promoted
            try await conn.rows(PG.PromoteJobs.self, [.ints(p.map(\.id)), .texts(p.map(\.state.rawValue)), .bools(p.map(\.isHead)), .texts(p.map { $0.lastError ?? none })],
                                logger: logger)
        }
        if !w.ended.isEmpty {
            for r in try await conn.rows(PG.EndJobs.self, [.ints(w.ended.map(\.id)), .texts(w.ended.map(\.state.rawValue)), .texts(w.ended.map(\.reason))],
                                         logger: logger) { written.insert(try r.int("id")) }
        }
        if !w.heads.isEmpty {
            try await conn.rows(PG.MakeHeads.self, [.ints(w.heads)], logger: logger)
        }
        if !w.activityTimestamps.isEmpty {
            let ts = Array(w.activityTimestamps)
            try await conn.rows(PG.SetActivityTimestamps.self, [.texts(ts.map(\.key)), .ints(ts.map(\.value))], logger: logger)
        }
        if !w.channelTimestamps.isEmpty {
            let ts = Array(w.channelTimestamps)
            try await conn.rows(PG.SetChannelTimestamps.self, [.texts(ts.map(\.key)), .ints(ts.map(\.value))], logger: logger)
        }
        if !w.claims.isEmpty {
            try await conn.rows(PG.ClaimJobs.self, [.text(w.claimWorker), .date(w.claimUntil), .ints(w.claims.map(\.id)), .ints(w.claims.map(\.timestamp)),
                                                    .texts(w.claims.map(\.apnsID.text))], logger: logger)
        }
        // Completions: each written only while its claim is still the worker's (same worker, same attempt).
        func guardArgs(_ gs: [QueueWrites.Guard]) -> [PGArg] { [.ints(gs.map(\.id)), .texts(gs.map(\.worker)), .ints(gs.map { Int64($0.attempts) })] }
        if !w.finished.isEmpty {
            // An attempt without a request: status -1.
            for r in try await conn.rows(PG.FinishJobs.self, guardArgs(w.finished.map(\.claim)) + [.texts(w.finished.map(\.state.rawValue)), .texts(w.finished.map { $0.reason ?? none }),
                                                                                                   .ints(w.finished.map { Int64($0.answer?.status ?? -1) }), .texts(w.finished.map { $0.answer?.reason ?? none })],
                                         logger: logger) { written.insert(try r.int("id")) }
        }
        if !w.requeued.isEmpty {
            for r in try await conn.rows(PG.RequeueJobs.self, guardArgs(w.requeued.map(\.claim)) + [.dates(w.requeued.map(\.at)), .texts(w.requeued.map(\.reason)),
                                                                                                    .ints(w.requeued.map { Int64($0.answer?.status ?? -1) }), .texts(w.requeued.map { $0.answer?.reason ?? none })],
                                         logger: logger) { written.insert(try r.int("id")) }
        }
        if !w.deliveries.isEmpty {
            try await PostgresStore.insert(conn, w.deliveries.map { (record: $0.record, bundleID: $0.bundleID) }, logger: logger)
        }
        if !w.activityPatches.isEmpty {
            // Content, relevance and stale date of every activity in one statement; then ends, dead
            // tokens and broadcasts' patches one by one (rare), in order. Content first: an end that
            // carries the final content-state stores it, then ends the activity.
            var content: [String: ActivityPatch] = [:]
            for pw in w.activityPatches {
                guard case .activity(let id) = pw.target, pw.patch.content != nil || pw.patch.relevanceScore != nil || pw.patch.setsStaleDate else { continue }
                content[id] = pw.patch
            }
            if !content.isEmpty { try await PostgresStore.applyContent(conn, content, logger: logger) }
            for pw in w.activityPatches {
                switch pw.target {
                case .activity(let id):
                    var p = pw.patch
                    p.content = nil
                    p.relevanceScore = nil
                    p.setsStaleDate = false
                    try await PostgresStore.apply(conn, p, column: "id", id, logger: logger)
                case .channel(let id):
                    try await PostgresStore.apply(conn, pw.patch, column: "channel_id", id, logger: logger)
                }
            }
        }
        for i in w.installations { try await PostgresStore.writeInstallation(conn, i, logger: logger) }
        if !w.highPrioritySends.isEmpty {
            try await conn.rows(PG.InsertHighPrioritySends.self, [.texts(w.highPrioritySends.map(\.activityID)), .dates(w.highPrioritySends.map(\.at))], logger: logger)
        }
        if !w.highPriorityChannelSends.isEmpty {
            try await conn.rows(PG.InsertChannelHighPrioritySends.self, [.texts(w.highPriorityChannelSends.map(\.channelID)), .dates(w.highPriorityChannelSends.map(\.at))], logger: logger)
        }
        for r in w.idempotency { try await PostgresStore.insertIdempotency(conn, r, logger: logger) }
        // Last, after the activities' writes: an activity's events are inserted in the order of its writes.
        if !w.events.isEmpty { try await PostgresStore.insertEvents(conn, w.events, logger: logger) }
        if w.notify { try await conn.rows(PG.Notify.self, [.text(PostgresStore.notifyChannel)], logger: logger) }
        return written
    }
}

// MARK: The store's side

extension PostgresStore: QueueBackedStore {
    public typealias Transaction = PostgresQueueTransaction

    /// One transaction of ``transaction(_:)`` (retried when PostgreSQL breaks a deadlock).
    public func queueTransaction<T: Sendable>(_ body: @escaping @Sendable (PostgresQueueTransaction) async throws -> T) async throws -> T {
        let log = logger
        return try await transaction { conn in try await body(PostgresQueueTransaction(conn: conn, logger: log)) }
    }

    public func requeueClaims(before now: Date, keeping: Set<Int64>) async throws -> Int {
        let log = logger
        return try await transaction { conn in
            try await conn.rows(PG.RequeueClaims.self, [.date(now), .ints(keeping.sorted())], logger: log).count
        }
    }

    public func makeHeadsDue(lane: String?, bundleID: String?, now: Date) async throws {
        let log = logger
        try await transaction { conn in
            try await conn.rows(PG.MakeHeadsDue.self, [.date(now), .text(lane), .text(bundleID)], logger: log)
            try await conn.rows(PG.Notify.self, [.text(Self.notifyChannel)], logger: log)
        }
    }

    public func makeDue(jobID id: Int64, bundleID: String, now: Date) async throws -> Bool {
        let log = logger
        return try await transaction { conn in
            guard try await conn.row("SELECT id FROM jobs WHERE id = $1 AND bundle_id = $2 AND state = 'queued'", [.int(id), .text(bundleID)], logger: log) != nil else { return false }
            try await conn.rows("UPDATE jobs SET run_at = $1 WHERE id = $2 AND state = 'queued' AND run_at > $1", [.date(now), .int(id)], logger: log)
            try await conn.rows(PG.Notify.self, [.text(Self.notifyChannel)], logger: log)
            return true
        }
    }

    public func nextDue(excludingApps: Set<String>) async throws -> Date? {
        let log = logger
        return try await read { conn in
            try await conn.row(PG.NextDue.self, [.texts(excludingApps.sorted())], logger: log)?.optionalDate("t")
        }
    }
}

// MARK: Prepared statements (PreparedStatements.swift)

extension PG {
    /// Every lane's lock in one order; the same as ``PostgresStore/lockLanes(_:_:logger:)``.
    enum LockLanes: PreparedSQL {
        static let sql = "SELECT pg_advisory_xact_lock(1, k::int) FROM unnest($1::bigint[]) AS k ORDER BY k"
    }

    enum TryLockLanes: PreparedSQL {
        static let sql = "SELECT k, pg_try_advisory_xact_lock(1, k::int) AS ok FROM unnest($1::bigint[]) AS k"
    }

    enum LaneWindows: PreparedSQL {
        static let sql = """
            SELECT l.lane, o.id, o.is_head, o.state, o.supersedable, o.carries_content, o.run_at FROM unnest($1::text[]) AS l(lane)
            CROSS JOIN LATERAL (SELECT id, is_head, state, supersedable, carries_content, run_at, seq FROM jobs
                WHERE jobs.lane = l.lane AND state IN ('queued', 'claimed') ORDER BY seq LIMIT $2) AS o
            ORDER BY l.lane, o.seq
            """
    }

    enum DueHeads: PreparedSQL {
        static let sql = """
            SELECT * FROM jobs WHERE is_head AND state = 'queued' AND run_at <= $1 AND NOT (bundle_id = ANY($2::text[]))
            ORDER BY run_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED
            """
    }

    enum DueScheduled: PreparedSQL {
        static let sql = """
            SELECT id, lane, supersedable, carries_content FROM jobs WHERE state = 'scheduled' AND run_at <= $1 ORDER BY run_at, id LIMIT $2 FOR UPDATE SKIP LOCKED
            """
    }

    enum JobsByID: PreparedSQL {
        static let sql = "SELECT * FROM jobs WHERE id = ANY($1::bigint[])"
    }

    enum ActivitiesByID: PreparedSQL {
        static let sql = "SELECT * FROM activities WHERE id = ANY($1::text[])"
    }

    enum ChannelTimestamps: PreparedSQL {
        static let sql = "SELECT id, last_timestamp FROM channels WHERE id = ANY($1::text[])"
    }

    enum InstallationsByKey: PreparedSQL {
        static let sql = "SELECT i.* FROM installations AS i JOIN unnest($1::text[], $2::text[]) AS w(b, id) ON i.bundle_id = w.b AND i.id = w.id"
    }

    enum HighPrioritySends: PreparedSQL {
        static let sql = "SELECT activity_id, COUNT(*) AS n FROM high_priority_sends WHERE activity_id = ANY($1::text[]) AND at >= $2 GROUP BY activity_id"
    }

    enum InsertJobs: PreparedSQL {
        static let sql = """
            INSERT INTO jobs (id, bundle_id, kind, activity_id, installation_id, channel_id, aps, has_alert, requested_priority, run_at, state, created_at,
                lane, seq, is_head, supersedable, carries_content, trace_parent, last_error)
            SELECT nextval('jobs_id_seq'), b, k, NULLIF(a, E'\\x01'), NULLIF(i, E'\\x01'), NULLIF(c, E'\\x01'), aps, al, NULLIF(p, -1), r,
                st, cr, NULLIF(l, E'\\x01'), CASE WHEN st = 'scheduled' THEN NULL ELSE nextval('job_seq') END, h, s, cc,
                NULLIF(tp, E'\\x01'), NULLIF(e, E'\\x01')
            FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bool[], $8::bigint[], $9::timestamptz[], $10::timestamptz[],
                $11::text[], $12::text[], $13::bool[], $14::bool[], $15::bool[], $16::text[], $17::text[])
                WITH ORDINALITY AS t(b, k, a, i, c, aps, al, p, r, cr, l, st, h, s, cc, tp, e, n)
            ORDER BY n
            RETURNING id
            """
    }

    enum PromoteJobs: PreparedSQL {
        static let sql = """
            WITH t AS (SELECT id, st, h, e, nextval('job_seq') AS s
                FROM unnest($1::bigint[], $2::text[], $3::bool[], $4::text[]) WITH ORDINALITY AS x(id, st, h, e, n) ORDER BY n)
            UPDATE jobs AS j SET state = t.st, seq = t.s, is_head = t.h, last_error = NULLIF(t.e, E'\\x01') FROM t WHERE j.id = t.id
            """
    }

    enum EndJobs: PreparedSQL {
        static let sql = """
            UPDATE jobs AS j SET state = t.st, last_error = t.reason, is_head = FALSE, claimed_by = NULL, claimed_until = NULL
            FROM unnest($1::bigint[], $2::text[], $3::text[]) AS t(id, st, reason) WHERE j.id = t.id AND j.state IN ('scheduled', 'queued') RETURNING j.id
            """
    }

    enum MakeHeads: PreparedSQL {
        static let sql = "UPDATE jobs SET is_head = TRUE WHERE id = ANY($1::bigint[])"
    }

    enum SetActivityTimestamps: PreparedSQL {
        static let sql = "UPDATE activities AS a SET last_timestamp = t.ts FROM unnest($1::text[], $2::bigint[]) AS t(id, ts) WHERE a.id = t.id"
    }

    enum SetChannelTimestamps: PreparedSQL {
        static let sql = "UPDATE channels AS c SET last_timestamp = t.ts FROM unnest($1::text[], $2::bigint[]) AS t(id, ts) WHERE c.id = t.id"
    }

    enum ClaimJobs: PreparedSQL {
        static let sql = """
            UPDATE jobs AS j SET state = 'claimed', claimed_by = $1, claimed_until = $2, attempts = j.attempts + 1, push_timestamp = t.ts, apns_id = t.apns
            FROM unnest($3::bigint[], $4::bigint[], $5::text[]) AS t(id, ts, apns) WHERE j.id = t.id
            """
    }

    enum FinishJobs: PreparedSQL {
        static let sql = """
            UPDATE jobs AS j SET state = t.state, last_error = NULLIF(t.reason, E'\\x01'), claimed_by = NULL, claimed_until = NULL, is_head = FALSE,
                apns_requests = j.apns_requests + (t.status >= 0)::int, last_status = CASE WHEN t.status >= 0 THEN t.status ELSE j.last_status END,
                last_apns_reason = CASE WHEN t.status >= 0 THEN NULLIF(t.apns_reason, E'\\x01') ELSE j.last_apns_reason END
            FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::bigint[], $7::text[]) AS t(id, worker, attempts, state, reason, status, apns_reason)
            WHERE j.id = t.id AND j.state = 'claimed' AND j.claimed_by = t.worker AND j.attempts = t.attempts RETURNING j.id
            """
    }

    enum RequeueJobs: PreparedSQL {
        static let sql = """
            UPDATE jobs AS j SET state = 'queued', run_at = t.at, last_error = t.reason, claimed_by = NULL, claimed_until = NULL,
                apns_requests = j.apns_requests + (t.status >= 0)::int, last_status = CASE WHEN t.status >= 0 THEN t.status ELSE j.last_status END,
                last_apns_reason = CASE WHEN t.status >= 0 THEN NULLIF(t.apns_reason, E'\\x01') ELSE j.last_apns_reason END
            FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::timestamptz[], $5::text[], $6::bigint[], $7::text[]) AS t(id, worker, attempts, at, reason, status, apns_reason)
            WHERE j.id = t.id AND j.state = 'claimed' AND j.claimed_by = t.worker AND j.attempts = t.attempts RETURNING j.id
            """
    }

    enum InsertHighPrioritySends: PreparedSQL {
        static let sql = "INSERT INTO high_priority_sends (activity_id, at) SELECT * FROM unnest($1::text[], $2::timestamptz[])"
    }

    /// A priority-10 broadcast counts for each installation with an unended activity on its channel.
    enum InsertChannelHighPrioritySends: PreparedSQL {
        static let sql = """
            INSERT INTO high_priority_sends (activity_id, at) SELECT DISTINCT 'inst:' || a.bundle_id || '/' || a.installation_id, t.at
            FROM unnest($1::text[], $2::timestamptz[]) AS t(channel, at) JOIN activities a ON a.channel_id = t.channel
            WHERE a.installation_id IS NOT NULL AND a.state IN ('active', 'starting')
            """
    }

    enum Notify: PreparedSQL {
        static let sql = "SELECT pg_notify($1, '')"
    }

    enum RequeueClaims: PreparedSQL {
        static let sql = """
            UPDATE jobs SET state = 'queued', claimed_by = NULL, claimed_until = NULL
            WHERE state = 'claimed' AND claimed_until < $1 AND NOT (id = ANY($2::bigint[])) RETURNING id
            """
    }

    enum MakeHeadsDue: PreparedSQL {
        static let sql = """
            UPDATE jobs SET run_at = $1 WHERE is_head AND state = 'queued' AND run_at > $1 AND ($2::text IS NULL OR lane = $2) AND ($3::text IS NULL OR bundle_id = $3)
            """
    }

    enum NextDue: PreparedSQL {
        static let sql = """
            SELECT MIN(t) AS t FROM (SELECT MIN(run_at) AS t FROM jobs WHERE is_head AND state = 'queued' AND NOT (bundle_id = ANY($1::text[]))
                UNION ALL SELECT MIN(run_at) FROM jobs WHERE state = 'scheduled' AND NOT (bundle_id = ANY($1::text[]))) AS due
            """
    }
}
