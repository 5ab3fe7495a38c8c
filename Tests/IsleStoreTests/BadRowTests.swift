import Foundation
import GRDB
import IsleCore
import IsleStore
import IsleDelivery
import Testing

/// A stored row that does not decode is an error naming its table, row and column — never a
/// default (docs/server.md, "Delivery semantics"). In the claim, such a job is failed with that reason and its lane moves on:
/// it is never sent with a guessed kind or payload, and it blocks nothing.
@Suite("Bad rows: an error with the row's id, never a default")
struct BadRowTests {
    @Test("a job whose kind or aps no version of Isle writes: failed with the reason, the next job of its lane and other lanes claimed")
    func badJobsAreFailedNotGuessed() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("isle-badrow-\(UUID().uuidString).sqlite").path
        let store = try SQLiteStore(path: path)
        try await store.migrate()
        let t0 = Date(timeIntervalSince1970: 1_790_000_000)
        for id in ["a", "b"] {
            try await store.insertActivity(ActivityRecord(id: id, bundleID: "com.example.pizza", attributesType: "T", state: .active, updateToken: "tok-\(id)", startedAt: t0))
        }
        func update(_ activity: String, _ text: String) -> NewPushJob {
            NewPushJob(bundleID: "com.example.pizza", kind: .update, activityID: activity, payload: .update(["x": .string(text)], alert: LiveActivityAlert(title: "T", body: "B"), at: t0), runAt: t0)
        }
        let ids = try await store.enqueue([update("a", "1"), update("a", "2"), update("b", "1")], idempotency: nil, now: t0)
        // Corrupt the first job of lane a (kind) and the job of lane b (aps), as a foreign writer might.
        let db = try DatabaseQueue(path: path)
        try await db.write { db in
            try db.execute(sql: "UPDATE jobs SET kind = 'teleport' WHERE id = ?", arguments: [ids[0]])
            try db.execute(sql: "UPDATE jobs SET aps = '{not json' WHERE id = ?", arguments: [ids[2]])
        }
        let first = try await store.claim(limit: 10, now: t0, lease: 60, worker: "w", excludingApps: [])
        #expect(first.isEmpty, "neither bad job is handed out: \(first.map(\.job.id))")
        // Its lane moved on: the next job of lane a is its head, handed out at the next claim.
        let next = try await store.claim(limit: 10, now: t0, lease: 60, worker: "w", excludingApps: [])
        #expect(next.map(\.job.id) == [ids[1]], "\(next.map(\.job.id))")
        let rows = try db.read { db in try Row.fetchAll(db, sql: "SELECT id, state, last_error FROM jobs WHERE id IN (?, ?) ORDER BY id", arguments: [ids[0], ids[2]]) }
        #expect(rows.map { $0["state"] as String } == ["failed", "failed"])
        #expect((rows[0]["last_error"] as String).contains("jobs row \(ids[0]): column kind holds \"teleport\""), "\(rows[0]["last_error"] as String)")
        #expect((rows[1]["last_error"] as String).contains("jobs row \(ids[2]): column aps"), "\(rows[1]["last_error"] as String)")
        // Reading a bad row is an error naming it, not a guess.
        do {
            _ = try await store.job(id: ids[0])
            Issue.record("a bad job row was read")
        } catch let e as BadRow {
            #expect(e.table == "jobs" && e.id == String(ids[0]) && e.column == "kind")
        }
        // Counting jobs by state: a state no version writes is an error naming it, not a row left out.
        try await db.write { db in try db.execute(sql: "UPDATE jobs SET state = 'hovering' WHERE id = ?", arguments: [ids[1]]) }
        do {
            _ = try await store.jobCounts()
            Issue.record("a job in an unknown state was left out of the counts")
        } catch let e as BadRow {
            #expect(e.table == "jobs" && e.column == "state" && e.description.contains("hovering"), "\(e)")
        }
        // Reading a bad activity is an error naming it, not a guessed state.
        try await db.write { db in try db.execute(sql: "UPDATE activities SET state = 'levitating' WHERE id = 'b'") }
        do {
            _ = try await store.activity(id: "b")
            Issue.record("a bad activity row was read")
        } catch let e as BadRow {
            #expect(e.table == "activities" && e.id == "b" && e.column == "state" && e.description.contains("levitating"))
        }
    }

    @Test("installation tokens, an activity's content or environment, an app's schemas or ticket keys that do not decode: errors naming the row and column, never an empty default", arguments: [
        ("installations", "push_to_start_tokens", "'[1, 2]'"),
        ("installations", "push_to_start_tokens", "'{\"T\": 7}'"),
        ("installations", "environment", "'staging'"),
        ("activities", "content", "'{not json'"),
        ("activities", "environment", "'staging'"),
        ("apps", "schemas", "'[{\"attributesType\": 3}]'"),
        ("apps", "ticket_keys", "'[{\"id\": \"k\"}]'"),
        // Before: read as a device key.
        ("api_keys", "scope", "'superuser'"),
    ])
    func otherColumns(table: String, column: String, value: String) async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("isle-badrow-\(UUID().uuidString).sqlite").path
        let store = try SQLiteStore(path: path)
        try await store.migrate()
        let t0 = Date(timeIntervalSince1970: 1_790_000_000)
        try await store.upsertApp(AppRecord(bundleID: "com.example.pizza", teamID: "TEAM000001", keyID: "KEY0000001", keyPEM: "-", createdAt: t0))
        try await store.upsertInstallation(InstallationRecord(id: "phone", bundleID: "com.example.pizza", pushToStartTokens: ["T": "pts"], updatedAt: t0))
        try await store.insertActivity(ActivityRecord(id: "a", bundleID: "com.example.pizza", installationID: "phone", attributesType: "T", content: ["x": 1], state: .active, startedAt: t0))
        try await store.insertAPIKey(APIKeyRecord(id: "key_phone", bundleID: "com.example.pizza", scope: .device, secretHash: "h", createdAt: t0))
        let db = try DatabaseQueue(path: path)
        try await db.write { db in try db.execute(sql: "UPDATE \(table) SET \(column) = \(value)") }
        do {
            switch table {
            case "installations": _ = try await store.installation(bundleID: "com.example.pizza", id: "phone")
            case "activities": _ = try await store.activity(id: "a")
            case "api_keys": _ = try await store.apiKey(secretHash: "h")
            default: _ = try await store.app("com.example.pizza")
            }
            Issue.record("\(table).\(column) = \(value) was read")
        } catch let e as BadRow {
            #expect(e.table == table && e.column == column, "\(e)")
            #expect(e.id.contains(table == "apps" ? "com.example.pizza" : table == "activities" ? "a" : table == "api_keys" ? "key_phone" : "phone"), "\(e)")
        }
    }
}
