public import Foundation
public import IsleCore
public import IsleDelivery
public import Logging
import NIOSSL
import PostgresNIO
import Synchronization

/// The shared store: one PostgreSQL database, any number of `isle serve` processes.
///
/// The same contract as ``SQLiteStore`` (the contract suite runs on both), kept across processes:
/// - every change to a lane (an activity's or channel's jobs) takes that lane's advisory lock in its
///   transaction, so lane order, heads and coalescing are decided by one process at a time;
/// - claims take lane heads `FOR UPDATE SKIP LOCKED` and skip a lane another process is changing,
///   so no two processes ever hold jobs of one lane; a head waiting for its retry still blocks its lane;
/// - a claim's lease names its worker (process); any live process's sweep takes back claims whose
///   lease ran out, so a dead process's work comes back;
/// - migrations run under an advisory lock, so instances that start together migrate once;
/// - a commit that queues work sends `NOTIFY isle_jobs`; engines listening wake at once (polling
///   stays as the fallback).
///
/// Run it inside ``withRunning(_:)`` (the connection pool lives for that scope).
public final class PostgresStore: IsleStore {
    public let settings: PostgresSettings
    /// The connection pool (replaced when PostgreSQL comes back, ``PostgresPools``).
    let pools: PostgresPools
    var client: PostgresClient { pools.client }
    /// Whether PostgreSQL answers (``PostgresAvailability``): while it does not, calls fail at once.
    let availability: PostgresAvailability
    let logger: Logger
    /// The deadline of every call in flight (``bounded(_:)``).
    let deadlines = CallDeadlines()
    /// API requests' jobs and delivery results, group-committed (``QueueBackedStore``).
    public let batches = QueueBatches()
    /// Failpoints for tests (``StoreFaults``); disarmed unless a test arms them.
    public let faults: StoreFaults
    /// Accepting requests' activity reads, batched (see ``activityForPush(id:)``).
    let pushReads = Batcher<String, ActivityRecord?>(maximumBatch: 256)
    static let notifyChannel = "isle_jobs"
    /// An advisory lock key for migrations ("isle" in ASCII).
    static let migrationLock: Int64 = 0x6973_6C65

    public init(settings: PostgresSettings, logger: Logger, faults: StoreFaults = StoreFaults()) {
        self.faults = faults
        self.settings = settings
        self.logger = logger
        var c = PostgresClient.Configuration(host: settings.host, port: settings.port, username: settings.username, password: settings.password, database: settings.database,
                                             tls: Self.tls(settings.tls))
        c.options.maximumConnections = settings.poolSize
        c.options.connectTimeout = .seconds(5)
        // Prepared statements (PreparedStatements.swift) skip the parse; each execution is still
        // planned for its own arrays: a generic plan guesses ten elements per `unnest`/`ANY`, and
        // cost more PostgreSQL CPU per update than planning each time (docs/performance.md).
        c.options.additionalStartupParameters = [("statement_timeout", "\(settings.statementTimeout * 1000)"), ("application_name", "isle"),
                                                 ("plan_cache_mode", "force_custom_plan")]
        let configuration = c
        pools = PostgresPools { PostgresClient(configuration: configuration, backgroundLogger: logger) }
        availability = PostgresAvailability(logger: logger)
    }

    public convenience init(url: String, logger: Logger) throws {
        self.init(settings: try PostgresSettings(url: url), logger: logger)
    }

    /// Connects once, outside the pool: a refused password (`28P01`), user or authorization
    /// (`28000`) or an unknown database (`3D000`) will not get better by retrying, so it fails now
    /// with its own message — the pool would retry until a call's deadline and say only that
    /// PostgreSQL did not answer. A server that cannot be reached yet is left to the pool (it
    /// retries, as after a PostgreSQL restart).
    public func checkCredentials() async throws {
        let configuration = try Self.connectionConfiguration(settings, connectTimeout: .seconds(5))
        let connection: PostgresConnection
        do {
            connection = try await PostgresConnection.connect(configuration: configuration, id: 0, logger: logger)
        } catch let error as PSQLError {
            if let refusal = Self.refusal(error, settings: settings) { throw refusal }
            return
        } catch {
            return
        }
        try? await connection.close()
    }

    /// Connects once, outside the pool, and fails at once when PostgreSQL cannot be reached or
    /// refuses: for a command that runs once (`isle app add`, `isle serve --check-config`), which
    /// should say what is wrong rather than wait as a server does. The error names the host, the
    /// port and the cause (connection refused, a timeout, …), never the password.
    public func checkReachable(timeoutSeconds: Int64 = 5) async throws {
        let configuration = try Self.connectionConfiguration(settings, connectTimeout: .seconds(timeoutSeconds))
        do {
            let connection = try await PostgresConnection.connect(configuration: configuration, id: 0, logger: logger)
            try? await connection.close()
        } catch let error as PSQLError {
            if let refusal = Self.refusal(error, settings: settings) { throw refusal }
            throw StoreError(.unavailable, "cannot reach PostgreSQL at \(settings.host):\(settings.port) (\(settings.redacted)): \(PG.describe(error))")
        } catch {
            throw StoreError(.unavailable, "cannot reach PostgreSQL at \(settings.host):\(settings.port) (\(settings.redacted)): \(PG.describe(error))")
        }
    }

    /// A connection of its own, outside the pool (the credentials check, the availability probe).
    static func connectionConfiguration(_ settings: PostgresSettings, connectTimeout: TimeAmount) throws -> PostgresConnection.Configuration {
        let tls: PostgresConnection.Configuration.TLS
        switch settings.tls {
        case .disable: tls = .disable
        case .prefer: tls = .prefer(try NIOSSLContext(configuration: .makeClientConfiguration()))
        case .require: tls = .require(try NIOSSLContext(configuration: .makeClientConfiguration()))
        }
        var configuration = PostgresConnection.Configuration(host: settings.host, port: settings.port, username: settings.username, password: settings.password,
                                                             database: settings.database, tls: tls)
        configuration.options.connectTimeout = connectTimeout
        return configuration
    }

    /// The permanent refusals of a connection attempt, each with what to do about it.
    static func refusal(_ error: PSQLError, settings: PostgresSettings) -> StoreError? {
        let at = settings.redacted
        if error.code == .authMechanismRequiresPassword {
            return StoreError(.refused, "PostgreSQL at \(at) asks for the password of user \(settings.username) (28P01), and no password was given: set PGPASSWORD or ?passwordfile=")
        }
        if error.code == .unsupportedAuthMechanism {
            return StoreError(.refused, "PostgreSQL at \(at) asks user \(settings.username) to sign in in a way Isle does not support; use password, md5 or scram-sha-256 authentication in pg_hba.conf")
        }
        guard error.code == .server, let state = PG.sqlState(error) else { return nil }
        let said = error.serverInfo?[.message] ?? ""
        switch state {
        case "28P01":
            let source = settings.password == nil ? "no password was given: set PGPASSWORD or ?passwordfile=" : "check the password in PGPASSWORD or the ?passwordfile= file"
            return StoreError(.refused, "PostgreSQL at \(at) refused the password of user \(settings.username) (28P01: \(said)); \(source)")
        case "28000":
            return StoreError(.refused, "PostgreSQL at \(at) refused user \(settings.username) (28000: \(said)); check the user name and the server's pg_hba.conf")
        case "3D000":
            return StoreError(.refused, "PostgreSQL at \(at) has no database \(settings.database) (3D000: \(said)); create it (createdb \(settings.database)) or fix the URL")
        default:
            return nil
        }
    }

    static func tls(_ mode: PostgresSettings.TLSMode) -> PostgresClient.Configuration.TLS {
        switch mode {
        case .disable: .disable
        case .prefer: .prefer(.makeClientConfiguration())
        case .require: .require(.makeClientConfiguration())
        }
    }

    /// Runs `body` while the connection pool runs; the pool closes when it returns. A password,
    /// user or database PostgreSQL refuses fails here at once (see ``checkCredentials()``).
    public func withRunning<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        try await checkCredentials()
        await pools.start()
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await self.pools.run() }
            group.addTask { await self.watchAvailability() }
            defer { group.cancelAll() }
            return try await body()
        }
    }

    // MARK: Transactions

    /// One transaction, retried (a few times) when PostgreSQL breaks a deadlock or a serialization
    /// conflict by aborting it.
    @discardableResult
    func transaction<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        try await bounded { try await self.unboundedTransaction(body) }
    }

    /// Every store call ends within the statement timeout plus a margin, whatever the connection
    /// does: a call stuck on a connection PostgreSQL dropped (seen across a server restart) must not
    /// hold an API request, or a graceful shutdown, forever. The call is cancelled and the caller
    /// gets `.unavailable` (a 503 with Retry-After at the API).
    ///
    /// One shared watcher (``CallDeadlines``) keeps every call's deadline: a call costs one task
    /// and a table entry, not a sleeping timer task and a task to cancel it (three tasks per call
    /// before; docs/performance.md).
    func bounded<T: Sendable>(_ operation: @escaping @Sendable () async throws -> T) async throws -> T {
        try await bounded(limit: .seconds(settings.statementTimeout + 5), gated: true, operation)
    }

    /// ``bounded(_:)`` with its own deadline. `gated`: refused at once while PostgreSQL is away
    /// (``PostgresAvailability``); a call that loses its connection marks it away.
    func bounded<T: Sendable>(limit: Duration, gated: Bool, _ operation: @escaping @Sendable () async throws -> T) async throws -> T {
        if gated, let away = availability.current {
            throw StoreError(.unavailable, "PostgreSQL is unavailable (\(away.reason.prefix(120))); retry shortly", alreadyLogged: true)
        }
        let deadlines = self.deadlines
        let value: T = try await withCheckedThrowingContinuation { (c: CheckedContinuation<T, any Error>) in
            let answer = OneAnswer(c)
            let work = Mutex<Task<Void, Never>?>(nil)
            let id = deadlines.add(after: limit) { why in
                if answer.give(.failure(StoreError(.unavailable, why ?? "PostgreSQL did not answer within \(limit)", alreadyLogged: why != nil))) { work.withLock { $0?.cancel() } }
            }
            // Unstructured on purpose: the caller must get its answer at the deadline even when the
            // stuck operation ignores cancellation (a task group would wait for it).
            let task = Task {
                let result: Result<T, any Error>
                do { result = .success(try await operation()) } catch { result = .failure(error) }
                deadlines.remove(id)
                answer.give(result)
            }
            work.withLock { $0 = task }
        }
        return value
    }

    func unboundedTransaction<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        var attempt = 0
        while true {
            attempt += 1
            do {
                return try await client.withConnection { conn in
                    try await conn.rows("BEGIN", logger: logger)
                    do {
                        let value = try await body(conn)
                        try await conn.rows("COMMIT", logger: logger)
                        return value
                    } catch {
                        _ = try? await conn.rows("ROLLBACK", logger: logger)
                        throw error
                    }
                }
            } catch let e as RetryablePGError where e.isTransient && attempt < 5 {
                continue
            } catch {
                throw away(error)
            }
        }
    }

    /// A call's error as the store reports it; one that says PostgreSQL is away marks it so.
    func away(_ error: any Error) -> any Error {
        guard PostgresAvailability.saysAway(error) else {
            if let e = error as? PSQLError { return PG.storeError(e) }
            return error
        }
        goneAway("\(error)".prefix(200).description)
        if let e = error as? PSQLError { return PG.storeError(e) }
        return StoreError(.unavailable, "PostgreSQL is unreachable (\(error))")
    }

    func read<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        try await bounded {
            do {
                return try await self.client.withConnection { conn in try await body(conn) }
            } catch {
                throw self.away(error)
            }
        }
    }

    /// Serializes changes to one lane across processes (held until the transaction ends).
    /// Lanes map onto this many advisory locks (namespace 1): a fan-out to 100,000 activities
    /// takes at most this many, well inside PostgreSQL's lock table; two lanes that share a lock
    /// only wait for each other, which never breaks an order.
    static let laneLocks = 4096

    static func laneLock(_ lane: String) -> Int64 {
        // FNV-1a: stable across processes and versions (Swift's hashValue is seeded per process).
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in lane.utf8 { h = (h ^ UInt64(b)) &* 0x0000_0100_0000_01b3 }
        return Int64(h % UInt64(laneLocks))
    }

    static func lockLane(_ conn: PostgresConnection, _ lane: String, logger: Logger) async throws {
        try await conn.rows("SELECT pg_advisory_xact_lock(1, $1::int)", [.int(laneLock(lane))], logger: logger)
    }

    /// Locks every lane's lock, in one order (so two such transactions cannot deadlock), in one round trip.
    static func lockLanes(_ conn: PostgresConnection, _ lanes: [String], logger: Logger) async throws {
        let keys = Array(Set(lanes.map(laneLock))).sorted()
        guard !keys.isEmpty else { return }
        try await conn.rows("SELECT pg_advisory_xact_lock(1, k::int) FROM unnest($1::bigint[]) AS k ORDER BY k", [.ints(keys)], logger: logger)
    }

    // MARK: Serving

    /// Several processes may serve one PostgreSQL database: nothing to hold.
    public func holdForServing() throws -> any ServingHold { NoHold() }
    struct NoHold: ServingHold { func release() {} }

    /// Wakes `wake` whenever another process (or this one) commits queued work. Returns when
    /// cancelled; reconnects after a lost connection.
    public func listenForWork(_ wake: @escaping @Sendable () -> Void) async {
        while !Task.isCancelled {
            do {
                try await client.withConnection { conn in
                    try await conn.listen(on: Self.notifyChannel) { notifications in
                        // Listening again after a break: what was committed meanwhile is looked at now.
                        wake()
                        for try await _ in notifications { wake() }
                    }
                }
            } catch {
                logger.debug("LISTEN isle_jobs stopped; looking for work every second until it is back", metadata: ["error": "\(error)"])
            }
            try? await Task.sleep(for: .seconds(1))
            wake()
        }
    }

    // MARK: Migrations

    /// The steps that brought a database to its schema before ``Schema`` defined it, frozen: a
    /// database an earlier Isle made replays those it lacks, then ``Schema/changes``. A new
    /// database is created from ``Schema`` directly.
    static let frozenMigrations: [String] = [
        """
        CREATE TABLE apps (bundle_id TEXT PRIMARY KEY, team_id TEXT NOT NULL, key_id TEXT NOT NULL, key_pem TEXT NOT NULL,
            frequent_updates BOOLEAN NOT NULL, schemas TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL);
        CREATE TABLE api_keys (id TEXT PRIMARY KEY, bundle_id TEXT NOT NULL REFERENCES apps(bundle_id), scope TEXT NOT NULL,
            secret_hash TEXT NOT NULL UNIQUE, created_at DOUBLE PRECISION NOT NULL, revoked_at DOUBLE PRECISION);
        CREATE TABLE installations (id TEXT PRIMARY KEY, bundle_id TEXT NOT NULL, user_id TEXT, push_to_start_tokens TEXT NOT NULL,
            widget_token TEXT, live_activities_enabled BOOLEAN NOT NULL, frequent_pushes_enabled BOOLEAN NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL, secret_hash TEXT);
        CREATE INDEX installations_user ON installations(bundle_id, user_id);
        CREATE TABLE activities (id TEXT PRIMARY KEY, ord BIGSERIAL, bundle_id TEXT NOT NULL, external_key TEXT, installation_id TEXT,
            attributes_type TEXT NOT NULL, attributes TEXT, content TEXT, state TEXT NOT NULL, update_token TEXT, channel_id TEXT,
            relevance_score DOUBLE PRECISION, stale_date DOUBLE PRECISION, started_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION,
            dismissed_at DOUBLE PRECISION, last_timestamp BIGINT, state_reason TEXT);
        CREATE INDEX activities_key ON activities(bundle_id, external_key);
        CREATE INDEX activities_token ON activities(update_token);
        CREATE INDEX activities_installation ON activities(installation_id);
        CREATE INDEX activities_channel ON activities(channel_id);
        CREATE TABLE activity_topics (activity_id TEXT NOT NULL REFERENCES activities(id), bundle_id TEXT NOT NULL, topic TEXT NOT NULL,
            PRIMARY KEY (activity_id, topic));
        CREATE INDEX activity_topics_lookup ON activity_topics(bundle_id, topic);
        CREATE TABLE channels (id TEXT PRIMARY KEY, bundle_id TEXT NOT NULL, storage_policy BIGINT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
            last_timestamp BIGINT);
        CREATE INDEX channels_app ON channels(bundle_id);
        CREATE SEQUENCE job_seq;
        CREATE TABLE jobs (id BIGSERIAL PRIMARY KEY, bundle_id TEXT NOT NULL, kind TEXT NOT NULL, activity_id TEXT, installation_id TEXT,
            channel_id TEXT, aps TEXT NOT NULL, has_alert BOOLEAN NOT NULL, requested_priority BIGINT, run_at DOUBLE PRECISION NOT NULL,
            state TEXT NOT NULL, attempts BIGINT NOT NULL DEFAULT 0, claimed_by TEXT, claimed_until DOUBLE PRECISION, last_error TEXT,
            created_at DOUBLE PRECISION NOT NULL, push_timestamp BIGINT, apns_id TEXT, lane TEXT, seq BIGINT,
            is_head BOOLEAN NOT NULL DEFAULT FALSE, supersedable BOOLEAN NOT NULL DEFAULT FALSE, carries_content BOOLEAN NOT NULL DEFAULT FALSE);
        CREATE INDEX jobs_ready ON jobs(run_at, seq) WHERE is_head AND state = 'queued';
        CREATE INDEX jobs_lane_open ON jobs(lane, seq) WHERE state IN ('queued', 'claimed');
        CREATE INDEX jobs_scheduled ON jobs(run_at, id) WHERE state = 'scheduled';
        CREATE INDEX jobs_claimed ON jobs(claimed_until) WHERE state = 'claimed';
        CREATE INDEX jobs_finished ON jobs(created_at) WHERE state IN ('sent', 'failed', 'superseded', 'dropped');
        CREATE TABLE deliveries (id BIGSERIAL PRIMARY KEY, job_id BIGINT NOT NULL, activity_id TEXT, apns_id TEXT, apns_unique_id TEXT,
            status BIGINT NOT NULL, reason TEXT, latency_ms DOUBLE PRECISION NOT NULL, priority BIGINT NOT NULL, downgraded BOOLEAN NOT NULL,
            at DOUBLE PRECISION NOT NULL);
        CREATE INDEX deliveries_activity ON deliveries(activity_id, id);
        CREATE INDEX deliveries_apns ON deliveries(apns_id);
        CREATE INDEX deliveries_at ON deliveries(at);
        CREATE TABLE high_priority_sends (id BIGSERIAL PRIMARY KEY, activity_id TEXT NOT NULL, at DOUBLE PRECISION NOT NULL);
        CREATE INDEX high_priority_sends_activity ON high_priority_sends(activity_id, at);
        CREATE INDEX high_priority_sends_at ON high_priority_sends(at);
        CREATE TABLE idempotency (bundle_id TEXT NOT NULL, key TEXT NOT NULL, request_hash TEXT NOT NULL, status BIGINT NOT NULL,
            body TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (bundle_id, key));
        CREATE INDEX idempotency_created ON idempotency(created_at);
        """,
        // The APNs environment of each installation's, activity's and channel's tokens (NULL: the
        // server's default).
        """
        ALTER TABLE installations ADD COLUMN environment TEXT;
        ALTER TABLE activities ADD COLUMN environment TEXT;
        ALTER TABLE channels ADD COLUMN environment TEXT;
        """,
        // Trust model v2 (docs/security.md): installation ids and token look-ups per app; the
        // app's registration-ticket keys; indexes for pruning ended activities and silent installations.
        """
        ALTER TABLE installations DROP CONSTRAINT installations_pkey;
        ALTER TABLE installations ADD PRIMARY KEY (bundle_id, id);
        CREATE INDEX installations_updated ON installations(updated_at);
        ALTER TABLE apps ADD COLUMN ticket_keys TEXT NOT NULL DEFAULT '[]';
        DROP INDEX activities_token;
        CREATE INDEX activities_token ON activities(bundle_id, update_token);
        DROP INDEX activities_installation;
        CREATE INDEX activities_installation ON activities(bundle_id, installation_id, state);
        CREATE INDEX activities_finished ON activities(started_at) WHERE state IN ('ended', 'dismissed', 'unreachable');
        """,
    ]

    /// Creates the schema (a new database) or brings an older one to it.
    public func migrate() async throws { try await migrate(replayingFrozenSteps: false) }

    /// The schema version this binary writes: the frozen steps, then ``Schema/changes``.
    static var schemaVersion: Int { frozenMigrations.count + Schema.changes.count }

    public func schemaCheck() async throws -> SchemaCheck {
        let log = logger
        let current = try await read { conn -> Int in
            guard try await conn.row("SELECT to_regclass('isle_migrations') IS NOT NULL AS present", logger: log)?.bool("present") == true else { return 0 }
            return Int(try await conn.row("SELECT COALESCE(MAX(version), 0) AS v FROM isle_migrations", logger: log)?.int("v") ?? 0)
        }
        return SchemaCheck(current: current, known: Self.schemaVersion)
    }

    /// `replayingFrozenSteps`: build a new database as an earlier Isle would have, then bring it
    /// forward (the schema test compares that with one created from the definition).
    func migrate(replayingFrozenSteps: Bool, stoppingAfterFrozenSteps: Bool = false) async throws {
        let log = logger
        // Not bounded by the statement timeout: a change may rewrite large tables once.
        try await unboundedTransaction { conn in
            try await conn.rows("SET LOCAL statement_timeout = 0", logger: log)
            // Instances that start together: one migrates, the others wait here, then find it done.
            try await conn.rows("SELECT pg_advisory_xact_lock($1)", [.int(Self.migrationLock)], logger: log)
            try await conn.rows("CREATE TABLE IF NOT EXISTS isle_migrations (version BIGINT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)", logger: log)
            let done = try await conn.row("SELECT COALESCE(MAX(version), 0) AS v FROM isle_migrations", logger: log)?.int("v") ?? 0
            let frozen = Self.frozenMigrations.count
            try SchemaCheck(current: Int(done), known: Self.schemaVersion).refuseNewer()
            func record(_ version: Int) async throws {
                try await conn.rows("INSERT INTO isle_migrations (version, applied_at) VALUES ($1, $2)", [.int(Int64(version)), .double(Date().timeIntervalSince1970)], logger: log)
            }
            if done == 0, !replayingFrozenSteps {
                for statement in Schema.create(in: .postgres) { try await conn.rows(statement, logger: log) }
                return try await record(frozen + Schema.changes.count)
            }
            for (i, sql) in Self.frozenMigrations.enumerated() where Int64(i + 1) > done {
                // Simple-query protocol is not exposed: run the statements one by one.
                for statement in sql.split(separator: ";").map({ $0.trimmingCharacters(in: .whitespacesAndNewlines) }) where !statement.isEmpty {
                    try await conn.rows(statement, logger: log)
                }
                try await record(i + 1)
            }
            if stoppingAfterFrozenSteps { return }
            for (k, change) in Schema.changes.enumerated() where Int64(frozen + k + 1) > done {
                for statement in change.statements(.postgres) { try await conn.rows(statement, logger: log) }
                try await record(frozen + k + 1)
            }
        }
    }

    /// The schema as this database has it, one normalized line per column, constraint, index and
    /// sequence (the schema test compares databases built both ways, and each with ``Schema``).
    func schemaDescription() async throws -> [String] {
        let log = logger
        return try await read { conn in
            var lines: [String] = []
            for r in try await conn.rows("""
                SELECT table_name, column_name, data_type, is_nullable, COALESCE(column_default, '-') AS d FROM information_schema.columns
                WHERE table_schema = current_schema() AND table_name <> 'isle_migrations'
                """, logger: log) {
                lines.append("column \(try r.string("table_name")).\(try r.string("column_name")) \(try r.string("data_type")) nullable=\(try r.string("is_nullable")) default=\(try r.string("d"))")
            }
            for r in try await conn.rows("""
                SELECT c.relname AS t, k.conname AS n, pg_get_constraintdef(k.oid) AS def FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
                JOIN pg_namespace s ON s.oid = c.relnamespace WHERE s.nspname = current_schema() AND c.relname <> 'isle_migrations'
                """, logger: log) {
                lines.append("constraint \(try r.string("t")).\(try r.string("n")) \(try r.string("def"))")
            }
            for r in try await conn.rows("SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename <> 'isle_migrations'", logger: log) {
                lines.append("index " + (try r.string("indexdef")))
            }
            for r in try await conn.rows("SELECT sequencename FROM pg_sequences WHERE schemaname = current_schema()", logger: log) {
                lines.append("sequence " + (try r.string("sequencename")))
            }
            return lines.sorted()
        }
    }

    /// Deletes every table (tests and `isle db copy --replace` only).
    public func dropEverything() async throws {
        let log = logger
        try await transaction { conn in
            for t in ["history", "app_pauses", "audit_log", "webhooks", "events", "idempotency", "high_priority_sends", "deliveries", "jobs", "channels", "activity_topics", "activities", "installations", "api_keys", "apps", "isle_migrations"] {
                try await conn.rows("DROP TABLE IF EXISTS \(t) CASCADE", logger: log)
            }
            try await conn.rows("DROP SEQUENCE IF EXISTS job_seq", logger: log)
        }
    }

    // MARK: Apps and keys

    public func appRowCounts(_ bundleID: String) async throws -> [String: Int] {
        let log = logger
        return try await transaction { conn in
            var counts: [String: Int] = [:]
            for rows in Schema.appRows(in: .postgres) {
                counts[rows.table] = Int(try await conn.row("SELECT COUNT(*) AS n FROM \(rows.table) WHERE \(rows.condition)", [.text(bundleID)], logger: log)?.int("n") ?? 0)
            }
            return counts
        }
    }

    public func removeApp(_ bundleID: String) async throws -> [String: Int]? {
        let log = logger
        return try await transaction { conn in
            // Locked first, so an `isle app add` of the same app waits for the removal to end.
            guard try await conn.row("SELECT bundle_id FROM apps WHERE bundle_id = $1 FOR UPDATE", [.text(bundleID)], logger: log) != nil else { return nil }
            // The app's jobs and activities too: an engine's completion that commits between two
            // of the deletes below would leave its delivery and events behind; locked, it waits,
            // then finds its job gone and writes nothing.
            try await conn.rows("SELECT id FROM jobs WHERE bundle_id = $1 ORDER BY id FOR UPDATE", [.text(bundleID)], logger: log)
            try await conn.rows("SELECT id FROM activities WHERE bundle_id = $1 ORDER BY id FOR UPDATE", [.text(bundleID)], logger: log)
            var removed: [String: Int] = [:]
            for rows in Schema.appRows(in: .postgres) {
                removed[rows.table] = Int(try await conn.row("WITH gone AS (DELETE FROM \(rows.table) WHERE \(rows.condition) RETURNING 1) SELECT COUNT(*) AS n FROM gone",
                                                             [.text(bundleID)], logger: log)?.int("n") ?? 0)
            }
            return removed
        }
    }

    public func upsertApp(_ a: AppRecord) async throws {
        try MasterKey.refuseClear(a)
        let schemas = JSONValue.array(a.schemas.map(\.jsonValue)).jsonString
        let log = logger
        try await transaction { conn in
            try await conn.rows("""
                INSERT INTO apps (bundle_id, team_id, key_id, key_pem, frequent_updates, schemas, created_at, ticket_keys, environment_keys)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                ON CONFLICT (bundle_id) DO UPDATE SET team_id = excluded.team_id, key_id = excluded.key_id, key_pem = excluded.key_pem,
                    frequent_updates = excluded.frequent_updates, schemas = excluded.schemas, ticket_keys = excluded.ticket_keys, environment_keys = excluded.environment_keys
                """, [.text(a.bundleID), .text(a.teamID), .text(a.keyID), .text(a.keyPEM), .bool(a.frequentUpdatesDeclared), .orderedJSON(schemas), .date(a.createdAt),
                      .json(TicketKey.encode(a.ticketKeys)), .json(EnvironmentKey.encode(a.environmentKeys))], logger: log)
        }
    }

    public func app(_ bundleID: String) async throws -> AppRecord? {
        let log = logger
        return try await read { conn in try await conn.row("SELECT * FROM apps WHERE bundle_id = $1", [.text(bundleID)], logger: log).map(Self.app) }
    }

    public func apps() async throws -> [AppRecord] {
        let log = logger
        return try await read { conn in try await conn.rows("SELECT * FROM apps ORDER BY bundle_id", logger: log).map(Self.app) }
    }

    static func app(_ r: PGRow) throws -> AppRecord {
        let bundleID = try r.string("bundle_id")
        return AppRecord(bundleID: bundleID, teamID: try r.string("team_id"), keyID: try r.string("key_id"), keyPEM: try r.string("key_pem"),
                         frequentUpdatesDeclared: try r.bool("frequent_updates"), schemas: try AppRecord.storedSchemas(try r.string("schemas"), bundleID: bundleID),
                         createdAt: try r.date("created_at"), ticketKeys: try TicketKey.decode(try r.optionalString("ticket_keys"), bundleID: bundleID),
                         environmentKeys: try EnvironmentKey.decode(try r.optionalString("environment_keys"), bundleID: bundleID))
    }

    public func insertAPIKey(_ k: APIKeyRecord) async throws {
        let log = logger
        try await transaction { conn in
            try await conn.rows("INSERT INTO api_keys (id, bundle_id, scope, secret_hash, created_at, revoked_at) VALUES ($1, $2, $3, $4, $5, $6)",
                                [.text(k.id), .text(k.bundleID), .text(k.scope.rawValue), .text(k.secretHash), .date(k.createdAt), .date(k.revokedAt)], logger: log)
        }
    }

    public func apiKey(secretHash: String) async throws -> APIKeyRecord? {
        let log = logger
        return try await read { conn in
            try await conn.row("SELECT * FROM api_keys WHERE secret_hash = $1", [.text(secretHash)], logger: log).map { r in
                APIKeyRecord(id: try r.string("id"), bundleID: try r.string("bundle_id"), scope: try BadRow.decode(try r.string("scope"), as: APIKeyScope.self, table: "api_keys", id: try r.string("id"), column: "scope"),
                             secretHash: try r.string("secret_hash"), createdAt: try r.date("created_at"), revokedAt: try r.optionalDate("revoked_at"))
            }
        }
    }

    public func apiKeys(bundleID: String?) async throws -> [APIKeyRecord] {
        let log = logger
        return try await read { conn in
            try await conn.rows("SELECT * FROM api_keys WHERE $1::text IS NULL OR bundle_id = $1 ORDER BY created_at, id", [.text(bundleID)], logger: log).map { r in
                APIKeyRecord(id: try r.string("id"), bundleID: try r.string("bundle_id"), scope: try BadRow.decode(try r.string("scope"), as: APIKeyScope.self, table: "api_keys", id: try r.string("id"), column: "scope"),
                             secretHash: try r.string("secret_hash"), createdAt: try r.date("created_at"), revokedAt: try r.optionalDate("revoked_at"))
            }
        }
    }

    public func revokeAPIKey(id: String, at: Date) async throws -> Bool {
        let log = logger
        return try await transaction { conn in
            !(try await conn.rows("UPDATE api_keys SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL RETURNING id", [.date(at), .text(id)], logger: log).isEmpty)
        }
    }

    // MARK: Idempotency

    /// Stores an idempotent answer in the caller's transaction; a live record with the key means
    /// another request committed first.
    static func insertIdempotency(_ conn: PostgresConnection, _ r: IdempotencyRecord, logger: Logger) async throws {
        try await conn.rows("DELETE FROM idempotency WHERE bundle_id = $1 AND key = $2 AND created_at < $3",
                            [.text(r.bundleID), .text(r.key), .date(r.createdAt.addingTimeInterval(-IdempotencyRecord.lifetime))], logger: logger)
        let inserted = try await conn.rows("""
            INSERT INTO idempotency (bundle_id, key, request_hash, status, body, created_at) VALUES ($1, $2, $3, $4, $5, $6)
            ON CONFLICT (bundle_id, key) DO NOTHING RETURNING key
            """, [.text(r.bundleID), .text(r.key), .text(r.requestHash), .int(r.status), .text(r.body), .date(r.createdAt)], logger: logger)
        if inserted.isEmpty { throw StoreError(.idempotencyKeyTaken, "another request with this Idempotency-Key was accepted first") }
    }

    public func idempotencyRecord(bundleID: String, key: String) async throws -> IdempotencyRecord? {
        let log = logger
        return try await read { conn in
            try await conn.row("SELECT * FROM idempotency WHERE bundle_id = $1 AND key = $2", [.text(bundleID), .text(key)], logger: log).map { r in
                IdempotencyRecord(key: try r.string("key"), bundleID: try r.string("bundle_id"), requestHash: try r.string("request_hash"), status: Int(try r.int("status")),
                                  body: try r.string("body"), createdAt: try r.date("created_at"))
            }
        }
    }

    // MARK: Installations

    static func writeInstallation(_ conn: PostgresConnection, _ i: InstallationRecord, onConflict: String? = nil, logger: Logger) async throws {
        let tokens = JSONValue.object(JSONObject(i.pushToStartTokens.sorted { $0.key < $1.key }.map { ($0.key, JSONValue.string($0.value)) })).jsonString
        try await conn.rows("""
            INSERT INTO installations (id, bundle_id, user_id, push_to_start_tokens, widget_token, live_activities_enabled, frequent_pushes_enabled, updated_at, secret_hash, environment,
                                       controls_token, broadcast_channels, topics)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
            ON CONFLICT (bundle_id, id) \(onConflict ?? "DO UPDATE SET user_id = excluded.user_id, push_to_start_tokens = excluded.push_to_start_tokens, widget_token = excluded.widget_token, live_activities_enabled = excluded.live_activities_enabled, frequent_pushes_enabled = excluded.frequent_pushes_enabled, updated_at = excluded.updated_at, secret_hash = excluded.secret_hash, environment = excluded.environment, controls_token = excluded.controls_token, broadcast_channels = excluded.broadcast_channels, topics = excluded.topics")
            """, [.text(i.id), .text(i.bundleID), .text(i.userID), .json(tokens), .text(i.widgetToken), .bool(i.liveActivitiesEnabled), .bool(i.frequentPushesEnabled),
                  .date(i.updatedAt), .text(i.secretHash), .text(i.environment?.rawValue), .text(i.controlsToken), .bool(i.broadcastChannels),
                  .json(SQLiteStore.topicsJSON(i.topics))], logger: logger)
    }

    static func installation(_ r: PGRow) throws -> InstallationRecord {
        let id = try r.string("id")
        let key = "\(try r.string("bundle_id"))/\(id)"
        return InstallationRecord(id: id, bundleID: try r.string("bundle_id"), userID: try r.optionalString("user_id"),
                                  pushToStartTokens: try BadRow.stringMap(try r.string("push_to_start_tokens"), table: "installations", id: key, column: "push_to_start_tokens"),
                                  widgetToken: try r.optionalString("widget_token"), liveActivitiesEnabled: try r.bool("live_activities_enabled"),
                                  frequentPushesEnabled: try r.bool("frequent_pushes_enabled"), updatedAt: try r.date("updated_at"), secretHash: try r.optionalString("secret_hash"),
                                  environment: try BadRow.decode(try r.optionalString("environment"), as: PushEnvironment.self, table: "installations", id: key, column: "environment"),
                                  controlsToken: try r.optionalString("controls_token"), broadcastChannels: try r.row["broadcast_channels"].decode(Bool?.self),
                                  topics: try BadRow.strings(try r.optionalString("topics"), table: "installations", id: key, column: "topics"))
    }

    public func upsertInstallation(_ i: InstallationRecord) async throws {
        let log = logger
        try await transaction { conn in try await Self.writeInstallation(conn, i, logger: log) }
    }

    public func modifyInstallation(bundleID: String, id: String, create: @escaping @Sendable () -> InstallationRecord,
                                   _ change: @escaping @Sendable (inout InstallationRecord) throws -> Void,
                                   idempotency: IdempotentAnswer<InstallationRecord>?) async throws -> InstallationRecord {
        return try await faults.registryWrite {
            let log = logger
            return try await transaction { conn in
                // A missing row is created first (a second creator waits on the insert's conflict), so
                // the row lock below orders every change, the first ones included. A change that throws
                // rolls the creation back with it.
                if try await conn.row("SELECT id FROM installations WHERE bundle_id = $1 AND id = $2", [.text(bundleID), .text(id)], logger: log) == nil {
                    try await Self.writeInstallation(conn, create(), onConflict: "DO NOTHING", logger: log)
                }
                var i = try await conn.row("SELECT * FROM installations WHERE bundle_id = $1 AND id = $2 FOR UPDATE", [.text(bundleID), .text(id)], logger: log).map(Self.installation) ?? create()
                try change(&i)
                try await Self.writeInstallation(conn, i, logger: log)
                if let idempotency { try await Self.insertIdempotency(conn, idempotency.record(for: i), logger: log) }
                return i
            }
        }
    }

    public func installation(bundleID: String, id: String) async throws -> InstallationRecord? {
        if faults.take(.installationMissing) { return nil }
        let log = logger
        return try await read { conn in
            try await conn.row("SELECT * FROM installations WHERE bundle_id = $1 AND id = $2", [.text(bundleID), .text(id)], logger: log).map(Self.installation)
        }
    }

    public func installations(bundleID: String, topic: String) async throws -> [InstallationRecord] {
        let log = logger
        return try await read { conn in
            try await conn.rows("SELECT * FROM installations WHERE bundle_id = $1 AND topics ? $2 ORDER BY id", [.text(bundleID), .text(topic)], logger: log).map(Self.installation)
        }
    }

    public func installations(bundleID: String, userID: String) async throws -> [InstallationRecord] {
        let log = logger
        return try await read { conn in
            try await conn.rows("SELECT * FROM installations WHERE bundle_id = $1 AND user_id = $2 ORDER BY id", [.text(bundleID), .text(userID)], logger: log).map(Self.installation)
        }
    }

    // MARK: Activities

    static let activityColumns = "id, bundle_id, external_key, installation_id, attributes_type, attributes, content, state, update_token, channel_id, relevance_score, stale_date, started_at, ended_at, dismissed_at, last_timestamp, state_reason, environment"

    static func activityArguments(_ a: ActivityRecord) -> [PGArg] {
        [.text(a.id), .text(a.bundleID), .text(a.externalKey), .text(a.installationID), .text(a.attributesType), .json(a.attributes?.jsonString), .json(a.content?.jsonString),
         .text(a.state.rawValue), .text(a.updateToken), .text(a.channelID), .double(a.relevanceScore), .date(a.staleDate), .date(a.startedAt), .date(a.endedAt),
         .date(a.dismissedAt), .int(a.lastTimestamp), .text(a.stateReason), .text(a.environment?.rawValue)]
    }

    static func insertActivity(_ conn: PostgresConnection, _ a: ActivityRecord, logger: Logger) async throws {
        try await conn.rows("INSERT INTO activities (\(activityColumns)) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)",
                            activityArguments(a), logger: logger)
        try await writeTopics(conn, a, logger: logger)
    }

    static func update(_ conn: PostgresConnection, _ a: ActivityRecord, logger: Logger) async throws {
        let changed = try await conn.rows("""
            UPDATE activities SET id = $1, bundle_id = $2, external_key = $3, installation_id = $4, attributes_type = $5, attributes = $6, content = $7, state = $8,
                update_token = $9, channel_id = $10, relevance_score = $11, stale_date = $12, started_at = $13, ended_at = $14, dismissed_at = $15, last_timestamp = $16,
                state_reason = $17, environment = $18 WHERE id = $1 RETURNING id
            """, activityArguments(a), logger: logger)
        if changed.isEmpty { throw StoreError(.notFound, "no activity \(a.id)") }
        try await writeTopics(conn, a, logger: logger)
    }

    static func writeTopics(_ conn: PostgresConnection, _ a: ActivityRecord, logger: Logger) async throws {
        try await conn.rows("DELETE FROM activity_topics WHERE activity_id = $1", [.text(a.id)], logger: logger)
        let topics = Array(Set(a.topics)).sorted()
        guard !topics.isEmpty else { return }
        try await conn.rows("INSERT INTO activity_topics (activity_id, bundle_id, topic) SELECT $1, $2, unnest($3::text[])", [.text(a.id), .text(a.bundleID), .texts(topics)], logger: logger)
    }

    /// An activity row; `payloads: false` leaves attributes and content unparsed (nil), for planning.
    static func activity(_ r: PGRow, topics: [String], payloads: Bool = true) throws -> ActivityRecord {
        let id = try r.string("id")
        return ActivityRecord(
            id: try r.string("id"), bundleID: try r.string("bundle_id"), externalKey: try r.optionalString("external_key"), installationID: try r.optionalString("installation_id"),
            attributesType: try r.string("attributes_type"), attributes: payloads ? try r.optionalString("attributes").map { try BadRow.json($0, table: "activities", id: id, column: "attributes") } : nil,
            content: payloads ? try r.optionalString("content").map { try BadRow.json($0, table: "activities", id: id, column: "content") } : nil, state: try BadRow.decode(try r.string("state"), as: ActivityRecordState.self, table: "activities", id: try r.string("id"), column: "state"),
            updateToken: try r.optionalString("update_token"), channelID: try r.optionalString("channel_id"), relevanceScore: try r.optionalDouble("relevance_score"),
            staleDate: try r.optionalDate("stale_date"), startedAt: try r.date("started_at"), endedAt: try r.optionalDate("ended_at"), dismissedAt: try r.optionalDate("dismissed_at"),
            lastTimestamp: try r.optionalInt("last_timestamp"), topics: topics, stateReason: try r.optionalString("state_reason"),
            environment: try BadRow.decode(try r.optionalString("environment"), as: PushEnvironment.self, table: "activities", id: id, column: "environment"))
    }

    /// Activities matching `clause`, with their topics: in one statement for a read; for a change
    /// (`forUpdate`), the topics are read after the row lock is held, in a statement of their own
    /// (a subquery would see the snapshot from before the wait for the lock).
    static func activities(_ conn: PostgresConnection, where clause: String, _ args: [PGArg], forUpdate: Bool = false, logger: Logger) async throws -> [ActivityRecord] {
        guard forUpdate else {
            return try await conn.rows("""
                SELECT *, ARRAY(SELECT topic FROM activity_topics AS t WHERE t.activity_id = activities.id ORDER BY topic) AS topic_list FROM activities WHERE \(clause)
                """, args, logger: logger).map { r in try activity(r, topics: try r.strings("topic_list")) }
        }
        let rows = try await conn.rows("SELECT * FROM activities WHERE \(clause) FOR UPDATE", args, logger: logger)
        guard !rows.isEmpty else { return [] }
        let ids = try rows.map { try $0.string("id") }
        var topics: [String: [String]] = [:]
        for t in try await conn.rows("SELECT activity_id, topic FROM activity_topics WHERE activity_id = ANY($1::text[]) ORDER BY topic", [.texts(ids)], logger: logger) {
            topics[try t.string("activity_id"), default: []].append(try t.string("topic"))
        }
        return try rows.map { r in try activity(r, topics: topics[try r.string("id")] ?? []) }
    }

    public func insertActivity(_ a: ActivityRecord, idempotency: IdempotencyRecord?) async throws {
        try await faults.registryWrite {
            let log = logger
            try await transaction { conn in
                if let key = a.externalKey {
                    // The key's holder is decided under a lock on the key, so two racing registrations cannot both take it.
                    try await Self.lockLane(conn, "k:\(a.bundleID)\n\(key)", logger: log)
                    if let holder = try await conn.row("""
                        SELECT id FROM activities WHERE bundle_id = $1 AND external_key = $2 AND state IN (\(ActivityLifecycle.pushChangesSQL))
                            AND (installation_id IS NULL OR installation_id IS DISTINCT FROM $3) LIMIT 1
                        """, [.text(a.bundleID), .text(key), .text(a.installationID)], logger: log) {
                        throw StoreError(.conflict, "\(key) is the key of live activity \(try holder.string("id"))")
                    }
                }
                try await Self.insertActivity(conn, a, logger: log)
                if let idempotency { try await Self.insertIdempotency(conn, idempotency, logger: log) }
            }
        }
    }

    public func modifyActivity(id: String, _ change: @escaping @Sendable (inout ActivityRecord) throws -> Void,
                               idempotency: IdempotentAnswer<ActivityRecord>?, reportedBy: Events.Source?) async throws -> ActivityRecord? {
        return try await faults.registryWrite {
            let log = logger
            return try await transaction { conn in
                guard let old = try await Self.activities(conn, where: "id = $1", [.text(id)], forUpdate: true, logger: log).first else { return nil }
                var a = old
                try change(&a)
                try await Self.update(conn, a, logger: log)
                if let idempotency { try await Self.insertIdempotency(conn, idempotency.record(for: a), logger: log) }
                if let reportedBy {
                    var user = reportedBy.userID
                    if user == nil, let installation = a.installationID {
                        user = try await conn.row("SELECT user_id FROM installations WHERE bundle_id = $1 AND id = $2", [.text(a.bundleID), .text(installation)], logger: log)?.optionalString("user_id")
                    }
                    try await Self.insertEvents(conn, Events.activityChanged(from: old, to: a, by: reportedBy, userID: user), logger: log)
                }
                return a
            }
        }
    }

    public func linkStartedActivity(bundleID: String, externalKey: String, attributesType: String, installationID: String?, token: String, topics: [String],
                                    idempotency: IdempotentAnswer<ActivityRecord>?) async throws -> ActivityRecord? {
        let log = logger
        return try await transaction { conn in
            var clause = "bundle_id = $1 AND external_key = $2 AND attributes_type = $3 AND state = 'starting'"
            var args: [PGArg] = [.text(bundleID), .text(externalKey), .text(attributesType)]
            if let installationID {
                clause += " AND installation_id = $4"
                args.append(.text(installationID))
            }
            // The newest start (IsleStore.linkStartedActivity says why).
            guard var a = try await Self.activities(conn, where: clause + " ORDER BY started_at DESC, ord DESC LIMIT 1", args, forUpdate: true, logger: log).first else { return nil }
            try ActivityLifecycle.apply(.startLinked(token: token, topics: topics), to: &a)
            try await Self.update(conn, a, logger: log)
            if let idempotency { try await Self.insertIdempotency(conn, idempotency.record(for: a), logger: log) }
            return a
        }
    }

    public func activity(id: String) async throws -> ActivityRecord? {
        if faults.take(.activityMissing) { return nil }
        let log = logger
        return try await read { conn in try await Self.activities(conn, where: "id = $1", [.text(id)], logger: log).first }
    }

    /// Read with the other requests' reads that arrive meanwhile, in one statement (``pushReads``):
    /// accepting an update is one round trip per batch of requests, not one each.
    public func activityForPush(id: String) async throws -> ActivityRecord? {
        try await pushReads.submit(id) { ids in try await self.activitiesForPush(ids) }
    }

    func activitiesForPush(_ ids: [String]) async throws -> [Result<ActivityRecord?, any Error>] {
        let log = logger
        let found = try await read { conn in
            var byID: [String: Result<ActivityRecord, any Error>] = [:]
            for r in try await conn.rows(PG.ActivitiesByID.self, [.texts(Array(Set(ids)))], logger: log) {
                let id = try r.string("id")
                // A row that does not decode fails its own request only.
                byID[id] = Result { try Self.activity(r, topics: [], payloads: false) }
            }
            return byID
        }
        return ids.map { id in found[id].map { $0.map(Optional.some) } ?? .success(nil) }
    }

    public func activity(bundleID: String, externalKey: String) async throws -> ActivityRecord? {
        let log = logger
        return try await read { conn in
            try await Self.activities(conn, where: "bundle_id = $1 AND external_key = $2 ORDER BY started_at DESC, ord DESC LIMIT 1", [.text(bundleID), .text(externalKey)], logger: log).first
        }
    }

    public func liveActivities(bundleID: String, externalKey: String) async throws -> [ActivityRecord] {
        let log = logger
        return try await read { conn in
            try await Self.activities(conn, where: "bundle_id = $1 AND external_key = $2 AND state IN (\(ActivityLifecycle.pushChangesSQL)) ORDER BY started_at, ord",
                                      [.text(bundleID), .text(externalKey)], logger: log)
        }
    }

    public func activity(bundleID: String, updateToken: String) async throws -> ActivityRecord? {
        let log = logger
        return try await read { conn in
            try await Self.activities(conn, where: "bundle_id = $1 AND update_token = $2 ORDER BY ord LIMIT 1", [.text(bundleID), .text(updateToken)], logger: log).first
        }
    }

    public func liveActivityCount(bundleID: String, installationID: String) async throws -> Int {
        let log = logger
        return try await read { conn in
            Int(try await conn.row("SELECT COUNT(*) AS n FROM activities WHERE bundle_id = $1 AND installation_id = $2 AND state IN (\(ActivityLifecycle.pushChangesSQL))",
                                   [.text(bundleID), .text(installationID)], logger: log)?.int("n") ?? 0)
        }
    }

    public func liveActivities(bundleID: String, installationID: String) async throws -> [ActivityRecord] {
        let log = logger
        return try await read { conn in
            try await Self.activities(conn, where: "bundle_id = $1 AND installation_id = $2 AND state IN (\(ActivityLifecycle.pushChangesSQL)) ORDER BY started_at, ord",
                                      [.text(bundleID), .text(installationID)], logger: log)
        }
    }

    public func findActivities(_ q: ActivityQuery) async throws -> [ActivityRecord] {
        let log = logger
        return try await read { conn in
            try await Self.activities(conn, where: """
                bundle_id = $1 AND (cardinality($2::text[]) = 0 OR state = ANY($2::text[])) AND ($3::text IS NULL OR starts_with(external_key, $3))
                AND ($4::text IS NULL OR installation_id = $4)
                AND ($5::text IS NULL OR installation_id IN (SELECT id FROM installations WHERE bundle_id = $1 AND user_id = $5))
                AND ($6::text IS NULL OR id IN (SELECT activity_id FROM activity_topics WHERE bundle_id = $1 AND topic = $6))
                AND ($7::timestamptz IS NULL OR started_at < $7 OR (started_at = $7 AND id < $8))
                ORDER BY started_at DESC, id DESC LIMIT $9
                """, [.text(q.bundleID), .texts(q.states.map(\.rawValue)), .text(q.keyPrefix), .text(q.installationID), .text(q.userID), .text(q.topic),
                      // Bound at the nearest microsecond (PGArg.storable): the cursor's moment is
                      // the row's own.
                      .date(q.after?.startedAt), .text(q.after?.id), .int(Int64(max(0, q.limit)))], logger: log)
        }
    }

    /// A topic's live followers, oldest first.
    static let followers = "id IN (SELECT activity_id FROM activity_topics WHERE bundle_id = $1 AND topic = $2) AND state IN (\(ActivityLifecycle.pushChangesSQL)) ORDER BY started_at, id"

    public func activities(bundleID: String, topic: String) async throws -> [ActivityRecord] {
        let log = logger
        return try await read { conn in try await Self.activities(conn, where: Self.followers, [.text(bundleID), .text(topic)], logger: log) }
    }

    /// Without attributes, content and topics: a fan-out uses none of them.
    public func pushTargets(bundleID: String, topic: String) async throws -> [ActivityRecord] {
        let log = logger
        return try await read { conn in
            try await conn.rows("SELECT * FROM activities WHERE " + Self.followers, [.text(bundleID), .text(topic)], logger: log).map { try Self.activity($0, topics: [], payloads: false) }
        }
    }

    // MARK: Channels

    public func insertChannel(_ c: ChannelRecord, idempotency: IdempotencyRecord?) async throws {
        let log = logger
        try await transaction { conn in
            try await conn.rows("INSERT INTO channels (id, bundle_id, storage_policy, created_at, environment) VALUES ($1, $2, $3, $4, $5)",
                                [.text(c.id), .text(c.bundleID), .int(c.storagePolicy), .date(c.createdAt), .text(c.environment?.rawValue)], logger: log)
            if let idempotency { try await Self.insertIdempotency(conn, idempotency, logger: log) }
        }
    }

    static func channel(_ r: PGRow) throws -> ChannelRecord {
        ChannelRecord(id: try r.string("id"), bundleID: try r.string("bundle_id"), storagePolicy: Int(try r.int("storage_policy")), createdAt: try r.date("created_at"),
                      environment: try BadRow.decode(try r.optionalString("environment"), as: PushEnvironment.self, table: "channels", id: try r.string("id"), column: "environment"))
    }

    public func channels(bundleID: String) async throws -> [ChannelRecord] {
        let log = logger
        return try await read { conn in try await conn.rows("SELECT * FROM channels WHERE bundle_id = $1 ORDER BY created_at, id", [.text(bundleID)], logger: log).map(Self.channel) }
    }

    public func channel(id: String) async throws -> ChannelRecord? {
        let log = logger
        return try await read { conn in try await conn.row("SELECT * FROM channels WHERE id = $1", [.text(id)], logger: log).map(Self.channel) }
    }

    public func deleteChannel(id: String, idempotency: IdempotencyRecord?) async throws {
        let log = logger
        try await transaction { conn in
            try await conn.rows("DELETE FROM channels WHERE id = $1", [.text(id)], logger: log)
            if let idempotency { try await Self.insertIdempotency(conn, idempotency, logger: log) }
        }
    }

    // MARK: Reads

    static func delivery(_ r: PGRow) throws -> DeliveryRecord {
        var d = DeliveryRecord(jobID: try r.int("job_id"), activityID: try r.optionalString("activity_id"), apnsID: try r.optionalString("apns_id").flatMap { APNsID($0) },
                               apnsUniqueID: try r.optionalString("apns_unique_id"), status: Int(try r.int("status")), reason: try r.optionalString("reason"),
                               latencyMS: try r.double("latency_ms"), priority: try BadRow.decode(Int(try r.int("priority")), as: PushPriority.self, table: "deliveries", id: String(try r.int("id")), column: "priority"), downgraded: try r.bool("downgraded"), at: try r.date("at"))
        d.id = try r.int("id")
        d.deviceNote = try r.optionalString("device_note")
        return d
    }

    public func deliveries(activityID: String) async throws -> [DeliveryRecord] {
        let log = logger
        return try await read { conn in try await conn.rows("SELECT * FROM deliveries WHERE activity_id = $1 ORDER BY id", [.text(activityID)], logger: log).map(Self.delivery) }
    }

    public func deliveries(activityID: String, before: Int64?, limit: Int) async throws -> [DeliveryRecord] {
        let log = logger
        return try await read { conn in
            try await conn.rows("SELECT * FROM deliveries WHERE activity_id = $1 AND id < $2 ORDER BY id DESC LIMIT $3",
                                [.text(activityID), .int(before ?? Int64.max), .int(limit)], logger: log).map(Self.delivery).reversed()
        }
    }

    public func delivery(apnsID: APNsID) async throws -> DeliveryRecord? {
        let log = logger
        return try await read { conn in try await conn.row("SELECT * FROM deliveries WHERE apns_id = $1 ORDER BY id DESC LIMIT 1", [.text(apnsID.text)], logger: log).map(Self.delivery) }
    }

    public func prune(now: Date, retention: Retention, limit: Int) async throws -> Int {
        try faults.check(.prune)
        let log = logger
        return try await transaction { conn in
            var n = 0
            n += try await conn.rows("""
                DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE state IN ('sent', 'failed', 'superseded', 'dropped') AND created_at < $1 LIMIT $2) RETURNING id
                """, [.date(now.addingTimeInterval(-retention.finishedJobs)), .int(limit)], logger: log).count
            n += try await conn.rows("DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries WHERE at < $1 LIMIT $2) RETURNING id",
                                     [.date(now.addingTimeInterval(-retention.deliveries)), .int(limit)], logger: log).count
            n += try await conn.rows("DELETE FROM history WHERE (bundle_id, minute, metric) IN (SELECT bundle_id, minute, metric FROM history WHERE minute < $1 LIMIT $2) RETURNING metric",
                                     [.date(now.addingTimeInterval(-retention.history)), .int(limit)], logger: log).count
            // The newest placed event stays whatever its age: the next places count on from it.
            n += try await conn.rows("DELETE FROM events WHERE id IN (SELECT id FROM events WHERE at < $1 AND seq < (SELECT MAX(seq) FROM events) LIMIT $2) RETURNING id",
                                     [.date(now.addingTimeInterval(-retention.events)), .int(limit)], logger: log).count
            n += try await conn.rows("DELETE FROM high_priority_sends WHERE id IN (SELECT id FROM high_priority_sends WHERE at < $1 LIMIT $2) RETURNING id",
                                     [.date(now.addingTimeInterval(-retention.highPrioritySends)), .int(limit)], logger: log).count
            n += try await conn.rows("""
                DELETE FROM idempotency WHERE (bundle_id, key) IN (SELECT bundle_id, key FROM idempotency WHERE created_at < $1 LIMIT $2) RETURNING key
                """, [.date(now.addingTimeInterval(-IdempotencyRecord.lifetime)), .int(limit)], logger: log).count
            // An activity lives at most 12 hours, so its start dates its end within retention's grain.
            let ended = try await conn.rows("""
                SELECT id FROM activities WHERE state IN ('ended', 'dismissed', 'unreachable') AND started_at < $1 LIMIT $2
                """, [.date(now.addingTimeInterval(-retention.endedActivities)), .int(limit)], logger: log).map { try $0.string("id") }
            if !ended.isEmpty {
                try await conn.rows("DELETE FROM activity_topics WHERE activity_id = ANY($1::text[])", [.texts(ended)], logger: log)
                n += try await conn.rows("DELETE FROM activities WHERE id = ANY($1::text[]) RETURNING id", [.texts(ended)], logger: log).count
            }
            n += try await conn.rows("""
                DELETE FROM installations WHERE (bundle_id, id) IN (SELECT i.bundle_id, i.id FROM installations i WHERE i.updated_at < $1
                    AND NOT EXISTS (SELECT 1 FROM activities a WHERE a.bundle_id = i.bundle_id AND a.installation_id = i.id AND a.state IN (\(ActivityLifecycle.pushChangesSQL))) LIMIT $2)
                RETURNING id
                """, [.date(now.addingTimeInterval(-retention.staleInstallations)), .int(limit)], logger: log).count
            // Registrations that never became useful (docs/security.md, "Retention"): live
            // activities nothing was pushed to, long past any phone's 12 hours…
            let unpushed = try await conn.rows("""
                SELECT id FROM activities WHERE last_timestamp IS NULL AND state IN ('starting', 'active') AND started_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED
                """, [.date(now.addingTimeInterval(-retention.unusedActivities)), .int(limit)], logger: log).map { try $0.string("id") }
            if !unpushed.isEmpty {
                try await conn.rows("DELETE FROM activity_topics WHERE activity_id = ANY($1::text[])", [.texts(unpushed)], logger: log)
                n += try await conn.rows("DELETE FROM activities WHERE id = ANY($1::text[]) RETURNING id", [.texts(unpushed)], logger: log).count
            }
            // …and installations with no user and no activity that stopped reporting.
            n += try await conn.rows("""
                DELETE FROM installations WHERE (bundle_id, id) IN (SELECT i.bundle_id, i.id FROM installations i WHERE i.updated_at < $1 AND i.user_id IS NULL
                    AND NOT EXISTS (SELECT 1 FROM activities a WHERE a.bundle_id = i.bundle_id AND a.installation_id = i.id) LIMIT $2)
                RETURNING id
                """, [.date(now.addingTimeInterval(-retention.unusedInstallations)), .int(limit)], logger: log).count
            return n
        }
    }

    public func highPrioritySends(activityID: String, since: Date) async throws -> Int {
        let log = logger
        return try await read { conn in
            Int(try await conn.row("SELECT COUNT(*) AS n FROM high_priority_sends WHERE activity_id = $1 AND at >= $2", [.text(activityID), .date(since)], logger: log)?.int("n") ?? 0)
        }
    }

    public func ping() async throws {
        let log = logger
        _ = try await read { conn in try await conn.rows("SELECT 1", logger: log).count }
    }
}

extension PostgresStore {
    /// Runs the connection pool until cancelled (prefer ``withRunning(_:)``, which scopes it).
    public func run() async {
        await pools.start()
        await pools.run()
    }

    /// Runs one statement outside a transaction (administration: `CREATE DATABASE`).
    public func execute(_ sql: String) async throws {
        let log = logger
        try await read { conn in _ = try await conn.rows(sql, logger: log) }
    }

    /// Creates a new, empty database `<prefix>_<random>` on the server `settings` names and returns
    /// the settings that reach it (tests and benchmarks: a fresh database per run).
    public static func createDatabase(on settings: PostgresSettings, prefix: String, logger: Logger) async throws -> PostgresSettings {
        let admin = PostgresStore(settings: settings, logger: logger)
        let name = prefix + "_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased().prefix(12)
        try await admin.withRunning { try await admin.execute("CREATE DATABASE \(name)") }
        var fresh = settings
        fresh.database = name
        return fresh
    }
}

/// A continuation resumed by whichever answer comes first (the lock makes the check-and-resume atomic).
/// The deadlines of the store's calls, kept by one watcher task that runs while any call is in
/// flight and looks every quarter second: a call past its deadline gets its `expire` (its caller is
/// answered `.unavailable` and its work cancelled).
final class CallDeadlines: Sendable {
    private struct State {
        var next: UInt64 = 0
        /// Each call's deadline and what answers it (with the reason, when it is not the deadline).
        var entries: [UInt64: (at: ContinuousClock.Instant, expire: @Sendable (String?) -> Void)] = [:]
        var watching = false
    }
    private let state = Mutex(State())
    static let tick: Duration = .milliseconds(250)

    func add(after limit: Duration, expire: @escaping @Sendable (String?) -> Void) -> UInt64 {
        let at = ContinuousClock.now + limit
        let (id, start) = state.withLock { s -> (UInt64, Bool) in
            s.next += 1
            s.entries[s.next] = (at, expire)
            defer { s.watching = true }
            return (s.next, !s.watching)
        }
        if start { Task { await self.watch() } }
        return id
    }

    func remove(_ id: UInt64) {
        _ = state.withLock { $0.entries.removeValue(forKey: id) }
    }

    /// Answers every call now, with `reason` (the database is away).
    func expireAll(because reason: String) {
        let all = state.withLock { s -> [@Sendable (String?) -> Void] in
            defer { s.entries.removeAll() }
            return s.entries.values.map(\.expire)
        }
        for expire in all { expire(reason) }
    }

    private func watch() async {
        while true {
            try? await Task.sleep(for: Self.tick)
            let now = ContinuousClock.now
            let (due, stop) = state.withLock { s -> ([@Sendable (String?) -> Void], Bool) in
                var due: [@Sendable (String?) -> Void] = []
                for (id, e) in s.entries where e.at <= now {
                    due.append(e.expire)
                    s.entries[id] = nil
                }
                // Stops with nothing in flight; the next call starts it again (decided under the lock).
                if s.entries.isEmpty { s.watching = false }
                return (due, s.entries.isEmpty)
            }
            for expire in due { expire(nil) }
            if stop { return }
        }
    }
}

final class OneAnswer<T: Sendable>: Sendable {
    private let continuation: Mutex<CheckedContinuation<T, any Error>?>
    init(_ c: CheckedContinuation<T, any Error>) { continuation = Mutex(c) }
    @discardableResult
    func give(_ result: Result<T, any Error>) -> Bool {
        guard let c = continuation.withLock({ c in defer { c = nil }; return c }) else { return false }
        c.resume(with: result)
        return true
    }
}

// MARK: Copying (`isle db copy`)

extension PostgresStore {
    /// Rows in the tables a copy writes (0: the database holds no Isle data).
    public func copiedRowCount() async throws -> Int {
        let log = logger
        return try await read { conn in
            var n: Int64 = 0
            for t in DataCopy.tables { n += try await conn.row("SELECT COUNT(*) AS n FROM \(t)", logger: log)?.int("n") ?? 0 }
            return Int(n)
        }
    }

    /// Writes `table`'s rows into the table of the same name, in one transaction per table:
    /// SQLite's 0/1 become booleans where PostgreSQL has them; columns PostgreSQL does not have are
    /// refused by name. `replace` empties every copied table first (in the first call).
    /// The columns of a copied table as migrated here.
    public func columns(of table: String) async throws -> [DataCopy.Column] {
        guard DataCopy.tables.contains(table) else { throw StoreError(.notFound, "no table \(table)") }
        let log = logger
        return try await read { conn in
            try await conn.rows("SELECT column_name, data_type, is_nullable FROM information_schema.columns WHERE table_name = $1 AND table_schema = current_schema() ORDER BY ordinal_position",
                                [.text(table)], logger: log).map { r in
                DataCopy.Column(name: try r.string("column_name"), type: try r.string("data_type"), nullable: try r.string("is_nullable") == "YES")
            }
        }
    }

    public func importTable(_ table: DataCopy.Table, replacing: Bool) async throws {
        guard DataCopy.tables.contains(table.name) else { throw StoreError(.notFound, "no table \(table.name) to copy into") }
        let log = logger
        try await transaction { conn in
            if replacing {
                try await conn.rows("TRUNCATE \(DataCopy.tables.joined(separator: ", ")) RESTART IDENTITY CASCADE", logger: log)
            }
            var types: [String: String] = [:]
            for r in try await conn.rows("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = $1", [.text(table.name)], logger: log) {
                types[try r.string("column_name")] = try r.string("data_type")
            }
            if let missing = table.columns.first(where: { types[$0] == nil }) {
                throw StoreError(.conflict, "the PostgreSQL table \(table.name) has no column \(missing): run migrations on a database of this Isle version")
            }
            let columns = table.columns.map { "\"\($0)\"" }.joined(separator: ", ")
            for batch in stride(from: 0, to: table.rows.count, by: 200) {
                let rows = table.rows[batch..<min(table.rows.count, batch + 200)]
                var args: [PGArg] = []
                var tuples: [String] = []
                for row in rows {
                    var marks: [String] = []
                    for (i, value) in row.enumerated() {
                        args.append(try Self.argument(value, type: types[table.columns[i]] ?? "text", table: table.name, column: table.columns[i]))
                        marks.append("$\(args.count)")
                    }
                    tuples.append("(" + marks.joined(separator: ", ") + ")")
                }
                try await conn.rows("INSERT INTO \(table.name) (\(columns)) VALUES \(tuples.joined(separator: ", "))", args, logger: log)
            }
        }
    }

    /// A copied value as the PostgreSQL column takes it: SQLite's 0/1 as booleans, its seconds
    /// since 1970 as moments, its JSON text as JSONB. A value the column cannot hold is an error
    /// naming it, never a default.
    static func argument(_ v: DataCopy.Value, type: String, table: String, column: String) throws -> PGArg {
        switch (v, type) {
        case (.null, "boolean"): return .bool(nil)
        case (.null, "bigint"): return .int(nil as Int64?)
        case (.null, "double precision"): return .double(nil)
        case (.null, "timestamp with time zone"): return .date(nil)
        case (.null, "jsonb"): return .json(nil)
        case (.null, "json"): return .orderedJSON(nil)
        case (.null, _): return .text(nil)
        case (.int(let n), "boolean"): return .bool(n != 0)
        case (.int(let n), "double precision"): return .double(Double(n))
        case (.int(let n), "timestamp with time zone"): return .date(Date(timeIntervalSince1970: Double(n)))
        case (.int(let n), "text"): return .text(String(n))
        case (.int(let n), _): return .int(n)
        case (.double(let d), "bigint"):
            guard let n = Int64(exactly: d.rounded()) else { throw StoreError(.conflict, "\(table).\(column) holds \(d), which is not a 64-bit integer") }
            return .int(n)
        case (.double(let d), "timestamp with time zone"): return .date(Date(timeIntervalSince1970: d))
        case (.double(let d), _): return .double(d)
        case (.text(let t), "jsonb"): return .json(t)
        case (.text(let t), "json"): return .orderedJSON(t)
        case (.text(let t), _): return .text(t)
        }
    }

    /// After a copy: the id and sequence counters continue after the copied rows.
    public func resetSequences() async throws {
        let log = logger
        try await transaction { conn in
            try await conn.rows("SELECT setval('jobs_id_seq', GREATEST((SELECT COALESCE(MAX(id), 0) FROM jobs), 1))", logger: log)
            try await conn.rows("SELECT setval('deliveries_id_seq', GREATEST((SELECT COALESCE(MAX(id), 0) FROM deliveries), 1))", logger: log)
            try await conn.rows("SELECT setval('high_priority_sends_id_seq', GREATEST((SELECT COALESCE(MAX(id), 0) FROM high_priority_sends), 1))", logger: log)
            try await conn.rows("SELECT setval('job_seq', GREATEST((SELECT COALESCE(MAX(seq), 0) FROM jobs), 1))", logger: log)
            try await conn.rows("SELECT setval('audit_log_id_seq', GREATEST((SELECT COALESCE(MAX(id), 0) FROM audit_log), 1))", logger: log)
            try await conn.rows("SELECT setval('events_id_seq', GREATEST((SELECT COALESCE(MAX(id), 0) FROM events), 1))", logger: log)
            try await conn.rows("SELECT setval('webhook_attempts_id_seq', GREATEST((SELECT COALESCE(MAX(id), 0) FROM webhook_attempts), 1))", logger: log)
        }
    }
}
