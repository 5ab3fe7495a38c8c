public import Foundation
import GRDB
public import IsleCore

/// The embedded store: one SQLite file (WAL), one writer, plain-SQL migrations.
public final class SQLiteStore: IsleStore {
    let db: DatabaseQueue
    public let path: String

    /// Opens (creating if needed) the database file. Call ``migrate()`` before use.
    public init(path: String) throws {
        var config = Configuration()
        config.busyMode = .timeout(10)
        config.prepareDatabase { db in
            try db.execute(sql: "PRAGMA foreign_keys = ON")
        }
        self.path = path
        db = try DatabaseQueue(path: path, configuration: config)
        try db.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA journal_mode = WAL")
            try db.execute(sql: "PRAGMA synchronous = FULL")
        }
    }

    // MARK: Migrations (append-only, numbered)

    static let migrations: [String] = [
        """
        CREATE TABLE apps (bundle_id TEXT PRIMARY KEY, team_id TEXT NOT NULL, key_id TEXT NOT NULL, key_pem TEXT NOT NULL,
            frequent_updates INTEGER NOT NULL, schemas TEXT NOT NULL, created_at REAL NOT NULL);
        CREATE TABLE api_keys (id TEXT PRIMARY KEY, bundle_id TEXT NOT NULL REFERENCES apps(bundle_id), scope TEXT NOT NULL,
            secret_hash TEXT NOT NULL UNIQUE, created_at REAL NOT NULL, revoked_at REAL);
        CREATE TABLE installations (id TEXT PRIMARY KEY, bundle_id TEXT NOT NULL, user_id TEXT, push_to_start_tokens TEXT NOT NULL,
            widget_token TEXT, live_activities_enabled INTEGER NOT NULL, frequent_pushes_enabled INTEGER NOT NULL, updated_at REAL NOT NULL);
        CREATE INDEX installations_user ON installations(bundle_id, user_id);
        CREATE TABLE activities (id TEXT PRIMARY KEY, bundle_id TEXT NOT NULL, external_key TEXT, installation_id TEXT,
            attributes_type TEXT NOT NULL, attributes TEXT, content TEXT, state TEXT NOT NULL, update_token TEXT, channel_id TEXT,
            relevance_score REAL, stale_date REAL, started_at REAL NOT NULL, ended_at REAL, dismissed_at REAL, last_timestamp INTEGER,
            state_reason TEXT);
        CREATE INDEX activities_key ON activities(bundle_id, external_key);
        CREATE INDEX activities_token ON activities(update_token);
        CREATE TABLE activity_topics (activity_id TEXT NOT NULL REFERENCES activities(id), bundle_id TEXT NOT NULL, topic TEXT NOT NULL,
            PRIMARY KEY (activity_id, topic));
        CREATE INDEX activity_topics_lookup ON activity_topics(bundle_id, topic);
        CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, bundle_id TEXT NOT NULL, kind TEXT NOT NULL, activity_id TEXT,
            installation_id TEXT, aps TEXT NOT NULL, has_alert INTEGER NOT NULL, requested_priority INTEGER, run_at REAL NOT NULL,
            state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, claimed_by TEXT, claimed_until REAL, last_error TEXT,
            created_at REAL NOT NULL, push_timestamp INTEGER, apns_id TEXT);
        CREATE INDEX jobs_due ON jobs(state, run_at, id);
        CREATE INDEX jobs_activity ON jobs(activity_id, state);
        CREATE TABLE deliveries (id INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER NOT NULL, activity_id TEXT, apns_id TEXT,
            apns_unique_id TEXT, status INTEGER NOT NULL, reason TEXT, latency_ms REAL NOT NULL, priority INTEGER NOT NULL,
            downgraded INTEGER NOT NULL, at REAL NOT NULL);
        CREATE INDEX deliveries_activity ON deliveries(activity_id, id);
        CREATE INDEX deliveries_apns ON deliveries(apns_id);
        CREATE TABLE high_priority_sends (activity_id TEXT NOT NULL, at REAL NOT NULL);
        CREATE INDEX high_priority_sends_activity ON high_priority_sends(activity_id, at);
        CREATE TABLE idempotency (bundle_id TEXT NOT NULL, key TEXT NOT NULL, request_hash TEXT NOT NULL, status INTEGER NOT NULL,
            body TEXT NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (bundle_id, key));
        """,
        """
        ALTER TABLE jobs ADD COLUMN channel_id TEXT;
        CREATE TABLE channels (id TEXT PRIMARY KEY, bundle_id TEXT NOT NULL, storage_policy INTEGER NOT NULL, created_at REAL NOT NULL);
        CREATE INDEX channels_app ON channels(bundle_id);
        """,
        """
        ALTER TABLE channels ADD COLUMN last_timestamp INTEGER;
        CREATE INDEX jobs_channel ON jobs(channel_id, state);
        """,
    ]

    public func migrate() async throws {
        try await db.write { db in
            try db.execute(sql: "CREATE TABLE IF NOT EXISTS isle_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
            let done = try Int.fetchOne(db, sql: "SELECT COALESCE(MAX(version), 0) FROM isle_migrations") ?? 0
            for (i, sql) in Self.migrations.enumerated() where i + 1 > done {
                try db.execute(sql: sql)
                try db.execute(sql: "INSERT INTO isle_migrations (version, applied_at) VALUES (?, ?)", arguments: [i + 1, Date().timeIntervalSince1970])
            }
        }
    }

    // MARK: Apps and keys

    public func upsertApp(_ a: AppRecord) async throws {
        let schemas = JSONValue.array(a.schemas.map(\.jsonValue)).jsonString
        try await db.write { db in
            try db.execute(sql: """
                INSERT INTO apps (bundle_id, team_id, key_id, key_pem, frequent_updates, schemas, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT(bundle_id) DO UPDATE SET team_id = excluded.team_id, key_id = excluded.key_id, key_pem = excluded.key_pem,
                    frequent_updates = excluded.frequent_updates, schemas = excluded.schemas
                """, arguments: [a.bundleID, a.teamID, a.keyID, a.keyPEM, a.frequentUpdatesDeclared, schemas, a.createdAt.timeIntervalSince1970])
        }
    }

    public func app(_ bundleID: String) async throws -> AppRecord? {
        try await db.read { db in try Row.fetchOne(db, sql: "SELECT * FROM apps WHERE bundle_id = ?", arguments: [bundleID]).map(Self.app) }
    }

    public func apps() async throws -> [AppRecord] {
        try await db.read { db in try Row.fetchAll(db, sql: "SELECT * FROM apps ORDER BY bundle_id").map(Self.app) }
    }

    static func app(_ r: Row) -> AppRecord {
        let schemas = ((try? JSONParser.parse(r["schemas"] as String))?.arrayValue ?? []).compactMap { try? ActivitySchema(json: $0) }
        return AppRecord(bundleID: r["bundle_id"], teamID: r["team_id"], keyID: r["key_id"], keyPEM: r["key_pem"], frequentUpdatesDeclared: r["frequent_updates"],
                         schemas: schemas, createdAt: Date(timeIntervalSince1970: r["created_at"]))
    }

    public func insertAPIKey(_ k: APIKeyRecord) async throws {
        try await db.write { db in
            try db.execute(sql: "INSERT INTO api_keys (id, bundle_id, scope, secret_hash, created_at, revoked_at) VALUES (?, ?, ?, ?, ?, ?)",
                           arguments: [k.id, k.bundleID, k.scope.rawValue, k.secretHash, k.createdAt.timeIntervalSince1970, k.revokedAt?.timeIntervalSince1970])
        }
    }

    public func apiKey(secretHash: String) async throws -> APIKeyRecord? {
        try await db.read { db in
            try Row.fetchOne(db, sql: "SELECT * FROM api_keys WHERE secret_hash = ?", arguments: [secretHash]).map { r in
                APIKeyRecord(id: r["id"], bundleID: r["bundle_id"], scope: APIKeyScope(rawValue: r["scope"]) ?? .device, secretHash: r["secret_hash"],
                             createdAt: Date(timeIntervalSince1970: r["created_at"]), revokedAt: (r["revoked_at"] as Double?).map(Date.init(timeIntervalSince1970:)))
            }
        }
    }

    public func revokeAPIKey(id: String, at: Date) async throws -> Bool {
        try await db.write { db in
            try db.execute(sql: "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", arguments: [at.timeIntervalSince1970, id])
            return db.changesCount > 0
        }
    }

    // MARK: Installations

    public func upsertInstallation(_ i: InstallationRecord) async throws {
        let tokens = JSONValue.object(JSONObject(i.pushToStartTokens.sorted { $0.key < $1.key }.map { ($0.key, JSONValue.string($0.value)) })).jsonString
        try await db.write { db in
            try db.execute(sql: """
                INSERT INTO installations (id, bundle_id, user_id, push_to_start_tokens, widget_token, live_activities_enabled, frequent_pushes_enabled, updated_at)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT(id) DO UPDATE SET user_id = excluded.user_id, push_to_start_tokens = excluded.push_to_start_tokens,
                    widget_token = excluded.widget_token, live_activities_enabled = excluded.live_activities_enabled,
                    frequent_pushes_enabled = excluded.frequent_pushes_enabled, updated_at = excluded.updated_at
                """, arguments: [i.id, i.bundleID, i.userID, tokens, i.widgetToken, i.liveActivitiesEnabled, i.frequentPushesEnabled, i.updatedAt.timeIntervalSince1970])
        }
    }

    public func installation(id: String) async throws -> InstallationRecord? {
        try await db.read { db in try Row.fetchOne(db, sql: "SELECT * FROM installations WHERE id = ?", arguments: [id]).map(Self.installation) }
    }

    public func installations(bundleID: String, userID: String) async throws -> [InstallationRecord] {
        try await db.read { db in
            try Row.fetchAll(db, sql: "SELECT * FROM installations WHERE bundle_id = ? AND user_id = ? ORDER BY id", arguments: [bundleID, userID]).map(Self.installation)
        }
    }

    static func installation(_ r: Row) -> InstallationRecord {
        var tokens: [String: String] = [:]
        for (k, v) in (try? JSONParser.parse(r["push_to_start_tokens"] as String))?.objectValue ?? [:] { tokens[k] = v.stringValue }
        return InstallationRecord(id: r["id"], bundleID: r["bundle_id"], userID: r["user_id"], pushToStartTokens: tokens, widgetToken: r["widget_token"],
                                  liveActivitiesEnabled: r["live_activities_enabled"], frequentPushesEnabled: r["frequent_pushes_enabled"],
                                  updatedAt: Date(timeIntervalSince1970: r["updated_at"]))
    }

    // MARK: Activities

    static func activityArguments(_ a: ActivityRecord) -> StatementArguments {
        [a.id, a.bundleID, a.externalKey, a.installationID, a.attributesType, a.attributes?.jsonString, a.content?.jsonString, a.state.rawValue, a.updateToken,
         a.channelID, a.relevanceScore, a.staleDate?.timeIntervalSince1970, a.startedAt.timeIntervalSince1970, a.endedAt?.timeIntervalSince1970,
         a.dismissedAt?.timeIntervalSince1970, a.lastTimestamp, a.stateReason]
    }

    static let activityColumns = "id, bundle_id, external_key, installation_id, attributes_type, attributes, content, state, update_token, channel_id, relevance_score, stale_date, started_at, ended_at, dismissed_at, last_timestamp, state_reason"

    public func insertActivity(_ a: ActivityRecord) async throws {
        try await db.write { db in
            try db.execute(sql: "INSERT INTO activities (\(Self.activityColumns)) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", arguments: Self.activityArguments(a))
            try Self.writeTopics(db, a)
        }
    }

    public func updateActivity(_ a: ActivityRecord) async throws {
        try await db.write { db in try Self.update(db, a) }
    }

    static func update(_ db: Database, _ a: ActivityRecord) throws {
        var args = activityArguments(a)
        args += [a.id]
        try db.execute(sql: """
            UPDATE activities SET id = ?, bundle_id = ?, external_key = ?, installation_id = ?, attributes_type = ?, attributes = ?, content = ?, state = ?,
                update_token = ?, channel_id = ?, relevance_score = ?, stale_date = ?, started_at = ?, ended_at = ?, dismissed_at = ?, last_timestamp = ?,
                state_reason = ? WHERE id = ?
            """, arguments: args)
        if db.changesCount == 0 { throw StoreError(.notFound, "no activity \(a.id)") }
        try writeTopics(db, a)
    }

    static func writeTopics(_ db: Database, _ a: ActivityRecord) throws {
        try db.execute(sql: "DELETE FROM activity_topics WHERE activity_id = ?", arguments: [a.id])
        for topic in Set(a.topics) {
            try db.execute(sql: "INSERT INTO activity_topics (activity_id, bundle_id, topic) VALUES (?, ?, ?)", arguments: [a.id, a.bundleID, topic])
        }
    }

    public func activity(id: String) async throws -> ActivityRecord? {
        try await db.read { db in try Self.activity(db, where: "id = ?", [id]) }
    }

    public func activity(bundleID: String, externalKey: String) async throws -> ActivityRecord? {
        try await db.read { db in try Self.activity(db, where: "bundle_id = ? AND external_key = ? ORDER BY started_at DESC, rowid DESC", [bundleID, externalKey]) }
    }

    public func activity(updateToken: String) async throws -> ActivityRecord? {
        try await db.read { db in try Self.activity(db, where: "update_token = ?", [updateToken]) }
    }

    static func activity(_ db: Database, where clause: String, _ arguments: StatementArguments) throws -> ActivityRecord? {
        guard let row = try Row.fetchOne(db, sql: "SELECT * FROM activities WHERE \(clause) LIMIT 1", arguments: arguments) else { return nil }
        let topics = try String.fetchAll(db, sql: "SELECT topic FROM activity_topics WHERE activity_id = ? ORDER BY topic", arguments: [row["id"] as String])
        return activity(row, topics: topics)
    }

    static func activity(_ r: Row, topics: [String]) -> ActivityRecord {
        ActivityRecord(
            id: r["id"], bundleID: r["bundle_id"], externalKey: r["external_key"], installationID: r["installation_id"], attributesType: r["attributes_type"],
            attributes: (r["attributes"] as String?).flatMap { try? JSONParser.parse($0) }, content: (r["content"] as String?).flatMap { try? JSONParser.parse($0) },
            state: ActivityRecordState(rawValue: r["state"]) ?? .active, updateToken: r["update_token"], channelID: r["channel_id"], relevanceScore: r["relevance_score"],
            staleDate: (r["stale_date"] as Double?).map(Date.init(timeIntervalSince1970:)), startedAt: Date(timeIntervalSince1970: r["started_at"]),
            endedAt: (r["ended_at"] as Double?).map(Date.init(timeIntervalSince1970:)), dismissedAt: (r["dismissed_at"] as Double?).map(Date.init(timeIntervalSince1970:)),
            lastTimestamp: r["last_timestamp"], topics: topics, stateReason: r["state_reason"])
    }

    public func activities(bundleID: String, topic: String) async throws -> [ActivityRecord] {
        try await db.read { db in
            let rows = try Row.fetchAll(db, sql: """
                SELECT a.* FROM activities a JOIN activity_topics t ON t.activity_id = a.id
                WHERE t.bundle_id = ? AND t.topic = ? AND a.state IN ('active', 'starting') ORDER BY a.started_at, a.id
                """, arguments: [bundleID, topic])
            return rows.map { Self.activity($0, topics: [topic]) }
        }
    }

    // MARK: Queue

    public func enqueue(_ jobs: [NewPushJob], idempotency: IdempotencyRecord?) async throws -> [Int64] {
        try await db.write { db in
            var ids: [Int64] = []
            ids.reserveCapacity(jobs.count)
            let now = Date().timeIntervalSince1970
            let statement = try db.makeStatement(sql: """
                INSERT INTO jobs (bundle_id, kind, activity_id, installation_id, channel_id, aps, has_alert, requested_priority, run_at, state, created_at)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'queued', ?)
                """)
            for j in jobs {
                try statement.execute(arguments: [j.bundleID, j.kind.rawValue, j.activityID, j.installationID, j.channelID, j.aps.jsonString, j.hasAlert, j.requestedPriority,
                                                  j.runAt.timeIntervalSince1970, now])
                ids.append(db.lastInsertedRowID)
            }
            if let r = idempotency {
                try db.execute(sql: "INSERT INTO idempotency (bundle_id, key, request_hash, status, body, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                               arguments: [r.bundleID, r.key, r.requestHash, r.status, r.body, r.createdAt.timeIntervalSince1970])
            }
            return ids
        }
    }

    static func job(_ r: Row) -> PushJob {
        PushJob(id: r["id"], bundleID: r["bundle_id"], kind: PushJobKind(rawValue: r["kind"]) ?? .update, activityID: r["activity_id"], installationID: r["installation_id"],
                channelID: r["channel_id"],
                aps: (try? JSONParser.parse(r["aps"] as String)) ?? [:], hasAlert: r["has_alert"], requestedPriority: r["requested_priority"],
                runAt: Date(timeIntervalSince1970: r["run_at"]), state: PushJobState(rawValue: r["state"]) ?? .queued, attempts: r["attempts"],
                claimedBy: r["claimed_by"], claimedUntil: (r["claimed_until"] as Double?).map(Date.init(timeIntervalSince1970:)), lastError: r["last_error"],
                createdAt: Date(timeIntervalSince1970: r["created_at"]))
    }

    /// One transaction: pick due jobs in (run_at, id) order, at most one per activity (or per
    /// broadcast channel) and none for one that already has a job claimed; coalesce superseded
    /// content; fix each job's timestamp (strictly increasing per activity and per channel) and
    /// apns-id at its first claim.
    public func claim(limit: Int, now: Date, lease: TimeInterval, worker: String) async throws -> [ClaimedJob] {
        try await db.write { db in
            var busy = Set(try String.fetchAll(db, sql: "SELECT DISTINCT 'a:' || activity_id FROM jobs WHERE state = 'claimed' AND activity_id IS NOT NULL"))
            busy.formUnion(try String.fetchAll(db, sql: "SELECT DISTINCT 'c:' || channel_id FROM jobs WHERE state = 'claimed' AND kind = 'broadcast' AND channel_id IS NOT NULL"))
            let due = try Row.fetchAll(db, sql: "SELECT * FROM jobs WHERE state = 'queued' AND run_at <= ? ORDER BY run_at, id LIMIT ?",
                                       arguments: [now.timeIntervalSince1970, max(limit * 8, 512)]).map(Self.job)
            var perKey: [String: [PushJob]] = [:]
            var order: [String] = []
            var picked: [PushJob] = []
            for j in due {
                guard let key = Self.orderingKey(j) else {
                    if picked.count < limit { picked.append(j) }
                    continue
                }
                if busy.contains(key) { continue }
                if perKey[key] == nil { order.append(key) }
                perKey[key, default: []].append(j)
            }
            for key in order where picked.count < limit {
                var jobs = perKey[key]!
                // Coalesce: a plain update is superseded by any later update or end already due.
                while jobs.count > 1, Self.isPlainUpdate(jobs[0]), jobs.dropFirst().contains(where: Self.carriesContent) {
                    try db.execute(sql: "UPDATE jobs SET state = 'superseded', last_error = 'superseded by newer content before it was sent' WHERE id = ?", arguments: [jobs[0].id])
                    jobs.removeFirst()
                }
                picked.append(jobs[0])
            }
            var claimed: [ClaimedJob] = []
            for var j in picked {
                let row = try Row.fetchOne(db, sql: "SELECT push_timestamp, apns_id FROM jobs WHERE id = ?", arguments: [j.id])!
                var timestamp: Int64? = row["push_timestamp"]
                var apnsID: String? = row["apns_id"]
                var activity: ActivityRecord?
                if let a = j.activityID { activity = try Self.activity(db, where: "id = ?", [a]) }
                if timestamp == nil {
                    var ts = Int64(now.timeIntervalSince1970.rounded(.down))
                    if let last = activity?.lastTimestamp, ts <= last { ts = last + 1 }
                    if j.kind == .broadcast, let channel = j.channelID {
                        if let last = try Int64?.fetchOne(db, sql: "SELECT last_timestamp FROM channels WHERE id = ?", arguments: [channel]) ?? nil, ts <= last { ts = last + 1 }
                        try db.execute(sql: "UPDATE channels SET last_timestamp = ? WHERE id = ?", arguments: [ts, channel])
                    }
                    timestamp = ts
                    if var act = activity {
                        act.lastTimestamp = ts
                        try db.execute(sql: "UPDATE activities SET last_timestamp = ? WHERE id = ?", arguments: [ts, act.id])
                        activity = act
                    }
                }
                if apnsID == nil { apnsID = UUID().uuidString.lowercased() }
                try db.execute(sql: """
                    UPDATE jobs SET state = 'claimed', claimed_by = ?, claimed_until = ?, attempts = attempts + 1, push_timestamp = ?, apns_id = ? WHERE id = ?
                    """, arguments: [worker, now.timeIntervalSince1970 + lease, timestamp, apnsID, j.id])
                j.state = .claimed
                j.claimedBy = worker
                j.attempts += 1
                claimed.append(ClaimedJob(job: j, timestamp: timestamp!, apnsID: apnsID!, worker: worker, activity: activity))
            }
            return claimed
        }
    }

    /// Jobs with the same key go out one at a time, in order: an activity's pushes, or a
    /// broadcast channel's (the devices on it drop a push older than the last they applied).
    static func orderingKey(_ j: PushJob) -> String? {
        if let a = j.activityID { return "a:" + a }
        if j.kind == .broadcast, let c = j.channelID { return "c:" + c }
        return nil
    }

    static func isPlainUpdate(_ j: PushJob) -> Bool {
        !j.hasAlert && (j.kind == .update || (j.kind == .broadcast && j.aps["event"]?.stringValue == "update"))
    }

    static func carriesContent(_ j: PushJob) -> Bool { j.kind == .update || j.kind == .end || j.kind == .broadcast }

    public func finish(_ c: ClaimedJob, state: PushJobState, error: String?, delivery: DeliveryRecord?, activity: ActivityRecord?, highPriorityAt: Date?) async throws -> Bool {
        try await db.write { db in
            try db.execute(sql: "UPDATE jobs SET state = ?, last_error = ?, claimed_by = NULL, claimed_until = NULL WHERE id = ? AND state = 'claimed' AND claimed_by = ?",
                           arguments: [state.rawValue, error, c.job.id, c.worker])
            guard db.changesCount > 0 else { return false }
            if let d = delivery { try Self.insert(db, d) }
            if let a = activity { try Self.update(db, a) }
            if let at = highPriorityAt, let id = c.job.activityID {
                try db.execute(sql: "INSERT INTO high_priority_sends (activity_id, at) VALUES (?, ?)", arguments: [id, at.timeIntervalSince1970])
            }
            return true
        }
    }

    public func retry(_ c: ClaimedJob, runAt: Date, error: String, delivery: DeliveryRecord?) async throws -> Bool {
        try await db.write { db in
            try db.execute(sql: "UPDATE jobs SET state = 'queued', run_at = ?, last_error = ?, claimed_by = NULL, claimed_until = NULL WHERE id = ? AND state = 'claimed' AND claimed_by = ?",
                           arguments: [runAt.timeIntervalSince1970, error, c.job.id, c.worker])
            guard db.changesCount > 0 else { return false }
            if let d = delivery { try Self.insert(db, d) }
            return true
        }
    }

    static func insert(_ db: Database, _ d: DeliveryRecord) throws {
        try db.execute(sql: """
            INSERT INTO deliveries (job_id, activity_id, apns_id, apns_unique_id, status, reason, latency_ms, priority, downgraded, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """, arguments: [d.jobID, d.activityID, d.apnsID, d.apnsUniqueID, d.status, d.reason, d.latencyMS, d.priority, d.downgraded, d.at.timeIntervalSince1970])
    }

    public func requeueExpiredClaims(now: Date) async throws -> Int {
        try await db.write { db in
            try db.execute(sql: "UPDATE jobs SET state = 'queued', claimed_by = NULL, claimed_until = NULL WHERE state = 'claimed' AND claimed_until < ?", arguments: [now.timeIntervalSince1970])
            return db.changesCount
        }
    }

    public func job(id: Int64) async throws -> PushJob? {
        try await db.read { db in try Row.fetchOne(db, sql: "SELECT * FROM jobs WHERE id = ?", arguments: [id]).map(Self.job) }
    }

    public func jobCounts() async throws -> [PushJobState: Int] {
        try await db.read { db in
            var out: [PushJobState: Int] = [:]
            for r in try Row.fetchAll(db, sql: "SELECT state, COUNT(*) AS n FROM jobs GROUP BY state") {
                if let s = PushJobState(rawValue: r["state"]) { out[s] = r["n"] }
            }
            return out
        }
    }

    public func highPrioritySends(activityID: String, since: Date) async throws -> Int {
        try await db.read { db in
            try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM high_priority_sends WHERE activity_id = ? AND at >= ?", arguments: [activityID, since.timeIntervalSince1970]) ?? 0
        }
    }

    // MARK: Channels

    public func insertChannel(_ c: ChannelRecord) async throws {
        try await db.write { db in
            try db.execute(sql: "INSERT INTO channels (id, bundle_id, storage_policy, created_at) VALUES (?, ?, ?, ?)",
                           arguments: [c.id, c.bundleID, c.storagePolicy, c.createdAt.timeIntervalSince1970])
        }
    }

    static func channel(_ r: Row) -> ChannelRecord {
        ChannelRecord(id: r["id"], bundleID: r["bundle_id"], storagePolicy: r["storage_policy"], createdAt: Date(timeIntervalSince1970: r["created_at"]))
    }

    public func channels(bundleID: String) async throws -> [ChannelRecord] {
        try await db.read { db in try Row.fetchAll(db, sql: "SELECT * FROM channels WHERE bundle_id = ? ORDER BY created_at, id", arguments: [bundleID]).map(Self.channel) }
    }

    public func channel(id: String) async throws -> ChannelRecord? {
        try await db.read { db in try Row.fetchOne(db, sql: "SELECT * FROM channels WHERE id = ?", arguments: [id]).map(Self.channel) }
    }

    public func deleteChannel(id: String) async throws {
        try await db.write { db in try db.execute(sql: "DELETE FROM channels WHERE id = ?", arguments: [id]) }
    }

    // MARK: Reads

    static func delivery(_ r: Row) -> DeliveryRecord {
        DeliveryRecord(jobID: r["job_id"], activityID: r["activity_id"], apnsID: r["apns_id"], apnsUniqueID: r["apns_unique_id"], status: r["status"], reason: r["reason"],
                       latencyMS: r["latency_ms"], priority: r["priority"], downgraded: r["downgraded"], at: Date(timeIntervalSince1970: r["at"]))
    }

    public func deliveries(activityID: String) async throws -> [DeliveryRecord] {
        try await db.read { db in try Row.fetchAll(db, sql: "SELECT * FROM deliveries WHERE activity_id = ? ORDER BY id", arguments: [activityID]).map(Self.delivery) }
    }

    public func delivery(apnsID: String) async throws -> DeliveryRecord? {
        try await db.read { db in try Row.fetchOne(db, sql: "SELECT * FROM deliveries WHERE apns_id = ? ORDER BY id DESC LIMIT 1", arguments: [apnsID]).map(Self.delivery) }
    }

    public func idempotencyRecord(bundleID: String, key: String) async throws -> IdempotencyRecord? {
        try await db.read { db in
            try Row.fetchOne(db, sql: "SELECT * FROM idempotency WHERE bundle_id = ? AND key = ?", arguments: [bundleID, key]).map { r in
                IdempotencyRecord(key: r["key"], bundleID: r["bundle_id"], requestHash: r["request_hash"], status: r["status"], body: r["body"],
                                  createdAt: Date(timeIntervalSince1970: r["created_at"]))
            }
        }
    }

    public func saveIdempotencyRecord(_ r: IdempotencyRecord) async throws {
        try await db.write { db in
            try db.execute(sql: "INSERT OR IGNORE INTO idempotency (bundle_id, key, request_hash, status, body, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                           arguments: [r.bundleID, r.key, r.requestHash, r.status, r.body, r.createdAt.timeIntervalSince1970])
        }
    }
}
