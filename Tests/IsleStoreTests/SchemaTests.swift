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
}
