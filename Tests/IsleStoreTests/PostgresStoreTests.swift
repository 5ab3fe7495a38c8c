import Foundation
import IsleCore
@testable import IsleStore
import IsleDelivery
import Logging
import IsleTesting
import Testing

/// What only the PostgreSQL store has: its URL settings, migrations racing at start, and
/// LISTEN/NOTIFY wake-ups between processes (two stores = two connection pools, as two instances).
@Suite("PostgreSQL store")
struct PostgresStoreTests {
    @Test("settings: the password comes from the URL, PGPASSWORD or a file, and is never in the redacted form; bad settings name themselves")
    func settings() throws {
        let s = try PostgresSettings(url: "postgres://isle:s3cr%40t@db.internal:6543/isle?sslmode=require&pool=5&statement_timeout=12", environment: [:])
        #expect(s.host == "db.internal" && s.port == 6543 && s.username == "isle" && s.password == "s3cr@t" && s.database == "isle")
        #expect(s.tls == .require && s.poolSize == 5 && s.statementTimeout == 12)
        #expect(s.redacted == "postgres://isle@db.internal:6543/isle" && !s.redacted.contains("s3cr"))
        #expect(try PostgresSettings(url: "postgres://isle@h/db", environment: ["PGPASSWORD": "from-env"]).password == "from-env")
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("pgpass-\(UUID().uuidString)").path
        try "from-file\n".write(toFile: file, atomically: true, encoding: .utf8)
        // A password file others can read is refused, saying how to fix it (docs/security.md).
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: file)
        #expect(throws: StoreError.self) { try PostgresSettings(url: "postgres://isle@h/db?passwordfile=\(file)", environment: [:]) }
        do { _ = try PostgresSettings(url: "postgres://isle@h/db?passwordfile=\(file)", environment: [:]) } catch let e as StoreError {
            #expect(e.message.contains("readable by others") && e.message.contains("chmod 600") && !e.message.contains("from-file"))
        }
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: file)
        #expect(try PostgresSettings(url: "postgres://isle@h/db?passwordfile=\(file)", environment: [:]).password == "from-file")
        #expect(try PostgresSettings(url: "postgres://isle@h/db", environment: ["ISLE_DATABASE_PASSWORD_FILE": file]).password == "from-file")
        #expect(try PostgresSettings(url: "postgres://isle@h/db", environment: [:]).password == nil)
        for (url, says) in [("postgres://h/db", "no user"), ("postgres://isle@h", "no database"), ("postgres://isle@h/db?pool=0", "pool"),
                            ("postgres://isle@h/db?sslmode=maybe", "sslmode"), ("postgres://isle@h/db?colour=blue", "unknown PostgreSQL URL setting colour"),
                            ("postgres://isle@h/db?statement_timeout=1e9", "statement_timeout")] {
            #expect(throws: StoreError.self, "\(url)") { try PostgresSettings(url: url, environment: [:]) }
            do { _ = try PostgresSettings(url: url, environment: [:]) } catch let e as StoreError { #expect(e.message.contains(says), "\(url): \(e.message)") }
        }
    }

    @Test("the two schemas do not drift: every table has the same columns in SQLite and PostgreSQL, of the same kind and nullability", .enabled(if: PostgresTestDatabase.url != nil, "needs ISLE_TEST_POSTGRES_URL"))
    func schemasAgree() async throws {
        let pg = try await PostgresTestDatabase.fresh()
        try await pg.migrate()
        let sqlite = try SQLiteStore(path: FileManager.default.temporaryDirectory.appendingPathComponent("isle-schema-\(UUID().uuidString).sqlite").path)
        try await sqlite.migrate()
        // Where the dialects differ by design: PostgreSQL numbers rows explicitly where SQLite has its rowid.
        let postgresOnly: Set<String> = ["activities.ord", "high_priority_sends.id"]
        // A type of one dialect, as the kind of value it holds.
        func kind(_ type: String) -> String {
            switch type.uppercased() {
            // Moments are SQLite's REAL seconds, PostgreSQL's TIMESTAMPTZ; JSON is SQLite's TEXT, PostgreSQL's JSONB (Schema).
            case "TEXT", "JSONB", "JSON": "text"
            case "INTEGER", "BIGINT", "BOOLEAN": "integer"
            case "REAL", "DOUBLE PRECISION", "TIMESTAMP WITH TIME ZONE": "real"
            default: type
            }
        }
        for table in DataCopy.tables {
            let s = Dictionary(uniqueKeysWithValues: try await sqlite.columns(of: table).map { ($0.name, $0) })
            let p = Dictionary(uniqueKeysWithValues: try await pg.columns(of: table).map { ($0.name, $0) }.filter { !postgresOnly.contains("\(table).\($0.0)") })
            #expect(s.count >= 2 && p.count >= 2, "\(table): no columns read")
            #expect(Set(s.keys) == Set(p.keys), "\(table): only in SQLite \(Set(s.keys).subtracting(p.keys).sorted()), only in PostgreSQL \(Set(p.keys).subtracting(s.keys).sorted())")
            for (name, c) in s {
                guard let other = p[name] else { continue }
                #expect(kind(c.type) == kind(other.type), "\(table).\(name): SQLite \(c.type), PostgreSQL \(other.type)")
                #expect(c.nullable == other.nullable, "\(table).\(name): nullable in SQLite \(c.nullable), in PostgreSQL \(other.nullable)")
            }
        }
    }

    @Test("a refused password, user or database fails at once with its own message, never the password", .enabled(if: PostgresTestDatabase.url != nil, "needs ISLE_TEST_POSTGRES_URL"))
    func refusedCredentials() async throws {
        let base = try PostgresSettings(url: try #require(PostgresTestDatabase.url))
        var noDatabase = base
        noDatabase.database = "isle_missing_\(UUID().uuidString.prefix(8).lowercased())"
        var noUser = base
        noUser.username = "isle_nobody"
        for (settings, state, says) in [(noDatabase, "3D000", "has no database \(noDatabase.database)"), (noUser, "28000", "refused user isle_nobody")] {
            try await Self.expectRefused(settings, state: state, says: says)
        }
        // A wrong password needs a server that asks for one: IsleServerTests' "PostgreSQL that asks for a password".
    }

    static func expectRefused(_ settings: PostgresSettings, state: String, says: String, never: String? = nil) async throws {
        let store = PostgresStore(settings: settings, logger: PostgresTestDatabase.logger)
        let start = ContinuousClock.now
        do {
            try await store.withRunning { try await store.migrate() }
            Issue.record("\(state): the store ran")
        } catch let e as StoreError {
            #expect(e.code == .refused && e.message.contains(state) && e.message.contains(says), "\(e.message)")
            if let never { #expect(!e.message.contains(never)) }
        }
        // Before, the pool retried until the call's deadline (statement timeout + 5 s = 35 s).
        let took = ContinuousClock.now - start
        #expect(took < .seconds(10), "\(state) took \(took)")
    }

    @Test("instances that start together migrate once", .enabled(if: PostgresTestDatabase.url != nil, "needs ISLE_TEST_POSTGRES_URL"))
    func concurrentMigrations() async throws {
        let first = try await PostgresTestDatabase.fresh()
        let others = (0..<3).map { _ in PostgresStore(settings: first.settings, logger: PostgresTestDatabase.logger) }
        for o in others { Task.detached { await o.run() } }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await first.migrate() }
            for o in others { group.addTask { try await o.migrate() } }
            try await group.waitForAll()
        }
        // Every store works on the one schema.
        try await others[0].upsertApp(AppRecord(bundleID: "com.example.pizza", teamID: "T", keyID: "K", keyPEM: "-", createdAt: Date()))
        #expect(try await first.apps().count == 1)
    }

    @Test("work queued by one instance wakes another at once (LISTEN/NOTIFY)", .enabled(if: PostgresTestDatabase.url != nil, "needs ISLE_TEST_POSTGRES_URL"))
    func notifyWakesOtherInstances() async throws {
        let a = try await PostgresTestDatabase.fresh()
        try await a.migrate()
        let b = PostgresStore(settings: a.settings, logger: PostgresTestDatabase.logger)
        Task.detached { await b.run() }
        let wakes = Locked(0)
        let listener = Task { await b.listenForWork { wakes.withLock { $0 += 1 } } }
        defer { listener.cancel() }
        try await a.upsertApp(AppRecord(bundleID: "com.example.pizza", teamID: "T", keyID: "K", keyPEM: "-", createdAt: Date()))
        try await a.insertActivity(ActivityRecord(id: "a0", bundleID: "com.example.pizza", attributesType: "T", state: .active, updateToken: "t0", startedAt: Date()))
        // The listener subscribes asynchronously: queue work, and wait (with a deadline) for the
        // wake-up; one that came before the subscription is lost, so queue again, up to 50 times.
        var woke = false
        for n in 0..<50 where !woke {
            _ = try await a.enqueue([NewPushJob(bundleID: "com.example.pizza", kind: .update, activityID: "a0",
                                                payload: .update(["n": .int(Int64(n))], alert: LiveActivityAlert(title: "T", body: "B"), at: Date()), runAt: Date())], idempotency: nil, now: Date())
            woke = (try? await eventually(within: .milliseconds(300), "a wake-up") { wakes.withLock { $0 } > 0 }) != nil
        }
        #expect(woke, "the other instance was never woken")
    }

    @Test("reads for accepting pushes, many at once, batched into shared statements: each caller gets its own activity, nil for a missing one, an error for a row that does not decode",
          .enabled(if: PostgresTestDatabase.url != nil, "needs ISLE_TEST_POSTGRES_URL"))
    func batchedPushReads() async throws {
        let store = try await PostgresTestDatabase.fresh()
        try await store.migrate()
        let t0 = Date(timeIntervalSince1970: 1_790_000_000)
        for i in 0..<40 {
            try await store.insertActivity(ActivityRecord(id: "a\(i)", bundleID: "com.example.pizza", attributesType: "T", content: ["n": .int(Int64(i))], state: .active,
                                                          updateToken: "tok\(i)", startedAt: t0), idempotency: nil)
        }
        try await store.transaction { conn in
            try await conn.rows("UPDATE activities SET state = 'levitating' WHERE id = 'a7'", logger: PostgresTestDatabase.logger)
        }
        let results = try await withThrowingTaskGroup(of: (String, Result<ActivityRecord?, any Error>).self) { group in
            for round in 0..<5 {
                for i in 0..<45 {
                    let id = "a\(i)"
                    group.addTask {
                        do { return (id, .success(try await store.activityForPush(id: id))) } catch { return (id, .failure(error)) }
                    }
                }
                _ = round
            }
            var all: [(String, Result<ActivityRecord?, any Error>)] = []
            for try await r in group { all.append(r) }
            return all
        }
        #expect(results.count == 225)
        for (id, result) in results {
            let n = Int(id.dropFirst())!
            switch (n, result) {
            case (7, .failure(let e)): #expect((e as? BadRow)?.column == "state", "\(e)")
            case (40..., .success(let a)): #expect(a == nil, "\(id)")
            case (_, .success(let a)): #expect(a?.id == id && a?.updateToken == "tok\(n)" && a?.content == nil, "\(id): \(String(describing: a))")
            default: Issue.record("\(id): \(result)")
            }
        }
    }
}
