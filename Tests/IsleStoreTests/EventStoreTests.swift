import Foundation
import IsleCore
import IsleStore
import IsleDelivery
import Testing

/// Events and webhooks, on every store (docs/events.md): written in the transaction of the fact they
/// tell, numbered in commit order, read after a cursor; webhooks' progress and holds.
@Suite("Events and webhooks in the store")
struct EventStoreTests {
    let t0 = Date(timeIntervalSince1970: 1_767_225_600)
    let app = "com.example.pizza"

    func seeded(_ kind: StoreKind) async throws -> any IsleStore {
        let s = try await kind.make()
        try await s.upsertApp(AppRecord(bundleID: app, teamID: "TEAM000001", keyID: "KEY0000001", keyPEM: "-", createdAt: t0))
        try await s.upsertApp(AppRecord(bundleID: "com.example.other", teamID: "TEAM000001", keyID: "KEY0000001", keyPEM: "-", createdAt: t0))
        for i in 0..<4 {
            try await s.insertActivity(ActivityRecord(id: "a\(i)", bundleID: app, attributesType: "T", state: .active, updateToken: "tok\(i)", startedAt: t0))
        }
        return s
    }

    func update(_ activity: String) -> NewPushJob {
        NewPushJob(bundleID: app, kind: .update, activityID: activity, payload: .update(["x": "1"], alert: LiveActivityAlert(title: "T", body: "B"), at: t0), runAt: t0)
    }

    func delivery(_ c: ClaimedJob, status: Int, reason: String? = nil) -> DeliveryRecord {
        DeliveryRecord(jobID: c.job.id, activityID: c.job.activityID, apnsID: c.apnsID, apnsUniqueID: nil, status: status, reason: reason, latencyMS: 1, priority: .low,
                       downgraded: false, at: t0.addingTimeInterval(1))
    }

    @Test("completions and device reports write their events in the same transaction, in order; a lost claim writes none", arguments: StoreKind.allCases)
    func eventsOfFacts(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.enqueue((0..<4).map { update("a\($0)") }, idempotency: nil, now: t0)
        let claimed = try await s.claim(limit: 10, now: t0, lease: 30, worker: "w")
        #expect(claimed.count == 4)
        let by = Dictionary(uniqueKeysWithValues: claimed.map { ($0.job.activityID!, $0) })
        // a0 delivered; a1 refused for good; a2's token dead (410) while the activity still holds it.
        #expect(try await s.complete(JobCompletion(claim: by["a0"]!, result: .finished(.sent, reason: nil), delivery: delivery(by["a0"]!, status: 200))))
        #expect(try await s.complete(JobCompletion(claim: by["a1"]!, result: .finished(.failed, reason: "PayloadTooLarge"), delivery: delivery(by["a1"]!, status: 413, reason: "PayloadTooLarge"))))
        #expect(try await s.complete(JobCompletion(claim: by["a2"]!, result: .deadToken(token: "tok2", reason: "Unregistered", graceUntil: t0.addingTimeInterval(60)),
                                                   delivery: delivery(by["a2"]!, status: 410, reason: "Unregistered"))))
        // A claim completed by another worker is lost: nothing is written, no event either.
        var stolen = by["a3"]!
        stolen.worker = "someone-else"
        #expect(try await !s.complete(JobCompletion(claim: stolen, result: .finished(.sent, reason: nil), delivery: delivery(stolen, status: 200))))
        // The device reports: a3 dismissed, a0's token rotated; a change with no report tells nothing.
        _ = try await s.modifyActivity(id: "a3", { try ActivityLifecycle.apply(.dismissed(at: self.t0.addingTimeInterval(5)), to: &$0) }, idempotency: nil,
                                       reportedBy: Events.Source("device", at: t0.addingTimeInterval(5)))
        _ = try await s.modifyActivity(id: "a0", { try ActivityLifecycle.apply(.tokenRotated("tok0-new"), to: &$0) }, idempotency: nil,
                                       reportedBy: Events.Source("device", at: t0.addingTimeInterval(6)))
        _ = try await s.modifyActivity(id: "a1", { $0.externalKey = "order-1" })
        try await s.appendEvents([NewEvent(bundleID: "com.example.other", type: .appResumed, at: t0)])

        let events = try await s.events(bundleID: app, after: 0, limit: 100)
        #expect(events.map(\.event.type) == [.pushDelivered, .pushFailed, .tokenRetired, .activityDismissed, .activityTokenRotated])
        #expect(events.map(\.event.activityID) == ["a0", "a1", "a2", "a3", "a0"])
        #expect(events[0].event.data["apnsID"]?.stringValue == by["a0"]!.apnsID.text)
        #expect(events[1].event.data["reason"]?.stringValue == "PayloadTooLarge" && events[1].event.data["status"] == .int(413))
        #expect(events[2].event.data["apnsReason"]?.stringValue == "Unregistered")
        #expect(events[3].event.at == t0.addingTimeInterval(5) && events[3].event.data["source"]?.stringValue == "device")
        #expect(zip(events, events.dropFirst()).allSatisfy { $0.seq < $1.seq })
        // Paged by cursor; each app sees its own.
        let page = try await s.events(bundleID: app, after: events[1].seq, limit: 2)
        #expect(page.map(\.seq) == [events[2].seq, events[3].seq])
        #expect(try await s.lastEventSeq(bundleID: app) == events[4].seq)
        #expect(try await s.events(bundleID: "com.example.other", after: 0, limit: 10).map(\.event.type) == [.appResumed])
        #expect(try await s.lastEventSeq(bundleID: "com.example.none") == 0)
        #expect(events[0].id == "evt_\(events[0].seq)")

        // Retention: events older than their time go.
        var retention = Retention()
        retention.events = 60
        _ = try await s.prune(now: t0.addingTimeInterval(3600), retention: retention, limit: 1000)
        // The newest event of the stream (another app's here) stays, so numbers never start again.
        let highest = try await s.lastEventSeq(bundleID: "com.example.other")
        #expect(try await s.events(bundleID: app, after: 0, limit: 100).isEmpty)
        #expect(highest > events[4].seq)
        try await s.appendEvents([NewEvent(bundleID: app, type: .appResumed, at: t0.addingTimeInterval(3600))])
        #expect(try await s.events(bundleID: app, after: 0, limit: 10).map(\.seq).allSatisfy { $0 > highest })
    }

    @Test("events name the activity's key, installation and user; a job keeps the requests APNs saw and its last answer, which a later failure without a request reports", arguments: StoreKind.allCases)
    func eventSubjectsAndAnswers(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        try await s.upsertInstallation(InstallationRecord(id: "phone", bundleID: app, userID: "user-1", updatedAt: t0))
        for (id, key) in [("a0", "order-0"), ("a1", "order-1")] {
            _ = try await s.modifyActivity(id: id, { $0.externalKey = key; $0.installationID = "phone" })
        }
        try await s.enqueue([update("a0"), update("a1")], idempotency: nil, now: t0)
        var claimed = try await s.claim(limit: 10, now: t0, lease: 30, worker: "w")
        var by = Dictionary(uniqueKeysWithValues: claimed.map { ($0.job.activityID!, $0) })
        #expect(by["a0"]?.job.apnsRequests == 0 && by["a0"]?.job.lastAnswer == nil)
        // a0 delivered at once; a1 answered 503 and retried.
        var c0 = JobCompletion(claim: by["a0"]!, result: .finished(.sent, reason: nil), delivery: delivery(by["a0"]!, status: 200))
        c0.at = t0.addingTimeInterval(1)
        #expect(try await s.complete(c0))
        #expect(try await s.complete(JobCompletion(claim: by["a1"]!, result: .retry(at: t0.addingTimeInterval(2), reason: "503"),
                                                   delivery: delivery(by["a1"]!, status: 503, reason: "ServiceUnavailable"))))
        // The retry's claim: one request so far, its answer kept; then a claim that sends nothing.
        claimed = try await s.claim(limit: 10, now: t0.addingTimeInterval(3), lease: 30, worker: "w")
        by = Dictionary(uniqueKeysWithValues: claimed.map { ($0.job.activityID!, $0) })
        #expect(by["a1"]?.job.apnsRequests == 1 && by["a1"]?.job.lastAnswer == APNsAnswer(status: 503, reason: "ServiceUnavailable"))
        #expect(try await s.complete(JobCompletion(claim: by["a1"]!, result: .retry(at: t0.addingTimeInterval(4), reason: "held: the app is paused"))))
        // A request that got no answer (status 0: the connection failed) is not APNs' answer.
        claimed = try await s.claim(limit: 10, now: t0.addingTimeInterval(4.5), lease: 30, worker: "w")
        let lost = try #require(claimed.first)
        #expect(try await s.complete(JobCompletion(claim: lost, result: .retry(at: t0.addingTimeInterval(4.6), reason: "transport"),
                                                   delivery: delivery(lost, status: 0, reason: "transport: connection reset"))))
        claimed = try await s.claim(limit: 10, now: t0.addingTimeInterval(5), lease: 30, worker: "w")
        let last = try #require(claimed.first)
        #expect(last.job.apnsRequests == 1 && last.job.lastAnswer?.status == 503)
        // The installation's user changes; the failure that follows names the new one.
        try await s.upsertInstallation(InstallationRecord(id: "phone", bundleID: app, userID: "user-2", updatedAt: t0))
        var failure = JobCompletion(claim: last, result: .finished(.failed, reason: "its time ran out"))
        failure.at = t0.addingTimeInterval(90)
        #expect(try await s.complete(failure))
        _ = try await s.modifyActivity(id: "a0", { try ActivityLifecycle.apply(.dismissed(at: self.t0.addingTimeInterval(100)), to: &$0) }, idempotency: nil,
                                       reportedBy: Events.Source("device", at: t0.addingTimeInterval(100)))

        let events = try await s.events(bundleID: app, after: 0, limit: 100).map(\.event)
        // The 503 is told once, as push.retrying, when it is answered; the retries that sent nothing are not.
        #expect(events.map(\.type) == [.pushDelivered, .pushRetrying, .pushFailed, .activityDismissed])
        #expect(events.map(\.externalKey) == ["order-0", "order-1", "order-1", "order-0"])
        #expect(events.map(\.installationID) == ["phone", "phone", "phone", "phone"])
        #expect(events.map(\.userID) == ["user-1", "user-1", "user-2", "user-2"])
        #expect(events[0].data["attempts"] == .int(1) && events[0].at == t0.addingTimeInterval(1))
        #expect(events[1].data["status"] == .int(503) && events[1].data["apnsReason"] == .string("ServiceUnavailable") && events[1].data["retryAt"] == .int(Int64(t0.timeIntervalSince1970) + 2))
        // The failure: APNs' last answer (503), one request, at the moment it failed.
        #expect(events[2].data["status"] == .int(503) && events[2].data["apnsReason"] == .string("ServiceUnavailable"))
        #expect(events[2].data["attempts"] == .int(1))
        #expect(events[2].at == t0.addingTimeInterval(90))
        let stored = try #require(try await s.events(bundleID: app, after: 0, limit: 1).first?.event)
        #expect(stored.externalKey == "order-0" && stored.installationID == "phone" && stored.userID == "user-1")
    }

    @Test("events written concurrently are read after a cursor without a gap: a reader never steps over one committed later", arguments: StoreKind.allCases)
    func commitOrder(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        let writers = 8, perWriter = 40
        let seen = try await withThrowingTaskGroup(of: [Int64].self) { group in
            for w in 0..<writers {
                group.addTask {
                    for i in 0..<perWriter {
                        try await s.appendEvents([NewEvent(bundleID: app, type: .appResumed, data: ["w": .int(w), "i": .int(i)], at: t0)])
                    }
                    return []
                }
            }
            group.addTask {
                var cursor: Int64 = 0
                var got: [Int64] = []
                let deadline = ContinuousClock.now + .seconds(60)
                while got.count < writers * perWriter, ContinuousClock.now < deadline {
                    let page = try await s.events(bundleID: app, after: cursor, limit: 7)
                    got += page.map(\.seq)
                    cursor = page.last?.seq ?? cursor
                    if page.isEmpty { await Task.yield() }
                }
                return got
            }
            var all: [Int64] = []
            for try await r in group { all += r }
            return all
        }
        let stored = try await s.events(bundleID: app, after: 0, limit: 10_000).map(\.seq)
        #expect(stored.count == writers * perWriter)
        #expect(seen == stored, "the reader following the cursor saw \(seen.count) of \(stored.count)")
        // Each writer's events in its own order.
        let events = try await s.events(bundleID: app, after: 0, limit: 10_000)
        for w in 0..<writers {
            let mine = events.filter { $0.event.data["w"] == .int(w) }.compactMap { $0.event.data["i"]?.numberValue?.int64Value }
            #expect(mine == (0..<perWriter).map(Int64.init))
        }
    }

    @Test("webhooks: created, listed per app, progress saved (the cursor never moves back), held by one worker at a time, deleted", arguments: StoreKind.allCases)
    func webhooks(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        let hook = WebhookRecord(id: "wh_1", bundleID: app, url: "http://127.0.0.1:9/in", secret: "sealed", createdAt: t0, cursor: 5)
        try await s.insertWebhook(hook)
        try await s.insertWebhook(WebhookRecord(id: "wh_2", bundleID: "com.example.other", url: "https://example.invalid/x", secret: "s", createdAt: t0.addingTimeInterval(1), cursor: 0))
        #expect(try await s.webhooks(bundleID: app).map(\.id) == ["wh_1"])
        #expect(try await s.allWebhooks().map(\.id) == ["wh_1", "wh_2"])
        var w = try #require(try await s.webhook(id: "wh_1"))
        #expect(w == hook)
        w.failed(status: 500, error: "the endpoint answered 500", at: t0.addingTimeInterval(10))
        #expect(try await s.saveWebhookProgress(w))
        var back = try #require(try await s.webhook(id: "wh_1"))
        #expect(back.failingSince == t0.addingTimeInterval(10) && back.lastStatus == 500 && back.attempts == 1 && back.nextAttemptAt == t0.addingTimeInterval(11))
        back.acknowledged(through: 9, count: 4, at: t0.addingTimeInterval(20))
        #expect(try await s.saveWebhookProgress(back))
        var stale = back
        stale.cursor = 7
        #expect(try await s.saveWebhookProgress(stale))
        let now = try #require(try await s.webhook(id: "wh_1"))
        #expect(now.cursor == 9 && now.delivered == 4 && now.failingSince == nil && now.nextAttemptAt == nil && now.attempts == 0 && now.secret == "sealed")
        // Holds.
        #expect(try await s.holdWebhook(id: "wh_1", worker: "p1", now: t0, lease: 30))
        #expect(try await !s.holdWebhook(id: "wh_1", worker: "p2", now: t0.addingTimeInterval(10), lease: 30))
        #expect(try await s.holdWebhook(id: "wh_1", worker: "p1", now: t0.addingTimeInterval(10), lease: 30))
        #expect(try await s.holdWebhook(id: "wh_1", worker: "p2", now: t0.addingTimeInterval(41), lease: 30))
        // A serving process's start: on SQLite every hold is a dead process's (the file lock says
        // so) and goes at once; on PostgreSQL another instance may be sending, so it stays.
        let released = try await s.releaseWebhookHoldsAtStart()
        #expect(released == (kind == .sqlite ? 1 : 0))
        #expect(try await s.holdWebhook(id: "wh_1", worker: "p3", now: t0.addingTimeInterval(42), lease: 30) == (kind == .sqlite))
        #expect(try await s.deleteWebhook(id: "wh_1"))
        #expect(try await !s.deleteWebhook(id: "wh_1"))
        #expect(try await !s.saveWebhookProgress(now))
        #expect(try await !s.holdWebhook(id: "wh_1", worker: "p1", now: t0, lease: 30))
    }

    @Test("webhooks managed: settings change under their revision (a sender's stale progress is refused, a replay moves the cursor back), a disable writes its event in the same transaction; the newest 100 attempts are kept", arguments: StoreKind.allCases)
    func webhooksManaged(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        var hook = WebhookRecord(id: "wh_1", bundleID: app, url: "https://example.com/h", secret: "s1", createdAt: t0, cursor: 0)
        hook.eventTypes = [.pushFailed, .webhookDisabled]
        try await s.insertWebhook(hook)
        try await s.appendEvents((0..<5).map { NewEvent(bundleID: app, type: .appResumed, at: t0.addingTimeInterval(Double($0))) })
        let last = try await s.lastEventSeq(bundleID: app)
        // A sender read it, then its settings changed: the sender's save is refused.
        var sender = try #require(try await s.webhook(id: "wh_1"))
        #expect(sender.eventTypes == [.pushFailed, .webhookDisabled] && sender.revision == 0)
        sender.acknowledged(through: last, count: 5, at: t0)
        var edited = try #require(try await s.webhook(id: "wh_1"))
        edited.secret = "s2"
        edited.previousSecret = "s1"
        edited.previousSecretUntil = t0.addingTimeInterval(3600)
        edited.eventTypes = nil
        #expect(try await s.changeWebhook(edited, replayFrom: nil, resetFailure: false, events: []))
        #expect(try await !s.saveWebhookProgress(sender))
        #expect(try await !s.changeWebhook(edited, replayFrom: nil, resetFailure: false, events: []), "a second change from the same read is refused")
        var now = try #require(try await s.webhook(id: "wh_1"))
        #expect(now.revision == 1 && now.cursor == 0 && now.secret == "s2" && now.previousSecret == "s1" && now.previousSecretUntil == t0.addingTimeInterval(3600) && now.eventTypes == nil)
        // Progress under the current revision; then a replay moves the cursor back.
        now.acknowledged(through: last, count: 5, at: t0)
        #expect(try await s.saveWebhookProgress(now))
        let read = try #require(try await s.webhook(id: "wh_1"))
        #expect(try await s.changeWebhook(read, replayFrom: 2, resetFailure: false, events: []))
        #expect(try await s.webhook(id: "wh_1")?.cursor == 2)
        // Failing, then disabled with its event in the same write; enabling clears the failure.
        var failing = try #require(try await s.webhook(id: "wh_1"))
        failing.failed(status: 500, error: "the endpoint answered 500", at: t0)
        #expect(try await s.saveWebhookProgress(failing))
        var off = try #require(try await s.webhook(id: "wh_1"))
        off.disabledAt = t0.addingTimeInterval(10)
        off.disabledReason = "failing"
        #expect(try await s.changeWebhook(off, replayFrom: nil, resetFailure: false, events: [NewEvent(bundleID: app, type: .webhookDisabled, data: ["webhookID": "wh_1"], at: t0)]))
        #expect(try await s.events(bundleID: app, after: last, limit: 10).map(\.event.type) == [.webhookDisabled])
        var on = try #require(try await s.webhook(id: "wh_1"))
        #expect(on.disabledAt == t0.addingTimeInterval(10) && on.disabledReason == "failing" && on.failingSince != nil)
        on.disabledAt = nil
        on.disabledReason = nil
        #expect(try await s.changeWebhook(on, replayFrom: nil, resetFailure: true, events: []))
        let enabled = try #require(try await s.webhook(id: "wh_1"))
        #expect(enabled.disabledAt == nil && enabled.failingSince == nil && enabled.attempts == 0 && enabled.nextAttemptAt == nil)
        // Attempts: newest first, the newest 100 kept, gone with the webhook.
        for i in 0..<105 {
            try await s.recordWebhookAttempt(WebhookAttempt(webhookID: "wh_1", bundleID: app, at: t0.addingTimeInterval(Double(i)), status: i % 2 == 0 ? 200 : 0, latencyMS: 1.5,
                                                            error: i % 2 == 0 ? nil : "no answer", events: 2, firstEvent: 1, lastEvent: 2, kind: "delivery"))
        }
        let kept = try await s.webhookAttempts(webhookID: "wh_1", limit: 1000)
        #expect(kept.count == WebhookAttempt.kept)
        #expect(kept.first?.at == t0.addingTimeInterval(104) && kept.last?.at == t0.addingTimeInterval(5))
        #expect(kept.first?.error == nil && kept[1].error == "no answer" && kept[1].status == 0 && kept.first?.lastEvent == 2)
        #expect(try await s.deleteWebhook(id: "wh_1"))
        #expect(try await s.webhookAttempts(webhookID: "wh_1", limit: 10).isEmpty)
    }

    @Test("operators: the open queue of an app or activity; cancel a job not in flight (its lane's next job becomes the head); retry a queued one now; the audit log pages newest first", arguments: StoreKind.allCases)
    func operatorActions(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        // a0: three jobs in its lane; a1: one scheduled for later.
        let ids = try await s.enqueue([update("a0"), update("a0"), update("a0")], idempotency: nil, now: t0)
        var later = update("a1")
        later.runAt = t0.addingTimeInterval(3600)
        let scheduled = try await s.enqueue([later], idempotency: nil, now: t0)[0]
        #expect(try await s.openJobs(bundleID: app, activityID: nil, limit: 10).map(\.id) == ids + [scheduled])
        #expect(try await s.openJobs(bundleID: app, activityID: "a1", limit: 10).map(\.state) == [.scheduled])
        #expect(try await s.openJobs(bundleID: "com.example.other", activityID: nil, limit: 10).isEmpty)
        // Cancel the head: the next job of the lane is claimed next, in order.
        #expect(try await s.cancelJob(id: ids[0], bundleID: app, reason: "by an operator")?.id == ids[0])
        let dropped = try await s.job(id: ids[0])
        #expect(dropped?.state == .dropped && dropped?.lastError == "by an operator")
        #expect(try await s.cancelJob(id: ids[0], bundleID: app, reason: "again") == nil)
        #expect(try await s.cancelJob(id: ids[1], bundleID: "com.example.other", reason: "not mine") == nil)
        #expect(try await s.cancelJob(id: scheduled, bundleID: app, reason: "not wanted")?.state == .scheduled)
        let claimed = try await s.claim(limit: 10, now: t0, lease: 30, worker: "w")
        #expect(claimed.map(\.job.id) == [ids[1]])
        // In flight: not cancellable. Sent back for a retry an hour later, then retried now.
        #expect(try await s.cancelJob(id: ids[1], bundleID: app, reason: "in flight") == nil)
        #expect(try await s.complete(JobCompletion(claim: claimed[0], result: .retry(at: t0.addingTimeInterval(3600), reason: "503"))))
        #expect(try await s.claim(limit: 10, now: t0.addingTimeInterval(1), lease: 30, worker: "w").isEmpty)
        #expect(try await s.retryJobNow(id: ids[1], bundleID: app, now: t0.addingTimeInterval(2)))
        #expect(try await !s.retryJobNow(id: ids[0], bundleID: app, now: t0.addingTimeInterval(2)))
        #expect(try await s.claim(limit: 10, now: t0.addingTimeInterval(2), lease: 30, worker: "w").map(\.job.id) == [ids[1]])
        #expect(try await s.openJobs(bundleID: app, activityID: "a0", limit: 10).map(\.state) == [.queued, .claimed])  // by due time: the retried one is due later

        for i in 0..<5 { try await s.appendAudit(AuditEntry(bundleID: app, keyID: "key_1", action: "job.cancel", target: "job \(i)", at: t0.addingTimeInterval(Double(i)))) }
        try await s.appendAudit(AuditEntry(bundleID: "com.example.other", keyID: "key_2", action: "signIn", at: t0))
        let page = try await s.auditLog(bundleID: app, before: nil, limit: 3)
        #expect(page.map(\.target) == ["job 4", "job 3", "job 2"] && page.allSatisfy { $0.keyID == "key_1" })
        #expect(try await s.auditLog(bundleID: app, before: page.last?.id, limit: 10).map(\.target) == ["job 1", "job 0"])
        #expect(try await s.auditLog(bundleID: "com.example.other", before: nil, limit: 10).map(\.action) == ["signIn"])
    }

    @Test("operator pauses: stored with their event in one transaction; a second pause changes the reason without an event; resume returns the pause", arguments: StoreKind.allCases)
    func pauses(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        let paused = NewEvent(bundleID: app, type: .appPaused, data: ["cause": "operator"], at: t0)
        #expect(try await s.pauseApp(OperatorPause(bundleID: app, keyID: "key_1", reason: "first", at: t0), event: paused))
        #expect(try await !s.pauseApp(OperatorPause(bundleID: app, keyID: "key_2", reason: "second", at: t0.addingTimeInterval(1)), event: paused))
        #expect(try await s.operatorPauses() == [OperatorPause(bundleID: app, keyID: "key_2", reason: "second", at: t0.addingTimeInterval(1))])
        let resumed = NewEvent(bundleID: app, type: .appResumed, data: ["source": "operator"], at: t0.addingTimeInterval(2))
        #expect(try await s.resumeApp(bundleID: app, event: resumed)?.reason == "second")
        #expect(try await s.resumeApp(bundleID: app, event: resumed) == nil)
        #expect(try await s.operatorPauses().isEmpty)
        #expect(try await s.events(bundleID: app, after: 0, limit: 10).map(\.event.type) == [.appPaused, .appResumed])
    }

    @Test("history: counts add up per app, minute and metric (several writers); read summed over buckets; pruned after their time; priority-10 sends per activity of an app", arguments: StoreKind.allCases)
    func history(_ kind: StoreKind) async throws {
        let s = try await seeded(kind)
        let m0 = t0, m1 = t0.addingTimeInterval(60), m2 = t0.addingTimeInterval(3600)
        try await s.addHistory([HistoryPoint(bundleID: app, minute: m0, metric: "delivered", count: 2), HistoryPoint(bundleID: app, minute: m1, metric: "delivered", count: 3),
                                HistoryPoint(bundleID: app, minute: m2, metric: "delivered", count: 7), HistoryPoint(bundleID: "com.example.other", minute: m0, metric: "delivered", count: 100)])
        try await s.addHistory([HistoryPoint(bundleID: app, minute: m0, metric: "delivered", count: 1), HistoryPoint(bundleID: app, minute: m0, metric: "reason:BadDeviceToken", count: 1)])
        let perMinute = try await s.history(bundleID: app, from: t0, to: t0.addingTimeInterval(7200), bucket: 60)
        #expect(perMinute.filter { $0.metric == "delivered" }.map(\.count) == [3, 3, 7])
        #expect(perMinute.first { $0.metric == "reason:BadDeviceToken" }?.count == 1)
        let perHour = try await s.history(bundleID: app, from: t0, to: t0.addingTimeInterval(7200), bucket: 3600)
        #expect(perHour.filter { $0.metric == "delivered" }.map(\.count) == [6, 7])
        #expect(perHour.filter { $0.metric == "delivered" }.map(\.minute) == [t0, t0.addingTimeInterval(3600)])
        #expect(try await s.history(bundleID: app, from: t0.addingTimeInterval(61), to: t0.addingTimeInterval(3600), bucket: 60).isEmpty)
        var retention = Retention()
        retention.history = 1800
        _ = try await s.prune(now: t0.addingTimeInterval(3600), retention: retention, limit: 1000)
        #expect(try await s.history(bundleID: app, from: t0, to: t0.addingTimeInterval(7200), bucket: 60).map(\.count) == [7])

        for (activity, n) in [("a0", 3), ("a1", 1)] {
            for i in 0..<n {
                try await s.enqueue([update(activity)], idempotency: nil, now: t0)
                let c = try await s.claim(limit: 1, now: t0, lease: 30, worker: "w")
                #expect(try await s.complete(JobCompletion(claim: c[0], result: .finished(.sent, reason: nil), highPriorityAt: t0.addingTimeInterval(Double(i)))))
            }
        }
        let budget = try await s.highPrioritySends(bundleID: app, since: t0, limit: 10)
        #expect(budget.map(\.activityID) == ["a0", "a1"] && budget.map(\.count) == [3, 1])
        #expect(try await s.highPrioritySends(bundleID: "com.example.other", since: t0, limit: 10).isEmpty)
    }

    @Test("the operator's search: key prefix, installation, user, state, newest first, per app", arguments: StoreKind.allCases)
    func search(_ kind: StoreKind) async throws {
        let s = try await kind.make()
        try await s.upsertApp(AppRecord(bundleID: app, teamID: "TEAM000001", keyID: "KEY0000001", keyPEM: "-", createdAt: t0))
        try await s.upsertInstallation(InstallationRecord(id: "phone-b", bundleID: app, userID: "user-42", updatedAt: t0))
        for (i, (key, installation)) in [("order-1", "phone-a"), ("order-12", "phone-b"), ("pizza-3", "phone-b"), ("order_x", "phone-a")].enumerated() {
            try await s.insertActivity(ActivityRecord(id: "a\(i)", bundleID: app, externalKey: key, installationID: installation, attributesType: "T", state: i == 3 ? .ended : .active,
                                                      updateToken: "tok\(i)", startedAt: t0.addingTimeInterval(Double(i))))
        }
        func ids(_ prefix: String?, _ installation: String? = nil, _ user: String? = nil, _ state: ActivityRecordState? = nil) async throws -> [String] {
            try await s.findActivities(bundleID: app, keyPrefix: prefix, installationID: installation, userID: user, state: state, limit: 10).map(\.id)
        }
        #expect(try await ids("order-1") == ["a1", "a0"])
        #expect(try await ids("order") == ["a3", "a1", "a0"])
        #expect(try await ids("order_") == ["a3"], "_ is a character, not a wildcard")
        #expect(try await ids(nil, "phone-b") == ["a2", "a1"])
        #expect(try await ids(nil, nil, "user-42") == ["a2", "a1"])
        #expect(try await ids("pizza", nil, "user-42") == ["a2"])
        #expect(try await ids(nil, nil, nil, .ended) == ["a3"])
        #expect(try await s.findActivities(bundleID: "com.example.other", keyPrefix: nil, installationID: nil, userID: nil, state: nil, limit: 10).isEmpty)

        // The API's query: several states, a topic, a cursor (equal start times ordered by id).
        try await s.insertActivity(ActivityRecord(id: "b1", bundleID: app, externalKey: "t-1", attributesType: "T", state: .active, updateToken: "tb1",
                                                  startedAt: t0.addingTimeInterval(10.123456), topics: ["goals"]))
        try await s.insertActivity(ActivityRecord(id: "b2", bundleID: app, externalKey: "t-2", attributesType: "T", state: .active, updateToken: "tb2",
                                                  startedAt: t0.addingTimeInterval(10.123456), topics: ["goals", "news"]))
        func query(_ q: ActivityQuery) async throws -> [String] { try await s.findActivities(q).map(\.id) }
        #expect(try await query(ActivityQuery(bundleID: app, topic: "goals", limit: 10)) == ["b2", "b1"])
        #expect(try await s.findActivities(ActivityQuery(bundleID: app, topic: "news", limit: 10)).first?.topics == ["goals", "news"])
        #expect(try await query(ActivityQuery(bundleID: app, states: [.ended, .active], limit: 10)) == ["b2", "b1", "a3", "a2", "a1", "a0"])
        var all: [String] = []
        var after: ActivityQuery.Cursor?
        repeat {
            let page = try await s.findActivities(ActivityQuery(bundleID: app, after: after, limit: 2))
            all += page.map(\.id)
            after = page.count == 2 ? page.last.map { ActivityQuery.Cursor(startedAt: $0.startedAt, id: $0.id) } : nil
        } while after != nil
        #expect(all == ["b2", "b1", "a3", "a2", "a1", "a0"])

        // Start times no store keeps exactly (PostgreSQL: microseconds), several activities on
        // each: pages of every size list each activity once, in order.
        var ids: [String] = []
        for group in 0..<4 {
            for n in 0..<3 {
                let id = "c\(group)\(n)"
                ids.append(id)
                try await s.insertActivity(ActivityRecord(id: id, bundleID: app, externalKey: "c-\(group)-\(n)", attributesType: "T", state: .active, updateToken: "t\(id)",
                                                          startedAt: t0.addingTimeInterval(20 + Double(group) * 0.1234567 + 0.0000003)))
            }
        }
        let everything = try await query(ActivityQuery(bundleID: app, keyPrefix: "c-", limit: 100))
        #expect(Set(everything) == Set(ids) && everything.count == ids.count)
        for size in 1...4 {
            var paged: [String] = []
            var cursor: ActivityQuery.Cursor?
            repeat {
                let page = try await s.findActivities(ActivityQuery(bundleID: app, keyPrefix: "c-", after: cursor, limit: size))
                paged += page.map(\.id)
                cursor = page.count == size ? page.last.map { ActivityQuery.Cursor(startedAt: $0.startedAt, id: $0.id) } : nil
            } while cursor != nil
            #expect(paged == everything, "\(kind): pages of \(size)")
        }
    }
}
