public import Foundation
public import IsleCore
import Logging
import PostgresNIO

// The durable queue on PostgreSQL: the same lanes, heads and LanePlanner decisions as SQLite,
// made safe across processes with lane advisory locks and `FOR UPDATE SKIP LOCKED` claims.
extension PostgresStore {
    static func lane(_ j: NewPushJob) -> String? { LanePlanner.lane(kind: j.kind, activityID: j.activityID, channelID: j.channelID) }

    public func enqueue(_ jobs: [NewPushJob], creating activities: [ActivityRecord], idempotency: IdempotencyRecord?, now: Date) async throws -> [Int64] {
        let log = logger
        return try await transaction { conn in
            try await Self.insertActivities(conn, activities, logger: log)
            // Every lane this request touches, locked in one order (no two enqueues can deadlock).
            try await Self.lockLanes(conn, jobs.compactMap(Self.lane), logger: log)
            // A fan-out: the jobs whose lane is empty become its head, inserted in one statement;
            // the others (lanes with open work, scheduled jobs) go one by one below.
            var ids = [Int64?](repeating: nil, count: jobs.count)
            let due = jobs.indices.filter { jobs[$0].runAt <= now && Self.lane(jobs[$0]) != nil }
            if due.count > 1 {
                let lanes = due.map { Self.lane(jobs[$0])! }
                let busy = Set(try await conn.rows("SELECT DISTINCT lane FROM jobs WHERE lane = ANY($1::text[]) AND state IN ('queued', 'claimed')",
                                                   [.texts(lanes)], logger: log).map { try $0.string("lane") })
                var seen: Set<String> = []
                let fresh = due.filter { i in
                    let lane = Self.lane(jobs[i])!
                    return !busy.contains(lane) && seen.insert(lane).inserted
                }
                if !fresh.isEmpty {
                    let inserted = try await Self.insertHeads(conn, fresh.map { jobs[$0] }, now: now, logger: log)
                    for (k, i) in fresh.enumerated() { ids[i] = inserted[k] }
                }
            }
            for (index, j) in jobs.enumerated() where ids[index] == nil {
                let lane = Self.lane(j)
                let supersedable = LanePlanner.isSupersedable(kind: j.kind, hasAlert: j.hasAlert, aps: j.aps)
                let carries = LanePlanner.carriesContent(kind: j.kind, aps: j.aps)
                let scheduled = j.runAt > now
                var head: LaneHead?
                if !scheduled, let lane { head = try await Self.openHead(conn, lane, logger: log) }
                let row = try await conn.row("""
                    INSERT INTO jobs (bundle_id, kind, activity_id, installation_id, channel_id, aps, has_alert, requested_priority, run_at, state, created_at,
                        lane, seq, is_head, supersedable, carries_content)
                    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, CASE WHEN $13 THEN NULL ELSE nextval('job_seq') END, $14, $15, $16) RETURNING id
                    """, [.text(j.bundleID), .text(j.kind.rawValue), .text(j.activityID), .text(j.installationID), .text(j.channelID), .text(j.aps.jsonString),
                          .bool(j.hasAlert), .int(j.requestedPriority), .date(j.runAt), .text(scheduled ? "scheduled" : "queued"), .date(now),
                          .text(lane), .bool(scheduled), .bool(!scheduled && head == nil), .bool(supersedable), .bool(carries)], logger: log)
                ids[index] = try row!.int("id")
                // A head waiting for a retry that this job makes pointless goes now, not later.
                if carries, let lane, let head, !head.claimed, head.supersedable { try await Self.coalesce(conn, lane: lane, now: now, logger: log) }
            }
            let allIDs = ids.compactMap { $0 }
            if var r = idempotency {
                r.body = r.body(withJobs: allIDs)
                try await Self.insertIdempotency(conn, r, logger: log)
            }
            if !jobs.isEmpty { try await conn.rows("SELECT pg_notify($1, '')", [.text(Self.notifyChannel)], logger: log) }
            return allIDs
        }
    }

    /// Jobs that each become the head of an empty lane, in one statement; their ids in order.
    static func insertHeads(_ conn: PostgresConnection, _ jobs: [NewPushJob], now: Date, logger: Logger) async throws -> [Int64] {
        var ids: [Int64] = []
        for start in stride(from: 0, to: jobs.count, by: 10_000) {
            let chunk = Array(jobs[start..<min(jobs.count, start + 10_000)])
            let rows = try await conn.rows("""
                INSERT INTO jobs (bundle_id, kind, activity_id, installation_id, channel_id, aps, has_alert, requested_priority, run_at, state, created_at,
                    lane, seq, is_head, supersedable, carries_content)
                SELECT b, k, NULLIF(a, E'\\x01'), NULLIF(i, E'\\x01'), NULLIF(c, E'\\x01'), aps, al, NULLIF(p, -1), r, 'queued', $13, l, nextval('job_seq'), TRUE, s, cc
                FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bool[], $8::bigint[], $9::float8[], $10::text[], $11::bool[], $12::bool[])
                    WITH ORDINALITY AS t(b, k, a, i, c, aps, al, p, r, l, s, cc, n)
                ORDER BY n
                RETURNING id, lane
                """, [.texts(chunk.map(\.bundleID)), .texts(chunk.map(\.kind.rawValue)), .texts(chunk.map { $0.activityID ?? "\u{1}" }),
                      .texts(chunk.map { $0.installationID ?? "\u{1}" }), .texts(chunk.map { $0.channelID ?? "\u{1}" }), .texts(chunk.map(\.aps.jsonString)),
                      .bools(chunk.map(\.hasAlert)), .ints(chunk.map { Int64($0.requestedPriority ?? -1) }), .doubles(chunk.map { $0.runAt.timeIntervalSince1970 }),
                      .texts(chunk.map { lane($0)! }), .bools(chunk.map { LanePlanner.isSupersedable(kind: $0.kind, hasAlert: $0.hasAlert, aps: $0.aps) }),
                      .bools(chunk.map { LanePlanner.carriesContent(kind: $0.kind, aps: $0.aps) }), .date(now)], logger: logger)
            // Lanes are unique within the statement: map the returned ids back by lane.
            var byLane: [String: Int64] = [:]
            for r in rows { byLane[try r.string("lane")] = try r.int("id") }
            for j in chunk { ids.append(byLane[lane(j)!]!) }
        }
        return ids
    }

    /// Activities a push-to-start creates, with their topics.
    static func insertActivities(_ conn: PostgresConnection, _ activities: [ActivityRecord], logger: Logger) async throws {
        for a in activities { try await insertActivity(conn, a, logger: logger) }
    }

    struct LaneHead {
        var id: Int64
        var isHead: Bool
        var claimed: Bool
        var supersedable: Bool
    }

    static func openHead(_ conn: PostgresConnection, _ lane: String, logger: Logger) async throws -> LaneHead? {
        try await conn.row("SELECT id, is_head, state, supersedable FROM jobs WHERE lane = $1 AND state IN ('queued', 'claimed') ORDER BY seq LIMIT 1",
                           [.text(lane)], logger: logger).map { r in
            LaneHead(id: try r.int("id"), isHead: try r.bool("is_head"), claimed: try r.string("state") == "claimed", supersedable: try r.bool("supersedable"))
        }
    }

    static func fixHead(_ conn: PostgresConnection, _ lane: String?, logger: Logger) async throws {
        guard let lane, let head = try await openHead(conn, lane, logger: logger), !head.isHead else { return }
        try await conn.rows("UPDATE jobs SET is_head = TRUE WHERE id = $1", [.int(head.id)], logger: logger)
    }

    /// ``LanePlanner`` decides over the lane's unfinished jobs (the caller holds the lane's lock).
    @discardableResult
    static func coalesce(_ conn: PostgresConnection, lane: String, now: Date, logger: Logger) async throws -> Int64? {
        let rows = try await conn.rows("""
            SELECT id, state, supersedable, carries_content, run_at FROM jobs WHERE lane = $1 AND state IN ('queued', 'claimed') ORDER BY seq LIMIT 256
            """, [.text(lane)], logger: logger)
        let entries = try rows.map { r in
            LanePlanner.Entry(id: try r.int("id"), supersedable: try r.bool("supersedable"), carriesContent: try r.bool("carries_content"),
                              due: try r.double("run_at") <= now.timeIntervalSince1970, claimed: try r.string("state") == "claimed")
        }
        let decision = LanePlanner.decide(entries)
        guard !decision.superseded.isEmpty else { return decision.claim }
        try await conn.rows("""
            UPDATE jobs SET state = 'superseded', is_head = FALSE, last_error = 'superseded by newer content before it was sent' WHERE id = ANY($1::bigint[]) AND state = 'queued'
            """, [.ints(decision.superseded)], logger: logger)
        try await fixHead(conn, lane, logger: logger)
        return decision.claim
    }

    static func job(_ r: PGRow) throws -> PushJob {
        PushJob(id: try r.int("id"), bundleID: try r.string("bundle_id"), kind: PushJobKind(rawValue: try r.string("kind")) ?? .update, activityID: try r.optionalString("activity_id"),
                installationID: try r.optionalString("installation_id"), channelID: try r.optionalString("channel_id"), aps: (try? JSONParser.parse(try r.string("aps"))) ?? [:],
                hasAlert: try r.bool("has_alert"), requestedPriority: try r.optionalInt("requested_priority").map(Int.init), runAt: try r.date("run_at"),
                state: PushJobState(rawValue: try r.string("state")) ?? .queued, attempts: Int(try r.int("attempts")), claimedBy: try r.optionalString("claimed_by"),
                claimedUntil: try r.optionalDate("claimed_until"), lastError: try r.optionalString("last_error"), createdAt: try r.date("created_at"),
                lane: try r.optionalString("lane"), seq: try r.optionalInt("seq"))
    }

    public func claim(limit: Int, now: Date, lease: TimeInterval, worker: String, excludingApps: Set<String>) async throws -> [ClaimedJob] {
        guard limit > 0 else { return [] }
        let log = logger
        return try await transaction { conn in
            try await Self.promoteScheduled(conn, now: now, logger: log)
            // Heads another process is claiming are skipped, not waited for.
            let heads = try await conn.rows("""
                SELECT * FROM jobs WHERE is_head AND state = 'queued' AND run_at <= $1 AND NOT (bundle_id = ANY($2::text[]))
                ORDER BY run_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED
                """, [.date(now), .texts(excludingApps.sorted()), .int(limit)], logger: log).map(Self.job)
            var claimed: [ClaimedJob] = []
            for head in heads {
                var j = head
                if let lane = head.lane {
                    // A lane another process is changing (an enqueue, a completion) waits for the next round.
                    guard try await Self.tryLockLane(conn, lane, logger: log) else { continue }
                    if LanePlanner.isSupersedable(kind: head.kind, hasAlert: head.hasAlert, aps: head.aps) {
                        guard let id = try await Self.coalesce(conn, lane: lane, now: now, logger: log) else { continue }
                        if id != head.id {
                            guard let next = try await conn.row("SELECT * FROM jobs WHERE id = $1", [.int(id)], logger: log).map(Self.job) else { continue }
                            j = next
                        }
                    }
                }
                claimed.append(try await Self.claimOne(conn, j, now: now, lease: lease, worker: worker, logger: log))
            }
            return claimed
        }
    }

    static func promoteScheduled(_ conn: PostgresConnection, now: Date, logger: Logger) async throws {
        let due = try await conn.rows("""
            SELECT id, lane, carries_content FROM jobs WHERE state = 'scheduled' AND run_at <= $1 ORDER BY run_at, id LIMIT 1000 FOR UPDATE SKIP LOCKED
            """, [.date(now)], logger: logger)
        for r in due {
            let lane = try r.optionalString("lane")
            if let lane { guard try await tryLockLane(conn, lane, logger: logger) else { continue } }
            var head: LaneHead?
            if let lane { head = try await openHead(conn, lane, logger: logger) }
            try await conn.rows("UPDATE jobs SET state = 'queued', seq = nextval('job_seq'), is_head = $1 WHERE id = $2", [.bool(head == nil), .int(try r.int("id"))], logger: logger)
            if try r.bool("carries_content"), let lane, let head, !head.claimed, head.supersedable { try await coalesce(conn, lane: lane, now: now, logger: logger) }
        }
    }

    static func claimOne(_ conn: PostgresConnection, _ job: PushJob, now: Date, lease: TimeInterval, worker: String, logger: Logger) async throws -> ClaimedJob {
        var j = job
        let row = try await conn.row("SELECT push_timestamp, apns_id FROM jobs WHERE id = $1", [.int(j.id)], logger: logger)!
        var timestamp = try row.optionalInt("push_timestamp")
        var apnsID = try row.optionalString("apns_id")
        var activity: ActivityRecord?
        if let a = j.activityID {
            activity = try await conn.row("SELECT * FROM activities WHERE id = $1", [.text(a)], logger: logger).map { try Self.activity($0, topics: []) }
        }
        if timestamp == nil {
            var channelLast: Int64?
            if j.kind == .broadcast, let channel = j.channelID {
                channelLast = try await conn.row("SELECT last_timestamp FROM channels WHERE id = $1", [.text(channel)], logger: logger)?.optionalInt("last_timestamp")
            }
            let ts = ClaimedJob.firstTimestamp(now: now, afterActivity: activity?.lastTimestamp, afterChannel: channelLast)
            if j.kind == .broadcast, let channel = j.channelID {
                try await conn.rows("UPDATE channels SET last_timestamp = $1 WHERE id = $2", [.int(ts), .text(channel)], logger: logger)
            }
            timestamp = ts
            if var act = activity {
                act.lastTimestamp = ts
                try await conn.rows("UPDATE activities SET last_timestamp = $1 WHERE id = $2", [.int(ts), .text(act.id)], logger: logger)
                activity = act
            }
        }
        if apnsID == nil { apnsID = UUID().uuidString.lowercased() }
        try await conn.rows("""
            UPDATE jobs SET state = 'claimed', claimed_by = $1, claimed_until = $2, attempts = attempts + 1, push_timestamp = $3, apns_id = $4 WHERE id = $5
            """, [.text(worker), .double(now.timeIntervalSince1970 + lease), .int(timestamp), .text(apnsID), .int(j.id)], logger: logger)
        j.markClaimed(by: worker, until: now.addingTimeInterval(lease))
        return ClaimedJob(job: j, timestamp: timestamp!, apnsID: apnsID!, worker: worker, activity: activity)
    }

    public func complete(_ c: JobCompletion) async throws -> Bool {
        let log = logger
        return try await transaction { conn in
            let job = c.claim.job
            if let lane = job.lane { try await Self.lockLane(conn, lane, logger: log) }
            var current: String?
            if case .deadToken = c.result, let id = job.activityID {
                current = try await conn.row("SELECT update_token FROM activities WHERE id = $1", [.text(id)], logger: log)?.optionalString("update_token")
            }
            let (result, activityPatch) = c.resolvingDeadToken(currentToken: current)
            // The claim must still be this worker's, this attempt's.
            let guardClause = " WHERE id = $3 AND state = 'claimed' AND claimed_by = $4 AND attempts = $5 RETURNING id"
            let guardArgs: [PGArg] = [.int(job.id), .text(c.claim.worker), .int(job.attempts)]
            switch result {
            case .finished(let state, let reason):
                let done = try await conn.rows("UPDATE jobs SET state = $1, last_error = $2, claimed_by = NULL, claimed_until = NULL, is_head = FALSE" + guardClause,
                                               [.text(state.rawValue), .text(reason)] + guardArgs, logger: log)
                guard !done.isEmpty else { return false }
                try await Self.fixHead(conn, job.lane, logger: log)
            case .retry(let at, let reason):
                let done = try await conn.rows("UPDATE jobs SET state = 'queued', run_at = $1, last_error = $2, claimed_by = NULL, claimed_until = NULL" + guardClause,
                                               [.date(at), .text(reason)] + guardArgs, logger: log)
                guard !done.isEmpty else { return false }
                if at <= Date(timeIntervalSince1970: 1) { try await conn.rows("SELECT pg_notify($1, '')", [.text(Self.notifyChannel)], logger: log) }
            case .deadToken:
                return false
            }
            if let d = c.delivery { try await Self.insert(conn, d, logger: log) }
            if let p = activityPatch {
                if let id = job.activityID {
                    try await Self.apply(conn, p, column: "id", id, logger: log)
                } else if job.kind == .broadcast, let channel = job.channelID {
                    try await Self.apply(conn, p, column: "channel_id", channel, logger: log)
                }
            }
            if let p = c.installation { try await Self.apply(conn, p, logger: log) }
            if let at = c.highPriorityAt, let id = job.activityID {
                try await conn.rows("INSERT INTO high_priority_sends (activity_id, at) VALUES ($1, $2)", [.text(id), .date(at)], logger: log)
            }
            return true
        }
    }

    /// Writes only what the push changed; never reverts what the device reported since.
    static func apply(_ conn: PostgresConnection, _ p: ActivityPatch, column: String, _ id: String, logger: Logger) async throws {
        if p.content != nil || p.relevanceScore != nil || p.setsStaleDate {
            try await conn.rows("""
                UPDATE activities SET content = COALESCE($1, content), relevance_score = COALESCE($2, relevance_score),
                    stale_date = CASE WHEN $3 THEN $4 ELSE stale_date END
                WHERE \(column) = $5 AND state IN ('active', 'starting')
                """, [.text(p.content?.jsonString), .double(p.relevanceScore), .bool(p.setsStaleDate), .date(p.staleDate), .text(id)], logger: logger)
        }
        if let e = p.end {
            try await conn.rows("""
                UPDATE activities SET state = 'ended', ended_at = COALESCE(ended_at, $1), dismissed_at = COALESCE($2, dismissed_at), state_reason = COALESCE($3, state_reason)
                WHERE \(column) = $4 AND state IN ('active', 'starting')
                """, [.date(e.at), .date(e.dismissAt), .text(e.reason), .text(id)], logger: logger)
        }
        if let u = p.unreachable {
            try await conn.rows("""
                UPDATE activities SET state = 'unreachable', state_reason = $1 WHERE \(column) = $2 AND state IN ('active', 'starting') AND ($3::text IS NULL OR update_token = $3)
                """, [.text(u.reason), .text(id), .text(u.ifToken)], logger: logger)
        }
    }

    static func apply(_ conn: PostgresConnection, _ p: InstallationPatch, logger: Logger) async throws {
        guard var i = try await conn.row("SELECT * FROM installations WHERE id = $1 FOR UPDATE", [.text(p.installationID)], logger: logger).map(installation) else { return }
        var changed = false
        if let (type, token) = p.deadPushToStartToken, i.pushToStartTokens[type] == token {
            i.pushToStartTokens[type] = nil
            changed = true
        }
        if let w = p.deadWidgetToken, i.widgetToken == w {
            i.widgetToken = nil
            changed = true
        }
        if changed { try await writeInstallation(conn, i, logger: logger) }
    }

    static func insert(_ conn: PostgresConnection, _ d: DeliveryRecord, logger: Logger) async throws {
        try await conn.rows("""
            INSERT INTO deliveries (job_id, activity_id, apns_id, apns_unique_id, status, reason, latency_ms, priority, downgraded, at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
            """, [.int(d.jobID), .text(d.activityID), .text(d.apnsID), .text(d.apnsUniqueID), .int(d.status), .text(d.reason), .double(d.latencyMS), .int(d.priority),
                  .bool(d.downgraded), .date(d.at)], logger: logger)
    }

    public func requeueExpiredClaims(now: Date, keeping: Set<Int64>) async throws -> Int {
        let log = logger
        return try await transaction { conn in
            try await conn.rows("""
                UPDATE jobs SET state = 'queued', claimed_by = NULL, claimed_until = NULL
                WHERE state = 'claimed' AND claimed_until < $1 AND NOT (id = ANY($2::bigint[])) RETURNING id
                """, [.double(min(now.timeIntervalSince1970, 1e15)), .ints(keeping.sorted())], logger: log).count
        }
    }

    /// Other processes may be sending right now: at start only claims whose lease ran out come back.
    public func requeueClaimsAtStart(now: Date) async throws -> Int {
        try await requeueExpiredClaims(now: now, keeping: [])
    }

    public func wakeLane(activityID: String, now: Date) async throws {
        let log = logger
        try await transaction { conn in
            try await conn.rows("UPDATE jobs SET run_at = $1 WHERE lane = $2 AND is_head AND state = 'queued' AND run_at > $1", [.date(now), .text("a:" + activityID)], logger: log)
            try await conn.rows("SELECT pg_notify($1, '')", [.text(Self.notifyChannel)], logger: log)
        }
    }

    public func wakeApp(bundleID: String, now: Date) async throws {
        let log = logger
        try await transaction { conn in
            try await conn.rows("UPDATE jobs SET run_at = $1 WHERE bundle_id = $2 AND is_head AND state = 'queued' AND run_at > $1", [.date(now), .text(bundleID)], logger: log)
            try await conn.rows("SELECT pg_notify($1, '')", [.text(Self.notifyChannel)], logger: log)
        }
    }

    public func job(id: Int64) async throws -> PushJob? {
        let log = logger
        return try await read { conn in try await conn.row("SELECT * FROM jobs WHERE id = $1", [.int(id)], logger: log).map(Self.job) }
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
                if let s = PushJobState(rawValue: try r.string("state")) { out[s] = Int(try r.int("n")) }
            }
            return out
        }
    }
}
