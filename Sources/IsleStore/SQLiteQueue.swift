public import Foundation
import GRDB
import IsleCore
public import IsleDelivery

// The durable queue on SQLite: ``QueueProcedure`` on this driver. One process writes the file, so
// every lane is held already (no locks); sets of rows travel as one JSON argument (`json_each`) or
// one multi-row `VALUES`, so each part of a batch is one statement.

extension SQLiteStore: QueueBackedStore {
    public func queueTransaction<T: Sendable>(_ body: @escaping @Sendable (SQLiteQueueTransaction) async throws -> T) async throws -> T {
        try await writer.transaction { w in try await body(SQLiteQueueTransaction(writer: w)) }
    }

    public func requeueClaims(before: Date, keeping: Set<Int64>) async throws -> Int {
        try await writer.write { db in
            try db.cachedStatement(sql: """
                UPDATE jobs SET state = 'queued', claimed_by = NULL, claimed_until = NULL
                WHERE id IN (SELECT id FROM jobs INDEXED BY jobs_claimed WHERE state = 'claimed' AND claimed_until < ?) AND id NOT IN (SELECT value FROM json_each(?))
                """).execute(arguments: [before.timeIntervalSince1970, SQLiteQueueTransaction.list(keeping.sorted().map { .int($0) })])
            return db.changesCount
        }
    }

    /// One process serves the file: every claim left belongs to a process that is gone.
    public func requeueClaimsAtStart(now: Date) async throws -> Int {
        try await requeueClaims(before: .distantFuture, keeping: [])
    }

    public func makeHeadsDue(lane: String?, bundleID: String?, now: Date) async throws {
        try await writer.write { db in
            let t = now.timeIntervalSince1970
            try db.cachedStatement(sql: """
                UPDATE jobs SET run_at = ? WHERE is_head = 1 AND state = 'queued' AND run_at > ? AND (? IS NULL OR lane = ?) AND (? IS NULL OR bundle_id = ?)
                """).execute(arguments: [t, t, lane, lane, bundleID, bundleID])
        }
    }

    public func makeDue(jobID: Int64, bundleID: String, now: Date) async throws -> Bool {
        try await writer.write { db in
            try db.execute(sql: "UPDATE jobs SET run_at = ? WHERE id = ? AND bundle_id = ? AND state = 'queued' AND run_at > ?",
                           arguments: [now.timeIntervalSince1970, jobID, bundleID, now.timeIntervalSince1970])
            if db.changesCount > 0 { return true }
            return try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM jobs WHERE id = ? AND bundle_id = ? AND state = 'queued'", arguments: [jobID, bundleID]) == 1
        }
    }

    public func nextDue(excludingApps: Set<String>) async throws -> Date? {
        try readNow { db in
            let apps = SQLiteQueueTransaction.list(excludingApps.sorted().map { .string($0) })
            let earliest = try Double.fetchOne(db.cachedStatement(sql: """
                SELECT MIN(t) FROM (SELECT MIN(run_at) AS t FROM jobs INDEXED BY jobs_ready WHERE is_head = 1 AND state = 'queued' AND bundle_id NOT IN (SELECT value FROM json_each(?1))
                    UNION ALL SELECT MIN(run_at) FROM jobs INDEXED BY jobs_scheduled WHERE state = 'scheduled' AND bundle_id NOT IN (SELECT value FROM json_each(?1)))
                """), arguments: [apps])
            return earliest.map { Date(timeIntervalSince1970: $0) }
        }
    }
}

/// ``QueueTransaction`` on the writer connection, inside the transaction ``GroupCommit`` opened.
public struct SQLiteQueueTransaction: QueueTransaction {
    let writer: SQLiteWriter

    /// Each row of the statement, read from its cursor: a cursor's row finds a column by name in
    /// the statement's own index, where a copied row (`Row.fetchAll`) compares lowercased names
    /// for every column it reads.
    static func each(_ statement: Statement, arguments: StatementArguments, _ body: (Row) throws -> Void) throws {
        let cursor = try Row.fetchCursor(statement, arguments: arguments)
        while let row = try cursor.next() { try body(row) }
    }

    static func map<T>(_ statement: Statement, arguments: StatementArguments, _ transform: (Row) throws -> T) throws -> [T] {
        var out: [T] = []
        try each(statement, arguments: arguments) { out.append(try transform($0)) }
        return out
    }

    /// A JSON array argument for `json_each`.
    static func list(_ values: [JSONValue]) -> String { JSONValue.array(values).jsonString }

    static func text(_ s: String?) -> JSONValue { s.map(JSONValue.string) ?? .null }
    static func number(_ d: Double?) -> JSONValue { d.map(JSONValue.double) ?? .null }
    /// An attempt's APNs answer as two list elements: status (null: no request made) and reason.
    static func answer(_ a: APNsAnswer?) -> [JSONValue] { [a.map { .int(Int64($0.status)) } ?? .null, text(a?.reason)] }

    public func lockLanes(_ lanes: [String]) async throws {}

    public func tryLockLanes(_ lanes: [String]) async throws -> Set<String> { Set(lanes) }

    public func laneWindows(_ lanes: [String], limit: Int) async throws -> [String: [LaneJob]] {
        try writer.run { db in
            var out: [String: [LaneJob]] = [:]
            try Self.each(db.cachedStatement(sql: """
                SELECT l.value AS lane, j.id, j.is_head, j.state, j.supersedable, j.carries_content, j.run_at FROM json_each(?) AS l, jobs AS j
                WHERE j.id IN (SELECT id FROM jobs INDEXED BY jobs_lane_open WHERE lane = l.value AND state IN ('queued', 'claimed') ORDER BY seq LIMIT ?)
                ORDER BY l.key, j.seq
                """), arguments: [Self.list(lanes.map { .string($0) }), limit]) { r in
                out[r["lane"], default: []].append(LaneJob(id: r["id"], isHead: r["is_head"], claimed: (r["state"] as String) == "claimed", supersedable: r["supersedable"],
                                                          carriesContent: r["carries_content"], runAt: Date(timeIntervalSince1970: r["run_at"])))
            }
            return out
        }
    }

    static func stored(_ r: Row) -> StoredJob {
        let job: Result<PushJob, any Error>
        do { job = .success(try SQLiteStore.job(r)) } catch let bad as BadRow { job = .failure(bad) } catch {
            job = .failure(BadRow(table: "jobs", id: "\(r["id"] as Int64)", column: "?", found: "\(error)"))
        }
        return StoredJob(id: r["id"], lane: r["lane"], job: job, timestamp: r["push_timestamp"], apnsID: (r["apns_id"] as String?).flatMap { APNsID($0) }, supersedable: r["supersedable"])
    }

    public func dueHeads(now: Date, limit: Int, excludingApps: Set<String>) async throws -> [StoredJob] {
        try writer.run { db in
            // INDEXED BY: without statistics SQLite may pick another index and scan every queued row;
            // the partial index holds only lane heads, already in claim order.
            try Self.map(db.cachedStatement(sql: """
                SELECT * FROM jobs INDEXED BY jobs_ready WHERE is_head = 1 AND state = 'queued' AND run_at <= ? AND bundle_id NOT IN (SELECT value FROM json_each(?))
                ORDER BY run_at, seq LIMIT ?
                """), arguments: [now.timeIntervalSince1970, Self.list(excludingApps.sorted().map { .string($0) }), limit], Self.stored)
        }
    }

    public func dueScheduled(now: Date, limit: Int) async throws -> [ScheduledJob] {
        try writer.run { db in
            try Row.fetchAll(db.cachedStatement(sql: """
                SELECT id, lane, supersedable, carries_content FROM jobs INDEXED BY jobs_scheduled WHERE state = 'scheduled' AND run_at <= ? ORDER BY run_at, id LIMIT ?
                """), arguments: [now.timeIntervalSince1970, limit]).map {
                ScheduledJob(id: $0["id"], lane: $0["lane"], supersedable: $0["supersedable"], carriesContent: $0["carries_content"])
            }
        }
    }

    public func jobs(ids: [Int64]) async throws -> [StoredJob] {
        try writer.run { db in
            try Self.map(db.cachedStatement(sql: "SELECT * FROM jobs WHERE id IN (SELECT value FROM json_each(?))"), arguments: [Self.list(ids.map { .int($0) })], Self.stored)
        }
    }

    public func activities(ids: [String]) async throws -> [String: ActivityRecord] {
        try writer.run { db in
            var out: [String: ActivityRecord] = [:]
            try Self.each(db.cachedStatement(sql: "SELECT * FROM activities WHERE id IN (SELECT value FROM json_each(?))"), arguments: [Self.list(ids.map { .string($0) })]) { r in
                let a = try SQLiteStore.activity(r, topics: [], payloads: false)
                out[a.id] = a
            }
            return out
        }
    }

    public func channelTimestamps(ids: [String]) async throws -> [String: Int64] {
        try writer.run { db in
            var out: [String: Int64] = [:]
            try Self.each(db.cachedStatement(sql: "SELECT id, last_timestamp FROM channels WHERE id IN (SELECT value FROM json_each(?)) AND last_timestamp IS NOT NULL"),
                                      arguments: [Self.list(ids.map { .string($0) })]) { r in
                out[r["id"]] = r["last_timestamp"]
            }
            return out
        }
    }

    public func installations(_ keys: [InstallationKey]) async throws -> [InstallationKey: InstallationRecord] {
        try writer.run { db in
            var out: [InstallationKey: InstallationRecord] = [:]
            try Self.each(db.cachedStatement(sql: """
                SELECT * FROM installations WHERE (bundle_id, id) IN (SELECT value ->> 0, value ->> 1 FROM json_each(?))
                """), arguments: [Self.list(keys.map { .array([.string($0.bundleID), .string($0.id)]) })]) { r in
                let i = try SQLiteStore.installation(r)
                out[InstallationKey(bundleID: i.bundleID, id: i.id)] = i
            }
            return out
        }
    }

    public func highPrioritySends(activityIDs: [String], since: Date) async throws -> [String: Int] {
        try writer.run { db in
            var out: [String: Int] = [:]
            try Self.each(db.cachedStatement(sql: """
                SELECT activity_id, COUNT(*) AS n FROM high_priority_sends WHERE activity_id IN (SELECT value FROM json_each(?)) AND at >= ? GROUP BY activity_id
                """), arguments: [Self.list(activityIDs.map { .string($0) }), since.timeIntervalSince1970]) { r in
                out[r["activity_id"]] = r["n"]
            }
            return out
        }
    }

    public func insertJobs(_ rows: [NewJobRow]) async throws -> [Int64] {
        try writer.run { db in
            var seq = try Int64.fetchOne(db.cachedStatement(sql: "SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs")) ?? 1
            // Each chunk's arguments are made as it is written: a million-job fan-out never holds
            // them all at once.
            var seqs: [Int64?] = []
            seqs.reserveCapacity(rows.count)
            for r in rows {
                seqs.append(r.state == .scheduled ? nil : seq)
                if r.state != .scheduled { seq += 1 }
            }
            var ids: [Int64] = []
            ids.reserveCapacity(rows.count)
            try MultiRow.insert(db, into: """
                jobs (bundle_id, kind, activity_id, installation_id, channel_id, aps, has_alert, requested_priority, run_at, state, created_at,
                    lane, seq, is_head, supersedable, carries_content, trace_parent, last_error)
                """, count: rows.count, width: 18, returning: "id", row: { n in
                let r = rows[n], j = r.job
                return [j.bundleID, j.kind.rawValue, j.activityID, j.installationID, j.channelID, j.apsText, j.hasAlert, j.requestedPriority?.rawValue,
                        j.runAt.timeIntervalSince1970, r.state.rawValue, r.createdAt.timeIntervalSince1970, r.lane, seqs[n],
                        r.isHead, r.supersedable, r.carriesContent, j.traceParent, r.lastError]
            }) { ids.append($0["id"]) }
            // Ids are drawn in row order: sorted, they are the rows' ids.
            return ids.sorted()
        }
    }

    public func apply(_ w: QueueWrites) async throws -> Set<Int64> {
        try writer.run { db in
            var written = Set<Int64>()
            for a in w.activities { try SQLiteStore.insertActivity(db, a) }
            if !w.promoted.isEmpty {
                let seq = try Int64.fetchOne(db.cachedStatement(sql: "SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs")) ?? 1
                try db.cachedStatement(sql: """
                    UPDATE jobs SET state = v.value ->> 1, seq = ? + v.key, is_head = v.value ->> 2, last_error = v.value ->> 3 FROM json_each(?) AS v WHERE jobs.id = v.value ->> 0
                    """).execute(arguments: [seq, Self.list(w.promoted.map { .array([.int($0.id), .string($0.state.rawValue), .bool($0.isHead), Self.text($0.lastError)]) })])
            }
            if !w.ended.isEmpty {
                try Self.each(db.cachedStatement(sql: """
                    UPDATE jobs SET state = v.value ->> 1, last_error = v.value ->> 2, is_head = 0, claimed_by = NULL, claimed_until = NULL FROM json_each(?) AS v
                    WHERE jobs.id = v.value ->> 0 AND jobs.state IN ('scheduled', 'queued') RETURNING jobs.id
                    """), arguments: [Self.list(w.ended.map { .array([.int($0.id), .string($0.state.rawValue), .string($0.reason)]) })]) { r in written.insert(r["id"]) }
            }
            if !w.heads.isEmpty {
                try db.cachedStatement(sql: "UPDATE jobs SET is_head = 1 WHERE id IN (SELECT value FROM json_each(?))").execute(arguments: [Self.list(w.heads.map { .int($0) })])
            }
            if !w.activityTimestamps.isEmpty {
                try db.cachedStatement(sql: "UPDATE activities SET last_timestamp = v.value ->> 1 FROM json_each(?) AS v WHERE activities.id = v.value ->> 0")
                    .execute(arguments: [Self.list(w.activityTimestamps.map { .array([.string($0.key), .int($0.value)]) })])
            }
            if !w.channelTimestamps.isEmpty {
                try db.cachedStatement(sql: "UPDATE channels SET last_timestamp = v.value ->> 1 FROM json_each(?) AS v WHERE channels.id = v.value ->> 0")
                    .execute(arguments: [Self.list(w.channelTimestamps.map { .array([.string($0.key), .int($0.value)]) })])
            }
            if !w.claims.isEmpty {
                try db.cachedStatement(sql: """
                    UPDATE jobs SET state = 'claimed', claimed_by = ?, claimed_until = ?, attempts = attempts + 1, push_timestamp = v.value ->> 1, apns_id = v.value ->> 2
                    FROM json_each(?) AS v WHERE jobs.id = v.value ->> 0
                    """).execute(arguments: [w.claimWorker, w.claimUntil.timeIntervalSince1970,
                                             Self.list(w.claims.map { .array([.int($0.id), .int($0.timestamp), .string($0.apnsID.text)]) })])
            }
            if !w.finished.isEmpty {
                try Self.each(db.cachedStatement(sql: """
                    UPDATE jobs SET state = v.value ->> 3, last_error = v.value ->> 4, claimed_by = NULL, claimed_until = NULL, is_head = 0,
                        apns_requests = apns_requests + (v.value ->> 5 IS NOT NULL), last_status = COALESCE(v.value ->> 5, last_status),
                        last_apns_reason = CASE WHEN v.value ->> 5 IS NULL THEN last_apns_reason ELSE v.value ->> 6 END
                    FROM json_each(?) AS v
                    WHERE jobs.id = v.value ->> 0 AND jobs.state = 'claimed' AND jobs.claimed_by = v.value ->> 1 AND jobs.attempts = v.value ->> 2 RETURNING jobs.id
                    """), arguments: [Self.list(w.finished.map { .array([.int($0.claim.id), .string($0.claim.worker), .int($0.claim.attempts), .string($0.state.rawValue), Self.text($0.reason)] + Self.answer($0.answer)) })]) { r in
                    written.insert(r["id"])
                }
            }
            if !w.requeued.isEmpty {
                try Self.each(db.cachedStatement(sql: """
                    UPDATE jobs SET state = 'queued', run_at = v.value ->> 3, last_error = v.value ->> 4, claimed_by = NULL, claimed_until = NULL,
                        apns_requests = apns_requests + (v.value ->> 5 IS NOT NULL), last_status = COALESCE(v.value ->> 5, last_status),
                        last_apns_reason = CASE WHEN v.value ->> 5 IS NULL THEN last_apns_reason ELSE v.value ->> 6 END
                    FROM json_each(?) AS v
                    WHERE jobs.id = v.value ->> 0 AND jobs.state = 'claimed' AND jobs.claimed_by = v.value ->> 1 AND jobs.attempts = v.value ->> 2 RETURNING jobs.id
                    """), arguments: [Self.list(w.requeued.map { .array([.int($0.claim.id), .string($0.claim.worker), .int($0.claim.attempts), .double($0.at.timeIntervalSince1970), .string($0.reason)] + Self.answer($0.answer)) })]) { r in
                    written.insert(r["id"])
                }
            }
            if !w.deliveries.isEmpty {
                try MultiRow.insert(db, into: "deliveries (job_id, activity_id, apns_id, apns_unique_id, status, reason, latency_ms, priority, downgraded, at, bundle_id, device_note)", w.deliveries.map { n in
                    let d = n.record
                    return [d.jobID, d.activityID, d.apnsID?.text, d.apnsUniqueID, d.status, d.reason, d.latencyMS, d.priority.rawValue, d.downgraded, d.at.timeIntervalSince1970, n.bundleID, d.deviceNote]
                })
            }
            try Self.patchActivities(db, w.activityPatches)
            for i in w.installations { try SQLiteStore.writeInstallation(db, i) }
            if !w.highPrioritySends.isEmpty {
                try MultiRow.insert(db, into: "high_priority_sends (activity_id, at)", w.highPrioritySends.map { [$0.activityID, $0.at.timeIntervalSince1970] })
            }
            for c in w.highPriorityChannelSends {
                // One row per installation with an unended activity on the channel (its budget key).
                try db.execute(sql: """
                    INSERT INTO high_priority_sends (activity_id, at) SELECT DISTINCT 'inst:' || bundle_id || '/' || installation_id, ? FROM activities
                    WHERE channel_id = ? AND installation_id IS NOT NULL AND state IN ('active', 'starting')
                    """, arguments: [c.at.timeIntervalSince1970, c.channelID])
            }
            for r in w.idempotency { try SQLiteStore.insertIdempotency(db, r) }
            try SQLiteStore.insertEvents(db, w.events)
            return written
        }
    }

    /// Content, relevance and stale date of every activity in one statement (never of one that
    /// ended or was dismissed meanwhile); then ends and dead tokens, and broadcasts' patches of
    /// their channels' subscribers, one by one (rare). Content first, as ``ActivityLifecycle``
    /// applies one patch: an end that carries the final content-state stores it, then ends.
    static func patchActivities(_ db: Database, _ writes: [QueueWrites.ActivityPatchWrite]) throws {
        guard !writes.isEmpty else { return }
        var content: [JSONValue] = []
        var rest: [(column: String, id: String, patch: ActivityPatch)] = []
        for w in writes {
            switch w.target {
            case .activity(let id):
                var p = w.patch
                if p.content != nil || p.relevanceScore != nil || p.setsStaleDate {
                    content.append(.array([.string(id), text(p.content?.jsonString), number(p.relevanceScore), .bool(p.setsStaleDate), number(p.staleDate?.timeIntervalSince1970)]))
                }
                p.content = nil
                p.relevanceScore = nil
                p.setsStaleDate = false
                if p.end != nil || p.unreachable != nil { rest.append(("id", id, p)) }
            case .channel(let id):
                rest.append(("channel_id", id, w.patch))
            }
        }
        if !content.isEmpty {
            try db.cachedStatement(sql: """
                UPDATE activities SET content = COALESCE(v.value ->> 1, content), relevance_score = COALESCE(v.value ->> 2, relevance_score),
                    stale_date = CASE WHEN v.value ->> 3 THEN v.value ->> 4 ELSE stale_date END
                FROM json_each(?) AS v WHERE activities.id = v.value ->> 0 AND activities.state IN (\(ActivityLifecycle.pushChangesSQL))
                """).execute(arguments: [list(content)])
        }
        for r in rest { try SQLiteStore.apply(db, r.patch, column: r.column, r.id) }
    }
}

/// Rows inserted with one multi-row `VALUES` per chunk (SQLite binds at most 32,766 values).
enum MultiRow {
    static func insert(_ db: Database, into target: String, _ rows: [[(any DatabaseValueConvertible)?]], returning: String? = nil, each: (Row) throws -> Void = { _ in }) throws {
        guard let width = rows.first?.count, width > 0 else { return }
        try insert(db, into: target, count: rows.count, width: width, returning: returning, row: { rows[$0] }, each: each)
    }

    /// `count` rows of `width` values, the `n`th made by `row(n)` when its chunk is written.
    static func insert(_ db: Database, into target: String, count: Int, width: Int, returning: String? = nil, row: (Int) -> [(any DatabaseValueConvertible)?],
                       each: (Row) throws -> Void = { _ in }) throws {
        guard count > 0, width > 0 else { return }
        let chunk = max(1, 30_000 / width)
        let tuple = "(" + Array(repeating: "?", count: width).joined(separator: ", ") + ")"
        for start in stride(from: 0, to: count, by: chunk) {
            let end = min(count, start + chunk)
            var sql = "INSERT INTO \(target) VALUES " + Array(repeating: tuple, count: end - start).joined(separator: ", ")
            if let returning { sql += " RETURNING \(returning)" }
            // A full chunk's text repeats (cached); a remainder's is made once.
            let statement = end - start == chunk || end - start <= 8 ? try db.cachedStatement(sql: sql) : try db.makeStatement(sql: sql)
            var values: [(any DatabaseValueConvertible)?] = []
            values.reserveCapacity((end - start) * width)
            for n in start..<end { values += row(n) }
            let arguments = StatementArguments(values)
            if returning != nil {
                try SQLiteQueueTransaction.each(statement, arguments: arguments, each)
            } else {
                try statement.execute(arguments: arguments)
            }
        }
    }
}
