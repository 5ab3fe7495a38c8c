import Foundation
import GRDB
import IsleCore
@testable import IsleStore
import IsleDelivery
import Testing

/// One schema definition (`Schema`) for both stores: a database created from it and one an earlier
/// Isle made, brought forward by the frozen steps and the shared changes, must be the same, and
/// be the definition — on SQLite and on PostgreSQL.
@Suite("Schema definition")
struct SchemaTests {
    /// information_schema's name for each kind on PostgreSQL.
    static func postgresType(_ kind: Schema.Kind) -> String {
        switch kind {
        case .text: "text"
        case .integer, .rowNumber: "bigint"
        case .real: "double precision"
        case .flag: "boolean"
        case .time: "timestamp with time zone"
        case .json: "jsonb"
        case .orderedJSON: "json"
        }
    }

    /// Every column of the definition in `dialect` has its line in `description`, holding each of
    /// `fragments`; and the description has no other column.
    static func expectColumns(_ description: [String], _ dialect: Schema.Dialect, fragments: (Schema.Table, Schema.Column) -> [String]) {
        let columns = description.filter { $0.hasPrefix("column ") }
        var expected = 0
        for table in Schema.tables {
            for column in table.columns(in: dialect) {
                expected += 1
                let line = columns.first { $0.hasPrefix("column \(table.name).\(column.name) ") }
                for fragment in fragments(table, column) {
                    #expect(line?.contains(fragment) == true, "\(table.name).\(column.name): \(line ?? "missing"), expected \(fragment)")
                }
            }
        }
        #expect(columns.count == expected, "columns the definition does not have: \(columns.count) vs \(expected)")
    }

    /// The name in "index CREATE [UNIQUE] INDEX name ON …".
    static func indexName(_ line: String) -> String {
        let words = line.split(separator: " ").map(String.init)
        return words.firstIndex(of: "INDEX").map { words[$0 + 1] } ?? line
    }

    static func sqliteFile() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("isle-schema-\(UUID().uuidString).sqlite").path
    }

    @Test("SQLite: a file created from the definition and a file an earlier Isle made, brought forward, have one schema: the definition's")
    func sqlite() async throws {
        let fresh = try SQLiteStore(path: Self.sqliteFile())
        try await fresh.migrate()
        let replayed = try SQLiteStore(path: Self.sqliteFile())
        try await replayed.migrate(replayingFrozenSteps: true)
        let a = try fresh.schemaDescription(), b = try replayed.schemaDescription()
        #expect(a.count > 100)
        #expect(a == b, "only created: \(Set(a).subtracting(b).sorted()); only brought forward: \(Set(b).subtracting(a).sorted())")

        Self.expectColumns(a, .sqlite) { table, column in
            // SQLite reports a key's column as nullable unless declared NOT NULL: only the others' nullability is the definition's.
            let keyed = column.primaryKey || (table.primaryKey ?? []).contains(column.name)
            return [" \(column.kind.type(in: .sqlite)) "] + (keyed ? [] : ["notnull=\(column.nullable ? 0 : 1)"])
        }
        let indexes = Set(a.filter { $0.hasPrefix("index ") }.map(Self.indexName))
        #expect(indexes == Set(Schema.indexes.filter { $0.only != .postgres }.map(\.name)))
        // Migrating again changes nothing.
        try await fresh.migrate()
        #expect(try fresh.schemaDescription() == a)
    }

    @Test("PostgreSQL: a database created from the definition and one an earlier Isle made, brought forward, have one schema: the definition's (TIMESTAMPTZ, JSONB)",
          .enabled(if: PostgresTestDatabase.url != nil, "needs ISLE_TEST_POSTGRES_URL"))
    func postgres() async throws {
        let fresh = try await PostgresTestDatabase.fresh()
        try await fresh.migrate()
        let replayed = try await PostgresTestDatabase.fresh()
        try await replayed.migrate(replayingFrozenSteps: true)
        let a = try await fresh.schemaDescription(), b = try await replayed.schemaDescription()
        #expect(a.count > 100)
        #expect(a == b, "only created: \(Set(a).subtracting(b).sorted()); only brought forward: \(Set(b).subtracting(a).sorted())")

        Self.expectColumns(a, .postgres) { table, column in
            let nullable = column.nullable && !column.primaryKey && column.kind != .rowNumber && !(table.primaryKey ?? []).contains(column.name)
            return [" \(Self.postgresType(column.kind)) nullable=\(nullable ? "YES" : "NO")"]
        }
        // Less the indexes of keys and unique constraints.
        let constraints = Set(a.filter { $0.hasPrefix("constraint ") }.compactMap { $0.split(separator: " ")[1].split(separator: ".").last.map(String.init) })
        let indexes = Set(a.filter { $0.hasPrefix("index ") }.map(Self.indexName)).subtracting(constraints)
        #expect(indexes == Set(Schema.indexes.filter { $0.only != .sqlite }.map(\.name)))
        #expect(!a.contains { $0.contains("double precision") && ($0.contains("_at ") || $0.contains(".at ") || $0.contains("stale_date") || $0.contains("run_at")) })
        try await fresh.migrate()
        #expect(try await fresh.schemaDescription() == a)
    }

    @Test("PostgreSQL: a database an earlier Isle filled (seconds as DOUBLE PRECISION, JSON as TEXT) keeps every value through the change to TIMESTAMPTZ and JSONB",
          .enabled(if: PostgresTestDatabase.url != nil, "needs ISLE_TEST_POSTGRES_URL"))
    func postgresValuesSurvive() async throws {
        let store = try await PostgresTestDatabase.fresh()
        try await store.migrate(replayingFrozenSteps: true, stoppingAfterFrozenSteps: true)
        let log = PostgresTestDatabase.logger
        try await store.transaction { conn in
            try await conn.rows("""
                INSERT INTO apps (bundle_id, team_id, key_id, key_pem, frequent_updates, schemas, created_at, ticket_keys)
                VALUES ('com.example.pizza', 'TEAM000001', 'KEY0000001', '-', TRUE, '[]', 1790000000.25, '[]')
                """, logger: log)
            try await conn.rows("""
                INSERT INTO installations (id, bundle_id, push_to_start_tokens, live_activities_enabled, frequent_pushes_enabled, updated_at)
                VALUES ('phone', 'com.example.pizza', '{"PizzaAttributes": "ab12"}', TRUE, FALSE, 1790000001.5)
                """, logger: log)
            try await conn.rows("""
                INSERT INTO activities (id, bundle_id, installation_id, attributes_type, attributes, content, state, update_token, stale_date, started_at)
                VALUES ('a1', 'com.example.pizza', 'phone', 'PizzaAttributes', '{"order": 42}', '{"status": "baking", "eta": 1790000900}', 'active', 'cd34', 1790003600, 1790000002.125)
                """, logger: log)
            try await conn.rows("""
                INSERT INTO jobs (bundle_id, kind, activity_id, aps, has_alert, run_at, state, created_at, lane, seq, is_head)
                VALUES ('com.example.pizza', 'update', 'a1', '{"event":"update","content-state":{"status":"out"}}', FALSE, 1790000003, 'queued', 1790000003, 'a:a1', nextval('job_seq'), TRUE)
                """, logger: log)
        }
        try await store.migrate()
        let app = try #require(try await store.app("com.example.pizza"))
        #expect(app.createdAt == Date(timeIntervalSince1970: 1_790_000_000.25) && app.frequentUpdatesDeclared)
        let i = try #require(try await store.installation(bundleID: "com.example.pizza", id: "phone"))
        #expect(i.pushToStartTokens == ["PizzaAttributes": "ab12"] && i.updatedAt == Date(timeIntervalSince1970: 1_790_000_001.5))
        let a = try #require(try await store.activity(id: "a1"))
        #expect(a.content == ["status": "baking", "eta": 1_790_000_900] && a.attributes == ["order": 42])
        #expect(a.staleDate == Date(timeIntervalSince1970: 1_790_003_600) && a.startedAt == Date(timeIntervalSince1970: 1_790_000_002.125))
        // The queued job is claimed after the change, its payload byte for byte.
        let claimed = try await store.claim(limit: 10, now: Date(timeIntervalSince1970: 1_790_000_010), lease: 30, worker: "w", excludingApps: [])
        #expect(claimed.count == 1 && claimed.first.map { String(decoding: $0.job.encodedAPS, as: UTF8.self) } == #"{"event":"update","content-state":{"status":"out"}}"#
                && claimed.first?.job.payload.liveActivity?.contentState == ["status": "out"])
    }

    /// The schema version of the previous release (0.9.0): the frozen steps and the changes up to
    /// "webhooks by key" and before "unpushed activities and webhook keys".
    static let previousRelease = SQLiteStore.frozenMigrations.count + (Schema.changes.firstIndex { $0.name == "unpushed activities and webhook keys" } ?? 0)

    @Test("SQLite: a database written by the previous release's schema, with data in it, is brought forward: every row reads back and a queued push is claimed with its payload")
    func upgradeFromThePreviousRelease() async throws {
        let path = Self.sqliteFile()
        let old = try SQLiteStore(path: path)
        try await old.migrate(replayingFrozenSteps: true, through: Self.previousRelease)
        #expect(try await old.schemaCheck() == SchemaCheck(current: Self.previousRelease, known: SQLiteStore.schemaVersion))
        let t0 = Date(timeIntervalSince1970: 1_790_000_000)
        // What that release wrote: an app with its keys, an installation, an activity, a queued
        // push, a delivery, an event, and a webhook (without the key_id it did not have).
        // The app as that release wrote it (without the environment_keys it did not have).
        try await old.pool.write { db in
            try db.execute(sql: """
                INSERT INTO apps (bundle_id, team_id, key_id, key_pem, frequent_updates, schemas, created_at, ticket_keys)
                VALUES ('com.example.pizza', 'TEAM123456', 'KEY1234567', 'isle-sealed:v1:AAAA', 0, '[]', ?, '[]')
                """, arguments: [t0.timeIntervalSince1970])
        }
        try await old.insertAPIKey(APIKeyRecord(id: "key_old", bundleID: "com.example.pizza", scope: .backend, secretHash: "hash", createdAt: t0))
        try await old.insertActivity(ActivityRecord(id: "act-1", bundleID: "com.example.pizza", externalKey: "order-1", attributesType: "T", state: .active, updateToken: "tok-1", startedAt: t0))
        let jobs = try await old.enqueue([NewPushJob(bundleID: "com.example.pizza", kind: .update, activityID: "act-1",
                                                     payload: .update(["status": "baking"], alert: LiveActivityAlert(title: "T", body: "B"), at: t0), runAt: t0)],
                                         idempotency: nil, now: t0)
        try await old.pool.write { db in
            try db.execute(sql: "INSERT INTO webhooks (id, bundle_id, url, secret, created_at, cursor, delivered, attempts) VALUES ('wh_old', 'com.example.pizza', 'https://hooks.example.com/isle', 's', ?, 0, 0, 0)",
                           arguments: [t0.timeIntervalSince1970])
            try db.execute(sql: "INSERT INTO events (bundle_id, type, activity_id, data, at, seq) VALUES ('com.example.pizza', 'activity.ended', 'act-1', '{}', ?, 1)", arguments: [t0.timeIntervalSince1970])
        }

        let store = try SQLiteStore(path: path)
        try await store.migrate()
        #expect(try await store.schemaCheck() == SchemaCheck(current: SQLiteStore.schemaVersion, known: SQLiteStore.schemaVersion))
        #expect(try await store.app("com.example.pizza")?.keyID == "KEY1234567")
        #expect(try await store.app("com.example.pizza")?.environmentKeys == [], "an app from before has no key per environment")
        #expect(try await store.apiKeys(bundleID: "com.example.pizza").map(\.id) == ["key_old"])
        #expect(try await store.activity(id: "act-1")?.externalKey == "order-1")
        let hooks = try await store.webhooks(bundleID: "com.example.pizza")
        #expect(hooks.map(\.id) == ["wh_old"] && hooks.first?.keyID == nil)
        #expect(try await store.events(bundleID: "com.example.pizza", after: 0, limit: 10).map(\.event.type) == [.activityEnded])
        let claimed = try await store.claim(limit: 10, now: t0.addingTimeInterval(1), lease: 30, worker: "w", excludingApps: [])
        #expect(claimed.map(\.job.id) == jobs && claimed.first?.job.payload.liveActivity?.contentState == ["status": "baking"])
    }

    @Test("a database newer than this binary is refused, with the versions and what to do, and left unchanged")
    func newerDatabaseRefused() async throws {
        let path = Self.sqliteFile()
        let store = try SQLiteStore(path: path)
        try await store.migrate()
        let known = SQLiteStore.frozenMigrations.count + Schema.changes.count
        try await store.pool.write { db in try db.execute(sql: "INSERT INTO isle_migrations (version, applied_at) VALUES (?, 0)", arguments: [known + 1]) }
        let check = try await store.schemaCheck()
        #expect(check == SchemaCheck(current: known + 1, known: known) && check.problem?.contains("newer Isle") == true)
        do {
            try await SQLiteStore(path: path).migrate()
            Issue.record("a newer database was migrated")
        } catch let e as StoreError {
            #expect(e.code == .refused && e.message.contains("version \(known + 1)") && e.message.contains("up to \(known)") && e.message.contains("backup"), "\(e)")
        }
        #expect(try await store.schemaCheck().current == known + 1)
    }
}
