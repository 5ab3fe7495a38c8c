import Foundation
import IsleCore
import IsleStore
import Testing

/// The contract every store keeps (PostgreSQL will run the same suite). Each test gets a fresh
/// store made by `makeStore`.
enum StoreKind: String, CaseIterable, Sendable {
    case sqlite

    func make() async throws -> any IsleStore {
        switch self {
        case .sqlite:
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("isle-store-\(UUID().uuidString).sqlite").path
            let store = try SQLiteStore(path: path)
            try await store.migrate()
            return store
        }
    }
}

@Suite("Store contract")
struct StoreContractTests {
    let t0 = Date(timeIntervalSince1970: 1_767_225_600)

    func seeded(_ kind: StoreKind, activities: Int = 2) async throws -> any IsleStore {
        let s = try await kind.make()
        try await s.upsertApp(AppRecord(bundleID: "com.example.pizza", teamID: "TEAM000001", keyID: "KEY0000001", keyPEM: "-", createdAt: t0))
        for i in 0..<activities {
            try await s.insertActivity(ActivityRecord(id: "a\(i)", bundleID: "com.example.pizza", externalKey: "k\(i)", attributesType: "T", state: .active, updateToken: "tok\(i)", startedAt: t0, topics: ["t"]))
        }
        return s
    }

    func update(_ activity: String, _ text: String, alert: Bool = false, at: Date? = nil) -> NewPushJob {
        NewPushJob(bundleID: "com.example.pizza", kind: .update, activityID: activity, aps: ["event": "update", "content-state": ["x": .string(text)]], hasAlert: alert, runAt: at ?? t0)
    }

    @Test("migrations are idempotent; apps, keys and installations round-trip", arguments: StoreKind.allCases)
    func basics(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.migrate()
        #expect(try await s.app("com.example.pizza")?.teamID == "TEAM000001")
        try await s.insertAPIKey(APIKeyRecord(id: "k1", bundleID: "com.example.pizza", scope: .backend, secretHash: "h", createdAt: t0))
        #expect(try await s.apiKey(secretHash: "h")?.scope == .backend)
        #expect(try await s.revokeAPIKey(id: "k1", at: t0))
        #expect(try await s.apiKey(secretHash: "h")?.revokedAt == t0)
        #expect(try await !s.revokeAPIKey(id: "k1", at: t0))
        try await s.upsertInstallation(InstallationRecord(id: "i1", bundleID: "com.example.pizza", userID: "u", pushToStartTokens: ["T": "abcd"], updatedAt: t0))
        #expect(try await s.installations(bundleID: "com.example.pizza", userID: "u").first?.pushToStartTokens == ["T": "abcd"])
        #expect(try await s.activities(bundleID: "com.example.pizza", topic: "t").count == 2)
        #expect(try await s.activity(updateToken: "tok1")?.id == "a1")
    }

    @Test("one job per activity at a time, in order; other activities are not blocked", arguments: StoreKind.allCases)
    func ordering(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.enqueue([update("a0", "1", alert: true), update("a0", "2", alert: true), update("a1", "x", alert: true)], idempotency: nil)
        let first = try await s.claim(limit: 10, now: t0, lease: 60, worker: "w")
        #expect(first.map(\.job.activityID) == ["a0", "a1"])
        #expect(first[0].job.aps["content-state"]?["x"] == "1")
        // a0's second job waits for the first.
        #expect(try await s.claim(limit: 10, now: t0, lease: 60, worker: "w").isEmpty)
        #expect(try await s.finish(first[0], state: .sent, error: nil, delivery: nil, activity: nil, highPriorityAt: nil))
        let next = try await s.claim(limit: 10, now: t0, lease: 60, worker: "w")
        #expect(next.first?.job.aps["content-state"]?["x"] == "2")
        // Timestamps strictly increase per activity, even within one second.
        #expect(next[0].timestamp > first[0].timestamp)
    }

    @Test("coalescing: superseded plain updates are not sent; alerts and ends always are", arguments: StoreKind.allCases)
    func coalescing(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.enqueue([update("a0", "1"), update("a0", "2"), update("a0", "alert", alert: true), update("a0", "3"), update("a0", "4")], idempotency: nil)
        var sent: [String] = []
        while let c = try await s.claim(limit: 1, now: t0, lease: 60, worker: "w").first {
            sent.append(c.job.aps["content-state"]?["x"]?.stringValue ?? "")
            _ = try await s.finish(c, state: .sent, error: nil, delivery: nil, activity: nil, highPriorityAt: nil)
        }
        #expect(sent == ["alert", "4"])
        let counts = try await s.jobCounts()
        #expect(counts[.superseded] == 3 && counts[.sent] == 2)
    }

    @Test("broadcasts go out one at a time per channel, coalesced, with increasing timestamps; channels do not block each other", arguments: StoreKind.allCases)
    func broadcastOrdering(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        for c in ["ch1", "ch2"] { try await s.insertChannel(ChannelRecord(id: c, bundleID: "com.example.pizza", storagePolicy: 0, createdAt: t0)) }
        func broadcast(_ channel: String, _ text: String, event: String = "update", alert: Bool = false) -> NewPushJob {
            NewPushJob(bundleID: "com.example.pizza", kind: .broadcast, channelID: channel, aps: ["event": .string(event), "content-state": ["x": .string(text)]], hasAlert: alert, runAt: t0)
        }
        try await s.enqueue([broadcast("ch1", "1", alert: true), broadcast("ch1", "2"), broadcast("ch1", "3"), broadcast("ch2", "x")], idempotency: nil)
        let first = try await s.claim(limit: 10, now: t0, lease: 60, worker: "w")
        #expect(first.map { $0.job.aps["content-state"]?["x"] } == ["1", "x"])
        // ch1's next job waits for the first: devices drop a push older than the last applied.
        #expect(try await s.claim(limit: 10, now: t0, lease: 60, worker: "w").isEmpty)
        #expect(try await s.finish(first[0], state: .sent, error: nil, delivery: nil, activity: nil, highPriorityAt: nil))
        let next = try await s.claim(limit: 10, now: t0, lease: 60, worker: "w")
        // "2" was superseded by "3" before it was sent.
        #expect(next.map { $0.job.aps["content-state"]?["x"] } == ["3"])
        #expect(next[0].timestamp > first[0].timestamp)
        #expect(try await s.jobCounts()[.superseded] == 1)
    }

    @Test("scheduled jobs wait for their time and do not block due ones", arguments: StoreKind.allCases)
    func scheduling(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.enqueue([update("a0", "later", alert: true, at: t0.addingTimeInterval(600)), update("a0", "now", alert: true)], idempotency: nil)
        #expect(try await s.claim(limit: 10, now: t0, lease: 60, worker: "w").map { $0.job.aps["content-state"]?["x"] } == ["now"])
    }

    @Test("a crashed worker's claims come back after the lease; its late finish is refused; the retry reuses timestamp and apns-id", arguments: StoreKind.allCases)
    func leases(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.enqueue([update("a0", "1")], idempotency: nil)
        let lost = try #require(try await s.claim(limit: 1, now: t0, lease: 60, worker: "dead").first)
        #expect(try await s.requeueExpiredClaims(now: t0.addingTimeInterval(30)) == 0)
        #expect(try await s.requeueExpiredClaims(now: t0.addingTimeInterval(61)) == 1)
        let again = try #require(try await s.claim(limit: 1, now: t0.addingTimeInterval(62), lease: 60, worker: "alive").first)
        #expect(again.timestamp == lost.timestamp && again.apnsID == lost.apnsID)
        #expect(again.job.attempts == 2)
        #expect(try await !s.finish(lost, state: .sent, error: nil, delivery: nil, activity: nil, highPriorityAt: nil))
        #expect(try await s.finish(again, state: .sent, error: nil, delivery: nil, activity: nil, highPriorityAt: nil))
    }

    @Test("retry puts a job back for later with its attempt recorded; deliveries and the budget are kept", arguments: StoreKind.allCases)
    func retries(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.enqueue([update("a0", "1")], idempotency: nil)
        let c = try #require(try await s.claim(limit: 1, now: t0, lease: 60, worker: "w").first)
        let d = DeliveryRecord(jobID: c.job.id, activityID: "a0", apnsID: c.apnsID, apnsUniqueID: nil, status: 503, reason: "ServiceUnavailable", latencyMS: 1, priority: 10, downgraded: false, at: t0)
        #expect(try await s.retry(c, runAt: t0.addingTimeInterval(10), error: "503", delivery: d))
        #expect(try await s.claim(limit: 1, now: t0.addingTimeInterval(5), lease: 60, worker: "w").isEmpty)
        let c2 = try #require(try await s.claim(limit: 1, now: t0.addingTimeInterval(10), lease: 60, worker: "w").first)
        var a = try #require(try await s.activity(id: "a0"))
        a.content = ["x": "1"]
        #expect(try await s.finish(c2, state: .sent, error: nil, delivery: DeliveryRecord(jobID: c2.job.id, activityID: "a0", apnsID: c2.apnsID, apnsUniqueID: "u", status: 200, reason: nil, latencyMS: 1, priority: 10, downgraded: false, at: t0), activity: a, highPriorityAt: t0))
        #expect(try await s.deliveries(activityID: "a0").map(\.status) == [503, 200])
        #expect(try await s.delivery(apnsID: c.apnsID)?.status == 200)
        #expect(try await s.highPrioritySends(activityID: "a0", since: t0.addingTimeInterval(-3600)) == 1)
        #expect(try await s.activity(id: "a0")?.content == ["x": "1"])
    }

    @Test("enqueue is atomic with its idempotency record; a 1,000-job fan-out commits at once", arguments: StoreKind.allCases)
    func enqueueAtomic(_ kind: StoreKind) async throws {
        let s = try await seeded(kind, activities: 1000)
        let record = IdempotencyRecord(key: "k", bundleID: "com.example.pizza", requestHash: "h", status: 202, body: "{}", createdAt: t0)
        let ids = try await s.enqueue((0..<1000).map { update("a\($0)", "go") }, idempotency: record)
        #expect(ids.count == 1000 && Set(ids).count == 1000)
        #expect(try await s.idempotencyRecord(bundleID: "com.example.pizza", key: "k")?.status == 202)
        // A second enqueue with the same key fails and leaves nothing behind.
        await #expect(throws: (any Error).self) { try await s.enqueue([update("a0", "dup")], idempotency: record) }
        #expect(try await s.jobCounts()[.queued] == 1000)
    }
}
