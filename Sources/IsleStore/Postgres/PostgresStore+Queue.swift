public import Foundation
import IsleCore
public import IsleDelivery
import Logging
import PostgresNIO

// The queue's reads and the SQL its driver shares (PostgresQueue.swift): a job row, an activity
// patch, delivery records.
extension PostgresStore {
    /// A job row; throws ``BadRow`` for a row no version of Isle wrote.
    static func job(_ r: PGRow) throws -> PushJob {
        let id = try r.int("id")
        let row = String(id)
        let aps = try r.string("aps")
        let kind = try BadRow.decode(try r.string("kind"), as: PushJobKind.self, table: "jobs", id: row, column: "kind")
        let createdAt = try r.date("created_at")
        var job = PushJob(id: id, bundleID: try r.string("bundle_id"), kind: kind,
                activityID: try r.optionalString("activity_id"),
                installationID: try r.optionalString("installation_id"), channelID: try r.optionalString("channel_id"),
                payload: try BadRow.payload(aps, kind: kind, acceptedAt: createdAt, id: row), encodedAPS: Array(aps.utf8),
                requestedPriority: try BadRow.decode(try r.optionalInt("requested_priority").map(Int.init), as: PushPriority.self, table: "jobs", id: row, column: "requested_priority"), runAt: try r.date("run_at"),
                state: try BadRow.decode(try r.string("state"), as: PushJobState.self, table: "jobs", id: row, column: "state"), attempts: Int(try r.int("attempts")), claimedBy: try r.optionalString("claimed_by"),
                claimedUntil: try r.optionalDate("claimed_until"), lastError: try r.optionalString("last_error"), createdAt: createdAt,
                lane: try r.optionalString("lane"), seq: try r.optionalInt("seq"))
        job.traceParent = try r.optionalString("trace_parent")
        job.apnsRequests = Int(try r.optionalInt("apns_requests") ?? 0)
        job.lastAnswer = try r.optionalInt("last_status").map { APNsAnswer(status: Int($0), reason: try r.optionalString("last_apns_reason")) }
        return job
    }

    /// Content, relevance and stale date of many activities in one statement (never of one that
    /// ended or was dismissed meanwhile).
    static func applyContent(_ conn: PostgresConnection, _ patches: [String: ActivityPatch], logger: Logger) async throws {
        let ids = Array(patches.keys)
        let ps = ids.map { patches[$0]! }
        try await conn.rows(PG.ApplyContent.self, [
            .texts(ids), .texts(ps.map { $0.content?.jsonString ?? "\u{1}" }), .bools(ps.map { $0.relevanceScore != nil }), .doubles(ps.map { $0.relevanceScore ?? 0 }),
            .bools(ps.map(\.setsStaleDate)), .bools(ps.map { $0.staleDate != nil }), .dates(ps.map { $0.staleDate ?? Date(timeIntervalSince1970: 0) })], logger: logger)
    }

    /// Writes only what the push changed; never reverts what the device reported since.
    static func apply(_ conn: PostgresConnection, _ p: ActivityPatch, column: String, _ id: String, logger: Logger) async throws {
        if p.content != nil || p.relevanceScore != nil || p.setsStaleDate {
            try await conn.rows("""
                UPDATE activities SET content = COALESCE($1, content), relevance_score = COALESCE($2, relevance_score),
                    stale_date = CASE WHEN $3 THEN $4 ELSE stale_date END
                WHERE \(column) = $5 AND state IN (\(ActivityLifecycle.pushChangesSQL))
                """, [.json(p.content?.jsonString), .double(p.relevanceScore), .bool(p.setsStaleDate), .date(p.staleDate), .text(id)], logger: logger)
        }
        if let e = p.end {
            try await conn.rows("""
                UPDATE activities SET state = 'ended', ended_at = COALESCE(ended_at, $1), dismissed_at = COALESCE($2, dismissed_at), state_reason = COALESCE($3, state_reason)
                WHERE \(column) = $4 AND state IN (\(ActivityLifecycle.pushChangesSQL))
                """, [.date(e.at), .date(e.dismissAt), .text(e.reason), .text(id)], logger: logger)
        }
        if let u = p.unreachable {
            try await conn.rows("""
                UPDATE activities SET state = 'unreachable', state_reason = $1 WHERE \(column) = $2 AND state IN (\(ActivityLifecycle.pushChangesSQL)) AND ($3::text IS NULL OR update_token = $3)
                """, [.text(u.reason), .text(id), .text(u.ifToken)], logger: logger)
        }
    }

    /// Delivery records in one statement, in order.
    static func insert(_ conn: PostgresConnection, _ records: [(record: DeliveryRecord, bundleID: String)], logger: Logger) async throws {
        let none = "\u{1}"
        let ds = records.map(\.record)
        try await conn.rows(PG.InsertDeliveries.self, [
            .ints(ds.map(\.jobID)), .texts(ds.map { $0.activityID ?? none }), .texts(ds.map { $0.apnsID?.text ?? none }), .texts(ds.map { $0.apnsUniqueID ?? none }),
            .ints(ds.map { Int64($0.status) }), .texts(ds.map { $0.reason ?? none }), .doubles(ds.map(\.latencyMS)), .ints(ds.map { Int64($0.priority.rawValue) }),
            .bools(ds.map(\.downgraded)), .dates(ds.map(\.at)), .texts(records.map(\.bundleID)), .texts(ds.map { $0.deviceNote ?? none })], logger: logger)
    }

    /// Other processes may be sending right now: at start only claims whose lease ran out come back.
    public func requeueClaimsAtStart(now: Date) async throws -> Int {
        try await requeueClaims(before: now, keeping: [])
    }

    public func openJobs(bundleID: String, activityID: String?, limit: Int) async throws -> [PushJob] {
        let log = logger
        return try await read { conn in
            try await conn.rows("""
                SELECT * FROM jobs WHERE bundle_id = $1 AND ($2::text IS NULL OR activity_id = $2) AND state IN ('scheduled', 'queued', 'claimed') ORDER BY run_at, id LIMIT $3
                """, [.text(bundleID), .text(activityID), .int(max(0, limit))], logger: log).map(Self.job)
        }
    }

    public func job(id: Int64) async throws -> PushJob? {
        let log = logger
        return try await read { conn in try await conn.row("SELECT * FROM jobs WHERE id = $1", [.int(id)], logger: log).map(Self.job) }
    }

    public func failedJobs(activityID: String, limit: Int) async throws -> [PushJob] {
        let log = logger
        return try await read { conn in
            try await conn.rows("""
                SELECT * FROM jobs WHERE activity_id = $1 AND state = 'failed' ORDER BY created_at DESC, id DESC LIMIT $2
                """, [.text(activityID), .int(max(0, limit))], logger: log).map(Self.job)
        }
    }

    public func unsentJobs(activityID: String, limit: Int) async throws -> [PushJob] {
        let log = logger
        return try await read { conn in
            try await conn.rows("""
                SELECT * FROM jobs WHERE activity_id = $1 AND state IN ('superseded', 'dropped') ORDER BY created_at DESC, id DESC LIMIT $2
                """, [.text(activityID), .int(max(0, limit))], logger: log).map(Self.job)
        }
    }

    public func unsentJobCounts(bundleID: String, since: Date) async throws -> [PushJobState: Int] {
        let log = logger
        return try await read { conn in
            var counts: [PushJobState: Int] = [:]
            for row in try await conn.rows("""
                SELECT state, COUNT(*) AS n FROM jobs WHERE state IN ('superseded', 'dropped') AND created_at >= $1 AND bundle_id = $2 GROUP BY state
                """, [.date(since), .text(bundleID)], logger: log) {
                if let state = PushJobState(rawValue: try row.string("state")) { counts[state] = Int(try row.int("n")) }
            }
            return counts
        }
    }

    public func openJobCounts() async throws -> [PushJobState: Int] {
        let log = logger
        return try await read { conn in
            let scheduled = try await conn.row("SELECT COUNT(*) AS n FROM jobs WHERE state = 'scheduled'", logger: log)?.int("n") ?? 0
            let queued = try await conn.row("SELECT COUNT(*) AS n FROM jobs WHERE state = 'queued'", logger: log)?.int("n") ?? 0
            let claimed = try await conn.row("SELECT COUNT(*) AS n FROM jobs WHERE state = 'claimed'", logger: log)?.int("n") ?? 0
            return [.scheduled: Int(scheduled), .queued: Int(queued), .claimed: Int(claimed)]
        }
    }

    public func jobCounts() async throws -> [PushJobState: Int] {
        let log = logger
        return try await read { conn in
            var out: [PushJobState: Int] = [:]
            for r in try await conn.rows("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state", logger: log) {
                let n = Int(try r.int("n"))
                // A state no version of Isle writes is an error naming it, not a row left out of the count.
                out[try BadRow.decode(try r.string("state"), as: PushJobState.self, table: "jobs", id: "\(n) rows", column: "state")] = n
            }
            return out
        }
    }
}

// MARK: Prepared statements (PreparedStatements.swift)

extension PG {
    enum ApplyContent: PreparedSQL {
        static let sql = """
            UPDATE activities AS a SET content = COALESCE(NULLIF(t.content, E'\\x01')::jsonb, a.content),
                relevance_score = CASE WHEN t.has_relevance THEN t.relevance ELSE a.relevance_score END,
                stale_date = CASE WHEN NOT t.sets_stale THEN a.stale_date WHEN t.has_stale THEN t.stale ELSE NULL END
            FROM unnest($1::text[], $2::text[], $3::bool[], $4::float8[], $5::bool[], $6::bool[], $7::timestamptz[])
                AS t(id, content, has_relevance, relevance, sets_stale, has_stale, stale)
            WHERE a.id = t.id AND a.state IN (\(ActivityLifecycle.pushChangesSQL))
            """
    }

    enum InsertDeliveries: PreparedSQL {
        static let sql = """
            INSERT INTO deliveries (job_id, activity_id, apns_id, apns_unique_id, status, reason, latency_ms, priority, downgraded, at, bundle_id, device_note)
            SELECT j, NULLIF(a, E'\\x01'), NULLIF(i, E'\\x01'), NULLIF(u, E'\\x01'), s, NULLIF(r, E'\\x01'), l, p, d, t, b, NULLIF(o, E'\\x01')
            FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::float8[], $8::bigint[], $9::bool[], $10::timestamptz[], $11::text[], $12::text[])
                WITH ORDINALITY AS x(j, a, i, u, s, r, l, p, d, t, b, o, n)
            ORDER BY n
            """
    }
}
