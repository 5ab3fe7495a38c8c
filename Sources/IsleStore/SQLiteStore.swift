public import Foundation
import GRDB
public import Logging
public import IsleCore
public import IsleDelivery
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The embedded store: one SQLite file (WAL), readers beside one writer, plain-SQL migrations.
///
/// Writes go through ``GroupCommit``: requests that arrive together share one transaction (one
/// fsync with `synchronous=FULL`), each in its own savepoint; every caller returns only once its
/// transaction is committed. Reads run on the pool's readers, alongside the writer.
public final class SQLiteStore: IsleStore {
    let pool: DatabasePool
    let writer: GroupCommit
    /// Connections of their own for one-statement reads (``readOne(_:)``).
    let singleReads: SingleReadConnections
    /// A write of the database, started by `/ready` while writes fail, is under way (``ping()``).
    let writeProbe = Mutex<Bool>(false)
    public let path: String
    public let batches = QueueBatches()
    /// Failpoints for tests (``StoreFaults``); disarmed unless a test arms them.
    public let faults: StoreFaults

    /// Opens (creating if needed) the database file. Call ``migrate()`` before use.
    ///
    /// A new file is created readable by its owner only (0600); SQLite gives its `-wal` and `-shm`
    /// files the same mode. ``FilePermissions/problem(withDatabase:)`` says when an existing file
    /// is more open than that.
    /// `logger`: where a failing disk is said, once when writes start failing and once when they
    /// work again (`isle serve` passes its own; nil: only the errors say it).
    public init(path: String, faults: StoreFaults = StoreFaults(), logger: Logger? = nil) throws {
        self.faults = faults
        guard !path.isEmpty else { throw StoreError(.unavailable, "the database path is empty: give a file, e.g. ./isle.sqlite") }
        if !FileManager.default.fileExists(atPath: path) {
            let fd = open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
            guard fd >= 0 else { throw StoreError(.unavailable, "cannot create \(path): \(String(cString: strerror(errno)))") }
            close(fd)
        }
        var config = Configuration()
        config.busyMode = .timeout(10)
        // ``GroupCommit`` keeps a batch's transaction open across its writes' suspensions (only the
        // batch's leader uses the writer meanwhile).
        config.allowsUnsafeTransactions = true
        // Reads are synchronous (``readNow(_:)``): at least as many readers as threads that may read at once.
        config.maximumReaderCount = max(5, ProcessInfo.processInfo.activeProcessorCount * 2)
        config.prepareDatabase { db in
            try db.execute(sql: "PRAGMA foreign_keys = ON")
            try db.execute(sql: "PRAGMA synchronous = FULL")
            // Pages read through a memory map and a 16 MiB page cache per connection instead of a
            // pread per page missing from the default 2 MiB (docs/performance.md, "Split processes").
            try db.execute(sql: "PRAGMA cache_size = -16384")
            try db.execute(sql: "PRAGMA mmap_size = 268435456")
            db.trace(options: .statement) { event in StoreStatements.add(sql: "\(event)") }
        }
        self.path = path
        pool = try DatabasePool(path: path, configuration: config)
        writer = GroupCommit(pool: pool, faults: faults, logger: logger)
        var single = Configuration()
        single.busyMode = .timeout(10)
        single.prepareDatabase { db in
            try db.execute(sql: "PRAGMA query_only = 1")
            try db.execute(sql: "PRAGMA cache_size = -16384")
            try db.execute(sql: "PRAGMA mmap_size = 268435456")
            db.trace(options: .statement) { event in StoreStatements.add(sql: "\(event)") }
        }
        singleReads = SingleReadConnections(path: path, configuration: single, limit: config.maximumReaderCount)
    }

    /// A read on the calling thread (GRDB's synchronous `read`): no hop to a reader's dispatch
    /// queue and back, the two thread switches that dominated a read-only request's CPU
    /// (docs/performance.md, "Delivery core v3"). Every read of this store is synchronous, so a
    /// reader connection is never held across a suspension: the pool's readers (5) outnumber the
    /// threads that can read at once (Swift's cooperative pool and NIO's event loops), and a read
    /// waiting for one always gets it. (Mixing these with GRDB's async reads deadlocked: an async
    /// read gives its connection back only once its task runs again.)
    func readNow<T>(_ body: (Database) throws -> T) throws -> T { try pool.read(body) }

    /// A read of one statement, outside a transaction: a single `SELECT` sees one snapshot by
    /// itself (WAL), so the `BEGIN`/`COMMIT` around it (two statements of three) are saved. The
    /// hot reads of an accepted request (its key, app, activity and idempotency record) use it.
    func readOne<T>(_ body: (Database) throws -> T) throws -> T {
        try singleReads.read(body) ?? pool.unsafeRead(body)
    }

    // MARK: One serving process per file

    /// An exclusive `flock` on `<file>-lock`, held while serving (the kernel drops it when the
    /// process dies, so a crash never leaves the file locked).
    public func holdForServing() throws -> any ServingHold {
        let lockPath = path + "-lock"
        let fd = open(lockPath, O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw StoreError(.unavailable, "cannot open \(lockPath): \(String(cString: strerror(errno)))") }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            close(fd)
            throw StoreError(.conflict, "another isle serve is already using \(path); one process serves a SQLite file (several instances need PostgreSQL)")
        }
        return FileHold(fd: fd)
    }

    final class FileHold: ServingHold {
        private let fd: Mutex<Int32?>
        init(fd: Int32) { self.fd = Mutex(fd) }
        func release() {
            guard let fd = fd.withLock({ f -> Int32? in defer { f = nil }; return f }) else { return }
            flock(fd, LOCK_UN)
            close(fd)
        }
        deinit { release() }
    }

    // MARK: Migrations

    /// The steps that brought a database to its schema before ``Schema`` defined it, frozen: a
    /// database an earlier Isle made replays those it lacks, then ``Schema/changes``. A new
    /// database is created from ``Schema`` directly.
    static let frozenMigrations: [String] = [
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
        // Lanes: each activity's (and channel's) jobs in `seq` order, the first unfinished one
        // flagged as the lane's head; only heads are claimed. The flags are LanePlanner's rules,
        // computed in Swift for new jobs (and here, once, for the rows of older versions).
        """
        ALTER TABLE jobs ADD COLUMN lane TEXT;
        ALTER TABLE jobs ADD COLUMN seq INTEGER;
        ALTER TABLE jobs ADD COLUMN is_head INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE jobs ADD COLUMN supersedable INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE jobs ADD COLUMN carries_content INTEGER NOT NULL DEFAULT 0;
        UPDATE jobs SET lane = CASE WHEN activity_id IS NOT NULL THEN 'a:' || activity_id
                                    WHEN kind = 'broadcast' AND channel_id IS NOT NULL THEN 'c:' || channel_id END,
            supersedable = (has_alert = 0 AND (kind = 'update' OR (kind = 'broadcast' AND json_extract(aps, '$.event') = 'update'))),
            carries_content = (kind = 'update' OR (kind IN ('end', 'broadcast') AND json_extract(aps, '$."content-state"') IS NOT NULL)),
            seq = id;
        UPDATE jobs SET is_head = 1 WHERE state IN ('queued', 'claimed')
            AND (lane IS NULL OR id = (SELECT MIN(o.id) FROM jobs o WHERE o.lane = jobs.lane AND o.state IN ('queued', 'claimed')));
        CREATE INDEX jobs_ready ON jobs(run_at, seq) WHERE is_head = 1 AND state = 'queued';
        CREATE INDEX jobs_lane_open ON jobs(lane, seq) WHERE state IN ('queued', 'claimed');
        CREATE INDEX jobs_scheduled ON jobs(run_at, id) WHERE state = 'scheduled';
        CREATE INDEX jobs_claimed ON jobs(claimed_until) WHERE state = 'claimed';
        CREATE INDEX jobs_seq ON jobs(seq);
        DROP INDEX jobs_activity;
        DROP INDEX jobs_channel;
        CREATE INDEX activities_installation ON activities(installation_id);
        """,
        // Retention: the sweep prunes by age without scanning the tables.
        """
        CREATE INDEX jobs_finished ON jobs(created_at) WHERE state IN ('sent', 'failed', 'superseded', 'dropped');
        CREATE INDEX deliveries_at ON deliveries(at);
        CREATE INDEX high_priority_sends_at ON high_priority_sends(at);
        CREATE INDEX idempotency_created ON idempotency(created_at);
        """,
        // Installation secrets (the trust model, docs/security.md).
        """
        ALTER TABLE installations ADD COLUMN secret_hash TEXT;
        """,
        // The APNs environment of each installation's, activity's and channel's tokens (NULL: the
        // server's default).
        """
        ALTER TABLE installations ADD COLUMN environment TEXT;
        ALTER TABLE activities ADD COLUMN environment TEXT;
        ALTER TABLE channels ADD COLUMN environment TEXT;
        """,
        // Trust model v2 (docs/security.md): installation ids and token look-ups per app; the
        // app's registration-ticket keys; what retention needs to prune ended activities and
        // silent installations without a scan.
        """
        CREATE TABLE installations_v2 (id TEXT NOT NULL, bundle_id TEXT NOT NULL, user_id TEXT, push_to_start_tokens TEXT NOT NULL,
            widget_token TEXT, live_activities_enabled INTEGER NOT NULL, frequent_pushes_enabled INTEGER NOT NULL, updated_at REAL NOT NULL,
            secret_hash TEXT, environment TEXT, PRIMARY KEY (bundle_id, id));
        INSERT INTO installations_v2 (id, bundle_id, user_id, push_to_start_tokens, widget_token, live_activities_enabled, frequent_pushes_enabled, updated_at, secret_hash, environment)
            SELECT id, bundle_id, user_id, push_to_start_tokens, widget_token, live_activities_enabled, frequent_pushes_enabled, updated_at, secret_hash, environment FROM installations;
        DROP TABLE installations;
        ALTER TABLE installations_v2 RENAME TO installations;
        CREATE INDEX installations_user ON installations(bundle_id, user_id);
        CREATE INDEX installations_updated ON installations(updated_at);
        ALTER TABLE apps ADD COLUMN ticket_keys TEXT NOT NULL DEFAULT '[]';
        DROP INDEX activities_token;
        CREATE INDEX activities_token ON activities(bundle_id, update_token);
        DROP INDEX activities_installation;
        CREATE INDEX activities_installation ON activities(bundle_id, installation_id, state);
        CREATE INDEX activities_finished ON activities(started_at) WHERE state IN ('ended', 'dismissed', 'unreachable');
        """,
        // Delivery core v3: no query reads jobs by (state, run_at) any more (claims use jobs_ready,
        // promotion jobs_scheduled, the sweep jobs_claimed); the index only cost a write per change.
        """
        DROP INDEX jobs_due;
        """,
    ]

    /// Creates the schema (a new file) or brings an older one to it.
    public func migrate() async throws { try await migrate(replayingFrozenSteps: false) }

    /// The schema version this binary writes: the frozen steps, then ``Schema/changes``.
    static var schemaVersion: Int { frozenMigrations.count + Schema.changes.count }

    public func schemaCheck() async throws -> SchemaCheck {
        let current = try readNow { db -> Int in
            guard try db.tableExists("isle_migrations") else { return 0 }
            return try Int.fetchOne(db, sql: "SELECT COALESCE(MAX(version), 0) FROM isle_migrations") ?? 0
        }
        return SchemaCheck(current: current, known: Self.schemaVersion)
    }

    /// `replayingFrozenSteps`: build a new file as an earlier Isle would have, then bring it forward
    /// (the schema test compares that with a file created from the definition).
    /// `through`: stop at that version (a test builds the database an earlier release had).
    func migrate(replayingFrozenSteps: Bool, stoppingAfterFrozenSteps: Bool = false, through: Int? = nil) async throws {
        try await pool.write { db in
            try db.execute(sql: "CREATE TABLE IF NOT EXISTS isle_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
            let done = try Int.fetchOne(db, sql: "SELECT COALESCE(MAX(version), 0) FROM isle_migrations") ?? 0
            let frozen = Self.frozenMigrations.count
            try SchemaCheck(current: done, known: Self.schemaVersion).refuseNewer()
            func record(_ version: Int) throws {
                try db.execute(sql: "INSERT INTO isle_migrations (version, applied_at) VALUES (?, ?)", arguments: [version, Date().timeIntervalSince1970])
            }
            if done == 0, !replayingFrozenSteps {
                for statement in Schema.create(in: .sqlite) { try db.execute(sql: statement) }
                return try record(frozen + Schema.changes.count)
            }
            for (i, sql) in Self.frozenMigrations.enumerated() where i + 1 > done {
                try db.execute(sql: sql)
                try record(i + 1)
            }
            if stoppingAfterFrozenSteps { return }
            for (k, change) in Schema.changes.enumerated() where frozen + k + 1 > done && frozen + k + 1 <= (through ?? .max) {
                for statement in change.statements(.sqlite) { try db.execute(sql: statement) }
                try record(frozen + k + 1)
            }
        }
    }

    /// The schema as this file has it, one normalized line per column, key, reference and index
    /// (the schema test compares files built both ways, and each with ``Schema``).
    func schemaDescription() throws -> [String] {
        try readNow { db in
            var lines: [String] = []
            let tables = try String.fetchAll(db, sql: "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT IN ('sqlite_sequence', 'isle_migrations') ORDER BY name")
            for t in tables {
                for r in try Row.fetchAll(db, sql: "PRAGMA table_info(\(t))") {
                    let dflt: String? = r["dflt_value"]
                    lines.append("column \(t).\(r["name"] as String) \((r["type"] as String).uppercased()) notnull=\(r["notnull"] as Int) pk=\(r["pk"] as Int) default=\(dflt ?? "-")")
                }
                for r in try Row.fetchAll(db, sql: "PRAGMA foreign_key_list(\(t))") {
                    lines.append("reference \(t).\(r["from"] as String) -> \(r["table"] as String)(\(r["to"] as String))")
                }
                for r in try Row.fetchAll(db, sql: "PRAGMA index_list(\(t))") where (r["origin"] as String) == "u" {
                    let cols = try String.fetchAll(db, sql: "SELECT name FROM pragma_index_info(?) ORDER BY seqno", arguments: [r["name"] as String])
                    lines.append("unique \(t)(\(cols.joined(separator: ", ")))")
                }
            }
            for sql in try String.fetchAll(db, sql: "SELECT sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL") {
                lines.append("index " + sql.split(whereSeparator: \.isWhitespace).joined(separator: " "))
            }
            return lines.sorted()
        }
    }

    // MARK: Apps and keys

    /// Stores an app. Its key must be sealed (``MasterKey/seal(_:bundleID:)``): this store never
    /// writes a `.p8` key in clear.
    /// Seals every app key still stored in clear (a database from before keys were sealed).
    /// Returns the bundle ids it sealed.
    public func sealPlaintextKeys(with masterKey: MasterKey) async throws -> [String] {
        try await writer.write { db in
            var sealed: [String] = []
            for row in try Row.fetchAll(db, sql: "SELECT bundle_id, key_pem FROM apps") {
                let bundleID: String = row["bundle_id"]
                let pem: String = row["key_pem"]
                guard !MasterKey.isSealed(pem) else { continue }
                try db.execute(sql: "UPDATE apps SET key_pem = ? WHERE bundle_id = ?", arguments: [masterKey.seal(pem, bundleID: bundleID), bundleID])
                sealed.append(bundleID)
            }
            return sealed
        }
    }

    public func upsertApp(_ a: AppRecord) async throws {
        try MasterKey.refuseClear(a)
        let schemas = JSONValue.array(a.schemas.map(\.jsonValue)).jsonString
        try await writer.write { db in
            try db.execute(sql: """
                INSERT INTO apps (bundle_id, team_id, key_id, key_pem, frequent_updates, schemas, created_at, ticket_keys, environment_keys) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT(bundle_id) DO UPDATE SET team_id = excluded.team_id, key_id = excluded.key_id, key_pem = excluded.key_pem,
                    frequent_updates = excluded.frequent_updates, schemas = excluded.schemas, ticket_keys = excluded.ticket_keys, environment_keys = excluded.environment_keys
                """, arguments: [a.bundleID, a.teamID, a.keyID, a.keyPEM, a.frequentUpdatesDeclared, schemas, a.createdAt.timeIntervalSince1970, TicketKey.encode(a.ticketKeys),
                                 EnvironmentKey.encode(a.environmentKeys)])
        }
    }

    public func app(_ bundleID: String) async throws -> AppRecord? {
        try readOne { db in try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM apps WHERE bundle_id = ?"), arguments: [bundleID]).map(Self.app) }
    }

    public func appRowCounts(_ bundleID: String) async throws -> [String: Int] {
        try readNow { db in
            try Schema.appRows(in: .sqlite).reduce(into: [:]) { counts, rows in
                counts[rows.table] = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM \(rows.table) WHERE \(rows.condition)", arguments: [bundleID]) ?? 0
            }
        }
    }

    public func removeApp(_ bundleID: String) async throws -> [String: Int]? {
        try await writer.write { db in
            guard try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM apps WHERE bundle_id = ?", arguments: [bundleID]) == 1 else { return nil }
            var removed: [String: Int] = [:]
            for rows in Schema.appRows(in: .sqlite) {
                try db.execute(sql: "DELETE FROM \(rows.table) WHERE \(rows.condition)", arguments: [bundleID])
                removed[rows.table] = db.changesCount
            }
            return removed
        }
    }

    public func apps() async throws -> [AppRecord] {
        try readNow { db in try Row.fetchAll(db, sql: "SELECT * FROM apps ORDER BY bundle_id").map(Self.app) }
    }

    static func app(_ r: Row) throws -> AppRecord {
        let bundleID: String = r["bundle_id"]
        return AppRecord(bundleID: bundleID, teamID: r["team_id"], keyID: r["key_id"], keyPEM: r["key_pem"], frequentUpdatesDeclared: r["frequent_updates"],
                         schemas: try AppRecord.storedSchemas(r["schemas"], bundleID: bundleID), createdAt: Date(timeIntervalSince1970: r["created_at"]),
                         ticketKeys: try TicketKey.decode(r["ticket_keys"], bundleID: bundleID), environmentKeys: try EnvironmentKey.decode(r["environment_keys"], bundleID: bundleID))
    }

    public func insertAPIKey(_ k: APIKeyRecord) async throws {
        try await writer.write { db in
            try db.execute(sql: "INSERT INTO api_keys (id, bundle_id, scope, secret_hash, created_at, revoked_at) VALUES (?, ?, ?, ?, ?, ?)",
                           arguments: [k.id, k.bundleID, k.scope.rawValue, k.secretHash, k.createdAt.timeIntervalSince1970, k.revokedAt?.timeIntervalSince1970])
        }
    }

    public func apiKey(secretHash: String) async throws -> APIKeyRecord? {
        try readOne { db in
            try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM api_keys WHERE secret_hash = ?"), arguments: [secretHash]).map { r in
                APIKeyRecord(id: r["id"], bundleID: r["bundle_id"], scope: try BadRow.decode(r["scope"] as String, as: APIKeyScope.self, table: "api_keys", id: r["id"], column: "scope"), secretHash: r["secret_hash"],
                             createdAt: Date(timeIntervalSince1970: r["created_at"]), revokedAt: (r["revoked_at"] as Double?).map(Date.init(timeIntervalSince1970:)))
            }
        }
    }

    public func apiKeys(bundleID: String?) async throws -> [APIKeyRecord] {
        try readNow { db in
            try Row.fetchAll(db, sql: "SELECT * FROM api_keys WHERE ? IS NULL OR bundle_id = ? ORDER BY created_at, id", arguments: [bundleID, bundleID]).map { r in
                APIKeyRecord(id: r["id"], bundleID: r["bundle_id"], scope: try BadRow.decode(r["scope"] as String, as: APIKeyScope.self, table: "api_keys", id: r["id"], column: "scope"), secretHash: r["secret_hash"],
                             createdAt: Date(timeIntervalSince1970: r["created_at"]), revokedAt: (r["revoked_at"] as Double?).map(Date.init(timeIntervalSince1970:)))
            }
        }
    }

    public func revokeAPIKey(id: String, at: Date) async throws -> Bool {
        try await writer.write { db in
            try db.execute(sql: "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", arguments: [at.timeIntervalSince1970, id])
            return db.changesCount > 0
        }
    }

    // MARK: Installations

    public func upsertInstallation(_ i: InstallationRecord) async throws {
        try await writer.write { db in try Self.writeInstallation(db, i) }
    }

    static func writeInstallation(_ db: Database, _ i: InstallationRecord) throws {
        let tokens = JSONValue.object(JSONObject(i.pushToStartTokens.sorted { $0.key < $1.key }.map { ($0.key, JSONValue.string($0.value)) })).jsonString
        do {
            try db.execute(sql: """
                INSERT INTO installations (id, bundle_id, user_id, push_to_start_tokens, widget_token, live_activities_enabled, frequent_pushes_enabled, updated_at, secret_hash, environment,
                                           controls_token, broadcast_channels, topics)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT(bundle_id, id) DO UPDATE SET user_id = excluded.user_id, push_to_start_tokens = excluded.push_to_start_tokens,
                    widget_token = excluded.widget_token, live_activities_enabled = excluded.live_activities_enabled,
                    frequent_pushes_enabled = excluded.frequent_pushes_enabled, updated_at = excluded.updated_at, secret_hash = excluded.secret_hash,
                    environment = excluded.environment, controls_token = excluded.controls_token, broadcast_channels = excluded.broadcast_channels, topics = excluded.topics
                """, arguments: [i.id, i.bundleID, i.userID, tokens, i.widgetToken, i.liveActivitiesEnabled, i.frequentPushesEnabled, i.updatedAt.timeIntervalSince1970, i.secretHash,
                                 i.environment?.rawValue, i.controlsToken, i.broadcastChannels, Self.topicsJSON(i.topics)])
        }
    }

    public func modifyInstallation(bundleID: String, id: String, create: @escaping @Sendable () -> InstallationRecord,
                                   _ change: @escaping @Sendable (inout InstallationRecord) throws -> Void,
                                   idempotency: IdempotentAnswer<InstallationRecord>?) async throws -> InstallationRecord {
        return try await faults.registryWrite {
            try await writer.write { db in
                var i = try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM installations WHERE bundle_id = ? AND id = ?"), arguments: [bundleID, id]).map(Self.installation) ?? create()
                try change(&i)
                try Self.writeInstallation(db, i)
                if let idempotency { try Self.insertIdempotency(db, idempotency.record(for: i)) }
                return i
            }
        }
    }

    public func installation(bundleID: String, id: String) async throws -> InstallationRecord? {
        if faults.take(.installationMissing) { return nil }
        return try readOne { db in
            try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM installations WHERE bundle_id = ? AND id = ?"), arguments: [bundleID, id]).map(Self.installation)
        }
    }

    public func installations(bundleID: String, userID: String) async throws -> [InstallationRecord] {
        try readNow { db in
            try Row.fetchAll(db.cachedStatement(sql: "SELECT * FROM installations WHERE bundle_id = ? AND user_id = ? ORDER BY id"), arguments: [bundleID, userID]).map(Self.installation)
        }
    }

    static func installation(_ r: Row) throws -> InstallationRecord {
        let id: String = r["id"]
        let key = "\(r["bundle_id"] as String)/\(id)"
        return InstallationRecord(id: id, bundleID: r["bundle_id"], userID: r["user_id"],
                                  pushToStartTokens: try BadRow.stringMap(r["push_to_start_tokens"], table: "installations", id: key, column: "push_to_start_tokens"),
                                  widgetToken: r["widget_token"], liveActivitiesEnabled: r["live_activities_enabled"], frequentPushesEnabled: r["frequent_pushes_enabled"],
                                  updatedAt: Date(timeIntervalSince1970: r["updated_at"]), secretHash: r["secret_hash"],
                                  environment: try BadRow.decode(r["environment"] as String?, as: PushEnvironment.self, table: "installations", id: key, column: "environment"),
                                  controlsToken: r["controls_token"], broadcastChannels: r["broadcast_channels"],
                                  topics: try BadRow.strings(r["topics"], table: "installations", id: key, column: "topics"))
    }

    /// An installation's topics as stored: a JSON array, or NULL for none.
    static func topicsJSON(_ topics: [String]) -> String? { topics.isEmpty ? nil : JSONValue.array(topics.map(JSONValue.string)).jsonString }

    public func installations(bundleID: String, topic: String) async throws -> [InstallationRecord] {
        try readNow { db in
            try Row.fetchAll(db.cachedStatement(sql: """
                SELECT * FROM installations WHERE bundle_id = ? AND topics IS NOT NULL AND EXISTS (SELECT 1 FROM json_each(installations.topics) WHERE value = ?) ORDER BY id
                """), arguments: [bundleID, topic]).map(Self.installation)
        }
    }

    // MARK: Activities

    static func activityArguments(_ a: ActivityRecord) -> StatementArguments {
        [a.id, a.bundleID, a.externalKey, a.installationID, a.attributesType, a.attributes?.jsonString, a.content?.jsonString, a.state.rawValue, a.updateToken,
         a.channelID, a.relevanceScore, a.staleDate?.timeIntervalSince1970, a.startedAt.timeIntervalSince1970, a.endedAt?.timeIntervalSince1970,
         a.dismissedAt?.timeIntervalSince1970, a.lastTimestamp, a.stateReason, a.environment?.rawValue]
    }

    static let activityColumns = "id, bundle_id, external_key, installation_id, attributes_type, attributes, content, state, update_token, channel_id, relevance_score, stale_date, started_at, ended_at, dismissed_at, last_timestamp, state_reason, environment"

    public func insertActivity(_ a: ActivityRecord, idempotency: IdempotencyRecord?) async throws {
        try await faults.registryWrite {
            try await writer.write { db in
                if let key = a.externalKey,
                   let holder = try Self.activity(db, where: "bundle_id = ? AND external_key = ? AND state IN (\(ActivityLifecycle.pushChangesSQL)) AND (installation_id IS NULL OR installation_id IS NOT ?)",
                                                  [a.bundleID, key, a.installationID]) {
                    throw StoreError(.conflict, "\(key) is the key of live activity \(holder.id)")
                }
                try db.execute(sql: "INSERT INTO activities (\(Self.activityColumns)) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", arguments: Self.activityArguments(a))
                try Self.writeTopics(db, a)
                if let idempotency { try Self.insertIdempotency(db, idempotency) }
            }
        }
    }

    public func modifyActivity(id: String, _ change: @escaping @Sendable (inout ActivityRecord) throws -> Void,
                               idempotency: IdempotentAnswer<ActivityRecord>?, reportedBy: Events.Source?) async throws -> ActivityRecord? {
        return try await faults.registryWrite {
            try await writer.write { db in
                guard let old = try Self.activity(db, where: "id = ?", [id]) else { return nil }
                var a = old
                try change(&a)
                try Self.update(db, a)
                if let idempotency { try Self.insertIdempotency(db, idempotency.record(for: a)) }
                // After the activity's write: an activity's events are numbered in the order of its writes.
                if let reportedBy {
                    let user = try reportedBy.userID
                        ?? a.installationID.flatMap { try String.fetchOne(db, sql: "SELECT user_id FROM installations WHERE bundle_id = ? AND id = ?", arguments: [a.bundleID, $0]) }
                    try Self.insertEvents(db, Events.activityChanged(from: old, to: a, by: reportedBy, userID: user))
                }
                return a
            }
        }
    }

    public func linkStartedActivity(bundleID: String, externalKey: String, attributesType: String, installationID: String?, token: String, topics: [String],
                                    idempotency: IdempotentAnswer<ActivityRecord>?) async throws -> ActivityRecord? {
        try await writer.write { db in
            var clause = "bundle_id = ? AND external_key = ? AND attributes_type = ? AND state = 'starting'"
            var arguments: StatementArguments = [bundleID, externalKey, attributesType]
            if let installationID {
                clause += " AND installation_id = ?"
                arguments += [installationID]
            }
            // The newest start (IsleStore.linkStartedActivity says why).
            guard var a = try Self.activity(db, where: clause + " ORDER BY started_at DESC, rowid DESC", arguments) else { return nil }
            try ActivityLifecycle.apply(.startLinked(token: token, topics: topics), to: &a)
            try Self.update(db, a)
            if let idempotency { try Self.insertIdempotency(db, idempotency.record(for: a)) }
            return a
        }
    }

    public func findActivities(_ q: ActivityQuery) async throws -> [ActivityRecord] {
        try readNow { db in
            let rows = try Row.fetchAll(db.cachedStatement(sql: """
                SELECT * FROM activities WHERE bundle_id = ?1
                    AND (json_array_length(?2) = 0 OR state IN (SELECT value FROM json_each(?2)))
                    AND (?3 IS NULL OR substr(external_key, 1, length(?3)) = ?3)
                    AND (?4 IS NULL OR installation_id = ?4)
                    AND (?5 IS NULL OR installation_id IN (SELECT id FROM installations WHERE bundle_id = ?1 AND user_id = ?5))
                    AND (?6 IS NULL OR id IN (SELECT activity_id FROM activity_topics WHERE bundle_id = ?1 AND topic = ?6))
                    AND (?7 IS NULL OR started_at < ?7 OR (started_at = ?7 AND id < ?8))
                ORDER BY started_at DESC, id DESC LIMIT ?9
                """), arguments: [q.bundleID, SQLiteQueueTransaction.list(q.states.map { .string($0.rawValue) }), q.keyPrefix, q.installationID, q.userID, q.topic,
                                  q.after?.startedAt.timeIntervalSince1970, q.after?.id, max(0, q.limit)])
            guard !rows.isEmpty else { return [] }
            // The page's topics in one statement.
            var topics: [String: [String]] = [:]
            for t in try Row.fetchAll(db.cachedStatement(sql: "SELECT activity_id, topic FROM activity_topics WHERE activity_id IN (SELECT value FROM json_each(?)) ORDER BY topic"),
                                      arguments: [SQLiteQueueTransaction.list(rows.map { .string($0["id"] as String) })]) {
                topics[t["activity_id"], default: []].append(t["topic"])
            }
            return try rows.map { r in try Self.activity(r, topics: topics[r["id"] as String] ?? []) }
        }
    }

    public func liveActivities(bundleID: String, externalKey: String) async throws -> [ActivityRecord] {
        try readNow { db in
            let rows = try Row.fetchAll(db.cachedStatement(sql: """
                SELECT * FROM activities WHERE bundle_id = ? AND external_key = ? AND state IN (\(ActivityLifecycle.pushChangesSQL)) ORDER BY started_at, rowid
                """), arguments: [bundleID, externalKey])
            return try rows.map { r in
                try Self.activity(r, topics: try String.fetchAll(db.cachedStatement(sql: "SELECT topic FROM activity_topics WHERE activity_id = ? ORDER BY topic"), arguments: [r["id"] as String]))
            }
        }
    }

    static func update(_ db: Database, _ a: ActivityRecord) throws {
        var args = activityArguments(a)
        args += [a.id]
        try db.execute(sql: """
            UPDATE activities SET id = ?, bundle_id = ?, external_key = ?, installation_id = ?, attributes_type = ?, attributes = ?, content = ?, state = ?,
                update_token = ?, channel_id = ?, relevance_score = ?, stale_date = ?, started_at = ?, ended_at = ?, dismissed_at = ?, last_timestamp = ?,
                state_reason = ?, environment = ? WHERE id = ?
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
        if faults.take(.activityMissing) { return nil }
        return try readNow { db in try Self.activity(db, where: "id = ?", [id]) }
    }

    public func activityForPush(id: String) async throws -> ActivityRecord? {
        try readOne { db in
            try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM activities WHERE id = ?"), arguments: [id]).map { try Self.activity($0, topics: [], payloads: false) }
        }
    }

    public func activity(bundleID: String, externalKey: String) async throws -> ActivityRecord? {
        try readNow { db in try Self.activity(db, where: "bundle_id = ? AND external_key = ? ORDER BY started_at DESC, rowid DESC", [bundleID, externalKey]) }
    }

    public func activity(bundleID: String, updateToken: String) async throws -> ActivityRecord? {
        try readNow { db in try Self.activity(db, where: "bundle_id = ? AND update_token = ?", [bundleID, updateToken]) }
    }

    public func liveActivityCount(bundleID: String, installationID: String) async throws -> Int {
        try readNow { db in
            try Int.fetchOne(db.cachedStatement(sql: "SELECT COUNT(*) FROM activities WHERE bundle_id = ? AND installation_id = ? AND state IN (\(ActivityLifecycle.pushChangesSQL))"),
                             arguments: [bundleID, installationID]) ?? 0
        }
    }

    public func liveActivities(bundleID: String, installationID: String) async throws -> [ActivityRecord] {
        try readNow { db in
            let rows = try Row.fetchAll(db.cachedStatement(sql: "SELECT * FROM activities WHERE bundle_id = ? AND installation_id = ? AND state IN (\(ActivityLifecycle.pushChangesSQL)) ORDER BY started_at, id"),
                                        arguments: [bundleID, installationID])
            return try rows.map { r in
                try Self.activity(r, topics: try String.fetchAll(db.cachedStatement(sql: "SELECT topic FROM activity_topics WHERE activity_id = ? ORDER BY topic"), arguments: [r["id"] as String]))
            }
        }
    }

    static func activity(_ db: Database, where clause: String, _ arguments: StatementArguments) throws -> ActivityRecord? {
        guard let row = try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM activities WHERE \(clause) LIMIT 1"), arguments: arguments) else { return nil }
        let topics = try String.fetchAll(db.cachedStatement(sql: "SELECT topic FROM activity_topics WHERE activity_id = ? ORDER BY topic"), arguments: [row["id"] as String])
        return try activity(row, topics: topics)
    }

    /// An activity row; `payloads: false` leaves its attributes and content unparsed (nil): the
    /// claim plans from the rest, and parsing up to 8 KB of JSON per delivery was a tenth of its cost.
    static func activity(_ r: Row, topics: [String], payloads: Bool = true) throws -> ActivityRecord {
        let id: String = r["id"]
        return ActivityRecord(
            id: r["id"], bundleID: r["bundle_id"], externalKey: r["external_key"], installationID: r["installation_id"], attributesType: r["attributes_type"],
            attributes: payloads ? try (r["attributes"] as String?).map { try BadRow.json($0, table: "activities", id: id, column: "attributes") } : nil,
            content: payloads ? try (r["content"] as String?).map { try BadRow.json($0, table: "activities", id: id, column: "content") } : nil,
            state: try BadRow.decode(r["state"], as: ActivityRecordState.self, table: "activities", id: id, column: "state"), updateToken: r["update_token"], channelID: r["channel_id"], relevanceScore: r["relevance_score"],
            staleDate: (r["stale_date"] as Double?).map(Date.init(timeIntervalSince1970:)), startedAt: Date(timeIntervalSince1970: r["started_at"]),
            endedAt: (r["ended_at"] as Double?).map(Date.init(timeIntervalSince1970:)), dismissedAt: (r["dismissed_at"] as Double?).map(Date.init(timeIntervalSince1970:)),
            lastTimestamp: r["last_timestamp"], topics: topics, stateReason: r["state_reason"],
            environment: try BadRow.decode(r["environment"] as String?, as: PushEnvironment.self, table: "activities", id: id, column: "environment"))
    }

    public func activities(bundleID: String, topic: String) async throws -> [ActivityRecord] {
        try followers(bundleID: bundleID, topic: topic, payloads: true)
    }

    public func pushTargets(bundleID: String, topic: String) async throws -> [ActivityRecord] {
        try followers(bundleID: bundleID, topic: topic, payloads: false)
    }

    /// The topic's live followers, oldest first; with `payloads: false`, without attributes,
    /// content and topics (a fan-out uses none of them).
    func followers(bundleID: String, topic: String, payloads: Bool) throws -> [ActivityRecord] {
        try readNow { db in
            var out: [ActivityRecord] = []
            let cursor = try Row.fetchCursor(db.cachedStatement(sql: """
                SELECT a.* FROM activities a JOIN activity_topics t ON t.activity_id = a.id
                WHERE t.bundle_id = ? AND t.topic = ? AND a.state IN (\(ActivityLifecycle.pushChangesSQL)) ORDER BY a.started_at, a.id
                """), arguments: [bundleID, topic])
            while let r = try cursor.next() { out.append(try Self.activity(r, topics: payloads ? [topic] : [], payloads: payloads)) }
            return out
        }
    }

    static func insertActivity(_ db: Database, _ a: ActivityRecord) throws {
        try db.execute(sql: "INSERT INTO activities (\(activityColumns)) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", arguments: activityArguments(a))
        try writeTopics(db, a)
    }

    // MARK: Queue

    static func job(_ r: Row) throws -> PushJob {
        let id: Int64 = r["id"]
        let row = String(id)
        let aps: String = r["aps"]
        let kind = try BadRow.decode(r["kind"], as: PushJobKind.self, table: "jobs", id: row, column: "kind")
        let createdAt = Date(timeIntervalSince1970: r["created_at"])
        var job = PushJob(id: id, bundleID: r["bundle_id"], kind: kind,
                       activityID: r["activity_id"], installationID: r["installation_id"], channelID: r["channel_id"],
                       payload: try BadRow.payload(aps, kind: kind, acceptedAt: createdAt, id: row), encodedAPS: Array(aps.utf8), requestedPriority: try BadRow.decode(r["requested_priority"] as Int?, as: PushPriority.self, table: "jobs", id: row, column: "requested_priority"),
                       runAt: Date(timeIntervalSince1970: r["run_at"]), state: try BadRow.decode(r["state"], as: PushJobState.self, table: "jobs", id: row, column: "state"),
                       attempts: r["attempts"],
                       claimedBy: r["claimed_by"], claimedUntil: (r["claimed_until"] as Double?).map(Date.init(timeIntervalSince1970:)), lastError: r["last_error"],
                       createdAt: createdAt, lane: r["lane"], seq: r["seq"])
        job.traceParent = r["trace_parent"]
        job.apnsRequests = (r["apns_requests"] as Int?) ?? 0
        job.lastAnswer = (r["last_status"] as Int?).map { APNsAnswer(status: $0, reason: r["last_apns_reason"]) }
        return job
    }

    /// Writes only what the push changed; never reverts what the device reported since.
    static func apply(_ db: Database, _ p: ActivityPatch, column: String, _ id: String) throws {
        if p.content != nil || p.relevanceScore != nil || p.setsStaleDate {
            // A push to an activity the person dismissed (or that ended) changes nothing on the phone.
            try db.cachedStatement(sql: """
                UPDATE activities SET content = COALESCE(?, content), relevance_score = COALESCE(?, relevance_score),
                    stale_date = CASE WHEN ? THEN ? ELSE stale_date END
                WHERE \(column) = ? AND state IN (\(ActivityLifecycle.pushChangesSQL))
                """).execute(arguments: [p.content?.jsonString, p.relevanceScore, p.setsStaleDate, p.staleDate?.timeIntervalSince1970, id])
        }
        if let e = p.end {
            try db.cachedStatement(sql: """
                UPDATE activities SET state = 'ended', ended_at = COALESCE(ended_at, ?), dismissed_at = COALESCE(?, dismissed_at), state_reason = COALESCE(?, state_reason)
                WHERE \(column) = ? AND state IN (\(ActivityLifecycle.pushChangesSQL))
                """).execute(arguments: [e.at.timeIntervalSince1970, e.dismissAt?.timeIntervalSince1970, e.reason, id])
        }
        if let u = p.unreachable {
            try db.cachedStatement(sql: """
                UPDATE activities SET state = 'unreachable', state_reason = ? WHERE \(column) = ? AND state IN (\(ActivityLifecycle.pushChangesSQL)) AND (? IS NULL OR update_token = ?)
                """).execute(arguments: [u.reason, id, u.ifToken, u.ifToken])
        }
    }

    public func openJobs(bundleID: String, activityID: String?, limit: Int) async throws -> [PushJob] {
        try readNow { db in
            try Row.fetchAll(db.cachedStatement(sql: """
                SELECT * FROM jobs WHERE bundle_id = ? AND (? IS NULL OR activity_id = ?) AND state IN ('scheduled', 'queued', 'claimed') ORDER BY run_at, id LIMIT ?
                """), arguments: [bundleID, activityID, activityID, max(0, limit)]).map(Self.job)
        }
    }

    public func job(id: Int64) async throws -> PushJob? {
        try readNow { db in try Row.fetchOne(db.cachedStatement(sql: "SELECT * FROM jobs WHERE id = ?"), arguments: [id]).map(Self.job) }
    }

    public func failedJobs(activityID: String, limit: Int) async throws -> [PushJob] {
        try readNow { db in
            try Row.fetchAll(db.cachedStatement(sql: """
                SELECT * FROM jobs INDEXED BY jobs_failed WHERE activity_id = ? AND state = 'failed' ORDER BY created_at DESC, id DESC LIMIT ?
                """), arguments: [activityID, max(0, limit)]).map(Self.job)
        }
    }

    public func unsentJobs(activityID: String, limit: Int) async throws -> [PushJob] {
        try readNow { db in
            try Row.fetchAll(db.cachedStatement(sql: """
                SELECT * FROM jobs INDEXED BY jobs_unsent WHERE activity_id = ? AND state IN ('superseded', 'dropped') ORDER BY created_at DESC, id DESC LIMIT ?
                """), arguments: [activityID, max(0, limit)]).map(Self.job)
        }
    }

    public func unsentJobCounts(bundleID: String, since: Date) async throws -> [PushJobState: Int] {
        // The partial index's own condition, as written, and then the states counted: SQLite uses a
        // partial index only when the query states its condition.
        try readNow { db in
            var counts: [PushJobState: Int] = [:]
            for row in try Row.fetchAll(db.cachedStatement(sql: """
                SELECT state, COUNT(*) AS n FROM jobs INDEXED BY jobs_finished
                WHERE state IN ('sent', 'failed', 'superseded', 'dropped') AND state IN ('superseded', 'dropped') AND created_at >= ? AND bundle_id = ? GROUP BY state
                """), arguments: [since.timeIntervalSince1970, bundleID]) {
                if let state = PushJobState(rawValue: row["state"]) { counts[state] = row["n"] }
            }
            return counts
        }
    }

    public func openJobCounts() async throws -> [PushJobState: Int] {
        try readNow { db in
            let scheduled = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM jobs INDEXED BY jobs_scheduled WHERE state = 'scheduled'") ?? 0
            let open = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM jobs INDEXED BY jobs_lane_open WHERE state IN ('queued', 'claimed')") ?? 0
            let claimed = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM jobs INDEXED BY jobs_claimed WHERE state = 'claimed'") ?? 0
            return [.scheduled: scheduled, .queued: open - claimed, .claimed: claimed]
        }
    }

    /// Reads work, and writes do too: after a commit failed (a full disk, an I/O error), a small
    /// file beside the database is written and synced until that succeeds (docs/server.md, "A
    /// full disk"). `/ready` answers 503 meanwhile.
    public func ping() async throws {
        _ = try readNow { db in try Int.fetchOne(db, sql: "SELECT 1") }
        guard let failure = writer.lastFailure else { return }
        // A file beside the database first (cheap, and it needs no lock); then a real write of
        // the database itself, a page into its log: free space can come and go by a few pages
        // while the database still cannot commit, and only its own write says it can.
        // The write runs on its own, so `/ready` never waits behind the writer: it answers not
        // ready now, and ready at a later look once that write committed (which clears the failure).
        if !faults.take(.diskProbe), Self.diskTakesWrites(beside: path), writeProbe.withLock({ busy in defer { busy = true }; return !busy }) {
            Task { [self] in
                _ = try? await writer.write { db in try db.execute(sql: "PRAGMA user_version = 0") }
                writeProbe.withLock { $0 = false }
            }
        }
        throw StoreError(.unavailable, "writes to the database fail (\(failure)); is its disk full?", alreadyLogged: true)
    }

    /// Writes and syncs 16 KiB in a file beside `path`, then removes it.
    static func diskTakesWrites(beside path: String) -> Bool {
        let probe = path + "-isle-probe"
        let fd = open(probe, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return false }
        defer {
            close(fd)
            unlink(probe)
        }
        let bytes = [UInt8](repeating: 0, count: 16_384)
        let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        return written == bytes.count && fsync(fd) == 0
    }

    public func jobCounts() async throws -> [PushJobState: Int] {
        try readNow { db in
            var out: [PushJobState: Int] = [:]
            for r in try Row.fetchAll(db, sql: "SELECT state, COUNT(*) AS n FROM jobs GROUP BY state") {
                let n: Int = r["n"]
                // A state no version of Isle writes is an error naming it, not a row left out of the count.
                out[try BadRow.decode(r["state"] as String, as: PushJobState.self, table: "jobs", id: "\(n) rows", column: "state")] = n
            }
            return out
        }
    }

    public func highPrioritySends(activityID: String, since: Date) async throws -> Int {
        try readNow { db in
            try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM high_priority_sends WHERE activity_id = ? AND at >= ?", arguments: [activityID, since.timeIntervalSince1970]) ?? 0
        }
    }

    // MARK: Copying (`isle db copy`)

    /// A consistent copy of the whole database in a new file at `path` (0600), written beside it
    /// and named only once complete (``writeBackup(to:check:beforeNaming:)``): never a partial file
    /// under that name.
    public func backup(to path: String) async throws {
        _ = try writeBackup(to: path, check: false)
    }

    /// Every row of `table` (one of ``DataCopy/tables``), as stored.
    /// The columns of a copied table as migrated here.
    public func columns(of table: String) async throws -> [DataCopy.Column] {
        guard DataCopy.tables.contains(table) else { throw StoreError(.notFound, "no table \(table)") }
        return try readNow { db in
            try db.columns(in: table).map { DataCopy.Column(name: $0.name, type: $0.type.uppercased(), nullable: !$0.isNotNull && $0.primaryKeyIndex == 0) }
        }
    }

    public func exportTable(_ table: String) async throws -> DataCopy.Table {
        guard DataCopy.tables.contains(table) else { throw StoreError(.notFound, "no table \(table) to copy") }
        return try readNow { db in
            let columns = try db.columns(in: table).map(\.name)
            let rows = try Row.fetchAll(db, sql: "SELECT \(columns.map { "\"\($0)\"" }.joined(separator: ", ")) FROM \(table) ORDER BY rowid")
            return DataCopy.Table(name: table, columns: columns, rows: rows.map { r in
                columns.indices.map { i -> DataCopy.Value in
                    switch r[i] as DatabaseValue {
                    case let v where v.isNull: .null
                    case let v: switch v.storage {
                        case .int64(let n): .int(n)
                        case .double(let d): .double(d)
                        case .string(let t): .text(t)
                        case .blob(let b): .text(String(decoding: b, as: UTF8.self))
                        case .null: .null
                        }
                    }
                }
            })
        }
    }

    // MARK: Channels

    public func insertChannel(_ c: ChannelRecord, idempotency: IdempotencyRecord?) async throws {
        try await writer.write { db in
            try db.execute(sql: "INSERT INTO channels (id, bundle_id, storage_policy, created_at, environment) VALUES (?, ?, ?, ?, ?)",
                           arguments: [c.id, c.bundleID, c.storagePolicy, c.createdAt.timeIntervalSince1970, c.environment?.rawValue])
            if let idempotency { try Self.insertIdempotency(db, idempotency) }
        }
    }

    static func channel(_ r: Row) throws -> ChannelRecord {
        ChannelRecord(id: r["id"], bundleID: r["bundle_id"], storagePolicy: r["storage_policy"], createdAt: Date(timeIntervalSince1970: r["created_at"]),
                      environment: try BadRow.decode(r["environment"] as String?, as: PushEnvironment.self, table: "channels", id: r["id"], column: "environment"))
    }

    public func channels(bundleID: String) async throws -> [ChannelRecord] {
        try readNow { db in try Row.fetchAll(db, sql: "SELECT * FROM channels WHERE bundle_id = ? ORDER BY created_at, id", arguments: [bundleID]).map(Self.channel) }
    }

    public func channel(id: String) async throws -> ChannelRecord? {
        try readNow { db in try Row.fetchOne(db, sql: "SELECT * FROM channels WHERE id = ?", arguments: [id]).map(Self.channel) }
    }

    public func deleteChannel(id: String, idempotency: IdempotencyRecord?) async throws {
        try await writer.write { db in
            try db.execute(sql: "DELETE FROM channels WHERE id = ?", arguments: [id])
            if let idempotency { try Self.insertIdempotency(db, idempotency) }
        }
    }

    // MARK: Reads

    static func delivery(_ r: Row) throws -> DeliveryRecord {
        var d = DeliveryRecord(jobID: r["job_id"], activityID: r["activity_id"], apnsID: (r["apns_id"] as String?).flatMap { APNsID($0) }, apnsUniqueID: r["apns_unique_id"], status: r["status"], reason: r["reason"],
                       latencyMS: r["latency_ms"], priority: try BadRow.decode(r["priority"] as Int, as: PushPriority.self, table: "deliveries", id: "\(r["id"] as Int64)", column: "priority"), downgraded: r["downgraded"], at: Date(timeIntervalSince1970: r["at"]))
        d.id = r["id"]
        d.deviceNote = r["device_note"]
        return d
    }

    public func deliveries(activityID: String, before: Int64?, limit: Int) async throws -> [DeliveryRecord] {
        try readNow { db in
            try Row.fetchAll(db, sql: "SELECT * FROM deliveries INDEXED BY deliveries_activity WHERE activity_id = ? AND id < ? ORDER BY id DESC LIMIT ?",
                             arguments: [activityID, before ?? Int64.max, limit]).map(Self.delivery).reversed()
        }
    }

    public func deliveries(activityID: String) async throws -> [DeliveryRecord] {
        try readNow { db in try Row.fetchAll(db, sql: "SELECT * FROM deliveries WHERE activity_id = ? ORDER BY id", arguments: [activityID]).map(Self.delivery) }
    }

    public func delivery(apnsID: APNsID) async throws -> DeliveryRecord? {
        try readNow { db in try Row.fetchOne(db, sql: "SELECT * FROM deliveries WHERE apns_id = ? ORDER BY id DESC LIMIT 1", arguments: [apnsID.text]).map(Self.delivery) }
    }

    public func idempotencyRecord(bundleID: String, key: String) async throws -> IdempotencyRecord? {
        try readOne { db in
            try Row.fetchOne(db, sql: "SELECT * FROM idempotency WHERE bundle_id = ? AND key = ?", arguments: [bundleID, key]).map { r in
                IdempotencyRecord(key: r["key"], bundleID: r["bundle_id"], requestHash: r["request_hash"], status: r["status"], body: r["body"],
                                  createdAt: Date(timeIntervalSince1970: r["created_at"]))
            }
        }
    }

    public func prune(now: Date, retention: Retention, limit: Int) async throws -> Int {
        try faults.check(.prune)
        let t = now.timeIntervalSince1970
        return try await writer.write { db in
            try db.execute(sql: """
                DELETE FROM jobs WHERE id IN (SELECT id FROM jobs INDEXED BY jobs_finished
                    WHERE state IN ('sent', 'failed', 'superseded', 'dropped') AND created_at < ? LIMIT ?)
                """, arguments: [t - retention.finishedJobs, limit])
            var n = db.changesCount
            try db.execute(sql: "DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries WHERE at < ? LIMIT ?)", arguments: [t - retention.deliveries, limit])
            n += db.changesCount
            try db.execute(sql: "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE at < ? AND seq < (SELECT MAX(seq) FROM events) LIMIT ?)", arguments: [t - retention.events, limit])
            n += db.changesCount
            try db.execute(sql: "DELETE FROM history WHERE rowid IN (SELECT rowid FROM history WHERE minute < ? LIMIT ?)", arguments: [t - retention.history, limit])
            n += db.changesCount
            try db.execute(sql: "DELETE FROM high_priority_sends WHERE rowid IN (SELECT rowid FROM high_priority_sends WHERE at < ? LIMIT ?)",
                           arguments: [t - retention.highPrioritySends, limit])
            n += db.changesCount
            try db.execute(sql: "DELETE FROM idempotency WHERE rowid IN (SELECT rowid FROM idempotency WHERE created_at < ? LIMIT ?)",
                           arguments: [t - IdempotencyRecord.lifetime, limit])
            n += db.changesCount
            // An activity lives at most 12 hours, so its start dates its end within retention's grain.
            let ended = try String.fetchAll(db, sql: """
                SELECT id FROM activities INDEXED BY activities_finished WHERE state IN ('ended', 'dismissed', 'unreachable') AND started_at < ? LIMIT ?
                """, arguments: [t - retention.endedActivities, limit])
            for id in ended {
                try db.execute(sql: "DELETE FROM activity_topics WHERE activity_id = ?", arguments: [id])
                try db.execute(sql: "DELETE FROM activities WHERE id = ?", arguments: [id])
                n += 1
            }
            try db.execute(sql: """
                DELETE FROM installations WHERE rowid IN (SELECT i.rowid FROM installations i INDEXED BY installations_updated WHERE i.updated_at < ?
                    AND NOT EXISTS (SELECT 1 FROM activities a WHERE a.bundle_id = i.bundle_id AND a.installation_id = i.id AND a.state IN (\(ActivityLifecycle.pushChangesSQL))) LIMIT ?)
                """, arguments: [t - retention.staleInstallations, limit])
            n += db.changesCount
            // Registrations that never became useful (docs/security.md, "Retention"): live
            // activities nothing was pushed to, long past any phone's 12 hours…
            let unpushed = try String.fetchAll(db, sql: """
                SELECT id FROM activities INDEXED BY activities_unpushed WHERE last_timestamp IS NULL AND state IN ('starting', 'active') AND started_at < ? LIMIT ?
                """, arguments: [t - retention.unusedActivities, limit])
            for id in unpushed {
                try db.execute(sql: "DELETE FROM activity_topics WHERE activity_id = ?", arguments: [id])
                try db.execute(sql: "DELETE FROM activities WHERE id = ?", arguments: [id])
                n += 1
            }
            // …and installations with no user and no activity that stopped reporting.
            try db.execute(sql: """
                DELETE FROM installations WHERE rowid IN (SELECT i.rowid FROM installations i INDEXED BY installations_updated WHERE i.updated_at < ? AND i.user_id IS NULL
                    AND NOT EXISTS (SELECT 1 FROM activities a WHERE a.bundle_id = i.bundle_id AND a.installation_id = i.id) LIMIT ?)
                """, arguments: [t - retention.unusedInstallations, limit])
            n += db.changesCount
            return n
        }
    }

    /// Stores an idempotent answer in the caller's transaction. A record past its lifetime frees
    /// its key; a live one means another request with this key committed first.
    static func insertIdempotency(_ db: Database, _ r: IdempotencyRecord) throws {
        try db.cachedStatement(sql: "DELETE FROM idempotency WHERE bundle_id = ? AND key = ? AND created_at < ?")
            .execute(arguments: [r.bundleID, r.key, r.createdAt.timeIntervalSince1970 - IdempotencyRecord.lifetime])
        do {
            try db.cachedStatement(sql: "INSERT INTO idempotency (bundle_id, key, request_hash, status, body, created_at) VALUES (?, ?, ?, ?, ?, ?)")
                .execute(arguments: [r.bundleID, r.key, r.requestHash, r.status, r.body, r.createdAt.timeIntervalSince1970])
        } catch let error as DatabaseError where error.resultCode == .SQLITE_CONSTRAINT {
            throw StoreError(.idempotencyKeyTaken, "another request with this Idempotency-Key was accepted first")
        }
    }
}
