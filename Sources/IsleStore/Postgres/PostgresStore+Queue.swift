public import Foundation
public import IsleCore
import Logging
import PostgresNIO

// The durable queue on PostgreSQL: the same lanes, heads and LanePlanner decisions as SQLite,
// made safe across processes with lane advisory locks and `FOR UPDATE SKIP LOCKED` claims.
extension PostgresStore {
    static func lane(_ j: NewPushJob) -> String? { LanePlanner.lane(kind: j.kind, activityID: j.activityID, channelID: j.channelID) }

    /// One API request's jobs, waiting to be group-committed with others (``enqueues``).
    struct EnqueueRequest: Sendable {
        var jobs: [NewPushJob]
        var activities: [ActivityRecord]
        var idempotency: IdempotencyRecord?
        var now: Date
    }

    /// Requests that arrive while another batch commits wait and go together in the next
    /// transaction: one lock statement, one head lookup and one insert for the whole batch.
    public func enqueue(_ jobs: [NewPushJob], creating activities: [ActivityRecord], idempotency: IdempotencyRecord?, now: Date) async throws -> [Int64] {
        try await enqueues.submit(EnqueueRequest(jobs: jobs, activities: activities, idempotency: idempotency, now: now)) { batch in try await self.enqueueBatch(batch) }
    }

    /// A batch in one transaction; when it fails for a reason other than the database being away
    /// (an idempotency key or external key taken by one request), each request runs alone, so one
    /// refused request fails only itself.
    func enqueueBatch(_ rs: [EnqueueRequest]) async throws -> [Result<[Int64], any Error>] {
        let log = logger
        do {
            return try await transaction { conn in try await Self.enqueueAll(conn, rs, logger: log).map { .success($0) } }
        } catch let e as StoreError where e.code == .unavailable {
            throw e
        } catch where rs.count > 1 {
            var out: [Result<[Int64], any Error>] = []
            for r in rs {
                do { out.append(.success(try await transaction { conn in try await Self.enqueueAll(conn, [r], logger: log)[0] })) } catch { out.append(.failure(error)) }
            }
            return out
        }
    }

    /// Queues every request's jobs in order: a due job joins the end of its lane (its head if the
    /// lane is empty); a scheduled one waits outside until promoted. Lanes whose waiting head a new
    /// job makes pointless are coalesced by ``LanePlanner`` once, after the inserts.
    static func enqueueAll(_ conn: PostgresConnection, _ rs: [EnqueueRequest], logger log: Logger) async throws -> [[Int64]] {
        for r in rs { try await insertActivities(conn, r.activities, logger: log) }
        let all = rs.flatMap { r in r.jobs.map { (job: $0, now: r.now) } }
        // Every lane the batch touches, locked in one order (no two batches can deadlock).
        try await lockLanes(conn, all.compactMap { lane($0.job) }, logger: log)
        let dueLanes = Array(Set(all.filter { $0.job.runAt <= $0.now }.compactMap { lane($0.job) })).sorted()
        var heads = try await openHeads(conn, dueLanes, logger: log)
        var rows: [NewRow] = []
        var coalescing: [String: Date] = [:]
        for (job, now) in all {
            let p = LanePlanner.place(job, now: now) { heads[$0] }
            if let lane = p.lane, !p.scheduled {
                // A head waiting for a retry that this job makes pointless goes now, not later.
                if p.coalescesLane { coalescing[lane] = max(coalescing[lane] ?? now, now) }
                // The batch's later jobs of this lane stand behind this one.
                if p.isHead { heads[lane] = LanePlanner.Head(id: 0, isHead: true, claimed: false, supersedable: p.supersedable) }
            }
            rows.append(NewRow(job: job, lane: p.lane, scheduled: p.scheduled, isHead: p.isHead, supersedable: p.supersedable, carries: p.carriesContent, now: now))
        }
        let ids = try await insertJobs(conn, rows, logger: log)
        var out: [[Int64]] = []
        var next = 0
        for r in rs {
            let mine = Array(ids[next..<next + r.jobs.count])
            next += r.jobs.count
            if var record = r.idempotency {
                record.body = record.body(withJobs: mine)
                try await insertIdempotency(conn, record, logger: log)
            }
            out.append(mine)
        }
        if let now = coalescing.values.max() { try await coalesce(conn, lanes: Array(coalescing.keys), now: now, logger: log) }
        if !all.isEmpty { try await conn.rows("SELECT pg_notify($1, '')", [.text(Self.notifyChannel)], logger: log) }
        return out
    }

    struct NewRow {
        var job: NewPushJob
        var lane: String?
        var scheduled: Bool
        var isHead: Bool
        var supersedable: Bool
        var carries: Bool
        var now: Date
    }

    /// Inserts the rows in order, a statement per 10,000; answers their ids in the same order (ids
    /// and lane sequence numbers are drawn in row order, so sorted ids are the rows' ids).
    static func insertJobs(_ conn: PostgresConnection, _ rows: [NewRow], logger: Logger) async throws -> [Int64] {
        var ids: [Int64] = []
        let none = "\u{1}"
        for start in stride(from: 0, to: rows.count, by: 10_000) {
            let chunk = Array(rows[start..<min(rows.count, start + 10_000)])
            let inserted = try await conn.rows("""
                INSERT INTO jobs (id, bundle_id, kind, activity_id, installation_id, channel_id, aps, has_alert, requested_priority, run_at, state, created_at,
                    lane, seq, is_head, supersedable, carries_content, trace_parent)
                SELECT nextval('jobs_id_seq'), b, k, NULLIF(a, E'\\x01'), NULLIF(i, E'\\x01'), NULLIF(c, E'\\x01'), aps, al, NULLIF(p, -1), r,
                    CASE WHEN sch THEN 'scheduled' ELSE 'queued' END, cr, NULLIF(l, E'\\x01'), CASE WHEN sch THEN NULL ELSE nextval('job_seq') END, h, s, cc,
                    NULLIF(tp, E'\\x01')
                FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bool[], $8::bigint[], $9::timestamptz[], $10::timestamptz[],
                    $11::text[], $12::bool[], $13::bool[], $14::bool[], $15::bool[], $16::text[])
                    WITH ORDINALITY AS t(b, k, a, i, c, aps, al, p, r, cr, l, sch, h, s, cc, tp, n)
                ORDER BY n
                RETURNING id
                """, [.texts(chunk.map(\.job.bundleID)), .texts(chunk.map(\.job.kind.rawValue)), .texts(chunk.map { $0.job.activityID ?? none }),
                      .texts(chunk.map { $0.job.installationID ?? none }), .texts(chunk.map { $0.job.channelID ?? none }), .texts(chunk.map(\.job.apsText)),
                      .bools(chunk.map(\.job.hasAlert)), .ints(chunk.map { Int64($0.job.requestedPriority?.rawValue ?? -1) }), .dates(chunk.map(\.job.runAt)),
                      .dates(chunk.map(\.now)), .texts(chunk.map { $0.lane ?? none }), .bools(chunk.map(\.scheduled)), .bools(chunk.map(\.isHead)),
                      .bools(chunk.map(\.supersedable)), .bools(chunk.map(\.carries)), .texts(chunk.map { $0.job.traceParent ?? none })], logger: logger)
            let sorted = try inserted.map { try $0.int("id") }.sorted()
            guard sorted.count == chunk.count else { throw StoreError(.unavailable, "PostgreSQL inserted \(sorted.count) of \(chunk.count) jobs") }
            ids += sorted
        }
        return ids
    }

    /// The first open job of each lane (none for an empty lane), in one statement.
    static func openHeads(_ conn: PostgresConnection, _ lanes: [String], logger: Logger) async throws -> [String: LanePlanner.Head] {
        guard !lanes.isEmpty else { return [:] }
        var heads: [String: LanePlanner.Head] = [:]
        for r in try await conn.rows("""
            SELECT l.lane, h.id, h.is_head, h.state, h.supersedable FROM unnest($1::text[]) AS l(lane)
            CROSS JOIN LATERAL (SELECT id, is_head, state, supersedable FROM jobs WHERE jobs.lane = l.lane AND state IN ('queued', 'claimed') ORDER BY seq LIMIT 1) AS h
            """, [.texts(lanes)], logger: logger) {
            heads[try r.string("lane")] = LanePlanner.Head(id: try r.int("id"), isHead: try r.bool("is_head"), claimed: try r.string("state") == "claimed",
                                                   supersedable: try r.bool("supersedable"))
        }
        return heads
    }

    /// Activities a push-to-start creates, with their topics.
    static func insertActivities(_ conn: PostgresConnection, _ activities: [ActivityRecord], logger: Logger) async throws {
        for a in activities { try await insertActivity(conn, a, logger: logger) }
    }


    static func openHead(_ conn: PostgresConnection, _ lane: String, logger: Logger) async throws -> LanePlanner.Head? {
        try await conn.row("SELECT id, is_head, state, supersedable FROM jobs WHERE lane = $1 AND state IN ('queued', 'claimed') ORDER BY seq LIMIT 1",
                           [.text(lane)], logger: logger).map { r in
            LanePlanner.Head(id: try r.int("id"), isHead: try r.bool("is_head"), claimed: try r.string("state") == "claimed", supersedable: try r.bool("supersedable"))
        }
    }

    static func fixHead(_ conn: PostgresConnection, _ lane: String?, logger: Logger) async throws {
        guard let lane else { return }
        try await fixHeads(conn, [lane], logger: logger)
    }

    /// The first open job of each lane is its head (one statement for any number of lanes).
    static func fixHeads(_ conn: PostgresConnection, _ lanes: [String], logger: Logger) async throws {
        guard !lanes.isEmpty else { return }
        try await conn.rows("""
            UPDATE jobs SET is_head = TRUE WHERE id IN (
                SELECT h.id FROM unnest($1::text[]) AS l(lane)
                CROSS JOIN LATERAL (SELECT id, is_head FROM jobs WHERE jobs.lane = l.lane AND state IN ('queued', 'claimed') ORDER BY seq LIMIT 1) AS h
                WHERE NOT h.is_head)
            """, [.texts(lanes)], logger: logger)
    }

    /// ``LanePlanner`` decides over the lane's unfinished jobs (the caller holds the lane's lock).
    @discardableResult
    static func coalesce(_ conn: PostgresConnection, lane: String, now: Date, logger: Logger) async throws -> Int64? {
        try await coalesce(conn, lanes: [lane], now: now, logger: logger)[lane] ?? nil
    }

    /// ``LanePlanner`` decides over each lane's unfinished jobs (the caller holds the lanes' locks),
    /// read in one statement; superseded jobs go in one statement. Answers the job each lane would
    /// claim now (nil: none), for every lane given.
    static func coalesce(_ conn: PostgresConnection, lanes: [String], now: Date, logger: Logger) async throws -> [String: Int64?] {
        let unique = Array(Set(lanes)).sorted()
        var entries: [String: [LanePlanner.Entry]] = [:]
        for r in try await conn.rows("""
            SELECT l.lane, o.id, o.state, o.supersedable, o.carries_content, o.run_at FROM unnest($1::text[]) AS l(lane)
            CROSS JOIN LATERAL (SELECT id, state, supersedable, carries_content, run_at, seq FROM jobs
                WHERE jobs.lane = l.lane AND state IN ('queued', 'claimed') ORDER BY seq LIMIT 256) AS o
            ORDER BY l.lane, o.seq
            """, [.texts(unique)], logger: logger) {
            entries[try r.string("lane"), default: []].append(LanePlanner.Entry(
                id: try r.int("id"), supersedable: try r.bool("supersedable"), carriesContent: try r.bool("carries_content"),
                due: try r.date("run_at") <= PGArg.storable(now), claimed: try r.string("state") == "claimed"))
        }
        var claims: [String: Int64?] = [:]
        var superseded: [Int64] = []
        var changed: [String] = []
        for lane in unique {
            let decision = LanePlanner.decide(entries[lane] ?? [])
            claims[lane] = decision.claim
            if !decision.superseded.isEmpty {
                superseded += decision.superseded
                changed.append(lane)
            }
        }
        guard !superseded.isEmpty else { return claims }
        try await conn.rows("""
            UPDATE jobs SET state = 'superseded', is_head = FALSE, last_error = 'superseded by newer content before it was sent' WHERE id = ANY($1::bigint[]) AND state = 'queued'
            """, [.ints(superseded)], logger: logger)
        try await fixHeads(conn, changed, logger: logger)
        return claims
    }

    static func job(_ r: PGRow) throws -> PushJob {
        let id = try r.int("id")
        let row = String(id)
        let aps = try r.string("aps")
        var job = PushJob(id: id, bundleID: try r.string("bundle_id"), kind: try BadRow.decode(try r.string("kind"), as: PushJobKind.self, table: "jobs", id: row, column: "kind"),
                activityID: try r.optionalString("activity_id"),
                installationID: try r.optionalString("installation_id"), channelID: try r.optionalString("channel_id"),
                aps: try BadRow.json(aps, table: "jobs", id: row, column: "aps"),
                hasAlert: try r.bool("has_alert"), requestedPriority: try BadRow.decode(try r.optionalInt("requested_priority").map(Int.init), as: PushPriority.self, table: "jobs", id: row, column: "requested_priority"), runAt: try r.date("run_at"),
                state: try BadRow.decode(try r.string("state"), as: PushJobState.self, table: "jobs", id: row, column: "state"), attempts: Int(try r.int("attempts")), claimedBy: try r.optionalString("claimed_by"),
                claimedUntil: try r.optionalDate("claimed_until"), lastError: try r.optionalString("last_error"), createdAt: try r.date("created_at"),
                lane: try r.optionalString("lane"), seq: try r.optionalInt("seq"))
        job.encodedAPS = Array(aps.utf8)
        job.traceParent = try r.optionalString("trace_parent")
        return job
    }

    /// Claims up to `limit` heads in one transaction of a fixed number of set-based statements,
    /// whatever the number of jobs: select the heads, try their lanes' locks, let ``LanePlanner``
    /// coalesce the lanes that need it, stamp timestamps, mark them claimed.
    public func claim(limit: Int, now: Date, lease: TimeInterval, worker: String, excludingApps: Set<String>) async throws -> [ClaimedJob] {
        guard limit > 0 else { return [] }
        let log = logger
        return try await transaction { conn in
            try await Self.promoteScheduled(conn, now: now, logger: log)
            // Heads another process is claiming are skipped, not waited for.
            let headRows = try await conn.rows("""
                SELECT * FROM jobs WHERE is_head AND state = 'queued' AND run_at <= $1 AND NOT (bundle_id = ANY($2::text[]))
                ORDER BY run_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED
                """, [.date(now), .texts(excludingApps.sorted()), .int(limit)], logger: log)
            var stamps: [Int64: (timestamp: Int64?, apnsID: String?)] = [:]
            var heads: [PushJob] = []
            for r in headRows {
                let j: PushJob
                do { j = try Self.job(r) } catch let bad as BadRow {
                    // A row no version of Isle wrote: failed, saying why, and its lane moves on.
                    let lane = try r.optionalString("lane")
                    if let lane { try await Self.lockLane(conn, lane, logger: log) }
                    try await conn.rows("UPDATE jobs SET state = 'failed', last_error = $1, claimed_by = NULL, claimed_until = NULL, is_head = false WHERE id = $2",
                                        [.text(bad.description), .int(try r.int("id"))], logger: log)
                    try await Self.fixHead(conn, lane, logger: log)
                    continue
                }
                heads.append(j)
                stamps[j.id] = (try r.optionalInt("push_timestamp"), try r.optionalString("apns_id"))
            }
            // A lane another process is changing (an enqueue, a completion) waits for the next round.
            let free = try await Self.tryLockLanes(conn, heads.compactMap(\.lane), logger: log)
            heads = heads.filter { $0.lane.map(free.contains) ?? true }
            // Lanes whose head could give way to newer content: decided over each lane's open jobs.
            let coalescing = heads.filter { j in j.lane != nil && LanePlanner.isSupersedable(kind: j.kind, hasAlert: j.hasAlert, aps: j.aps) }
            if !coalescing.isEmpty {
                let decided = try await Self.coalesce(conn, lanes: coalescing.map { $0.lane! }, now: now, logger: log)
                var replacements: [Int64] = []
                heads = heads.compactMap { j in
                    guard let lane = j.lane, let decision = decided[lane] else { return j }
                    guard let id = decision else { return nil }
                    if id != j.id { replacements.append(id) }
                    return j
                }
                if !replacements.isEmpty {
                    var byID: [Int64: PushJob] = [:]
                    for r in try await conn.rows("SELECT * FROM jobs WHERE id = ANY($1::bigint[])", [.ints(replacements)], logger: log) {
                        let j = try Self.job(r)
                        byID[j.id] = j
                        stamps[j.id] = (try r.optionalInt("push_timestamp"), try r.optionalString("apns_id"))
                    }
                    heads = heads.compactMap { j in
                        guard let lane = j.lane, let decision = decided[lane], let id = decision, id != j.id else { return j }
                        return byID[id]
                    }
                }
            }
            return try await Self.claimAll(conn, heads, stamps: stamps, now: now, lease: lease, worker: worker, logger: log)
        }
    }

    /// Tries each lane's lock without waiting; answers the lanes this transaction now holds.
    static func tryLockLanes(_ conn: PostgresConnection, _ lanes: [String], logger: Logger) async throws -> Set<String> {
        guard !lanes.isEmpty else { return [] }
        let keys = Array(Set(lanes.map(laneLock))).sorted()
        var held = Set<Int64>()
        for r in try await conn.rows("SELECT k, pg_try_advisory_xact_lock(1, k::int) AS ok FROM unnest($1::bigint[]) AS k", [.ints(keys)], logger: logger) where try r.bool("ok") {
            held.insert(try r.int("k"))
        }
        return Set(lanes.filter { held.contains(laneLock($0)) })
    }

    /// Stamps and claims the jobs: the first claim of a job fixes its `timestamp` (after the
    /// activity's or channel's last one) and its apns-id, which every retry keeps.
    static func claimAll(_ conn: PostgresConnection, _ jobs: [PushJob], stamps: [Int64: (timestamp: Int64?, apnsID: String?)], now: Date, lease: TimeInterval,
                         worker: String, logger log: Logger) async throws -> [ClaimedJob] {
        guard !jobs.isEmpty else { return [] }
        var activities: [String: ActivityRecord] = [:]
        let activityIDs = jobs.compactMap(\.activityID)
        if !activityIDs.isEmpty {
            for r in try await conn.rows("SELECT * FROM activities WHERE id = ANY($1::text[])", [.texts(activityIDs)], logger: log) {
                let a = try Self.activity(r, topics: [], payloads: false)
                activities[a.id] = a
            }
        }
        var channelLast: [String: Int64] = [:]
        let channelIDs = jobs.filter { $0.kind == .broadcast && stamps[$0.id]?.timestamp == nil }.compactMap(\.channelID)
        if !channelIDs.isEmpty {
            for r in try await conn.rows("SELECT id, last_timestamp FROM channels WHERE id = ANY($1::text[])", [.texts(channelIDs)], logger: log) {
                if let t = try r.optionalInt("last_timestamp") { channelLast[try r.string("id")] = t }
            }
        }
        var claimed: [ClaimedJob] = []
        var activityStamps: [String: Int64] = [:]
        var channelStamps: [String: Int64] = [:]
        for job in jobs {
            var j = job
            var activity = j.activityID.flatMap { activities[$0] }
            var timestamp = stamps[j.id]?.timestamp
            if timestamp == nil {
                let channel = j.kind == .broadcast ? j.channelID : nil
                let ts = ClaimedJob.firstTimestamp(now: now, afterActivity: activity?.lastTimestamp, afterChannel: channel.flatMap { channelLast[$0] })
                if let channel {
                    channelStamps[channel] = ts
                    channelLast[channel] = ts
                }
                if var act = activity {
                    act.lastTimestamp = ts
                    activityStamps[act.id] = ts
                    activities[act.id] = act
                    activity = act
                }
                timestamp = ts
            }
            j.markClaimed(by: worker, until: now.addingTimeInterval(lease))
            claimed.append(ClaimedJob(job: j, timestamp: timestamp!, apnsID: stamps[j.id]?.apnsID ?? ClaimedJob.newAPNsID(now: now), worker: worker, activity: activity))
        }
        // What planning needs besides the activity (ClaimReads), one statement each for the batch.
        let reads = claimed.map { ClaimReads($0.job, activity: $0.activity, now: now) }
        let wanted = reads.compactMap(\.installation)
        if !wanted.isEmpty {
            var installations: [String: InstallationRecord] = [:]
            for r in try await conn.rows("SELECT i.* FROM installations AS i JOIN unnest($1::text[], $2::text[]) AS w(b, id) ON i.bundle_id = w.b AND i.id = w.id",
                                         [.texts(wanted.map(\.bundleID)), .texts(wanted.map(\.id))], logger: log) {
                let i = try Self.installation(r)
                installations[i.bundleID + "\u{1F}" + i.id] = i
            }
            for (n, read) in reads.enumerated() { claimed[n].installation = read.installation.flatMap { installations[$0.bundleID + "\u{1F}" + $0.id] } }
        }
        let counted = reads.compactMap(\.highPriorityActivity)
        if !counted.isEmpty {
            var sends: [String: Int] = [:]
            for r in try await conn.rows("SELECT activity_id, COUNT(*) AS n FROM high_priority_sends WHERE activity_id = ANY($1::text[]) AND at >= $2 GROUP BY activity_id",
                                         [.texts(Array(Set(counted))), .date(now.addingTimeInterval(-3600))], logger: log) {
                sends[try r.string("activity_id")] = Int(try r.int("n"))
            }
            for (n, read) in reads.enumerated() { claimed[n].highPrioritySends = read.highPriorityActivity.flatMap { sends[$0] } ?? 0 }
        }
        if !activityStamps.isEmpty {
            try await conn.rows("UPDATE activities AS a SET last_timestamp = t.ts FROM unnest($1::text[], $2::bigint[]) AS t(id, ts) WHERE a.id = t.id",
                                [.texts(Array(activityStamps.keys)), .ints(Array(activityStamps.values))], logger: log)
        }
        if !channelStamps.isEmpty {
            try await conn.rows("UPDATE channels AS c SET last_timestamp = t.ts FROM unnest($1::text[], $2::bigint[]) AS t(id, ts) WHERE c.id = t.id",
                                [.texts(Array(channelStamps.keys)), .ints(Array(channelStamps.values))], logger: log)
        }
        try await conn.rows("""
            UPDATE jobs AS j SET state = 'claimed', claimed_by = $1, claimed_until = $2, attempts = j.attempts + 1, push_timestamp = t.ts, apns_id = t.apns
            FROM unnest($3::bigint[], $4::bigint[], $5::text[]) AS t(id, ts, apns) WHERE j.id = t.id
            """, [.text(worker), .date(now.addingTimeInterval(lease)), .ints(claimed.map(\.job.id)), .ints(claimed.map(\.timestamp)), .texts(claimed.map(\.apnsID))],
            logger: log)
        return claimed
    }

    static func promoteScheduled(_ conn: PostgresConnection, now: Date, logger: Logger) async throws {
        let due = try await conn.rows("""
            SELECT id, lane, carries_content FROM jobs WHERE state = 'scheduled' AND run_at <= $1 ORDER BY run_at, id LIMIT \(LanePlanner.promotionBatch) FOR UPDATE SKIP LOCKED
            """, [.date(now)], logger: logger)
        for r in due {
            let lane = try r.optionalString("lane")
            if let lane { guard try await tryLockLane(conn, lane, logger: logger) else { continue } }
            var head: LanePlanner.Head?
            if let lane { head = try await openHead(conn, lane, logger: logger) }
            let joined = try LanePlanner.join(lane: lane, carriesContent: r.bool("carries_content")) { _ in head }
            try await conn.rows("UPDATE jobs SET state = 'queued', seq = nextval('job_seq'), is_head = $1 WHERE id = $2", [.bool(joined.isHead), .int(try r.int("id"))], logger: logger)
            if joined.coalescesLane, let lane { try await coalesce(conn, lane: lane, now: now, logger: logger) }
        }
    }

    public func nextDue(after now: Date, excludingApps: Set<String>) async throws -> Date? {
        let log = logger
        let earliest = try await read { conn in
            try await conn.row("""
                SELECT MIN(t) AS t FROM (SELECT MIN(run_at) AS t FROM jobs WHERE is_head AND state = 'queued' AND NOT (bundle_id = ANY($1::text[]))
                    UNION ALL SELECT MIN(run_at) FROM jobs WHERE state = 'scheduled' AND NOT (bundle_id = ANY($1::text[]))) AS due
                """, [.texts(excludingApps.sorted())], logger: log)?.optionalDate("t")
        }
        return earliest
    }

    /// Results written while another batch commits wait and go together in the next transaction
    /// (``completions``): a handful of set-based statements per batch instead of about nine per push.
    public func complete(_ c: JobCompletion) async throws -> Bool {
        try await completions.submit(c) { batch in try await self.completeBatch(batch) }
    }

    /// One batch of results in one transaction. When it fails as a whole for a reason other than
    /// the database being away, each result is written alone, so one bad write loses no other.
    func completeBatch(_ cs: [JobCompletion]) async throws -> [Result<Bool, any Error>] {
        let log = logger
        do {
            return try await transaction { conn in try await Self.completeAll(conn, cs, logger: log).map { .success($0) } }
        } catch let e as StoreError where e.code == .unavailable {
            throw e
        } catch where cs.count > 1 {
            var out: [Result<Bool, any Error>] = []
            for c in cs {
                do { out.append(.success(try await transaction { conn in try await Self.completeAll(conn, [c], logger: log)[0] })) } catch { out.append(.failure(error)) }
            }
            return out
        }
    }

    /// Writes each verdict if its claim is still the worker's (same worker, same attempt); answers
    /// whether it was. Every lane of the batch is locked first, in one order.
    static func completeAll(_ conn: PostgresConnection, _ cs: [JobCompletion], logger log: Logger) async throws -> [Bool] {
        try await lockLanes(conn, cs.compactMap(\.claim.job.lane), logger: log)
        var tokens: [String: String] = [:]
        let dead = cs.compactMap { c -> String? in
            if case .deadToken = c.result { return c.claim.job.activityID }
            return nil
        }
        if !dead.isEmpty {
            for r in try await conn.rows("SELECT id, update_token FROM activities WHERE id = ANY($1::text[])", [.texts(dead)], logger: log) {
                if let t = try r.optionalString("update_token") { tokens[try r.string("id")] = t }
            }
        }
        let writes = cs.map { c in c.writes(currentToken: c.claim.job.activityID.flatMap { tokens[$0] }) }
        let none = "\u{1}"
        var finished: [Int] = []
        var retried: [Int] = []
        for (i, w) in writes.enumerated() {
            switch w.job {
            case .finish: finished.append(i)
            case .requeue: retried.append(i)
            }
        }
        func guardArgs(_ indices: [Int]) -> [PGArg] {
            [.ints(indices.map { cs[$0].claim.job.id }), .texts(indices.map { cs[$0].claim.worker }), .ints(indices.map { Int64(cs[$0].claim.job.attempts) })]
        }
        var written = Set<Int64>()
        if !finished.isEmpty {
            var states: [String] = [], reasons: [String] = []
            for i in finished {
                if case .finish(let state, let reason) = writes[i].job {
                    states.append(state.rawValue)
                    reasons.append(reason ?? none)
                }
            }
            for r in try await conn.rows("""
                UPDATE jobs AS j SET state = t.state, last_error = NULLIF(t.reason, E'\\x01'), claimed_by = NULL, claimed_until = NULL, is_head = FALSE
                FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::text[]) AS t(id, worker, attempts, state, reason)
                WHERE j.id = t.id AND j.state = 'claimed' AND j.claimed_by = t.worker AND j.attempts = t.attempts RETURNING j.id
                """, guardArgs(finished) + [.texts(states), .texts(reasons)], logger: log) { written.insert(try r.int("id")) }
            // The next job of each lane a finished job leaves becomes its head.
            let lanes = Array(Set(finished.filter { written.contains(cs[$0].claim.job.id) }.compactMap { cs[$0].claim.job.lane })).sorted()
            try await fixHeads(conn, lanes, logger: log)
        }
        if !retried.isEmpty {
            var ats: [Date] = [], reasons: [String] = []
            for i in retried {
                if case .requeue(let at, let reason) = writes[i].job {
                    ats.append(at)
                    reasons.append(reason)
                }
            }
            for r in try await conn.rows("""
                UPDATE jobs AS j SET state = 'queued', run_at = t.at, last_error = t.reason, claimed_by = NULL, claimed_until = NULL
                FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::timestamptz[], $5::text[]) AS t(id, worker, attempts, at, reason)
                WHERE j.id = t.id AND j.state = 'claimed' AND j.claimed_by = t.worker AND j.attempts = t.attempts RETURNING j.id
                """, guardArgs(retried) + [.dates(ats), .texts(reasons)], logger: log) { written.insert(try r.int("id")) }
        }
        let done = cs.indices.filter { written.contains(cs[$0].claim.job.id) }
        let deliveries = done.compactMap { i in writes[i].delivery.map { (record: $0, bundleID: cs[i].claim.job.bundleID) } }
        if !deliveries.isEmpty { try await insert(conn, deliveries, logger: log) }
        // What the pushes changed in their activities: content, relevance and stale date of every
        // activity job in one statement; ends, dead tokens and broadcasts' patches one by one (rare).
        // Content before ends, as ActivityLifecycle applies one patch: an end that carries the
        // final content-state stores it, then ends the activity.
        var contentPatches: [String: ActivityPatch] = [:]
        var stateChanges: [(column: String, id: String, patch: ActivityPatch)] = []
        for i in done {
            let job = cs[i].claim.job
            guard var p = writes[i].activity else { continue }
            if let id = job.activityID {
                if p.content != nil || p.relevanceScore != nil || p.setsStaleDate { contentPatches[id] = p }
                p.content = nil
                p.relevanceScore = nil
                p.setsStaleDate = false
                if p.end != nil || p.unreachable != nil { stateChanges.append(("id", id, p)) }
            } else if job.kind == .broadcast, let channel = job.channelID {
                stateChanges.append(("channel_id", channel, p))
            }
        }
        if !contentPatches.isEmpty { try await applyContent(conn, contentPatches, logger: log) }
        for change in stateChanges { try await apply(conn, change.patch, column: change.column, change.id, logger: log) }
        for i in done { if let p = writes[i].installation { try await apply(conn, p, logger: log) } }
        let budget = done.compactMap { i in writes[i].highPriorityAt.flatMap { at in cs[i].claim.job.activityID.map { ($0, at) } } }
        if !budget.isEmpty {
            try await conn.rows("INSERT INTO high_priority_sends (activity_id, at) SELECT * FROM unnest($1::text[], $2::timestamptz[])",
                                [.texts(budget.map(\.0)), .dates(budget.map(\.1))], logger: log)
        }
        if done.contains(where: { writes[$0].wakesNow }) { try await conn.rows("SELECT pg_notify($1, '')", [.text(Self.notifyChannel)], logger: log) }
        // Last, after the activities' writes: an activity's events are inserted in the order of its writes.
        try await insertEvents(conn, done.flatMap { Events.of(cs[$0], writes[$0]) }, logger: log)
        return cs.indices.map { written.contains(cs[$0].claim.job.id) }
    }

    /// Content, relevance and stale date of many activities in one statement (never of one that
    /// ended or was dismissed meanwhile).
    static func applyContent(_ conn: PostgresConnection, _ patches: [String: ActivityPatch], logger: Logger) async throws {
        let ids = Array(patches.keys)
        let ps = ids.map { patches[$0]! }
        try await conn.rows("""
            UPDATE activities AS a SET content = COALESCE(NULLIF(t.content, E'\\x01')::jsonb, a.content),
                relevance_score = CASE WHEN t.has_relevance THEN t.relevance ELSE a.relevance_score END,
                stale_date = CASE WHEN NOT t.sets_stale THEN a.stale_date WHEN t.has_stale THEN t.stale ELSE NULL END
            FROM unnest($1::text[], $2::text[], $3::bool[], $4::float8[], $5::bool[], $6::bool[], $7::timestamptz[])
                AS t(id, content, has_relevance, relevance, sets_stale, has_stale, stale)
            WHERE a.id = t.id AND a.state IN (\(ActivityLifecycle.pushChangesSQL))
            """, [.texts(ids), .texts(ps.map { $0.content?.jsonString ?? "\u{1}" }), .bools(ps.map { $0.relevanceScore != nil }), .doubles(ps.map { $0.relevanceScore ?? 0 }),
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

    static func apply(_ conn: PostgresConnection, _ p: InstallationPatch, logger: Logger) async throws {
        guard var i = try await conn.row("SELECT * FROM installations WHERE bundle_id = $1 AND id = $2 FOR UPDATE", [.text(p.bundleID), .text(p.installationID)],
                                         logger: logger).map(installation) else { return }
        if p.apply(to: &i) { try await writeInstallation(conn, i, logger: logger) }
    }

    static func insert(_ conn: PostgresConnection, _ records: [(record: DeliveryRecord, bundleID: String)], logger: Logger) async throws {
        let none = "\u{1}"
        let ds = records.map(\.record)
        try await conn.rows("""
            INSERT INTO deliveries (job_id, activity_id, apns_id, apns_unique_id, status, reason, latency_ms, priority, downgraded, at, bundle_id)
            SELECT j, NULLIF(a, E'\\x01'), NULLIF(i, E'\\x01'), NULLIF(u, E'\\x01'), s, NULLIF(r, E'\\x01'), l, p, d, t, b
            FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::float8[], $8::bigint[], $9::bool[], $10::timestamptz[], $11::text[])
                WITH ORDINALITY AS x(j, a, i, u, s, r, l, p, d, t, b, n)
            ORDER BY n
            """, [.ints(ds.map(\.jobID)), .texts(ds.map { $0.activityID ?? none }), .texts(ds.map { $0.apnsID ?? none }), .texts(ds.map { $0.apnsUniqueID ?? none }),
                  .ints(ds.map { Int64($0.status) }), .texts(ds.map { $0.reason ?? none }), .doubles(ds.map(\.latencyMS)), .ints(ds.map { Int64($0.priority.rawValue) }),
                  .bools(ds.map(\.downgraded)), .dates(ds.map(\.at)), .texts(records.map(\.bundleID))], logger: logger)
    }

    public func requeueExpiredClaims(now: Date, keeping: Set<Int64>) async throws -> Int {
        let log = logger
        return try await transaction { conn in
            try await conn.rows("""
                UPDATE jobs SET state = 'queued', claimed_by = NULL, claimed_until = NULL
                WHERE state = 'claimed' AND claimed_until < $1 AND NOT (id = ANY($2::bigint[])) RETURNING id
                """, [.date(now), .ints(keeping.sorted())], logger: log).count
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

    public func openJobs(bundleID: String, activityID: String?, limit: Int) async throws -> [PushJob] {
        let log = logger
        return try await read { conn in
            try await conn.rows("""
                SELECT * FROM jobs WHERE bundle_id = $1 AND ($2::text IS NULL OR activity_id = $2) AND state IN ('scheduled', 'queued', 'claimed') ORDER BY run_at, id LIMIT $3
                """, [.text(bundleID), .text(activityID), .int(max(0, limit))], logger: log).map(Self.job)
        }
    }

    public func cancelJob(id: Int64, bundleID: String, reason: String) async throws -> PushJob? {
        let log = logger
        return try await transaction { conn in
            guard let peek = try await conn.row("SELECT lane FROM jobs WHERE id = $1 AND bundle_id = $2", [.int(id), .text(bundleID)], logger: log) else { return nil }
            // The lane's lock first, as every change to a lane takes it.
            if let lane = try peek.optionalString("lane") { try await Self.lockLane(conn, lane, logger: log) }
            guard let job = try await conn.row("SELECT * FROM jobs WHERE id = $1 AND state IN ('scheduled', 'queued') FOR UPDATE", [.int(id)], logger: log).map(Self.job) else { return nil }
            try await conn.rows("UPDATE jobs SET state = 'dropped', last_error = $2, is_head = FALSE WHERE id = $1", [.int(id), .text(reason)], logger: log)
            try await Self.fixHead(conn, job.lane, logger: log)
            return job
        }
    }

    public func retryJobNow(id: Int64, bundleID: String, now: Date) async throws -> Bool {
        let log = logger
        return try await transaction { conn in
            guard try await conn.row("SELECT id FROM jobs WHERE id = $1 AND bundle_id = $2 AND state = 'queued'", [.int(id), .text(bundleID)], logger: log) != nil else { return false }
            try await conn.rows("UPDATE jobs SET run_at = $1 WHERE id = $2 AND state = 'queued' AND run_at > $1", [.date(now), .int(id)], logger: log)
            try await conn.rows("SELECT pg_notify($1, '')", [.text(Self.notifyChannel)], logger: log)
            return true
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
                let n = Int(try r.int("n"))
                // A state no version of Isle writes is an error naming it, not a row left out of the count.
                out[try BadRow.decode(try r.string("state"), as: PushJobState.self, table: "jobs", id: "\(n) rows", column: "state")] = n
            }
            return out
        }
    }
}
