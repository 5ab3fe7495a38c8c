import Foundation
import IsleCore
import IsleStore
import IsleDelivery
import IsleTesting
import Testing

/// The contract every store keeps: each test runs on every store, with a fresh store made by
/// `make()`. PostgreSQL joins when `ISLE_TEST_POSTGRES_URL` names a server (CI always sets it; see
/// `.ci/run`); without it the PostgreSQL cases are left out and the reason is printed.
enum StoreKind: String, CaseIterable, Sendable {
    case sqlite
    case postgres

    static var allCases: [StoreKind] { PostgresTestDatabase.url == nil ? [.sqlite] : [.sqlite, .postgres] }

    func make() async throws -> any IsleStore {
        switch self {
        case .sqlite:
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("isle-store-\(UUID().uuidString).sqlite").path
            let store = try SQLiteStore(path: path)
            try await store.migrate()
            return store
        case .postgres:
            let store = try await PostgresTestDatabase.fresh()
            try await store.migrate()
            return store
        }
    }
}

@Suite("Store contract")
struct StoreContractTests {
    let t0 = Date(timeIntervalSince1970: 1_767_225_600)
    let ping = LiveActivityAlert(title: "Ping", body: "An alert")
    var startPayload: JobPayload { .start(attributesType: "T", attributes: [:], contentState: [:], alert: ping, at: t0) }

    func seeded(_ kind: StoreKind, activities: Int = 2) async throws -> any IsleStore {
        let s = try await kind.make()
        try await s.upsertApp(AppRecord(bundleID: "com.example.pizza", teamID: "TEAM000001", keyID: "KEY0000001", keyPEM: "-", createdAt: t0))
        for i in 0..<activities {
            try await s.insertActivity(ActivityRecord(id: "a\(i)", bundleID: "com.example.pizza", externalKey: "k\(i)", attributesType: "T", state: .active, updateToken: "tok\(i)", startedAt: t0, topics: ["t"]))
        }
        return s
    }

    func update(_ activity: String, _ text: String, alert: Bool = false, at: Date? = nil) -> NewPushJob {
        NewPushJob(bundleID: "com.example.pizza", kind: .update, activityID: activity, payload: .update(["x": .string(text)], alert: alert ? ping : nil, at: t0), runAt: at ?? t0)
    }

    func end(_ activity: String, content: String? = nil) -> NewPushJob {
        NewPushJob(bundleID: "com.example.pizza", kind: .end, activityID: activity, payload: .end(content.map { ["x": .string($0)] }, at: t0), runAt: t0)
    }

    @discardableResult
    func finish(_ s: any IsleStore, _ c: ClaimedJob, _ state: PushJobState = .sent, activity: ActivityPatch? = nil, delivery: DeliveryRecord? = nil, highPriorityAt: Date? = nil) async throws -> Bool {
        try await s.complete(JobCompletion(claim: c, result: .finished(state, reason: nil), delivery: delivery, activity: activity, highPriorityAt: highPriorityAt))
    }

    func retry(_ s: any IsleStore, _ c: ClaimedJob, at: Date, delivery: DeliveryRecord? = nil) async throws -> Bool {
        try await s.complete(JobCompletion(claim: c, result: .retry(at: at, reason: "503"), delivery: delivery))
    }

    func text(_ c: ClaimedJob) -> String? { content(c)?["x"]?.stringValue }
    func content(_ c: ClaimedJob) -> JSONValue? { c.job.payload.liveActivity?.contentState }

    @Test("failpoints: an armed point fails its call once, writing nothing; after-commit writes and then fails; reads answer none; disarmed, nothing happens", arguments: StoreKind.allCases)
    func failpoints(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        let faults = try #require((s as? any QueueBackedStore)?.faults)
        faults.arm(.enqueue, times: 1)
        await #expect(throws: StoreError.self) { try await s.enqueue([update("a0", "lost")], idempotency: nil, now: t0) }
        #expect(try await s.jobCounts().isEmpty, "nothing written")
        try await s.enqueue([update("a0", "kept")], idempotency: nil, now: t0)
        let c = try #require(try await s.claim(limit: 1, now: t0, lease: 60, worker: "w").first)
        faults.arm(.complete, times: 1)
        await #expect(throws: StoreError.self) { try await finish(s, c) }
        #expect(try await s.jobCounts()[.claimed] == 1, "the result was not written")
        #expect(try await finish(s, c))
        faults.arm(.registryAfterCommit, times: 1)
        await #expect(throws: StoreError.self) { try await s.modifyActivity(id: "a1") { $0.relevanceScore = 9 } }
        #expect(try await s.activity(id: "a1")?.relevanceScore == 9, "written, then the answer lost")
        faults.arm(.activityMissing, times: 1)
        #expect(try await s.activity(id: "a1") == nil)
        #expect(try await s.activity(id: "a1") != nil)
        #expect(faults.injected == 4)
    }

    @Test("retention: finished jobs, deliveries, budget records and idempotency records go after their time; open work never does", arguments: StoreKind.allCases)
    func retention(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        var r = Retention()
        r.finishedJobs = 3600
        r.deliveries = 7200
        r.highPrioritySends = 1800
        // a0: sent at t0 (old); a1: still queued from t0 (old but open).
        try await s.enqueue([update("a0", "sent"), update("a1", "open")], idempotency: nil, now: t0)
        let claimed = try await s.claim(limit: 10, now: t0, lease: 60, worker: "w")
        let c0 = try #require(claimed.first { $0.job.activityID == "a0" })
        let c1 = try #require(claimed.first { $0.job.activityID == "a1" })
        #expect(try await finish(s, c0, delivery: DeliveryRecord(jobID: c0.job.id, activityID: "a0", apnsID: c0.apnsID, apnsUniqueID: nil, status: 200, reason: nil,
                                                                    latencyMS: 1, priority: .high, downgraded: false, at: t0), highPriorityAt: t0))
        #expect(try await s.complete(JobCompletion(claim: c1, result: .retry(at: t0, reason: "503"))))
        // Open work counted along its indexes equals the open part of the full count.
        try await s.enqueue([update("a0", "later", at: t0.addingTimeInterval(600))], idempotency: nil, now: t0)
        let all = try await s.jobCounts()
        let open = try await s.openJobCounts()
        #expect(open[.queued] == all[.queued] && open[.scheduled] == 1 && (open[.claimed] ?? 0) == (all[.claimed] ?? 0), "\(open) vs \(all)")
        try await s.ping()
        try await s.enqueue([], idempotency: IdempotencyRecord(key: "backend:k", bundleID: "com.example.pizza", requestHash: "h", status: 202, body: "{}", createdAt: t0), now: t0)

        // Nothing is old enough yet.
        #expect(try await s.prune(now: t0.addingTimeInterval(60), retention: r, limit: 100) == 0)
        // After an hour and a half: the finished job and the budget record go; the delivery stays.
        #expect(try await s.prune(now: t0.addingTimeInterval(5400), retention: r, limit: 100) == 2)
        #expect(try await s.job(id: c0.job.id) == nil)
        #expect(try await s.job(id: c1.job.id)?.state == .queued, "open work is never pruned")
        #expect(try await s.deliveries(activityID: "a0").count == 1)
        #expect(try await s.highPrioritySends(activityID: "a0", since: .distantPast) == 0)
        #expect(try await s.idempotencyRecord(bundleID: "com.example.pizza", key: "backend:k") != nil)
        // After a day: the delivery and the idempotency record too.
        #expect(try await s.prune(now: t0.addingTimeInterval(86_500), retention: r, limit: 100) == 2)
        #expect(try await s.deliveries(activityID: "a0").isEmpty)
        #expect(try await s.idempotencyRecord(bundleID: "com.example.pizza", key: "backend:k") == nil)
    }

    @Test("trust model v2: installations and token look-ups per app; ticket keys round-trip; ended activities and silent installations are pruned, live ones never", arguments: StoreKind.allCases)
    func namespacesAndRetention(_ kind: StoreKind) async throws {
        let s = try await seeded(kind, activities: 0)
        try await s.upsertApp(AppRecord(bundleID: "com.example.other", teamID: "TEAM000002", keyID: "KEY0000002", keyPEM: "-", createdAt: t0,
                                        ticketKeys: [TicketKey(id: "tk_1", publicKeyPEM: "PEM", createdAt: t0)]))
        #expect(try await s.app("com.example.other")?.ticketKeys == [TicketKey(id: "tk_1", publicKeyPEM: "PEM", createdAt: t0)])
        #expect(try await s.app("com.example.pizza")?.ticketKeys == [])
        // One installation id in two apps: two installations.
        for app in ["com.example.pizza", "com.example.other"] {
            _ = try await s.modifyInstallation(bundleID: app, id: "same", create: { InstallationRecord(id: "same", bundleID: app, updatedAt: self.t0) }) { $0.widgetToken = app }
        }
        #expect(try await s.installation(bundleID: "com.example.pizza", id: "same")?.widgetToken == "com.example.pizza")
        #expect(try await s.installation(bundleID: "com.example.other", id: "same")?.widgetToken == "com.example.other")
        // A token is looked up within its app.
        try await s.insertActivity(ActivityRecord(id: "p1", bundleID: "com.example.pizza", installationID: "same", attributesType: "T", updateToken: "shared", startedAt: t0))
        #expect(try await s.activity(bundleID: "com.example.other", updateToken: "shared") == nil)
        #expect(try await s.activity(bundleID: "com.example.pizza", updateToken: "shared")?.id == "p1")
        #expect(try await s.liveActivities(bundleID: "com.example.pizza", installationID: "same").map(\.id) == ["p1"])
        #expect(try await s.liveActivities(bundleID: "com.example.other", installationID: "same").isEmpty)
        #expect(try await s.liveActivityCount(bundleID: "com.example.pizza", installationID: "same") == 1)
        #expect(try await s.liveActivityCount(bundleID: "com.example.other", installationID: "same") == 0)
        // What accepting a push reads: the same activity, with what a push needs (docs/server.md, "Delivery semantics").
        try await s.insertActivity(ActivityRecord(id: "lean", bundleID: "com.example.pizza", attributesType: "T", attributes: ["a": 1], content: ["c": 2], state: .active,
                                                  startedAt: t0, topics: ["t1"], stateReason: "why"))
        let lean = try #require(try await s.activityForPush(id: "lean"))
        #expect(lean.id == "lean" && lean.bundleID == "com.example.pizza" && lean.attributesType == "T" && lean.state == .active && lean.stateReason == "why")
        #expect(try await s.activityForPush(id: "missing") == nil)
        // Retention: an activity that ended long ago goes (with its topics); a live one and its
        // installation stay however old; a silent installation with nothing live goes.
        let old = t0.addingTimeInterval(-100 * 86_400)
        try await s.insertActivity(ActivityRecord(id: "gone", bundleID: "com.example.pizza", attributesType: "T", state: .ended, startedAt: old, endedAt: old, topics: ["x"]))
        try await s.insertActivity(ActivityRecord(id: "recent", bundleID: "com.example.pizza", attributesType: "T", state: .dismissed, startedAt: t0, endedAt: t0))
        try await s.insertActivity(ActivityRecord(id: "old-live", bundleID: "com.example.pizza", installationID: "kept", attributesType: "T", state: .active, startedAt: old, lastTimestamp: 1))
        // Registrations that never became useful: a live activity nothing was pushed to, past a
        // day; an installation with no user and no activity, silent for a week (one with a user stays).
        try await s.insertActivity(ActivityRecord(id: "unpushed", bundleID: "com.example.pizza", installationID: "junk", attributesType: "T", state: .active,
                                                  startedAt: t0.addingTimeInterval(-86_401), topics: ["u"]))
        try await s.insertActivity(ActivityRecord(id: "fresh-unpushed", bundleID: "com.example.pizza", attributesType: "T", state: .active, startedAt: t0.addingTimeInterval(-3_600)))
        try await s.upsertInstallation(InstallationRecord(id: "unused", bundleID: "com.example.pizza", updatedAt: t0.addingTimeInterval(-8 * 86_400)))
        try await s.upsertInstallation(InstallationRecord(id: "bound", bundleID: "com.example.pizza", userID: "u1", updatedAt: t0.addingTimeInterval(-8 * 86_400)))
        try await s.upsertInstallation(InstallationRecord(id: "kept", bundleID: "com.example.pizza", updatedAt: old.addingTimeInterval(-200 * 86_400)))
        try await s.upsertInstallation(InstallationRecord(id: "silent", bundleID: "com.example.pizza", updatedAt: old.addingTimeInterval(-200 * 86_400)))
        var retention = Retention()
        retention.endedActivities = 30 * 86_400
        retention.staleInstallations = 180 * 86_400
        _ = try await s.prune(now: t0, retention: retention, limit: 100)
        #expect(try await s.activity(id: "gone") == nil)
        #expect(try await s.activities(bundleID: "com.example.pizza", topic: "x").isEmpty)
        #expect(try await s.activity(id: "recent") != nil)
        #expect(try await s.activity(id: "old-live") != nil)
        #expect(try await s.installation(bundleID: "com.example.pizza", id: "kept") != nil)
        #expect(try await s.installation(bundleID: "com.example.pizza", id: "silent") == nil)
        #expect(try await s.installation(bundleID: "com.example.pizza", id: "same") != nil)
        #expect(try await s.activity(id: "unpushed") == nil)
        #expect(try await s.activities(bundleID: "com.example.pizza", topic: "u").isEmpty)
        #expect(try await s.activity(id: "fresh-unpushed") != nil)
        #expect(try await s.installation(bundleID: "com.example.pizza", id: "unused") == nil)
        #expect(try await s.installation(bundleID: "com.example.pizza", id: "bound") != nil)
    }

    @Test("unsent jobs: superseded and cancelled jobs are listed for their activity, newest first, and counted per app from a time; sent and open ones are not", arguments: StoreKind.allCases)
    func unsentJobs(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        // Three plain updates queued at once: the claim hands the lane's head over to the newest
        // content, and the two before it are superseded.
        let ids = try await s.enqueue([update("a0", "one"), update("a0", "two"), update("a0", "three")], idempotency: nil, now: t0)
        let claimed = try await s.claim(limit: 10, now: t0, lease: 30, worker: "w", excludingApps: [])
        #expect(claimed.map(\.job.id) == [ids[2]])
        let later = try await s.enqueue([update("a1", "tomorrow", at: t0.addingTimeInterval(86_400))], idempotency: nil, now: t0)
        _ = try #require(try await s.cancelJob(id: later[0], bundleID: "com.example.pizza", reason: "cancelled by an operator (key k)"))
        let unsent = try await s.unsentJobs(activityID: "a0", limit: 10)
        #expect(unsent.map(\.id) == [ids[1], ids[0]] && unsent.allSatisfy { $0.state == .superseded }, "\(unsent.map { ($0.id, $0.state) })")
        let cancelled = try await s.unsentJobs(activityID: "a1", limit: 10)
        #expect(cancelled.map(\.id) == later && cancelled.first?.state == .dropped && cancelled.first?.lastError?.contains("cancelled") == true)
        #expect(try await s.unsentJobCounts(bundleID: "com.example.pizza", since: t0.addingTimeInterval(-60)) == [.superseded: 2, .dropped: 1])
        #expect(try await s.unsentJobCounts(bundleID: "com.example.pizza", since: t0.addingTimeInterval(60)).isEmpty)
        #expect(try await s.unsentJobCounts(bundleID: "com.example.other", since: t0.addingTimeInterval(-60)).isEmpty)
        // A job that failed is the activity's failed one (a rotated token's refresh reads it), not an unsent one.
        #expect(try await s.failedJobs(activityID: "a0", limit: 10).isEmpty)
        let third = try #require(claimed.first)
        #expect(try await s.complete(JobCompletion(claim: third, result: .finished(.failed, reason: "410 Unregistered"))))
        let failed = try await s.failedJobs(activityID: "a0", limit: 10)
        #expect(failed.map(\.id) == [ids[2]] && failed.first?.state == .failed && failed.first?.lastError == "410 Unregistered", "\(failed.map { ($0.id, $0.state, $0.lastError) })")
        #expect(try await s.unsentJobs(activityID: "a0", limit: 10).map(\.id) == [ids[1], ids[0]])
        #expect(try await s.failedJobs(activityID: "a1", limit: 10).isEmpty)
    }

    @Test("idempotency: the record carries the queued job ids; a live key refuses a second enqueue atomically; an expired one is free again", arguments: StoreKind.allCases)
    func idempotencyRecords(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        let record = IdempotencyRecord(key: "backend:abc", bundleID: "com.example.pizza", requestHash: "h1", status: 202, body: #"{"accepted":1}"#, createdAt: t0, jobsField: "jobs")
        let ids = try await s.enqueue([update("a0", "one")], idempotency: record, now: t0)
        let stored = try #require(try await s.idempotencyRecord(bundleID: "com.example.pizza", key: "backend:abc"))
        #expect(try JSONParser.parse(Array(stored.body.utf8))["jobs"] == .array(ids.map { .int($0) }))
        // Same key again while it lives: refused, and nothing of that request is queued.
        await #expect(throws: StoreError.self) {
            try await s.enqueue([self.update("a1", "two")], idempotency: record, now: self.t0.addingTimeInterval(10))
        }
        #expect(try await s.jobCounts()[.queued] == 1)
        // A day later the key is free.
        var later = record
        later.createdAt = t0.addingTimeInterval(IdempotencyRecord.lifetime + 1)
        later.requestHash = "h2"
        _ = try await s.enqueue([update("a1", "two")], idempotency: later, now: later.createdAt)
        #expect(try await s.idempotencyRecord(bundleID: "com.example.pizza", key: "backend:abc")?.requestHash == "h2")
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
        #expect(try await s.activity(bundleID: "com.example.pizza", updateToken: "tok1")?.id == "a1")
    }

    @Test("the APNs environment of installations, activities and channels round-trips, through every write and the claim (docs/protocol.md §1.1, §7.1)", arguments: StoreKind.allCases)
    func environments(_ kind: StoreKind) async throws {
        let s = try await seeded(kind, activities: 0)
        try await s.upsertInstallation(InstallationRecord(id: "dev", bundleID: "com.example.pizza", updatedAt: t0, environment: .sandbox))
        try await s.upsertInstallation(InstallationRecord(id: "unsaid", bundleID: "com.example.pizza", updatedAt: t0))
        #expect(try await s.installation(bundleID: "com.example.pizza", id: "dev")?.environment == .sandbox)
        #expect(try await s.installation(bundleID: "com.example.pizza", id: "unsaid")?.environment == nil)
        // A TestFlight build over a debug one (the same Keychain, so the same installation).
        let moved = try await s.modifyInstallation(bundleID: "com.example.pizza", id: "dev", create: { InstallationRecord(id: "dev", bundleID: "com.example.pizza", updatedAt: self.t0) }) { $0.environment = .production }
        #expect(moved.environment == .production)
        #expect(try await s.installation(bundleID: "com.example.pizza", id: "dev")?.environment == .production)

        try await s.insertActivity(ActivityRecord(id: "p", bundleID: "com.example.pizza", attributesType: "T", updateToken: "aa", startedAt: t0, environment: .production))
        try await s.insertActivity(ActivityRecord(id: "d", bundleID: "com.example.pizza", attributesType: "T", updateToken: "bb", startedAt: t0))
        #expect(try await s.activity(id: "p")?.environment == .production)
        #expect(try await s.activity(id: "d")?.environment == nil)
        _ = try await s.modifyActivity(id: "d") { $0.environment = .sandbox }
        #expect(try await s.activity(bundleID: "com.example.pizza", updateToken: "bb")?.environment == .sandbox)
        // Push-to-start: the starting record keeps its installation's environment when linked.
        try await s.enqueue([NewPushJob(bundleID: "com.example.pizza", kind: .start, activityID: "s", installationID: "dev", payload: startPayload, runAt: t0)],
                            creating: [ActivityRecord(id: "s", bundleID: "com.example.pizza", externalKey: "order", installationID: "dev", attributesType: "T", state: .starting,
                                                      startedAt: t0, environment: .production)], idempotency: nil, now: t0)
        let linked = try await s.linkStartedActivity(bundleID: "com.example.pizza", externalKey: "order", attributesType: "T", installationID: "dev", token: "cc", topics: [])
        #expect(linked?.environment == .production)
        try await s.enqueue([update("p", "1")], idempotency: nil, now: t0)
        let claimed = try await s.claim(limit: 10, now: t0, lease: 60, worker: "w")
        #expect(claimed.first { $0.job.activityID == "p" }?.activity?.environment == .production)
        #expect(try await s.recentActivities(bundleID: "com.example.pizza", state: nil, limit: 10).map(\.environment).contains(.sandbox))

        try await s.insertChannel(ChannelRecord(id: "ch-prod", bundleID: "com.example.pizza", storagePolicy: 0, createdAt: t0, environment: .production))
        try await s.insertChannel(ChannelRecord(id: "ch-dev", bundleID: "com.example.pizza", storagePolicy: 1, createdAt: t0, environment: .sandbox))
        #expect(try await s.channel(id: "ch-prod")?.environment == .production)
        #expect(Set(try await s.channels(bundleID: "com.example.pizza").map(\.environment)) == [.production, .sandbox])
        #expect(try await s.channel(id: "ch-dev")?.environment == .sandbox)
    }

    @Test("one job per activity at a time, in order; other activities are not blocked", arguments: StoreKind.allCases)
    func ordering(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.enqueue([update("a0", "1", alert: true), update("a0", "2", alert: true), update("a1", "x", alert: true)], idempotency: nil, now: t0)
        let first = try await s.claim(limit: 10, now: t0, lease: 60, worker: "w")
        #expect(first.map(\.job.activityID) == ["a0", "a1"])
        #expect(text(first[0]) == "1")
        // a0's second job waits for the first.
        #expect(try await s.claim(limit: 10, now: t0, lease: 60, worker: "w").isEmpty)
        #expect(try await finish(s, first[0]))
        let next = try await s.claim(limit: 10, now: t0, lease: 60, worker: "w")
        #expect(next.first.flatMap(text) == "2")
        // Timestamps strictly increase per activity, even within one second.
        #expect(next[0].timestamp > first[0].timestamp)
    }

    @Test("coalescing: superseded plain updates are not sent; alerts and ends always are", arguments: StoreKind.allCases)
    func coalescing(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.enqueue([update("a0", "1"), update("a0", "2"), update("a0", "alert", alert: true), update("a0", "3"), update("a0", "4")], idempotency: nil, now: t0)
        var sent: [String] = []
        while let c = try await s.claim(limit: 1, now: t0, lease: 60, worker: "w").first {
            sent.append(text(c) ?? "")
            try await finish(s, c)
        }
        #expect(sent == ["alert", "4"])
        let counts = try await s.jobCounts()
        #expect(counts[.superseded] == 3 && counts[.sent] == 2)
    }

    @Test("broadcasts go out one at a time per channel, coalesced, with increasing timestamps; channels do not block each other", arguments: StoreKind.allCases)
    func broadcastOrdering(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        for c in ["ch1", "ch2"] { try await s.insertChannel(ChannelRecord(id: c, bundleID: "com.example.pizza", storagePolicy: 0, createdAt: t0)) }
        func broadcast(_ channel: String, _ text: String, event: LiveActivityEvent = .update, alert: Bool = false) -> NewPushJob {
            let payload = LiveActivityPayload(event: event, timestamp: t0, contentState: ["x": .string(text)], alert: alert ? ping : nil)
            return NewPushJob(bundleID: "com.example.pizza", kind: .broadcast, channelID: channel, payload: .liveActivity(payload), runAt: t0)
        }
        try await s.enqueue([broadcast("ch1", "1", alert: true), broadcast("ch1", "2"), broadcast("ch1", "3"), broadcast("ch2", "x")], idempotency: nil, now: t0)
        let first = try await s.claim(limit: 10, now: t0, lease: 60, worker: "w")
        #expect(first.map(text) == ["1", "x"])
        // ch1's next job waits for the first: devices drop a push older than the last applied.
        #expect(try await s.claim(limit: 10, now: t0, lease: 60, worker: "w").isEmpty)
        #expect(try await finish(s, first[0]))
        let next = try await s.claim(limit: 10, now: t0, lease: 60, worker: "w")
        // "2" was superseded by "3" before it was sent.
        #expect(next.map(text) == ["3"])
        #expect(next[0].timestamp > first[0].timestamp)
        #expect(try await s.jobCounts()[.superseded] == 1)
    }

    @Test("scheduled jobs wait for their time and do not block due ones", arguments: StoreKind.allCases)
    func scheduling(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.enqueue([update("a0", "later", alert: true, at: t0.addingTimeInterval(600)), update("a0", "now", alert: true)], idempotency: nil, now: t0)
        #expect(try await s.claim(limit: 10, now: t0, lease: 60, worker: "w").map(text) == ["now"])
    }

    @Test("a crashed worker's claims come back after the lease; its late finish is refused; the retry reuses timestamp and apns-id", arguments: StoreKind.allCases)
    func leases(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.enqueue([update("a0", "1")], idempotency: nil, now: t0)
        let lost = try #require(try await s.claim(limit: 1, now: t0, lease: 60, worker: "dead").first)
        #expect(try await s.requeueExpiredClaims(now: t0.addingTimeInterval(30), keeping: []) == 0)
        // A job this process still works on is never taken back by its own sweep.
        #expect(try await s.requeueExpiredClaims(now: t0.addingTimeInterval(61), keeping: [lost.job.id]) == 0)
        #expect(try await s.requeueExpiredClaims(now: t0.addingTimeInterval(61), keeping: []) == 1)
        let again = try #require(try await s.claim(limit: 1, now: t0.addingTimeInterval(62), lease: 60, worker: "alive").first)
        #expect(again.timestamp == lost.timestamp && again.apnsID == lost.apnsID)
        #expect(again.job.attempts == 2)
        #expect(try await !finish(s, lost))
        #expect(try await finish(s, again))
    }

    @Test("retry puts a job back for later with its attempt recorded; deliveries and the budget are kept", arguments: StoreKind.allCases)
    func retries(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.enqueue([update("a0", "1")], idempotency: nil, now: t0)
        let c = try #require(try await s.claim(limit: 1, now: t0, lease: 60, worker: "w").first)
        let d = DeliveryRecord(jobID: c.job.id, activityID: "a0", apnsID: c.apnsID, apnsUniqueID: nil, status: 503, reason: "ServiceUnavailable", latencyMS: 1, priority: .high, downgraded: false, at: t0)
        #expect(try await retry(s, c, at: t0.addingTimeInterval(10), delivery: d))
        #expect(try await s.claim(limit: 1, now: t0.addingTimeInterval(5), lease: 60, worker: "w").isEmpty)
        let c2 = try #require(try await s.claim(limit: 1, now: t0.addingTimeInterval(10), lease: 60, worker: "w").first)
        #expect(try await finish(s, c2, activity: ActivityPatch(content: ["x": "1"]), delivery: DeliveryRecord(jobID: c2.job.id, activityID: "a0", apnsID: c2.apnsID, apnsUniqueID: "u", status: 200, reason: nil, latencyMS: 1, priority: .high, downgraded: false, at: t0), highPriorityAt: t0))
        #expect(try await s.deliveries(activityID: "a0").map(\.status) == [503, 200])
        #expect(try await s.delivery(apnsID: c.apnsID)?.status == 200)
        #expect(try await s.highPrioritySends(activityID: "a0", since: t0.addingTimeInterval(-3600)) == 1)
        #expect(try await s.activity(id: "a0")?.content == ["x": "1"])
    }

    @Test("enqueue is atomic with its idempotency record; a 1,000-job fan-out commits at once", arguments: StoreKind.allCases)
    func enqueueAtomic(_ kind: StoreKind) async throws {
        let s = try await seeded(kind, activities: 1000)
        let record = IdempotencyRecord(key: "k", bundleID: "com.example.pizza", requestHash: "h", status: 202, body: "{}", createdAt: t0)
        let ids = try await s.enqueue((0..<1000).map { update("a\($0)", "go") }, idempotency: record, now: t0)
        #expect(ids.count == 1000 && Set(ids).count == 1000)
        #expect(try await s.idempotencyRecord(bundleID: "com.example.pizza", key: "k")?.status == 202)
        // A second enqueue with the same key fails and leaves nothing behind.
        await #expect(throws: (any Error).self) { try await s.enqueue([update("a0", "dup")], idempotency: record, now: t0) }
        #expect(try await s.jobCounts()[.queued] == 1000)
    }

    @Test("registry writes commit with their idempotency record, answered from what was written; a taken key changes nothing", arguments: StoreKind.allCases)
    func registryWritesAreAtomicWithIdempotency(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        func record(_ key: String, _ hash: String = "h") -> IdempotencyRecord {
            IdempotencyRecord(key: "device:\(key)", bundleID: "com.example.pizza", requestHash: hash, status: 0, body: "", createdAt: t0)
        }
        let answer: @Sendable (ActivityRecord) -> (status: Int, body: String) = { (200, #"{"state":"\#($0.state.rawValue)"}"#) }
        // modifyActivity: the answer is made from the written row, in the same transaction.
        _ = try await s.modifyActivity(id: "a0", { $0.state = .dismissed }, idempotency: IdempotentAnswer(record("m1"), answer: answer))
        #expect(try await s.idempotencyRecord(bundleID: "com.example.pizza", key: "device:m1")?.body == #"{"state":"dismissed"}"#)
        // The same key again: refused with its own code, and the change is not written.
        await #expect(throws: StoreError(.idempotencyKeyTaken, "another request with this Idempotency-Key was accepted first")) {
            _ = try await s.modifyActivity(id: "a1", { $0.state = .ended }, idempotency: IdempotentAnswer(record("m1"), answer: answer))
        }
        #expect(try await s.activity(id: "a1")?.state == .active)
        // A change that throws leaves no record behind: the key is still free.
        struct Refused: Error {}
        await #expect(throws: Refused.self) {
            _ = try await s.modifyActivity(id: "a1", { _ in throw Refused() }, idempotency: IdempotentAnswer(record("m2"), answer: answer))
        }
        #expect(try await s.idempotencyRecord(bundleID: "com.example.pizza", key: "device:m2") == nil)
        // insertActivity, modifyInstallation, insertChannel and deleteChannel: the same.
        var fixed = record("i1")
        fixed.status = 201
        try await s.insertActivity(ActivityRecord(id: "a9", bundleID: "com.example.pizza", attributesType: "T", state: .active, updateToken: "tok9", startedAt: t0), idempotency: fixed)
        await #expect(throws: StoreError.self) {
            try await s.insertActivity(ActivityRecord(id: "a10", bundleID: "com.example.pizza", attributesType: "T", state: .active, updateToken: "tok10", startedAt: self.t0), idempotency: fixed)
        }
        #expect(try await s.activity(id: "a10") == nil)
        let inst = try await s.modifyInstallation(bundleID: "com.example.pizza", id: "i1", create: { InstallationRecord(id: "i1", bundleID: "com.example.pizza", updatedAt: self.t0) }, { $0.widgetToken = "w1" },
                                                  idempotency: IdempotentAnswer(record("r1"), answer: { (200, $0.widgetToken ?? "-") }))
        #expect(inst.widgetToken == "w1")
        #expect(try await s.idempotencyRecord(bundleID: "com.example.pizza", key: "device:r1")?.body == "w1")
        await #expect(throws: StoreError.self) {
            _ = try await s.modifyInstallation(bundleID: "com.example.pizza", id: "i2", create: { InstallationRecord(id: "i2", bundleID: "com.example.pizza", updatedAt: self.t0) }, { _ in },
                                               idempotency: IdempotentAnswer(record("r1"), answer: { _ in (200, "") }))
        }
        #expect(try await s.installation(bundleID: "com.example.pizza", id: "i2") == nil)
        try await s.insertChannel(ChannelRecord(id: "c1", bundleID: "com.example.pizza", storagePolicy: 0, createdAt: t0), idempotency: record("c1"))
        await #expect(throws: StoreError.self) {
            try await s.insertChannel(ChannelRecord(id: "c2", bundleID: "com.example.pizza", storagePolicy: 0, createdAt: self.t0), idempotency: record("c1"))
        }
        #expect(try await s.channel(id: "c2") == nil)
        await #expect(throws: StoreError.self) { try await s.deleteChannel(id: "c1", idempotency: record("c1")) }
        #expect(try await s.channel(id: "c1") != nil)
    }

    @Test("a live external key belongs to one installation: racing inserts cannot both take it; once it ends the key is free", arguments: StoreKind.allCases)
    func externalKeyIsTakenAtomically(_ kind: StoreKind) async throws {
        let s = try await seeded(kind, activities: 0)
        let results = try await withThrowingTaskGroup(of: Bool.self) { group in
            for i in 0..<20 {
                group.addTask {
                    do {
                        try await s.insertActivity(ActivityRecord(id: "r\(i)", bundleID: "com.example.pizza", externalKey: "order-1", attributesType: "T", state: .active,
                                                                  updateToken: "tok\(i)", startedAt: self.t0))
                        return true
                    } catch let e as StoreError where e.code == .conflict { return false }
                }
            }
            return try await group.reduce(into: [Bool]()) { $0.append($1) }
        }
        #expect(results.filter { $0 }.count == 1)
        #expect(try await s.liveActivities(bundleID: "com.example.pizza", externalKey: "order-1").count == 1)
        let holder = try #require(try await s.liveActivities(bundleID: "com.example.pizza", externalKey: "order-1").first)
        _ = try await s.modifyActivity(id: holder.id) { $0.state = .ended }
        try await s.insertActivity(ActivityRecord(id: "after", bundleID: "com.example.pizza", externalKey: "order-1", attributesType: "T", state: .active, updateToken: "tok-after", startedAt: t0))
    }

    // MARK: Delivery core v2 (docs/server.md, "Delivery semantics"): each defect of the first queue, as a contract

    @Test("a head waiting for its retry blocks the later jobs of its activity, and only of its activity", arguments: StoreKind.allCases)
    func retryBlocksItsLane(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.enqueue([update("a0", "U1", alert: true)], idempotency: nil, now: t0)
        let u1 = try #require(try await s.claim(limit: 10, now: t0, lease: 60, worker: "w").first)
        #expect(try await retry(s, u1, at: t0.addingTimeInterval(30)))
        // U2 arrives while U1 waits: it must not overtake (the phone would drop U1 as older).
        try await s.enqueue([update("a0", "U2", alert: true), update("a1", "other", alert: true)], idempotency: nil, now: t0.addingTimeInterval(1))
        let meanwhile = try await s.claim(limit: 10, now: t0.addingTimeInterval(2), lease: 60, worker: "w")
        #expect(meanwhile.map(text) == ["other"])
        let again = try await s.claim(limit: 10, now: t0.addingTimeInterval(30), lease: 60, worker: "w")
        #expect(again.map(text) == ["U1"])
        #expect(again[0].timestamp == u1.timestamp && again[0].apnsID == u1.apnsID)
        #expect(try await finish(s, again[0]))
        let last = try #require(try await s.claim(limit: 10, now: t0.addingTimeInterval(31), lease: 60, worker: "w").first)
        #expect(text(last) == "U2")
        #expect(last.timestamp > u1.timestamp)
    }

    @Test("a plain update waiting for its retry is superseded by newer content at once, not after the wait", arguments: StoreKind.allCases)
    func waitingPlainUpdateSuperseded(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.enqueue([update("a0", "old")], idempotency: nil, now: t0)
        let old = try #require(try await s.claim(limit: 1, now: t0, lease: 60, worker: "w").first)
        #expect(try await retry(s, old, at: t0.addingTimeInterval(600)))
        try await s.enqueue([update("a0", "new")], idempotency: nil, now: t0.addingTimeInterval(1))
        let next = try await s.claim(limit: 10, now: t0.addingTimeInterval(1), lease: 60, worker: "w")
        #expect(next.map(text) == ["new"])
        #expect(try await s.job(id: old.job.id)?.state == .superseded)
    }

    @Test("an end without content-state supersedes nothing: the plain update before it still goes out", arguments: StoreKind.allCases)
    func endWithoutContentSupersedesNothing(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.enqueue([update("a0", "final"), end("a0")], idempotency: nil, now: t0)
        var sent: [String] = []
        while let c = try await s.claim(limit: 1, now: t0, lease: 60, worker: "w").first {
            sent.append(c.job.kind == .end ? "end" : text(c) ?? "?")
            try await finish(s, c)
        }
        #expect(sent == ["final", "end"])
        // An end that carries content does replace it.
        try await s.enqueue([update("a1", "x"), end("a1", content: "done")], idempotency: nil, now: t0)
        let c = try #require(try await s.claim(limit: 5, now: t0, lease: 60, worker: "w").first)
        #expect(c.job.kind == .end && text(c) == "done")
    }

    @Test("a claim reads what planning needs: the installation of a priority-10 update and its hour's priority-10 sends; a start's installation; nothing for a plain update", arguments: StoreKind.allCases)
    func claimReadsPlanningContext(_ kind: StoreKind) async throws {
        let s = try await kind.make()
        try await s.upsertApp(AppRecord(bundleID: "com.example.pizza", teamID: "TEAM000001", keyID: "KEY0000001", keyPEM: "-", createdAt: t0))
        try await s.upsertInstallation(InstallationRecord(id: "phone", bundleID: "com.example.pizza", pushToStartTokens: ["T": "pts"], frequentPushesEnabled: true, updatedAt: t0))
        for id in ["a0", "a1"] {
            try await s.insertActivity(ActivityRecord(id: id, bundleID: "com.example.pizza", installationID: "phone", attributesType: "T", state: .active, updateToken: "tok-\(id)", startedAt: t0))
        }
        // a0: three priority-10 sends, one of them more than an hour before the claim.
        try await s.enqueue([update("a0", "1", alert: true)], idempotency: nil, now: t0)
        for (n, at) in [t0, t0.addingTimeInterval(1_000), t0.addingTimeInterval(2_000)].enumerated() {
            let c = try #require(try await s.claim(limit: 1, now: at, lease: 60, worker: "w").first)
            #expect(try await finish(s, c, highPriorityAt: at))
            try await s.enqueue([update("a0", "\(n + 2)", alert: true)], idempotency: nil, now: at)
        }
        let now = t0.addingTimeInterval(3_700)
        try await s.enqueue([update("a1", "plain"),
                             NewPushJob(bundleID: "com.example.pizza", kind: .start, installationID: "phone", payload: startPayload, runAt: now)],
                            idempotency: nil, now: now)
        let claimed = try await s.claim(limit: 10, now: now, lease: 60, worker: "w")
        let high = try #require(claimed.first { $0.job.activityID == "a0" })
        #expect(high.installation?.id == "phone" && high.installation?.frequentPushesEnabled == true)
        #expect(high.highPrioritySends == 2, "sends at t0+1000 and t0+2000 are within the hour before t0+3700; the one at t0 is not")
        let plain = try #require(claimed.first { $0.job.activityID == "a1" })
        #expect(plain.installation == nil && plain.highPrioritySends == 0)
        let start = try #require(claimed.first { $0.job.kind == .start })
        #expect(start.installation?.pushToStartTokens["T"] == "pts")
    }

    /// What of an activity's record its lifecycle decides.
    struct LifecycleView: Equatable, CustomStringConvertible {
        var state: ActivityRecordState, token: String?, content: JSONValue?, score: Double?, stale: Date?, ended: Date?, dismissed: Date?, reason: String?
        init(_ a: ActivityRecord) {
            (state, token, content, score, stale, ended, dismissed, reason) = (a.state, a.updateToken, a.content, a.relevanceScore, a.staleDate, a.endedAt, a.dismissedAt, a.stateReason)
        }
        var description: String { "\(state) token=\(token ?? "-") content=\(content?.jsonString ?? "-") ended=\(ended.map { "\($0.timeIntervalSince1970)" } ?? "-") reason=\(reason ?? "-")" }
    }

    @Test("an activity's record follows ActivityLifecycle on every store: seeded random device reports, rotations and pushes (content, end, dead token)", arguments: StoreKind.allCases)
    func lifecycleMatchesTheModel(_ kind: StoreKind) async throws {
        for seed in 0..<10 {
            let s = try await seeded(kind, activities: 1)
            var model = try #require(try await s.activity(id: "a0"))
            var random = SeededRandom(seed: UInt64(seed))
            var now = t0
            for step in 0..<14 {
                now = now.addingTimeInterval(60)
                let event: ActivityLifecycle.Event = switch Int.random(in: 0..<7, using: &random) {
                case 0: .tokenRotated("tok-\(seed)-\(step)")
                case 1: .dismissed(at: now)
                case 2: .endedByApp(at: now)
                case 3: .pushed(ActivityPatch(content: ["x": .string("\(step)")], relevanceScore: Double(step), setsStaleDate: true, staleDate: now.addingTimeInterval(600)))
                case 4: .pushed(ActivityPatch(content: ["x": .string("last")], end: .init(at: now, dismissAt: now.addingTimeInterval(3600), reason: "ended by a push")))
                case 5: .pushed(ActivityPatch(unreachable: .init(reason: "410 Unregistered", ifToken: model.updateToken)))
                default: .pushed(ActivityPatch(unreachable: .init(reason: "410 for an older token", ifToken: "tok-older")))
                }
                var expected = model
                let modelRefused = (try? ActivityLifecycle.apply(event, to: &expected)) == nil
                var storeRefused = false
                if case .pushed(let patch) = event {
                    // The real path: a job queued, claimed and finished with what its push changed.
                    try await s.enqueue([update("a0", "\(step)")], idempotency: nil, now: now)
                    let c = try #require(try await s.claim(limit: 1, now: now, lease: 60, worker: "w").first)
                    #expect(try await finish(s, c, activity: patch))
                } else {
                    do { _ = try await s.modifyActivity(id: "a0", { try ActivityLifecycle.apply(event, to: &$0) }, idempotency: nil) } catch { storeRefused = true }
                }
                #expect(storeRefused == modelRefused, "seed \(seed), step \(step): \(event)")
                if !modelRefused { model = expected }
                let stored = try #require(try await s.activity(id: "a0"))
                #expect(LifecycleView(stored) == LifecycleView(model), "seed \(seed), step \(step) after \(event)")
            }
        }
    }

    @Test("the next due time: the earliest scheduled job or waiting lane head of an app not held; a head due but unclaimed gives its past time; nothing waiting means nil", arguments: StoreKind.allCases)
    func nextDue(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        #expect(try await s.nextDue(after: t0, excludingApps: []) == nil)
        try await s.enqueue([update("a0", "later", at: t0.addingTimeInterval(600))], idempotency: nil, now: t0)
        #expect(try await s.nextDue(after: t0, excludingApps: []) == t0.addingTimeInterval(600))
        #expect(try await s.nextDue(after: t0, excludingApps: ["com.example.pizza"]) == nil, "an app held by its circuit wakes the engine when its pause ends instead")
        // a1's head is retried in 30 s: that is earlier.
        try await s.enqueue([update("a1", "now")], idempotency: nil, now: t0)
        let c = try #require(try await s.claim(limit: 1, now: t0, lease: 60, worker: "w").first)
        #expect(try await retry(s, c, at: t0.addingTimeInterval(30)))
        #expect(try await s.nextDue(after: t0, excludingApps: []) == t0.addingTimeInterval(30))
        // Due already but not claimed (say its lane is busy in another process): its time, in the past.
        #expect(try await s.nextDue(after: t0.addingTimeInterval(40), excludingApps: []) == t0.addingTimeInterval(30))
    }

    @Test("hundreds of jobs behind a stuck activity do not hold back anyone else", arguments: StoreKind.allCases)
    func stuckActivityDelaysOnlyItself(_ kind: StoreKind) async throws {
        let s = try await seeded(kind, activities: 12)
        try await s.enqueue((0..<600).map { update("a0", "\($0)", alert: true) }, idempotency: nil, now: t0)
        _ = try #require(try await s.claim(limit: 1, now: t0, lease: 3600, worker: "w").first)  // a0 in flight, for long
        try await s.enqueue((1..<12).map { update("a\($0)", "go", alert: true) }, idempotency: nil, now: t0)
        let others = try await s.claim(limit: 20, now: t0, lease: 60, worker: "w")
        #expect(Set(others.compactMap(\.job.activityID)) == Set((1..<12).map { "a\($0)" }))
    }

    @Test("a token rotated during the send wins: the 410 for the old token sends again with the new one", arguments: StoreKind.allCases)
    func rotationDuringSend(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.enqueue([update("a0", "x", alert: true)], idempotency: nil, now: t0)
        let c = try #require(try await s.claim(limit: 1, now: t0, lease: 60, worker: "w").first)
        #expect(c.activity?.updateToken == "tok0")
        _ = try await s.modifyActivity(id: "a0") { $0.updateToken = "tok0-new" }
        #expect(try await s.complete(JobCompletion(claim: c, result: .deadToken(token: "tok0", reason: "410 Unregistered", graceUntil: t0.addingTimeInterval(30)))))
        let a = try #require(try await s.activity(id: "a0"))
        #expect(a.state == .active && a.updateToken == "tok0-new")
        let again = try #require(try await s.claim(limit: 1, now: t0, lease: 60, worker: "w").first)
        #expect(again.job.id == c.job.id && again.activity?.updateToken == "tok0-new" && again.timestamp == c.timestamp)
        // With the token unchanged, the same answer retires the activity; the job waits out the
        // grace period for a rotated token still on its way.
        #expect(try await s.complete(JobCompletion(claim: again, result: .deadToken(token: "tok0-new", reason: "410 Unregistered", graceUntil: t0.addingTimeInterval(30)))))
        #expect(try await s.activity(id: "a0")?.state == .unreachable)
        #expect(try await s.job(id: c.job.id)?.state == .queued)
        #expect(try await s.claim(limit: 1, now: t0.addingTimeInterval(29), lease: 60, worker: "w").isEmpty)
        #expect(try await s.claim(limit: 1, now: t0.addingTimeInterval(30), lease: 60, worker: "w").first?.job.id == c.job.id)
    }

    @Test("a push planned to wait for its activity's token is due at once when the token arrived while it was claimed (the registration's wake found it claimed); with none, it waits", arguments: StoreKind.allCases)
    func tokenArrivesWhileClaimed(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        _ = try await s.modifyActivity(id: "a0") { $0.updateToken = nil }
        try await s.enqueue([update("a0", "x", alert: true)], idempotency: nil, now: t0)
        let c = try #require(try await s.claim(limit: 1, now: t0, lease: 60, worker: "w").first)
        #expect(c.activity?.updateToken == nil)
        // No token yet: it waits its 30 s.
        var waiting = JobCompletion(claim: c, result: .retry(at: t0.addingTimeInterval(30), reason: "waiting for the device to hand over the activity's update token"))
        waiting.dueNowIfTokenArrived = true
        #expect(try await s.complete(waiting))
        #expect(try await s.claim(limit: 1, now: t0.addingTimeInterval(1), lease: 60, worker: "w").isEmpty)
        let again = try #require(try await s.claim(limit: 1, now: t0.addingTimeInterval(30), lease: 60, worker: "w").first)
        // The device hands the token over while the job is claimed; the worker had read none.
        _ = try await s.modifyActivity(id: "a0") { $0.updateToken = "tok0-late" }
        try await s.wakeLane(activityID: "a0", now: t0.addingTimeInterval(31))
        var late = JobCompletion(claim: again, result: .retry(at: t0.addingTimeInterval(61), reason: "waiting for the device to hand over the activity's update token"))
        late.dueNowIfTokenArrived = true
        #expect(try await s.complete(late))
        let now = try #require(try await s.claim(limit: 1, now: t0.addingTimeInterval(32), lease: 60, worker: "w").first, "due at once, not at +61 s")
        #expect(now.job.id == c.job.id && now.activity?.updateToken == "tok0-late")
    }

    @Test("a dismissal or end reported during the send is never undone by the delivery's bookkeeping", arguments: StoreKind.allCases)
    func deviceStateWins(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.enqueue([update("a0", "x"), end("a1", content: "bye")], idempotency: nil, now: t0)
        let claimed = try await s.claim(limit: 2, now: t0, lease: 60, worker: "w")
        let later = t0.addingTimeInterval(5)
        _ = try await s.modifyActivity(id: "a0") { $0.state = .dismissed; $0.dismissedAt = later }
        _ = try await s.modifyActivity(id: "a1") { $0.state = .dismissed; $0.dismissedAt = later }
        for c in claimed {
            let patch = ActivityPatch(content: content(c), end: c.job.kind == .end ? .init(at: t0) : nil)
            #expect(try await finish(s, c, activity: patch))
        }
        for id in ["a0", "a1"] {
            let a = try #require(try await s.activity(id: id))
            #expect(a.state == .dismissed && a.dismissedAt == later && a.content == nil, "\(id)")
        }
    }

    @Test("scheduled jobs take their place in the lane when they come due", arguments: StoreKind.allCases)
    func scheduledJoinTheLaneWhenDue(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.enqueue([update("a0", "at+60", alert: true, at: t0.addingTimeInterval(60))], idempotency: nil, now: t0)
        #expect(try await s.jobCounts()[.scheduled] == 1)
        try await s.enqueue([update("a0", "now", alert: true)], idempotency: nil, now: t0)
        let first = try #require(try await s.claim(limit: 5, now: t0, lease: 60, worker: "w").first)
        #expect(text(first) == "now")
        // Due while "now" is in flight: it waits behind it, then goes.
        #expect(try await s.claim(limit: 5, now: t0.addingTimeInterval(61), lease: 60, worker: "w").isEmpty)
        #expect(try await finish(s, first))
        #expect(try await s.claim(limit: 5, now: t0.addingTimeInterval(61), lease: 60, worker: "w").map(text) == ["at+60"])
    }

    @Test("claims skip the apps that are paused", arguments: StoreKind.allCases)
    func pausedAppsSkipped(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.upsertApp(AppRecord(bundleID: "com.example.other", teamID: "TEAM000001", keyID: "KEY0000002", keyPEM: "-", createdAt: t0))
        try await s.insertActivity(ActivityRecord(id: "o0", bundleID: "com.example.other", attributesType: "T", updateToken: "otok", startedAt: t0))
        try await s.enqueue([update("a0", "x"), NewPushJob(bundleID: "com.example.other", kind: .update, activityID: "o0", payload: .update([:], at: t0), runAt: t0)],
                            idempotency: nil, now: t0)
        #expect(try await s.claim(limit: 5, now: t0, lease: 60, worker: "w", excludingApps: ["com.example.pizza"]).map(\.job.activityID) == ["o0"])
        #expect(try await s.claim(limit: 5, now: t0, lease: 60, worker: "w").map(\.job.activityID) == ["a0"])
    }

    @Test("push-to-start: activities and jobs commit together; by key every live activity is found; linking picks the installation's, and of two starting the newest", arguments: StoreKind.allCases)
    func pushToStartLinks(_ kind: StoreKind) async throws {
        let s = try await seeded(kind, activities: 0)
        let started = (0..<3).map { ActivityRecord(id: "s\($0)", bundleID: "com.example.pizza", externalKey: "order-9", installationID: "i\($0)", attributesType: "T", state: .starting, startedAt: t0) }
        let jobs = started.map { NewPushJob(bundleID: "com.example.pizza", kind: .start, activityID: $0.id, installationID: $0.installationID, payload: startPayload, runAt: t0) }
        try await s.enqueue(jobs, creating: started, idempotency: nil, now: t0)
        #expect(try await s.liveActivities(bundleID: "com.example.pizza", externalKey: "order-9").count == 3)
        let linked = try await s.linkStartedActivity(bundleID: "com.example.pizza", externalKey: "order-9", attributesType: "T", installationID: "i2", token: "t2", topics: ["x"])
        #expect(linked?.id == "s2" && linked?.state == .active && linked?.updateToken == "t2" && linked?.topics == ["x"])
        #expect(try await s.activity(id: "s0")?.state == .starting)
        // Two starts on one installation (a predecessor never confirmed, its renewal's successor
        // 7.5 hours later): the token handed over links the newest.
        let pair = [ActivityRecord(id: "old", bundleID: "com.example.pizza", externalKey: "order-11", installationID: "i5", attributesType: "T", state: .starting, startedAt: t0),
                    ActivityRecord(id: "new", bundleID: "com.example.pizza", externalKey: "order-11", installationID: "i5", attributesType: "T", state: .starting,
                                   startedAt: t0.addingTimeInterval(27_000))]
        try await s.enqueue(pair.map { NewPushJob(bundleID: "com.example.pizza", kind: .start, activityID: $0.id, installationID: "i5", payload: startPayload, runAt: t0) },
                            creating: pair, idempotency: nil, now: t0)
        let newest = try await s.linkStartedActivity(bundleID: "com.example.pizza", externalKey: "order-11", attributesType: "T", installationID: "i5", token: "t5", topics: [])
        #expect(newest?.id == "new" && newest?.updateToken == "t5")
        #expect(try await s.activity(id: "old")?.state == .starting)
        // If an enqueue fails, the activities it would have created are not there either.
        let dup = IdempotencyRecord(key: "k", bundleID: "com.example.pizza", requestHash: "h", status: 202, body: "{}", createdAt: t0)
        try await s.enqueue([], idempotency: dup, now: t0)
        let extra = ActivityRecord(id: "s9", bundleID: "com.example.pizza", externalKey: "order-10", attributesType: "T", state: .starting, startedAt: t0)
        await #expect(throws: (any Error).self) { try await s.enqueue([], creating: [extra], idempotency: dup, now: t0) }
        #expect(try await s.activity(id: "s9") == nil)
    }

    @Test("recent activities: newest first, of the app only, filtered by state, bounded", arguments: StoreKind.allCases)
    func recentActivities(_ kind: StoreKind) async throws {
        let s = try await seeded(kind, activities: 0)
        try await s.upsertApp(AppRecord(bundleID: "com.example.other", teamID: "TEAM000001", keyID: "KEY0000001", keyPEM: "-", createdAt: t0))
        for i in 0..<5 {
            try await s.insertActivity(ActivityRecord(id: "r\(i)", bundleID: "com.example.pizza", externalKey: "k\(i)", attributesType: "T", state: i % 2 == 0 ? .active : .ended,
                                                      updateToken: "tok\(i)", startedAt: t0.addingTimeInterval(Double(i)), topics: ["t\(i)"]))
        }
        try await s.insertActivity(ActivityRecord(id: "other", bundleID: "com.example.other", attributesType: "T", state: .active, startedAt: t0.addingTimeInterval(99)))
        #expect(try await s.recentActivities(bundleID: "com.example.pizza", state: nil, limit: 10).map(\.id) == ["r4", "r3", "r2", "r1", "r0"])
        #expect(try await s.recentActivities(bundleID: "com.example.pizza", state: .ended, limit: 10).map(\.id) == ["r3", "r1"])
        let two = try await s.recentActivities(bundleID: "com.example.pizza", state: .active, limit: 2)
        #expect(two.map(\.id) == ["r4", "r2"] && two[0].topics == ["t4"])
    }

    @Test("read-modify-write is one transaction: 40 concurrent changes of one row all land", arguments: StoreKind.allCases)
    func concurrentModifications(_ kind: StoreKind) async throws {
        // 40 of each, not 100: the changes of one row serialize on its lock, so every call also
        // waits for all those before it, and on a loaded 2-core machine (the whole suite, the
        // PostgreSQL server included) 200 of them queued past the store's 35-second call bound.
        // A lost update shows with any two; 40 racing writers on a pool of connections are plenty.
        let s = try await seeded(kind)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for i in 0..<40 {
                group.addTask { _ = try await s.modifyActivity(id: "a0") { $0.topics.append("t\(i)") } }
                group.addTask {
                    _ = try await s.modifyInstallation(bundleID: "com.example.pizza", id: "i1", create: { InstallationRecord(id: "i1", bundleID: "com.example.pizza", updatedAt: Date(timeIntervalSince1970: 0)) }) {
                        $0.pushToStartTokens["T\(i)"] = "ab"
                    }
                }
            }
            try await group.waitForAll()
        }
        #expect(try await s.activity(id: "a0")?.topics.count == 41)
        #expect(try await s.installation(bundleID: "com.example.pizza", id: "i1")?.pushToStartTokens.count == 40)
    }

    @Test("group commit: concurrent writers share transactions, and one failing write fails alone", arguments: StoreKind.allCases)
    func groupCommitIsolation(_ kind: StoreKind) async throws {
        let s = try await seeded(kind, activities: 50)
        let record = IdempotencyRecord(key: "taken", bundleID: "com.example.pizza", requestHash: "h", status: 202, body: "{}", createdAt: t0)
        try await s.enqueue([], idempotency: record, now: t0)
        let failures = try await withThrowingTaskGroup(of: Bool.self) { group in
            for i in 0..<300 {
                group.addTask {
                    do {
                        try await s.enqueue([update("a\(i % 50)", "\(i)", alert: true)], idempotency: i == 150 ? record : nil, now: t0)
                        return false
                    } catch { return true }
                }
            }
            return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        #expect(failures == 1)
        #expect(try await s.jobCounts()[.queued] == 299)
    }

    /// Producers (one per activity, each waiting for its last request, as an API client does),
    /// workers claiming in random batch sizes and answering sent or retry at random, all at once:
    /// the interleavings of batched enqueues, claims and completions that a hand-picked sequence
    /// would miss. Seeded: the scripts replay from the seed; the scheduling varies run to run.
    @Test("seeded random interleaving: lanes never overlap, each activity's content is sent in order, alerts and the last update always are", arguments: StoreKind.allCases)
    func randomInterleaving(_ kind: StoreKind) async throws {
        let activities = 8, perActivity = 40, seed: UInt64 = 20_261_123
        let s = try await seeded(kind, activities: activities)
        let producing = Locked(activities)
        let inFlight = Locked<Set<String>>([])
        let overlaps = Locked(0)
        let sent = Locked<[String: [Int]]>([:])
        let alerts = Locked<[String: Set<Int>]>([:])
        try await withThrowingTaskGroup(of: Void.self) { group in
            for a in 0..<activities {
                group.addTask {
                    var rng = SeededRandom(seed: seed &+ UInt64(a))
                    var n = 0
                    while n < perActivity {
                        // Sometimes two updates in one request.
                        let count = min(perActivity - n, Int.random(in: 1...2, using: &rng))
                        var jobs: [NewPushJob] = []
                        for k in n..<n + count {
                            let alert = Int.random(in: 0..<5, using: &rng) == 0
                            if alert { _ = alerts.withLock { $0["a\(a)", default: []].insert(k) } }
                            jobs.append(update("a\(a)", "\(k)", alert: alert))
                        }
                        try await s.enqueue(jobs, idempotency: nil, now: t0)
                        n += count
                    }
                    producing.withLock { $0 -= 1 }
                }
            }
            for w in 0..<3 {
                group.addTask {
                    var rng = SeededRandom(seed: seed &+ 100 &+ UInt64(w))
                    while true {
                        let done = producing.withLock { $0 == 0 }
                        let claimed = try await s.claim(limit: Int.random(in: 1...4, using: &rng), now: t0, lease: 600, worker: "w\(w)")
                        if claimed.isEmpty {
                            if done, try await s.openJobCounts().values.reduce(0, +) == 0 { return }
                            await Task.yield()
                            continue
                        }
                        for c in claimed {
                            let id = c.job.activityID!
                            if !inFlight.withLock({ $0.insert(id).inserted }) { overlaps.withLock { $0 += 1 } }
                        }
                        for c in claimed {
                            let id = c.job.activityID!
                            let n = Int(text(c)!)!
                            let retry = Int.random(in: 0..<5, using: &rng) == 0
                            // Recorded before the verdict commits, while the lane is still held (after
                            // it, the lane's next job may be claimed and recorded first).
                            inFlight.withLock { _ = $0.remove(id) }
                            if retry {
                                #expect(try await self.retry(s, c, at: t0))
                            } else {
                                sent.withLock { $0[id, default: []].append(n) }
                                #expect(try await finish(s, c))
                            }
                        }
                    }
                }
            }
            try await group.waitForAll()
        }
        #expect(overlaps.withLock { $0 } == 0, "two jobs of one activity were in flight at once (seed \(seed))")
        let log = sent.withLock { $0 }
        for a in 0..<activities {
            let seq = log["a\(a)"] ?? []
            #expect(seq == seq.sorted() && Set(seq).count == seq.count, "a\(a) sent out of order or twice: \(seq) (seed \(seed))")
            #expect(seq.last == perActivity - 1, "a\(a): the last update was not sent (seed \(seed))")
            let wanted = alerts.withLock { $0["a\(a)"] ?? [] }
            #expect(wanted.isSubset(of: Set(seq)), "a\(a): alerts \(wanted.subtracting(seq).sorted()) were never sent (seed \(seed))")
        }
        #expect(try await s.openJobCounts().values.reduce(0, +) == 0)
    }
}

@Suite("Lane planner")
struct LanePlannerTests {
    let t0 = Date(timeIntervalSince1970: 1_767_225_600)
    let ping = LiveActivityAlert(title: "Ping", body: "An alert")
    var startPayload: JobPayload { .start(attributesType: "T", attributes: [:], contentState: [:], alert: ping, at: t0) }
    typealias E = LanePlanner.Entry
    static func plain(_ id: Int64, due: Bool = true) -> E { E(id: id, supersedable: true, carriesContent: true, due: due) }
    static func alert(_ id: Int64, due: Bool = true) -> E { E(id: id, supersedable: false, carriesContent: true, due: due) }
    static func bareEnd(_ id: Int64) -> E { E(id: id, supersedable: false, carriesContent: false, due: true) }

    @Test("decisions", arguments: [
        ([plain(1), plain(2), plain(3)], [1, 2], 3),
        ([plain(1, due: false), plain(2)], [1], 2),
        ([alert(1, due: false), plain(2)], [], nil),
        ([alert(1), plain(2)], [], 1),
        ([plain(1), bareEnd(2)], [], 1),
        ([plain(1), alert(2), plain(3)], [1], 2),
        ([E(id: 1, supersedable: true, carriesContent: true, due: true, claimed: true), plain(2)], [], nil),
        ([plain(1, due: false)], [], nil),
    ] as [([E], [Int64], Int64?)])
    func decide(_ lane: [E], superseded: [Int64], claim: Int64?) {
        let d = LanePlanner.decide(lane)
        #expect(d.superseded == superseded)
        #expect(d.claim == claim)
    }

    @Test("what carries content and what may be superseded")
    func flags() {
        #expect(LanePlanner.isSupersedable(kind: .update, payload: .update([:], at: t0)))
        #expect(!LanePlanner.isSupersedable(kind: .update, payload: .update([:], alert: ping, at: t0)))
        #expect(!LanePlanner.isSupersedable(kind: .end, payload: .end([:], at: t0)))
        #expect(LanePlanner.isSupersedable(kind: .broadcast, payload: .update([:], at: t0)))
        #expect(!LanePlanner.isSupersedable(kind: .broadcast, payload: .end([:], at: t0)))
        #expect(!LanePlanner.isSupersedable(kind: .widgets, payload: .widgets(WidgetPayload())))
        #expect(!LanePlanner.carriesContent(kind: .end, payload: .end(at: t0)))
        #expect(LanePlanner.carriesContent(kind: .end, payload: .end([:], at: t0)))
        #expect(LanePlanner.lane(kind: .widgets, activityID: nil, channelID: nil) == nil)
    }

    @Test("apns-ids: version 7 UUIDs, ordered by time, never repeated")
    func apnsIDs() throws {
        let t = Date(timeIntervalSince1970: 1_767_225_600.123)
        let ids = (0..<2_000).map { ClaimedJob.newAPNsID(now: t.addingTimeInterval(Double($0 / 100) * 0.01)).text }
        #expect(Set(ids).count == ids.count)
        for id in ids.prefix(50) {
            let uuid = try #require(UUID(uuidString: id), "\(id) is a canonical UUID")
            #expect(uuid.uuidString.lowercased() == id)
            #expect(Array(id)[14] == "7", "version 7: \(id)")
            #expect("89ab".contains(Array(id)[19]), "RFC 9562 variant: \(id)")
        }
        // The first 48 bits are the milliseconds: later claims sort after earlier ones.
        #expect(ids.first!.hasPrefix("019b76da-a87b"))
        let prefixes = ids.map { String($0.prefix(13)) }
        #expect(prefixes == prefixes.sorted())
        // Read back in any case, always written lowercase; anything but 8-4-4-4-12 hex is refused.
        #expect(APNsID("0199A1B2-C3D4-7E5F-8A9B-0C1D2E3F4A5B")?.text == "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")
        for bad in ["", "0199a1b2c3d47e5f8a9b0c1d2e3f4a5b", "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5", "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5g", "0199a1b2-c3d4-7e5f-8a9b_0c1d2e3f4a5b"] {
            #expect(APNsID(bad) == nil, "\(bad)")
        }
        let u = UUID()
        #expect(APNsID(u).text == u.uuidString.lowercased() && APNsID(u).uuid == u)
    }

    @Test("completion writes: a dead token retires the activity only if it still holds it; a rotated one sends again at once; installation tokens go only if still held")
    func completionWrites() {
        let t = Date(timeIntervalSince1970: 1_767_225_600)
        let job = PushJob(id: 7, bundleID: "b", kind: .update, activityID: "a", installationID: nil, channelID: nil, payload: .update([:], at: t), requestedPriority: nil, runAt: t, state: .claimed,
                          attempts: 1, claimedBy: "w", claimedUntil: t, lastError: nil, createdAt: t, lane: "a:a", seq: 1)
        let claim = ClaimedJob(job: job, timestamp: 1, apnsID: .random(), worker: "w", activity: nil)
        let dead = JobCompletion(claim: claim, result: .deadToken(token: "old", reason: "410 Unregistered", graceUntil: t.addingTimeInterval(30)))
        let same = dead.writes(currentToken: "old")
        #expect(same.job == JobCompletion.Writes.JobWrite.requeue(at: t.addingTimeInterval(30), reason: "410 Unregistered; waiting briefly for a rotated token before giving up"))
        #expect(same.activity?.unreachable == .init(reason: "410 Unregistered", ifToken: "old") && !same.wakesNow)
        let rotated = dead.writes(currentToken: "new")
        #expect(rotated.wakesNow && rotated.activity == nil)
        #expect(dead.writes(currentToken: nil).job == JobCompletion.Writes.JobWrite.finish(.failed, reason: "410 Unregistered"))
        #expect(JobCompletion(claim: claim, result: .finished(.sent, reason: nil)).writes(currentToken: nil).job == JobCompletion.Writes.JobWrite.finish(.sent, reason: nil))

        var i = InstallationRecord(id: "p", bundleID: "b", pushToStartTokens: ["T": "new"], widgetToken: "w1", updatedAt: t)
        #expect(!InstallationPatch(bundleID: "b", installationID: "p", deadPushToStartToken: ("T", "old")).apply(to: &i), "a token replaced since the push stays")
        #expect(InstallationPatch(bundleID: "b", installationID: "p", deadPushToStartToken: ("T", "new"), deadWidgetToken: "w1").apply(to: &i))
        #expect(i.pushToStartTokens.isEmpty && i.widgetToken == nil)
    }

    @Test("placement: where a job joins the queue, the one rule every store writes")
    func placement() {
        let now = Date(timeIntervalSince1970: 1_767_225_600)
        typealias H = LanePlanner.Head
        let plainHead = H(id: 1, isHead: true, claimed: false, supersedable: true)
        func place(_ kind: PushJobKind, activity: String? = "a", alert: Bool = false, payload: JobPayload? = nil, at: Date? = nil, head: H?) -> LanePlanner.Placement {
            LanePlanner.place(kind: kind, activityID: activity, channelID: nil, payload: payload ?? .update([:], alert: alert ? ping : nil, at: now), runAt: at ?? now, now: now) { _ in head }
        }
        // No lane (a start, a widgets push): its own head, whatever else is queued.
        let start = place(.start, activity: nil, payload: startPayload, head: plainHead)
        #expect(start.lane == nil && start.isHead && !start.scheduled && !start.coalescesLane)
        // An empty lane: the head.
        #expect(place(.update, head: nil).isHead)
        // Behind an unsent plain update, content makes the lane coalesce now; an end without content does not.
        let behind = place(.update, alert: true, head: plainHead)
        #expect(!behind.isHead && behind.coalescesLane && !behind.supersedable)
        #expect(!place(.end, payload: .end(at: now), head: plainHead).coalescesLane)
        // Behind a head in flight, or one with an alert: it waits, nothing is coalesced.
        #expect(!place(.update, head: H(id: 1, isHead: true, claimed: true, supersedable: true)).coalescesLane)
        #expect(!place(.update, head: H(id: 1, isHead: true, claimed: false, supersedable: false)).coalescesLane)
        // Scheduled: outside its lane until it comes due (the head is not even read).
        let later = LanePlanner.place(kind: .update, activityID: "a", channelID: nil, payload: .update([:], at: now), runAt: now.addingTimeInterval(60), now: now) { _ -> H? in
            Issue.record("a scheduled job's lane head was read")
            return nil
        }
        #expect(later.scheduled && !later.isHead && !later.coalescesLane)
    }
}

@Suite("SQLite: one serving process per file")
struct ServingHoldTests {
    @Test("a second hold on the same file is refused with the reason; released, it can be taken again")
    func exclusive() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("isle-hold-\(UUID().uuidString).sqlite").path
        let a = try SQLiteStore(path: path)
        let b = try SQLiteStore(path: path)
        let hold = try a.holdForServing()
        #expect {
            _ = try b.holdForServing()
        } throws: { error in
            "\(error)".contains("another isle serve is already using")
        }
        hold.release()
        try b.holdForServing().release()
    }
}


/// `isle app remove`: an app and every row that belongs to it go in one transaction; another
/// app's rows stay, on every store.
@Suite("Store contract: removing an app")
struct AppRemovalTests {
    let t0 = Date(timeIntervalSince1970: 1_767_225_600)
    let ping = LiveActivityAlert(title: "Ping", body: "An alert")

    /// One of everything a store keeps, for `app`: a row in each table of ``Schema/appRows``.
    func populate(_ s: any IsleStore, _ app: String) async throws {
        try await s.upsertApp(AppRecord(bundleID: app, teamID: "TEAM000001", keyID: "KEY0000001", keyPEM: "-", createdAt: t0))
        try await s.insertAPIKey(APIKeyRecord(id: "key_\(app)", bundleID: app, scope: .backend, secretHash: "hash-\(app)", createdAt: t0))
        try await s.upsertInstallation(InstallationRecord(id: "phone", bundleID: app, pushToStartTokens: ["T": "pts-\(app)"], updatedAt: t0))
        try await s.insertActivity(ActivityRecord(id: "a-\(app)", bundleID: app, externalKey: "k", installationID: "phone", attributesType: "T", state: .active,
                                                  updateToken: "tok-\(app)", startedAt: t0, topics: ["t"]))
        try await s.insertActivity(ActivityRecord(id: "b-\(app)", bundleID: app, externalKey: "k2", attributesType: "T", state: .active, updateToken: "tok2-\(app)", startedAt: t0))
        try await s.insertChannel(ChannelRecord(id: "ch-\(app)", bundleID: app, storagePolicy: 0, createdAt: t0), idempotency: nil)
        try await s.putTopic(TopicRecord(bundleID: app, topic: "t", storagePolicy: 1, closeAfterIdle: 3600, createdAt: t0), idempotency: nil)
        try await s.putRenewal(RenewalRecord(activityID: "a-\(app)", bundleID: app, renewUntil: t0.addingTimeInterval(86_400), alert: ["title": "T", "body": "B"], createdAt: t0), idempotency: nil)
        _ = try await s.addTopicChannel(TopicChannel(channelID: "tch-\(app)", bundleID: app, topic: "t", environment: .sandbox, createdAt: t0, lastUsedAt: t0),
                                        channel: ChannelRecord(id: "tch-\(app)", bundleID: app, storagePolicy: 1, createdAt: t0, environment: .sandbox))
        let update = { (activity: String) in
            NewPushJob(bundleID: app, kind: .update, activityID: activity, payload: .update(["x": 1], alert: self.ping, at: self.t0), runAt: self.t0)
        }
        // An update and a widget push (its delivery has no activity), both sent.
        let widgets = NewPushJob(bundleID: app, kind: .widgets, installationID: "phone", payload: .widgets(WidgetPayload()), runAt: t0)
        try await s.enqueue([update("a-\(app)"), widgets], idempotency: IdempotencyRecord(key: "backend:k", bundleID: app, requestHash: "h", status: 202, body: "{}", createdAt: t0), now: t0)
        let others = Set(["com.example.gone", "com.example.kept"]).subtracting([app])
        let claimed = try await s.claim(limit: 10, now: t0, lease: 60, worker: "w", excludingApps: others)
        #expect(claimed.count == 2)
        for c in claimed {
            #expect(try await s.complete(JobCompletion(claim: c, result: .finished(.sent, reason: nil),
                                                       delivery: DeliveryRecord(jobID: c.job.id, activityID: c.job.activityID, apnsID: c.apnsID, apnsUniqueID: nil,
                                                                                status: 200, reason: nil, latencyMS: 1, priority: .high, downgraded: false, at: t0),
                                                       highPriorityAt: c.job.activityID == nil ? nil : t0)))
        }
        try await s.enqueue([update("b-\(app)")], idempotency: nil, now: t0.addingTimeInterval(1))  // still queued
        try await s.appendEvents([NewEvent(bundleID: app, type: .appResumed, at: t0)])
        try await s.insertWebhook(WebhookRecord(id: "wh-\(app)", bundleID: app, url: "http://127.0.0.1:9/in", secret: "s", createdAt: t0, cursor: 0))
        try await s.recordWebhookAttempt(WebhookAttempt(webhookID: "wh-\(app)", bundleID: app, at: t0, status: 200, latencyMS: 1, error: nil, events: 1, firstEvent: 1, lastEvent: 1, kind: "delivery"))
        try await s.appendAudit(AuditEntry(bundleID: app, keyID: "key_\(app)", action: "job.cancel", at: t0))
        try await s.addHistory([HistoryPoint(bundleID: app, minute: t0, metric: "sent", count: 1)])
        #expect(try await s.pauseApp(OperatorPause(bundleID: app, keyID: "key_\(app)", reason: "r", at: t0), event: NewEvent(bundleID: app, type: .appPaused, at: t0)))
    }

    @Test("the app's rows in every table go, another app's stay; removing it again finds nothing", arguments: StoreKind.allCases)
    func removesEverything(_ kind: StoreKind) async throws {
        let s = try await kind.make()
        try await populate(s, "com.example.gone")
        try await populate(s, "com.example.kept")
        // Finished jobs pruned (deliveries stay longer): the widget push's delivery then names
        // neither a job nor an activity, only its app.
        var retention = Retention()
        retention.finishedJobs = 60
        _ = try await s.prune(now: t0.addingTimeInterval(120), retention: retention, limit: 1000)
        let before = try await s.appRowCounts("com.example.gone")
        let kept = try await s.appRowCounts("com.example.kept")
        // The test reaches every table the removal covers, and the removal covers every table.
        #expect(Set(Schema.appRows.map(\.table)) == Set(Schema.tables.map(\.name)))
        for (table, _) in Schema.appRows { #expect((before[table] ?? 0) > 0, "\(kind): no \(table) row to remove") }

        let removed = try #require(try await s.removeApp("com.example.gone"))
        #expect(removed == before, "\(kind): removed \(removed), counted \(before)")
        for (table, n) in try await s.appRowCounts("com.example.gone") { #expect(n == 0, "\(kind): \(n) \(table) rows left") }
        #expect(try await s.appRowCounts("com.example.kept") == kept)
        #expect(try await s.app("com.example.gone") == nil)
        #expect(try await s.apiKey(secretHash: "hash-com.example.gone") == nil)
        #expect(try await s.activity(id: "a-com.example.gone") == nil)
        #expect(try await s.removeApp("com.example.gone") == nil)
        // The other app's queue still works: its queued job is claimed and sent.
        let next = try await s.claim(limit: 10, now: t0.addingTimeInterval(200), lease: 60, worker: "w")
        #expect(next.map(\.job.bundleID) == ["com.example.kept"])
        // Counted without the removal's own conditions: every row left in every table is the
        // other app's (SQLite, read table by table).
        if let sqlite = s as? SQLiteStore {
            for table in Schema.tables.map(\.name) {
                let rows = try await sqlite.exportTable(table).rows.count
                #expect(rows == kept[table] ?? 0, "\(table): \(rows) rows left, the kept app has \(kept[table] ?? 0)")
            }
        }
    }
}

/// A job keeps the traceparent of the request that queued it (docs/server.md, "Tracing"; the
/// server sets it as it queues), on every store; none when the server does not trace.
@Suite("Store contract: trace context")
struct TraceContextStoreTests {
    let t0 = Date(timeIntervalSince1970: 1_767_225_600)
    let ping = LiveActivityAlert(title: "Ping", body: "An alert")

    @Test("a job queued with a traceparent carries it to the claim; one without, none", arguments: StoreKind.allCases)
    func traceParentRoundTrip(_ kind: StoreKind) async throws {
        let s = try await kind.make()
        try await s.upsertApp(AppRecord(bundleID: "com.example.pizza", teamID: "TEAM000001", keyID: "KEY0000001", keyPEM: "-", createdAt: t0))
        for id in ["traced", "plain"] {
            try await s.insertActivity(ActivityRecord(id: id, bundleID: "com.example.pizza", attributesType: "T", state: .active, updateToken: "tok-\(id)", startedAt: t0))
        }
        func update(_ activity: String) -> NewPushJob {
            NewPushJob(bundleID: "com.example.pizza", kind: .update, activityID: activity, payload: .update(["x": 1], alert: ping, at: t0), runAt: t0)
        }
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        var traced = update("traced")
        traced.traceParent = parent
        try await s.enqueue([traced, update("plain")], idempotency: nil, now: t0)
        let claimed = try await s.claim(limit: 10, now: t0, lease: 60, worker: "w")
        #expect(claimed.count == 2)
        #expect(claimed.first { $0.job.activityID == "traced" }?.job.traceParent == parent)
        #expect(claimed.first { $0.job.activityID == "plain" }.map { $0.job.traceParent == nil } == true)
    }
}

/// A job's payload as the store holds it reads back typed, and only for the job's kind.
@Suite("Job payloads")
struct JobPayloadTests {
    let t0 = Date(timeIntervalSince1970: 1_767_225_600)

    @Test("a stored aps decodes to the typed payload of its kind; another kind's is refused, naming the event")
    func kinds() throws {
        let alert = LiveActivityAlert(title: .localized(key: "ARRIVING", arguments: ["Anna"]), body: .plain("Soon"), sound: .default)
        let cases: [(PushJobKind, JobPayload)] = [
            (.update, .update(["n": 1], alert: alert, staleDate: t0.addingTimeInterval(600), relevanceScore: 50, at: t0)),
            (.end, .end(["n": 2], dismissalDate: t0.addingTimeInterval(60), at: t0)),
            (.end, .end(at: t0)),
            (.start, .start(attributesType: "T", attributes: ["o": 1], contentState: ["n": 0], alert: alert, at: t0)),
            (.broadcast, .update(["n": 3], at: t0)),
            (.broadcast, .end(at: t0)),
            (.widgets, .widgets(WidgetPayload())),
        ]
        for (kind, payload) in cases {
            let job = NewPushJob(bundleID: "b", kind: kind, payload: payload, runAt: t0)
            #expect(try JobPayload(kind: kind, encoded: job.apsText.utf8, acceptedAt: t0) == payload, "\(kind)")
        }
        #expect(throws: PayloadDecodingError.self) { try JobPayload(kind: .update, encoded: #"{"event":"end"}"#.utf8, acceptedAt: t0) }
        #expect(throws: PayloadDecodingError.self) { try JobPayload(kind: .broadcast, encoded: #"{"event":"start"}"#.utf8, acceptedAt: t0) }
        #expect(throws: PayloadDecodingError.self) { try JobPayload(kind: .widgets, encoded: #"{"event":"update"}"#.utf8, acceptedAt: t0) }
        #expect(throws: PayloadDecodingError.self) { try JobPayload(kind: .update, encoded: "[1]".utf8, acceptedAt: t0) }
        #expect(NewPushJob(bundleID: "b", kind: .widgets, payload: .widgets(WidgetPayload()), runAt: t0).apsText == #"{"content-changed":true}"#)
    }
}
